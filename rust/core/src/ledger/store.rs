//! The storage engine of one data directory: every managed ledger in it
//! shares one journal, one group-commit pipeline, one flusher, one catalog.
//!
//! # Layout (storage format 2)
//!
//! ```text
//! <data>/LOCK                    the writer process's lock (OFD lock)
//! <data>/CATALOG                 state of every managed ledger as of a checkpoint
//! <data>/journal/<base>.wal      journal segments (see `journal`)
//! <data>/journal/SYNCED          synced-end hint for readers
//! <data>/ledgers/<name>/<id>.log ledger data, written behind the journal
//! <data>/ledgers/<name>/<id>.idx its index
//! ```
//!
//! Why the journal is replayed into per-ledger files (rather than entries
//! living only in journal segments with garbage collection): a slow or
//! never-trimmed topic interleaved with busy, quickly trimmed logs would pin
//! journal segments forever and need compaction that moves live entries; with
//! per-ledger files, trimming is a file removal, a sealed ledger is a
//! self-contained unit (for tiered offload and for Spark partitions), and
//! the second write is off the append path (page cache, synced once per
//! checkpoint for all the ledgers it touched).
//!
//! # Threads (fixed per data directory, whatever the number of ledgers)
//!
//! - journal writer and journal sync ([`super::group_commit`]);
//! - the flusher: writes published entries behind into ledger files, journals
//!   dirty cursor states and trims, and checkpoints: syncs the ledger files
//!   written since the last checkpoint, writes the CATALOG (checkpoint = the
//!   journal offset everything before which is now in files or in the
//!   catalog) and removes journal segments and ledger files no longer needed.
//!
//! # Recovery
//!
//! Load the catalog, replay the journal from its checkpoint
//! ([`MlState::apply`]), with the acknowledged-point rule of
//! [`super::journal`] for damage; open costs the catalog plus the journal
//! tail, never the bytes in sealed ledgers (they are verified on read).
//!
//! # Registry and fork
//!
//! One store per (file system, directory, mode) per process, found through a
//! registry and shared by every handle; it closes when the last handle does.
//! After `fork()` the child starts with an empty registry; stores of the
//! parent fail fast there (see [`crate::fork`]).

use super::catalog::{self, read_catalog, write_catalog, CATALOG_FILE, CATALOG_FORMAT_VERSION};
use super::cursor::CursorInner;
use super::fault::{FaultInjector, FaultKind};
use super::fs::{Fs, FsFile, LockGuard, OpenMode, RealFs};
use super::group_commit::{
    self, Active, Command, Done, Journal, JournalOptions, MetaOp, Published, WriterThread,
};
use super::journal::{self, Kind, JOURNAL_DIR};
use super::ledger_file;
use super::options::LedgerOptions;
use super::state::{Applied, FileCache, FileOpen, MlState, Rollover, StoreIo};
use crate::error::{Error, Result};
use crate::fork;
use crate::position::Position;
use crate::proto::{Catalog, ManagedLedgerState};
use crossbeam_channel::Sender;
use parking_lot::{Condvar, Mutex, RwLock};
use prost::Message;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Directory of the ledger files inside a data directory.
pub const LEDGERS_DIR: &str = "ledgers";
/// Name of the writer lock file.
pub const LOCK_FILE: &str = "LOCK";

// ------------------------------------------------------------------ registry

type Key = (usize, PathBuf, bool);

#[derive(Default)]
struct Registry {
    generation: u64,
    open: HashMap<Key, Arc<Store>>,
    /// Stores shutting down: an open of the same key waits for them.
    closing: HashMap<Key, Arc<(Mutex<bool>, Condvar)>>,
}

static REGISTRY: OnceLock<Mutex<Registry>> = OnceLock::new();

fn with_registry<T>(f: impl FnOnce(&mut Registry) -> T) -> T {
    let _gate = fork::gate();
    let mut r = REGISTRY.get_or_init(Default::default).lock();
    let gen = fork::generation();
    if r.generation != gen {
        // A forked child: the parent's stores have no threads here. Forget
        // them without running anything of theirs.
        std::mem::forget(std::mem::take(&mut r.open));
        std::mem::forget(std::mem::take(&mut r.closing));
        r.generation = gen;
    }
    f(&mut r)
}

fn real_fs() -> Arc<dyn Fs> {
    static REAL: OnceLock<Arc<RealFs>> = OnceLock::new();
    let fs: Arc<RealFs> = Arc::clone(REAL.get_or_init(|| Arc::new(RealFs::new())));
    fs
}

fn fs_id(fs: &Arc<dyn Fs>) -> usize {
    Arc::as_ptr(fs) as *const () as usize
}

// ------------------------------------------------------------------ signals

/// What the journal's threads tell the store (no reference back to it).
#[derive(Debug, Default)]
pub(crate) struct Signals {
    flush: Mutex<FlushState>,
    flush_cv: Condvar,
    pending: Mutex<u64>,
    pending_cv: Condvar,
}

#[derive(Debug, Default)]
struct FlushState {
    stop: bool,
    /// Managed ledgers with entries still only in the journal.
    dirty: HashSet<u64>,
    /// Ledger files to remove once a catalog without them is durable.
    deletes: Vec<(Arc<MlState>, u64)>,
    /// A cursor changed somewhere (journal its state soon).
    cursors: bool,
    /// Someone waits for a checkpoint (sequence it must pass).
    checkpoint_wanted: bool,
}

impl Published for Signals {
    fn published(&self, _end: u64, applied: Vec<(Arc<MlState>, Applied)>) {
        let mut f = self.flush.lock();
        let mut wake = false;
        for (ml, a) in applied {
            if a.appended && f.dirty.insert(ml.id) {
                wake = true;
            }
            if !a.dropped.is_empty() {
                let mut cache = ml.io.files.lock();
                for id in a.dropped {
                    cache.evict((ml.id, id));
                    f.deletes.push((Arc::clone(&ml), id));
                }
            }
        }
        if wake {
            self.flush_cv.notify_one();
        }
    }

    fn released(&self, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let mut p = self.pending.lock();
        *p = p.saturating_sub(bytes);
        self.pending_cv.notify_all();
    }
}

// ------------------------------------------------------------------ the store

#[derive(Debug, Default)]
struct Checkpoint {
    /// Journal offset of the last durable catalog.
    at: u64,
    sequence: u64,
    /// Journal offset up to which entries are written behind.
    copied: u64,
    /// Ledger files written since the last checkpoint (to sync).
    unsynced: HashSet<(u64, u64)>,
    /// Directories with names created since the last checkpoint (to sync).
    dirs: BTreeSet<PathBuf>,
    when: Option<Instant>,
    /// Failures of background work (reported by stats, retried).
    errors: u64,
    last_error: Option<String>,
    count: u64,
    copied_entries: u64,
}

/// The storage engine of one data directory (see the module docs).
pub(crate) struct Store {
    pub io: Arc<StoreIo>,
    pub opts: LedgerOptions,
    pub generation: u64,
    key: Key,
    mls: RwLock<HashMap<u64, Arc<MlState>>>,
    names: Mutex<HashMap<String, u64>>,
    next_ml_id: AtomicU64,
    journal: Option<Arc<Journal>>,
    signals: Arc<Signals>,
    tx: RwLock<Option<Sender<Command>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    lock: Mutex<Option<LockGuard>>,
    ckpt: Mutex<Checkpoint>,
    /// Read-only: journal offset scanned through, catalog sequence loaded.
    ro: Mutex<(u64, u64)>,
    handles: AtomicUsize,
    closing: AtomicBool,
    /// Serialises checkpoints and write-behind (flusher, close, callers).
    serial: Mutex<()>,
    /// Ledger files found at open, by escaped managed-ledger name: (ledger
    /// id, is index). Checked against each managed ledger's state when it
    /// is first opened.
    listing: Mutex<HashMap<String, Vec<(u64, bool)>>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("dir", &self.io.data_dir)
            .field("read_only", &self.io.read_only)
            .finish_non_exhaustive()
    }
}

fn io_err(what: impl Into<String>, e: &io::Error) -> Error {
    Error::io(what, e)
}

