//! Compacted topics: a managed ledger of keyed records (`CompactedRecord`
//! protobuf entries) where readers see only the newest value per key and a
//! record without a value deletes its key. `compact()` rewrites the live
//! records into one new ledger and swaps it in atomically (one journal group).

use super::{LedgerOptions, ManagedLedger};
use crate::error::{Error, Result};
use crate::position::Position;
use crate::proto::CompactedRecord;
use crate::sync::{Condvar, Mutex, RwLock};
use prost::Message;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// Entries decoded per read while rebuilding the key index.
const REPLAY_CHUNK: u64 = 4096;

/// Outcome of one compaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompactionStats {
    /// Entries in the log before.
    pub entries_before: u64,
    /// Entries (live keys) after.
    pub entries_after: u64,
}

/// Newest record per key: its position, and its value (`None`: deleted).
type Index = BTreeMap<String, (Position, Option<Vec<u8>>)>;

/// Puts queued and not complete yet, and the condition compaction waits on.
#[derive(Debug, Default)]
struct InFlight {
    count: Mutex<usize>,
    idle: Condvar,
}

impl InFlight {
    fn done(&self) {
        let mut n = self.count.lock();
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.idle.notify_all();
        }
    }
}

/// A key-value view over a managed ledger with compaction.
#[derive(Debug)]
pub struct CompactedTopic {
    ml: Arc<ManagedLedger>,
    index: Arc<Mutex<Index>>,
    /// No key index (see the module docs).
    write_only: bool,
    /// Puts share it while they queue, compaction takes it alone; compaction
    /// then waits for the puts in flight ([`InFlight`]): no put can land
    /// between compaction's snapshot and the swap.
    gate: RwLock<()>,
    inflight: Arc<InFlight>,
}

/// A blocking put refuses to run on a storage thread (a completion callback),
/// as every blocking storage call does (`Store::submit_wait`): its completion
/// needs the thread it would block, and a compaction holding the gate would
/// block it before that.
fn not_on_storage_thread() -> Result<()> {
    super::group_commit::not_on_storage_thread("put (use put_many_async there)")
}

fn decode(pos: Position, entry: &[u8]) -> Result<CompactedRecord> {
    CompactedRecord::decode(entry).map_err(|e| Error::CorruptEntry {
        position: Some(pos),
        offset: 0,
        reason: format!("not a CompactedRecord: {e}"),
    })
}

fn encode(key: &str, value: Option<&[u8]>) -> Vec<u8> {
    CompactedRecord {
        key: key.to_owned(),
        value: value.map(<[u8]>::to_vec),
    }
    .encode_to_vec()
}

fn apply(index: &mut Index, pos: Position, rec: CompactedRecord) {
    match index.get(&rec.key) {
        // A concurrent put that landed later already won.
        Some((p, _)) if *p > pos => {}
        _ => {
            index.insert(rec.key, (pos, rec.value));
        }
    }
}

impl CompactedTopic {
    /// Opens (creating if needed) compacted topic `name` under `data_dir`.
    pub fn open(data_dir: &Path, name: &str, opts: LedgerOptions) -> Result<Self> {
        Self::open_with(data_dir, name, opts, false)
    }

    /// Opens (creating if needed) `name` for writing without a key index:
    /// nothing is read at open (see the module docs).
    pub fn open_write_only(data_dir: &Path, name: &str, opts: LedgerOptions) -> Result<Self> {
        if opts.read_only {
            return Err(Error::InvalidArgument(
                "a write-only compacted topic cannot be opened read-only".into(),
            ));
        }
        Self::open_with(data_dir, name, opts, true)
    }

    fn open_with(
        data_dir: &Path,
        name: &str,
        opts: LedgerOptions,
        write_only: bool,
    ) -> Result<Self> {
        let read_only = opts.read_only;
        let ml = ManagedLedger::open(data_dir, name, opts)?;
        if !read_only {
            ml.set_compacted()?;
        }
        let t = Self {
            ml,
            index: Arc::new(Mutex::new(Index::new())),
            write_only,
            gate: RwLock::new(()),
            inflight: Arc::new(InFlight::default()),
        };
        if !write_only {
            *t.index.lock() = t.read_index()?;
        }
        Ok(t)
    }

    /// True if opened with [`CompactedTopic::open_write_only`].
    pub fn is_write_only(&self) -> bool {
        self.write_only
    }

    fn replay(&self) -> Result<()> {
        *self.index.lock() = self.read_index()?;
        Ok(())
    }

    /// Reads the whole log: the newest record of every key.
    fn read_index(&self) -> Result<Index> {
        let mut index = Index::new();
        let mut next = self.ml.first_position();
        let last = self.ml.last_position();
        while let (Some(start), Some(last)) = (next, last) {
            if start > last {
                break;
            }
            let end = Position::new(
                start.ledger_id,
                start.entry_id.saturating_add(REPLAY_CHUNK - 1),
            );
            let chunk = self.ml.read_range(start, end.min(last))?;
            let Some(&(tail, _)) = chunk.last() else {
                next = self.ml.next_after(Some(end));
                continue;
            };
            for (pos, entry) in chunk {
                apply(&mut index, pos, decode(pos, &entry)?);
            }
            next = self.ml.next_after(Some(tail));
        }
        Ok(index)
    }

