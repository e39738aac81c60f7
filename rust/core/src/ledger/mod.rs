//! Durable ledger storage: the managed ledger.
//!
//! A managed ledger is an ordered list of ledgers (segment files) forming
//! one log, plus named cursors. Its directory is
//! `<data_dir>/ledgers/<escaped name>/` (see [`meta::escape_name`]):
//!
//! ```text
//! <ledger_id>.log     one ledger (segment file)
//! <ledger_id>.synced  open ledger only: its synced end offset, for readers
//!                     in other processes ([u64][u32 crc32c][u32 0], a hint,
//!                     never fsynced; removed when the ledger is sealed)
//! META                ManagedLedgerMeta protobuf: ledgers, cursors, next id
//! LOCK                flock'ed by the one writer process
//! ```
//!
//! # Segment file format (version 1, little-endian)
//!
//! ```text
//! header, 32 bytes:  magic "TXSLEDG\0" | u32 version=1 | u32 flags=0
//!                    | u64 ledger_id | u32 crc32c(bytes 0..24) | u32 0
//! records:           [u32 len][u32 crc32c(len bytes ++ payload)][payload]
//! ```
//!
//! Entry ids count records from 0. The file is preallocated with
//! `fallocate`, so past the last record it holds zeros; because the crc
//! covers the length bytes, the zero header `(0, 0)` never validates and
//! marks the end. A sealed ledger is truncated to its last record and its
//! entry count is recorded in META; only the newest ledger may be open
//! (`entries` absent in META).
//!
//! # Durability
//!
//! A dedicated writer thread takes every queued append and writes them with
//! one `pwritev` (group commit); a sync thread `fdatasync`s everything written
//! so far while the writer thread already writes the next group, publishes
//! the synced groups to readers (its own index, and the `.synced` hint for
//! other processes) and only then completes the callers, in append order
//! (see `writer_thread`). A failed write or sync fails every caller not yet
//! known durable and every append queued at that moment, and the file is
//! truncated back to the last synced offset so unacknowledged bytes never
//! resurface.
//!
//! # Recovery
//!
//! On open every ledger is scanned and every checksum verified. A torn or
//! checksum-failing tail of the open ledger is truncated (only unacknowledged
//! data can be there); a bad record followed by any valid record is a
//! `CorruptLedger` error naming the position, never a silent loss. Telling
//! the two apart costs time linear in the rest of the file, however large
//! the damaged record (see `segment::valid_record_after`). A sealed ledger
//! must hold exactly its recorded number of entries. Ledger files without a
//! META are a `CorruptLedger` error; of the files META does not list, only
//! provable leftovers are removed (ids at or past `next_ledger_id`: created,
//! never listed; ids below the lowest listed one: trimmed, not yet unlinked).
//!
//! A read-only open takes no lock and writes nothing, so another process can
//! read a live ledger; it stops at the last complete record (the crc guards
//! against half-written ones) and never passes the open ledger's `.synced`
//! offset, so it serves no bytes a failing sync could still take back;
//! [`ManagedLedger::refresh`] catches up.

pub mod compacted;
mod crc_range;
pub mod cursor;
pub mod fault;
pub mod meta;
pub mod options;
pub mod segment;
mod sync_thread;
mod writer_thread;

pub use compacted::CompactedTopic;
pub use cursor::Cursor;
pub use fault::{FaultInjector, FaultKind};
pub use options::{LedgerOptions, MAX_ENTRY_SIZE};

use crate::error::{Error, Result};
use crate::position::Position;
use crate::proto::{LedgerInfo, ManagedLedgerMeta};
use crate::sink::{AppendCallback, EntrySink};
use crossbeam_channel::{Receiver, Sender};
use cursor::{CursorData, CursorInner};
use meta::{read_meta, write_meta, META_FORMAT_VERSION};
use parking_lot::{Condvar, Mutex, RwLock};
use segment::{scan, segment_path, ScanMode, Segment, HEADER_LEN};
use std::collections::BTreeMap;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use writer_thread::{Command, Done, WriterThread};

/// First ledger id of a new managed ledger.
const FIRST_LEDGER_ID: u64 = 1;

/// Ledger-list bookkeeping guarded by the META lock: every META write and
/// every change of the ledger list happens under it, so each written META is
/// one consistent snapshot.
#[derive(Debug)]
pub(crate) struct MetaState {
    pub next_ledger_id: u64,
    /// The ledger the writer appends to, if one is open.
    pub active: Option<u64>,
    pub compacted: bool,
    /// Cursor states from META, for cursors not opened yet.
    pub persisted_cursors: BTreeMap<String, CursorData>,
}

