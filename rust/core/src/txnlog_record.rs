//! One `TransactionMetadataEntry` record: a borrowed decode and a direct
//! encode, both at the wire level.
//!
//! The coordinator writes five records per transaction; building a protobuf
//! message object per record costs more in Python than the whole write
//! does in Rust, so records are encoded here from plain arguments. The bytes
//! equal what protobuf (prost, upb) produces for a message with the same
//! fields set: fields in number order, proto2 presence (a field given as 0
//! is written). Recovery decodes records without building messages.

use crate::error::Result;
use crate::wire::{enum_value, put_varint, utf8, varint_len, wrong_type, Value, Wire};
use std::ops::RangeInclusive;

/// `metadata_op` values.
pub const OP_NEW: i8 = 0;
/// Partitions were added.
pub const OP_ADD_PARTITION: i8 = 1;
/// Subscriptions were added.
pub const OP_ADD_SUBSCRIPTION: i8 = 2;
/// A status change.
pub const OP_UPDATE: i8 = 3;

/// Field number of the txnstream `timed_out` extension (far above Pulsar's).
pub const FIELD_TIMED_OUT: u32 = 1000;
/// Its key, field 1000 wire type varint: `1000 << 3 = 8000` as a varint.
const KEY_TIMED_OUT: [u8; 2] = [0xC0, 0x3E];

/// Every `TransactionMetadataOp` value (proto2 enums are closed: a record
/// with another value reads as one without the field).
pub const METADATA_OPS: RangeInclusive<i8> = OP_NEW..=OP_UPDATE;

/// `TxnStatus` values.
pub const STATUS_OPEN: i8 = 0;
/// Committing.
pub const STATUS_COMMITTING: i8 = 1;
/// Committed (final).
pub const STATUS_COMMITTED: i8 = 2;
/// Aborting.
pub const STATUS_ABORTING: i8 = 3;
/// Aborted (final).
pub const STATUS_ABORTED: i8 = 4;
/// Every `TxnStatus` value.
pub const TXN_STATUSES: RangeInclusive<i8> = STATUS_OPEN..=STATUS_ABORTED;

/// A decoded record. Absent enums are -1 (a value outside its enum reads
/// as absent, as in proto2), absent integers 0, absent strings empty (as
/// in [`crate::columns`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnRecord<'a> {
    /// `metadata_op`.
    pub op: i8,
    /// Coordinator id.
    pub most_bits: u64,
    /// Sequence within the coordinator.
    pub least_bits: u64,
    /// `expected_status`.
    pub expected_status: i8,
    /// `new_status`.
    pub new_status: i8,
    /// Added partitions.
    pub partitions: Vec<&'a str>,
    /// Added `(topic, subscription)` pairs.
    pub subscriptions: Vec<(&'a str, &'a str)>,
    /// Timeout.
    pub timeout_ms: u64,
    /// Start time (ms since epoch).
    pub start_time: u64,
    /// Last modification time (ms since epoch).
    pub last_modification_time: u64,
    /// Highest sequence issued when written.
    pub max_local_txn_id: u64,
    /// Owner.
    pub owner: &'a str,
    /// PIP-255 client name.
    pub client_name: &'a str,
    /// txnstream field 1000: the abort was caused by the timeout.
    pub timed_out: bool,
}

impl Default for TxnRecord<'_> {
    fn default() -> Self {
        Self {
            op: -1,
            most_bits: 0,
            least_bits: 0,
            expected_status: -1,
            new_status: -1,
            partitions: Vec::new(),
            subscriptions: Vec::new(),
            timeout_ms: 0,
            start_time: 0,
            last_modification_time: 0,
            max_local_txn_id: 0,
            owner: "",
            client_name: "",
            timed_out: false,
        }
    }
}

