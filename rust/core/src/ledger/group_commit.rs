//! Group commit of the journal: a writer thread and a sync thread shared by
//! every managed ledger of a data directory.
//!
//! Appends and other changes queue on one channel. The writer thread takes
//! everything queued (up to `max_batch_bytes`), frames it as journal records
//! ([`super::journal`]), writes them at the end of the journal with one
//! `pwritev`, and hands the group to the sync thread; it takes the next group
//! at once, so group N+1 is written while group N is being synced (a group of
//! less than [`PIPELINE_MIN_BYTES`] first waits for the running sync to end,
//! gathering what queues meanwhile: the sync, not the write, is its cost):
//!
//! ```text
//! writer thread:  write N | write N+1 | write N+2 ...
//! sync thread:            | fdatasync N ........ | fdatasync N+1,N+2 | ...
//! ```
//!
//! The sync thread takes every group handed to it so far, syncs once,
//! publishes the groups (applies their records to the managed ledgers'
//! state, [`MlState::apply`]), rewrites the `SYNCED` hint for readers in
//! other processes and only then completes the callers, in append order. So
//! nobody is acknowledged, and no reader sees an entry, before its bytes are
//! durable; concurrent appenders on any ledgers share syncs. A small group
//! while no sync is running is synced by the writer thread itself, sparing a
//! lone appender a thread hand-off.
//!
//! Ledger rollover (by entries or bytes) is decided here, per managed
//! ledger: a `LedgerOpen` record goes into the same group as the first entry
//! of the new ledger.
//!
//! Failures. A failed write or sync fails every group not yet known
//! durable: the sync thread gives the callers of the failed group and of
//! every group handed to it later back and wakes the writer thread, which
//! waits until the sync thread is idle, cuts the journal back to its synced
//! end and syncs the cut (so failed bytes never resurface: a later sync would
//! make them durable, and Linux may already have written them back), takes
//! every change queued at that moment and only then fails, in order, the
//! given-back groups, its own group and the queued changes: a caller that
//! sees the error and appends again is not failed by the same fault. Its
//! per-ledger rollover state is reloaded from the published state, and every
//! managed ledger with entries in the failed groups moves to a new ledger on
//! its next append (as BookKeeper closes a ledger whose add failed), so a
//! position already handed out by `append_positioned` is never reused.
//! A journal segment is sealed, and the next one started, only once every
//! group written to it is synced.

use super::fault::FaultKind;
use super::fs::{FsFile, OpenMode};
use super::journal::{self, Kind, RECORD_HEADER_LEN, SEGMENT_HEADER_LEN};
use super::ledger_file;
use super::state::{
    Applied, FileOpen, MlState, Rollover, StoreIo, CREATED, CREATE_FAILED, FIRST_LEDGER_ID,
};
use crate::error::{Error, Result};
use crate::position::Position;
use crate::sink::AppendCallback;
use crate::sync::{Condvar, Mutex};
use crossbeam_channel::{Receiver, Sender};
use std::cell::Cell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

