//! Columnar decode of transaction-log and pending-ack log entries.
//!
//! Replay and Spark read millions of records; building one object per record
//! costs more than decoding it. These functions decode many entries at once
//! into Arrow-shaped columns (values + offsets) that the binding hands to
//! Python as numpy arrays without per-record objects. Records are walked at
//! the wire level (no message struct, no per-string allocation); the tests
//! check the result against prost's decoding of the same bytes.

use crate::error::{Error, Result};
pub use crate::frame::RecordOrigin;
use crate::frame::{for_each_record, with_entry_index};
use crate::wire::{enum8, utf8, wrong_type, Value, Wire};

/// A column of UTF-8 strings: value `i` is `data[offsets[i]..offsets[i+1]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Utf8Column {
    /// String bytes back to back.
    pub data: Vec<u8>,
    /// `len + 1` offsets (Arrow `string` layout, int32).
    pub offsets: Vec<i32>,
}

impl Default for Utf8Column {
    fn default() -> Self {
        Self {
            data: Vec::new(),
            offsets: vec![0],
        }
    }
}

impl Utf8Column {
    fn push_bytes(&mut self, s: &[u8]) -> Result<()> {
        self.data.extend_from_slice(s);
        let end = i32::try_from(self.data.len())
            .map_err(|_| Error::invalid("string column exceeds 2 GiB; decode fewer entries"))?;
        self.offsets.push(end);
        Ok(())
    }

    /// Number of strings.
    pub fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    /// True when the column holds no string.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// String `i` (the bytes came from `&str`, so they are UTF-8).
    pub fn get(&self, i: usize) -> &str {
        let b = &self.data[self.offsets[i] as usize..self.offsets[i + 1] as usize];
        std::str::from_utf8(b).unwrap_or_default()
    }
}

/// Decodes every record of every entry with `f`, tracking origins.
fn each_record<F>(entries: &[&[u8]], origin: &mut RecordOrigin, mut f: F) -> Result<()>
where
    F: FnMut(&[u8]) -> Result<()>,
{
    for (idx, entry) in entries.iter().enumerate() {
        let mut failure = None;
        let mut seen = 0u32;
        let n = for_each_record(entry, |r| {
            if failure.is_none() {
                if let Err(e) = f(r) {
                    failure = Some((seen, e));
                }
            }
            seen += 1;
        })
        .map_err(|e| with_entry_index(e, idx))?;
        if let Some((i, e)) = failure {
            return Err(with_entry_index(
                Error::corrupt_entry(0, format!("record {i}: {e}")),
                idx,
            ));
        }
        origin.push_entry(idx, n)?;
    }
    Ok(())
}

/// `TransactionMetadataEntry` records as columns. Absent enums are -1,
/// absent integers 0, absent strings empty.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TxnLogColumns {
    /// Origin of each record.
    pub origin: RecordOrigin,
    /// `metadata_op` (-1 when absent).
    pub metadata_op: Vec<i8>,
    /// TxnID most bits (coordinator id).
    pub txnid_most_bits: Vec<u64>,
    /// TxnID least bits (sequence).
    pub txnid_least_bits: Vec<u64>,
    /// `expected_status` (-1 when absent).
    pub expected_status: Vec<i8>,
    /// `new_status` (-1 when absent).
    pub new_status: Vec<i8>,
    /// Transaction timeout.
    pub timeout_ms: Vec<u64>,
    /// Start time (ms since epoch).
    pub start_time: Vec<u64>,
    /// Last modification time (ms since epoch).
    pub last_modification_time: Vec<u64>,
    /// Highest sequence issued when the record was written.
    pub max_local_txn_id: Vec<u64>,
    /// Owner.
    pub owner: Utf8Column,
    /// PIP-255 client name.
    pub client_name: Utf8Column,
    /// Record `i` added `partitions[partition_offsets[i]..partition_offsets[i+1]]`.
    pub partition_offsets: Vec<i32>,
    /// Flattened partition names.
    pub partitions: Utf8Column,
    /// Record `i` added subscriptions `subscription_offsets[i]..[i+1]`.
    pub subscription_offsets: Vec<i32>,
    /// Flattened subscription topics.
    pub subscription_topics: Utf8Column,
    /// Flattened subscription names.
    pub subscription_names: Utf8Column,
}

fn len_i32(n: usize) -> Result<i32> {
    i32::try_from(n).map_err(|_| Error::invalid("list column exceeds 2^31 items"))
}

/// Decodes transaction-log entries (batched or not) into columns.
pub fn decode_txn_log(entries: &[&[u8]]) -> Result<TxnLogColumns> {
    let mut c = TxnLogColumns {
        partition_offsets: vec![0],
        subscription_offsets: vec![0],
        ..Default::default()
    };
    let mut origin = RecordOrigin::default();
    each_record(entries, &mut origin, |r| decode_txn_record(r, &mut c))?;
    c.origin = origin;
    Ok(c)
}