/// Decodes one record (unknown fields are skipped, as protobuf does).
pub fn decode(r: &[u8]) -> Result<TxnRecord<'_>> {
    let mut out = TxnRecord::default();
    let mut w = Wire::new(r, 0, 0);
    while let Some((field, value, at)) = w.next_field()? {
        match (field, value) {
            // An enum value outside the enum leaves the field as it was.
            (1, Value::Varint(v)) => out.op = enum_value(v, METADATA_OPS).unwrap_or(out.op),
            (2, Value::Varint(v)) => out.least_bits = v,
            (3, Value::Varint(v)) => out.most_bits = v,
            (4, Value::Varint(v)) => {
                out.expected_status = enum_value(v, TXN_STATUSES).unwrap_or(out.expected_status);
            }
            (5, Value::Varint(v)) => {
                out.new_status = enum_value(v, TXN_STATUSES).unwrap_or(out.new_status);
            }
            (6, Value::Bytes(b)) => out.partitions.push(utf8(b, at)?),
            (7, Value::Bytes(b)) => {
                let (mut topic, mut sub) = ("", "");
                let mut n = Wire::new(b, 0, at);
                while let Some((f, v, at)) = n.next_field()? {
                    match (f, v) {
                        (1, Value::Bytes(x)) => topic = utf8(x, at)?,
                        (2, Value::Bytes(x)) => sub = utf8(x, at)?,
                        (1 | 2, _) => return Err(wrong_type(f, at)),
                        _ => {}
                    }
                }
                out.subscriptions.push((topic, sub));
            }
            (8, Value::Varint(v)) => out.timeout_ms = v,
            (9, Value::Varint(v)) => out.start_time = v,
            (10, Value::Varint(v)) => out.last_modification_time = v,
            (11, Value::Varint(v)) => out.max_local_txn_id = v,
            (12, Value::Bytes(b)) => out.owner = utf8(b, at)?,
            (13, Value::Bytes(b)) => out.client_name = utf8(b, at)?,
            (FIELD_TIMED_OUT, Value::Varint(v)) => out.timed_out = v != 0,
            (1..=13 | FIELD_TIMED_OUT, _) => return Err(wrong_type(field, at)),
            _ => {}
        }
    }
    Ok(out)
}

/// What to encode: `None` leaves a field absent.
#[derive(Debug, Clone, Default)]
pub struct Encode<'a> {
    /// `metadata_op`.
    pub op: i8,
    /// Sequence.
    pub least_bits: u64,
    /// Coordinator id.
    pub most_bits: u64,
    /// `expected_status`.
    pub expected_status: Option<i8>,
    /// `new_status`.
    pub new_status: Option<i8>,
    /// Added partitions.
    pub partitions: &'a [&'a str],
    /// Added `(topic, subscription)` pairs.
    pub subscriptions: &'a [(&'a str, &'a str)],
    /// Timeout.
    pub timeout_ms: Option<u64>,
    /// Start time.
    pub start_time: Option<u64>,
    /// Last modification time.
    pub last_modification_time: Option<u64>,
    /// Highest sequence issued.
    pub max_local_txn_id: Option<u64>,
    /// Owner.
    pub owner: Option<&'a str>,
    /// PIP-255 client name.
    pub client_name: Option<&'a str>,
    /// The abort was caused by the timeout (written only when true, so
    /// every other record is byte-identical to Pulsar's).
    pub timed_out: bool,
}

fn varint_field(out: &mut Vec<u8>, key: u8, v: u64) {
    out.push(key);
    put_varint(out, v);
}

/// An enum as protobuf writes it: negative values sign-extend to 10 bytes.
fn enum_field(out: &mut Vec<u8>, key: u8, v: i8) {
    varint_field(out, key, i64::from(v) as u64);
}

