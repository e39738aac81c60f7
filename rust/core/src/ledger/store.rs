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
//! checkpoint for all the ledgers it touched). Large entries (from
//! `direct_entry_bytes`) skip the second write altogether: the journal
//! writer puts their record straight into the ledger file and journals a
//! reference, both synced in the same group.
//!
//! # Threads (fixed per data directory, whatever the number of ledgers)
//!
//! - journal writer and journal sync (`group_commit`);
//! - the flusher: writes published entries behind into ledger files, journals
//!   dirty cursor states and trims, and checkpoints: syncs the ledger files
//!   written since the last checkpoint, writes the CATALOG (checkpoint = the
//!   journal offset everything before which is now in files or in the
//!   catalog) and removes journal segments and ledger files no longer needed.
//!
//! # Recovery
//!
//! Load the catalog, replay the journal from its checkpoint
//! (`MlState::apply`), with the acknowledged-point rule of
//! [`super::journal`] for damage; open costs the catalog plus the journal
//! tail, never the bytes in sealed ledgers (they are verified on read).
//!
//! The flusher is in `flusher`, recovery in `recovery`.
//!
//! # Registry and fork
//!
//! One store per (file system, directory, mode) per process, found through a
//! registry and shared by every handle; it closes when the last handle does.
//! After `fork()` the child starts with an empty registry; stores of the
//! parent fail fast there (see [`crate::fork`]).

use super::catalog::{self, read_catalog, write_catalog, CATALOG_FILE, CATALOG_FORMAT_VERSION};
use super::cursor::CursorInner;
use super::fault::FaultInjector;
use super::flusher::Signals;
use super::fs::{Fs, LockGuard, OpenMode, RealFs};
use super::group_commit::{
    self, Active, Command, Done, Journal, JournalOptions, MetaOp, Published, WriterThread,
};
use super::journal::{self, JOURNAL_DIR};
use super::ledger_file;
use super::options::LedgerOptions;
use super::recovery::list_segments;
use super::state::{FileCache, MlState, Rollover, StoreIo, FIRST_LEDGER_ID};
use crate::error::{Error, Result};
use crate::fork;
use crate::position::Position;
use crate::proto::Catalog;
use crate::sync::{Condvar, Mutex, RwLock};
use crossbeam_channel::Sender;
use prost::Message;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io;
use std::panic::AssertUnwindSafe;
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

// ------------------------------------------------------------------ the store

#[derive(Debug, Default)]
pub(super) struct Checkpoint {
    /// Journal offset of the last durable catalog.
    pub(super) at: u64,
    pub(super) sequence: u64,
    /// Journal offset up to which entries are written behind.
    pub(super) copied: u64,
    /// Ledger files written since the last checkpoint (to sync).
    pub(super) unsynced: HashSet<(u64, u64)>,
    /// Directories with names created since the last checkpoint (to sync).
    pub(super) dirs: BTreeSet<PathBuf>,
    pub(super) when: Option<Instant>,
    /// Failures of background work (reported by stats, retried).
    pub(super) errors: u64,
    pub(super) last_error: Option<String>,
    pub(super) count: u64,
    pub(super) copied_entries: u64,
    /// A ledger-file sync failed: the pages written since may be gone
    /// while a retried sync would report success (Linux drops failed dirty
    /// pages), so no checkpoint may advance in this process any more; the
    /// journal keeps everything after the last good checkpoint and the next
    /// open copies it again.
    pub(super) sync_failed: Option<Error>,
}

/// The storage engine of one data directory (see the module docs).
pub(crate) struct Store {
    pub io: Arc<StoreIo>,
    pub opts: LedgerOptions,
    pub generation: u64,
    pub(super) key: Key,
    pub(super) mls: RwLock<HashMap<u64, Arc<MlState>>>,
    pub(super) names: Mutex<HashMap<String, u64>>,
    pub(super) next_ml_id: AtomicU64,
    pub(super) journal: Option<Arc<Journal>>,
    pub(super) signals: Arc<Signals>,
    pub(super) tx: RwLock<Option<Sender<Command>>>,
    pub(super) threads: Mutex<Vec<JoinHandle<()>>>,
    pub(super) lock: Mutex<Option<LockGuard>>,
    pub(super) ckpt: Mutex<Checkpoint>,
    /// Read-only: journal offset scanned through, catalog sequence loaded.
    pub(super) ro: Mutex<(u64, u64)>,
    pub(super) handles: AtomicUsize,
    pub(super) closing: AtomicBool,
    /// Serialises checkpoints and write-behind (flusher, close, callers).
    pub(super) serial: Mutex<()>,
    /// Ledger files found at open, by escaped managed-ledger name: (ledger
    /// id, is index). Checked against each managed ledger's state when it
    /// is first opened.
    pub(super) listing: Mutex<HashMap<String, Vec<(u64, bool)>>>,
    /// Names of managed ledgers deleted in this session: the lowest ledger
    /// id none of them used. A managed ledger created again under such a
    /// name starts there (its files must never take the names of files a
    /// checkpoint is about to remove, or whose unsynced removal a power cut
    /// may undo). Kept for the session: one entry per deleted name.
    pub(super) retired: Mutex<HashMap<String, u64>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("dir", &self.io.data_dir)
            .field("read_only", &self.io.read_only)
            .finish_non_exhaustive()
    }
}