fn decode_txn_record(r: &[u8], c: &mut TxnLogColumns) -> Result<()> {
    let (mut op, mut expected, mut new) = (-1i8, -1i8, -1i8);
    let (mut most, mut least, mut timeout, mut start, mut modified, mut max_id) =
        (0, 0, 0, 0, 0, 0);
    let (mut owner, mut client): (&[u8], &[u8]) = (b"", b"");
    let mut w = Wire::new(r, 0, 0);
    while let Some((field, value, at)) = w.next_field()? {
        match (field, value) {
            (1, Value::Varint(v)) => op = enum8(v),
            (2, Value::Varint(v)) => least = v,
            (3, Value::Varint(v)) => most = v,
            (4, Value::Varint(v)) => expected = enum8(v),
            (5, Value::Varint(v)) => new = enum8(v),
            (6, Value::Bytes(b)) => c.partitions.push_bytes(utf8(b, at)?.as_bytes())?,
            (7, Value::Bytes(b)) => {
                let (mut topic, mut sub): (&[u8], &[u8]) = (b"", b"");
                let mut n = Wire::new(b, 0, at);
                while let Some((f, v, at)) = n.next_field()? {
                    match (f, v) {
                        (1, Value::Bytes(x)) => topic = utf8(x, at)?.as_bytes(),
                        (2, Value::Bytes(x)) => sub = utf8(x, at)?.as_bytes(),
                        (1 | 2, _) => return Err(wrong_type(f, at)),
                        _ => {}
                    }
                }
                c.subscription_topics.push_bytes(topic)?;
                c.subscription_names.push_bytes(sub)?;
            }
            (8, Value::Varint(v)) => timeout = v,
            (9, Value::Varint(v)) => start = v,
            (10, Value::Varint(v)) => modified = v,
            (11, Value::Varint(v)) => max_id = v,
            (12, Value::Bytes(b)) => owner = utf8(b, at)?.as_bytes(),
            (13, Value::Bytes(b)) => client = utf8(b, at)?.as_bytes(),
            (1..=13, _) => return Err(wrong_type(field, at)),
            _ => {} // unknown field: skipped, as protobuf does
        }
    }
    c.metadata_op.push(op);
    c.txnid_most_bits.push(most);
    c.txnid_least_bits.push(least);
    c.expected_status.push(expected);
    c.new_status.push(new);
    c.timeout_ms.push(timeout);
    c.start_time.push(start);
    c.last_modification_time.push(modified);
    c.max_local_txn_id.push(max_id);
    c.owner.push_bytes(owner)?;
    c.client_name.push_bytes(client)?;
    c.partition_offsets.push(len_i32(c.partitions.len())?);
    c.subscription_offsets
        .push(len_i32(c.subscription_topics.len())?);
    Ok(())
}

/// `PendingAckMetadataEntry` records as columns, with the acked positions
/// flattened. Absent enums are -1; an absent position batch size is -1.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PendingAckColumns {
    /// Origin of each record.
    pub origin: RecordOrigin,
    /// `pending_ack_op` (-1 when absent).
    pub op: Vec<i8>,
    /// `ack_type` (-1 when absent).
    pub ack_type: Vec<i8>,
    /// TxnID most bits.
    pub txnid_most_bits: Vec<u64>,
    /// TxnID least bits.
    pub txnid_least_bits: Vec<u64>,
    /// Record `i` holds positions `position_offsets[i]..[i+1]`.
    pub position_offsets: Vec<i32>,
    /// Acked ledger ids.
    pub ledger_id: Vec<u64>,
    /// Acked entry ids.
    pub entry_id: Vec<u64>,
    /// Batch size of the acked entry (-1 when absent).
    pub batch_size: Vec<i32>,
    /// Position `j` has ack-set words `ack_set_offsets[j]..[j+1]`.
    pub ack_set_offsets: Vec<i32>,
    /// Flattened ack-set words.
    pub ack_set_words: Vec<i64>,
}

/// Decodes pending-ack log entries (batched or not) into columns.
pub fn decode_pending_ack_log(entries: &[&[u8]]) -> Result<PendingAckColumns> {
    let mut c = PendingAckColumns {
        position_offsets: vec![0],
        ack_set_offsets: vec![0],
        ..Default::default()
    };
    let mut origin = RecordOrigin::default();
    each_record(entries, &mut origin, |r| decode_ack_record(r, &mut c))?;
    c.origin = origin;
    Ok(c)
}

