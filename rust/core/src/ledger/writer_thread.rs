//! The writer thread: group commit, pipelined with the sync thread.
//!
//! Appends queue on a channel. The writer thread takes everything queued
//! (up to `max_batch_bytes`), frames it and writes it at the end of the open
//! ledger with one `pwritev`: record headers and small payloads are copied
//! into one buffer, payloads of [`BIG_PAYLOAD`] bytes or more are written
//! straight from the callers' buffers. It then hands the written group to
//! the sync thread ([`super::sync_thread`]) and takes the next group at
//! once, so group N+1 is written while group N is being synced (a group of
//! less than [`PIPELINE_MIN_BYTES`] first waits for the running sync to end,
//! gathering what queues meanwhile: the sync, not the write, is its cost):
//!
//! ```text
//! writer thread:  write N | write N+1 | write N+2 ...
//! sync thread:            | fdatasync N ........ | fdatasync N+1,N+2 | ...
//! ```
//!
//! The sync thread takes every group handed to it so far, syncs once (it
//! covers everything written before the call), publishes the groups to
//! readers (the index, then the `.synced` hint) and only then completes
//! their callers, in append order. So nobody is acknowledged, and no reader
//! sees an entry, before its bytes are durable; concurrent appenders share
//! syncs without any timer.
//!
//! Failures. A failed write (on the writer thread) or sync (on the sync
//! thread) fails every group not yet known durable: the sync thread gives
//! the callers of the failed group and of every group handed to it later
//! back, and wakes the writer thread. That one waits until the sync thread
//! is idle, cuts the file back to the last synced offset (so failed bytes
//! never resurface: a later sync would make them durable), takes every
//! append queued at that moment, and only then fails, in append order, the
//! given-back groups, its own group and the queued appends — a caller that
//! sees the error and appends again is not failed by the same fault.
//! A small group while no sync is running is synced by the writer thread
//! itself, the same way, sparing a lone appender a thread hand-off.
//! Rollover, sealing, compaction and close first wait until every written
//! group is synced (or failed), so a sync never spans two files' lifetimes
//! and close drains everything.

use super::fault::FaultKind;
use super::segment::{
    encode_header, encode_record, encode_record_header, encode_synced, preallocate, segment_path,
    sync_dir, synced_path, Segment, SegmentIndex, HEADER_LEN, RECORD_HEADER_LEN,
};
use super::sync_thread::{self, Pipeline, SyncJob};
use super::Shared;
use crate::error::{Error, Result};
use crate::position::Position;
use crate::sink::AppendCallback;
use crossbeam_channel::{Receiver, Sender};
use parking_lot::RwLock;
use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::sync::Arc;
use std::thread::JoinHandle;

/// How an append's caller learns the outcome.
pub(crate) enum Done {
    /// One entry, a callback (the `EntrySink` path).
    Callback(AppendCallback),
    /// Any number of entries, a callback with all positions.
    Batch(Box<dyn FnOnce(Result<Vec<Position>>) + Send>),
    /// A blocked caller.
    Waiter(Sender<Result<Vec<Position>>>),
}

impl Done {
    pub(crate) fn complete(self, r: Result<Vec<Position>>) {
        match self {
            Done::Callback(cb) => cb(r.and_then(|v| {
                v.first()
                    .copied()
                    .ok_or_else(|| Error::invalid("append completed without a position"))
            })),
            Done::Batch(cb) => cb(r),
            Done::Waiter(tx) => {
                // The waiter may have gone away; nothing to tell then.
                let _ = tx.send(r);
            }
        }
    }
}

pub(crate) enum Command {
    Append {
        entries: Vec<Vec<u8>>,
        done: Done,
    },
    /// Compaction: replace every ledger by one holding `entries`.
    Replace {
        entries: Vec<Vec<u8>>,
        done: Sender<Result<Vec<Position>>>,
    },
    /// Seal and stop; always the last command.
    Close {
        done: Sender<Result<()>>,
    },
}

impl Command {
    pub fn fail(self, e: &Error) {
        match self {
            Command::Append { done, .. } => done.complete(Err(e.clone())),
            Command::Replace { done, .. } => {
                let _ = done.send(Err(e.clone()));
            }
            Command::Close { done } => {
                let _ = done.send(Err(e.clone()));
            }
        }
    }
}

