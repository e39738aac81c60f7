//! The writer thread: group commit.
//!
//! Appends queue on a channel. The thread takes everything queued (up to
//! `max_batch_bytes`), frames it into one buffer, writes it with one
//! `pwrite`, syncs once, publishes the entries to readers and completes
//! the callers in order. While it syncs, new appends queue up and form the
//! next group, so concurrent appenders share syncs without any timer.

use super::fault::FaultKind;
use super::segment::{
    datasync, encode_header, encode_record, encode_synced, preallocate, segment_path, sync_dir,
    synced_path, Segment, SegmentIndex, HEADER_LEN, RECORD_HEADER_LEN,
};
use super::Shared;
use crate::error::{Error, Result};
use crate::position::Position;
use crate::sink::AppendCallback;
use crossbeam_channel::{Receiver, Sender};
use parking_lot::RwLock;
use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::sync::Arc;

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
    fn complete(self, r: Result<Vec<Position>>) {
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
    /// End of synced data; the next write goes here.
    write_off: u64,
    /// End of the preallocated region.
    alloc_end: u64,
    entries: u64,
    /// `<id>.synced`: where read-only readers in other processes learn
    /// how far the file is durable (they must not serve bytes a failed
    /// sync may still take back). A hint only, never synced itself: after
    /// a crash the ledger is sealed and the hint removed.
    synced_hint: File,
}

/// An append staged in the current group: its done and first entry id.
struct Staged {
    done: Done,
    first: u64,
    n: u64,
}

pub(crate) struct WriterThread {
    shared: Arc<Shared>,
    rx: Receiver<Command>,
    active: Option<Active>,
    /// Commands taken off the channel but not yet handled.
    deferred: VecDeque<Command>,
    buf: Vec<u8>,
    /// Set when a failed group could not be cut off the file: appending
    /// more could expose its bytes, so every later append fails until reopen.
    poisoned: Option<Error>,
}

fn io_err(seg: &Segment, what: &str, e: &std::io::Error) -> Error {
    Error::io(format!("{what} ledger file {}", seg.path.display()), e)
}

impl WriterThread {
    pub fn new(shared: Arc<Shared>, rx: Receiver<Command>) -> Self {
        Self {
            shared,
            rx,
            active: None,
            deferred: VecDeque::new(),
            buf: Vec::new(),
            poisoned: None,
        }
    }

