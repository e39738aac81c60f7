//! Scanning a transaction or pending-ack log for analysis: every record of a
//! ledger range as columns, with its position, whether the log's cursors
//! deleted it, and an error row instead of a failure for damaged entries.
//!
//! This is what the Spark data source `txnstream-log` reads in each task (a
//! read-only open of a live or closed data directory). Unlike
//! [`crate::replay`], which returns the live records a recovery needs and
//! fails on damage, a scan returns *every* record still stored — deleted
//! ones flagged — and keeps going past damage: an entry that cannot be split
//! into records is one row with an error, a record that does not decode is
//! a row with null fields and an error, and an entry whose stored bytes
//! fail their checksum is an error row too.
//!
//! A record is *deleted* when every cursor given deleted it: its entry is at
//! or before the cursor's mark-delete, in an individually deleted range, or
//! its batch index is cleared in the cursor's ack set for the entry. With no
//! cursor nothing is deleted.

use crate::columns::{Lenient, RecordColumns, RowStatus};
use crate::error::{Error, Result};
use crate::frame::is_batched;
use crate::ledger::{Cursor, ManagedLedger};
use crate::position::Position;

/// Entries read from the ledger per call while scanning.
const READ_WINDOW: u64 = 256;

/// The `deleted` value of a row whose cursor state contradicts the entry (an
/// ack set sized for another number of records): unknown, shown as null.
pub const DELETED_UNKNOWN: u8 = 2;

/// Rows of a scan: `rows` (decoded fields, origin, status, error) plus, per
/// row, where its entry is and what the cursors say.
#[derive(Debug)]
pub struct ScannedRows<C> {
    /// Decoded records; `rows.origin.entry_index` counts the scanned entries.
    pub rows: Lenient<C>,
    /// Ledger of each row's entry.
    pub ledger_id: Vec<u64>,
    /// Entry id of each row's entry.
    pub entry_id: Vec<u64>,
    /// Stored size of the entry in bytes (0 when it could not be read).
    pub entry_size: Vec<u32>,
    /// The entry is a batched (magic 0x0E01) entry.
    pub batched: Vec<bool>,
    /// 1: deleted by every cursor, 0: not, [`DELETED_UNKNOWN`].
    pub deleted: Vec<u8>,
    /// Entries scanned.
    pub entries: u64,
    /// The first entry not scanned yet, `None` once the range is done.
    pub next_entry: Option<u64>,
}

/// What the cursors say about the records of one entry.
enum Deletion {
    /// No record deleted.
    Nothing,
    /// Every record deleted.
    All,
    /// Record `i` deleted when `deleted[i]`.
    Some(Vec<bool>),
    /// The cursor state does not fit the entry.
    Unknown(String),
}

fn deletion(cursors: &[Cursor], pos: Position, records: usize) -> Deletion {
    if cursors.is_empty() {
        return Deletion::Nothing;
    }
    // Deleted overall = deleted by every cursor.
    let mut deleted: Option<Vec<bool>> = None;
    for c in cursors {
        if c.is_deleted(pos) {
            continue;
        }
        let Some(set) = c.batch_ack_set(pos) else {
            return Deletion::Nothing;
        };
        if set.batch_size() as usize != records {
            return Deletion::Unknown(format!(
                "cursor {:?} has an ack set for {} records but entry {pos} holds {records}",
                c.name(),
                set.batch_size()
            ));
        }
        let d = deleted.get_or_insert_with(|| vec![true; records]);
        for (i, slot) in (0i64..).zip(d.iter_mut()) {
            *slot &= !set.get(i).unwrap_or(true);
        }
    }
    match deleted {
        None => Deletion::All,
        Some(d) => Deletion::Some(d),
    }
}

impl<C: RecordColumns> ScannedRows<C> {
    fn new() -> Self {
        Self {
            rows: Lenient::default(),
            ledger_id: Vec::new(),
            entry_id: Vec::new(),
            entry_size: Vec::new(),
            batched: Vec::new(),
            deleted: Vec::new(),
            entries: 0,
            next_entry: None,
        }
    }