/// Creates `dir` and any missing parents, syncing each parent after a
/// child is created in it (so the new names survive a power cut).
fn create_dirs(fs: &dyn Fs, dir: &Path) -> Result<()> {
    if fs.is_dir(dir) {
        return Ok(());
    }
    let mut missing = Vec::new();
    let mut p = Some(dir);
    while let Some(d) = p.filter(|d| !d.as_os_str().is_empty()) {
        if fs.is_dir(d) {
            break;
        }
        missing.push(d.to_path_buf());
        p = d.parent();
    }
    for d in missing.iter().rev() {
        match fs.create_dir(d) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && fs.is_dir(d) => {}
            Err(e) => return Err(io_err(format!("creating directory {}", d.display()), &e)),
        }
        let parent = match d.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        fs.sync_dir(parent)
            .map_err(|e| io_err(format!("syncing directory {}", parent.display()), &e))?;
    }
    Ok(())
}

/// The flusher writes published entries behind into ledger files once this
/// many journal bytes are waiting, or this long after the last time.
const WRITE_BEHIND_BYTES: u64 = 8 << 20;
const WRITE_BEHIND_EVERY: Duration = Duration::from_millis(200);

/// Past this many files and directories to sync, a checkpoint syncs the
/// whole file system with one call instead.
const SYNCFS_THRESHOLD: usize = 64;

/// Creates `dir` and any missing parents without syncing (the caller syncs
/// their parents before relying on them); returns the ones created.
fn make_dirs(fs: &dyn Fs, dir: &Path) -> Result<Vec<PathBuf>> {
    let mut missing = Vec::new();
    let mut p = Some(dir);
    while let Some(d) = p.filter(|d| !d.as_os_str().is_empty()) {
        if fs.is_dir(d) {
            break;
        }
        missing.push(d.to_path_buf());
        p = d.parent();
    }
    missing.reverse();
    for d in &missing {
        match fs.create_dir(d) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && fs.is_dir(d) => {}
            Err(e) => return Err(io_err(format!("creating directory {}", d.display()), &e)),
        }
    }
    Ok(missing)
}

/// Ledger files in `<data_dir>/ledgers`, by escaped managed-ledger name.
fn list_ledger_files(fs: &dyn Fs, data_dir: &Path) -> Result<HashMap<String, Vec<(u64, bool)>>> {
    let dir = data_dir.join(LEDGERS_DIR);
    let names = match fs.read_dir(&dir) {
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(HashMap::new()),
        Err(e) => return Err(io_err(format!("listing {}", dir.display()), &e)),
    };
    let mut out: HashMap<String, Vec<(u64, bool)>> = HashMap::new();
    for n in &names {
        if let Some((ml, id, idx)) = n.to_str().and_then(ledger_file::parse_file_name) {
            out.entry(ml.to_owned()).or_default().push((id, idx));
        }
    }
    Ok(out)
}

/// Journal segments in `data_dir`, by base offset.
fn list_segments(fs: &dyn Fs, data_dir: &Path) -> Result<Vec<u64>> {
    let dir = data_dir.join(JOURNAL_DIR);
    let names = match fs.read_dir(&dir) {
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err(format!("listing {}", dir.display()), &e)),
    };
    let mut out: Vec<u64> = names
        .iter()
        .filter_map(|n| n.to_str().and_then(journal::parse_segment_name))
        .collect();
    out.sort_unstable();
    Ok(out)
}

/// Validates a data-directory argument before anything touches the disk.
fn check_data_dir(data_dir: &Path) -> Result<()> {
    if data_dir.as_os_str().is_empty() {
        return Err(Error::invalid("data directory must not be empty"));
    }
    if data_dir.to_str().is_some_and(|s| s.contains('\0')) {
        return Err(Error::invalid(format!(
            "data directory {data_dir:?} contains a NUL byte"
        )));
    }
    Ok(())
}

/// A journal segment: base offset and open file.
type Segment = (u64, Arc<dyn FsFile>);

/// Write-behind work for one ledger: first entry id, the entries' bodies
/// back to back, and each one's (length, checksum).
type Batch = (u64, Vec<u8>, Vec<(u32, u32)>);

/// What a journal scan from the checkpoint found.
struct TailScan {
    /// Journal offset just past the last valid record.
    end: u64,
    /// The segment holding `end` (if any segment exists).
    last: Option<Segment>,
}

impl Store {
    /// The store of `data_dir` for this process (opened if needed), with one
    /// more handle counted on it.
    pub fn acquire(data_dir: &Path, opts: &LedgerOptions) -> Result<Arc<Store>> {
        check_data_dir(data_dir)?;
        opts.validate()?;
        let fs = opts.fs.clone().unwrap_or_else(real_fs);
        if !opts.read_only {
            create_dirs(fs.as_ref(), data_dir)?;
        }
        loop {
            let path = fs.canonicalize(data_dir);
            let key: Key = (fs_id(&fs), path, opts.read_only);
            enum Next {
                Got(Arc<Store>),
                Wait(Arc<(Mutex<bool>, Condvar)>),
                Open,
            }
            let next = with_registry(|r| {
                if let Some(s) = r.open.get(&key) {
                    s.handles.fetch_add(1, Ordering::AcqRel);
                    return Next::Got(Arc::clone(s));
                }
                match r.closing.get(&key) {
                    Some(c) => Next::Wait(Arc::clone(c)),
                    None => Next::Open,
                }
            });
            match next {
                Next::Got(s) => {
                    if let Some(e) = opts.conflict_with(&s.opts) {
                        let _ = s.release();
                        return Err(e);
                    }
                    return Ok(s);
                }
                Next::Wait(c) => {
                    let (m, cv) = &*c;
                    let mut done = m.lock();
                    let deadline = Instant::now() + Duration::from_secs(120);
                    while !*done {
                        if cv.wait_until(&mut done, deadline).timed_out() {
                            return Err(Error::io(
                                format!(
                                    "waiting for data directory {} to close",
                                    data_dir.display()
                                ),
                                &io::Error::from(io::ErrorKind::TimedOut),
                            ));
                        }
                    }
                    continue;
                }
                Next::Open => {}
            }
            let store = Arc::new(if opts.read_only {
                Store::open_read_only(Arc::clone(&fs), data_dir, opts, key.clone())?
            } else {
                Store::open_writer(Arc::clone(&fs), data_dir, opts, key.clone())?
            });
            if !opts.read_only {
                if let Err(e) = store.start_flusher() {
                    let _ = store.shutdown();
                    return Err(e);
                }
            }
            // Another thread may have opened it meanwhile (read-only only:
            // the writer lock makes a second writer fail above).
            let raced = with_registry(|r| {
                if let Some(s) = r.open.get(&key) {
                    s.handles.fetch_add(1, Ordering::AcqRel);
                    return Some(Arc::clone(s));
                }
                store.handles.store(1, Ordering::Release);
                r.open.insert(key.clone(), Arc::clone(&store));
                None
            });
            if let Some(s) = raced {
                let _ = store.shutdown();
                return Ok(s);
            }
            return Ok(store);
        }
    }

    /// One handle fewer; the last one closes the store.
    pub fn release(self: &Arc<Self>) -> Result<()> {
        if self.generation != fork::generation() {
            return Ok(()); // a parent's store in a forked child: nothing runs
        }
        let last = with_registry(|r| {
            if self.handles.fetch_sub(1, Ordering::AcqRel) != 1 {
                return None;
            }
            r.open.remove(&self.key);
            let c = Arc::new((Mutex::new(false), Condvar::new()));
            r.closing.insert(self.key.clone(), Arc::clone(&c));
            Some(c)
        });
        let Some(c) = last else { return Ok(()) };
        let result = self.shutdown();
        with_registry(|r| {
            if r.closing.get(&self.key).is_some_and(|x| Arc::ptr_eq(x, &c)) {
                r.closing.remove(&self.key);
            }
        });
        *c.0.lock() = true;
        c.1.notify_all();
        result
    }

    fn new_io(fs: Arc<dyn Fs>, data_dir: &Path, opts: &LedgerOptions) -> Arc<StoreIo> {
        Arc::new(StoreIo {
            fs,
            data_dir: data_dir.to_path_buf(),
            read_only: opts.read_only,
            faults: opts
                .fault_injector
                .clone()
                .unwrap_or_else(|| Arc::new(FaultInjector::new())),
            segments: RwLock::new(BTreeMap::new()),
            files: Mutex::new(FileCache::new(opts.max_open_files / 2)),
            file_reads: AtomicU64::new(0),
            journal_reads: AtomicU64::new(0),
        })
    }

