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
use crate::txnlog_record::{FIELD_TIMED_OUT, METADATA_OPS, TXN_STATUSES};
use crate::wire::{enum_value, utf8, wrong_type, Value, Wire};
use std::ops::RangeInclusive;

/// Every `PendingAckOp` value (`ACK=1; COMMIT=2; ABORT=3`).
pub const PENDING_ACK_OPS: RangeInclusive<i8> = 1..=3;
/// Every `AckType` value (`Individual=0; Cumulative=1`).
pub const ACK_TYPES: RangeInclusive<i8> = 0..=1;

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

    /// Appends one string.
    pub fn push_str(&mut self, s: &str) -> Result<()> {
        self.push_bytes(s.as_bytes())
    }

    /// Keeps the first `n` strings (no-op when there are fewer).
    pub fn truncate(&mut self, n: usize) {
        if n < self.len() {
            self.offsets.truncate(n + 1);
            let end = self.offsets.last().map_or(0, |&e| e as usize);
            self.data.truncate(end);
        }
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

/// `TransactionMetadataEntry` records as columns. Absent enums are -1 (a
/// value outside its enum reads as absent, as proto2's closed enums do),
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
    /// txnstream field 1000 (the abort was caused by the timeout): -1 when
    /// absent, else 0 or 1.
    pub timed_out: Vec<i8>,
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
    let mut c = TxnLogColumns::empty();
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
    let mut timed_out = -1i8;
    let mut w = Wire::new(r, 0, 0);
    while let Some((field, value, at)) = w.next_field()? {
        match (field, value) {
            // An enum value outside the enum leaves the field as it was (proto2).
            (1, Value::Varint(v)) => op = enum_value(v, METADATA_OPS).unwrap_or(op),
            (2, Value::Varint(v)) => least = v,
            (3, Value::Varint(v)) => most = v,
            (4, Value::Varint(v)) => expected = enum_value(v, TXN_STATUSES).unwrap_or(expected),
            (5, Value::Varint(v)) => new = enum_value(v, TXN_STATUSES).unwrap_or(new),
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
            (FIELD_TIMED_OUT, Value::Varint(v)) => timed_out = i8::from(v != 0),
            (1..=13 | FIELD_TIMED_OUT, _) => return Err(wrong_type(field, at)),
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
    c.timed_out.push(timed_out);
    c.owner.push_bytes(owner)?;
    c.client_name.push_bytes(client)?;
    c.partition_offsets.push(len_i32(c.partitions.len())?);
    c.subscription_offsets
        .push(len_i32(c.subscription_topics.len())?);
    Ok(())
}

/// `PendingAckMetadataEntry` records as columns, with the acked positions
/// flattened. Absent enums are -1 (as are values outside the enum); an
/// absent position batch size is -1.
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
    let mut c = PendingAckColumns::empty();
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
            (1, Value::Varint(v)) => op = enum_value(v, PENDING_ACK_OPS).unwrap_or(op),
            (2, Value::Varint(v)) => ack_type = enum_value(v, ACK_TYPES).unwrap_or(ack_type),
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

// ------------------------------------------------------------ lenient decode

/// Columns that records decode into, one row per record. A record that
/// fails half-way is rolled back to a [`mark`](RecordColumns::mark) and
/// replaced by a null row, so one malformed record never shifts or breaks
/// the rows of the others (the Spark data sources and UDFs decode this way).
pub trait RecordColumns {
    /// Lengths to roll back to.
    type Mark: Copy;
    /// Columns holding no row.
    fn empty() -> Self;
    /// Number of rows.
    fn rows(&self) -> usize;
    /// The current lengths of every column.
    fn mark(&self) -> Self::Mark;
    /// Drops everything pushed since `m`.
    fn rollback(&mut self, m: Self::Mark);
    /// Decodes one record into a new row.
    fn push_record(&mut self, r: &[u8]) -> Result<()>;
    /// Pushes a row of defaults (no list items) that callers mark null.
    fn push_null(&mut self) -> Result<()> {
        // An empty message is every field absent: it always decodes.
        self.push_record(&[])
    }
}

impl TxnLogColumns {
    /// Columns holding no record.
    pub fn empty() -> Self {
        Self {
            partition_offsets: vec![0],
            subscription_offsets: vec![0],
            ..Default::default()
        }
    }
}

impl RecordColumns for TxnLogColumns {
    /// (rows, partitions, subscriptions)
    type Mark = (usize, usize, usize);

    fn empty() -> Self {
        TxnLogColumns::empty()
    }

    fn rows(&self) -> usize {
        self.metadata_op.len()
    }

    fn mark(&self) -> Self::Mark {
        (
            self.rows(),
            self.partitions.len(),
            self.subscription_topics.len(),
        )
    }

    fn rollback(&mut self, (rows, parts, subs): Self::Mark) {
        self.metadata_op.truncate(rows);
        self.txnid_most_bits.truncate(rows);
        self.txnid_least_bits.truncate(rows);
        self.expected_status.truncate(rows);
        self.new_status.truncate(rows);
        self.timeout_ms.truncate(rows);
        self.start_time.truncate(rows);
        self.last_modification_time.truncate(rows);
        self.max_local_txn_id.truncate(rows);
        self.timed_out.truncate(rows);
        self.owner.truncate(rows);
        self.client_name.truncate(rows);
        self.partition_offsets.truncate(rows + 1);
        self.partitions.truncate(parts);
        self.subscription_offsets.truncate(rows + 1);
        self.subscription_topics.truncate(subs);
        self.subscription_names.truncate(subs);
    }

    fn push_record(&mut self, r: &[u8]) -> Result<()> {
        decode_txn_record(r, self)
    }
}

impl PendingAckColumns {
    /// Columns holding no record.
    pub fn empty() -> Self {
        Self {
            position_offsets: vec![0],
            ack_set_offsets: vec![0],
            ..Default::default()
        }
    }
}

impl RecordColumns for PendingAckColumns {
    /// (rows, positions, ack-set words)
    type Mark = (usize, usize, usize);

    fn empty() -> Self {
        PendingAckColumns::empty()
    }

    fn rows(&self) -> usize {
        self.op.len()
    }

    fn mark(&self) -> Self::Mark {
        (self.rows(), self.ledger_id.len(), self.ack_set_words.len())
    }

    fn rollback(&mut self, (rows, positions, words): Self::Mark) {
        self.op.truncate(rows);
        self.ack_type.truncate(rows);
        self.txnid_most_bits.truncate(rows);
        self.txnid_least_bits.truncate(rows);
        self.position_offsets.truncate(rows + 1);
        self.ledger_id.truncate(positions);
        self.entry_id.truncate(positions);
        self.batch_size.truncate(positions);
        self.ack_set_offsets.truncate(positions + 1);
        self.ack_set_words.truncate(words);
    }

    fn push_record(&mut self, r: &[u8]) -> Result<()> {
        decode_ack_record(r, self)
    }
}

/// How a row of a [`Lenient`] decode came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum RowStatus {
    /// The record decoded.
    Ok = 0,
    /// The entry split into records but this record is malformed: its
    /// fields are null, its batch index and size are known.
    BadRecord = 1,
    /// The entry itself is malformed (framing): one row stands for the whole
    /// entry, with batch index and size unknown (stored as 0).
    BadEntry = 2,
}

/// Rows of a lenient decode: one per record, and one per entry that could
/// not be split into records. Every row of `columns` lines up with `origin`,
/// `status` and `error` (empty for good rows).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lenient<C> {
    /// Decoded fields (defaults on rows whose status is not `Ok`).
    pub columns: C,
    /// Entry index (in the input), batch index and batch size of each row.
    pub origin: RecordOrigin,
    /// [`RowStatus`] of each row, as `u8`.
    pub status: Vec<u8>,
    /// Why a row failed ("" for good rows).
    pub error: Utf8Column,
}

