//! Columnar scan of topic messages: what the Spark data source `txnstream`
//! reads in each task.
//!
//! A scan decodes every message of every entry of a range (a managed
//! ledger's entries, or a remote segment's frames) into Arrow-shaped
//! columns: fixed-width vectors, strings and binaries as data + int32
//! offsets, nullable columns with a validity vector, and the properties as
//! a list (offsets) over flat key and value string columns. The binding
//! hands them to Python as numpy arrays and bytes, so no Python object is
//! built per message.
//!
//! Transaction markers are never rows. Messages of the transactions in the
//! caller's `aborted` set are dropped (READ_COMMITTED); nothing else is
//! filtered: a Spark read is not a cursor read, so acknowledgements (whole
//! entries or batch indexes) play no part. A scan stops after `max_entries`
//! entries or once the values hold `max_bytes`, and reports the last
//! position it looked at so the caller pages. A damaged entry is a
//! [`Error::CorruptEntry`] naming its position, as it is for a consumer.

use crate::columns::Utf8Column;
use crate::error::{Error, Result};
use crate::ledger::ManagedLedger;
use crate::message::{self, txn_of};
use crate::tiered::segment::FRAME_LEN;
use crate::Position;
use std::collections::HashSet;

/// A transaction id as `(most_bits, least_bits)`.
pub type TxnId = (u64, u64);

/// Entries read from a ledger per `read_range` call inside a scan (bounds
/// the bytes held between two checks of `max_bytes`).
const READ_STEP: usize = 64;

/// A column of byte strings: value `i` is `data[offsets[i]..offsets[i+1]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BinaryColumn {
    /// Values back to back.
    pub data: Vec<u8>,
    /// `len + 1` offsets (Arrow `binary` layout, int32).
    pub offsets: Vec<i32>,
}

impl Default for BinaryColumn {
    fn default() -> Self {
        Self {
            data: Vec::new(),
            offsets: vec![0],
        }
    }
}

impl BinaryColumn {
    fn push(&mut self, v: &[u8]) -> Result<()> {
        self.data.extend_from_slice(v);
        let end = i32::try_from(self.data.len())
            .map_err(|_| Error::invalid("binary column exceeds 2 GiB; scan fewer entries"))?;
        self.offsets.push(end);
        Ok(())
    }

    /// Value `i`.
    pub fn get(&self, i: usize) -> &[u8] {
        &self.data[self.offsets[i] as usize..self.offsets[i + 1] as usize]
    }
}

/// Topic messages as columns, one row per message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopicColumns {
    /// The payloads.
    pub value: BinaryColumn,
    /// `partition_key` (`""` where `key_valid` is false).
    pub key: Utf8Column,
    /// False where the message has no key.
    pub key_valid: Vec<bool>,
    /// Ledger of the entry.
    pub ledger_id: Vec<u64>,
    /// Entry id.
    pub entry_id: Vec<u64>,
    /// Index in the batch (0 for an unbatched entry).
    pub batch_index: Vec<i32>,
    /// Messages in the entry (1 for an unbatched entry).
    pub batch_size: Vec<i32>,
    /// Milliseconds since the epoch.
    pub publish_time: Vec<u64>,
    /// The producer's name.
    pub producer_name: Utf8Column,
    /// The message's sequence id.
    pub sequence_id: Vec<u64>,
    /// Transaction id, most bits (0 where `txn_valid` is false).
    pub txnid_most_bits: Vec<u64>,
    /// Transaction id, least bits (0 where `txn_valid` is false).
    pub txnid_least_bits: Vec<u64>,
    /// False where the message was not sent in a transaction.
    pub txn_valid: Vec<bool>,
    /// Message `i` has properties `property_offsets[i]..[i+1]` (len + 1 offsets).
    pub property_offsets: Vec<i32>,
    /// Flattened property keys.
    pub property_keys: Utf8Column,
    /// Flattened property values.
    pub property_values: Utf8Column,
}

impl TopicColumns {
    /// No rows.
    pub fn new() -> Self {
        Self {
            property_offsets: vec![0],
            ..Self::default()
        }
    }

    /// Number of messages (rows).
    pub fn len(&self) -> usize {
        self.ledger_id.len()
    }