#[derive(Debug, Default)]
struct FlushSignal {
    dirty: bool,
    stop: bool,
}

/// State shared by the handle, the writer thread, the flusher and cursors.
pub(crate) struct Shared {
    pub name: String,
    pub dir: PathBuf,
    pub opts: LedgerOptions,
    pub faults: Arc<FaultInjector>,
    pub ledgers: RwLock<BTreeMap<u64, Arc<Segment>>>,
    pub meta: Mutex<MetaState>,
    pub cursors: Mutex<BTreeMap<String, Arc<CursorInner>>>,
    pub closed: AtomicBool,
    flush: Mutex<FlushSignal>,
    flush_cv: Condvar,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("name", &self.name)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl Shared {
    pub fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::LedgerClosed(self.name.clone()));
        }
        Ok(())
    }

    pub fn check_writable(&self) -> Result<()> {
        self.check_open()?;
        if self.opts.read_only {
            return Err(Error::ReadOnly(self.name.clone()));
        }
        Ok(())
    }

    pub fn first_position(&self) -> Option<Position> {
        self.ledgers
            .read()
            .iter()
            .find(|(_, s)| s.count() > 0)
            .map(|(&id, _)| Position::new(id, 0))
    }

    pub fn last_position(&self) -> Option<Position> {
        self.ledgers.read().iter().rev().find_map(|(&id, s)| {
            let c = s.count();
            (c > 0).then(|| Position::new(id, c - 1))
        })
    }

    /// The first existing entry after `p` (after nothing: the first entry).
    pub fn next_after(&self, p: Option<Position>) -> Option<Position> {
        let (ledger, entry) = match p {
            None => (0, 0),
            Some(p) => match p.entry_id.checked_add(1) {
                Some(e) => (p.ledger_id, e),
                None => (p.ledger_id.checked_add(1)?, 0),
            },
        };
        let ledgers = self.ledgers.read();
        for (&id, seg) in ledgers.range(ledger..) {
            let e = if id == ledger { entry } else { 0 };
            if e < seg.count() {
                return Some(Position::new(id, e));
            }
        }
        None
    }

    pub fn exists(&self, p: Position) -> bool {
        self.ledgers
            .read()
            .get(&p.ledger_id)
            .is_some_and(|s| p.entry_id < s.count())
    }

    /// A position between existing entries that names no entry (in a
    /// trimmed or empty ledger): valid as a mark-delete bound.
    pub fn is_gap(&self, p: Position) -> bool {
        !self.ledgers.read().contains_key(&p.ledger_id)
            && self.last_position().is_some_and(|l| p < l)
    }

    pub fn not_found(&self, p: Position) -> Error {
        let reason = match self.ledgers.read().get(&p.ledger_id) {
            Some(s) => format!("ledger {} has {} entries", p.ledger_id, s.count()),
            None => match (self.first_position(), self.last_position()) {
                (Some(f), _) if p < f => format!("trimmed (first entry is {f})"),
                (_, Some(l)) if p > l => format!("past the end (last entry is {l})"),
                (_, None) => "the managed ledger is empty".to_owned(),
                _ => format!("ledger {} does not exist", p.ledger_id),
            },
        };
        Error::PositionNotFound {
            position: p,
            reason,
        }
    }

    fn segment(&self, p: Position) -> Result<Arc<Segment>> {
        self.ledgers
            .read()
            .get(&p.ledger_id)
            .cloned()
            .ok_or_else(|| self.not_found(p))
    }

    /// The test hook in front of every read (a held gate or an injected error).
    fn read_fault(&self) -> Result<()> {
        self.faults
            .check(FaultKind::Read)
            .map_err(|e| Error::io(format!("reading managed ledger {:?}", self.name), &e))
    }

    pub fn read(&self, p: Position) -> Result<Vec<u8>> {
        self.check_open()?;
        self.read_fault()?;
        let seg = self.segment(p)?;
        if p.entry_id >= seg.count() {
            return Err(self.not_found(p));
        }
        let mut v = seg.read_entries(p.entry_id, 1)?;
        v.pop().ok_or_else(|| self.not_found(p))
    }

    /// Reads existing positions (ascending), one `pread` per contiguous run.
    pub fn read_positions(&self, ps: &[Position]) -> Result<Vec<Vec<u8>>> {
        if !ps.is_empty() {
            self.read_fault()?;
        }
        let mut out = Vec::with_capacity(ps.len());
        let mut i = 0;
        while i < ps.len() {
            let first = ps[i];
            let mut j = i + 1;
            while j < ps.len()
                && ps[j].ledger_id == first.ledger_id
                && ps[j].entry_id == ps[j - 1].entry_id + 1
            {
                j += 1;
            }
            let seg = self.segment(first)?;
            out.extend(seg.read_entries(first.entry_id, (j - i) as u64)?);
            i = j;
        }
        Ok(out)
    }

    pub fn read_range(&self, start: Position, end: Position) -> Result<Vec<(Position, Vec<u8>)>> {
        self.check_open()?;
        if start > end {
            return Err(Error::invalid(format!(
                "read_range start {start} is after end {end}"
            )));
        }
        match self.last_position() {
            Some(l) if start <= l => {}
            _ => return Err(self.not_found(start)),
        }
        self.read_fault()?;
        let segs: Vec<Arc<Segment>> = self
            .ledgers
            .read()
            .range(start.ledger_id..=end.ledger_id)
            .map(|(_, s)| Arc::clone(s))
            .collect();
        let mut out = Vec::new();
        for seg in segs {
            let count = seg.count();
            let a = if seg.id == start.ledger_id {
                start.entry_id
            } else {
                0
            };
            let b = if seg.id == end.ledger_id {
                end.entry_id.saturating_add(1).min(count)
            } else {
                count
            };
            if a >= b {
                continue;
            }
            for (k, data) in seg.read_entries(a, b - a)?.into_iter().enumerate() {
                out.push((Position::new(seg.id, a + k as u64), data));
            }
        }
        Ok(out)
    }

    pub fn mark_dirty(&self) {
        let mut f = self.flush.lock();
        if !f.dirty {
            f.dirty = true;
            self.flush_cv.notify_one();
        }
    }

    /// META as it should be now, leaving out `drop_ids`.
    fn build_meta(&self, m: &MetaState, drop_ids: &[u64]) -> ManagedLedgerMeta {
        let ledgers = self
            .ledgers
            .read()
            .iter()
            .filter(|(id, _)| !drop_ids.contains(id))
            .map(|(&id, s)| {
                let idx = s.index.read();
                LedgerInfo {
                    ledger_id: id,
                    entries: (m.active != Some(id)).then(|| idx.count()),
                    size_bytes: Some(idx.end),
                }
            })
            .collect();
        let mut cursors: BTreeMap<String, _> = m
            .persisted_cursors
            .iter()
            .map(|(n, d)| (n.clone(), d.to_proto(n)))
            .collect();
        for (n, c) in self.cursors.lock().iter() {
            cursors.insert(n.clone(), c.data.lock().to_proto(n));
        }
        ManagedLedgerMeta {
            format_version: META_FORMAT_VERSION,
            ledgers,
            cursors: cursors.into_values().collect(),
            next_ledger_id: Some(m.next_ledger_id),
            compacted: Some(m.compacted),
        }
    }

    /// Writes META from the current state; the caller holds the META lock.
    pub fn write_meta_locked(&self, m: &MetaState) -> Result<()> {
        self.meta_fault()?;
        write_meta(&self.dir, &self.build_meta(m, &[]))
    }

    /// The test hook in front of every META write (called under the META lock).
    fn meta_fault(&self) -> Result<()> {
        self.faults.check(FaultKind::Meta).map_err(|e| {
            Error::io(
                format!("writing {}", self.dir.join(meta::META_FILE).display()),
                &e,
            )
        })
    }

    /// Ledgers wholly before every cursor's mark-delete (never the newest
    /// nor the open one); none without cursors.
    fn trimmable(&self, m: &MetaState) -> Vec<u64> {
        let mut min_md: Option<Position> = None;
        {
            let cursors = self.cursors.lock();
            let persisted = m
                .persisted_cursors
                .iter()
                .filter(|(n, _)| !cursors.contains_key(*n))
                .map(|(_, d)| d.mark_delete);
            let live = cursors.values().map(|c| c.data.lock().mark_delete);
            let mut any = false;
            for md in live.chain(persisted) {
                any = true;
                match md {
                    None => return Vec::new(),
                    Some(p) => min_md = Some(min_md.map_or(p, |q: Position| q.min(p))),
                }
            }
            if !any {
                return Vec::new();
            }
        }
        let Some(md) = min_md else {
            return Vec::new();
        };
        let ledgers = self.ledgers.read();
        let newest = ledgers.keys().next_back().copied();
        ledgers
            .iter()
            .filter(|(&id, _)| Some(id) != newest && Some(id) != m.active)
            .filter(|(&id, s)| match s.count() {
                0 => id <= md.ledger_id,
                c => Position::new(id, c - 1) <= md,
            })
            .map(|(&id, _)| id)
            .collect()
    }

    /// Writes META (cursor states) and, if `trim`, drops ledgers every
    /// cursor has passed: first from META, then from disk.
    pub fn persist(&self, trim: bool) -> Result<()> {
        let m = self.meta.lock();
        let drop_ids = if trim { self.trimmable(&m) } else { Vec::new() };
        self.meta_fault()?;
        write_meta(&self.dir, &self.build_meta(&m, &drop_ids))?;
        if !drop_ids.is_empty() {
            let mut ledgers = self.ledgers.write();
            for id in &drop_ids {
                ledgers.remove(id);
            }
            drop(ledgers);
            for id in &drop_ids {
                // A file left behind is unlisted and removed on the next open.
                let _ = fs::remove_file(segment_path(&self.dir, *id));
                let _ = fs::remove_file(segment::synced_path(&self.dir, *id));
            }
        }
        Ok(())
    }

    /// Background flush loop: writes dirty cursor state at most once per
    /// interval.
    fn flusher(self: &Arc<Self>) {
        let interval = self.opts.cursor_flush_interval;
        let mut f = self.flush.lock();
        loop {
            while !f.dirty && !f.stop {
                self.flush_cv.wait(&mut f);
            }
            if f.stop {
                return;
            }
            // Coalesce changes for one interval (cut short by close).
            let deadline = Instant::now() + interval;
            while !f.stop && Instant::now() < deadline {
                self.flush_cv.wait_until(&mut f, deadline);
            }
            f.dirty = false;
            drop(f);
            // A failure is retried on the next change and reported by
            // flush()/close(), which persist synchronously.
            if self.persist(true).is_err() {
                self.flush.lock().dirty = true;
                std::thread::sleep(interval.max(Duration::from_millis(10)));
            }
            f = self.flush.lock();
        }
    }

    fn stop_flusher(&self) {
        self.flush.lock().stop = true;
        self.flush_cv.notify_all();
    }
}

