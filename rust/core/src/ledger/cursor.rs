//! Cursors: named readers with a durable mark-delete position, individually
//! deleted ranges beyond it and batch-index ack sets.
//!
//! Changes apply in memory at once; the data directory's flusher journals
//! them (coalesced), as do `flush()` and `close()`. After a crash a cursor
//! may be slightly behind, so consumers can see deleted records again.

use super::Shared;
use crate::ackset::AckSet;
use crate::error::{Error, Result};
use crate::position::{Position, TxnPosition};
use crate::proto::{BatchDeletion, CursorState, DeletedRange};
use crate::sync::Mutex;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Names starting with this are hold cursors: they keep ledgers from being
/// trimmed like any cursor, but never let a ledger go on their own (a log
/// with only holds keeps everything, as one without cursors does). The
/// broker holds what its transaction-buffer snapshot has not covered yet.
pub const HOLD_CURSOR_PREFIX: &str = "__hold.";

/// In-memory state of one cursor.
#[derive(Debug, Default, Clone)]
pub(crate) struct CursorData {
    /// Every entry at or before it is deleted; `None`: nothing yet.
    pub mark_delete: Option<Position>,
    /// Last position `read_next` returned or skipped.
    pub read_after: Option<Position>,
    /// Individually deleted runs beyond the mark-delete: start -> last
    /// entry id (inclusive), never crossing a ledger.
    pub deleted: BTreeMap<Position, u64>,
    /// Partially deleted batched entries.
    pub ack_sets: BTreeMap<Position, AckSet>,
}

fn succ(p: Position) -> Position {
    match p.entry_id.checked_add(1) {
        Some(e) => Position::new(p.ledger_id, e),
        None => Position::new(p.ledger_id.saturating_add(1), 0),
    }
}

impl CursorData {
    fn in_ranges(&self, p: Position) -> bool {
        self.deleted
            .range(..=p)
            .next_back()
            .is_some_and(|(s, &end)| s.ledger_id == p.ledger_id && end >= p.entry_id)
    }

    /// True if the whole entry at `p` is deleted for this cursor.
    pub fn is_deleted(&self, p: Position) -> bool {
        self.mark_delete.is_some_and(|m| p <= m) || self.in_ranges(p)
    }

    fn insert(&mut self, p: Position) {
        if self.in_ranges(p) {
            return;
        }
        let mut start = p;
        let mut end = p.entry_id;
        if let Some((&s, &e)) = self.deleted.range(..p).next_back() {
            if s.ledger_id == p.ledger_id && e.checked_add(1) == Some(p.entry_id) {
                start = s;
            }
        }
        if let Some(next) = p.entry_id.checked_add(1) {
            if let Some(e) = self.deleted.remove(&Position::new(p.ledger_id, next)) {
                end = e;
            }
        }
        self.deleted.insert(start, end);
        self.ack_sets.remove(&p);
    }

    /// Drops everything at or before the mark-delete position.
    fn drop_through_mark_delete(&mut self) {
        let Some(md) = self.mark_delete else { return };
        let keep_from = succ(md);
        let mut rest = self.deleted.split_off(&keep_from);
        // A run that started at or before md may reach past it.
        if let Some((&s, &e)) = self.deleted.iter().next_back() {
            if s.ledger_id == md.ledger_id && e > md.entry_id {
                rest.insert(keep_from, e);
            }
        }
        self.deleted = rest;
        self.ack_sets = self.ack_sets.split_off(&keep_from);
        if self.read_after.is_some_and(|r| r < md) || self.read_after.is_none() {
            self.read_after = Some(md);
        }
    }

    /// Moves the mark-delete over deleted entries that directly follow it.
    fn advance(&mut self, shared: &Shared) {
        while let Some(next) = shared.next_after(self.mark_delete) {
            match self.deleted.remove(&next) {
                Some(end) => self.mark_delete = Some(Position::new(next.ledger_id, end)),
                None => break,
            }
        }
        self.drop_through_mark_delete();
    }

    pub fn to_proto(&self, name: &str) -> CursorState {
        let (ml, me) = match self.mark_delete {
            Some(p) => (p.ledger_id, p.entry_id as i64),
            None => (0, -1),
        };
        CursorState {
            name: name.to_owned(),
            mark_delete_ledger_id: ml,
            mark_delete_entry_id: me,
            deleted: self
                .deleted
                .iter()
                .map(|(s, &e)| DeletedRange {
                    start_ledger_id: s.ledger_id,
                    start_entry_id: s.entry_id,
                    end_ledger_id: s.ledger_id,
                    end_entry_id: e,
                })
                .collect(),
            batch_deletions: self
                .ack_sets
                .iter()
                .map(|(p, a)| BatchDeletion {
                    ledger_id: p.ledger_id,
                    entry_id: p.entry_id,
                    batch_size: a.batch_size() as i32,
                    ack_set: a.to_words(),
                })
                .collect(),
        }
    }

