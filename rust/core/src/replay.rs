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
    /// cursor's ack set for it (`None`: every record is live). A damaged
    /// entry changes nothing (see [`entry_records`]).
    pub fn push_entry(&mut self, pos: Position, entry: &[u8], acks: Option<&AckSet>) -> Result<()> {
        for rec in entry_records(pos, entry, acks)? {
            if rec.deleted {
                self.skipped += 1;
                continue;
            }
            self.data.extend_from_slice(rec.data);
            self.offsets.push(self.data.len() as i64);
            self.ledger_id.push(pos.ledger_id);
            self.entry_id.push(pos.entry_id);
            self.batch_size.push(rec.position.batch_size);
            self.batch_index.push(rec.position.batch_index);
        }
        self.entries += 1;
        Ok(())
    }
}

/// One record of an entry as a cursor sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryRecord<'a> {
    /// The record's bytes (borrowed from the entry).
    pub data: &'a [u8],
    /// Entry position, batch size and this record's batch index.
    pub position: TxnPosition,
    /// The cursor already deleted this batch index.
    pub deleted: bool,
}

/// The records of the entry at `pos` in batch order, each with its
/// [`TxnPosition`] and whether `acks` (the cursor's ack set for the entry,
/// bit clear = deleted; `None`: nothing deleted) marks it deleted.
///
/// The entry is checked whole before anything is returned, so callers never
/// see part of a damaged entry: bad framing, or an ack set that does not
/// cover exactly the entry's records, is a `CorruptEntry` naming `pos`.
pub fn entry_records<'a>(
    pos: Position,
    entry: &'a [u8],
    acks: Option<&AckSet>,
) -> Result<Vec<EntryRecord<'a>>> {
    let mut records: Vec<&'a [u8]> = Vec::new();
    let n = for_each_record(entry, |r| records.push(r)).map_err(|e| e.at(pos))?;
    let size = u32::try_from(n).map_err(|_| Error::invalid("entry holds over 4G records"))?;
    if let Some(a) = acks.filter(|a| a.batch_size() != size) {
        return Err(Error::CorruptEntry {
            position: Some(pos),
            offset: 0,
            reason: format!(
                "cursor ack set covers {} records but the entry holds {size}",
                a.batch_size()
            ),
        });
    }
    // `size` fits in u32, so every index does too.
    Ok((0u32..)
        .zip(records)
        .map(|(index, data)| EntryRecord {
            data,
            position: TxnPosition {
                position: pos,
                batch_size: size,
                batch_index: index,
            },
            deleted: acks.is_some_and(|a| !a.get(i64::from(index)).unwrap_or(true)),
        })
        .collect())
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
    let mut out = LiveRecords::default();
    scan_cursor(cursor, |pos, entry, acks| out.push_entry(pos, entry, acks))?;
    Ok(out)
}

/// Rewinds `cursor` to just after its mark-delete position and calls
/// `f(position, entry, ack set)` for every entry up to the end of the log,
/// reading [`REPLAY_CHUNK_ENTRIES`] at a time; the first error stops it.
pub fn scan_cursor<F>(cursor: &Cursor, mut f: F) -> Result<()>
where
    F: FnMut(Position, &[u8], Option<&AckSet>) -> Result<()>,
{
    cursor.rewind();
    loop {
        let entries = cursor.read_next(REPLAY_CHUNK_ENTRIES)?;
        if entries.is_empty() {
            return Ok(());
        }
        for (pos, entry) in &entries {
            f(*pos, entry, cursor.batch_ack_set(*pos).as_ref())?;
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
    fn entry_records_flags_deleted_indexes_with_positions() {
        let batched = encode_batch(&[b"a".as_slice(), b"bb", b"ccc"]);
        let acks = AckSet::single_deleted(3, 1).unwrap();
        let pos = Position::new(4, 9);
        let recs = entry_records(pos, &batched, Some(&acks)).unwrap();
        let seen: Vec<(&[u8], u32, u32, bool)> = recs
            .iter()
            .map(|r| {
                assert_eq!(r.position.position, pos);
                (
                    r.data,
                    r.position.batch_size,
                    r.position.batch_index,
                    r.deleted,
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                (b"a".as_slice(), 3, 0, false),
                (b"bb".as_slice(), 3, 1, true),
                (b"ccc".as_slice(), 3, 2, false)
            ]
        );
        let single = entry_records(pos, b"\x08\x01", None).unwrap();
        assert_eq!(single.len(), 1);
        assert_eq!(single[0].position, TxnPosition::single(pos));
        assert!(!single[0].deleted);
        let wrong = AckSet::new(2).unwrap();
        match entry_records(pos, &batched, Some(&wrong)) {
            Err(Error::CorruptEntry {
                position, reason, ..
            }) => {
                assert_eq!(position, Some(pos));
                assert!(reason.contains("covers 2 records"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
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