    fn next(&mut self) -> Option<Command> {
        match self.deferred.pop_front() {
            Some(c) => Some(c),
            None => self.rx.recv().ok(),
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
                    while bytes < self.shared.opts.max_batch_bytes {
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
                    let _ = done.send(r);
                    return;
                }
            }
        }
        // Every sender is gone without a Close (the handle was leaked):
        // still leave the ledger sealed.
        let _ = self.seal_active();
    }

    fn append_group(&mut self, group: Vec<(Vec<Vec<u8>>, Done)>) {
        if let Some(e) = self.poisoned.clone() {
            return self.fail_group(Vec::new(), group.into_iter(), &e);
        }
        let max_entries = self.shared.opts.max_entries_per_ledger;
        let max_bytes = self.shared.opts.max_bytes_per_ledger;
        let mut staged: Vec<Staged> = Vec::new();
        let mut staged_n = 0u64;
        self.buf.clear();
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
                    let b = a.write_off - HEADER_LEN + self.buf.len() as u64;
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
            for e in &entries {
                encode_record(&mut self.buf, e);
            }
            staged_n += entries.len() as u64;
            staged.push(Staged {
                done,
                first,
                n: entries.len() as u64,
            });
        }
        if let Err(e) = self.commit(&mut staged) {
            self.fail_group(staged, std::iter::empty(), &e);
        }
    }

    /// Fails the staged group, the rest of the batch and every append
    /// queued right now with `e`. The queue is drained BEFORE anyone is told:
    /// a caller that sees the error and appends again must not be failed by
    /// this fault.
    fn fail_group(
        &mut self,
        staged: Vec<Staged>,
        rest: impl Iterator<Item = (Vec<Vec<u8>>, Done)>,
        e: &Error,
    ) {
        let mut queued = Vec::new();
        let mut keep = VecDeque::new();
        while let Some(cmd) = self.try_next() {
            match cmd {
                Command::Append { done, .. } => queued.push(done),
                other => keep.push_back(other),
            }
        }
        self.deferred = keep;
        let rest: Vec<Done> = rest.map(|(_, d)| d).collect();
        for done in staged.into_iter().map(|s| s.done).chain(rest).chain(queued) {
            done.complete(Err(e.clone()));
        }
    }

    /// Writes and syncs the staged group, publishes it, completes callers.
    /// On failure the file is cut back to the last synced offset and the
    /// group is left in `staged` for [`fail_group`](Self::fail_group).
    fn commit(&mut self, staged: &mut Vec<Staged>) -> Result<()> {
        if staged.is_empty() {
            return Ok(());
        }
        let Some(a) = self.active.as_mut() else {
            return Err(Error::invalid("no open ledger to commit to"));
        };
        let res = write_and_sync(&self.shared, a, &self.buf);
        if let Err(e) = res {
            // Unacknowledged bytes must not survive to be read back later
            // (a later sync would make them durable): cut them off.
            match a.seg.file.set_len(a.write_off) {
                Ok(()) => a.alloc_end = a.write_off,
                Err(te) => self.poisoned = Some(io_err(&a.seg, "truncating failed write in", &te)),
            }
            self.buf.clear();
            return Err(e);
        }
        let base = a.write_off;
        {
            let mut idx = a.seg.index.write();
            let mut off = 0usize;
            while off < self.buf.len() {
                let mut l = [0u8; 4];
                l.copy_from_slice(&self.buf[off..off + 4]);
                let len = u32::from_le_bytes(l);
                idx.offsets.push(base + off as u64);
                idx.lens.push(len);
                off += RECORD_HEADER_LEN + len as usize;
            }
            idx.end = base + self.buf.len() as u64;
        }
        a.write_off += self.buf.len() as u64;
        // Publish the durable end before anyone is acknowledged; a failed
        // hint write only makes readers lag.
        let _ = a.synced_hint.write_all_at(&encode_synced(a.write_off), 0);
        let id = a.seg.id;
        for s in staged.drain(..) {
            a.entries += s.n;
            let ps = (s.first..s.first + s.n)
                .map(|e| Position::new(id, e))
                .collect();
            s.done.complete(Ok(ps));
        }
        self.buf.clear();
        Ok(())
    }

    /// Seals the open ledger: cut the preallocated tail, fsync.
    fn seal_active(&mut self) -> Result<()> {
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
            synced_hint: hint,
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

/// Preallocates if needed, writes `buf` at the write offset and syncs.
fn write_and_sync(shared: &Shared, a: &mut Active, buf: &[u8]) -> Result<()> {
    let seg = &a.seg;
    let off = a.write_off;
    let end = off + buf.len() as u64;
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
    if let Err(e) = shared.faults.check(FaultKind::Write) {
        // Simulate a short write followed by the failure.
        let _ = seg.file.write_all_at(&buf[..buf.len() / 2], off);
        return Err(io_err(seg, "writing", &e));
    }
    // Large groups go out in chunks, each handed to writeback at once, so
    // the disk works while the rest is still being copied and the final
    // sync has little left to wait for.
    let mut at = 0usize;
    for chunk in buf.chunks(WRITEBACK_CHUNK) {
        let pos = off + at as u64;
        seg.file
            .write_all_at(chunk, pos)
            .map_err(|e| io_err(seg, "writing", &e))?;
        at += chunk.len();
        if buf.len() > WRITEBACK_CHUNK {
            start_writeback(&seg.file, pos, chunk.len() as u64);
        }
    }
    shared
        .faults
        .check(FaultKind::Sync)
        .and_then(|()| datasync(&seg.file))
        .map_err(|e| io_err(seg, "syncing", &e))
}

/// Groups larger than this are written in chunks of this size.
const WRITEBACK_CHUNK: usize = 1 << 20;

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