/// The ledger being appended to.
struct Active {
    seg: Arc<Segment>,
    /// End of written data (synced or in flight); the next write goes here.
    write_off: u64,
    /// End of the preallocated region.
    alloc_end: u64,
    /// Entries written (synced or in flight).
    entries: u64,
    /// `<id>.synced`: where read-only readers in other processes learn
    /// how far the file is durable (they must not serve bytes a failed
    /// sync may still take back). A hint only, never synced itself: after
    /// a crash the ledger is sealed and the hint removed. Written by the
    /// sync thread.
    synced_hint: Arc<File>,
}

/// An append in a group: its done and its entry ids.
pub(crate) struct Staged {
    pub done: Done,
    pub first: u64,
    pub n: u64,
}

/// Payloads of at least this many bytes are written from the caller's
/// buffer instead of being copied into the group buffer.
pub(crate) const BIG_PAYLOAD: usize = 16 << 10;

/// A group smaller than this waits for the running sync to end (taking
/// in what queues meanwhile) instead of being written during it: writing
/// it early saves little, and waking the writer thread for every small
/// append costs the appenders more.
const PIPELINE_MIN_BYTES: usize = 64 << 10;

/// Most buffers per `pwritev` (Linux `IOV_MAX`).
const MAX_IOV: usize = 1024;

/// Groups larger than this are written in chunks of this size.
const WRITEBACK_CHUNK: usize = 1 << 20;

enum Piece {
    /// `small[start..end]`.
    Small(usize, usize),
    /// `big[i]`.
    Big(usize),
}

/// The framed records of one group, in file order.
#[derive(Default)]
struct GroupBuf {
    /// Record headers and small payloads.
    small: Vec<u8>,
    /// Large payloads, owned until written.
    big: Vec<Vec<u8>>,
    pieces: Vec<Piece>,
    /// End of `small` covered by `pieces`.
    small_done: usize,
    /// Offset (from the group start) and payload length of each record.
    offsets: Vec<u64>,
    lens: Vec<u32>,
    len: usize,
}

impl GroupBuf {
    fn push(&mut self, payload: Vec<u8>) {
        self.offsets.push(self.len as u64);
        self.lens.push(payload.len() as u32);
        self.len += RECORD_HEADER_LEN + payload.len();
        encode_record_header(&mut self.small, &payload);
        if payload.len() >= BIG_PAYLOAD {
            self.close_small();
            self.pieces.push(Piece::Big(self.big.len()));
            self.big.push(payload);
        } else {
            self.small.extend_from_slice(&payload);
        }
    }

    fn close_small(&mut self) {
        let end = self.small.len();
        // Copied runs are cut into writeback chunks too.
        while self.small_done < end {
            let to = end.min(self.small_done + WRITEBACK_CHUNK);
            self.pieces.push(Piece::Small(self.small_done, to));
            self.small_done = to;
        }
    }

    /// The group's bytes as slices, in file order (after `close_small`).
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
        self.offsets.clear();
        self.lens.clear();
        self.len = 0;
    }
}

pub(crate) struct WriterThread {
    shared: Arc<Shared>,
    rx: Receiver<Command>,
    active: Option<Active>,
    /// Commands taken off the channel but not yet handled.
    deferred: VecDeque<Command>,
    group: GroupBuf,
    /// Set when a failed group could not be cut off the file: appending
    /// more could expose its bytes, so every later append fails until reopen.
    poisoned: Option<Error>,
    pipe: Arc<Pipeline>,
    /// Written groups to the sync thread; dropped to stop it.
    jobs: Option<Sender<SyncJob>>,
    /// A sync failed (see the module doc).
    wake: Receiver<()>,
    sync_thread: Option<JoinHandle<()>>,
}

fn io_err(seg: &Segment, what: &str, e: &io::Error) -> Error {
    Error::io(format!("{what} ledger file {}", seg.path.display()), e)
}

enum Event {
    Command(Option<Command>),
    Wake,
}

