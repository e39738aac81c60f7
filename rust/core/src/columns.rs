//! Columnar decode of transaction-log and pending-ack log entries.
//!
//! Replay and Spark read millions of records; building one object per record
//! costs more than decoding it. These functions decode many entries at once
//! into Arrow-shaped columns (values + offsets) that the binding hands to
//! Python as numpy arrays without per-record objects.

use crate::error::{Error, Result};
use crate::frame::{for_each_record, with_entry_index};
use crate::proto::{PendingAckMetadataEntry, TransactionMetadataEntry};
use prost::Message;

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
    fn push(&mut self, s: &str) -> Result<()> {
        self.data.extend_from_slice(s.as_bytes());
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

/// Where each record of a bulk decode came from.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RecordOrigin {
    /// Index of the entry in the input.
    pub entry_index: Vec<u32>,
    /// Index within the entry.
    pub batch_index: Vec<u32>,
    /// Records in that entry.
    pub batch_size: Vec<u32>,
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
        let idx = u32::try_from(idx).map_err(|_| Error::invalid("too many entries"))?;
        origin.entry_index.extend(std::iter::repeat_n(idx, n));
        origin.batch_index.extend(0..n as u32);
        origin.batch_size.extend(std::iter::repeat_n(n as u32, n));
    }
    Ok(())
}

fn decode<M: Message + Default>(r: &[u8]) -> Result<M> {
    M::decode(r).map_err(|e| Error::corrupt_entry(0, format!("malformed protobuf: {e}")))
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

fn opt_enum(v: Option<i32>) -> i8 {
    v.and_then(|v| i8::try_from(v).ok()).unwrap_or(-1)
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
    each_record(entries, &mut origin, |r| {
        let m: TransactionMetadataEntry = decode(r)?;
        c.metadata_op.push(opt_enum(m.metadata_op));
        c.txnid_most_bits.push(m.txnid_most_bits.unwrap_or(0));
        c.txnid_least_bits.push(m.txnid_least_bits.unwrap_or(0));
        c.expected_status.push(opt_enum(m.expected_status));
        c.new_status.push(opt_enum(m.new_status));
        c.timeout_ms.push(m.timeout_ms.unwrap_or(0));
        c.start_time.push(m.start_time.unwrap_or(0));
        c.last_modification_time
            .push(m.last_modification_time.unwrap_or(0));
        c.max_local_txn_id.push(m.max_local_txn_id.unwrap_or(0));
        c.owner.push(m.owner.as_deref().unwrap_or(""))?;
        c.client_name.push(m.client_name.as_deref().unwrap_or(""))?;
        for p in &m.partitions {
            c.partitions.push(p)?;
        }
        c.partition_offsets.push(len_i32(c.partitions.len())?);
        for s in &m.subscriptions {
            c.subscription_topics.push(&s.topic)?;
            c.subscription_names.push(&s.subscription)?;
        }
        c.subscription_offsets
            .push(len_i32(c.subscription_topics.len())?);
        Ok(())
    })?;
    c.origin = origin;
    Ok(c)
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
    each_record(entries, &mut origin, |r| {
        let m: PendingAckMetadataEntry = decode(r)?;
        c.op.push(opt_enum(m.pending_ack_op));
        c.ack_type.push(opt_enum(m.ack_type));
        c.txnid_most_bits.push(m.txnid_most_bits.unwrap_or(0));
        c.txnid_least_bits.push(m.txnid_least_bits.unwrap_or(0));
        for p in &m.pending_ack_metadata {
            c.ledger_id.push(p.ledger_id);
            c.entry_id.push(p.entry_id);
            c.batch_size.push(p.batch_size.unwrap_or(-1));
            c.ack_set_words.extend_from_slice(&p.ack_set);
            c.ack_set_offsets.push(len_i32(c.ack_set_words.len())?);
        }
        c.position_offsets.push(len_i32(c.ledger_id.len())?);
        Ok(())
    })?;
    c.origin = origin;
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::encode_batch;
    use crate::proto::{PendingAckMetadata, Subscription};

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