/// A durable, ordered log of entries with cursors; always used as
/// `Arc<ManagedLedger>`.
pub struct ManagedLedger {
    shared: Arc<Shared>,
    tx: RwLock<Option<Sender<Command>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Held (flock'ed) while open for writing; released by close.
    lock: Mutex<Option<File>>,
}

impl fmt::Debug for ManagedLedger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManagedLedger")
            .field("name", &self.shared.name)
            .field("dir", &self.shared.dir)
            .field("read_only", &self.shared.opts.read_only)
            .finish()
    }
}

fn lock_dir(dir: &Path) -> Result<File> {
    let path = dir.join("LOCK");
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| Error::io(format!("opening {}", path.display()), &e))?;
    // SAFETY: flock on a valid descriptor we own; no memory involved.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return Err(Error::io(
            format!(
                "locking {} (is the ledger open for writing elsewhere?)",
                path.display()
            ),
            &e,
        ));
    }
    Ok(f)
}

fn create_dirs(data_dir: &Path, dir: &Path) -> Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating directory {}", dir.display()), &e))?;
    // Make the new names durable up to the data directory.
    let mut p = dir.parent();
    while let Some(parent) = p {
        segment::sync_dir(parent)?;
        if parent == data_dir {
            break;
        }
        p = parent.parent();
    }
    Ok(())
}