impl WriterThread {
    /// A writer thread (to be run) and its running sync thread.
    pub fn new(shared: Arc<Shared>, rx: Receiver<Command>) -> io::Result<Self> {
        let pipe = Arc::new(Pipeline::default());
        let (jobs_tx, jobs_rx) = crossbeam_channel::unbounded();
        let (wake_tx, wake_rx) = crossbeam_channel::bounded(1);
        let sync = sync_thread::spawn(Arc::clone(&shared), Arc::clone(&pipe), jobs_rx, wake_tx)?;
        Ok(Self {
            shared,
            rx,
            active: None,
            deferred: VecDeque::new(),
            group: GroupBuf::default(),
            poisoned: None,
            pipe,
            jobs: Some(jobs_tx),
            wake: wake_rx,
            sync_thread: Some(sync),
        })
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
                        self.fail_group(Vec::new(), std::iter::empty(), &e);
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

    pub fn run(mut self) {
        while let Some(cmd) = self.next() {
            match cmd {
                Command::Append { entries, done } => {
                    let mut bytes: usize = entries.iter().map(Vec::len).sum();
                    let mut group = vec![(entries, done)];
                    let max = self.shared.opts.max_batch_bytes;
                    if bytes < PIPELINE_MIN_BYTES {
                        // A small group gains nothing from being written
                        // during the running sync: let appends queue (no
                        // wake-up for their senders) until it ends. A
                        // failure it reports is handled by append_group.
                        let _ = self.pipe.wait_idle();
                    }
                    while bytes < max {
                        match self.try_next() {
                            Some(Command::Append { entries, done }) => {
                                bytes += entries.iter().map(Vec::len).sum::<usize>();
                                group.push((entries, done));
                            }
                            Some(other) => {
                                self.deferred.push_front(other);
                                break;
                            }
                            None => break,
                        }
                    }
                    self.append_group(group);
                }
                Command::Replace { entries, done } => {
                    let _ = done.send(self.replace(entries));
                }
                Command::Close { done } => {
                    let r = self.seal_active();
                    self.stop_sync_thread();
                    let _ = done.send(r);
                    return;
                }
            }
        }
        // Every sender is gone without a Close (the handle was leaked):
        // still leave the ledger sealed.
        let _ = self.seal_active();
        self.stop_sync_thread();
    }

    fn stop_sync_thread(&mut self) {
        self.jobs = None;
        if let Some(t) = self.sync_thread.take() {
            let _ = t.join();
        }
    }

    fn append_group(&mut self, group: Vec<(Vec<Vec<u8>>, Done)>) {
        if let Some(e) = self.poisoned.clone().or_else(|| self.pipe.failure()) {
            return self.fail_group(Vec::new(), group.into_iter(), &e);
        }
        let max_entries = self.shared.opts.max_entries_per_ledger;
        let max_bytes = self.shared.opts.max_bytes_per_ledger;
        let mut staged: Vec<Staged> = Vec::new();
        let mut staged_n = 0u64;
        self.group.clear();
        let mut it = group.into_iter();
        while let Some((entries, done)) = it.next() {
            let bytes: u64 = entries
                .iter()
                .map(|e| (e.len() + RECORD_HEADER_LEN) as u64)
                .sum();
            let roll = match &self.active {
                None => true,
                Some(a) => {
                    let n = a.entries + staged_n;
                    let b = a.write_off - HEADER_LEN + self.group.len as u64;
                    n > 0 && (n + entries.len() as u64 > max_entries || b + bytes > max_bytes)
                }
            };
            if roll {
                let r = self.commit(&mut staged).and_then(|()| self.roll());
                if let Err(e) = r {
                    let rest = std::iter::once((entries, done)).chain(it);
                    return self.fail_group(staged, rest, &e);
                }
                staged_n = 0;
            }
            let Some(a) = &self.active else {
                // roll() succeeded, so a ledger is open.
                done.complete(Err(Error::invalid("no open ledger after rollover")));
                continue;
            };
            let first = a.entries + staged_n;
            let n = entries.len() as u64;
            for e in entries {
                self.group.push(e);
            }
            staged_n += n;
            staged.push(Staged { done, first, n });
        }
        if let Err(e) = self.commit(&mut staged) {
            self.fail_group(staged, std::iter::empty(), &e);
        }
    }

    /// Fails, in append order: the groups a failed sync gave back, the
    /// staged group, the rest of the batch and every append queued right
    /// now, with `e` (the given-back ones with the sync's error). Waits for
    /// the sync thread first and cuts the open ledger back to its synced
    /// end. The queue is drained BEFORE anyone is told: a caller that sees
    /// the error and appends again must not be failed by this fault.
    fn fail_group(
        &mut self,
        staged: Vec<Staged>,
        rest: impl Iterator<Item = (Vec<Vec<u8>>, Done)>,
        e: &Error,
    ) {
        let given_back = self.pipe.take_failure();
        self.group.clear();
        if let Some(a) = self.active.as_mut() {
            // Unacknowledged bytes must not survive to be read back later
            // (a later sync would make them durable): cut them off.
            let (end, count) = {
                let idx = a.seg.index.read();
                (idx.end, idx.count())
            };
            a.write_off = end;
            a.entries = count;
            match a.seg.file.set_len(end) {
                Ok(()) => a.alloc_end = end,
                Err(te) => self.poisoned = Some(io_err(&a.seg, "truncating failed write in", &te)),
            }
        }
        let mut queued = Vec::new();
        let mut keep = VecDeque::new();
        while let Some(cmd) = self.try_next() {
            match cmd {
                Command::Append { done, .. } => queued.push(done),
                other => keep.push_back(other),
            }
        }
        self.deferred = keep;
        if let Some((se, back)) = given_back {
            for s in back {
                s.done.complete(Err(se.clone()));
            }
        }
        let rest: Vec<Done> = rest.map(|(_, d)| d).collect();
        for done in staged.into_iter().map(|s| s.done).chain(rest).chain(queued) {
            done.complete(Err(e.clone()));
        }
    }

    /// Writes the staged group and hands it to the sync thread (a small group
    /// with no sync running is synced right here). On failure
    /// the group is left in `staged` for [`fail_group`](Self::fail_group),
    /// which cuts the file back.
    fn commit(&mut self, staged: &mut Vec<Staged>) -> Result<()> {
        if staged.is_empty() {
            return Ok(());
        }
        let Some(a) = self.active.as_mut() else {
            return Err(Error::invalid("no open ledger to commit to"));
        };
        self.group.close_small();
        let written = write_group(&self.shared, a, &self.group);
        let base = a.write_off;
        let len = self.group.len as u64;
        let offsets = self.group.offsets.iter().map(|o| base + o).collect();
        let lens = std::mem::take(&mut self.group.lens);
        self.group.clear();
        written?;
        a.write_off += len;
        a.entries += staged.iter().map(|s| s.n).sum::<u64>();
        // A group must never be synced past the bytes of a failed one
        // (they would become durable): fail_group cuts them off first.
        let inline = len < PIPELINE_MIN_BYTES as u64 && self.pipe.is_idle()?;
        let job = SyncJob {
            seg: Arc::clone(&a.seg),
            hint: Arc::clone(&a.synced_hint),
            offsets,
            lens,
            end: a.write_off,
            staged: std::mem::take(staged),
        };
        if inline {
            // Nothing to overlap with: sync here and spare the appender a
            // thread hand-off (the latency of a lone append).
            return sync_thread::sync_and_complete(&self.shared, vec![job]).map_err(|(e, jobs)| {
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
            // The sync thread is gone (it never stops before this thread).
            *staged = job.staged;
            self.pipe.settled(1);
            return Err(Error::LedgerClosed(self.shared.name.clone()));
        }
        Ok(())
    }

    /// Seals the open ledger once every written group is settled (a
    /// failed sync is handled first): cut the preallocated tail, fsync.
    fn seal_active(&mut self) -> Result<()> {
        if let Some(e) = self.pipe.wait_idle() {
            self.fail_group(Vec::new(), std::iter::empty(), &e);
        }
        let Some(a) = self.active.take() else {
            return Ok(());
        };
        {
            let mut m = self.shared.meta.lock();
            if m.active == Some(a.seg.id) {
                m.active = None;
            }
        }
        a.seg
            .file
            .set_len(a.write_off)
            .and_then(|()| a.seg.file.sync_all())
            .map_err(|e| io_err(&a.seg, "sealing", &e))?;
        // The file now ends at its last synced record: readers need no hint.
        let _ = fs::remove_file(synced_path(&self.shared.dir, a.seg.id));
        Ok(())
    }

    /// Creates ledger file `id` holding `records` (framed), preallocating
    /// `extra` bytes after them, synced with its directory entry.
    fn create_segment(&self, id: u64, records: &[u8], extra: u64) -> Result<(Arc<Segment>, u64)> {
        let dir = &self.shared.dir;
        let path = segment_path(dir, id);
        let ctx = |what: &str, e: &std::io::Error| {
            Error::io(format!("{what} ledger file {}", path.display()), e)
        };
        let file: File = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(|e| ctx("creating", &e))?;
        let data_end = HEADER_LEN + records.len() as u64;
        let result = (|| {
            let alloc_end = if extra > 0 {
                self.shared
                    .faults
                    .check(FaultKind::Preallocate)
                    .and_then(|()| preallocate(&file, 0, data_end + extra))
                    .map_err(|e| ctx("preallocating", &e))?;
                data_end + extra
            } else {
                data_end
            };
            let mut head = encode_header(id).to_vec();
            head.extend_from_slice(records);
            file.write_all_at(&head, 0)
                .map_err(|e| ctx("writing", &e))?;
            file.sync_all().map_err(|e| ctx("syncing", &e))?;
            sync_dir(dir)?;
            Ok(alloc_end)
        })();
        match result {
            Ok(alloc_end) => Ok((
                Arc::new(Segment {
                    id,
                    path: path.clone(),
                    file,
                    index: RwLock::new(SegmentIndex {
                        end: HEADER_LEN,
                        ..SegmentIndex::default()
                    }),
                }),
                alloc_end,
            )),
            Err(e) => {
                let _ = fs::remove_file(&path);
                Err(e)
            }
        }
    }

    /// Seals the open ledger and opens a new one, listed in META before
    /// anything is appended to it.
    fn roll(&mut self) -> Result<()> {
        // A failed sync fails the group being formed too (see fail_group).
        if let Some(e) = self.pipe.wait_idle() {
            return Err(e);
        }
        self.seal_active()?;
        let id = self.shared.meta.lock().next_ledger_id;
        let (seg, alloc_end) = self.create_segment(id, &[], self.shared.opts.preallocate_bytes)?;
        // The hint exists before META lists the ledger, so a reader that
        // sees it open always finds one.
        let hint_path = synced_path(&self.shared.dir, id);
        let hint = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&hint_path)
            .and_then(|f| f.write_all_at(&encode_synced(HEADER_LEN), 0).map(|()| f))
            .map_err(|e| Error::io(format!("creating {}", hint_path.display()), &e));
        let hint = match hint {
            Ok(f) => f,
            Err(e) => {
                let _ = fs::remove_file(&hint_path);
                let _ = fs::remove_file(&seg.path);
                return Err(e);
            }
        };
        let mut m = self.shared.meta.lock();
        self.shared.ledgers.write().insert(id, Arc::clone(&seg));
        m.active = Some(id);
        m.next_ledger_id = id + 1;
        if let Err(e) = self.shared.write_meta_locked(&m) {
            self.shared.ledgers.write().remove(&id);
            m.active = None;
            // The id is reused by the next attempt (its file is recreated),
            // so a file left behind stays a provable leftover (>= next id).
            m.next_ledger_id = id;
            drop(m);
            let _ = fs::remove_file(&seg.path);
            let _ = fs::remove_file(&hint_path);
            return Err(e);
        }
        self.active = Some(Active {
            seg,
            write_off: HEADER_LEN,
            alloc_end,
            entries: 0,
            synced_hint: Arc::new(hint),
        });
        Ok(())
    }

    fn replace(&mut self, entries: Vec<Vec<u8>>) -> Result<Vec<Position>> {
        self.seal_active()?;
        let id = self.shared.meta.lock().next_ledger_id;
        let mut buf = Vec::with_capacity(entries.iter().map(|e| e.len() + RECORD_HEADER_LEN).sum());
        for e in &entries {
            encode_record(&mut buf, e);
        }
        let (seg, _) = self.create_segment(id, &buf, 0)?;
        {
            let mut idx = seg.index.write();
            let mut off = HEADER_LEN;
            for e in &entries {
                idx.offsets.push(off);
                idx.lens.push(e.len() as u32);
                off += (e.len() + RECORD_HEADER_LEN) as u64;
            }
            idx.end = off;
        }
        let mut m = self.shared.meta.lock();
        let old = {
            let mut ledgers = self.shared.ledgers.write();
            let old = std::mem::take(&mut *ledgers);
            ledgers.insert(id, Arc::clone(&seg));
            old
        };
        m.next_ledger_id = id + 1;
        m.active = None;
        if let Err(e) = self.shared.write_meta_locked(&m) {
            m.next_ledger_id = id;
            *self.shared.ledgers.write() = old;
            drop(m);
            let _ = fs::remove_file(&seg.path);
            return Err(e);
        }
        drop(m);
        for oid in old.keys() {
            let _ = fs::remove_file(segment_path(&self.shared.dir, *oid));
        }
        Ok((0..entries.len() as u64)
            .map(|e| Position::new(id, e))
            .collect())
    }
}

/// Preallocates if needed and writes the group at the write offset.
fn write_group(shared: &Shared, a: &mut Active, group: &GroupBuf) -> Result<()> {
    let seg = &a.seg;
    let off = a.write_off;
    let end = off + group.len as u64;
    let chunk = shared.opts.preallocate_bytes;
    if chunk > 0 && end > a.alloc_end {
        let target = end.max(a.alloc_end + chunk);
        shared
            .faults
            .check(FaultKind::Preallocate)
            .and_then(|()| preallocate(&seg.file, a.alloc_end, target - a.alloc_end))
            .map_err(|e| io_err(seg, "preallocating", &e))?;
        a.alloc_end = target;
    }
    let slices = group.slices();
    if let Err(e) = shared.faults.check(FaultKind::Write) {
        // Simulate a short write followed by the failure.
        let all = slices.concat();
        let _ = seg.file.write_all_at(&all[..all.len() / 2], off);
        return Err(io_err(seg, "writing", &e));
    }
    // Large groups go out in chunks, each handed to writeback at once, so
    // the disk works while the rest is still being written and the sync
    // has little left to wait for.
    let chunked = group.len > WRITEBACK_CHUNK;
    let mut pos = off;
    let mut i = 0;
    while i < slices.len() {
        let mut j = i;
        let mut bytes = 0usize;
        while j < slices.len() && j - i < MAX_IOV && bytes < WRITEBACK_CHUNK {
            bytes += slices[j].len();
            j += 1;
        }
        pwritev_all(&seg.file, &slices[i..j], pos).map_err(|e| io_err(seg, "writing", &e))?;
        if chunked {
            start_writeback(&seg.file, pos, bytes as u64);
        }
        pos += bytes as u64;
        i = j;
    }
    Ok(())
}

/// Writes `bufs` back to back at `off`, retrying short writes.
fn pwritev_all(file: &File, bufs: &[&[u8]], mut off: u64) -> io::Result<()> {
    let mut left: Vec<&[u8]> = bufs.iter().copied().filter(|b| !b.is_empty()).collect();
    let mut first = 0;
    while first < left.len() {
        let iov: Vec<libc::iovec> = left[first..]
            .iter()
            .map(|b| libc::iovec {
                iov_base: b.as_ptr() as *mut libc::c_void,
                iov_len: b.len(),
            })
            .collect();
        // SAFETY: every iovec points into a live slice borrowed for the whole
        // call, the count is the array's length (<= IOV_MAX), and pwritev
        // only reads from them; the descriptor is owned by `file`.
        let n = unsafe {
            libc::pwritev(
                file.as_raw_fd(),
                iov.as_ptr(),
                iov.len() as libc::c_int,
                off as libc::off_t,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        let mut n = n as usize;
        off += n as u64;
        while n > 0 && first < left.len() {
            let l = left[first].len();
            if n >= l {
                n -= l;
                first += 1;
            } else {
                left[first] = &left[first][n..];
                n = 0;
            }
        }
    }
    Ok(())
}

/// Asks the kernel to start writing `[off, off+len)` back now, without
/// waiting. Purely a hint: durability still comes from the `fdatasync`.
fn start_writeback(file: &File, off: u64, len: u64) {
    // SAFETY: plain syscall on a valid descriptor we own; no memory is shared.
    unsafe {
        libc::sync_file_range(
            file.as_raw_fd(),
            off as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        );
    }
}