impl<C: RecordColumns> Default for Lenient<C> {
    fn default() -> Self {
        Self {
            columns: C::empty(),
            origin: RecordOrigin::default(),
            status: Vec::new(),
            error: Utf8Column::default(),
        }
    }
}

impl<C: RecordColumns> Lenient<C> {
    /// Number of rows.
    pub fn len(&self) -> usize {
        self.status.len()
    }

    /// True when there is no row.
    pub fn is_empty(&self) -> bool {
        self.status.is_empty()
    }

    /// Adds the one row standing for input entry `idx`, which could not be
    /// read or split into records, with `message` as its error.
    pub fn push_bad_entry(&mut self, idx: usize, message: &str) -> Result<()> {
        let entry_u32 = u32::try_from(idx).map_err(|_| Error::invalid("too many entries"))?;
        self.columns.push_null()?;
        self.origin.entry_index.push(entry_u32);
        self.origin.batch_index.push(0);
        self.origin.batch_size.push(0);
        self.status.push(RowStatus::BadEntry as u8);
        self.error.push_str(message)
    }

    /// Replaces the error message of the rows from `from` on by `message`
    /// where `which(row)` says so (e.g. a row whose cursor state is wrong).
    pub fn set_errors(
        &mut self,
        from: usize,
        message: &str,
        which: impl Fn(usize) -> bool,
    ) -> Result<()> {
        let kept: Vec<String> = (from..self.len())
            .map(|k| self.error.get(k).to_owned())
            .collect();
        self.error.truncate(from);
        for (k, old) in (from..).zip(kept) {
            self.error.push_str(if which(k) { message } else { &old })?;
        }
        Ok(())
    }