    fn bare(
        io: Arc<StoreIo>,
        opts: &LedgerOptions,
        key: Key,
        journal: Option<Arc<Journal>>,
        signals: Arc<Signals>,
    ) -> Store {
        Store {
            io,
            opts: opts.clone(),
            generation: fork::generation(),
            key,
            mls: RwLock::new(HashMap::new()),
            names: Mutex::new(HashMap::new()),
            next_ml_id: AtomicU64::new(1),
            journal,
            signals,
            tx: RwLock::new(None),
            threads: Mutex::new(Vec::new()),
            lock: Mutex::new(None),
            ckpt: Mutex::new(Checkpoint::default()),
            ro: Mutex::new((0, 0)),
            handles: AtomicUsize::new(0),
            closing: AtomicBool::new(false),
            serial: Mutex::new(()),
            listing: Mutex::new(HashMap::new()),
        }
    }

    fn rollover_default(opts: &LedgerOptions) -> Rollover {
        Rollover {
            max_entries: opts.max_entries_per_ledger,
            max_bytes: opts.max_bytes_per_ledger,
        }
    }

    /// Loads a catalog into fresh managed-ledger states.
    fn load_catalog(&self, cat: &Catalog) -> Result<()> {
        let mut mls = self.mls.write();
        let mut names = self.names.lock();
        let existing: HashMap<u64, Arc<MlState>> = mls.drain().collect();
        names.clear();
        for s in &cat.ledgers {
            let ml = match existing.get(&s.id) {
                Some(ml) if ml.name == s.name => Arc::clone(ml),
                _ => Arc::new(MlState::new(
                    s.id,
                    s.name.clone(),
                    catalog::ledger_prefix(&self.io.data_dir, &s.name)?,
                    Arc::clone(&self.io),
                    Self::rollover_default(&self.opts),
                )),
            };
            ml.load(s)?;
            if names.insert(s.name.clone(), s.id).is_some() || s.id >= cat.next_ml_id {
                return Err(Error::CorruptLedger {
                    path: self.io.data_dir.join(CATALOG_FILE).display().to_string(),
                    position: Position::default(),
                    offset: 0,
                    reason: format!(
                        "managed ledger {:?} listed twice or with a bad id {}",
                        s.name, s.id
                    ),
                });
            }
            mls.insert(s.id, ml);
        }
        // Managed ledgers gone from the catalog (deleted): mark their states.
        for (id, ml) in existing {
            if !mls.contains_key(&id) {
                ml.meta.lock().deleted = true;
                ml.ledgers.write().clear();
            }
        }
        self.next_ml_id.store(cat.next_ml_id, Ordering::Release);
        Ok(())
    }

    /// Applies one journal record during recovery or a read-only scan.
    fn replay_record(&self, seen: &journal::Seen<'_>) -> Result<Vec<(Arc<MlState>, u64)>> {
        let h = &seen.head;
        let bad = |reason: String| Error::CorruptLedger {
            path: journal::segment_path(&self.io.data_dir, 0)
                .parent()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            position: h.position(),
            offset: seen.at,
            reason,
        };
        match h.kind {
            Kind::MlCreate => {
                let name = std::str::from_utf8(seen.body)
                    .map_err(|_| bad("managed ledger name is not UTF-8".to_owned()))?
                    .to_owned();
                let mut mls = self.mls.write();
                if mls.contains_key(&h.ml) {
                    return Ok(Vec::new());
                }
                let mut names = self.names.lock();
                if let Some(old) = names.get(&name) {
                    return Err(bad(format!(
                        "managed ledger {name:?} created twice (ids {old} and {})",
                        h.ml
                    )));
                }
                let ml = Arc::new(MlState::new(
                    h.ml,
                    name.clone(),
                    catalog::ledger_prefix(&self.io.data_dir, &name)?,
                    Arc::clone(&self.io),
                    Self::rollover_default(&self.opts),
                ));
                names.insert(name, h.ml);
                mls.insert(h.ml, ml);
                self.next_ml_id.fetch_max(h.ml + 1, Ordering::AcqRel);
                Ok(Vec::new())
            }
            Kind::MlDelete => {
                let ml = self.mls.write().remove(&h.ml);
                let Some(ml) = ml else { return Ok(Vec::new()) };
                self.names.lock().remove(&ml.name);
                ml.meta.lock().deleted = true;
                let ids: Vec<u64> = std::mem::take(&mut *ml.ledgers.write())
                    .into_keys()
                    .collect();
                Ok(ids.into_iter().map(|id| (Arc::clone(&ml), id)).collect())
            }
            _ => {
                let ml = self.mls.read().get(&h.ml).cloned();
                let Some(ml) = ml else {
                    if h.ml < self.next_ml_id.load(Ordering::Acquire) {
                        return Ok(Vec::new()); // deleted since
                    }
                    return Err(bad(format!(
                        "record of managed ledger id {} that was never created",
                        h.ml
                    )));
                };
                let a = ml.apply(seen.at, h, seen.body)?;
                Ok(a.dropped
                    .into_iter()
                    .map(|id| (Arc::clone(&ml), id))
                    .collect())
            }
        }
    }

