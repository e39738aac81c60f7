//! Property tests: the lenient decoders (Spark's path) never panic, keep one
//! row per record, and give good entries exactly the strict decoders' rows
//! whatever damaged entries sit next to them.

use proptest::prelude::*;
use prost::Message;
use txnstream_core::columns::{
    decode_lenient, decode_pending_ack_log, decode_txn_log, PendingAckColumns, RowStatus,
    TxnLogColumns,
};
use txnstream_core::frame::{decode_entry, decode_entry_lists, encode_batch};
use txnstream_core::proto::{Subscription, TransactionMetadataEntry};

fn txn_record() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::option::of(0i32..4),
        any::<u64>(),
        prop::collection::vec("[a-z]{0,6}", 0..3),
        prop::collection::vec(("[a-z]{0,4}", "[a-z]{0,4}"), 0..2),
        prop::option::of("[a-z0-9]{0,6}"),
    )
        .prop_map(|(op, least, parts, subs, client)| {
            TransactionMetadataEntry {
                metadata_op: op,
                txnid_least_bits: Some(least),
                partitions: parts,
                subscriptions: subs
                    .into_iter()
                    .map(|(topic, subscription)| Subscription {
                        topic,
                        subscription,
                    })
                    .collect(),
                client_name: client,
                ..Default::default()
            }
            .encode_to_vec()
        })
}

/// An entry: a good batch, a good single record, or arbitrary bytes.
fn entry() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(txn_record(), 1..6).prop_map(|r| encode_batch(&r)),
        txn_record(),
        prop::collection::vec(any::<u8>(), 0..40),
        prop::collection::vec(any::<u8>(), 0..40).prop_map(|mut b| {
            b.splice(0..0, [0x0E, 0x01, 0x00, 0x01]);
            b
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn good_entries_decode_as_strict_whatever_their_neighbours(entries in prop::collection::vec(entry(), 1..12)) {
        let slices: Vec<&[u8]> = entries.iter().map(Vec::as_slice).collect();
        let l = decode_lenient::<TxnLogColumns>(&slices).unwrap();
        let _ = decode_lenient::<PendingAckColumns>(&slices).unwrap();
        let lists = decode_entry_lists(&slices).unwrap();
        let mut row = 0usize;
        for (idx, e) in entries.iter().enumerate() {
            let framed = decode_entry(e);
            prop_assert_eq!(lists.failed[idx], framed.is_err());
            let n = framed.as_ref().map_or(1, Vec::len);
            let rows: Vec<usize> = (row..row + n).collect();
            for &k in &rows {
                prop_assert_eq!(l.origin.entry_index[k] as usize, idx);
            }
            match decode_txn_log(&[e.as_slice()]) {
                Ok(strict) => {
                    for (j, &k) in rows.iter().enumerate() {
                        prop_assert_eq!(l.status[k], RowStatus::Ok as u8);
                        prop_assert_eq!(l.error.get(k), "");
                        prop_assert_eq!(l.columns.txnid_least_bits[k], strict.txnid_least_bits[j]);
                        prop_assert_eq!(l.columns.client_name.get(k), strict.client_name.get(j));
                        let (a, b) = (l.columns.partition_offsets[k], l.columns.partition_offsets[k + 1]);
                        let (c, d) = (strict.partition_offsets[j], strict.partition_offsets[j + 1]);
                        prop_assert_eq!(b - a, d - c);
                        for q in 0..(b - a) {
                            prop_assert_eq!(
                                l.columns.partitions.get((a + q) as usize),
                                strict.partitions.get((c + q) as usize)
                            );
                        }
                    }
                }
                Err(_) => {
                    prop_assert!(rows.iter().any(|&k| l.status[k] != RowStatus::Ok as u8));
                    for &k in &rows {
                        prop_assert_eq!(l.status[k] == RowStatus::Ok as u8, l.error.get(k).is_empty());
                    }
                }
            }
            row += n;
        }
        prop_assert_eq!(row, l.len());
        prop_assert_eq!(l.columns.partition_offsets.len(), l.len() + 1);
        let _ = decode_pending_ack_log(&slices);
    }
}
