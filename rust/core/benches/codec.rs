//! Rust-only codec throughput: unframing batched entries (target ≥ 2 GB/s).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use txnstream_core::frame::{decode_entries, encode_batch, for_each_record};

fn entries(n_entries: usize, records: usize, rec_len: usize) -> Vec<Vec<u8>> {
    (0..n_entries)
        .map(|e| {
            let recs: Vec<Vec<u8>> = (0..records).map(|r| vec![(e + r) as u8; rec_len]).collect();
            encode_batch(&recs)
        })
        .collect()
}

fn unframe(c: &mut Criterion) {
    let mut g = c.benchmark_group("unframe");
    for rec_len in [64usize, 1024] {
        let es = entries(64, 512, rec_len);
        let bytes: usize = es.iter().map(Vec::len).sum();
        g.throughput(Throughput::Bytes(bytes as u64));
        g.bench_with_input(BenchmarkId::new("borrowed", rec_len), &es, |b, es| {
            b.iter(|| {
                let mut n = 0usize;
                for e in es {
                    n += for_each_record(black_box(e), |r| {
                        black_box(r);
                    })
                    .unwrap_or(0);
                }
                n
            })
        });
        g.bench_with_input(BenchmarkId::new("flat_copy", rec_len), &es, |b, es| {
            b.iter(|| decode_entries(black_box(es)).map(|f| f.len()).unwrap_or(0))
        });
    }
    g.finish();
}

fn txn_columns(c: &mut Criterion) {
    use prost::Message;
    use txnstream_core::proto::TransactionMetadataEntry;
    let es: Vec<Vec<u8>> = (0..16u64)
        .map(|e| {
            let recs: Vec<Vec<u8>> = (0..512u64)
                .map(|i| {
                    TransactionMetadataEntry {
                        metadata_op: Some(3),
                        txnid_most_bits: Some(1),
                        txnid_least_bits: Some(e * 512 + i),
                        expected_status: Some(0),
                        new_status: Some(1),
                        timeout_ms: Some(30_000),
                        last_modification_time: Some(1_700_000_000_000 + i),
                        partitions: if i % 4 == 0 {
                            vec![format!("public/default/topic-{}", i % 7)]
                        } else {
                            vec![]
                        },
                        ..Default::default()
                    }
                    .encode_to_vec()
                })
                .collect();
            encode_batch(&recs)
        })
        .collect();
    let slices: Vec<&[u8]> = es.iter().map(Vec::as_slice).collect();
    let mut g = c.benchmark_group("txn_log_columns");
    g.throughput(Throughput::Elements(16 * 512));
    g.bench_function("wire_decoder", |b| {
        b.iter(|| {
            txnstream_core::columns::decode_txn_log(black_box(&slices))
                .map(|c| c.metadata_op.len())
                .unwrap_or(0)
        })
    });
    g.finish();
}

criterion_group!(benches, unframe, txn_columns);
criterion_main!(benches);