fn decode_ack_record(r: &[u8], c: &mut PendingAckColumns) -> Result<()> {
    let (mut op, mut ack_type, mut most, mut least) = (-1i8, -1i8, 0, 0);
    let mut w = Wire::new(r, 0, 0);
    while let Some((field, value, at)) = w.next_field()? {
        match (field, value) {
            (1, Value::Varint(v)) => op = enum8(v),
            (2, Value::Varint(v)) => ack_type = enum8(v),
            (3, Value::Varint(v)) => least = v,
            (4, Value::Varint(v)) => most = v,
            (5, Value::Bytes(b)) => decode_acked_position(b, at, c)?,
            (1..=5, _) => return Err(wrong_type(field, at)),
            _ => {}
        }
    }
    c.op.push(op);
    c.ack_type.push(ack_type);
    c.txnid_most_bits.push(most);
    c.txnid_least_bits.push(least);
    c.position_offsets.push(len_i32(c.ledger_id.len())?);
    Ok(())
}

fn decode_acked_position(b: &[u8], base: usize, c: &mut PendingAckColumns) -> Result<()> {
    let (mut ledger, mut entry, mut batch_size) = (0, 0, -1i32);
    let mut n = Wire::new(b, 0, base);
    while let Some((f, v, at)) = n.next_field()? {
        match (f, v) {
            (1, Value::Varint(x)) => ledger = x,
            (2, Value::Varint(x)) => entry = x,
            // int64 words: unpacked (one varint each) or packed (proto2 allows both).
            (3, Value::Varint(x)) => c.ack_set_words.push(x as i64),
            (3, Value::Bytes(packed)) => {
                let mut p = Wire::new(packed, 0, at);
                while !p.at_end() {
                    c.ack_set_words.push(p.varint()? as i64);
                }
            }
            // int32 on the wire is a sign-extended varint.
            (4, Value::Varint(x)) => batch_size = x as i64 as i32,
            (1..=4, _) => return Err(wrong_type(f, at)),
            _ => {}
        }
    }
    c.ledger_id.push(ledger);
    c.entry_id.push(entry);
    c.batch_size.push(batch_size);
    c.ack_set_offsets.push(len_i32(c.ack_set_words.len())?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::encode_batch;
    use crate::proto::{
        PendingAckMetadata, PendingAckMetadataEntry, Subscription, TransactionMetadataEntry,
    };
    use prost::Message;

    #[test]
    fn txn_log_columns() {
        let a = TransactionMetadataEntry {
            metadata_op: Some(1),
            txnid_most_bits: Some(3),
            txnid_least_bits: Some(7),
            partitions: vec!["t1".into(), "t2".into()],
            client_name: Some("c".into()),
            ..Default::default()
        };
        let b = TransactionMetadataEntry {
            metadata_op: Some(2),
            new_status: Some(2),
            subscriptions: vec![Subscription {
                topic: "in".into(),
                subscription: "s".into(),
            }],
            ..Default::default()
        };
        let batched = encode_batch(&[a.encode_to_vec(), b.encode_to_vec()]);
        let single = a.encode_to_vec();
        let c = decode_txn_log(&[&batched, &single]).unwrap();
        assert_eq!(c.metadata_op, vec![1, 2, 1]);
        assert_eq!(c.new_status, vec![-1, 2, -1]);
        assert_eq!(c.origin.batch_size, vec![2, 2, 1]);
        assert_eq!(c.partition_offsets, vec![0, 2, 2, 4]);
        assert_eq!(c.partitions.get(1), "t2");
        assert_eq!(c.subscription_offsets, vec![0, 0, 1, 1]);
        assert_eq!(c.subscription_names.get(0), "s");
        assert_eq!(c.client_name.get(0), "c");
        assert_eq!(c.client_name.get(1), "");
    }

    #[test]
    fn pending_ack_columns() {
        let m = PendingAckMetadataEntry {
            pending_ack_op: Some(1),
            ack_type: Some(0),
            txnid_most_bits: Some(1),
            txnid_least_bits: Some(2),
            pending_ack_metadata: vec![PendingAckMetadata {
                ledger_id: 4,
                entry_id: 5,
                ack_set: vec![-2, 7],
                batch_size: Some(70),
            }],
        };
        let c = decode_pending_ack_log(&[&m.encode_to_vec()]).unwrap();
        assert_eq!(c.ledger_id, vec![4]);
        assert_eq!(c.ack_set_words, vec![-2, 7]);
        assert_eq!(c.ack_set_offsets, vec![0, 2]);
        assert_eq!(c.position_offsets, vec![0, 1]);
    }

    #[test]
    fn garbage_record_names_entry() {
        let bad = encode_batch(&[b"\x08\x01".as_slice(), b"\xff\xff"]);
        let err = decode_txn_log(&[b"\x08\x00", &bad]).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("entry #1") && msg.contains("record 1"),
            "{msg}"
        );
    }
}