    /// Rebuilds state from META; `Err` names what is malformed.
    pub fn from_proto(s: &CursorState) -> std::result::Result<Self, String> {
        let mut d = CursorData {
            mark_delete: match s.mark_delete_entry_id {
                -1 => None,
                e if e >= 0 => Some(Position::new(s.mark_delete_ledger_id, e as u64)),
                e => return Err(format!("cursor {}: mark-delete entry id {e}", s.name)),
            },
            ..CursorData::default()
        };
        for r in &s.deleted {
            if r.start_ledger_id != r.end_ledger_id || r.end_entry_id < r.start_entry_id {
                return Err(format!("cursor {}: bad deleted range {r:?}", s.name));
            }
            d.deleted.insert(
                Position::new(r.start_ledger_id, r.start_entry_id),
                r.end_entry_id,
            );
        }
        for b in &s.batch_deletions {
            let set = AckSet::from_words(&b.ack_set, i64::from(b.batch_size))
                .map_err(|e| format!("cursor {}: {e}", s.name))?;
            d.ack_sets
                .insert(Position::new(b.ledger_id, b.entry_id), set);
        }
        d.drop_through_mark_delete();
        Ok(d)
    }
}

/// Shared part of a cursor; one per name per ledger.
#[derive(Debug)]
pub(crate) struct CursorInner {
    pub name: String,
    /// Held only briefly, never across I/O.
    pub data: Mutex<CursorData>,
    /// Serialises `read_next` calls (held across their reads) so two
    /// readers of one cursor never get the same entries.
    pub reading: Mutex<()>,
    /// Bumped by `rewind`, so a read finishing after one keeps it.
    pub rewinds: AtomicU64,
}

/// A named, durable reader of a managed ledger. Cheap to clone; clones
/// share state.
#[derive(Clone)]
pub struct Cursor {
    pub(crate) inner: Arc<CursorInner>,
    pub(crate) shared: Arc<Shared>,
}

impl fmt::Debug for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cursor")
            .field("ledger", &self.shared.name)
            .field("name", &self.inner.name)
            .finish()
    }
}

/// What a position is to a cursor operation.
enum Where {
    /// An existing entry.
    Exists,
    /// At or before the mark-delete, or trimmed away: already deleted.
    Gone,
}