    /// Adds the rows of input entry `idx`; returns how many. `pos` (when
    /// known) goes into error messages. Only a column overflowing its
    /// 32-bit offsets is an error; damage in the entry becomes error rows.
    pub fn push_entry(
        &mut self,
        idx: usize,
        entry: &[u8],
        pos: Option<crate::position::Position>,
    ) -> Result<usize> {
        let entry_u32 = u32::try_from(idx).map_err(|_| Error::invalid("too many entries"))?;
        let mut records: Vec<&[u8]> = Vec::new();
        match for_each_record(entry, |r| records.push(r)) {
            Err(e) => {
                let e = match pos {
                    Some(p) => e.at(p),
                    None => e,
                };
                self.push_bad_entry(idx, &e.to_string())?;
                Ok(1)
            }
            Ok(n) => {
                let size =
                    u32::try_from(n).map_err(|_| Error::invalid("entry holds over 4G records"))?;
                for (i, r) in (0u32..).zip(records) {
                    let m = self.columns.mark();
                    match self.columns.push_record(r) {
                        Ok(()) => {
                            self.status.push(RowStatus::Ok as u8);
                            self.error.push_str("")?;
                        }
                        Err(e) => {
                            self.columns.rollback(m);
                            self.columns.push_null()?;
                            self.status.push(RowStatus::BadRecord as u8);
                            let at = pos.map_or_else(String::new, |p| format!(" of entry {p}"));
                            self.error.push_str(&format!("record {i}{at}: {e}"))?;
                        }
                    }
                    self.origin.entry_index.push(entry_u32);
                    self.origin.batch_index.push(i);
                    self.origin.batch_size.push(size);
                }
                Ok(n)
            }
        }
    }
}

/// Decodes `entries` leniently: a malformed entry or record becomes a row
/// with a [`RowStatus`] and an error message instead of failing the call.
pub fn decode_lenient<C: RecordColumns>(entries: &[&[u8]]) -> Result<Lenient<C>> {
    let mut out = Lenient::<C>::default();
    for (idx, entry) in entries.iter().enumerate() {
        out.push_entry(idx, entry, None)?;
    }
    Ok(out)
}

// --------------------------------------------------------------- Arrow input