    /// True when there is no row.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Decodes the entry at `pos` and appends its messages, unless it is a
    /// marker or was written by a transaction in `aborted`. Returns whether
    /// it was a marker. A damaged entry is an error naming `pos` (the
    /// columns are then to be dropped: a row may be half appended).
    pub fn push_entry(
        &mut self,
        pos: Position,
        entry: &[u8],
        aborted: Option<&HashSet<TxnId>>,
    ) -> Result<bool> {
        let d = message::decode(entry).map_err(|e| e.at(pos))?;
        if d.marker().is_some() {
            return Ok(true);
        }
        let txn = txn_of(&d.meta);
        if let (Some(t), Some(a)) = (txn, aborted) {
            if a.contains(&t) {
                return Ok(false);
            }
        }
        let batch_size = i32::try_from(d.batch_size)
            .map_err(|_| Error::corrupt_entry(0, "batch size out of range").at(pos))?;
        for m in &d.messages {
            let payload = entry.get(m.payload.clone()).ok_or_else(|| {
                Error::corrupt_entry(m.payload.start, "payload outside the entry").at(pos)
            })?;
            self.value.push(payload)?;
            self.key.push_str(m.key.as_deref().unwrap_or(""))?;
            self.key_valid.push(m.key.is_some());
            self.ledger_id.push(pos.ledger_id);
            self.entry_id.push(pos.entry_id);
            // batch_index < MAX_BATCH_MESSAGES (2^20): always fits.
            self.batch_index
                .push(i32::try_from(m.batch_index).unwrap_or(i32::MAX));
            self.batch_size.push(batch_size);
            self.publish_time.push(d.meta.publish_time);
            self.producer_name.push_str(&d.meta.producer_name)?;
            self.sequence_id.push(m.sequence_id);
            let (most, least) = txn.unwrap_or((0, 0));
            self.txnid_most_bits.push(most);
            self.txnid_least_bits.push(least);
            self.txn_valid.push(txn.is_some());
            for (k, v) in &m.properties {
                self.property_keys.push_str(k)?;
                self.property_values.push_str(v)?;
            }
            let n = i32::try_from(self.property_keys.len())
                .map_err(|_| Error::invalid("properties column exceeds 2^31 items"))?;
            self.property_offsets.push(n);
        }
        Ok(false)
    }
}

/// What one scan call read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicScan {
    /// The messages.
    pub columns: TopicColumns,
    /// Last position looked at (markers and dropped entries included);
    /// the scan's `after` when nothing was.
    pub last: Option<Position>,
    /// Entries looked at.
    pub entries: usize,
    /// Of which markers.
    pub markers: usize,
}

/// Bounds of one scan call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanLimits {
    /// Most entries looked at.
    pub max_entries: usize,
    /// Stop once the payloads hold at least this many bytes (checked
    /// between entries, so one call may go past it by one entry's worth).
    pub max_bytes: usize,
}

/// Scans the entries of `ml` after `after` (exclusive; None: from the
/// first) and before `limit` (exclusive; None: to the end) into columns,
/// dropping markers and the messages of `aborted` transactions.
pub fn scan_topic_columns(
    ml: &ManagedLedger,
    after: Option<Position>,
    limit: Option<Position>,
    limits: ScanLimits,
    aborted: Option<&HashSet<TxnId>>,
) -> Result<TopicScan> {
    let mut out = TopicScan {
        columns: TopicColumns::new(),
        last: after,
        entries: 0,
        markers: 0,
    };
    let mut cur = after;
    while out.entries < limits.max_entries && out.columns.value.data.len() < limits.max_bytes {
        let want = READ_STEP.min(limits.max_entries - out.entries);
        let mut positions = Vec::with_capacity(want);
        while positions.len() < want {
            let Some(n) = ml.next_after(cur) else { break };
            if limit.is_some_and(|l| n >= l) {
                break;
            }
            positions.push(n);
            cur = Some(n);
        }
        let (Some(&first), Some(&last)) = (positions.first(), positions.last()) else {
            break;
        };
        for (pos, data) in ml.read_range(first, last)? {
            if out.columns.push_entry(pos, &data, aborted)? {
                out.markers += 1;
            }
            out.entries += 1;
            out.last = Some(pos);
            if out.columns.value.data.len() >= limits.max_bytes {
                break;
            }
        }
        if positions.len() < want || out.last != Some(last) {
            break;
        }
    }
    Ok(out)
}