    /// Adds the rows of the entry at `pos` (`Err`: its bytes could not be read).
    fn push(&mut self, cursors: &[Cursor], pos: Position, entry: Result<&[u8]>) -> Result<()> {
        let idx = usize::try_from(self.entries).map_err(|_| Error::invalid("too many entries"))?;
        let before = self.rows.len();
        let (size, batched) = match entry {
            Ok(bytes) => {
                self.rows.push_entry(idx, bytes, Some(pos))?;
                (
                    u32::try_from(bytes.len()).unwrap_or(u32::MAX),
                    is_batched(bytes),
                )
            }
            Err(e) => {
                self.rows.push_bad_entry(idx, &e.to_string())?;
                (0, false)
            }
        };
        let added = self.rows.len() - before;
        let bad_entry = self.rows.status[before] == RowStatus::BadEntry as u8;
        match deletion(cursors, pos, added) {
            Deletion::Nothing => self.deleted.extend(std::iter::repeat_n(0, added)),
            Deletion::All => self.deleted.extend(std::iter::repeat_n(1, added)),
            Deletion::Some(_) if bad_entry => self.deleted.push(0),
            Deletion::Some(d) => self.deleted.extend(d.into_iter().map(u8::from)),
            Deletion::Unknown(_) if bad_entry => self.deleted.push(0),
            Deletion::Unknown(why) => {
                let status = &self.rows.status;
                let ok: Vec<bool> = status[before..]
                    .iter()
                    .map(|&s| s == RowStatus::Ok as u8)
                    .collect();
                self.rows.set_errors(before, &why, |k| ok[k - before])?;
                self.deleted
                    .extend(std::iter::repeat_n(DELETED_UNKNOWN, added));
            }
        }
        self.ledger_id
            .extend(std::iter::repeat_n(pos.ledger_id, added));
        self.entry_id
            .extend(std::iter::repeat_n(pos.entry_id, added));
        self.entry_size.extend(std::iter::repeat_n(size, added));
        self.batched.extend(std::iter::repeat_n(batched, added));
        self.entries += 1;
        Ok(())
    }
}

fn is_damage(e: &Error) -> bool {
    matches!(e, Error::CorruptLedger { .. } | Error::CorruptEntry { .. })
}

