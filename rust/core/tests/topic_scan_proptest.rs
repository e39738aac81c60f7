//! Property tests of the columnar topic scan: over random topics (single
//! messages, batches, markers, transactions, keys, properties) the columns
//! of a paged ledger scan and of a paged remote-segment scan equal a model
//! built from `message::decode`; damaged entries and arbitrary segment bytes
//! are a `CorruptEntry` naming the position, never a panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use std::collections::HashSet;
use txnstream_core::ledger::{LedgerOptions, ManagedLedger};
use txnstream_core::message::{self, Header, OutMessage};
use txnstream_core::tiered::encode_segment;
use txnstream_core::topic_scan::{
    scan_segment_columns, scan_topic_columns, ScanLimits, SegmentCursor, TopicColumns, TxnId,
};
use txnstream_core::{Error, Position};

#[derive(Debug, Clone)]
struct Msg {
    payload: Vec<u8>,
    key: Option<String>,
    props: Vec<(String, String)>,
    seq: u64,
}

#[derive(Debug, Clone)]
enum Ent {
    Single(Msg, Option<TxnId>),
    Batch(Vec<Msg>, Option<TxnId>),
    Marker(bool, TxnId),
    Garbage(Vec<u8>),
}

fn msg() -> impl Strategy<Value = Msg> {
    (
        prop::collection::vec(any::<u8>(), 0..30),
        prop::option::of("[a-zé]{0,5}"),
        prop::collection::vec(("[a-z]{0,3}", "[a-zé0-9]{0,4}"), 0..3),
        any::<u64>(),
    )
        .prop_map(|(payload, key, props, seq)| Msg {
            payload,
            key,
            props,
            seq,
        })
}

fn txn() -> impl Strategy<Value = Option<TxnId>> {
    prop::option::of((0u64..2, 0u64..6))
}

fn ent(garbage: bool) -> impl Strategy<Value = Ent> {
    let g = if garbage { 1 } else { 0 };
    prop_oneof![
        6 => (msg(), txn()).prop_map(|(m, t)| Ent::Single(m, t)),
        3 => (prop::collection::vec(msg(), 1..5), txn()).prop_map(|(ms, t)| Ent::Batch(ms, t)),
        2 => (any::<bool>(), (0u64..2, 0u64..6)).prop_map(|(c, t)| Ent::Marker(c, t)),
        g => prop::collection::vec(any::<u8>(), 0..40).prop_map(Ent::Garbage),
    ]
}

fn out(m: &Msg) -> OutMessage<'_> {
    OutMessage {
        payload: &m.payload,
        key: m.key.as_deref(),
        properties: &m.props,
        sequence_id: m.seq,
    }
}

fn encode(e: &Ent) -> Vec<u8> {
    let h = |txn| Header {
        producer_name: "producer-é",
        publish_time: 1_700_000_000_000,
        txn,
    };
    match e {
        Ent::Single(m, t) => message::encode_message(&h(*t), &out(m)),
        Ent::Batch(ms, t) => {
            let outs: Vec<_> = ms.iter().map(out).collect();
            message::encode_batch(&h(*t), &outs).unwrap()
        }
        Ent::Marker(commit, t) => message::encode_marker(*commit, *t, 5),
        Ent::Garbage(b) => b.clone(),
    }
}

/// The rows the scan must produce, from the row-wise decoder.
fn model(entries: &[(Position, Vec<u8>)], aborted: &HashSet<TxnId>) -> TopicColumns {
    let mut c = TopicColumns::new();
    for (pos, data) in entries {
        let d = message::decode(data).unwrap();
        if d.marker().is_some() || d.txn().is_some_and(|t| aborted.contains(&t)) {
            continue;
        }
        for m in &d.messages {
            // One row at a time through a single-message entry of the same fields.
            let props = m.properties.clone();
            let one = message::encode_message(
                &Header {
                    producer_name: &d.meta.producer_name,
                    publish_time: d.meta.publish_time,
                    txn: d.txn(),
                },
                &OutMessage {
                    payload: &data[m.payload.clone()],
                    key: m.key.as_deref(),
                    properties: &props,
                    sequence_id: m.sequence_id,
                },
            );
            c.push_entry(*pos, &one, None).unwrap();
            let last = c.len() - 1;
            c.batch_index[last] = m.batch_index as i32;
            c.batch_size[last] = d.batch_size as i32;
        }
    }
    c
}

/// Concatenates paged scans (offsets rebased).
fn concat(parts: Vec<TopicColumns>) -> TopicColumns {
    let mut c = TopicColumns::new();
    for p in parts {
        for i in 0..p.len() {
            let (lo, hi) = (
                p.property_offsets[i] as usize,
                p.property_offsets[i + 1] as usize,
            );
            let props: Vec<(String, String)> = (lo..hi)
                .map(|j| {
                    (
                        p.property_keys.get(j).to_owned(),
                        p.property_values.get(j).to_owned(),
                    )
                })
                .collect();
            let txn = p.txn_valid[i].then(|| (p.txnid_most_bits[i], p.txnid_least_bits[i]));
            let key = p.key_valid[i].then(|| p.key.get(i));
            let one = message::encode_message(
                &Header {
                    producer_name: p.producer_name.get(i),
                    publish_time: p.publish_time[i],
                    txn,
                },
                &OutMessage {
                    payload: p.value.get(i),
                    key,
                    properties: &props,
                    sequence_id: p.sequence_id[i],
                },
            );
            c.push_entry(Position::new(p.ledger_id[i], p.entry_id[i]), &one, None)
                .unwrap();
            let last = c.len() - 1;
            c.batch_index[last] = p.batch_index[i];
            c.batch_size[last] = p.batch_size[i];
        }
    }
    c
}

