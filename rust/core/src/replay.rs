//! Replay of a log written by a [`BufferedWriter`](crate::writer::BufferedWriter):
//! every live record with its [`TxnPosition`], in log order, columnar.
//!
//! A log may mix batched and unbatched entries (batching is switchable at
//! runtime). Entries deleted for the cursor are skipped by the cursor
//! itself; inside a partially deleted batched entry the cursor's ack set
//! (bit = 1: present) says which batch indexes are still live. Recovery of
//! million-record logs reads these columns instead of one object per record.

use crate::ackset::AckSet;
use crate::error::{Error, Result};
use crate::frame::for_each_record;
use crate::ledger::{Cursor, ManagedLedger};
use crate::position::{Position, TxnPosition};

/// Entries read per cursor call while replaying a whole log.
pub const REPLAY_CHUNK_ENTRIES: usize = 4096;

/// Live records, Arrow-style: record `i` is `data[offsets[i]..offsets[i+1]]`
/// at `(ledger_id[i], entry_id[i])`, index `batch_index[i]` of `batch_size[i]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveRecords {
    /// Ledger of each record's entry.
    pub ledger_id: Vec<u64>,
    /// Entry id of each record's entry.
    pub entry_id: Vec<u64>,
    /// Records in that entry (1 for an unbatched entry).
    pub batch_size: Vec<u32>,
    /// Index of the record in its entry.
    pub batch_index: Vec<u32>,
    /// `len + 1` offsets into `data`.
    pub offsets: Vec<i64>,
    /// Record bytes back to back.
    pub data: Vec<u8>,
    /// Entries read (live or partially live).
    pub entries: u64,
    /// Records skipped because their batch index was deleted.
    pub skipped: u64,
}

impl Default for LiveRecords {
    fn default() -> Self {
        Self {
            ledger_id: Vec::new(),
            entry_id: Vec::new(),
            batch_size: Vec::new(),
            batch_index: Vec::new(),
            offsets: vec![0],
            data: Vec::new(),
            entries: 0,
            skipped: 0,
        }
    }
}

impl LiveRecords {
    /// Number of live records.
    pub fn len(&self) -> usize {
        self.batch_index.len()
    }

    /// True when there is none.
    pub fn is_empty(&self) -> bool {
        self.batch_index.is_empty()
    }

    /// Bytes of record `i`.
    pub fn record(&self, i: usize) -> &[u8] {
        &self.data[self.offsets[i] as usize..self.offsets[i + 1] as usize]
    }

    /// Position of record `i`.
    pub fn position(&self, i: usize) -> TxnPosition {
        TxnPosition {
            position: Position::new(self.ledger_id[i], self.entry_id[i]),
            batch_size: self.batch_size[i],
            batch_index: self.batch_index[i],
        }
    }

    /// Appends the live records of the entry at `pos`. `acks` is the
    /// cursor's ack set for it (`None`: every record is live).
    pub fn push_entry(&mut self, pos: Position, entry: &[u8], acks: Option<&AckSet>) -> Result<()> {
        let first = self.len();
        let data_start = self.data.len();
        let mut index = 0u32;
        let mut skipped = 0u64;
        let counted = for_each_record(entry, |rec| {
            let live = acks.is_none_or(|a| a.get(i64::from(index)).unwrap_or(true));
            if live {
                self.data.extend_from_slice(rec);
                self.offsets.push(self.data.len() as i64);
                self.batch_index.push(index);
            } else {
                skipped += 1;
            }
            index += 1;
        });
        let n = match counted {
            Ok(n) => n,
            Err(e) => {
                self.truncate(first, data_start);
                return Err(e.at(pos));
            }
        };
        let size = u32::try_from(n).map_err(|_| Error::invalid("entry holds over 4G records"))?;
        if let Some(a) = acks {
            if a.batch_size() != size {
                self.truncate(first, data_start);
                return Err(Error::CorruptEntry {
                    position: Some(pos),
                    offset: 0,
                    reason: format!(
                        "cursor ack set covers {} records but the entry holds {size}",
                        a.batch_size()
                    ),
                });
            }
        }
        let live = self.len() - first;
        self.ledger_id
            .extend(std::iter::repeat_n(pos.ledger_id, live));
        self.entry_id
            .extend(std::iter::repeat_n(pos.entry_id, live));
        self.batch_size.extend(std::iter::repeat_n(size, live));
        self.entries += 1;
        self.skipped += skipped;
        Ok(())
    }