/// Ids of `<id>.log` files in `dir`.
fn ledger_files(dir: &Path) -> Result<Vec<u64>> {
    files_with_suffix(dir, ".log")
}

/// Ids of `<id><suffix>` files in `dir`, ascending.
fn files_with_suffix(dir: &Path, suffix: &str) -> Result<Vec<u64>> {
    let rd = fs::read_dir(dir)
        .map_err(|e| Error::io(format!("listing directory {}", dir.display()), &e))?;
    let mut out = Vec::new();
    for ent in rd {
        let ent = ent.map_err(|e| Error::io(format!("listing {}", dir.display()), &e))?;
        let name = ent.file_name();
        if let Some(id) = name
            .to_str()
            .and_then(|n| n.strip_suffix(suffix))
            .and_then(|n| n.parse::<u64>().ok())
        {
            out.push(id);
        }
    }
    out.sort_unstable();
    Ok(out)
}

fn load_cursors(meta: &ManagedLedgerMeta, dir: &Path) -> Result<BTreeMap<String, CursorData>> {
    let mut out = BTreeMap::new();
    for c in &meta.cursors {
        let d = CursorData::from_proto(c).map_err(|reason| Error::CorruptLedger {
            path: dir.join(meta::META_FILE).display().to_string(),
            position: Position::default(),
            offset: 0,
            reason,
        })?;
        out.insert(c.name.clone(), d);
    }
    Ok(out)
}