/// Where a segment scan stands: byte offset of the next frame and its entry id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentCursor {
    /// Byte offset of the next frame in the segment data.
    pub offset: usize,
    /// Entry id of that frame.
    pub entry_id: u64,
}

/// What one segment scan call read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentScan {
    /// The messages.
    pub columns: TopicColumns,
    /// Where to go on (None: the range or the data ended).
    pub next: Option<SegmentCursor>,
    /// Entries looked at (frames skipped before `start_entry` excluded).
    pub entries: usize,
    /// Of which markers.
    pub markers: usize,
}

/// Scans a remote segment's data (frames `len u32 | crc32c u32 | bytes`,
/// see [`crate::tiered::segment`]) of ledger `ledger_id` from `from` into
/// columns: entries `start_entry..=last_entry`, markers and `aborted`
/// transactions dropped. Frames before `start_entry` are stepped over
/// (bounds checked, not decoded). Start with `from = SegmentCursor { offset:
/// 0, entry_id: <the segment's first entry> }` and go on with `next`.
pub fn scan_segment_columns(
    ledger_id: u64,
    data: &[u8],
    from: SegmentCursor,
    start_entry: u64,
    last_entry: u64,
    limits: ScanLimits,
    aborted: Option<&HashSet<TxnId>>,
) -> Result<SegmentScan> {
    let mut out = SegmentScan {
        columns: TopicColumns::new(),
        next: None,
        entries: 0,
        markers: 0,
    };
    let (mut at, mut id) = (from.offset, from.entry_id);
    loop {
        if at >= data.len() || id > last_entry {
            return Ok(out);
        }
        if out.entries >= limits.max_entries || out.columns.value.data.len() >= limits.max_bytes {
            out.next = Some(SegmentCursor {
                offset: at,
                entry_id: id,
            });
            return Ok(out);
        }
        let pos = Position::new(ledger_id, id);
        let frame_at = at;
        let damaged = move |reason: String| Error::CorruptEntry {
            position: Some(pos),
            offset: frame_at,
            reason,
        };
        let header = data.get(at..at + FRAME_LEN).ok_or_else(|| {
            damaged(format!(
                "{} bytes left, less than a frame header",
                data.len() - at
            ))
        })?;
        let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
        let start = at + FRAME_LEN;
        let end = start
            .checked_add(len)
            .filter(|&e| e <= data.len())
            .ok_or_else(|| {
                damaged(format!(
                    "frame of {len} bytes runs past the end of the data"
                ))
            })?;
        if id >= start_entry {
            let entry = &data[start..end];
            if crc32c::crc32c(entry) != crc {
                return Err(damaged("remote segment entry checksum mismatch".into()));
            }
            if out.columns.push_entry(pos, entry, aborted)? {
                out.markers += 1;
            }
            out.entries += 1;
        }
        at = end;
        id = id
            .checked_add(1)
            .ok_or_else(|| damaged("entry id overflows".into()))?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{encode_batch, encode_marker, encode_message, Header, OutMessage};
    use crate::tiered::encode_segment;

    fn msg(payload: &'static [u8], key: Option<&'static str>, seq: u64) -> OutMessage<'static> {
        OutMessage {
            payload,
            key,
            properties: &[],
            sequence_id: seq,
        }
    }

    fn entries() -> Vec<Vec<u8>> {
        let props = vec![
            ("a".to_owned(), "1".to_owned()),
            ("b".to_owned(), "2".to_owned()),
        ];
        let h = |txn| Header {
            producer_name: "prod",
            publish_time: 99,
            txn,
        };
        let with_props = OutMessage {
            payload: b"p0",
            key: Some("k"),
            properties: &props,
            sequence_id: 1,
        };
        vec![
            encode_message(&h(None), &with_props),
            encode_batch(
                &h(Some((1, 2))),
                &[msg(b"b0", None, 5), msg(b"", Some("x"), 6)],
            )
            .expect("batch"),
            encode_message(&h(Some((1, 3))), &msg(b"gone", None, 7)),
            encode_marker(false, (1, 3), 100),
            encode_marker(true, (1, 2), 100),
            encode_message(&h(None), &msg(b"last", None, 8)),
        ]
    }

    #[test]
    fn segment_scan_fills_every_column_and_drops_markers_and_aborts() {
        let es = entries();
        let (data, _) = encode_segment(4, 10, es.iter().map(Vec::as_slice)).expect("segment");
        let aborted: HashSet<TxnId> = [(1, 3)].into_iter().collect();
        let limits = ScanLimits {
            max_entries: 100,
            max_bytes: 1 << 20,
        };
        let from = SegmentCursor {
            offset: 0,
            entry_id: 10,
        };
        let s = scan_segment_columns(4, &data, from, 10, u64::MAX, limits, Some(&aborted))
            .expect("scan");
        let c = &s.columns;
        assert_eq!((s.entries, s.markers, s.next), (6, 2, None));
        assert_eq!(c.len(), 4);
        assert_eq!(c.entry_id, vec![10, 11, 11, 15]);
        assert_eq!(c.ledger_id, vec![4; 4]);
        assert_eq!(c.batch_index, vec![0, 0, 1, 0]);
        assert_eq!(c.batch_size, vec![1, 2, 2, 1]);
        assert_eq!(c.value.get(0), b"p0");
        assert_eq!(c.value.get(2), b"");
        assert_eq!(c.value.get(3), b"last");
        assert_eq!(c.key_valid, vec![true, false, true, false]);
        assert_eq!(c.key.get(2), "x");
        assert_eq!(c.sequence_id, vec![1, 5, 6, 8]);
        assert_eq!(c.txn_valid, vec![false, true, true, false]);
        assert_eq!(c.txnid_least_bits, vec![0, 2, 2, 0]);
        assert_eq!(c.property_offsets, vec![0, 2, 2, 2, 2]);
        assert_eq!(c.property_keys.get(1), "b");
        assert_eq!(c.property_values.get(1), "2");
        assert_eq!(c.producer_name.get(3), "prod");
        assert_eq!(c.publish_time, vec![99; 4]);
        // Without the aborted set the aborted transaction's message is a row.
        let all = scan_segment_columns(4, &data, from, 10, u64::MAX, limits, None).expect("scan");
        assert_eq!(all.columns.len(), 5);
    }

    #[test]
    fn segment_scan_pages_and_bounds() {
        let es = entries();
        let (data, _) = encode_segment(4, 10, es.iter().map(Vec::as_slice)).expect("segment");
        let limits = ScanLimits {
            max_entries: 2,
            max_bytes: 1 << 20,
        };
        let mut from = Some(SegmentCursor {
            offset: 0,
            entry_id: 10,
        });
        let mut ids = Vec::new();
        while let Some(f) = from {
            let s = scan_segment_columns(4, &data, f, 11, 14, limits, None).expect("scan");
            assert!(s.entries <= 2);
            ids.extend(s.columns.entry_id);
            from = s.next;
        }
        assert_eq!(ids, vec![11, 11, 12]); // 11..=14: 13 and 14 are markers
    }

    #[test]
    fn damaged_segment_entry_names_its_position() {
        let es = entries();
        let (mut data, _) = encode_segment(4, 10, es.iter().map(Vec::as_slice)).expect("segment");
        let second = FRAME_LEN + es[0].len();
        data[second + FRAME_LEN + 3] ^= 0x40;
        let limits = ScanLimits {
            max_entries: 100,
            max_bytes: 1 << 20,
        };
        let from = SegmentCursor {
            offset: 0,
            entry_id: 10,
        };
        let err =
            scan_segment_columns(4, &data, from, 10, u64::MAX, limits, None).expect_err("damaged");
        match err {
            Error::CorruptEntry { position, .. } => {
                assert_eq!(position, Some(Position::new(4, 11)))
            }
            other => panic!("not a CorruptEntry: {other:?}"),
        }
        // Frames before the start are stepped over, not checked.
        let s = scan_segment_columns(4, &data, from, 12, u64::MAX, limits, None).expect("scan");
        assert_eq!(s.columns.entry_id, vec![12, 15]);
    }
}
