//! `SnapshotDemux`: one forward reader of a namespace's snapshot topic,
//! shared by every topic that recovers (SPEC §4.6, seed 003).
//!
//! The snapshot topic holds `CompactedRecord { key: topic, value: snapshot }`
//! entries (a record without a value deletes the topic's snapshot). Without
//! sharing, each of n recovering topics reads the whole topic: n·x entry
//! reads. With one demux, the first topic to ask reads forward to the end,
//! routing every record it passes to its topic's slot; later topics take
//! theirs from the slot. Every entry is read once per demux, whatever the
//! number of topics.
//!
//! Rules:
//! - a topic's answer is its newest record at the moment it asks: before
//!   answering, the demux catches up from where it stopped to the current
//!   end of the topic, so snapshots written while recovery runs are seen;
//! - a slot keeps only the newest record of its topic (recovery needs
//!   only that), so memory is one record per topic not yet recovered;
//! - a topic that took its answer is *done*: later records of it (it writes
//!   new snapshots after recovering) are not kept;
//! - a topic with no record learns it once the reader is at the end;
//! - a deleted topic (a record without value) answers "no snapshot".
//!
//! Decoding and routing run over whole runs of entries, with no Python.

use crate::error::{Error, Result};
use crate::ledger::ManagedLedger;
use crate::position::Position;
use crate::proto::CompactedRecord;
use prost::Message;
use std::collections::{HashMap, HashSet};

/// Entries read per call to the ledger while catching up.
pub const READ_CHUNK: usize = 4096;

/// The newest record of one topic: where it is and its value (`None`: deleted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routed {
    /// Position of the record in the snapshot topic.
    pub position: Position,
    /// The snapshot bytes, or `None` when the topic's snapshot was deleted.
    pub value: Option<Vec<u8>>,
}

/// Counters of one demux (for tests, benchmarks and admin stats).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DemuxStats {
    /// Entries read from the snapshot topic.
    pub entries_read: u64,
    /// Calls to the ledger's range read.
    pub reads: u64,
    /// Records routed to a topic not yet done.
    pub routed: u64,
    /// Records dropped because their topic had already taken its answer.
    pub dropped: u64,
    /// Topics that took their answer.
    pub answered: u64,
    /// Times the topic was rewritten under the reader (compaction) and routing restarted.
    pub restarts: u64,
}

/// Routes the records of one snapshot topic to per-topic slots.
#[derive(Debug, Default)]
pub struct SnapshotDemux {
    slots: HashMap<String, Routed>,
    done: HashSet<String>,
    /// Last position routed (the reader continues after it).
    last: Option<Position>,
    stats: DemuxStats,
}

impl SnapshotDemux {
    /// An empty demux positioned before the first entry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counters so far.
    pub fn stats(&self) -> DemuxStats {
        self.stats
    }

    /// Records waiting in slots (topics not yet recovered).
    pub fn queued(&self) -> usize {
        self.slots.len()
    }

    /// Routes a run of entries read in log order. A malformed entry is a
    /// `CorruptEntry` error naming its position; nothing of the run after it
    /// is routed, and the reader will read it again (and fail again).
    pub fn route<'a>(
        &mut self,
        entries: impl IntoIterator<Item = (Position, &'a [u8])>,
    ) -> Result<()> {
        for (pos, data) in entries {
            if self.last.is_some_and(|l| pos <= l) {
                continue; // already routed (a re-read after a failure)
            }
            let rec = CompactedRecord::decode(data).map_err(|e| Error::CorruptEntry {
                position: Some(pos),
                offset: 0,
                reason: format!("not a snapshot record (CompactedRecord): {e}"),
            })?;
            self.last = Some(pos);
            self.stats.entries_read += 1;
            if self.done.contains(&rec.key) {
                self.stats.dropped += 1;
                continue;
            }
            self.stats.routed += 1;
            self.slots.insert(
                rec.key,
                Routed {
                    position: pos,
                    value: rec.value,
                },
            );
        }
        Ok(())
    }

    /// Reads `ml` from where the demux stopped to its current end, routing
    /// every record (in chunks of [`READ_CHUNK`] entries).
    pub fn catch_up(&mut self, ml: &ManagedLedger) -> Result<()> {
        while !self.catch_up_some(ml, u64::MAX)? {}
        Ok(())
    }