impl ManagedLedger {
    /// Opens (creating if needed) managed ledger `name` under `data_dir`,
    /// recovering it as described in the [module docs](self).
    pub fn open(data_dir: &Path, name: &str, opts: LedgerOptions) -> Result<Arc<ManagedLedger>> {
        opts.validate()?;
        let dir = meta::ledger_dir(data_dir, name)?;
        let faults = opts
            .fault_injector
            .clone()
            .unwrap_or_else(|| Arc::new(FaultInjector::new()));
        let shared = Arc::new(Shared {
            name: name.to_owned(),
            dir: dir.clone(),
            faults,
            ledgers: RwLock::new(BTreeMap::new()),
            meta: Mutex::new(MetaState {
                next_ledger_id: FIRST_LEDGER_ID,
                active: None,
                compacted: false,
                persisted_cursors: BTreeMap::new(),
            }),
            cursors: Mutex::new(BTreeMap::new()),
            closed: AtomicBool::new(false),
            flush: Mutex::new(FlushSignal::default()),
            flush_cv: Condvar::new(),
            opts,
        });
        if shared.opts.read_only {
            if !dir.join(meta::META_FILE).is_file() {
                return Err(Error::Io {
                    context: format!("opening managed ledger {name:?} read-only"),
                    errno: Some(libc::ENOENT),
                    message: format!("no META in {}", dir.display()),
                });
            }
            let ml = Arc::new(ManagedLedger {
                shared,
                tx: RwLock::new(None),
                threads: Mutex::new(Vec::new()),
                lock: Mutex::new(None),
            });
            ml.refresh()?;
            return Ok(ml);
        }
        create_dirs(data_dir, &dir)?;
        let lock = lock_dir(&dir)?;
        Self::recover(&shared)?;
        let (tx, rx) = crossbeam_channel::unbounded();
        let ml = Arc::new(ManagedLedger {
            shared: Arc::clone(&shared),
            tx: RwLock::new(Some(tx)),
            threads: Mutex::new(Vec::new()),
            lock: Mutex::new(Some(lock)),
        });
        ml.spawn_threads(rx)?;
        Ok(ml)
    }

    fn spawn_threads(&self, rx: Receiver<Command>) -> Result<()> {
        let spawn_err = |e: io::Error| Error::io("spawning ledger thread", &e);
        let writer = WriterThread::new(Arc::clone(&self.shared), rx).map_err(spawn_err)?;
        let w = std::thread::Builder::new()
            .name(format!("ledger-writer-{}", self.shared.name))
            .spawn(move || writer.run())
            .map_err(spawn_err)?;
        let s = Arc::clone(&self.shared);
        let f = std::thread::Builder::new()
            .name(format!("ledger-flush-{}", self.shared.name))
            .spawn(move || s.flusher())
            .map_err(spawn_err)?;
        self.threads.lock().extend([w, f]);
        Ok(())
    }