fn bytes_field(out: &mut Vec<u8>, key: u8, b: &[u8]) {
    out.push(key);
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

impl Encode<'_> {
    /// Appends the serialized record to `out`.
    pub fn encode_to(&self, out: &mut Vec<u8>) {
        enum_field(out, 0x08, self.op);
        varint_field(out, 0x10, self.least_bits);
        varint_field(out, 0x18, self.most_bits);
        if let Some(s) = self.expected_status {
            enum_field(out, 0x20, s);
        }
        if let Some(s) = self.new_status {
            enum_field(out, 0x28, s);
        }
        for p in self.partitions {
            bytes_field(out, 0x32, p.as_bytes());
        }
        for (topic, sub) in self.subscriptions {
            let inner = 2
                + varint_len(topic.len() as u64)
                + topic.len()
                + varint_len(sub.len() as u64)
                + sub.len();
            out.push(0x3A);
            put_varint(out, inner as u64);
            bytes_field(out, 0x0A, topic.as_bytes());
            bytes_field(out, 0x12, sub.as_bytes());
        }
        let ints = [
            (0x40, self.timeout_ms),
            (0x48, self.start_time),
            (0x50, self.last_modification_time),
            (0x58, self.max_local_txn_id),
        ];
        for (key, v) in ints {
            if let Some(v) = v {
                varint_field(out, key, v);
            }
        }
        if let Some(o) = self.owner {
            bytes_field(out, 0x62, o.as_bytes());
        }
        if let Some(c) = self.client_name {
            bytes_field(out, 0x6A, c.as_bytes());
        }
        if self.timed_out {
            out.extend_from_slice(&KEY_TIMED_OUT);
            out.push(1);
        }
    }

    /// The serialized record.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(48);
        self.encode_to(&mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::proto::{Subscription, TransactionMetadataEntry};
    use proptest::prelude::*;
    use prost::Message;

    fn as_proto(e: &Encode<'_>) -> TransactionMetadataEntry {
        TransactionMetadataEntry {
            metadata_op: Some(i32::from(e.op)),
            txnid_least_bits: Some(e.least_bits),
            txnid_most_bits: Some(e.most_bits),
            expected_status: e.expected_status.map(i32::from),
            new_status: e.new_status.map(i32::from),
            partitions: e.partitions.iter().map(|s| s.to_string()).collect(),
            subscriptions: e
                .subscriptions
                .iter()
                .map(|(t, s)| Subscription {
                    topic: t.to_string(),
                    subscription: s.to_string(),
                })
                .collect(),
            timeout_ms: e.timeout_ms,
            start_time: e.start_time,
            last_modification_time: e.last_modification_time,
            max_local_txn_id: e.max_local_txn_id,
            owner: e.owner.map(str::to_owned),
            client_name: e.client_name.map(str::to_owned),
            timed_out: e.timed_out.then_some(true),
        }
    }

    proptest! {
        #[test]
        fn encode_matches_prost_and_decodes_back(
            op in 0i8..4,
            least in any::<u64>(),
            most in any::<u64>(),
            expected in proptest::option::of(0i8..5),
            new in proptest::option::of(0i8..5),
            parts in proptest::collection::vec("[a-z0-9/_-]{0,12}", 0..4),
            subs in proptest::collection::vec(("[a-z]{0,8}", "[a-zé]{0,140}"), 0..3),
            ints in proptest::collection::vec(proptest::option::of(any::<u64>()), 4),
            owner in proptest::option::of("[a-z]{0,5}"),
            client in proptest::option::of("[a-zA-Z0-9]{0,20}"),
            timed_out in any::<bool>(),
        ) {
            let part_refs: Vec<&str> = parts.iter().map(String::as_str).collect();
            let sub_refs: Vec<(&str, &str)> =
                subs.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
            let e = Encode {
                op, least_bits: least, most_bits: most,
                expected_status: expected, new_status: new,
                partitions: &part_refs, subscriptions: &sub_refs,
                timeout_ms: ints[0], start_time: ints[1],
                last_modification_time: ints[2], max_local_txn_id: ints[3],
                owner: owner.as_deref(), client_name: client.as_deref(),
                timed_out,
            };
            let bytes = e.encode();
            prop_assert_eq!(&bytes, &as_proto(&e).encode_to_vec());
            let d = decode(&bytes).unwrap();
            prop_assert_eq!(d.op, op);
            prop_assert_eq!((d.least_bits, d.most_bits), (least, most));
            prop_assert_eq!(d.expected_status, expected.unwrap_or(-1));
            prop_assert_eq!(d.new_status, new.unwrap_or(-1));
            prop_assert_eq!(d.partitions, part_refs);
            prop_assert_eq!(d.subscriptions, sub_refs);
            prop_assert_eq!(d.timeout_ms, ints[0].unwrap_or(0));
            prop_assert_eq!(d.max_local_txn_id, ints[3].unwrap_or(0));
            prop_assert_eq!(d.client_name, client.as_deref().unwrap_or(""));
            prop_assert_eq!(d.timed_out, timed_out);
        }
    }

    #[test]
    fn bad_records_are_typed_errors() {
        // Field 6 (partitions) as a varint; truncated length; bad UTF-8.
        for bad in [&b"\x30\x01"[..], b"\x32\x05ab", b"\x32\x02\xff\xfe"] {
            assert!(
                matches!(decode(bad), Err(Error::CorruptEntry { .. })),
                "{bad:?}"
            );
        }
        assert_eq!(decode(b"").unwrap(), TxnRecord::default());
        // The timed_out extension with a wrong wire type is rejected too.
        assert!(matches!(
            decode(b"\xC2\x3E\x00"),
            Err(Error::CorruptEntry { .. })
        ));
    }

    #[test]
    fn timed_out_is_skipped_by_readers_without_the_field() {
        // A reader built from Pulsar's schema (fields 1..13) sees the same
        // record with or without the extension: protobuf skips unknown fields.
        let base = Encode {
            op: OP_UPDATE,
            least_bits: 7,
            expected_status: Some(STATUS_ABORTING),
            new_status: Some(STATUS_ABORTED),
            last_modification_time: Some(5),
            ..Encode::default()
        };
        let plain = base.encode();
        let flagged = Encode {
            timed_out: true,
            ..base
        }
        .encode();
        assert_eq!(&flagged[..plain.len()], &plain[..]);
        assert_eq!(&flagged[plain.len()..], &[0xC0, 0x3E, 0x01]);
        let mut pulsar = TransactionMetadataEntry::decode(flagged.as_slice()).unwrap();
        pulsar.timed_out = None; // what a reader without field 1000 keeps
        assert_eq!(
            pulsar,
            TransactionMetadataEntry::decode(plain.as_slice()).unwrap()
        );
        assert!(decode(&flagged).unwrap().timed_out);
        assert!(!decode(&plain).unwrap().timed_out);
    }
}