pub(super) fn io_err(what: impl Into<String>, e: &io::Error) -> Error {
    Error::io(what, e)
}

/// Creates `dir` and any missing parents, syncing each parent after a
/// child is created in it (so the new names survive a power cut).
pub(super) fn create_dirs(fs: &dyn Fs, dir: &Path) -> Result<()> {
    for d in super::fs::make_dirs(fs, dir)? {
        let parent = match d.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        fs.sync_dir(parent)
            .map_err(|e| io_err(format!("syncing directory {}", parent.display()), &e))?;
    }
    Ok(())
}

/// Ledger files in `<data_dir>/ledgers`, by escaped managed-ledger name.
pub(super) fn list_ledger_files(
    fs: &dyn Fs,
    data_dir: &Path,
) -> Result<HashMap<String, Vec<(u64, bool)>>> {
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

    /// One handle fewer; the last one closes the store (waiting for that
    /// up to the directory's `close_timeout`).
    pub fn release(self: &Arc<Self>) -> Result<()> {
        self.release_by(Instant::now() + self.opts.close_timeout)
    }

    /// One handle fewer; the last one closes the store, waiting for that
    /// until `deadline`: past it, a `close_timed_out` error, the shutdown
    /// going on on its own thread (an open of the same directory waits for
    /// it meanwhile, with its own deadline).
    pub fn release_by(self: &Arc<Self>, deadline: Instant) -> Result<()> {
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
        if self.io.read_only {
            // Nothing to write or sync: no disk to wait for.
            let r = self.shutdown();
            self.closed(&c);
            return r;
        }
        // A thread of its own closes the store, and the caller waits for it
        // until the deadline: shutting down waits for syncs (the journal's
        // Close, the final checkpoint) that a stalled disk may never answer,
        // and that thread, not the caller, is their owner. (The last handle
        // may also go in a completion callback: on a storage thread the
        // shutdown would wait on itself; that caller does not wait at all.)
        // A result after the deadline has no caller left to take it: every
        // entry was durable when acknowledged, and a final cursor state that
        // failed to be written only means those acks are redelivered after a
        // reopen.
        struct Closed(Arc<Store>, Arc<(Mutex<bool>, Condvar)>);
        impl Drop for Closed {
            fn drop(&mut self) {
                self.0.closed(&self.1); // even if the shutdown panicked
            }
        }
        let result: Arc<Mutex<Option<Result<()>>>> = Arc::new(Mutex::new(None));
        let done = Closed(Arc::clone(self), Arc::clone(&c));
        let slot = Arc::clone(&result);
        let spawned = std::thread::Builder::new()
            .name("txnstream-close".into())
            .spawn(move || {
                let r = done.0.shutdown();
                *slot.lock() = Some(r);
                drop(done); // after the result is in its slot
            });
        if let Err(e) = spawned {
            // The guard went with the closure: openers waiting go on.
            return Err(io_err("starting the thread that closes the store", &e));
        }
        if group_commit::on_storage_thread() {
            return Ok(());
        }
        let (m, cv) = &*c;
        let mut finished = m.lock();
        while !*finished {
            if cv.wait_until(&mut finished, deadline).timed_out() && !*finished {
                return Err(self.close_timed_out("the data directory's shutdown"));
            }
        }
        drop(finished);
        let r = result.lock().take();
        r.unwrap_or_else(|| {
            Err(Error::Stopped(format!(
                "the shutdown of data directory {} panicked",
                self.io.data_dir.display()
            )))
        })
    }

    /// `close()` waited its `close_timeout` for `what` in vain.
    pub(super) fn close_timed_out(&self, what: &str) -> Error {
        Error::Io {
            context: format!(
                "closing data directory {}: waiting {:?} (close_timeout) for {what}",
                self.io.data_dir.display(),
                self.opts.close_timeout
            ),
            errno: Some(libc::ETIMEDOUT),
            message: "the disk did not answer in time; the close goes on in the background \
                      and the next open recovers from the files"
                .to_owned(),
        }
    }

    /// The close registered as `c` has finished: an open waiting for it goes on.
    fn closed(&self, c: &Arc<(Mutex<bool>, Condvar)>) {
        with_registry(|r| {
            if r.closing.get(&self.key).is_some_and(|x| Arc::ptr_eq(x, c)) {
                r.closing.remove(&self.key);
            }
        });
        *c.0.lock() = true;
        c.1.notify_all();
    }

    pub(super) fn new_io(fs: Arc<dyn Fs>, data_dir: &Path, opts: &LedgerOptions) -> Arc<StoreIo> {
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

    pub(super) fn bare(
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
            retired: Mutex::new(HashMap::new()),
        }
    }

    pub(super) fn rollover_default(opts: &LedgerOptions) -> Rollover {
        Rollover {
            max_entries: opts.max_entries_per_ledger,
            max_bytes: opts.max_bytes_per_ledger,
        }
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
            direct_min: opts.direct_entry_bytes,
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
                // A panic (a bug) is reported like a failed flush and the
                // loop starts again: trimming, cursor flushes and
                // checkpoints go on, nobody waits on this thread.
                while let Err(p) = std::panic::catch_unwind(AssertUnwindSafe(|| me.flusher_loop()))
                {
                    let why = group_commit::panic_message(p.as_ref());
                    let mut c = me.ckpt.lock();
                    c.errors += 1;
                    c.last_error = Some(format!("the flusher thread panicked: {why}"));
                    drop(c);
                    std::thread::sleep(Duration::from_millis(50));
                }
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
        let first = self.first_ledger_id(name)?;
        let id = self.next_ml_id.fetch_add(1, Ordering::AcqRel);
        let ml = Arc::new(MlState::new(
            id,
            name.to_owned(),
            dir,
            Arc::clone(&self.io),
            rollover,
        ));
        // Journaled with its creation (see `journal::encode_ml_create`).
        ml.meta.lock().next_ledger_id = first;
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
            done: Done::nothing(),
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

    /// The first ledger id of a new managed ledger `name`: past the ids of
    /// any files a managed ledger of that name deleted before may have left
    /// (found at open, or deleted since).
    fn first_ledger_id(&self, name: &str) -> Result<u64> {
        let escaped = catalog::escape_name(name)?;
        let listed = self
            .listing
            .lock()
            .get(&escaped)
            .and_then(|files| files.iter().map(|&(id, _)| id).max())
            .map_or(0, |id| id.saturating_add(1));
        let retired = self.retired.lock().get(name).copied().unwrap_or(0);
        Ok(FIRST_LEDGER_ID.max(listed).max(retired))
    }

    /// A managed ledger `name` was deleted; none of its ledger ids reached
    /// `next` (see `retired`).
    pub(super) fn retire(&self, name: &str, next: u64) {
        let mut r = self.retired.lock();
        let floor = r.entry(name.to_owned()).or_insert(next);
        *floor = (*floor).max(next);
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
        // meta before ledgers, as the journal's `apply` takes them, and not
        // both at once.
        let next = ml.meta.lock().next_ledger_id;
        let ledgers = ml.ledgers.read();
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
                    // The listing was taken when the store opened; since
                    // then the write-behind may have written this ledger's
                    // file from the journal (recovery of a ledger that is
                    // opened only later). Missing means missing now.
                    if fs.exists(&p) {
                        continue;
                    }
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
        // Files of a deleted managed ledger of the same name are removed by
        // the checkpoint that stops listing it, not here: until then a crash
        // replays that ledger's journal records, which may point into them.
        if self.retired.lock().contains_key(&ml.name) {
            leftovers.clear();
        }
        for path in leftovers {
            match fs.remove_file(&path) {
                Ok(()) => {}
                // The listing is from the store's open: a checkpoint may
                // have removed it since.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(format!("removing {}", path.display()), &e)),
            }
        }
        ml.checked.store(true, Ordering::Release);
        Ok(())
    }

    /// A handle on `ml` closes (its cursor states made durable by `deadline`).
    pub fn close_ml(&self, ml: &Arc<MlState>, deadline: Instant) -> Result<()> {
        if self.io.read_only {
            return Ok(());
        }
        // Cursor states are made durable before close returns (on a storage
        // thread: before the store's shutdown, see below); the seal
        // need not be waited for (recovery seals an open ledger at its
        // durable end just the same, and the journal keeps it ahead of any
        // later append).
        let has_cursors = !ml.cursors.lock().is_empty();
        let r = if has_cursors {
            // On a storage thread (a handle closed in a completion callback) the
            // states are queued, not waited for: the store's shutdown, queued
            // after them, makes them durable before it releases the directory.
            let wait = !group_commit::on_storage_thread();
            self.persist_cursors_by(ml, wait, Some(deadline))
        } else {
            Ok(())
        };
        let r = r.and(self.submit(Command::Meta {
            ml: Arc::clone(ml),
            op: MetaOp::Seal,
            done: Done::nothing(),
        }));
        ml.open.store(false, Ordering::Release);
        r
    }

    /// Journals `ml`'s cursor states and trims the ledgers every cursor has
    /// passed; with `wait`, returns once that is durable.
    pub fn persist_cursors(&self, ml: &Arc<MlState>, wait: bool) -> Result<()> {
        self.persist_cursors_by(ml, wait, None)
    }

    /// [`persist_cursors`](Self::persist_cursors), waiting no later than
    /// `deadline` if one is given (a `close_timed_out` error then).
    fn persist_cursors_by(
        &self,
        ml: &Arc<MlState>,
        wait: bool,
        deadline: Option<Instant>,
    ) -> Result<()> {
        if self.io.read_only {
            return Ok(());
        }
        if wait {
            group_commit::not_on_storage_thread("cursor flush")?;
        }
        let order = ml.cursor_journal.lock();
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
                Done::waiter(tx.clone())
            } else {
                let ml = Arc::clone(ml);
                Done::batch(Box::new(move |r| {
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
        drop(order); // queued: journal order is fixed now
        if wait {
            for _ in 0..count {
                let got = match deadline {
                    Some(d) => rx.recv_deadline(d).map_err(|e| e.is_timeout()),
                    None => rx.recv().map_err(|_| false),
                };
                match got {
                    Ok(r) => {
                        if let Err(e) = r {
                            ml.cursors_dirty.store(true, Ordering::Release);
                            return Err(e);
                        }
                    }
                    Err(true) => {
                        // Still queued: journaled when the disk answers (the
                        // shutdown then writes them), or not, and redelivered.
                        return Err(self.close_timed_out(&format!(
                            "the cursor states of managed ledger {:?}",
                            ml.name
                        )));
                    }
                    Err(false) => return Err(Error::LedgerClosed(ml.name.clone())),
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
            done: Done::nothing(),
        })
        .map(|_| ())
    }

    /// Removes a cursor durably.
    pub fn delete_cursor(&self, ml: &Arc<MlState>, name: &str) -> Result<()> {
        self.submit_wait(Command::Meta {
            ml: Arc::clone(ml),
            op: MetaOp::CursorDelete(name.to_owned()),
            done: Done::nothing(),
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
            done: Done::nothing(),
        })?;
        names.remove(&ml.name);
        self.mls.write().remove(&ml.id);
        // Applying the durable record moved it past every id it used.
        let next = {
            let mut m = ml.meta.lock();
            m.deleted = true;
            m.next_ledger_id
        };
        ml.open.store(false, Ordering::Release);
        let ids: Vec<u64> = std::mem::take(&mut *ml.ledgers.write())
            .into_keys()
            .collect();
        self.io.files.lock().evict_ml(ml.id);
        self.retire(&ml.name, next);
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
            done: Done::nothing(),
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

    /// True if `bytes` more would be queued at once, without waiting for
    /// room (a hint: callers release the GIL only when it is false).
    pub fn has_room(&self, bytes: u64) -> bool {
        let p = self.signals.pending.lock();
        *p == 0 || *p + bytes <= self.opts.max_pending_bytes
    }

    /// Waits for queue space for `bytes` (never on a storage thread, nor on
    /// a thread serving other directories too: see `sink::may_wait_for_room`).
    fn admit(&self, bytes: u64) -> Result<()> {
        let mut p = self.signals.pending.lock();
        if bytes > 0 && !group_commit::on_storage_thread() && crate::sink::may_wait_for_room() {
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
        if let Err(e) = group_commit::not_on_storage_thread("storage call") {
            cmd.fail(&e);
            return Err(e);
        }
        let (tx, rx) = crossbeam_channel::bounded(1);
        let cmd = match cmd {
            Command::Append {
                ml, entries, bytes, ..
            } => Command::Append {
                ml,
                entries,
                bytes,
                done: Done::waiter(tx),
            },
            Command::Replace {
                ml, entries, bytes, ..
            } => Command::Replace {
                ml,
                entries,
                bytes,
                done: Done::waiter(tx),
            },
            Command::Meta { ml, op, .. } => Command::Meta {
                ml,
                op,
                done: Done::waiter(tx),
            },
            Command::Barrier { .. } => Command::Barrier {
                done: Done::waiter(tx),
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
            done: Done::nothing(),
        })
        .map(|_| ())
    }

    // ------------------------------------------------------------- flusher

    /// Closes the store: journals cursor states, drains the journal, stops
    /// the threads, checkpoints everything and releases the lock.
    pub(super) fn shutdown(&self) -> Result<()> {
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