    /// Writer-side open: scan every ledger, cut a torn tail of the crashed
    /// open ledger, remove unlisted files, write a fresh META.
    fn recover(shared: &Arc<Shared>) -> Result<()> {
        let dir = &shared.dir;
        let meta = read_meta(dir)?;
        let files = ledger_files(dir)?;
        if meta.is_none() && !files.is_empty() {
            // META is written before the first ledger file is created, so
            // ledger files without it mean META was lost: never guess.
            let names: Vec<String> = files.iter().map(|id| format!("{id}.log")).collect();
            return Err(Error::CorruptLedger {
                path: dir.join(meta::META_FILE).display().to_string(),
                position: Position::default(),
                offset: 0,
                reason: format!(
                    "META is missing but {} holds ledger files ({}); nothing was removed",
                    dir.display(),
                    names.join(", ")
                ),
            });
        }
        let mut m = shared.meta.lock();
        let mut ledgers = BTreeMap::new();
        if let Some(meta) = &meta {
            m.next_ledger_id = meta.next_ledger_id.unwrap_or(FIRST_LEDGER_ID);
            m.compacted = meta.compacted.unwrap_or(false);
            m.persisted_cursors = load_cursors(meta, dir)?;
            for info in &meta.ledgers {
                let seg = Segment::open(dir, info.ledger_id, true)?;
                let mode = match info.entries {
                    Some(n) => ScanMode::Sealed(n),
                    None => ScanMode::Recover,
                };
                let res = scan(&seg.file, &seg.path, seg.id, HEADER_LEN, 0, mode)?;
                if mode == ScanMode::Recover {
                    // Cut the torn tail and the preallocated space: the
                    // ledger is sealed now, appends go to a new one.
                    let ctx = format!("truncating ledger file {}", seg.path.display());
                    seg.file
                        .set_len(res.end)
                        .and_then(|()| seg.file.sync_all())
                        .map_err(|e| Error::io(ctx, &e))?;
                }
                seg.publish_scan(&res);
                m.next_ledger_id = m.next_ledger_id.max(info.ledger_id + 1);
                ledgers.insert(info.ledger_id, Arc::new(seg));
            }
        }
        let lowest = ledgers.keys().next().copied();
        for id in files {
            if ledgers.contains_key(&id) {
                continue;
            }
            // Only provable leftovers go: an id at or past next_ledger_id was
            // created by a rollover or compaction that never reached META
            // (never acknowledged); one below the lowest listed id was
            // trimmed from META but not yet unlinked. Anything else is
            // unexplained and stays on disk (it is not read either way).
            if id >= m.next_ledger_id || lowest.is_some_and(|lo| id < lo) {
                let p = segment_path(dir, id);
                fs::remove_file(&p)
                    .map_err(|e| Error::io(format!("removing {}", p.display()), &e))?;
            }
        }
        // Every recovered ledger is sealed now: synced-offset hints are stale.
        for id in files_with_suffix(dir, segment::SYNCED_SUFFIX)? {
            let _ = fs::remove_file(segment::synced_path(dir, id));
        }
        let _ = fs::remove_file(dir.join("META.tmp"));
        *shared.ledgers.write() = ledgers;
        shared.write_meta_locked(&m)
    }

    /// Picks up what another process wrote since the last look (read-only
    /// opens; a no-op for the writer, whose state is always current).
    pub fn refresh(&self) -> Result<()> {
        self.shared.check_open()?;
        if !self.shared.opts.read_only {
            return Ok(());
        }
        // A trim or compaction may delete a file between our META read and
        // its open: read META again.
        let mut last_err = None;
        for _ in 0..20 {
            match self.refresh_once() {
                Ok(()) => return Ok(()),
                Err(
                    e @ Error::Io {
                        errno: Some(libc::ENOENT),
                        ..
                    },
                ) => last_err = Some(e),
                // A live ledger seen mid-write can look torn with data after it.
                Err(e @ Error::CorruptLedger { .. }) => last_err = Some(e),
                Err(e) => return Err(e),
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Err(last_err.unwrap_or_else(|| Error::invalid("refresh failed")))
    }

    fn refresh_once(&self) -> Result<()> {
        let sh = &self.shared;
        let Some(meta) = read_meta(&sh.dir)? else {
            return Ok(());
        };
        let mut m = sh.meta.lock();
        let persisted = load_cursors(&meta, &sh.dir)?;
        let current: BTreeMap<u64, Arc<Segment>> = sh.ledgers.read().clone();
        let mut next = BTreeMap::new();
        for info in &meta.ledgers {
            let seg = match current.get(&info.ledger_id) {
                Some(s) => Arc::clone(s),
                None => Arc::new(Segment::open(&sh.dir, info.ledger_id, false)?),
            };
            let (have, end) = {
                let idx = seg.index.read();
                (idx.count(), idx.end)
            };
            let mode = match info.entries {
                Some(n) => ScanMode::Sealed(n),
                // Never past what the writer has synced: bytes beyond may
                // belong to a group whose sync fails and is rewritten.
                None => ScanMode::Live {
                    synced: segment::read_synced(&sh.dir, info.ledger_id)?
                        .map(|hint| hint.unwrap_or(end)),
                },
            };
            let needs_scan = match mode {
                ScanMode::Sealed(n) => have < n,
                _ => true,
            };
            if needs_scan {
                let res = scan(&seg.file, &seg.path, seg.id, end, have, mode)?;
                seg.publish_scan(&res);
            }
            next.insert(info.ledger_id, seg);
        }
        *sh.ledgers.write() = next;
        m.next_ledger_id = meta.next_ledger_id.unwrap_or(FIRST_LEDGER_ID);
        m.compacted = meta.compacted.unwrap_or(false);
        // Open cursors take the persisted state; their read position stays.
        for (name, c) in sh.cursors.lock().iter() {
            let mut d = c.data.lock();
            let read_after = d.read_after;
            *d = persisted.get(name).cloned().unwrap_or_default();
            d.read_after = read_after.max(d.mark_delete);
        }
        m.persisted_cursors = persisted;
        Ok(())
    }

    /// Name of the managed ledger.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// True if opened read-only.
    pub fn is_read_only(&self) -> bool {
        self.shared.opts.read_only
    }

    /// True once closed.
    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire)
    }