/// The values of an Arrow `binary` (`offset_width` 4) or `large_binary`
/// (8) array as slices of `data`, without copying: value `i` is
/// `data[offsets[start + i]..offsets[start + i + 1]]` for `i < len`, with
/// `offsets` the raw little-endian offsets buffer and `start` the array's
/// slice offset. Offsets out of order or out of bounds are an error (the
/// buffers come from users), never a panic.
pub fn arrow_binary_values<'a>(
    offsets: &[u8],
    offset_width: usize,
    start: usize,
    len: usize,
    data: &'a [u8],
) -> Result<Vec<&'a [u8]>> {
    if offset_width != 4 && offset_width != 8 {
        return Err(Error::invalid(format!(
            "offset width must be 4 (binary) or 8 (large_binary), got {offset_width}"
        )));
    }
    let need = start
        .checked_add(len)
        .and_then(|n| n.checked_add(1))
        .and_then(|n| n.checked_mul(offset_width))
        .ok_or_else(|| Error::invalid("array offset + length overflows"))?;
    if offsets.len() < need {
        return Err(Error::invalid(format!(
            "offsets buffer holds {} bytes; {len} values from offset {start} need {need}",
            offsets.len()
        )));
    }
    let at = |k: usize| -> i64 {
        let b = &offsets[k * offset_width..(k + 1) * offset_width];
        match *b {
            [a, b, c, d] => i64::from(i32::from_le_bytes([a, b, c, d])),
            [a, b, c, d, e, f, g, h] => i64::from_le_bytes([a, b, c, d, e, f, g, h]),
            _ => -1,
        }
    };
    let mut out = Vec::with_capacity(len);
    let mut lo = at(start);
    for k in start + 1..=start + len {
        let hi = at(k);
        if lo < 0 || hi < lo || hi as u64 > data.len() as u64 {
            return Err(Error::invalid(format!(
                "Arrow offsets [{lo}, {hi}) of value {} are out of order or beyond the \
                 {}-byte data buffer",
                k - start - 1,
                data.len()
            )));
        }
        out.push(&data[lo as usize..hi as usize]);
        lo = hi;
    }
    Ok(out)
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
        assert_eq!(c.timed_out, vec![-1, -1, -1]);
        let timed = crate::txnlog_record::Encode {
            op: 3,
            least_bits: 7,
            most_bits: 0,
            expected_status: Some(0),
            new_status: Some(3),
            timed_out: true,
            ..Default::default()
        }
        .encode();
        let c = decode_txn_log(&[&timed]).unwrap();
        assert_eq!((c.timed_out[0], c.new_status[0]), (1, 3));
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

    #[test]
    fn lenient_rows_line_up_around_bad_records_and_entries() {
        let good = TransactionMetadataEntry {
            metadata_op: Some(1),
            txnid_least_bits: Some(5),
            partitions: vec!["a".into(), "b".into()],
            ..Default::default()
        }
        .encode_to_vec();
        // A record that adds a partition, then breaks: its partition must not leak.
        let mut half = TransactionMetadataEntry {
            partitions: vec!["leak".into()],
            ..Default::default()
        }
        .encode_to_vec();
        half.extend_from_slice(b"\xff\xff");
        let batch = encode_batch(&[good.as_slice(), &half, &good]);
        let broken = b"\x0e\x01\x00\x07".to_vec(); // unknown batch version
        let l = decode_lenient::<TxnLogColumns>(&[&batch, &broken, &good]).unwrap();
        assert_eq!(l.len(), 5);
        assert_eq!(l.status, vec![0, 1, 0, 2, 0]);
        assert_eq!(l.origin.entry_index, vec![0, 0, 0, 1, 2]);
        assert_eq!(l.origin.batch_index, vec![0, 1, 2, 0, 0]);
        assert_eq!(l.origin.batch_size, vec![3, 3, 3, 0, 1]);
        let c = &l.columns;
        assert_eq!(c.metadata_op, vec![1, -1, 1, -1, 1]);
        assert_eq!(c.partition_offsets, vec![0, 2, 2, 4, 4, 6]);
        assert!(!c.partitions.data.windows(4).any(|w| w == b"leak"));
        assert!(l.error.get(1).starts_with("record 1"), "{}", l.error.get(1));
        assert!(l.error.get(3).contains("unknown batch version"));
        assert_eq!(l.error.get(0), "");
        // Good entries alone decode to the same fields as the strict decoder.
        let strict = decode_txn_log(&[&good]).unwrap();
        assert_eq!(strict.partitions.get(1), c.partitions.get(1));
    }

    #[test]
    fn lenient_pending_ack_rolls_back_positions() {
        let m = PendingAckMetadataEntry {
            pending_ack_op: Some(1),
            pending_ack_metadata: vec![PendingAckMetadata {
                ledger_id: 4,
                entry_id: 5,
                ack_set: vec![-2, 7],
                batch_size: Some(70),
            }],
            ..Default::default()
        }
        .encode_to_vec();
        let mut bad = m.clone();
        bad.push(0x08); // field 1 varint without its value
        let batch = encode_batch(&[bad.as_slice(), &m]);
        let l = decode_lenient::<PendingAckColumns>(&[&batch]).unwrap();
        assert_eq!(l.status, vec![1, 0]);
        let c = &l.columns;
        assert_eq!(c.position_offsets, vec![0, 0, 1]);
        assert_eq!(c.ledger_id, vec![4]);
        assert_eq!(c.ack_set_offsets, vec![0, 2]);
        assert_eq!(c.op, vec![-1, 1]);
    }

    #[test]
    fn arrow_values_from_buffers() {
        let data = b"abcdef";
        let offs: Vec<u8> = [0i32, 2, 2, 6]
            .iter()
            .flat_map(|o| o.to_le_bytes())
            .collect();
        let v = arrow_binary_values(&offs, 4, 0, 3, data).unwrap();
        assert_eq!(v, vec![b"ab".as_slice(), b"", b"cdef"]);
        let v = arrow_binary_values(&offs, 4, 1, 2, data).unwrap();
        assert_eq!(v, vec![b"".as_slice(), b"cdef"]);
        let large: Vec<u8> = [0i64, 6].iter().flat_map(|o| o.to_le_bytes()).collect();
        assert_eq!(
            arrow_binary_values(&large, 8, 0, 1, data).unwrap(),
            vec![b"abcdef".as_slice()]
        );
        assert!(arrow_binary_values(&offs, 4, 0, 4, data).is_err());
        assert!(arrow_binary_values(&offs, 3, 0, 1, data).is_err());
        let backwards: Vec<u8> = [0i32, 4, 2].iter().flat_map(|o| o.to_le_bytes()).collect();
        assert!(arrow_binary_values(&backwards, 4, 0, 2, data).is_err());
        let beyond: Vec<u8> = [0i32, 9].iter().flat_map(|o| o.to_le_bytes()).collect();
        assert!(arrow_binary_values(&beyond, 4, 0, 1, data).is_err());
        assert!(arrow_binary_values(&offs, 4, usize::MAX, 1, data).is_err());
    }
}