fn opts() -> LedgerOptions {
    LedgerOptions {
        max_entries_per_ledger: 4,
        preallocate_bytes: 64 << 10,
        ..LedgerOptions::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn paged_ledger_and_segment_scans_equal_the_model(
        ents in prop::collection::vec(ent(false), 0..24),
        aborted in prop::collection::hash_set((0u64..2, 0u64..6), 0..4),
        max_entries in 1usize..7,
        max_bytes in 1usize..200,
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let ml = ManagedLedger::open(tmp.path(), "persistent://t/n/x", opts()).unwrap();
        let mut stored = Vec::new();
        for e in &ents {
            let data = encode(e);
            let p = ml.append(&data).unwrap();
            stored.push((p, data));
        }
        let want = model(&stored, &aborted);
        let limits = ScanLimits { max_entries, max_bytes };

        // Ledger, paged from the start to the end.
        let mut parts = Vec::new();
        let mut after = None;
        let mut seen = 0;
        loop {
            let s = scan_topic_columns(&ml, after, None, limits, Some(&aborted)).unwrap();
            prop_assert!(s.entries <= max_entries);
            if s.entries == 0 {
                prop_assert_eq!(s.last, after);
                break;
            }
            seen += s.entries;
            after = s.last;
            parts.push(s.columns);
        }
        prop_assert_eq!(seen, stored.len());
        prop_assert_eq!(concat(parts), want.clone());

        // An exclusive limit stops the scan before it.
        if let Some((mid, _)) = stored.get(stored.len() / 2) {
            let s = scan_topic_columns(&ml, None, Some(*mid), ScanLimits { max_entries: 1000, max_bytes: 1 << 20 }, None).unwrap();
            prop_assert!(s.columns.entry_id.iter().zip(&s.columns.ledger_id)
                .all(|(&e, &l)| Position::new(l, e) < *mid));
            prop_assert_eq!(s.entries, stored.len() / 2);
        }

        // The same entries as one remote segment (one ledger id), paged.
        let seg: Vec<(Position, Vec<u8>)> = stored.iter().enumerate()
            .map(|(i, (_, d))| (Position::new(9, 3 + i as u64), d.clone())).collect();
        let (data, _) = encode_segment(9, 3, seg.iter().map(|(_, d)| d.as_slice())).unwrap();
        let mut parts = Vec::new();
        let mut from = Some(SegmentCursor { offset: 0, entry_id: 3 });
        while let Some(f) = from {
            let s = scan_segment_columns(9, &data, f, 3, u64::MAX, limits, Some(&aborted)).unwrap();
            prop_assert!(s.entries <= max_entries);
            from = s.next;
            parts.push(s.columns);
        }
        prop_assert_eq!(concat(parts), model(&seg, &aborted));
        ml.close().unwrap();
    }

    #[test]
    fn damaged_entries_are_named_by_position(ents in prop::collection::vec(ent(true), 1..16)) {
        let tmp = tempfile::tempdir().unwrap();
        let ml = ManagedLedger::open(tmp.path(), "persistent://t/n/y", opts()).unwrap();
        let mut first_bad = None;
        for e in &ents {
            let data = encode(e);
            let p = ml.append(&data).unwrap();
            if first_bad.is_none() && message::decode(&data).is_err() {
                first_bad = Some(p);
            }
        }
        let r = scan_topic_columns(&ml, None, None, ScanLimits { max_entries: 1000, max_bytes: 1 << 20 }, None);
        match (r, first_bad) {
            (Ok(_), None) => {}
            (Err(Error::CorruptEntry { position, .. }), Some(p)) => prop_assert_eq!(position, Some(p)),
            (other, bad) => prop_assert!(false, "scan gave {:?}, first bad entry {:?}", other.map(|s| s.entries), bad),
        }
        ml.close().unwrap();
    }

    #[test]
    fn segment_scan_of_any_bytes_never_panics(
        ents in prop::collection::vec(ent(true), 0..8),
        flip in any::<prop::sample::Index>(), bit in 0u8..8, cut in any::<prop::sample::Index>(),
        junk in prop::collection::vec(any::<u8>(), 0..120),
        start in 0u64..10, offset in 0usize..300,
    ) {
        let enc: Vec<Vec<u8>> = ents.iter().map(encode).collect();
        let (mut data, _) = encode_segment(2, 0, enc.iter().map(Vec::as_slice)).unwrap();
        let limits = ScanLimits { max_entries: 1000, max_bytes: 1 << 20 };
        let from = SegmentCursor { offset: 0, entry_id: 0 };
        let _ = scan_segment_columns(2, &junk, from, 0, u64::MAX, limits, None);
        let _ = scan_segment_columns(2, &data, SegmentCursor { offset, entry_id: 0 }, start, u64::MAX, limits, None);
        if !data.is_empty() {
            let c = cut.index(data.len());
            let _ = scan_segment_columns(2, &data[..c], from, start, u64::MAX, limits, None);
            let i = flip.index(data.len());
            data[i] ^= 1 << bit;
            // A flipped bit fails the frame check of the entry it lands in (or
            // its header): never decoded as other messages.
            if let Ok(s) = scan_segment_columns(2, &data, from, 0, u64::MAX, limits, None) {
                let good = model_rows(&enc);
                prop_assert!(s.columns.len() <= good);
            }
        }
    }
}

fn model_rows(enc: &[Vec<u8>]) -> usize {
    enc.iter()
        .filter_map(|d| message::decode(d).ok())
        .filter(|d| d.marker().is_none())
        .map(|d| d.messages.len())
        .sum()
}