    /// The injector armed by fault tests.
    pub fn fault_injector(&self) -> &Arc<FaultInjector> {
        &self.shared.faults
    }

    /// Arms a fault: the next `times` calls of `kind` fail with `errno`.
    pub fn inject_fault(&self, kind: FaultKind, errno: i32, times: u32) {
        self.shared.faults.inject(kind, errno, times);
    }

    fn send(&self, cmd: Command) {
        let tx = self.tx.read();
        let cmd = match tx.as_ref() {
            Some(tx) => match tx.send(cmd) {
                Ok(()) => return,
                Err(e) => e.0,
            },
            None => cmd,
        };
        drop(tx);
        cmd.fail(&Error::LedgerClosed(self.shared.name.clone()));
    }

    fn check_entry(&self, data: &[u8]) -> Result<()> {
        self.shared.check_writable()?;
        if data.len() > MAX_ENTRY_SIZE {
            return Err(Error::invalid(format!(
                "entry of {} bytes exceeds the maximum of {MAX_ENTRY_SIZE}",
                data.len()
            )));
        }
        Ok(())
    }

    fn wait(&self, rx: &Receiver<Result<Vec<Position>>>) -> Result<Vec<Position>> {
        rx.recv()
            .unwrap_or_else(|_| Err(Error::LedgerClosed(self.shared.name.clone())))
    }

    /// Appends one entry; returns its position once it is durable.
    pub fn append(&self, data: &[u8]) -> Result<Position> {
        self.check_entry(data)?;
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.send(Command::Append {
            entries: vec![data.to_vec()],
            done: Done::Waiter(tx),
        });
        let mut v = self.wait(&rx)?;
        v.pop()
            .ok_or_else(|| Error::invalid("append completed without a position"))
    }

    /// Appends entries in one group commit (never split across ledgers);
    /// returns their positions once all are durable.
    pub fn append_many(&self, data: Vec<Vec<u8>>) -> Result<Vec<Position>> {
        self.shared.check_writable()?;
        for d in &data {
            self.check_entry(d)?;
        }
        if data.is_empty() {
            return Ok(Vec::new());
        }
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.send(Command::Append {
            entries: data,
            done: Done::Waiter(tx),
        });
        self.wait(&rx)
    }

    /// Like [`append_many`](Self::append_many) but returns at once; `done`
    /// runs on the writer thread once all entries are durable or failed.
    pub fn append_many_async(
        &self,
        data: Vec<Vec<u8>>,
        done: Box<dyn FnOnce(Result<Vec<Position>>) + Send>,
    ) {
        if let Err(e) = self
            .shared
            .check_writable()
            .and_then(|()| data.iter().try_for_each(|d| self.check_entry(d)))
        {
            return done(Err(e));
        }
        if data.is_empty() {
            return done(Ok(Vec::new()));
        }
        self.send(Command::Append {
            entries: data,
            done: Done::Batch(done),
        });
    }

    /// Reads the entry at `pos`.
    pub fn read(&self, pos: Position) -> Result<Vec<u8>> {
        self.shared.read(pos)
    }

    /// Reads existing entries with `start <= position <= end_inclusive`.
    /// `start` past the last entry is `PositionNotFound`; `end` is clipped.
    pub fn read_range(
        &self,
        start: Position,
        end_inclusive: Position,
    ) -> Result<Vec<(Position, Vec<u8>)>> {
        self.shared.read_range(start, end_inclusive)
    }

    /// First readable entry.
    pub fn first_position(&self) -> Option<Position> {
        self.shared.first_position()
    }

    /// Last durable entry.
    pub fn last_position(&self) -> Option<Position> {
        self.shared.last_position()
    }

    /// Number of readable entries.
    pub fn entry_count(&self) -> u64 {
        self.shared.ledgers.read().values().map(|s| s.count()).sum()
    }

    /// Ledgers as `(ledger_id, entries, sealed)`.
    pub fn ledgers(&self) -> Vec<(u64, u64, bool)> {
        let active = self.shared.meta.lock().active;
        self.shared
            .ledgers
            .read()
            .iter()
            .map(|(&id, s)| (id, s.count(), Some(id) != active))
            .collect()
    }

