//! Property tests: the frame codec and ack sets never panic and round-trip.

use proptest::prelude::*;
use txnstream_core::ackset::{rows, AckSet};
use txnstream_core::columns::{decode_pending_ack_log, decode_txn_log};
use txnstream_core::frame::{decode_entries, decode_entry, encode_batch, is_batched, MAGIC};
use txnstream_core::Error;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn batch_round_trip(records in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..300), 1..40)) {
        let e = encode_batch(&records);
        prop_assert!(is_batched(&e));
        let back: Vec<Vec<u8>> = decode_entry(&e).unwrap().into_iter().map(<[u8]>::to_vec).collect();
        prop_assert_eq!(&back, &records);
        let flat = decode_entries(&[e]).unwrap();
        prop_assert_eq!(flat.len(), records.len());
        for (i, r) in records.iter().enumerate() {
            prop_assert_eq!(flat.record(i), r.as_slice());
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        match decode_entry(&bytes) {
            Ok(recs) => {
                if !is_batched(&bytes) {
                    prop_assert_eq!(recs, vec![bytes.as_slice()]);
                }
            }
            Err(Error::CorruptEntry { offset, .. }) => prop_assert!(offset <= bytes.len()),
            Err(other) => prop_assert!(false, "unexpected error {other:?}"),
        }
        let _ = decode_txn_log(&[&bytes]);
        let _ = decode_pending_ack_log(&[&bytes]);
    }

    #[test]
    fn garbage_after_header_never_panics(body in prop::collection::vec(any::<u8>(), 0..256)) {
        let mut e = MAGIC.to_be_bytes().to_vec();
        e.extend_from_slice(&[0, 1]);
        e.extend_from_slice(&body);
        if let Err(err) = decode_entry(&e) {
            let is_corrupt = matches!(err, Error::CorruptEntry { .. });
            prop_assert!(is_corrupt);
        }
    }

    #[test]
    fn truncation_is_detected(records in prop::collection::vec(prop::collection::vec(any::<u8>(), 1..50), 1..10), cut in 1usize..40) {
        let e = encode_batch(&records);
        let cut = cut.min(e.len() - 2);
        let t = &e[..e.len() - cut];
        // A strict prefix either fails or yields fewer records, never more.
        if let Ok(recs) = decode_entry(t) {
            prop_assert!(recs.len() < records.len());
        }
    }

    #[test]
    fn ackset_words_round_trip(n in 1i64..600, deleted in prop::collection::vec(any::<u16>(), 0..64)) {
        let mut s = AckSet::new(n).unwrap();
        for d in &deleted {
            s.clear(i64::from(*d) % n).unwrap();
        }
        let back = AckSet::from_words(&s.to_words(), n).unwrap();
        prop_assert_eq!(&back, &s);
        let uniq: std::collections::BTreeSet<i64> = deleted.iter().map(|d| i64::from(*d) % n).collect();
        prop_assert_eq!(i64::from(s.cardinality()), n - uniq.len() as i64);
    }

    #[test]
    fn ackset_and_is_union_of_deletions(n in 1i64..300, a in prop::collection::vec(any::<u16>(), 0..20), b in prop::collection::vec(any::<u16>(), 0..20)) {
        let mut x = AckSet::new(n).unwrap();
        let mut y = AckSet::new(n).unwrap();
        for i in &a { x.clear(i64::from(*i) % n).unwrap(); }
        for i in &b { y.clear(i64::from(*i) % n).unwrap(); }
        let overlap = a.iter().any(|i| b.iter().any(|j| i64::from(*i) % n == i64::from(*j) % n));
        prop_assert_eq!(x.overlaps(&y).unwrap(), overlap);
        let width = (n as usize).div_ceil(64);
        let mut wx = x.to_words(); wx.resize(width, 0);
        let mut wy = y.to_words(); wy.resize(width, 0);
        prop_assert_eq!(rows::overlaps(&wx, &wy, width, &[n]).unwrap(), vec![overlap]);
        x.and_assign(&y).unwrap();
        for i in 0..n {
            let deleted = a.iter().chain(&b).any(|d| i64::from(*d) % n == i);
            prop_assert_eq!(x.get(i).unwrap(), !deleted);
        }
    }

    #[test]
    fn ackset_from_arbitrary_words_never_panics(words in prop::collection::vec(any::<i64>(), 0..12), n in -5i64..800) {
        if let Ok(s) = AckSet::from_words(&words, n) {
            prop_assert!(s.cardinality() <= n as u32);
        }
    }
}

mod columns_vs_prost {
    use proptest::prelude::*;
    use prost::Message;
    use txnstream_core::columns::{decode_pending_ack_log, decode_txn_log};
    use txnstream_core::frame::encode_batch;
    use txnstream_core::proto::{
        PendingAckMetadata, PendingAckMetadataEntry, Subscription, TransactionMetadataEntry,
    };