/// Scans entries `first..=last` of ledger `ledger_id` of `ml`, stopping after
/// the entry that brings the rows to `max_rows` or more (then
/// [`ScannedRows::next_entry`] says where to go on). Entries that no longer
/// exist (trimmed since the range was planned) are skipped; entries past the
/// end of the log end the scan. `cursors` decide the `deleted` flags.
pub fn scan_ledger<C: RecordColumns>(
    ml: &ManagedLedger,
    ledger_id: u64,
    first: u64,
    last: u64,
    cursors: &[Cursor],
    max_rows: usize,
) -> Result<ScannedRows<C>> {
    let mut out = ScannedRows::<C>::new();
    // Only what the ledger holds now: a `last` far past its end (or a ledger
    // gone or never there) would step through empty windows up to `last`.
    let Some(count) = ml.ledgers().iter().find(|l| l.0 == ledger_id).map(|l| l.1) else {
        return Ok(out);
    };
    let Some(last) = count.checked_sub(1).map(|end| end.min(last)) else {
        return Ok(out);
    };
    if first > last {
        return Ok(out);
    }
    let max_rows = max_rows.max(1);
    let mut at = first;
    while at <= last {
        let end = at.saturating_add(READ_WINDOW - 1).min(last);
        let (start_pos, end_pos) = (Position::new(ledger_id, at), Position::new(ledger_id, end));
        let window = match ml.read_range(start_pos, end_pos) {
            Ok(w) => w,
            Err(Error::PositionNotFound { .. }) => break, // past the log's end
            Err(e) if is_damage(&e) => {
                // Find the damaged entries one by one; the others read fine.
                let mut w = Vec::new();
                for id in at..=end {
                    let p = Position::new(ledger_id, id);
                    match ml.read(p) {
                        Ok(b) => w.push((p, Ok(b))),
                        Err(Error::PositionNotFound { .. }) => {}
                        Err(e) if is_damage(&e) => w.push((p, Err(e))),
                        Err(e) => return Err(e),
                    }
                }
                for (p, r) in &w {
                    out.push(cursors, *p, r.as_deref().map_err(Clone::clone))?;
                }
                at = end + 1;
                if out.rows.len() >= max_rows && at <= last {
                    out.next_entry = Some(at);
                    return Ok(out);
                }
                continue;
            }
            Err(e) => return Err(e),
        };
        if window.is_empty() {
            // The whole window is gone (trimmed ledger) or not there yet.
            at = end + 1;
            continue;
        }
        for (p, bytes) in &window {
            out.push(cursors, *p, Ok(bytes))?;
            at = p.entry_id + 1;
            if out.rows.len() >= max_rows && at <= last {
                out.next_entry = Some(at);
                return Ok(out);
            }
        }
        at = at.max(end + 1);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::columns::TxnLogColumns;
    use crate::frame::encode_batch;
    use crate::ledger::LedgerOptions;
    use crate::position::TxnPosition;
    use crate::proto::TransactionMetadataEntry;
    use prost::Message;

    fn rec(least: u64) -> Vec<u8> {
        TransactionMetadataEntry {
            metadata_op: Some(0),
            txnid_least_bits: Some(least),
            ..Default::default()
        }
        .encode_to_vec()
    }

    #[test]
    fn scan_flags_deletions_and_errors() {
        let dir = tempfile::tempdir().unwrap();
        let ml = ManagedLedger::open(dir.path(), "log", LedgerOptions::default()).unwrap();
        let b0 = encode_batch(&[rec(1), rec(2), rec(3)]);
        let p0 = ml.append(&b0).unwrap();
        let p1 = ml.append(&rec(4)).unwrap();
        let p2 = ml.append(b"\x0e\x01\x00\x09").unwrap(); // bad version
        let p3 = ml.append(&rec(5)).unwrap();
        let c = ml.open_cursor("c").unwrap();
        c.delete_batch_indexes(&[TxnPosition {
            position: p0,
            batch_size: 3,
            batch_index: 1,
        }])
        .unwrap();
        c.delete(&[p1]).unwrap();
        let lid = p0.ledger_id;
        let s =
            scan_ledger::<TxnLogColumns>(&ml, lid, 0, p3.entry_id, std::slice::from_ref(&c), 100)
                .unwrap();
        assert_eq!(s.entries, 4);
        assert_eq!(s.rows.columns.txnid_least_bits, vec![1, 2, 3, 4, 0, 5]);
        assert_eq!(s.deleted, vec![0, 1, 0, 1, 0, 0]);
        assert_eq!(s.rows.status, vec![0, 0, 0, 0, 2, 0]);
        assert_eq!(s.entry_id, vec![0, 0, 0, 1, 2, 3]);
        assert_eq!(s.batched, vec![true, true, true, false, true, false]);
        assert!(s.rows.error.get(4).contains(&p2.to_string()));
        assert_eq!(s.next_entry, None);
        // Without a cursor nothing is deleted.
        let s = scan_ledger::<TxnLogColumns>(&ml, lid, 0, p3.entry_id, &[], 100).unwrap();
        assert_eq!(s.deleted, vec![0; 6]);
        // Chunks: stop after the entry that reaches max_rows.
        let s = scan_ledger::<TxnLogColumns>(&ml, lid, 0, p3.entry_id, &[], 2).unwrap();
        assert_eq!((s.rows.len(), s.next_entry), (3, Some(1)));
        let s = scan_ledger::<TxnLogColumns>(&ml, lid, 1, p3.entry_id, &[], 2).unwrap();
        assert_eq!((s.rows.len(), s.next_entry), (2, Some(3)));
        // A range past the end is empty.
        let s = scan_ledger::<TxnLogColumns>(&ml, lid, 10, 20, &[], 2).unwrap();
        assert_eq!(s.rows.len(), 0);
        // Mark-delete covers the batch: every record deleted.
        c.mark_delete(p0).unwrap();
        let s = scan_ledger::<TxnLogColumns>(&ml, lid, 0, 0, &[c], 100).unwrap();
        assert_eq!(s.deleted, vec![1, 1, 1]);
    }

    #[test]
    fn deleted_only_when_every_cursor_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let ml = ManagedLedger::open(dir.path(), "log", LedgerOptions::default()).unwrap();
        let p0 = ml.append(&encode_batch(&[rec(1), rec(2), rec(3)])).unwrap();
        let (a, b) = (ml.open_cursor("a").unwrap(), ml.open_cursor("b").unwrap());
        let del = |c: &Cursor, i| {
            c.delete_batch_indexes(&[TxnPosition {
                position: p0,
                batch_size: 3,
                batch_index: i,
            }])
            .unwrap()
        };
        del(&a, 0);
        del(&a, 1);
        del(&b, 1);
        del(&b, 2);
        let s = scan_ledger::<TxnLogColumns>(&ml, p0.ledger_id, 0, 0, &[a, b], 100).unwrap();
        assert_eq!(s.deleted, vec![0, 1, 0]);
    }

    #[test]
    fn cursor_state_that_does_not_fit_is_unknown_with_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let ml = ManagedLedger::open(dir.path(), "log", LedgerOptions::default()).unwrap();
        let p0 = ml.append(&encode_batch(&[rec(1), rec(2)])).unwrap();
        let c = ml.open_cursor("c").unwrap();
        c.delete_batch_indexes(&[TxnPosition {
            position: p0,
            batch_size: 5,
            batch_index: 0,
        }])
        .unwrap();
        let s = scan_ledger::<TxnLogColumns>(&ml, p0.ledger_id, 0, 0, &[c], 100).unwrap();
        assert_eq!(s.deleted, vec![DELETED_UNKNOWN; 2]);
        assert_eq!(s.rows.status, vec![0, 0]);
        assert!(s.rows.error.get(1).contains("ack set for 5 records"));
        assert_eq!(s.rows.columns.txnid_least_bits, vec![1, 2]);
    }
}