thread_local! {
    /// Set on storage threads: they never wait for queue space (a callback
    /// they run may append, and waiting there would deadlock the pipeline).
    static STORAGE_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// True on a storage thread of any data directory.
pub(crate) fn on_storage_thread() -> bool {
    STORAGE_THREAD.with(Cell::get)
}

/// Refuses a blocking `what` on a storage thread (in a completion callback):
/// it would wait for a completion that needs the thread it blocks, and every
/// ledger of the directory would hang for good.
pub(crate) fn not_on_storage_thread(what: &str) -> Result<()> {
    if on_storage_thread() {
        return Err(Error::invalid(format!(
            "a blocking {what} from a completion callback (on a storage thread) would \
             wait on itself; use the asynchronous call there"
        )));
    }
    Ok(())
}

pub(crate) fn mark_storage_thread() {
    STORAGE_THREAD.with(|c| c.set(true));
}

/// How a caller learns the outcome: told exactly once. A `Done` dropped
/// without being completed -- its command was lost because a storage thread
/// panicked and unwound -- completes with an error, so no caller ever waits
/// for an answer that cannot come.
pub(crate) struct Done(Option<Reply>);

/// The ways a caller is told (see [`Done`]).
enum Reply {
    /// One entry, a callback (the `EntrySink` path).
    Callback(AppendCallback),
    /// Any number of entries, a callback with all positions.
    Batch(Box<dyn FnOnce(Result<Vec<Position>>) + Send>),
    /// A blocked caller.
    Waiter(Sender<Result<Vec<Position>>>),
    /// One entry whose caller learns its position as soon as the writer
    /// assigns it (before the sync), and later whether it is durable.
    Positioned(Option<PositionCallback>, AppendCallback),
}

/// Told an entry's position once the journal writer assigned it.
pub type PositionCallback = Box<dyn FnOnce(Result<Position>) + Send + 'static>;

fn first_position(r: Result<Vec<Position>>) -> Result<Position> {
    r.and_then(|v| {
        v.first()
            .copied()
            .ok_or_else(|| Error::invalid("append completed without a position"))
    })
}

impl Done {
    /// One entry, a callback (the `EntrySink` path).
    pub(crate) fn callback(cb: AppendCallback) -> Self {
        Self(Some(Reply::Callback(cb)))
    }

    /// Any number of entries, a callback with all positions.
    pub(crate) fn batch(cb: Box<dyn FnOnce(Result<Vec<Position>>) + Send>) -> Self {
        Self(Some(Reply::Batch(cb)))
    }

    /// A blocked caller.
    pub(crate) fn waiter(tx: Sender<Result<Vec<Position>>>) -> Self {
        Self(Some(Reply::Waiter(tx)))
    }

    /// Nobody waits (background cursor and trim records).
    pub(crate) fn nothing() -> Self {
        Self(None)
    }

    /// One entry: its position once assigned (`at`), then its durability.
    pub(crate) fn positioned(at: PositionCallback, durable: AppendCallback) -> Self {
        Self(Some(Reply::Positioned(Some(at), durable)))
    }

    pub(crate) fn complete(mut self, r: Result<Vec<Position>>) {
        let Some(reply) = self.0.take() else {
            return;
        };
        match reply {
            Reply::Callback(cb) => guarded(|| cb(first_position(r))),
            Reply::Batch(cb) => guarded(|| cb(r)),
            Reply::Waiter(tx) => {
                // The waiter may have gone away; nothing to tell then.
                let _ = tx.send(r);
            }
            Reply::Positioned(at, durable) => {
                let first = first_position(r);
                if let Some(at) = at {
                    // Failed before it was positioned.
                    let first = first.clone();
                    guarded(|| at(first));
                }
                guarded(|| durable(first));
            }
        }
    }

    /// Reports the assigned positions to a `Positioned` caller (once).
    fn positioned_at(&mut self, positions: &[Position]) {
        if let Some(Reply::Positioned(at, _)) = &mut self.0 {
            if let (Some(cb), Some(&p)) = (at.take(), positions.first()) {
                guarded(|| cb(Ok(p)));
            }
        }
    }
}

/// Runs a caller's callback on a storage thread. A panic in it is that
/// caller's bug (the panic hook has printed it): it must not pass for a
/// storage thread's panic, which stops the directory and tells the other
/// callers of the group that their durable writes "may not be durable".
fn guarded(callback: impl FnOnce()) {
    let _ = std::panic::catch_unwind(AssertUnwindSafe(callback));
}

impl Drop for Done {
    fn drop(&mut self) {
        if self.0.is_some() {
            let reply = Done(self.0.take());
            reply.complete(Err(lost_write()));
        }
    }
}

/// The error of a write whose command was lost (see [`Done`]).
fn lost_write() -> Error {
    Error::Stopped(
        "a storage thread panicked before this write completed (it may or may not be \
         durable); nothing more can be written until the data directory is opened again"
            .into(),
    )
}

/// A change of a managed ledger other than appending entries.
#[derive(Debug, Clone)]
pub(crate) enum MetaOp {
    /// The managed ledger is new (its name is the record body).
    Create,
    /// Seal its open ledger, if any.
    Seal,
    /// A cursor's state (encoded `CursorState`).
    Cursor(Vec<u8>),
    /// A cursor is removed.
    CursorDelete(String),
    /// Ledgers leave the front.
    Trim(Vec<u64>),
    /// It is a compacted topic.
    SetCompacted,
    /// It is removed.
    Delete,
}

/// Work for the writer thread.
pub(crate) enum Command {
    Append {
        ml: Arc<MlState>,
        entries: Vec<Vec<u8>>,
        bytes: u64,
        done: Done,
    },
    Meta {
        ml: Arc<MlState>,
        op: MetaOp,
        done: Done,
    },
    /// Compaction: replace every ledger of `ml` by one holding `entries`.
    Replace {
        ml: Arc<MlState>,
        entries: Vec<Vec<u8>>,
        bytes: u64,
        done: Done,
    },
    /// Completes once everything queued before it is durable.
    Barrier { done: Done },
    /// Drain and stop; always the last command.
    Close { done: Sender<Result<()>> },
}

impl Command {
    fn ml(&self) -> Option<&Arc<MlState>> {
        match self {
            Command::Append { ml, .. } | Command::Meta { ml, .. } | Command::Replace { ml, .. } => {
                Some(ml)
            }
            Command::Barrier { .. } | Command::Close { .. } => None,
        }
    }

    fn bytes(&self) -> u64 {
        match self {
            Command::Append { bytes, .. } | Command::Replace { bytes, .. } => *bytes,
            _ => 0,
        }
    }

    pub fn fail(self, e: &Error) {
        match self {
            Command::Append { done, .. }
            | Command::Meta { done, .. }
            | Command::Replace { done, .. }
            | Command::Barrier { done } => done.complete(Err(e.clone())),
            Command::Close { done } => {
                let _ = done.send(Err(e.clone()));
            }
        }
    }
}

/// What the store learns when groups are published.
pub(crate) trait Published: Send + Sync {
    /// Records up to journal offset `end` are durable and applied;
    /// `applied` lists what each record left to do, per managed ledger.
    fn published(&self, end: u64, applied: Vec<(Arc<MlState>, Applied)>);
    /// Bytes of appends that completed (for backpressure).
    fn released(&self, bytes: u64);
}

/// A record of a group, kept until it is published.
struct Rec {
    at: u64,
    kind: Kind,
    a: u64,
    b: u64,
    body_len: u32,
    crc: u32,
    /// Body of non-entry records (applied at publish).
    body: Vec<u8>,
}

/// A change in a group: its records, its caller and the entries' positions.
pub(crate) struct Staged {
    ml: Option<Arc<MlState>>,
    recs: Vec<Rec>,
    positions: Vec<Position>,
    done: Done,
    bytes: u64,
}

/// A written group (not yet synced).
pub(crate) struct SyncJob {
    seg: Arc<dyn FsFile>,
    end: u64,
    staged: Vec<Staged>,
    /// Ledger files holding large entries of the group (synced with it).
    files: Vec<Arc<dyn FsFile>>,
    /// Directories to sync with it (a ledger file created for them).
    dirs: Vec<PathBuf>,
}

#[derive(Default)]
struct PipeState {
    inflight: usize,
    failed: Option<(Error, Vec<Staged>)>,
    /// The sync thread panicked: every later group fails with this.
    fatal: Option<Error>,
}

/// What the two threads share about groups in flight.
#[derive(Default)]
struct Pipeline {
    state: Mutex<PipeState>,
    idle: Condvar,
}

impl Pipeline {
    fn is_idle(&self) -> Result<bool> {
        let s = self.state.lock();
        match &s.failed {
            Some((e, _)) => Err(e.clone()),
            None => Ok(s.inflight == 0),
        }
    }

    fn submitted(&self) {
        self.state.lock().inflight += 1;
    }

    fn settled(&self, n: usize) {
        let mut s = self.state.lock();
        s.inflight -= n;
        if s.inflight == 0 {
            self.idle.notify_all();
        }
    }

    fn failure(&self) -> Option<Error> {
        self.state.lock().failed.as_ref().map(|(e, _)| e.clone())
    }

    fn wait_idle(&self) -> Option<Error> {
        let mut s = self.state.lock();
        while s.inflight > 0 {
            self.idle.wait(&mut s);
        }
        s.failed.as_ref().map(|(e, _)| e.clone())
    }

    fn take_failure(&self) -> Option<(Error, Vec<Staged>)> {
        let mut s = self.state.lock();
        while s.inflight > 0 {
            self.idle.wait(&mut s);
        }
        s.failed.take()
    }

    /// The sync thread panicked: fail what is in flight and everything after.
    fn fatal(&self, e: Error) {
        let mut s = self.state.lock();
        s.failed.get_or_insert_with(|| (e.clone(), Vec::new()));
        s.fatal = Some(e);
    }

    fn fatal_error(&self) -> Option<Error> {
        self.state.lock().fatal.clone()
    }

    fn give_back(&self, e: Option<Error>, jobs: Vec<SyncJob>) {
        let mut s = self.state.lock();
        let failed = s.failed.get_or_insert_with(|| {
            (
                e.unwrap_or_else(|| Error::invalid("sync failed")),
                Vec::new(),
            )
        });
        failed.1.extend(jobs.into_iter().flat_map(|j| j.staged));
    }
}

/// Journal settings the pipeline uses.
#[derive(Debug, Clone, Copy)]
pub(crate) struct JournalOptions {
    pub segment_bytes: u64,
    /// Sync on a thread of its own, pipelined with the writes.
    pub sync_thread: bool,
    pub preallocate_bytes: u64,
    pub max_batch_bytes: usize,
    /// Entries of at least this many bytes are written once, straight into
    /// their ledger file, with a reference in the journal (0: never).
    pub direct_min: usize,
}

/// A large entry's record, to be written into its ledger file before the
/// group's sync.
struct DirectWrite {
    log: Arc<dyn FsFile>,
    off: u64,
    head: [u8; 8],
    payload: Vec<u8>,
}

/// State shared by the store and the pipeline threads.
pub(crate) struct Journal {
    pub io: Arc<StoreIo>,
    pub opts: JournalOptions,
    /// Journal offset through which everything is synced and published.
    pub synced: AtomicU64,
    /// Syncs of the journal (a count for benchmarks).
    pub syncs: AtomicU64,
    /// Groups written.
    pub groups: AtomicU64,
    pub publisher: Arc<dyn Published>,
    /// The `SYNCED` hint file.
    hint: Arc<dyn FsFile>,
    /// Set when a journal thread panicked: nothing more is written or
    /// checkpointed in this process (the next open recovers from the
    /// journal, which holds everything that was acknowledged).
    stopped: Mutex<Option<Error>>,
}

/// The segment being appended to.
pub(crate) struct Active {
    base: u64,
    file: Arc<dyn FsFile>,
    /// Journal offset where the next record goes.
    end: u64,
    /// Journal offset up to which the file is preallocated.
    alloc_end: u64,
}

/// Per managed ledger: where its appends go (the writer's view, ahead of
/// the published state by the groups in flight).
#[derive(Debug, Clone, Copy)]
struct WriterMl {
    active: Option<u64>,
    entries: u64,
    bytes: u64,
    next_ledger_id: u64,
    rollover: Rollover,
    /// The next append opens a new ledger whatever the counts say (a write
    /// of this managed ledger failed: see [`WriterThread::fenced`]).
    force_roll: bool,
}

/// Payloads of at least this many bytes are written from the caller's
/// buffer instead of being copied into the group buffer.
const BIG_PAYLOAD: usize = 16 << 10;

/// A group smaller than this waits for the running sync to end (taking in
/// what queues meanwhile) instead of being written during it.
const PIPELINE_MIN_BYTES: usize = 64 << 10;

/// Groups larger than this are handed to writeback in chunks of this size.
const WRITEBACK_CHUNK: usize = 1 << 20;

enum Piece {
    Small(usize, usize),
    Big(usize),
}

/// The framed records of one group, in journal order.
#[derive(Default)]
struct GroupBuf {
    small: Vec<u8>,
    big: Vec<Vec<u8>>,
    pieces: Vec<Piece>,
    small_done: usize,
    len: usize,
}

impl GroupBuf {
    fn push(&mut self, head: impl FnOnce(&mut Vec<u8>), body: Vec<u8>) {
        head(&mut self.small);
        self.len += RECORD_HEADER_LEN + body.len();
        if body.len() >= BIG_PAYLOAD {
            self.close_small();
            self.pieces.push(Piece::Big(self.big.len()));
            self.big.push(body);
        } else {
            self.small.extend_from_slice(&body);
        }
    }

    fn close_small(&mut self) {
        let end = self.small.len();
        while self.small_done < end {
            let to = end.min(self.small_done + WRITEBACK_CHUNK);
            self.pieces.push(Piece::Small(self.small_done, to));
            self.small_done = to;
        }
    }

    fn slices(&self) -> Vec<&[u8]> {
        self.pieces
            .iter()
            .map(|p| match *p {
                Piece::Small(a, b) => &self.small[a..b],
                Piece::Big(i) => self.big[i].as_slice(),
            })
            .collect()
    }

    fn clear(&mut self) {
        self.small.clear();
        self.big.clear();
        self.pieces.clear();
        self.small_done = 0;
        self.len = 0;
    }
}

pub(crate) struct WriterThread {
    j: Arc<Journal>,
    rx: Receiver<Command>,
    active: Active,
    deferred: VecDeque<Command>,
    group: GroupBuf,
    mls: HashMap<u64, WriterMl>,
    /// Managed ledgers with positions handed out in a failed group, and the
    /// lowest ledger id their next ledger may have. Like BookKeeper, which
    /// closes a ledger whose add failed, the next append of such a managed
    /// ledger opens a new ledger: a position given to a caller (through
    /// `append_positioned`) is never given to another entry.
    fenced: HashMap<u64, u64>,
    /// Large entries of the group being formed (see [`JournalOptions::direct_min`]).
    direct: Vec<DirectWrite>,
    /// Ledgers whose files this thread prepared for direct writes.
    direct_ready: HashSet<(u64, u64)>,
    /// A ledger file was prepared since the last group: its directory entry
    /// must be synced before anything in it is acknowledged.
    dir_dirty: bool,
    /// Index files whose headers were written since the last group (synced
    /// with it, like the data files).
    fresh_idx: Vec<Arc<dyn FsFile>>,
    poisoned: Option<Error>,
    pipe: Arc<Pipeline>,
    jobs: Option<Sender<SyncJob>>,
    wake: Receiver<()>,
    sync_thread: Option<JoinHandle<()>>,
}

fn io_err(j: &Journal, base: u64, what: &str, e: &std::io::Error) -> Error {
    Error::io(
        format!(
            "{what} journal file {}",
            journal::segment_path(&j.io.data_dir, base).display()
        ),
        e,
    )
}

enum Event {
    Command(Option<Command>),
    Wake,
}

impl Journal {
    pub fn new(
        io: Arc<StoreIo>,
        opts: JournalOptions,
        synced: u64,
        publisher: Arc<dyn Published>,
        hint: Arc<dyn FsFile>,
    ) -> Self {
        Self {
            io,
            opts,
            synced: AtomicU64::new(synced),
            syncs: AtomicU64::new(0),
            groups: AtomicU64::new(0),
            publisher,
            hint,
            stopped: Mutex::new(None),
        }
    }

    /// The error of a journal stopped by a panicking thread, if it was.
    pub(crate) fn stopped(&self) -> Option<Error> {
        self.stopped.lock().clone()
    }

    fn stop(&self, e: &Error) {
        self.stopped.lock().get_or_insert_with(|| e.clone());
    }

    pub(crate) fn write_hint(&self, end: u64) {
        // A failed hint write only makes readers lag.
        let _ = self.hint.write_all_at(&journal::encode_synced(end), 0);
    }
}

/// Creates the segment starting at journal offset `base`: header written
/// and synced, preallocated if possible, its name made durable before any
/// record is written to it.
pub(crate) fn create_segment(j: &Journal, base: u64) -> Result<Active> {
    let io = &j.io;
    let path = journal::segment_path(&io.data_dir, base);
    let ctx = |what: &str, e: &std::io::Error| {
        Error::io(format!("{what} journal file {}", path.display()), e)
    };
    let file = io
        .fs
        .open(&path, OpenMode::CREATE_NEW)
        .map_err(|e| ctx("creating", &e))?;
    let result = (|| {
        file.write_all_at(&journal::encode_segment_header(base), 0)
            .map_err(|e| ctx("writing", &e))?;
        let alloc_end = preallocate(j, file.as_ref(), base, base, j.opts.preallocate_bytes);
        file.sync_data().map_err(|e| ctx("syncing", &e))?;
        let dir = io.data_dir.join(journal::JOURNAL_DIR);
        io.fs
            .sync_dir(&dir)
            .map_err(|e| Error::io(format!("syncing directory {}", dir.display()), &e))?;
        Ok(alloc_end)
    })();
    match result {
        Ok(alloc_end) => {
            io.segments.write().insert(base, Arc::clone(&file));
            Ok(Active {
                base,
                file,
                end: base,
                alloc_end,
            })
        }
        Err(e) => {
            let _ = io.fs.remove_file(&path);
            Err(e)
        }
    }
}

/// Reserves space up to journal offset `end + chunk`; returns the new
/// preallocated end. Preallocation is an optimization: where it fails (a
/// nearly full disk), writes go on without it and only a real write can
/// fail.
fn preallocate(j: &Journal, file: &dyn FsFile, base: u64, end: u64, chunk: u64) -> u64 {
    if chunk == 0 {
        return end;
    }
    let target = end + chunk;
    let ok =
        j.io.faults
            .check(FaultKind::Preallocate)
            .and_then(|()| file.allocate(SEGMENT_HEADER_LEN + (target - base)))
            .is_ok();
    if ok {
        target
    } else {
        end
    }
}

impl Active {
    /// The existing segment at `base`, appended to at journal offset `end`.
    pub(crate) fn reopen(base: u64, file: Arc<dyn FsFile>, end: u64) -> Self {
        let alloc_end = file
            .size()
            .map(|l| base + l.saturating_sub(SEGMENT_HEADER_LEN))
            .unwrap_or(end)
            .max(end);
        Self {
            base,
            file,
            end,
            alloc_end,
        }
    }
}

impl WriterThread {
    /// A writer thread (to be run) and its running sync thread.
    pub fn spawn(
        j: Arc<Journal>,
        rx: Receiver<Command>,
        active: Active,
        name: &str,
    ) -> std::io::Result<JoinHandle<()>> {
        let pipe = Arc::new(Pipeline::default());
        let (jobs_tx, jobs_rx) = crossbeam_channel::unbounded();
        let (wake_tx, wake_rx) = crossbeam_channel::bounded(1);
        let sj = Arc::clone(&j);
        let sp = Arc::clone(&pipe);
        // Without a sync thread every group is synced by the writer thread
        // itself (no pipelining: one thread fewer).
        let sync = if j.opts.sync_thread {
            Some(
                std::thread::Builder::new()
                    .name(format!("txs-sync-{name}"))
                    .spawn(move || {
                        mark_storage_thread();
                        sync_loop(&sj, &sp, &jobs_rx, &wake_tx)
                    })?,
            )
        } else {
            None
        };
        let jobs_tx = sync.as_ref().map(|_| jobs_tx);
        let me = WriterThread {
            j,
            rx,
            active,
            deferred: VecDeque::new(),
            group: GroupBuf::default(),
            mls: HashMap::new(),
            fenced: HashMap::new(),
            direct: Vec::new(),
            direct_ready: HashSet::new(),
            dir_dirty: false,
            fresh_idx: Vec::new(),
            poisoned: None,
            pipe,
            jobs: jobs_tx,
            wake: wake_rx,
            sync_thread: sync,
        };
        let rx_after = me.rx.clone();
        let j_after = Arc::clone(&me.j);
        let writer = std::thread::Builder::new()
            .name(format!("txs-journal-{name}"))
            .spawn(move || {
                mark_storage_thread();
                if let Err(p) = std::panic::catch_unwind(AssertUnwindSafe(|| me.run())) {
                    // Unwinding dropped the commands the writer held: their
                    // callers were told (see `Done`). Fail every later one.
                    let e = panicked("journal writer", p.as_ref());
                    j_after.stop(&e);
                    fail_until_closed(&j_after, &rx_after, &e);
                }
            })?;
        Ok(writer)
    }

    fn next(&mut self) -> Option<Command> {
        loop {
            if let Some(c) = self.deferred.pop_front() {
                return Some(c);
            }
            let event = crossbeam_channel::select! {
                recv(self.rx) -> c => Event::Command(c.ok()),
                recv(self.wake) -> _ => Event::Wake,
            };
            match event {
                Event::Command(c) => return c,
                // An idle writer must still fail the callers of a failed sync.
                Event::Wake => {
                    if let Some(e) = self.pipe.failure() {
                        self.fail_group(Vec::new(), Vec::new(), &e);
                    }
                }
            }
        }
    }

    fn try_next(&mut self) -> Option<Command> {
        match self.deferred.pop_front() {
            Some(c) => Some(c),
            None => self.rx.try_recv().ok(),
        }
    }

    fn run(mut self) {
        while let Some(cmd) = self.next() {
            if let Command::Close { done } = cmd {
                let r = match self.pipe.wait_idle() {
                    Some(e) => {
                        self.fail_group(Vec::new(), Vec::new(), &e);
                        Err(e)
                    }
                    None => Ok(()),
                };
                self.stop_sync_thread();
                let _ = done.send(r);
                return;
            }
            let mut bytes = cmd.bytes() as usize;
            let mut group = vec![cmd];
            if bytes < PIPELINE_MIN_BYTES {
                // A small group gains nothing from being written during
                // the running sync: let changes queue until it ends.
                let _ = self.pipe.wait_idle();
            }
            while bytes < self.j.opts.max_batch_bytes {
                match self.try_next() {
                    Some(c @ Command::Close { .. }) => {
                        self.deferred.push_front(c);
                        break;
                    }
                    Some(c) => {
                        bytes += c.bytes() as usize;
                        group.push(c);
                    }
                    None => break,
                }
            }
            self.write_group(group);
        }
        // Every sender is gone without a Close.
        let _ = self.pipe.wait_idle();
        self.stop_sync_thread();
    }

    fn stop_sync_thread(&mut self) {
        self.jobs = None;
        if let Some(t) = self.sync_thread.take() {
            let _ = t.join();
        }
    }

    /// The writer's view of `ml` (loaded from its published state).
    fn writer_ml(&mut self, ml: &MlState) -> WriterMl {
        if let Some(w) = self.mls.get_mut(&ml.id) {
            // The thresholds of the newest open (a reopen may change them).
            w.rollover = *ml.rollover.lock();
            return *w;
        }
        let m = ml.meta.lock();
        let (entries, bytes) = match m.active {
            Some(id) => ml
                .ledgers
                .read()
                .get(&id)
                .map(|l| {
                    let tail: u64 = l.tail.iter().map(|t| u64::from(t.len) + 8).sum();
                    (
                        l.count,
                        l.file_bytes - super::ledger_file::HEADER_LEN + tail,
                    )
                })
                .unwrap_or((0, 0)),
            None => (0, 0),
        };
        let mut w = WriterMl {
            active: m.active,
            entries,
            bytes,
            next_ledger_id: m.next_ledger_id,
            rollover: *ml.rollover.lock(),
            force_roll: false,
        };
        if let Some(next) = self.fenced.remove(&ml.id) {
            w.next_ledger_id = w.next_ledger_id.max(next);
            w.force_roll = true;
        }
        drop(m);
        self.mls.insert(ml.id, w);
        w
    }

    /// The `.log` of ledger `ledger` of `ml`, ready for large entries to be
    /// written into it (its header written the first time).
    fn prepare_direct(&mut self, ml: &MlState, ledger: u64) -> Result<Arc<dyn FsFile>> {
        let key = (ml.id, ledger);
        if self.direct_ready.contains(&key) {
            return Ok(self.j.io.ledger_files(ml, ledger, FileOpen::Create)?.log);
        }
        // Only a ledger whose opening is durable (published) gets files
        // from here: a file never exists for a ledger the journal does not
        // know (recovery refuses those, as an older catalog restored over
        // newer files). The first entries of a new ledger, in the group
        // that opens it, go to the journal.
        let Some(file_entries) = ml.ledgers.read().get(&ledger).map(|l| l.file_entries) else {
            return Err(Error::invalid("ledger not published yet"));
        };
        let empty = file_entries == 0;
        let ldir = self.j.io.data_dir.join(super::store::LEDGERS_DIR);
        super::fs::make_dirs(self.j.io.fs.as_ref(), &ldir)?;
        let how = if empty {
            FileOpen::Fresh
        } else {
            FileOpen::Create
        };
        let h = self.j.io.ledger_files(ml, ledger, how)?;
        self.fresh_idx.push(Arc::clone(&h.idx));
        self.direct_ready.insert(key);
        // Its name (and maybe `ledgers/` itself) must be durable before an
        // entry in it is acknowledged.
        self.dir_dirty = true;
        Ok(h.log)
    }

    fn lac(&self) -> u64 {
        self.j.synced.load(Ordering::Acquire)
    }

    /// Frames one record into the group.
    #[allow(clippy::too_many_arguments)]
    fn push_rec(
        &mut self,
        recs: &mut Vec<Rec>,
        kind: Kind,
        ml: u64,
        a: u64,
        b: u64,
        body: Vec<u8>,
        keep_body: bool,
    ) {
        let at = self.active.end + self.group.len as u64;
        let crc = journal::body_crc(&body);
        let lac = self.lac();
        let body_len = body.len() as u32;
        let kept = if keep_body { body.clone() } else { Vec::new() };
        self.group.push(
            |buf| journal::encode_head_crc(buf, kind, lac, ml, a, b, body_len, crc),
            body,
        );
        recs.push(Rec {
            at,
            kind,
            a,
            b,
            body_len,
            crc,
            body: kept,
        });
    }

    /// Frames one command (`Close` is never in a group: it comes back, and
    /// so does a command of a ledger whose creation failed).
    fn stage(&mut self, cmd: Command) -> std::result::Result<Staged, Box<Command>> {
        let mut recs = Vec::new();
        let mut positions = Vec::new();
        if cmd.ml().is_some_and(|ml| ml.creation_failed()) {
            return Err(Box::new(cmd));
        }
        match cmd {
            Command::Append {
                ml,
                entries,
                bytes,
                done,
            } => {
                let mut w = self.writer_ml(&ml);
                let n = entries.len() as u64;
                let roll = match w.active {
                    None => true,
                    Some(_) => {
                        w.force_roll
                            || (w.entries > 0
                                && (w.entries + n > w.rollover.max_entries
                                    || w.bytes + bytes > w.rollover.max_bytes))
                    }
                };
                if roll {
                    let id = w.next_ledger_id;
                    self.push_rec(&mut recs, Kind::LedgerOpen, ml.id, id, 0, Vec::new(), false);
                    w.active = Some(id);
                    w.entries = 0;
                    w.bytes = 0;
                    w.next_ledger_id = id + 1;
                    w.force_roll = false;
                }
                let ledger = w.active.unwrap_or(0);
                for e in entries {
                    let entry = w.entries;
                    let file_off = ledger_file::HEADER_LEN + w.bytes;
                    w.bytes += (e.len() + 8) as u64;
                    w.entries += 1;
                    positions.push(Position::new(ledger, entry));
                    let direct = self.j.opts.direct_min > 0 && e.len() >= self.j.opts.direct_min;
                    // Where the ledger file cannot be prepared, the entry
                    // simply goes into the journal.
                    match direct.then(|| self.prepare_direct(&ml, ledger)) {
                        Some(Ok(log)) => {
                            let crc = journal::body_crc(&e);
                            let mut head = [0u8; 8];
                            head[..4].copy_from_slice(&(e.len() as u32).to_le_bytes());
                            head[4..].copy_from_slice(&crc.to_le_bytes());
                            let r = journal::EntryRef {
                                offset: file_off,
                                len: e.len() as u32,
                                crc,
                            };
                            self.direct.push(DirectWrite {
                                log,
                                off: file_off,
                                head,
                                payload: e,
                            });
                            let body = r.encode();
                            self.push_rec(
                                &mut recs,
                                Kind::EntryRef,
                                ml.id,
                                ledger,
                                entry,
                                body,
                                true,
                            );
                        }
                        _ => self.push_rec(&mut recs, Kind::Entry, ml.id, ledger, entry, e, false),
                    }
                }
                self.mls.insert(ml.id, w);
                let mut done = done;
                done.positioned_at(&positions);
                Ok(Staged {
                    ml: Some(ml),
                    recs,
                    positions,
                    done,
                    bytes,
                })
            }
            Command::Replace {
                ml,
                entries,
                bytes,
                done,
            } => {
                let mut w = self.writer_ml(&ml);
                let id = w.next_ledger_id;
                let n = entries.len() as u64;
                self.push_rec(
                    &mut recs,
                    Kind::ReplaceBegin,
                    ml.id,
                    id,
                    n,
                    Vec::new(),
                    false,
                );
                for (i, e) in entries.into_iter().enumerate() {
                    positions.push(Position::new(id, i as u64));
                    self.push_rec(&mut recs, Kind::Entry, ml.id, id, i as u64, e, false);
                }
                self.push_rec(
                    &mut recs,
                    Kind::ReplaceCommit,
                    ml.id,
                    id,
                    n,
                    Vec::new(),
                    false,
                );
                w.active = None;
                w.entries = 0;
                w.bytes = 0;
                w.next_ledger_id = id + 1;
                self.mls.insert(ml.id, w);
                Ok(Staged {
                    ml: Some(ml),
                    recs,
                    positions,
                    done,
                    bytes,
                })
            }
            Command::Meta { ml, op, done } => {
                match op {
                    MetaOp::Create => {
                        // Set by the creating open before it queued this.
                        let first = ml.meta.lock().next_ledger_id;
                        let body = journal::encode_ml_create(&ml.name, first, FIRST_LEDGER_ID);
                        self.push_rec(&mut recs, Kind::MlCreate, ml.id, 0, 0, body, true);
                    }
                    MetaOp::Seal => {
                        let mut w = self.writer_ml(&ml);
                        if let Some(id) = w.active.take() {
                            self.push_rec(
                                &mut recs,
                                Kind::Seal,
                                ml.id,
                                id,
                                w.entries,
                                Vec::new(),
                                false,
                            );
                            w.entries = 0;
                            w.bytes = 0;
                            self.mls.insert(ml.id, w);
                        }
                    }
                    MetaOp::Cursor(state) => {
                        self.push_rec(&mut recs, Kind::Cursor, ml.id, 0, 0, state, true);
                    }
                    MetaOp::CursorDelete(name) => {
                        self.push_rec(
                            &mut recs,
                            Kind::CursorDelete,
                            ml.id,
                            0,
                            0,
                            name.into_bytes(),
                            true,
                        );
                    }
                    MetaOp::Trim(ids) => {
                        let mut w = self.writer_ml(&ml);
                        let ids: Vec<u64> =
                            ids.into_iter().filter(|&id| Some(id) != w.active).collect();
                        if !ids.is_empty() {
                            let body: Vec<u8> =
                                ids.iter().flat_map(|id| id.to_le_bytes()).collect();
                            self.push_rec(&mut recs, Kind::Trim, ml.id, 0, 0, body, true);
                        }
                        if w.active.is_some_and(|a| ids.contains(&a)) {
                            w.active = None;
                        }
                        self.mls.insert(ml.id, w);
                    }
                    MetaOp::SetCompacted => {
                        self.push_rec(
                            &mut recs,
                            Kind::SetCompacted,
                            ml.id,
                            0,
                            0,
                            Vec::new(),
                            false,
                        );
                    }
                    MetaOp::Delete => {
                        // Past every ledger id the writer ever gave it (a
                        // failed group may have written files of ledgers the
                        // state never saw): the name's next creation starts there.
                        let next = self.writer_ml(&ml).next_ledger_id;
                        self.push_rec(&mut recs, Kind::MlDelete, ml.id, next, 0, Vec::new(), false);
                        self.mls.remove(&ml.id);
                    }
                }
                Ok(Staged {
                    ml: Some(ml),
                    recs,
                    positions,
                    done,
                    bytes: 0,
                })
            }
            Command::Barrier { done } => Ok(Staged {
                ml: None,
                recs,
                positions,
                done,
                bytes: 0,
            }),
            c @ Command::Close { .. } => Err(Box::new(c)),
        }
    }

    fn write_group(&mut self, group: Vec<Command>) {
        if let Some(e) = self.poisoned.clone().or_else(|| self.pipe.failure()) {
            return self.fail_group(Vec::new(), group, &e);
        }
        self.group.clear();
        let mut staged = Vec::with_capacity(group.len());
        let mut it = group.into_iter();
        for cmd in it.by_ref() {
            match self.stage(cmd) {
                Ok(s) => staged.push(s),
                Err(cmd) if matches!(*cmd, Command::Close { .. }) => self.deferred.push_back(*cmd),
                Err(cmd) => {
                    let name = cmd.ml().map(|ml| ml.name.clone()).unwrap_or_default();
                    self.j.publisher.released(cmd.bytes());
                    cmd.fail(&Error::io(
                        format!("writing to managed ledger {name:?}"),
                        &std::io::Error::other("its creation failed; open it again"),
                    ));
                }
            }
        }
        if let Err(e) = self.commit(&mut staged) {
            self.fail_group(staged, Vec::new(), &e);
        }
    }

    /// Fails, in order: the groups a failed sync gave back, the staged
    /// group, the rest and every change queued right now, with `e`. Waits
    /// for the sync thread first and cuts the journal back to its synced
    /// end (syncing the cut). The queue is drained BEFORE anyone is told.
    fn fail_group(&mut self, staged: Vec<Staged>, rest: Vec<Command>, e: &Error) {
        let given_back = self.pipe.take_failure();
        if let Some(fatal) = self.pipe.fatal_error() {
            self.poisoned = Some(fatal);
        }
        // Positions of the failed groups may have been handed out: their
        // managed ledgers move to a new ledger (never reusing an id the
        // writer's view had reached) before anything else is appended.
        for s in given_back
            .iter()
            .flat_map(|(_, back)| back.iter())
            .chain(staged.iter())
        {
            if let (Some(ml), false) = (&s.ml, s.positions.is_empty()) {
                let next = self.mls.get(&ml.id).map_or(0, |w| w.next_ledger_id);
                let fence = self.fenced.entry(ml.id).or_insert(0);
                *fence = (*fence).max(next);
            }
        }
        self.group.clear();
        self.direct.clear();
        self.mls.clear();
        let synced = self.lac();
        {
            let a = &self.active;
            let cut = SEGMENT_HEADER_LEN + synced.saturating_sub(a.base);
            let r = a.file.set_len(cut).and_then(|()| a.file.sync_data());
            match r {
                Ok(()) => {
                    self.active.end = synced.max(self.active.base);
                    self.active.alloc_end = self.active.end;
                }
                Err(te) => {
                    self.poisoned = Some(io_err(
                        &self.j,
                        a.base,
                        "cutting back a failed write in",
                        &te,
                    ));
                }
            }
        }
        let mut queued = Vec::new();
        let mut keep = VecDeque::new();
        while let Some(cmd) = self.try_next() {
            match cmd {
                c @ Command::Close { .. } => keep.push_back(c),
                c => {
                    if let Command::Meta {
                        ml,
                        op: MetaOp::Create,
                        ..
                    } = &c
                    {
                        ml.created.store(CREATE_FAILED, Ordering::Release);
                    }
                    queued.push(c)
                }
            }
        }
        self.deferred = keep;
        // Creations in the failed groups failed: no later record of those
        // ledgers may be written (this thread stages every record, so
        // marking them here, before anyone is told, closes every race).
        let failed_creates = given_back
            .iter()
            .flat_map(|(_, back)| back.iter())
            .chain(staged.iter())
            .filter(|s| s.recs.iter().any(|r| r.kind == Kind::MlCreate));
        for s in failed_creates {
            if let Some(ml) = &s.ml {
                ml.created.store(CREATE_FAILED, Ordering::Release);
            }
        }
        for c in &rest {
            if let Command::Meta {
                ml,
                op: MetaOp::Create,
                ..
            } = c
            {
                ml.created.store(CREATE_FAILED, Ordering::Release);
            }
        }
        let mut released = 0;
        if let Some((se, back)) = given_back {
            for s in back {
                released += s.bytes;
                s.done.complete(Err(se.clone()));
            }
        }
        for s in staged {
            released += s.bytes;
            s.done.complete(Err(e.clone()));
        }
        for c in rest.into_iter().chain(queued) {
            released += c.bytes();
            c.fail(e);
        }
        self.j.publisher.released(released);
    }

    /// Seals the active segment once everything in it is synced and starts
    /// the next one at the current end.
    fn roll_segment(&mut self) -> Result<()> {
        if let Some(e) = self.pipe.wait_idle() {
            return Err(e);
        }
        let end = self.active.end;
        let next = create_segment(&self.j, end)?;
        // Cut the old segment's preallocated tail (best effort: zeros are
        // read as the end anyway).
        let old = &self.active;
        let _ = old
            .file
            .set_len(SEGMENT_HEADER_LEN + (old.end - old.base))
            .and_then(|()| old.file.sync_data());
        self.active = next;
        Ok(())
    }

    /// Writes the staged group and hands it to the sync thread (a small
    /// group with no sync running is synced right here).
    fn commit(&mut self, staged: &mut Vec<Staged>) -> Result<()> {
        if staged.is_empty() {
            return Ok(());
        }
        if self.group.len == 0 {
            // Only barriers and no-op changes: nothing to write, but they
            // complete after everything before them.
            return self.hand_over(staged, self.jobs.is_none());
        }
        let len = self.group.len as u64;
        let used = self.active.end - self.active.base;
        if used > 0 && used + len > self.j.opts.segment_bytes {
            // Positions in the group were computed for the old segment.
            let shift_from = self.active.end;
            self.roll_segment()?;
            debug_assert_eq!(shift_from, self.active.end);
        }
        self.group.close_small();
        let a = &mut self.active;
        let off = SEGMENT_HEADER_LEN + (a.end - a.base);
        let end = a.end + len;
        if end > a.alloc_end {
            a.alloc_end = preallocate(
                &self.j,
                a.file.as_ref(),
                a.base,
                end,
                self.j.opts.preallocate_bytes,
            );
        }
        // Large entries go straight to their ledger files (synced with the
        // group); a failure fails the group like a journal write would.
        if let Err(e) = write_direct(&self.direct) {
            self.group.clear();
            self.direct.clear();
            return Err(Error::io("writing a large entry into its ledger file", &e));
        }
        let slices = self.group.slices();
        let written = self
            .j
            .io
            .faults
            .check(FaultKind::Write)
            .inspect_err(|_| {
                // Simulate a short write followed by the failure.
                let all = slices.concat();
                let _ = a.file.write_all_at(&all[..all.len() / 2], off);
            })
            .and_then(|()| write_chunked(a.file.as_ref(), &slices, off, self.group.len));
        self.group.clear();
        if let Err(e) = written {
            return Err(io_err(&self.j, a.base, "writing", &e));
        }
        a.end = end;
        self.j.groups.fetch_add(1, Ordering::Relaxed);
        // Large entries written into ledger files count: their sync is
        // what pipelining overlaps with the next group's writes.
        let direct: u64 = self.direct.iter().map(|d| d.payload.len() as u64).sum();
        let inline = self.jobs.is_none()
            || (len + direct < PIPELINE_MIN_BYTES as u64 && self.pipe.is_idle()?);
        self.hand_over(staged, inline)
    }

    fn hand_over(&mut self, staged: &mut Vec<Staged>, inline: bool) -> Result<()> {
        let mut files: Vec<Arc<dyn FsFile>> = std::mem::take(&mut self.fresh_idx);
        for d in self.direct.drain(..) {
            if !files.iter().any(|f| Arc::ptr_eq(f, &d.log)) {
                files.push(d.log);
            }
        }
        let mut dirs = Vec::new();
        if std::mem::take(&mut self.dir_dirty) {
            dirs.push(self.j.io.data_dir.join(super::store::LEDGERS_DIR));
            dirs.push(self.j.io.data_dir.clone());
        }
        let job = SyncJob {
            seg: Arc::clone(&self.active.file),
            end: self.active.end,
            staged: std::mem::take(staged),
            files,
            dirs,
        };
        if inline {
            return sync_and_complete(&self.j, vec![job]).map_err(|(e, jobs)| {
                staged.extend(jobs.into_iter().flat_map(|j| j.staged));
                e
            });
        }
        self.pipe.submitted();
        let sent = match &self.jobs {
            Some(tx) => tx.send(job).map_err(|e| e.into_inner()),
            None => Err(job),
        };
        if let Err(job) = sent {
            *staged = job.staged;
            self.pipe.settled(1);
            return Err(Error::LedgerClosed("the journal".to_owned()));
        }
        Ok(())
    }
}

/// Writes large entries into their ledger files: back-to-back records of
/// one file with one `pwritev` per run (up to [`WRITEBACK_CHUNK`]), each run
/// handed to writeback at once so the group's sync has little left to do.
fn write_direct(direct: &[DirectWrite]) -> std::io::Result<()> {
    let mut i = 0;
    while i < direct.len() {
        let first = &direct[i];
        let mut bufs: Vec<&[u8]> = vec![&first.head, &first.payload];
        let mut end = first.off + 8 + first.payload.len() as u64;
        let mut j = i + 1;
        while j < direct.len()
            && Arc::ptr_eq(&direct[j].log, &first.log)
            && direct[j].off == end
            && end - first.off < WRITEBACK_CHUNK as u64
        {
            bufs.push(&direct[j].head);
            bufs.push(&direct[j].payload);
            end += 8 + direct[j].payload.len() as u64;
            j += 1;
        }
        first.log.write_all_vectored_at(&bufs, first.off)?;
        first.log.writeback_hint(first.off, end - first.off);
        i = j;
    }
    Ok(())
}

/// Writes the slices at `off` in chunks handed to writeback as they go.
fn write_chunked(
    file: &dyn FsFile,
    slices: &[&[u8]],
    off: u64,
    total: usize,
) -> std::io::Result<()> {
    if total <= WRITEBACK_CHUNK {
        return file.write_all_vectored_at(slices, off);
    }
    let mut pos = off;
    let mut i = 0;
    while i < slices.len() {
        let mut j = i;
        let mut bytes = 0usize;
        while j < slices.len() && j - i < 1024 && bytes < WRITEBACK_CHUNK {
            bytes += slices[j].len();
            j += 1;
        }
        file.write_all_vectored_at(&slices[i..j], pos)?;
        file.writeback_hint(pos, bytes as u64);
        pos += bytes as u64;
        i = j;
    }
    Ok(())
}

/// What a caught panic said.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown cause".to_owned())
}