    /// Names of the cursors (opened or persisted).
    pub fn cursor_names(&self) -> Vec<String> {
        let m = self.shared.meta.lock();
        let mut names: Vec<String> = m.persisted_cursors.keys().cloned().collect();
        names.extend(self.shared.cursors.lock().keys().cloned());
        names.sort();
        names.dedup();
        names
    }

    /// Opens cursor `name`, restoring its persisted state; a new cursor
    /// starts before the first entry and is recorded in META at once.
    pub fn open_cursor(&self, name: &str) -> Result<Cursor> {
        self.shared.check_open()?;
        if name.is_empty() {
            return Err(Error::invalid("cursor name must not be empty"));
        }
        let mut m = self.shared.meta.lock();
        let mut cursors = self.shared.cursors.lock();
        if let Some(c) = cursors.get(name) {
            return Ok(Cursor {
                inner: Arc::clone(c),
                shared: Arc::clone(&self.shared),
            });
        }
        let (data, new) = match m.persisted_cursors.remove(name) {
            Some(d) => (d, false),
            None => (CursorData::default(), true),
        };
        let inner = Arc::new(CursorInner {
            name: name.to_owned(),
            data: Mutex::new(data),
            reading: Mutex::new(()),
            rewinds: std::sync::atomic::AtomicU64::new(0),
        });
        cursors.insert(name.to_owned(), Arc::clone(&inner));
        drop(cursors);
        if new && !self.shared.opts.read_only {
            if let Err(e) = self.shared.write_meta_locked(&m) {
                self.shared.cursors.lock().remove(name);
                return Err(e);
            }
        }
        Ok(Cursor {
            inner,
            shared: Arc::clone(&self.shared),
        })
    }

    /// Removes cursor `name` (it no longer holds back trimming).
    pub fn delete_cursor(&self, name: &str) -> Result<()> {
        self.shared.check_writable()?;
        let mut m = self.shared.meta.lock();
        let a = self.shared.cursors.lock().remove(name).is_some();
        let b = m.persisted_cursors.remove(name).is_some();
        if !a && !b {
            return Err(Error::invalid(format!("no cursor named {name:?}")));
        }
        self.shared.write_meta_locked(&m)
    }

    /// Writes cursor states to META now and trims passed ledgers.
    pub fn flush(&self) -> Result<()> {
        self.shared.check_writable()?;
        self.shared.persist(true)
    }

    /// Atomically replaces the whole log with one new ledger holding
    /// `entries` (compaction). Returns their positions.
    pub fn replace_all(&self, entries: Vec<Vec<u8>>) -> Result<Vec<Position>> {
        self.shared.check_writable()?;
        for d in &entries {
            self.check_entry(d)?;
        }
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.send(Command::Replace { entries, done: tx });
        self.wait(&rx)
    }

    /// Marks the ledger as a compacted topic in META.
    pub fn set_compacted(&self) -> Result<()> {
        self.shared.check_writable()?;
        let mut m = self.shared.meta.lock();
        if m.compacted {
            return Ok(());
        }
        m.compacted = true;
        self.shared.write_meta_locked(&m)
    }

    /// True if META marks this as a compacted topic.
    pub fn is_compacted(&self) -> bool {
        self.shared.meta.lock().compacted
    }

    /// Waits for queued appends, seals the open ledger, writes META and
    /// stops the threads. Later calls return `Ok`; other calls fail with
    /// `LedgerClosed`.
    pub fn close(&self) -> Result<()> {
        if self.shared.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let tx = self.tx.write().take();
        let mut result = Ok(());
        if let Some(tx) = tx {
            let (dtx, drx) = crossbeam_channel::bounded(1);
            if tx.send(Command::Close { done: dtx }).is_ok() {
                result = drx
                    .recv()
                    .unwrap_or_else(|_| Err(Error::LedgerClosed(self.shared.name.clone())));
            }
        }
        self.shared.stop_flusher();
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
        if !self.shared.opts.read_only {
            let r = self.shared.persist(true);
            if result.is_ok() {
                result = r;
            }
        }
        // Another writer may open the ledger now.
        self.lock.lock().take();
        result
    }
}

impl Drop for ManagedLedger {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

impl EntrySink for ManagedLedger {
    fn append_async(&self, entry: Vec<u8>, done: AppendCallback) {
        if let Err(e) = self.check_entry(&entry) {
            return done(Err(e));
        }
        self.send(Command::Append {
            entries: vec![entry],
            done: Done::Callback(done),
        });
    }

    fn name(&self) -> &str {
        &self.shared.name
    }
}