    fn txn() -> impl Strategy<Value = TransactionMetadataEntry> {
        (
            (
                prop::option::of(0i32..4),
                prop::option::of(any::<u64>()),
                prop::option::of(any::<u64>()),
                prop::option::of(0i32..5),
                prop::option::of(0i32..5),
            ),
            prop::collection::vec("[a-z/é]{0,8}", 0..4),
            prop::collection::vec(("[a-z]{0,6}", "[a-z]{0,6}"), 0..3),
            (
                prop::option::of(any::<u64>()),
                prop::option::of(any::<u64>()),
                prop::option::of("[a-z]{0,5}"),
                prop::option::of("[a-z0-9-]{0,9}"),
            ),
        )
            .prop_map(
                |((op, least, most, exp, new), parts, subs, (t, m, owner, client))| {
                    TransactionMetadataEntry {
                        metadata_op: op,
                        txnid_least_bits: least,
                        txnid_most_bits: most,
                        expected_status: exp,
                        new_status: new,
                        partitions: parts,
                        subscriptions: subs
                            .into_iter()
                            .map(|(topic, subscription)| Subscription {
                                topic,
                                subscription,
                            })
                            .collect(),
                        timeout_ms: t,
                        max_local_txn_id: m,
                        owner,
                        client_name: client,
                        ..Default::default()
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn txn_columns_equal_prost(msgs in prop::collection::vec(txn(), 1..20)) {
            let recs: Vec<Vec<u8>> = msgs.iter().map(Message::encode_to_vec).collect();
            let entry = encode_batch(&recs);
            let c = decode_txn_log(&[entry.as_slice()]).unwrap();
            for (i, r) in recs.iter().enumerate() {
                let m = TransactionMetadataEntry::decode(r.as_slice()).unwrap();
                prop_assert_eq!(c.txnid_least_bits[i], m.txnid_least_bits.unwrap_or(0));
                prop_assert_eq!(c.txnid_most_bits[i], m.txnid_most_bits.unwrap_or(0));
                prop_assert_eq!(i32::from(c.metadata_op[i]), m.metadata_op.unwrap_or(-1));
                prop_assert_eq!(i32::from(c.new_status[i]), m.new_status.unwrap_or(-1));
                prop_assert_eq!(i32::from(c.expected_status[i]), m.expected_status.unwrap_or(-1));
                prop_assert_eq!(c.timeout_ms[i], m.timeout_ms.unwrap_or(0));
                prop_assert_eq!(c.max_local_txn_id[i], m.max_local_txn_id.unwrap_or(0));
                prop_assert_eq!(c.owner.get(i), m.owner.as_deref().unwrap_or(""));
                prop_assert_eq!(c.client_name.get(i), m.client_name.as_deref().unwrap_or(""));
                let (a, b) = (c.partition_offsets[i] as usize, c.partition_offsets[i + 1] as usize);
                let parts: Vec<&str> = (a..b).map(|j| c.partitions.get(j)).collect();
                prop_assert_eq!(parts, m.partitions.iter().map(String::as_str).collect::<Vec<_>>());
                let (a, b) = (c.subscription_offsets[i] as usize, c.subscription_offsets[i + 1] as usize);
                let subs: Vec<(&str, &str)> = (a..b)
                    .map(|j| (c.subscription_topics.get(j), c.subscription_names.get(j)))
                    .collect();
                let want: Vec<(&str, &str)> = m
                    .subscriptions
                    .iter()
                    .map(|s| (s.topic.as_str(), s.subscription.as_str()))
                    .collect();
                prop_assert_eq!(subs, want);
            }
        }

        #[test]
        fn ack_columns_equal_prost(
            positions in prop::collection::vec(
                (any::<u64>(), any::<u64>(), prop::collection::vec(any::<i64>(), 0..5), prop::option::of(-3i32..1000)),
                0..6),
            op in prop::option::of(1i32..4),
        ) {
            let m = PendingAckMetadataEntry {
                pending_ack_op: op,
                ack_type: Some(1),
                txnid_least_bits: Some(5),
                txnid_most_bits: Some(6),
                pending_ack_metadata: positions
                    .iter()
                    .map(|(l, e, w, b)| PendingAckMetadata {
                        ledger_id: *l,
                        entry_id: *e,
                        ack_set: w.clone(),
                        batch_size: *b,
                    })
                    .collect(),
            };
            let bytes = m.encode_to_vec();
            let c = decode_pending_ack_log(&[bytes.as_slice()]).unwrap();
            prop_assert_eq!(i32::from(c.op[0]), op.unwrap_or(-1));
            prop_assert_eq!(c.position_offsets.clone(), vec![0, positions.len() as i32]);
            for (j, (l, e, w, b)) in positions.iter().enumerate() {
                prop_assert_eq!(c.ledger_id[j], *l);
                prop_assert_eq!(c.entry_id[j], *e);
                prop_assert_eq!(c.batch_size[j], b.unwrap_or(-1));
                let (a, z) = (c.ack_set_offsets[j] as usize, c.ack_set_offsets[j + 1] as usize);
                prop_assert_eq!(&c.ack_set_words[a..z], w.as_slice());
            }
        }
    }

    /// A proto2 reader's view of enum field `field` after these fields:
    /// the last value that is one of the enum's (`known`), -1 if none.
    /// Values are read as `int32` (the varint's low 32 bits).
    fn closed_enum(fields: &[(u32, u64)], field: u32, known: std::ops::RangeInclusive<i32>) -> i32 {
        fields
            .iter()
            .filter(|(f, _)| *f == field)
            .map(|(_, v)| *v as u32 as i32)
            .rfind(|v| known.contains(v))
            .unwrap_or(-1)
    }

    fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    /// An enum value: mostly near the enum (valid, just outside, negative),
    /// sometimes anything (the low 32 bits of a big one may be valid).
    fn enum_raw() -> impl Strategy<Value = u64> {
        prop_oneof![
            (-3i64..8).prop_map(|v| v as u64),
            any::<u64>(),
            (0u64..5).prop_map(|v| v | (1 << 32)),
            Just(200u64),
        ]
    }

    proptest! {
        /// proto2 enums are closed: a value outside the enum is an unknown
        /// field, and the field keeps its earlier value (absent if none) —
        /// what protobuf (upb, Java) reads. Checked for the columns and the
        /// single-record decode the coordinator's fold uses.
        #[test]
        fn enum_values_outside_the_enum_read_as_absent(
            txn_fields in prop::collection::vec((prop::sample::select(vec![1u32, 4, 5]), enum_raw()), 0..8),
            ack_fields in prop::collection::vec((prop::sample::select(vec![1u32, 2]), enum_raw()), 0..8),
        ) {
            let mut rec = Vec::new();
            for &(f, v) in &txn_fields {
                rec.push((f << 3) as u8);
                varint(&mut rec, v);
            }
            let c = decode_txn_log(&[rec.as_slice()]).unwrap();
            let r = txnstream_core::txnlog_record::decode(&rec).unwrap();
            let (op, exp, new) = (
                closed_enum(&txn_fields, 1, 0..=3),
                closed_enum(&txn_fields, 4, 0..=4),
                closed_enum(&txn_fields, 5, 0..=4),
            );
            prop_assert_eq!(i32::from(c.metadata_op[0]), op);
            prop_assert_eq!(i32::from(c.expected_status[0]), exp);
            prop_assert_eq!(i32::from(c.new_status[0]), new);
            prop_assert_eq!((i32::from(r.op), i32::from(r.expected_status), i32::from(r.new_status)), (op, exp, new));
            // The same record through prost (open enums: raw values) then
            // the closed-enum rule gives the same answer.
            let m = TransactionMetadataEntry::decode(rec.as_slice()).unwrap();
            if (0..=3).contains(&m.metadata_op.unwrap_or(-1)) {
                prop_assert_eq!(m.metadata_op, Some(op));
            }
            let mut ack = Vec::new();
            for &(f, v) in &ack_fields {
                ack.push((f << 3) as u8);
                varint(&mut ack, v);
            }
            let c = decode_pending_ack_log(&[ack.as_slice()]).unwrap();
            prop_assert_eq!(i32::from(c.op[0]), closed_enum(&ack_fields, 1, 1..=3));
            prop_assert_eq!(i32::from(c.ack_type[0]), closed_enum(&ack_fields, 2, 0..=1));
        }
    }

    #[test]
    fn enum_values_outside_the_enum_keep_the_earlier_value() {
        // The reviewer's cases, checked against the protobuf package.
        let c = decode_txn_log(&[
            b"\x08\x07\x10\x01".as_slice(),  // metadata_op=7: absent
            b"\x08\x02\x10\x01\x08\x07",     // 2 then 7: 2
            b"\x08\x02\x10\x01\x08\xc8\x01", // 2 then 200: 2
            b"\x08\x03\x10\x01\x28\x05",     // new_status=5: absent
            b"\x08\x82\x80\x80\x80\x10",     // 2 + 2**32: 2 (an int32)
        ])
        .unwrap();
        assert_eq!(c.metadata_op, vec![-1, 2, 2, 3, 2]);
        assert_eq!(c.new_status, vec![-1, -1, -1, -1, -1]);
        let c = decode_pending_ack_log(&[b"\x08\x09".as_slice(), b"\x10\x01\x10\x05"]).unwrap();
        assert_eq!(c.op, vec![-1, -1]);
        assert_eq!(c.ack_type, vec![-1, 1]);
    }

    #[test]
    fn packed_ack_set_words_are_read() {
        // ack_set (field 3) packed: key 0x1A, len, varints 2 and 3.
        let pos = [0x08, 0x01, 0x10, 0x02, 0x1A, 0x02, 0x02, 0x03];
        let mut rec = vec![0x08, 0x01, 0x2A, pos.len() as u8];
        rec.extend_from_slice(&pos);
        let c = decode_pending_ack_log(&[rec.as_slice()]).unwrap();
        assert_eq!(c.ack_set_words, vec![2, 3]);
    }
}