/// The error of a journal stopped by a panic of thread `which`.
fn panicked(which: &str, payload: &(dyn std::any::Any + Send)) -> Error {
    let why = panic_message(payload);
    Error::Stopped(format!(
        "the {which} thread panicked ({why}); nothing more can be written until the data \
         directory is opened again"
    ))
}

/// After the writer thread panicked: fail every command until the store
/// closes (a close is answered with the error), so no caller waits.
fn fail_until_closed(j: &Journal, rx: &Receiver<Command>, e: &Error) {
    for cmd in rx.iter() {
        if let Command::Close { done } = cmd {
            let _ = done.send(Err(e.clone()));
            return;
        }
        j.publisher.released(cmd.bytes());
        cmd.fail(e);
    }
}

fn sync_loop(j: &Journal, pipe: &Pipeline, rx: &Receiver<SyncJob>, wake: &Sender<()>) {
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        jobs.extend(rx.try_iter());
        let n = jobs.len();
        let outcome = match pipe.failure() {
            Some(_) => Err((None, jobs)),
            None => match std::panic::catch_unwind(AssertUnwindSafe(|| sync_and_complete(j, jobs)))
            {
                Ok(r) => r.map_err(|(e, jobs)| (Some(e), jobs)),
                Err(p) => {
                    // The jobs were dropped by the unwinding: their callers
                    // were told (see `Done`). Nothing more is written.
                    let e = panicked("journal sync", p.as_ref());
                    j.stop(&e);
                    pipe.fatal(e);
                    pipe.settled(n);
                    let _ = wake.try_send(());
                    continue;
                }
            },
        };
        match outcome {
            Ok(()) => pipe.settled(n),
            Err((e, jobs)) => {
                pipe.give_back(e, jobs);
                pipe.settled(n);
                let _ = wake.try_send(());
            }
        }
    }
}