    /// Replays the journal from `from` (read-write: cutting a torn tail;
    /// read-only: up to `limit`). Returns where it ended.
    fn replay_journal(&self, from: u64, limit: Option<u64>, repair: bool) -> Result<TailScan> {
        let fs = &self.io.fs;
        let data = &self.io.data_dir;
        let bases = list_segments(fs.as_ref(), data)?;
        // The segment holding `from`, and every one after it.
        let start = bases.iter().rposition(|&b| b <= from);
        let todo: Vec<u64> = match start {
            Some(i) => bases[i..].to_vec(),
            None => bases.clone(),
        };
        if repair {
            // Segments wholly before the checkpoint are leftovers of a
            // checkpoint that did not finish removing them.
            for &b in bases.iter().take(start.unwrap_or(0)) {
                let p = journal::segment_path(data, b);
                fs.remove_file(&p)
                    .map_err(|e| io_err(format!("removing {}", p.display()), &e))?;
            }
        }
        let mut end = from;
        let mut last: Option<Segment> = None;
        let mut dropped = Vec::new();
        // Where the valid journal stops early: (damage, index in `todo` of
        // the first segment wholly after it, the damaged segment to cut).
        let mut damage: Option<(journal::Damage, usize, Option<Segment>)> = None;
        let mode = if repair {
            OpenMode::WRITE
        } else {
            OpenMode::READ
        };
        for (i, &base) in todo.iter().enumerate() {
            if limit.is_some_and(|l| base >= l) {
                break;
            }
            if base > end {
                let reason = format!("journal records {end}..{base} are missing");
                damage = Some((
                    journal::Damage {
                        at: end,
                        reason,
                        head: None,
                    },
                    i,
                    None,
                ));
                break;
            }
            let path = journal::segment_path(data, base);
            let file = fs
                .open(&path, mode)
                .map_err(|e| io_err(format!("opening journal file {}", path.display()), &e))?;
            if let Err(e) = journal::check_segment_header(file.as_ref(), &path, base) {
                // A segment whose creation a crash cut short.
                let d = journal::Damage {
                    at: base,
                    reason: e.to_string(),
                    head: None,
                };
                damage = Some((d, i + 1, None));
                // It goes with the torn tail (nothing was ever written to it).
                if repair {
                    fs.remove_file(&path)
                        .map_err(|e| io_err(format!("removing {}", path.display()), &e))?;
                }
                break;
            }
            let scan =
                journal::scan_segment(file.as_ref(), &path, base, end.max(base), limit, |seen| {
                    dropped.extend(self.replay_record(&seen)?);
                    Ok(())
                })?;
            end = scan.end;
            self.io.segments.write().insert(base, Arc::clone(&file));
            last = Some((base, Arc::clone(&file)));
            if let Some(d) = scan.damage {
                damage = Some((d, i + 1, Some((base, file))));
                break;
            }
        }
        if let Some((d, after, cut)) = damage {
            // The durable point: the largest lac of any valid record after
            // the damage, or the synced hint.
            let hint = fs
                .read_file(&journal::synced_path(data))
                .ok()
                .and_then(|b| journal::decode_synced(&b));
            let mut durable = hint.unwrap_or(0);
            if let Some((b, f)) = &cut {
                let p = journal::segment_path(data, *b);
                durable = durable.max(journal::max_lac_after(f.as_ref(), &p, *b, d.at)?);
            }
            for &later in &todo[after..] {
                let p = journal::segment_path(data, later);
                let Ok(f) = fs.open(&p, OpenMode::READ) else {
                    continue;
                };
                if journal::check_segment_header(f.as_ref(), &p, later).is_err() {
                    continue;
                }
                let s = journal::scan_segment(f.as_ref(), &p, later, later, None, |_| Ok(()))?;
                durable = durable.max(s.max_lac);
                if let Some(dd) = s.damage {
                    durable = durable.max(journal::max_lac_after(f.as_ref(), &p, later, dd.at)?);
                }
            }
            let (path, offset) = match &cut {
                Some((b, _)) => (
                    journal::segment_path(data, *b),
                    journal::SEGMENT_HEADER_LEN + (d.at - b),
                ),
                None => (data.join(JOURNAL_DIR), d.at),
            };
            if d.at < durable {
                let position = d.head.map(|h| h.position()).unwrap_or_default();
                return Err(journal::corrupt(
                    &path,
                    offset,
                    position,
                    format!(
                        "{} at journal offset {}, before the acknowledged point {durable}{}",
                        d.reason,
                        d.at,
                        d.head
                            .map(|h| format!(" (managed ledger id {}, {:?} record)", h.ml, h.kind))
                            .unwrap_or_default()
                    ),
                ));
            }
            if !repair {
                // A reader stops at the damage: the writer may be mid-write.
                return Ok(TailScan { end, last });
            }
            // A torn tail: nothing acknowledged is there. Cut it (durably)
            // and drop every later segment.
            if let Some((_, f)) = &cut {
                f.set_len(offset)
                    .and_then(|()| f.sync_data())
                    .map_err(|e| {
                        io_err(format!("cutting the torn tail of {}", path.display()), &e)
                    })?;
            }
            for &later in &todo[after..] {
                let p = journal::segment_path(data, later);
                match fs.remove_file(&p) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io_err(format!("removing {}", p.display()), &e)),
                }
            }
            let jdir = data.join(JOURNAL_DIR);
            fs.sync_dir(&jdir)
                .map_err(|e| io_err(format!("syncing {}", jdir.display()), &e))?;
        }
        if repair {
            self.signals.flush.lock().deletes.extend(dropped);
        }
        Ok(TailScan { end, last })
    }

    fn open_writer(
        fs: Arc<dyn Fs>,
        data_dir: &Path,
        opts: &LedgerOptions,
        key: Key,
    ) -> Result<Store> {
        create_dirs(fs.as_ref(), data_dir)?;
        let lock_path = data_dir.join(LOCK_FILE);
        let lock = fs.lock(&lock_path).map_err(|e| {
            io_err(
                format!(
                    "locking {} (is the data directory open for writing in another process?)",
                    lock_path.display()
                ),
                &e,
            )
        })?;
        let io = Self::new_io(Arc::clone(&fs), data_dir, opts);
        let signals = Arc::new(Signals::default());
        let mut store = Self::bare(Arc::clone(&io), opts, key, None, Arc::clone(&signals));
        *store.lock.lock() = Some(lock);
        let cat = match read_catalog(fs.as_ref(), data_dir)? {
            Some(c) => c,
            None => {
                // Only an empty directory may lack a catalog.
                let mut found = Vec::new();
                if !list_segments(fs.as_ref(), data_dir)?.is_empty() {
                    found.push(data_dir.join(JOURNAL_DIR).display().to_string());
                }
                let ldir = data_dir.join(LEDGERS_DIR);
                if fs.read_dir(&ldir).is_ok_and(|n| !n.is_empty()) {
                    found.push(ldir.display().to_string());
                }
                if !found.is_empty() {
                    return Err(Error::CorruptLedger {
                        path: data_dir.join(CATALOG_FILE).display().to_string(),
                        position: Position::default(),
                        offset: 0,
                        reason: format!(
                            "no CATALOG, but {} exist (nothing was removed)",
                            found.join(" and ")
                        ),
                    });
                }
                let c = Catalog {
                    format_version: CATALOG_FORMAT_VERSION,
                    checkpoint: 0,
                    next_ml_id: 1,
                    ledgers: Vec::new(),
                    sequence: 0,
                };
                create_dirs(fs.as_ref(), &data_dir.join(JOURNAL_DIR))?;
                write_catalog(fs.as_ref(), data_dir, &c)?;
                c
            }
        };
        create_dirs(fs.as_ref(), &data_dir.join(JOURNAL_DIR))?;
        *store.listing.lock() = list_ledger_files(fs.as_ref(), data_dir)?;
        store.load_catalog(&cat)?;
        let tail = store.replay_journal(cat.checkpoint, None, true)?;
        for ml in store.mls.read().values() {
            ml.finish_recovery()?;
        }
        // Names created just before a crash may not be durable yet: make
        // them so before anything new depends on them.
        for d in [data_dir.to_path_buf(), data_dir.join(JOURNAL_DIR)] {
            fs.sync_dir(&d)
                .map_err(|e| io_err(format!("syncing {}", d.display()), &e))?;
        }
        let hint = fs
            .open(&journal::synced_path(data_dir), OpenMode::CREATE)
            .map_err(|e| io_err("opening the journal's SYNCED hint", &e))?;
        let jopts = JournalOptions {
            sync_thread: opts.storage_threads >= 3,
            segment_bytes: opts.journal_segment_bytes,
            preallocate_bytes: opts.preallocate_bytes,
            max_batch_bytes: opts.max_batch_bytes,
        };
        let journal = Arc::new(Journal::new(
            Arc::clone(&io),
            jopts,
            tail.end,
            Arc::clone(&signals) as Arc<dyn Published>,
            hint,
        ));
        journal.write_hint(tail.end);
        let active = match tail.last {
            Some((base, file)) => Active::reopen(base, file, tail.end),
            None => group_commit::create_segment(&journal, tail.end)?,
        };
        {
            let mut c = store.ckpt.lock();
            c.at = cat.checkpoint;
            c.sequence = cat.sequence;
            c.copied = cat.checkpoint;
            c.when = Some(Instant::now());
        }
        store.journal = Some(Arc::clone(&journal));
        // The recovered tail is written behind like new entries.
        {
            let mut f = signals.flush.lock();
            for ml in store.mls.read().values() {
                if ml.ledgers.read().values().any(|l| !l.tail.is_empty()) {
                    f.dirty.insert(ml.id);
                }
            }
        }
        let (tx, rx) = crossbeam_channel::unbounded();
        let name = data_dir
            .file_name()
            .map(|n| n.to_string_lossy().chars().take(8).collect::<String>())
            .unwrap_or_default();
        let writer = WriterThread::spawn(journal, rx, active, &name)
            .map_err(|e| io_err("starting the journal threads", &e))?;
        *store.tx.write() = Some(tx);
        store.threads.lock().push(writer);
        Ok(store)
    }

    /// Starts the flusher (once the store is in an `Arc`).
    fn start_flusher(self: &Arc<Self>) -> Result<()> {
        let me = Arc::clone(self);
        let t = std::thread::Builder::new()
            .name("txs-flusher".into())
            .spawn(move || {
                group_commit::mark_storage_thread();
                me.flusher_loop()
            })
            .map_err(|e| io_err("starting the flusher thread", &e))?;
        self.threads.lock().push(t);
        Ok(())
    }

    fn open_read_only(
        fs: Arc<dyn Fs>,
        data_dir: &Path,
        opts: &LedgerOptions,
        key: Key,
    ) -> Result<Store> {
        let io = Self::new_io(Arc::clone(&fs), data_dir, opts);
        let store = Self::bare(io, opts, key, None, Arc::new(Signals::default()));
        store.refresh()?;
        Ok(store)
    }

    /// Read-only stores: picks up what the writer made durable since.
    pub fn refresh(&self) -> Result<()> {
        if !self.io.read_only {
            return Ok(());
        }
        let mut last_err = None;
        for _ in 0..40 {
            match self.refresh_once() {
                Ok(()) => return Ok(()),
                // A checkpoint may remove a segment between our catalog read
                // and its open. (Below the synced hint every record is
                // complete: damage there is real, reported at once.)
                Err(
                    e @ Error::Io {
                        errno: Some(libc::ENOENT),
                        ..
                    },
                ) => last_err = Some(e),
                Err(e) => return Err(e),
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Err(last_err.unwrap_or_else(|| Error::invalid("refresh failed")))
    }

    fn refresh_once(&self) -> Result<()> {
        let fs = &self.io.fs;
        let data = &self.io.data_dir;
        let mut ro = self.ro.lock();
        let cat = match read_catalog(fs.as_ref(), data)? {
            Some(c) => c,
            None => {
                return Err(Error::Io {
                    context: format!("opening data directory {} read-only", data.display()),
                    errno: Some(libc::ENOENT),
                    message: format!("no {CATALOG_FILE} in {}", data.display()),
                })
            }
        };
        let hint = fs
            .read_file(&journal::synced_path(data))
            .ok()
            .and_then(|b| journal::decode_synced(&b));
        let writer_alive = fs.is_locked(&data.join(LOCK_FILE)).unwrap_or(true);
        let limit = match hint {
            Some(h) => Some(h),
            // No live writer: everything valid is what recovery would keep.
            None if !writer_alive => None,
            None => {
                return Err(Error::Io {
                    context: format!("reading {}", journal::synced_path(data).display()),
                    errno: Some(libc::EAGAIN),
                    message: "the journal's synced-end hint is unreadable while a writer runs"
                        .to_owned(),
                })
            }
        };
        let (scanned, seq) = *ro;
        if cat.sequence == seq && scanned != 0 && scanned >= cat.checkpoint {
            let tail = self.replay_journal(scanned, limit, false)?;
            *ro = (tail.end, seq);
            return Ok(());
        }
        // A new checkpoint: load it and its journal tail on the side, then
        // swap each managed ledger's state in at once, so that a reader
        // never sees a log shorter than before (and old journal segments,
        // now in ledger files, are let go).
        let shadow_io = Arc::new(StoreIo {
            fs: Arc::clone(&self.io.fs),
            data_dir: self.io.data_dir.clone(),
            read_only: true,
            faults: Arc::clone(&self.io.faults),
            segments: RwLock::new(BTreeMap::new()),
            files: Mutex::new(FileCache::new(1)),
            file_reads: AtomicU64::new(0),
            journal_reads: AtomicU64::new(0),
        });
        let shadow = Self::bare(
            shadow_io,
            &self.opts,
            self.key.clone(),
            None,
            Arc::new(Signals::default()),
        );
        shadow.load_catalog(&cat)?;
        let tail = shadow.replay_journal(cat.checkpoint, limit, false)?;
        self.adopt(&shadow);
        *ro = (tail.end.max(cat.checkpoint), cat.sequence);
        Ok(())
    }

    /// Takes over the managed-ledger states and journal segments of
    /// `shadow` (a read-only reload), keeping the `MlState`s handles hold.
    fn adopt(&self, shadow: &Store) {
        let smls = shadow.mls.read();
        let mut mls = self.mls.write();
        let mut next: HashMap<u64, Arc<MlState>> = HashMap::new();
        for (&id, s) in smls.iter() {
            let live = match mls.get(&id) {
                Some(m) if m.name == s.name => Arc::clone(m),
                _ => Arc::new(MlState::new(
                    id,
                    s.name.clone(),
                    s.prefix.clone(),
                    Arc::clone(&self.io),
                    Self::rollover_default(&self.opts),
                )),
            };
            live.adopt(s);
            next.insert(id, live);
        }
        // Segments first: the new states point into them.
        *self.io.segments.write() = std::mem::take(&mut *shadow.io.segments.write());
        for (id, m) in mls.drain() {
            if !next.contains_key(&id) {
                m.meta.lock().deleted = true;
                m.ledgers.write().clear();
            }
        }
        *mls = next;
        *self.names.lock() = shadow.names.lock().clone();
        self.next_ml_id
            .store(shadow.next_ml_id.load(Ordering::Acquire), Ordering::Release);
    }

    // ------------------------------------------------------------- handles

    /// The managed ledger `name`, for a new handle (created if needed).
    pub fn open_ml(self: &Arc<Self>, name: &str, opts: &LedgerOptions) -> Result<Arc<MlState>> {
        self.check_live()?;
        let rollover = Self::rollover_default(opts);
        if self.io.read_only {
            let id = self.names.lock().get(name).copied();
            let ml = id.and_then(|id| self.mls.read().get(&id).cloned());
            return ml.ok_or_else(|| Error::Io {
                context: format!("opening managed ledger {name:?} read-only"),
                errno: Some(libc::ENOENT),
                message: format!(
                    "no managed ledger {name:?} in {}",
                    self.io.data_dir.display()
                ),
            });
        }
        let mut names = self.names.lock();
        if let Some(&id) = names.get(name) {
            let ml = self.mls.read().get(&id).cloned();
            // One whose creation failed is made again below, with a new id.
            if let Some(ml) = ml.filter(|ml| !ml.creation_failed()) {
                if ml.open.swap(true, Ordering::AcqRel) {
                    return Err(Error::io(
                        format!("opening managed ledger {name:?}"),
                        &io::Error::new(
                            io::ErrorKind::WouldBlock,
                            "it is already open for writing in this process",
                        ),
                    ));
                }
                *ml.rollover.lock() = rollover;
                if let Err(e) = self.check_files(&ml) {
                    ml.open.store(false, Ordering::Release);
                    return Err(e);
                }
                return Ok(ml);
            }
        }
        let dir = catalog::ledger_prefix(&self.io.data_dir, name)?;
        let id = self.next_ml_id.fetch_add(1, Ordering::AcqRel);
        let ml = Arc::new(MlState::new(
            id,
            name.to_owned(),
            dir,
            Arc::clone(&self.io),
            rollover,
        ));
        self.check_files(&ml)?;
        // Registered before its creation record is durable, so that a
        // concurrent open of the same name sees it (and refuses a second
        // writer); waited for without holding the name lock, so that
        // concurrent creations share syncs. If the record fails, the writer
        // fails every later command of this ledger (see `MlState::created`)
        // and it is unregistered here.
        ml.mark_creating();
        ml.open.store(true, Ordering::Release);
        names.insert(name.to_owned(), id);
        self.mls.write().insert(id, Arc::clone(&ml));
        drop(names);
        let created = self.submit_wait(Command::Meta {
            ml: Arc::clone(&ml),
            op: MetaOp::Create,
            done: Done::Nothing,
        });
        if let Err(e) = created {
            let mut names = self.names.lock();
            if names.get(name) == Some(&id) {
                names.remove(name);
            }
            self.mls.write().remove(&id);
            ml.open.store(false, Ordering::Release);
            return Err(e);
        }
        Ok(ml)
    }

    /// Checks `ml`'s files against its state, once per store: removes
    /// provable leftovers (ledgers trimmed before the catalog said so),
    /// refuses files the catalog cannot explain that may hold data (an older
    /// CATALOG restored over newer files), and reports listed files that are
    /// missing.
    fn check_files(&self, ml: &MlState) -> Result<()> {
        if ml.checked.load(Ordering::Acquire) {
            return Ok(());
        }
        let fs = &self.io.fs;
        let escaped = catalog::escape_name(&ml.name)?;
        let files = self
            .listing
            .lock()
            .get(&escaped)
            .cloned()
            .unwrap_or_default();
        let ledgers = ml.ledgers.read();
        let next = ml.meta.lock().next_ledger_id;
        let lowest = ledgers.keys().next().copied().unwrap_or(next);
        let mut unexplained = Vec::new();
        let mut leftovers = Vec::new();
        for &(id, is_idx) in &files {
            if ledgers.contains_key(&id) {
                continue;
            }
            let path = if is_idx {
                ledger_file::idx_path(&ml.prefix, id)
            } else {
                ledger_file::log_path(&ml.prefix, id)
            };
            if id >= next {
                unexplained.push(path.display().to_string());
            } else if id < lowest {
                leftovers.push(path);
            }
        }
        if !unexplained.is_empty() {
            return Err(Error::CorruptLedger {
                path: ml.prefix.display().to_string(),
                position: Position::new(next, 0),
                offset: 0,
                reason: format!(
                    "ledger files newer than the catalog ({}): refusing to open, nothing was removed \
                     (was an older CATALOG restored?)",
                    unexplained.join(", ")
                ),
            });
        }
        for (&id, l) in ledgers.iter() {
            if l.file_entries == 0 {
                continue;
            }
            for is_idx in [false, true] {
                if !files.contains(&(id, is_idx)) {
                    let p = if is_idx {
                        ledger_file::idx_path(&ml.prefix, id)
                    } else {
                        ledger_file::log_path(&ml.prefix, id)
                    };
                    return Err(ledger_file::corrupt(
                        &p,
                        id,
                        0,
                        0,
                        format!(
                            "missing: the catalog lists {} entries in it",
                            l.file_entries
                        ),
                    ));
                }
            }
        }
        drop(ledgers);
        for path in leftovers {
            fs.remove_file(&path)
                .map_err(|e| io_err(format!("removing {}", path.display()), &e))?;
        }
        ml.checked.store(true, Ordering::Release);
        Ok(())
    }

    /// A handle on `ml` closes.
    pub fn close_ml(&self, ml: &Arc<MlState>) -> Result<()> {
        if self.io.read_only {
            return Ok(());
        }
        // Cursor states are made durable before close returns; the seal
        // need not be waited for (recovery seals an open ledger at its
        // durable end just the same, and the journal keeps it ahead of any
        // later append).
        let has_cursors = !ml.cursors.lock().is_empty();
        let r = if has_cursors {
            self.persist_cursors(ml, true)
        } else {
            Ok(())
        };
        let r = r.and(self.submit(Command::Meta {
            ml: Arc::clone(ml),
            op: MetaOp::Seal,
            done: Done::Nothing,
        }));
        ml.open.store(false, Ordering::Release);
        r
    }

    /// Journals `ml`'s cursor states and trims the ledgers every cursor has
    /// passed; with `wait`, returns once that is durable.
    pub fn persist_cursors(&self, ml: &Arc<MlState>, wait: bool) -> Result<()> {
        if self.io.read_only {
            return Ok(());
        }
        ml.cursors_dirty.store(false, Ordering::Release);
        let states: Vec<Vec<u8>> = ml
            .cursors
            .lock()
            .iter()
            .map(|(n, c)| c.data.lock().to_proto(n).encode_to_vec())
            .collect();
        let trim = ml.trimmable();
        let mut cmds: Vec<Command> = Vec::new();
        let n = states.len() + usize::from(!trim.is_empty());
        let (tx, rx) = crossbeam_channel::bounded(n.max(1));
        let mk_done = |tx: &Sender<Result<Vec<Position>>>| {
            if wait {
                Done::Waiter(tx.clone())
            } else {
                let ml = Arc::clone(ml);
                Done::Batch(Box::new(move |r| {
                    if r.is_err() {
                        // Try again with the next flush.
                        ml.cursors_dirty.store(true, Ordering::Release);
                    }
                }))
            }
        };
        for s in states {
            cmds.push(Command::Meta {
                ml: Arc::clone(ml),
                op: MetaOp::Cursor(s),
                done: mk_done(&tx),
            });
        }
        if !trim.is_empty() {
            cmds.push(Command::Meta {
                ml: Arc::clone(ml),
                op: MetaOp::Trim(trim),
                done: mk_done(&tx),
            });
        }
        let count = cmds.len();
        for c in cmds {
            self.submit(c)?;
        }
        if wait {
            for _ in 0..count {
                match rx.recv() {
                    Ok(r) => {
                        if let Err(e) = r {
                            ml.cursors_dirty.store(true, Ordering::Release);
                            return Err(e);
                        }
                    }
                    Err(_) => return Err(Error::LedgerClosed(ml.name.clone())),
                }
            }
        }
        Ok(())
    }

    /// A cursor of `ml` changed: the flusher journals it soon.
    pub fn cursor_changed(&self, ml: &MlState) {
        if !ml.cursors_dirty.swap(true, Ordering::AcqRel) {
            let mut f = self.signals.flush.lock();
            if !f.cursors {
                f.cursors = true;
                self.signals.flush_cv.notify_one();
            }
        }
    }

    /// Names of every managed ledger (sorted).
    pub fn ml_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.names.lock().keys().cloned().collect();
        v.sort();
        v
    }

    /// Adds a new cursor durably.
    pub fn create_cursor(&self, ml: &Arc<MlState>, inner: &CursorInner) -> Result<()> {
        if self.io.read_only {
            return Ok(());
        }
        let state = inner.data.lock().to_proto(&inner.name).encode_to_vec();
        self.submit_wait(Command::Meta {
            ml: Arc::clone(ml),
            op: MetaOp::Cursor(state),
            done: Done::Nothing,
        })
        .map(|_| ())
    }

    /// Removes a cursor durably.
    pub fn delete_cursor(&self, ml: &Arc<MlState>, name: &str) -> Result<()> {
        self.submit_wait(Command::Meta {
            ml: Arc::clone(ml),
            op: MetaOp::CursorDelete(name.to_owned()),
            done: Done::Nothing,
        })
        .map(|_| ())
    }

    /// Removes `ml` with all its ledgers and cursors (durably); its files go
    /// with the next checkpoint. The caller's handle is its only one.
    pub fn delete_ml(&self, ml: &Arc<MlState>) -> Result<()> {
        let mut names = self.names.lock();
        self.submit_wait(Command::Meta {
            ml: Arc::clone(ml),
            op: MetaOp::Delete,
            done: Done::Nothing,
        })?;
        names.remove(&ml.name);
        self.mls.write().remove(&ml.id);
        ml.meta.lock().deleted = true;
        ml.open.store(false, Ordering::Release);
        let ids: Vec<u64> = std::mem::take(&mut *ml.ledgers.write())
            .into_keys()
            .collect();
        self.io.files.lock().evict_ml(ml.id);
        let mut f = self.signals.flush.lock();
        f.dirty.remove(&ml.id);
        f.deletes
            .extend(ids.into_iter().map(|id| (Arc::clone(ml), id)));
        Ok(())
    }

    /// Marks `ml` a compacted topic durably.
    pub fn set_compacted(&self, ml: &Arc<MlState>) -> Result<()> {
        self.submit_wait(Command::Meta {
            ml: Arc::clone(ml),
            op: MetaOp::SetCompacted,
            done: Done::Nothing,
        })
        .map(|_| ())
    }

    // ------------------------------------------------------------- submit

    pub fn check_live(&self) -> Result<()> {
        if self.generation != fork::generation() {
            return Err(Error::LedgerClosed(format!(
                "in data directory {} (opened before fork(): open it again in this process)",
                self.io.data_dir.display()
            )));
        }
        Ok(())
    }

    /// Waits for queue space for `bytes` (never on a storage thread).
    fn admit(&self, bytes: u64) -> Result<()> {
        let mut p = self.signals.pending.lock();
        if bytes > 0 && !group_commit::on_storage_thread() {
            let limit = self.opts.max_pending_bytes;
            let deadline = Instant::now() + self.opts.append_timeout;
            while *p > 0 && *p + bytes > limit {
                if self
                    .signals
                    .pending_cv
                    .wait_until(&mut p, deadline)
                    .timed_out()
                {
                    return Err(Error::Io {
                        context: format!(
                            "waiting {:?} for journal queue space ({} bytes pending, limit {limit})",
                            self.opts.append_timeout, *p
                        ),
                        errno: Some(libc::EAGAIN),
                        message: "the storage is not keeping up (backpressure)".to_owned(),
                    });
                }
            }
        }
        *p += bytes;
        Ok(())
    }

    /// Queues a command for the journal (failing it if the store is closed).
    pub fn submit(&self, cmd: Command) -> Result<()> {
        if let Err(e) = self.check_live() {
            cmd.fail(&e);
            return Err(e);
        }
        let bytes = match &cmd {
            Command::Append { bytes, .. } | Command::Replace { bytes, .. } => *bytes,
            _ => 0,
        };
        if let Err(e) = self.admit(bytes) {
            cmd.fail(&e);
            return Err(e);
        }
        let tx = self.tx.read();
        let cmd = match tx.as_ref() {
            Some(tx) if !self.closing.load(Ordering::Acquire) => match tx.send(cmd) {
                Ok(()) => return Ok(()),
                Err(e) => e.0,
            },
            _ => cmd,
        };
        drop(tx);
        self.signals.released(bytes);
        let e = Error::LedgerClosed(format!("in data directory {}", self.io.data_dir.display()));
        cmd.fail(&e);
        Err(e)
    }

    /// Queues a command and waits until it is durable.
    pub fn submit_wait(&self, cmd: Command) -> Result<Vec<Position>> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let cmd = match cmd {
            Command::Append {
                ml, entries, bytes, ..
            } => Command::Append {
                ml,
                entries,
                bytes,
                done: Done::Waiter(tx),
            },
            Command::Replace {
                ml, entries, bytes, ..
            } => Command::Replace {
                ml,
                entries,
                bytes,
                done: Done::Waiter(tx),
            },
            Command::Meta { ml, op, .. } => Command::Meta {
                ml,
                op,
                done: Done::Waiter(tx),
            },
            Command::Barrier { .. } => Command::Barrier {
                done: Done::Waiter(tx),
            },
            Command::Close { .. } => return Err(Error::invalid("cannot wait on a close command")),
        };
        if self.submit(cmd).is_err() {
            // The command was failed with the error: report it.
        }
        rx.recv().unwrap_or_else(|_| {
            Err(Error::LedgerClosed(format!(
                "in data directory {}",
                self.io.data_dir.display()
            )))
        })
    }

    /// Waits until everything queued so far is durable.
    pub fn barrier(&self) -> Result<()> {
        self.submit_wait(Command::Barrier {
            done: Done::Nothing,
        })
        .map(|_| ())
    }

    // ------------------------------------------------------------- flusher

    fn flusher_loop(&self) {
        let tick = self
            .opts
            .cursor_flush_interval
            .max(Duration::from_millis(1));
        let mut last_cursor_flush = Instant::now();
        let mut last_copy = Instant::now();
        loop {
            let (stop, cursors, dirty, want_ckpt) = {
                let mut f = self.signals.flush.lock();
                let wait = if f.cursors {
                    tick
                } else {
                    WRITE_BEHIND_EVERY.min(tick.max(Duration::from_millis(50)))
                };
                if !f.stop && !f.checkpoint_wanted {
                    self.signals.flush_cv.wait_for(&mut f, wait);
                }
                let cursors = f.cursors && last_cursor_flush.elapsed() >= tick;
                if cursors {
                    f.cursors = false;
                }
                (
                    f.stop,
                    cursors,
                    !f.dirty.is_empty(),
                    std::mem::take(&mut f.checkpoint_wanted),
                )
            };
            if stop {
                return;
            }
            if cursors {
                last_cursor_flush = Instant::now();
                let mls: Vec<Arc<MlState>> = self.mls.read().values().cloned().collect();
                for ml in mls {
                    if ml.cursors_dirty.load(Ordering::Acquire) {
                        let _ = self.persist_cursors(&ml, false);
                    }
                }
            }
            let (due, behind) = {
                let c = self.ckpt.lock();
                let synced = self
                    .journal
                    .as_ref()
                    .map_or(0, |j| j.synced.load(Ordering::Acquire));
                let grown = synced.saturating_sub(c.at);
                let due = grown >= self.opts.checkpoint_bytes
                    || (grown > 0
                        && c.when
                            .is_some_and(|w| w.elapsed() >= self.opts.checkpoint_interval));
                (due, synced.saturating_sub(c.copied))
            };
            // Write-behind in batches: every ledger written then gets many
            // entries per write, whatever the number of ledgers.
            let copy = dirty
                && (behind >= WRITE_BEHIND_BYTES || last_copy.elapsed() >= WRITE_BEHIND_EVERY);
            let r = {
                let _g = self.serial.lock();
                if due || want_ckpt {
                    last_copy = Instant::now();
                    self.checkpoint(false)
                } else if copy {
                    last_copy = Instant::now();
                    self.copy_behind()
                } else {
                    Ok(())
                }
            };
            if let Err(e) = r {
                let mut c = self.ckpt.lock();
                c.errors += 1;
                c.last_error = Some(e.to_string());
                drop(c);
                // Back off; the work is retried.
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// Writes every published entry still only in the journal into its
    /// ledger's files (no sync: the next checkpoint syncs them).
    fn copy_behind(&self) -> Result<()> {
        let Some(j) = &self.journal else {
            return Ok(());
        };
        let upto = j.synced.load(Ordering::Acquire);
        let dirty: Vec<u64> = std::mem::take(&mut self.signals.flush.lock().dirty)
            .into_iter()
            .collect();
        let from = self.ckpt.lock().copied;
        if from >= upto {
            return Ok(());
        }
        let result = self.copy_range(from, upto);
        match &result {
            Ok(()) => self.ckpt.lock().copied = upto,
            Err(_) => self.signals.flush.lock().dirty.extend(dirty),
        }
        result
    }

    fn copy_range(&self, from: u64, upto: u64) -> Result<()> {
        let mut batches: BTreeMap<(u64, u64), Batch> = BTreeMap::new();
        let mut held = 0usize;
        let segments: Vec<(u64, Arc<dyn FsFile>)> = self
            .io
            .segments
            .read()
            .iter()
            .map(|(b, f)| (*b, Arc::clone(f)))
            .collect();
        let start = segments.iter().rposition(|(b, _)| *b <= from).unwrap_or(0);
        for (base, file) in &segments[start..] {
            if *base >= upto {
                break;
            }
            let path = journal::segment_path(&self.io.data_dir, *base);
            let scan = journal::scan_segment(
                file.as_ref(),
                &path,
                *base,
                from.max(*base),
                Some(upto),
                |seen| {
                    if seen.head.kind != Kind::Entry {
                        return Ok(());
                    }
                    let b = batches
                        .entry((seen.head.ml, seen.head.a))
                        .or_insert_with(|| (seen.head.b, Vec::new(), Vec::new()));
                    if b.0 + b.2.len() as u64 != seen.head.b {
                        return Err(journal::corrupt(
                            &path,
                            seen.at,
                            seen.head.position(),
                            "entries out of order in the journal",
                        ));
                    }
                    b.1.extend_from_slice(seen.body);
                    b.2.push((seen.head.body_len, seen.head.body_crc));
                    held += seen.body.len();
                    Ok(())
                },
            )?;
            if let Some(d) = scan.damage {
                if d.at < upto {
                    return Err(journal::corrupt(
                        &path,
                        d.at,
                        Position::default(),
                        format!("{} in a synced journal range", d.reason),
                    ));
                }
            }
            if held > 16 << 20 {
                self.write_batches(std::mem::take(&mut batches))?;
                held = 0;
            }
        }
        self.write_batches(batches)
    }

    fn write_batches(&self, batches: BTreeMap<(u64, u64), Batch>) -> Result<()> {
        for ((ml_id, ledger), (first, bodies, lens)) in batches {
            let Some(ml) = self.mls.read().get(&ml_id).cloned() else {
                continue;
            };
            let (skip, file_bytes, fresh) = {
                let ledgers = ml.ledgers.read();
                let Some(l) = ledgers.get(&ledger) else {
                    continue;
                };
                if l.file_entries < first {
                    return Err(Error::invalid(format!(
                        "write-behind of {}:{ledger} would leave a gap ({} in files, next {first})",
                        ml.name, l.file_entries
                    )));
                }
                (
                    (l.file_entries - first) as usize,
                    l.file_bytes,
                    l.file_entries == 0,
                )
            };
            if skip >= lens.len() {
                continue;
            }
            let mut off = 0usize;
            let mut records: Vec<(&[u8], u32)> = Vec::with_capacity(lens.len());
            for &(len, crc) in &lens {
                records.push((&bodies[off..off + len as usize], crc));
                off += len as usize;
            }
            let records = &records[skip..];
            if fresh {
                // New names in `ledgers/` (maybe the directory itself): made
                // durable by the checkpoint before a catalog refers to them.
                let ldir = self.io.data_dir.join(LEDGERS_DIR);
                let created = make_dirs(self.io.fs.as_ref(), &ldir)?;
                let mut c = self.ckpt.lock();
                c.dirs.insert(ldir);
                if !created.is_empty() {
                    c.dirs.insert(self.io.data_dir.clone());
                }
            }
            let how = if fresh {
                FileOpen::Fresh
            } else {
                FileOpen::Create
            };
            let h = self.io.ledger_files(&ml, ledger, how)?;
            let first_new = first + skip as u64;
            let end = ledger_file::append(&h.files(ledger), first_new, file_bytes, records)?;
            self.ckpt.lock().unsynced.insert((ml_id, ledger));
            let mut ledgers = ml.ledgers.write();
            if let Some(l) = ledgers.get_mut(&ledger) {
                if l.file_entries == first_new {
                    let n = records.len().min(l.tail.len());
                    l.file_entries += n as u64;
                    l.file_bytes = end;
                    l.tail.drain(..n);
                    self.ckpt.lock().copied_entries += n as u64;
                }
            }
        }
        Ok(())
    }

    /// Makes everything published durable in ledger files and the catalog,
    /// then removes what no longer needs to exist. `closing`: the journal
    /// is stopped; remove all of it.
    fn checkpoint(&self, closing: bool) -> Result<()> {
        let Some(j) = &self.journal else {
            return Ok(());
        };
        let at = j.synced.load(Ordering::Acquire);
        let from = self.ckpt.lock().copied;
        if from < at {
            self.copy_range(from, at)?;
            self.ckpt.lock().copied = at;
        }
        let deletes = std::mem::take(&mut self.signals.flush.lock().deletes);
        let (unsynced, dirs) = {
            let mut c = self.ckpt.lock();
            (std::mem::take(&mut c.unsynced), std::mem::take(&mut c.dirs))
        };
        let sync_result = if unsynced.len() + dirs.len() > SYNCFS_THRESHOLD {
            // Thousands of files and directories: one syncfs beats
            // thousands of fsyncs.
            self.io.fs.sync_filesystem(&self.io.data_dir).map_err(|e| {
                io_err(
                    format!("syncing the file system of {}", self.io.data_dir.display()),
                    &e,
                )
            })
        } else {
            self.sync_each(&unsynced, &dirs)
        };
        if let Err(e) = sync_result {
            let mut c = self.ckpt.lock();
            c.unsynced.extend(unsynced);
            c.dirs.extend(dirs);
            drop(c);
            self.signals.flush.lock().deletes.extend(deletes);
            return Err(e);
        }
        let sequence = self.ckpt.lock().sequence + 1;
        let cat = Catalog {
            format_version: CATALOG_FORMAT_VERSION,
            checkpoint: at,
            next_ml_id: self.next_ml_id.load(Ordering::Acquire),
            ledgers: {
                let mls = self.mls.read();
                let mut v: Vec<ManagedLedgerState> = mls
                    .values()
                    .filter(|ml| !ml.meta.lock().deleted)
                    .map(|ml| ml.snapshot())
                    .collect();
                v.sort_by_key(|s| s.id);
                v
            },
            sequence,
        };
        let written = self
            .io
            .faults
            .check(FaultKind::Meta)
            .map_err(|e| {
                io_err(
                    format!("writing {}", self.io.data_dir.join(CATALOG_FILE).display()),
                    &e,
                )
            })
            .and_then(|()| write_catalog(self.io.fs.as_ref(), &self.io.data_dir, &cat));
        if let Err(e) = written {
            self.signals.flush.lock().deletes.extend(deletes);
            return Err(e);
        }
        {
            let mut c = self.ckpt.lock();
            c.at = at;
            c.sequence = sequence;
            c.when = Some(Instant::now());
            c.count += 1;
        }
        // Journal segments wholly before the checkpoint.
        let bases: Vec<u64> = self.io.segments.read().keys().copied().collect();
        for (i, &b) in bases.iter().enumerate() {
            let next = bases.get(i + 1).copied();
            let gone = match next {
                Some(n) => n <= at,
                None => closing,
            };
            if gone {
                self.io.segments.write().remove(&b);
                let p = journal::segment_path(&self.io.data_dir, b);
                let _ = self.io.fs.remove_file(&p);
            }
        }
        // Ledger files no catalog lists any more (a failure leaves a
        // leftover that the next open removes).
        for (ml, id) in deletes {
            self.io.files.lock().evict((ml.id, id));
            let _ = self
                .io
                .fs
                .remove_file(&ledger_file::log_path(&ml.prefix, id));
            let _ = self
                .io
                .fs
                .remove_file(&ledger_file::idx_path(&ml.prefix, id));
        }
        Ok(())
    }

    /// True if ledger files wait for a checkpoint to be removed.
    pub fn has_pending_deletes(&self) -> bool {
        !self.signals.flush.lock().deletes.is_empty()
    }

    /// Syncs the given ledger files, then the given directories.
    fn sync_each(&self, files: &HashSet<(u64, u64)>, dirs: &BTreeSet<PathBuf>) -> Result<()> {
        for &(ml_id, ledger) in files {
            let Some(ml) = self.mls.read().get(&ml_id).cloned() else {
                continue;
            };
            if !ml.ledgers.read().contains_key(&ledger) {
                continue;
            }
            let h = self.io.ledger_files(&ml, ledger, FileOpen::Existing)?;
            h.log
                .sync_data()
                .and_then(|()| h.idx.sync_data())
                .map_err(|e| io_err(format!("syncing {}", h.log_path.display()), &e))?;
        }
        for d in dirs {
            self.io
                .fs
                .sync_dir(d)
                .map_err(|e| io_err(format!("syncing {}", d.display()), &e))?;
        }
        Ok(())
    }

    /// Runs a checkpoint now (and waits for it).
    pub fn checkpoint_now(&self) -> Result<()> {
        self.check_live()?;
        if self.io.read_only {
            return Ok(());
        }
        self.barrier()?;
        // Done on the caller's thread, serialised with the flusher's.
        let _g = self.serial.lock();
        self.checkpoint(false)
    }

    /// Closes the store: journals cursor states, drains the journal, stops
    /// the threads, checkpoints everything and releases the lock.
    fn shutdown(&self) -> Result<()> {
        if self.io.read_only {
            self.io.segments.write().clear();
            return Ok(());
        }
        let mut result = Ok(());
        let mls: Vec<Arc<MlState>> = self.mls.read().values().cloned().collect();
        for ml in &mls {
            if ml.cursors_dirty.load(Ordering::Acquire) {
                if let Err(e) = self.persist_cursors(ml, true) {
                    result = result.and(Err(e));
                }
            }
        }
        self.closing.store(true, Ordering::Release);
        let tx = self.tx.write().take();
        if let Some(tx) = tx {
            let (dtx, drx) = crossbeam_channel::bounded(1);
            if tx.send(Command::Close { done: dtx }).is_ok() {
                if let Ok(Err(e)) = drx.recv() {
                    result = result.and(Err(e));
                }
            }
        }
        self.signals.flush.lock().stop = true;
        self.signals.flush_cv.notify_all();
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
        let r = {
            let _g = self.serial.lock();
            self.checkpoint(true)
        };
        result = result.and(r);
        self.io.segments.write().clear();
        *self.io.files.lock() = FileCache::new(1);
        self.lock.lock().take();
        result
    }

    // ------------------------------------------------------------- stats

    /// Counters of this data directory's storage.
    pub fn stats(&self) -> Vec<(&'static str, u64)> {
        let mut out = self.io.fs.stats().snapshot();
        if let Some(j) = &self.journal {
            out.push(("journal_syncs", j.syncs.load(Ordering::Relaxed)));
            out.push(("journal_groups", j.groups.load(Ordering::Relaxed)));
            out.push(("journal_synced_end", j.synced.load(Ordering::Relaxed)));
        }
        let c = self.ckpt.lock();
        out.push(("checkpoints", c.count));
        out.push(("checkpoint_at", c.at));
        out.push(("checkpoint_errors", c.errors));
        out.push(("entries_written_behind", c.copied_entries));
        drop(c);
        out.push(("managed_ledgers", self.mls.read().len() as u64));
        out.push((
            "open_ledger_files",
            self.io.files.lock().descriptors() as u64,
        ));
        out.push(("journal_segments", self.io.segments.read().len() as u64));
        out.push((
            "entry_reads_from_files",
            self.io.file_reads.load(Ordering::Relaxed),
        ));
        out.push((
            "entry_reads_from_journal",
            self.io.journal_reads.load(Ordering::Relaxed),
        ));
        out.push(("pending_bytes", *self.signals.pending.lock()));
        out
    }

    /// The last background failure, if any (retried meanwhile).
    pub fn last_error(&self) -> Option<String> {
        self.ckpt.lock().last_error.clone()
    }
}