    /// The underlying managed ledger.
    pub fn ledger(&self) -> &Arc<ManagedLedger> {
        &self.ml
    }

    /// Writes `key = value` durably (`None` deletes the key).
    pub fn put(&self, key: &str, value: Option<&[u8]>) -> Result<Position> {
        not_on_storage_thread()?;
        let _g = self.gate.read();
        let pos = self.ml.append(&encode(key, value))?;
        if self.write_only {
            return Ok(pos);
        }
        let rec = CompactedRecord {
            key: key.to_owned(),
            value: value.map(<[u8]>::to_vec),
        };
        apply(&mut self.index.lock(), pos, rec);
        Ok(pos)
    }

    /// Writes many records in one group commit.
    pub fn put_many(&self, records: Vec<(String, Option<Vec<u8>>)>) -> Result<Vec<Position>> {
        not_on_storage_thread()?;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.put_many_async(
            records,
            None, // no deadline: always queued
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        rx.recv()
            .map_err(|_| Error::invalid("the ledger dropped a put without completing it"))?
    }

    /// Queues many records for one group commit; `done` runs once they are
    /// durable (and readable through [`Self::get`]) or failed. A caller may
    /// stop waiting for it (a deadline): the put completes anyway, and
    /// compaction waits for it. While a compaction holds the topic (it waits
    /// for such puts), queueing waits until `deadline` at most: then nothing
    /// is queued, `done` is not called, and this returns false.
    pub fn put_many_async(
        &self,
        records: Vec<(String, Option<Vec<u8>>)>,
        deadline: Option<Instant>,
        done: Box<dyn FnOnce(Result<Vec<Position>>) + Send>,
    ) -> bool {
        let Some(_g) = self.gate.read_by(deadline) else {
            return false;
        };
        let entries = records
            .iter()
            .map(|(k, v)| encode(k, v.as_deref()))
            .collect();
        *self.inflight.count.lock() += 1;
        let inflight = Arc::clone(&self.inflight);
        let index = (!self.write_only).then(|| Arc::clone(&self.index));
        self.ml.append_many_async(
            entries,
            Box::new(move |res| {
                if let (Ok(positions), Some(index)) = (&res, index) {
                    let mut index = index.lock();
                    for ((key, value), &pos) in records.into_iter().zip(positions) {
                        apply(&mut index, pos, CompactedRecord { key, value });
                    }
                }
                inflight.done();
                done(res);
            }),
        );
        true
    }

    /// Refuses reads of a write-only topic: it keeps no key index, so an
    /// answer would be a silent "no such key" (see [`Self::open_write_only`]).
    fn readable(&self) -> Result<()> {
        if self.write_only {
            return Err(Error::InvalidArgument(format!(
                "compacted topic {} was opened write_only: it keeps no key index to read",
                self.ml.name()
            )));
        }
        Ok(())
    }

    /// The newest value of `key`, if it has one (an error on a write-only topic).
    pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.readable()?;
        Ok(self.index.lock().get(key).and_then(|(_, v)| v.clone()))
    }

    /// Every live key with its newest value, in key order (an error on a write-only topic).
    pub fn items(&self) -> Result<Vec<(String, Vec<u8>)>> {
        self.readable()?;
        Ok(self.live_items())
    }

    fn live_items(&self) -> Vec<(String, Vec<u8>)> {
        self.index
            .lock()
            .iter()
            .filter_map(|(k, (_, v))| v.as_ref().map(|v| (k.clone(), v.clone())))
            .collect()
    }

    /// Number of live keys (an error on a write-only topic).
    pub fn len(&self) -> Result<usize> {
        self.readable()?;
        Ok(self
            .index
            .lock()
            .values()
            .filter(|(_, v)| v.is_some())
            .count())
    }

    /// True if no key has a value (an error on a write-only topic).
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Rewrites the live records into one new ledger and drops the old ones.
    ///
    /// A write-only topic reads its log once here to find them.
    pub fn compact(&self) -> Result<CompactionStats> {
        let _g = self.gate.write();
        {
            // Puts queued before the gate closed land first: their records are
            // in the snapshot below, never dropped by the swap.
            let mut n = self.inflight.count.lock();
            while *n > 0 {
                self.inflight.idle.wait(&mut n);
            }
        }
        let entries_before = self.ml.entry_count();
        let live: Vec<(String, Vec<u8>)> = if self.write_only {
            self.read_index()?
                .into_iter()
                .filter_map(|(k, (_, v))| v.map(|v| (k, v)))
                .collect()
        } else {
            self.live_items()
        };
        let entries = live.iter().map(|(k, v)| encode(k, Some(v))).collect();
        let positions = self.ml.replace_all(entries)?;
        let mut index = Index::new();
        for ((k, v), pos) in live.into_iter().zip(positions) {
            index.insert(k, (pos, Some(v)));
        }
        let entries_after = index.len() as u64;
        if !self.write_only {
            *self.index.lock() = index;
        }
        Ok(CompactionStats {
            entries_before,
            entries_after,
        })
    }

    /// Read-only opens: picks up records another process wrote.
    pub fn refresh(&self) -> Result<()> {
        self.ml.refresh()?;
        self.replay()
    }

    /// Closes the underlying ledger.
    pub fn close(&self) -> Result<()> {
        self.ml.close()
    }
}