impl Cursor {
    /// The cursor's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    fn locate(&self, d: &CursorData, p: Position) -> Result<Where> {
        if d.is_deleted(p) {
            return Ok(Where::Gone);
        }
        if self.shared.exists(p) {
            return Ok(Where::Exists);
        }
        if self.shared.first_position().is_some_and(|f| p < f) {
            return Ok(Where::Gone);
        }
        Err(self.shared.not_found(p))
    }

    /// Up to `max` entries after the read position, skipping deleted ones.
    /// Partially deleted batched entries are returned whole; see
    /// [`batch_ack_set`](Self::batch_ack_set).
    pub fn read_next(&self, max: usize) -> Result<Vec<(Position, Vec<u8>)>> {
        self.shared.check_open()?;
        let _reading = self.inner.reading.lock();
        // Pick under the lock, read without it, then advance.
        let (picks, cur, rewinds) = {
            let d = self.inner.data.lock();
            let rewinds = self.inner.rewinds.load(Ordering::Acquire);
            let mut cur = d.read_after.max(d.mark_delete);
            let mut picks = Vec::new();
            while picks.len() < max {
                let Some(n) = self.shared.next_after(cur) else {
                    break;
                };
                cur = Some(n);
                if !d.is_deleted(n) {
                    picks.push(n);
                }
            }
            (picks, cur, rewinds)
        };
        let data = self.shared.read_positions(&picks)?;
        let mut d = self.inner.data.lock();
        // A rewind during the read wins (these entries come again); a
        // mark-delete may have moved the read position past them already.
        if self.inner.rewinds.load(Ordering::Acquire) == rewinds {
            d.read_after = d.read_after.max(cur);
        }
        Ok(picks.into_iter().zip(data).collect())
    }

    /// Moves the read position back to just after the mark-delete.
    pub fn rewind(&self) {
        let mut d = self.inner.data.lock();
        self.inner.rewinds.fetch_add(1, Ordering::AcqRel);
        d.read_after = d.mark_delete;
    }

    /// Marks every entry at or before `pos` deleted. Moving backwards is a
    /// no-op (a replay may re-acknowledge); a position past the end is an error.
    pub fn mark_delete(&self, pos: Position) -> Result<()> {
        self.shared.check_writable()?;
        {
            let mut d = self.inner.data.lock();
            if d.mark_delete.is_some_and(|m| pos <= m) {
                return Ok(());
            }
            if !self.shared.exists(pos) && !self.shared.is_gap(pos) {
                return Err(self.shared.not_found(pos));
            }
            d.mark_delete = Some(pos);
            d.drop_through_mark_delete();
            d.advance(&self.shared);
        }
        self.shared.mark_dirty();
        Ok(())
    }

    /// The mark-delete position; `None` while nothing is deleted.
    pub fn mark_delete_position(&self) -> Option<Position> {
        self.inner.data.lock().mark_delete
    }

    /// Deletes whole entries (individual acknowledgement).
    pub fn delete(&self, positions: &[Position]) -> Result<()> {
        let recs: Vec<TxnPosition> = positions.iter().map(|&p| TxnPosition::single(p)).collect();
        self.delete_batch_indexes(&recs)
    }

    /// Deletes records: `batch_size == 1` deletes the entry; otherwise the
    /// record's index is cleared in the entry's ack set (AND-merge), and an
    /// entry whose set reaches all-zero is deleted whole. All-or-nothing:
    /// on a bad record nothing changes.
    pub fn delete_batch_indexes(&self, records: &[TxnPosition]) -> Result<()> {
        self.shared.check_writable()?;
        {
            let mut d = self.inner.data.lock();
            // Validate everything first so a bad record changes nothing.
            let mut sizes: BTreeMap<Position, u32> = BTreeMap::new();
            let mut todo = Vec::with_capacity(records.len());
            for r in records {
                let p = r.position;
                if r.batch_size == 0 || r.batch_index >= r.batch_size {
                    return Err(Error::invalid(format!(
                        "record {p}: batch_index {} must be < batch_size {} (>= 1)",
                        r.batch_index, r.batch_size
                    )));
                }
                if let Where::Gone = self.locate(&d, p)? {
                    continue;
                }
                if r.batch_size > 1 {
                    let known = d
                        .ack_sets
                        .get(&p)
                        .map(AckSet::batch_size)
                        .or_else(|| sizes.get(&p).copied());
                    if let Some(n) = known.filter(|&n| n != r.batch_size) {
                        return Err(Error::invalid(format!(
                            "record {p}: batch_size {} differs from {n} given before",
                            r.batch_size
                        )));
                    }
                    // Checks batch_size against the ack-set limit.
                    AckSet::new(i64::from(r.batch_size))?;
                    sizes.insert(p, r.batch_size);
                }
                todo.push(*r);
            }
            for r in todo {
                let p = r.position;
                if d.is_deleted(p) {
                    continue;
                }
                if r.batch_size == 1 {
                    d.insert(p);
                    continue;
                }
                let set = match d.ack_sets.remove(&p) {
                    Some(s) => s,
                    None => AckSet::new(i64::from(r.batch_size))?,
                };
                let mut set = set;
                set.clear(i64::from(r.batch_index))?;
                if set.is_empty() {
                    d.insert(p);
                } else {
                    d.ack_sets.insert(p, set);
                }
            }
            d.advance(&self.shared);
        }
        self.shared.mark_dirty();
        Ok(())
    }

    /// True if the whole entry at `pos` is deleted for this cursor.
    pub fn is_deleted(&self, pos: Position) -> bool {
        self.inner.data.lock().is_deleted(pos)
    }

    /// The entry's ack set if some, not all, of its records are deleted.
    pub fn batch_ack_set(&self, pos: Position) -> Option<AckSet> {
        self.inner.data.lock().ack_sets.get(&pos).cloned()
    }

    /// Individually deleted runs beyond the mark-delete, as inclusive
    /// `(first, last)` positions.
    pub fn deleted_ranges(&self) -> Vec<(Position, Position)> {
        self.inner
            .data
            .lock()
            .deleted
            .iter()
            .map(|(&s, &e)| (s, Position::new(s.ledger_id, e)))
            .collect()
    }

    /// Journals the cursor states now (durably) and trims passed ledgers.
    pub fn flush(&self) -> Result<()> {
        self.shared.check_writable()?;
        self.shared.persist()
    }
}