    /// Reads at most about `max_entries` entries (whole chunks) toward the
    /// current end; true once at the end. Lets a caller stop between chunks
    /// (recovery cancelled on close).
    ///
    /// Compaction of the snapshot topic rewrites it into a new ledger and
    /// drops deletions: when the ledger the demux stopped in is gone, the
    /// slots of topics that have not answered are cleared and routing starts
    /// again from the first entry, so a topic deleted before the compaction
    /// does not answer an old snapshot.
    pub fn catch_up_some(&mut self, ml: &ManagedLedger, max_entries: u64) -> Result<bool> {
        let mut budget = max_entries;
        let mut empty_runs = 0;
        loop {
            if let Some(last) = self.last {
                if !ml.ledgers().iter().any(|l| l.0 == last.ledger_id) {
                    self.slots.clear();
                    self.last = None;
                    self.stats.restarts += 1;
                }
            }
            let Some(first) = ml.next_after(self.last) else {
                return Ok(true);
            };
            let Some(end) = ml.last_position() else {
                return Ok(true);
            };
            if first > end {
                return Ok(true);
            }
            if budget == 0 {
                return Ok(false);
            }
            // At most READ_CHUNK entries of `first`'s ledger (the range is clipped).
            let last = Position::new(
                first.ledger_id,
                first.entry_id.saturating_add(READ_CHUNK as u64 - 1),
            )
            .min(end);
            let run = match ml.read_range(first, last) {
                Ok(run) => run,
                // The ledger went between the two calls (a compaction swap): look again.
                Err(Error::PositionNotFound { .. }) if empty_runs < 8 => Vec::new(),
                Err(e) => return Err(e),
            };
            self.stats.reads += 1;
            if run.is_empty() {
                empty_runs += 1;
                if empty_runs >= 8 {
                    return Err(Error::invalid(format!(
                        "snapshot topic {}: no entry readable at {first} although it ends at {end}",
                        ml.name()
                    )));
                }
                continue;
            }
            budget = budget.saturating_sub(run.len() as u64);
            self.route(run.iter().map(|(p, d)| (*p, d.as_slice())))?;
        }
    }

    /// The newest record of `topic` after catching up with `ml`; the topic
    /// is then done (its later records are not kept). `None`: no snapshot
    /// (never written, or deleted).
    pub fn take(&mut self, ml: &ManagedLedger, topic: &str) -> Result<Option<Routed>> {
        self.catch_up(ml)?;
        Ok(self.take_routed(topic))
    }

    /// Takes what is routed for `topic` without reading (the topic is then done).
    pub fn take_routed(&mut self, topic: &str) -> Option<Routed> {
        self.done.insert(topic.to_owned());
        self.stats.answered += 1;
        self.slots.remove(topic).filter(|r| r.value.is_some())
    }

    /// Lets `topic` answer again (it was unloaded and will recover anew):
    /// records of it routed from here on are kept. Call before writing its
    /// newest snapshot, so the next answer is that one.
    pub fn reopen(&mut self, topic: &str) {
        self.done.remove(topic);
    }

    /// Forgets `topic`'s slot (a topic deleted while recovery runs).
    pub fn forget(&mut self, topic: &str) {
        self.slots.remove(topic);
        self.done.insert(topic.to_owned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(key: &str, value: Option<&[u8]>) -> Vec<u8> {
        CompactedRecord {
            key: key.into(),
            value: value.map(<[u8]>::to_vec),
        }
        .encode_to_vec()
    }

    #[test]
    fn routes_newest_per_topic_and_drops_records_of_done_topics() {
        let mut d = SnapshotDemux::new();
        let e = [
            rec("a", Some(b"a1")),
            rec("b", Some(b"b1")),
            rec("a", Some(b"a2")),
            rec("c", None),
        ];
        d.route(
            e.iter()
                .enumerate()
                .map(|(i, r)| (Position::new(1, i as u64), r.as_slice())),
        )
        .unwrap();
        assert_eq!(d.queued(), 3);
        let a = d.take_routed("a").unwrap();
        assert_eq!(a.value.as_deref(), Some(&b"a2"[..]));
        assert_eq!(a.position, Position::new(1, 2));
        assert!(d.take_routed("c").is_none()); // deleted
        assert!(d.take_routed("zzz").is_none()); // never written
        let later = rec("a", Some(b"a3"));
        d.route([(Position::new(1, 9), later.as_slice())]).unwrap();
        let s = d.stats();
        assert_eq!((s.entries_read, s.routed, s.dropped), (5, 4, 1));
        assert_eq!(
            d.take_routed("b").unwrap().value.as_deref(),
            Some(&b"b1"[..])
        );
        assert_eq!(d.queued(), 0);
    }

    #[test]
    fn malformed_entry_is_typed_and_reread_is_idempotent() {
        let mut d = SnapshotDemux::new();
        let good = rec("a", Some(b"x"));
        let bad = vec![0xff, 0xff, 0xff];
        let e = d
            .route([
                (Position::new(2, 0), good.as_slice()),
                (Position::new(2, 1), bad.as_slice()),
            ])
            .unwrap_err();
        assert!(e.to_string().contains("2:1"), "{e}");
        // Reading the run again routes nothing twice.
        let _ = d.route([(Position::new(2, 0), good.as_slice())]);
        assert_eq!(d.stats().entries_read, 1);
    }
}