    fn truncate(&mut self, records: usize, data_len: usize) {
        self.batch_index.truncate(records);
        self.offsets.truncate(records + 1);
        self.data.truncate(data_len);
    }
}

/// The next live records after the cursor's read position, reading up to
/// `max_entries` entries (and moving the read position past them).
pub fn replay_next(cursor: &Cursor, max_entries: usize) -> Result<LiveRecords> {
    let mut out = LiveRecords::default();
    let entries = cursor.read_next(max_entries)?;
    for (pos, entry) in &entries {
        out.push_entry(*pos, entry, cursor.batch_ack_set(*pos).as_ref())?;
    }
    Ok(out)
}

/// Every live record of the log for this cursor: rewinds it to just after
/// its mark-delete position and reads to the end.
pub fn replay_all(cursor: &Cursor) -> Result<LiveRecords> {
    cursor.rewind();
    let mut out = LiveRecords::default();
    loop {
        let entries = cursor.read_next(REPLAY_CHUNK_ENTRIES)?;
        if entries.is_empty() {
            return Ok(out);
        }
        for (pos, entry) in &entries {
            out.push_entry(*pos, entry, cursor.batch_ack_set(*pos).as_ref())?;
        }
    }
}

/// Live records of the entries in `start..=end` (clipped to the log).
/// With a cursor, entries and batch indexes it deleted are skipped;
/// without one every record is returned.
pub fn replay_range(
    ml: &ManagedLedger,
    start: Position,
    end: Position,
    cursor: Option<&Cursor>,
) -> Result<LiveRecords> {
    let mut out = LiveRecords::default();
    for (pos, entry) in ml.read_range(start, end)? {
        let acks = match cursor {
            Some(c) if c.is_deleted(pos) => continue,
            Some(c) => c.batch_ack_set(pos),
            None => None,
        };
        out.push_entry(pos, &entry, acks.as_ref())?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::encode_batch;

    #[test]
    fn push_entry_skips_deleted_indexes_and_keeps_unbatched() {
        let mut out = LiveRecords::default();
        let batched = encode_batch(&[b"a".as_slice(), b"bb", b"ccc"]);
        let mut acks = AckSet::new(3).unwrap();
        acks.clear(1).unwrap();
        out.push_entry(Position::new(1, 0), &batched, Some(&acks))
            .unwrap();
        out.push_entry(Position::new(1, 1), b"\x08\x01", None)
            .unwrap();
        assert_eq!(out.len(), 3);
        assert_eq!(out.record(0), b"a");
        assert_eq!(out.record(1), b"ccc");
        assert_eq!(out.record(2), b"\x08\x01");
        assert_eq!(
            out.position(1),
            TxnPosition {
                position: Position::new(1, 0),
                batch_size: 3,
                batch_index: 2
            }
        );
        assert_eq!(out.position(2), TxnPosition::single(Position::new(1, 1)));
        assert_eq!((out.entries, out.skipped), (2, 1));
    }

    #[test]
    fn corrupt_or_mismatched_entry_names_position_and_changes_nothing() {
        let mut out = LiveRecords::default();
        out.push_entry(Position::new(1, 0), b"\x08\x01", None)
            .unwrap();
        let before = out.clone();
        let bad = b"\x0e\x01\x00\x01\x0a\x05ab";
        match out.push_entry(Position::new(1, 1), bad, None) {
            Err(Error::CorruptEntry { position, .. }) => {
                assert_eq!(position, Some(Position::new(1, 1)))
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(out, before);
        let two = encode_batch(&[b"a".as_slice(), b"b"]);
        let acks = AckSet::single_deleted(5, 0).unwrap();
        assert!(out
            .push_entry(Position::new(1, 2), &two, Some(&acks))
            .is_err());
        assert_eq!(out, before);
    }
}