/// Syncs the written `jobs`, publishes them and completes their callers in
/// order; on a failed sync nothing is published and the jobs come back.
fn sync_and_complete(
    j: &Journal,
    jobs: Vec<SyncJob>,
) -> std::result::Result<(), (Error, Vec<SyncJob>)> {
    let mut last: Option<&Arc<dyn FsFile>> = None;
    let mut synced_any = false;
    for job in &jobs {
        if job.staged.iter().all(|s| s.recs.is_empty()) {
            continue;
        }
        if last.is_some_and(|s| Arc::ptr_eq(s, &job.seg)) {
            continue;
        }
        last = Some(&job.seg);
        let r =
            j.io.faults
                .check(FaultKind::Sync)
                .and_then(|()| job.seg.sync_data());
        if let Err(e) = r {
            let err = Error::io("syncing the journal", &e);
            return Err((err, jobs));
        }
        synced_any = true;
    }
    // Large entries' ledger files, and the names of new ones.
    for job in &jobs {
        for f in &job.files {
            if let Err(e) = f.sync_data() {
                let err = Error::io("syncing a ledger file holding large entries", &e);
                return Err((err, jobs));
            }
        }
        for d in &job.dirs {
            if let Err(e) = j.io.fs.sync_dir(d) {
                let err = Error::io(format!("syncing directory {}", d.display()), &e);
                return Err((err, jobs));
            }
        }
    }
    if synced_any {
        j.syncs.fetch_add(1, Ordering::Relaxed);
    }
    let end = jobs.last().map_or(0, |job| job.end);
    // Publish: apply every record, in journal order.
    let mut applied: Vec<(Arc<MlState>, Applied)> = Vec::new();
    let mut first_error: Option<Error> = None;
    for job in &jobs {
        for s in &job.staged {
            let Some(ml) = &s.ml else { continue };
            let mut acc = Applied::default();
            for r in &s.recs {
                if r.kind == Kind::MlCreate {
                    ml.created.store(CREATED, Ordering::Release);
                }
                let head = journal::Head {
                    kind: r.kind,
                    lac: 0,
                    ml: ml.id,
                    a: r.a,
                    b: r.b,
                    body_len: r.body_len,
                    body_crc: r.crc,
                };
                match ml.apply(r.at, &head, &r.body) {
                    Ok(a) => {
                        acc.dropped.extend(a.dropped);
                        acc.appended |= a.appended;
                    }
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            }
            applied.push((Arc::clone(ml), acc));
        }
    }
    if end > 0 {
        j.synced.fetch_max(end, Ordering::AcqRel);
        j.write_hint(j.synced.load(Ordering::Acquire));
    }
    j.publisher.published(end, applied);
    let mut released = 0;
    for job in jobs {
        for s in job.staged {
            released += s.bytes;
            match &first_error {
                // A record that cannot apply to the published state is a bug;
                // report it rather than acknowledging.
                Some(e) => s.done.complete(Err(e.clone())),
                None => s.done.complete(Ok(s.positions)),
            }
        }
    }
    j.publisher.released(released);
    Ok(())
}
