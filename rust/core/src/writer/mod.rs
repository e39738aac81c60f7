//! `BufferedWriter`: batched writes of the transaction log and pending-ack
//! logs (PIP-160, SPEC §4.2).
//!
//! Records are framed into one batched entry as they arrive (no copy at
//! flush time) and the entry is handed to an [`EntrySink`] when ANY of
//! `max_records`, `max_size` or `max_delay` is reached. Each record then
//! completes with `(position, batch_size, batch_index)`, in submission order:
//! storage completes entries in append order and the writer completes the
//! records of an entry in index order.
//!
//! Threads: none per writer. The delay timer is one process-wide thread
//! ([`timer`]); completions run on the sink's thread (callbacks must be
//! quick, as for [`EntrySink`]).

mod config;
mod defer;
mod stats;
mod timer;

pub use config::{WriterConfig, DEFAULT_MAX_DELAY, DEFAULT_MAX_RECORDS, DEFAULT_MAX_SIZE};
pub use stats::{
    FlushTrigger, HistogramSnapshot, WriterStats, BATCH_RECORDS_BUCKETS, BATCH_SIZE_BYTES_BUCKETS,
    OLDEST_RECORD_DELAY_BUCKETS,
};

use crate::error::{Error, Result};
use crate::frame;
use crate::position::{Position, TxnPosition};
use crate::sink::EntrySink;
use crate::sync::{Condvar, Mutex};
use stats::Metrics;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use timer::{Scheduler, Timed};

/// Completion of one record written with [`BufferedWriter::write`].
pub type RecordCallback = Box<dyn FnOnce(Result<TxnPosition>) + Send + 'static>;
/// Completion of all records of one [`BufferedWriter::write_many`] call.
pub type ManyCallback = Box<dyn FnOnce(Result<Vec<TxnPosition>>) + Send + 'static>;

/// The records of one `write_many` call, completed once all entries
/// holding them are durable (or failed: then with the first error).
struct ManyRequest {
    inner: Mutex<ManyInner>,
}

struct ManyInner {
    positions: Vec<TxnPosition>,
    remaining: usize,
    error: Option<Error>,
    done: Option<ManyCallback>,
}

impl ManyRequest {
    fn new(n: usize, done: ManyCallback) -> Self {
        Self {
            inner: Mutex::new(ManyInner {
                positions: vec![TxnPosition::single(Position::default()); n],
                remaining: n,
                error: None,
                done: Some(done),
            }),
        }
    }

    /// Records `start..start+count` of the request sit at batch indexes
    /// `first_index..` of the entry that completed with `res`.
    fn finish_part(
        &self,
        start: usize,
        count: u32,
        res: &Result<Position>,
        batch_size: u32,
        first_index: u32,
    ) {
        let finished = {
            let mut g = self.inner.lock();
            match res {
                Ok(p) => {
                    let slots = &mut g.positions[start..start + count as usize];
                    for (k, slot) in slots.iter_mut().enumerate() {
                        *slot = TxnPosition {
                            position: *p,
                            batch_size,
                            batch_index: first_index + k as u32,
                        };
                    }
                }
                Err(e) => {
                    g.error.get_or_insert_with(|| e.clone());
                }
            }
            g.remaining -= count as usize;
            if g.remaining == 0 {
                let positions = std::mem::take(&mut g.positions);
                let result = match g.error.take() {
                    Some(e) => Err(e),
                    None => Ok(positions),
                };
                g.done.take().map(|d| (d, result))
            } else {
                None
            }
        };
        if let Some((done, result)) = finished {
            done(result);
        }
    }
}

/// Who waits for which records of an entry (in batch-index order).
enum Waiter {
    One(RecordCallback),
    Part {
        req: Arc<ManyRequest>,
        start: usize,
        count: u32,
    },
}

impl Waiter {
    fn records(&self) -> u32 {
        match self {
            Waiter::One(_) => 1,
            Waiter::Part { count, .. } => *count,
        }
    }
}

/// Completes `waiters` of an entry of `batch_size` records with `res`.
fn complete_waiters(waiters: Vec<Waiter>, res: &Result<Position>, batch_size: u32) {
    let mut index = 0u32;
    for w in waiters {
        match w {
            Waiter::One(cb) => {
                cb(res.clone().map(|position| TxnPosition {
                    position,
                    batch_size,
                    batch_index: index,
                }));
                index += 1;
            }
            Waiter::Part { req, start, count } => {
                req.finish_part(start, count, res, batch_size, index);
                index += count;
            }
        }
    }
}

/// The batch being filled: an entry encoded in place.
#[derive(Default)]
struct Batch {
    entry: Vec<u8>,
    records: u32,
    bytes: usize,
    first_at: Option<Instant>,
    waiters: Vec<Waiter>,
}

impl Batch {
    fn push(&mut self, record: &[u8], capacity_hint: usize) {
        if self.records == 0 {
            self.entry.reserve(capacity_hint.max(64));
            frame::begin_batch(&mut self.entry);
            self.first_at = Some(Instant::now());
        }
        frame::push_record(&mut self.entry, record);
        self.records += 1;
        self.bytes += record.len();
    }
}

struct State {
    cfg: WriterConfig,
    closed: bool,
    batch: Batch,
    /// The deadline this writer has queued in the scheduler, if any.
    timer_at: Option<Instant>,
    /// Size of the last batched entry: the next one reserves that much.
    last_entry_len: usize,
}

/// Where a record goes.
enum Route {
    Alone,
    Batch,
}

struct Inner {
    name: String,
    sink: Arc<dyn EntrySink>,
    state: Mutex<State>,
    metrics: Metrics,
    /// Mirrors of state fields for lock-free `stats()`.
    batch_enabled: AtomicBool,
    pending: AtomicU64,
    in_flight: Mutex<u64>,
    idle: Condvar,
    scheduler: &'static Scheduler,
    me: Weak<Inner>,
    /// The fork generation it was made in: a child process has neither its
    /// timer thread nor its sink's threads, so it refuses writes there.
    generation: u64,
}

impl Inner {
    fn route(self: &Arc<Self>, st: &mut State, len: usize) -> Route {
        if !st.cfg.batching() {
            // Keep log order: what is already batched goes first.
            self.flush_locked(st, FlushTrigger::Forced);
            return Route::Alone;
        }
        if len >= st.cfg.max_size {
            if st.batch.records > 0 {
                self.flush_locked(st, FlushTrigger::LargeData);
            } else {
                self.metrics.count_trigger(FlushTrigger::LargeData);
            }
            return Route::Alone;
        }
        Route::Batch
    }

    /// After a record joined the batch: flush on a size threshold, or arm
    /// the delay timer for a batch's first record.
    fn after_push(self: &Arc<Self>, st: &mut State) {
        if st.batch.records >= st.cfg.max_records {
            self.flush_locked(st, FlushTrigger::MaxRecords);
        } else if st.batch.bytes >= st.cfg.max_size {
            self.flush_locked(st, FlushTrigger::MaxSize);
        } else {
            if st.batch.records == 1 {
                self.arm_timer(st);
            }
            self.pending.store(u64::from(st.batch.records), Relaxed);
        }
    }

    /// End of a write call: a zero delay writes what is batched right away.
    fn end_of_call(self: &Arc<Self>, st: &mut State) {
        if st.cfg.max_delay.is_zero() {
            self.flush_locked(st, FlushTrigger::MaxDelay);
        }
    }

    /// Queues the current batch's deadline unless an earlier (or equal)
    /// one is queued already: its firing re-checks and re-arms. So one
    /// deadline per writer is outstanding (two right after a reconfigure
    /// shortened the delay), however slow the flushes are.
    fn arm_timer(&self, st: &mut State) {
        if st.cfg.max_delay.is_zero() || st.batch.records == 0 {
            return;
        }
        let Some(first) = st.batch.first_at else {
            return;
        };
        let due = first + st.cfg.max_delay;
        if st.timer_at.is_some_and(|at| at <= due) {
            return;
        }
        st.timer_at = Some(due);
        let target: Weak<dyn Timed> = self.me.clone();
        self.scheduler.schedule(due, target);
    }

    fn flush_locked(self: &Arc<Self>, st: &mut State, trigger: FlushTrigger) {
        if st.batch.records == 0 {
            return;
        }
        let batch = std::mem::take(&mut st.batch);
        self.pending.store(0, Relaxed);
        let oldest = batch.first_at.map(|t| t.elapsed()).unwrap_or_default();
        st.last_entry_len = batch.entry.len();
        self.metrics.count_trigger(trigger);
        self.metrics
            .observe_batch(batch.records, batch.entry.len(), oldest);
        self.submit(batch.entry, batch.waiters, batch.records, true);
    }

    /// Hands one entry to storage. Called under the state lock, so entries
    /// reach the sink in submission order.
    fn submit(self: &Arc<Self>, entry: Vec<u8>, waiters: Vec<Waiter>, size: u32, batched: bool) {
        *self.in_flight.lock() += 1;
        let me = Arc::clone(self);
        let len = entry.len() as u64;
        self.sink.append_async(
            entry,
            Box::new(move |res| {
                defer::run_or_defer(move || me.complete(res, waiters, size, len, batched))
            }),
        );
    }

    fn complete(
        &self,
        res: Result<Position>,
        waiters: Vec<Waiter>,
        size: u32,
        len: u64,
        batched: bool,
    ) {
        let m = &self.metrics;
        if res.is_ok() {
            m.entries.fetch_add(1, Relaxed);
            if batched {
                m.batched_entries.fetch_add(1, Relaxed);
            }
            m.records.fetch_add(u64::from(size), Relaxed);
            m.bytes.fetch_add(len, Relaxed);
        } else {
            m.failed_entries.fetch_add(1, Relaxed);
            m.failed_records.fetch_add(u64::from(size), Relaxed);
        }
        complete_waiters(waiters, &res, size);
        let mut n = self.in_flight.lock();
        *n -= 1;
        if *n == 0 {
            self.idle.notify_all();
        }
    }

    fn closed_error(&self) -> Error {
        Error::WriterClosed(self.name.clone())
    }

    /// Refuses a writer made before `fork()` (checked before taking any of
    /// its locks: the parent may have held one at the fork).
    fn check_process(&self) -> Result<()> {
        if self.generation != crate::fork::generation() {
            return Err(Error::WriterClosed(format!(
                "{} (made before fork(): make it again in this process)",
                self.name
            )));
        }
        Ok(())
    }
}

/// How soon a due batch whose sink has no room is looked at again, at least
/// and at most (its `max_delay` between the two).
const FULL_SINK_RETRY_MIN: Duration = Duration::from_millis(1);
const FULL_SINK_RETRY_MAX: Duration = Duration::from_millis(10);
/// Longest a due batch waits for room in its sink (the ledger's default
/// `append_timeout`) before it is submitted over the limit.
const FULL_SINK_WAIT_MAX: Duration = Duration::from_secs(30);

impl Timed for Inner {
    fn on_timer(&self) {
        let Some(me) = self.me.upgrade() else {
            return;
        };
        let _scope = defer::Scope::enter();
        let now = Instant::now();
        // A writer busy in another thread may hold its state while it waits for
        // room in its sink: never wait for it on this process-wide thread.
        let Some(mut st) = me.state.try_lock() else {
            let target: Weak<dyn Timed> = me.me.clone();
            me.scheduler.schedule(now + FULL_SINK_RETRY_MIN, target);
            return;
        };
        // An early, superseded deadline leaves the queued later one armed.
        if st.timer_at.is_some_and(|at| at <= now) {
            st.timer_at = None;
        }
        if st.closed {
            return;
        }
        let Some(first) = st.batch.first_at.filter(|_| st.batch.records > 0) else {
            return;
        };
        let due = first + st.cfg.max_delay;
        if due <= now {
            if now < due + FULL_SINK_WAIT_MAX && !me.sink.has_room(st.batch.entry.len()) {
                // The sink's directory is full (backpressure). Waiting for room
                // here would hold up every other writer's deadline on this
                // process-wide thread: look again shortly. A write that fills
                // the batch meanwhile flushes it, and waits, on its own thread.
                // Past FULL_SINK_WAIT_MAX the batch is submitted all the same
                // (this thread never waits for room: one batch over the limit).
                let again = now
                    + st.cfg
                        .max_delay
                        .clamp(FULL_SINK_RETRY_MIN, FULL_SINK_RETRY_MAX);
                st.timer_at = Some(again);
                let target: Weak<dyn Timed> = me.me.clone();
                me.scheduler.schedule(again, target);
                return;
            }
            me.flush_locked(&mut st, FlushTrigger::MaxDelay);
        } else {
            // The deadline was an older batch's; this one is due later.
            me.arm_timer(&mut st);
        }
    }
}

/// Batches records into entries of a managed ledger (PIP-160).
///
/// Dropping the writer closes it.
pub struct BufferedWriter {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for BufferedWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferedWriter")
            .field("name", &self.inner.name)
            .finish_non_exhaustive()
    }
}

impl BufferedWriter {
    /// A writer over `sink`, named after the sink unless `name` is given.
    pub fn new(
        sink: Arc<dyn EntrySink>,
        config: WriterConfig,
        name: Option<String>,
    ) -> Result<Self> {
        config.validate()?;
        let scheduler = timer::scheduler()?;
        let name = name.unwrap_or_else(|| sink.name().to_owned());
        let inner = Arc::new_cyclic(|me| Inner {
            name,
            sink,
            state: Mutex::new(State {
                cfg: config,
                closed: false,
                batch: Batch::default(),
                timer_at: None,
                last_entry_len: 0,
            }),
            metrics: Metrics::new(),
            batch_enabled: AtomicBool::new(config.batch_enabled),
            pending: AtomicU64::new(0),
            in_flight: Mutex::new(0),
            idle: Condvar::new(),
            scheduler,
            me: me.clone(),
            generation: crate::fork::generation(),
        });
        Ok(Self { inner })
    }

    /// The writer's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// True if a record of `len` bytes would be written without waiting for
    /// room in the sink (a hint: see [`EntrySink::has_room`]). The write may
    /// submit the batch being filled along with it, so that counts too; and
    /// a writer busy in another thread (which may be waiting for room while
    /// it holds the writer) counts as no room.
    pub fn has_room(&self, len: usize) -> bool {
        let Some(st) = self.inner.state.try_lock() else {
            return false;
        };
        let batched = st.batch.entry.len();
        drop(st);
        self.inner.sink.has_room(len.saturating_add(batched))
    }

    /// Writes one record; `done` runs exactly once with its position once
    /// the entry holding it is durable, or with the error that failed it.
    /// After `close()` this returns `WriterClosed` and never calls `done`.
    pub fn write(&self, record: &[u8], done: RecordCallback) -> Result<()> {
        let _scope = defer::Scope::enter();
        let inner = &self.inner;
        inner.check_process()?;
        let mut st = inner.state.lock();
        if st.closed {
            return Err(inner.closed_error());
        }
        match inner.route(&mut st, record.len()) {
            Route::Alone => inner.submit(record.to_vec(), vec![Waiter::One(done)], 1, false),
            Route::Batch => {
                let hint = st.last_entry_len;
                st.batch.push(record, hint);
                st.batch.waiters.push(Waiter::One(done));
                inner.after_push(&mut st);
            }
        }
        inner.end_of_call(&mut st);
        Ok(())
    }

    /// Writes many records, contiguous and in order (no other caller's
    /// record lands between them); `done` runs once with every position,
    /// or with the first error if any entry holding them failed.
    pub fn write_many<R: AsRef<[u8]>>(&self, records: &[R], done: ManyCallback) -> Result<()> {
        let _scope = defer::Scope::enter();
        let inner = &self.inner;
        inner.check_process()?;
        let mut st = inner.state.lock();
        if st.closed {
            return Err(inner.closed_error());
        }
        if records.is_empty() {
            drop(st);
            done(Ok(Vec::new()));
            return Ok(());
        }
        let req = Arc::new(ManyRequest::new(records.len(), done));
        for (i, r) in records.iter().enumerate() {
            let r = r.as_ref();
            match inner.route(&mut st, r.len()) {
                Route::Alone => {
                    let part = Waiter::Part {
                        req: Arc::clone(&req),
                        start: i,
                        count: 1,
                    };
                    inner.submit(r.to_vec(), vec![part], 1, false);
                }
                Route::Batch => {
                    let hint = st.last_entry_len;
                    st.batch.push(r, hint);
                    match st.batch.waiters.last_mut() {
                        Some(Waiter::Part {
                            req: last,
                            start,
                            count,
                        }) if Arc::ptr_eq(last, &req) && *start + *count as usize == i => {
                            *count += 1;
                        }
                        _ => st.batch.waiters.push(Waiter::Part {
                            req: Arc::clone(&req),
                            start: i,
                            count: 1,
                        }),
                    }
                    inner.after_push(&mut st);
                }
            }
        }
        inner.end_of_call(&mut st);
        Ok(())
    }

    /// Writes the current batch now (counted as a forced flush).
    pub fn flush(&self) {
        let _scope = defer::Scope::enter();
        if self.inner.check_process().is_err() {
            return; // made before fork(): nothing of this process to flush
        }
        let mut st = self.inner.state.lock();
        if !st.closed {
            self.inner.flush_locked(&mut st, FlushTrigger::Forced);
        }
    }

    /// Switches batching on or off for the next record. Switching off
    /// writes what is batched first, so log order stays submission order.
    pub fn set_batch_enabled(&self, enabled: bool) {
        let _scope = defer::Scope::enter();
        let mut st = self.inner.state.lock();
        st.cfg.batch_enabled = enabled;
        self.inner.batch_enabled.store(enabled, Relaxed);
        if !st.cfg.batching() && !st.closed {
            self.inner.flush_locked(&mut st, FlushTrigger::Forced);
        }
    }

    /// Whether batching is on.
    pub fn batch_enabled(&self) -> bool {
        self.inner.batch_enabled.load(Relaxed)
    }

    /// Changes the thresholds at runtime; the current batch is checked
    /// against the new ones at once.
    pub fn reconfigure(&self, config: WriterConfig) -> Result<()> {
        config.validate()?;
        let _scope = defer::Scope::enter();
        let inner = &self.inner;
        let mut st = inner.state.lock();
        st.cfg = config;
        inner.batch_enabled.store(config.batch_enabled, Relaxed);
        if st.closed || st.batch.records == 0 {
            return Ok(());
        }
        if !config.batching() {
            inner.flush_locked(&mut st, FlushTrigger::Forced);
        } else if st.batch.records >= config.max_records {
            inner.flush_locked(&mut st, FlushTrigger::MaxRecords);
        } else if st.batch.bytes >= config.max_size {
            inner.flush_locked(&mut st, FlushTrigger::MaxSize);
        } else if config.max_delay.is_zero() {
            inner.flush_locked(&mut st, FlushTrigger::MaxDelay);
        } else {
            // An armed timer re-checks against the new delay when it fires.
            inner.arm_timer(&mut st);
        }
        Ok(())
    }

    /// The current thresholds.
    pub fn config(&self) -> WriterConfig {
        self.inner.state.lock().cfg
    }

    /// Closes the writer: records not yet handed to storage fail with
    /// `WriterClosed`, entries already handed over complete normally, and
    /// later writes fail at once. Idempotent.
    pub fn close(&self) {
        let waiters = {
            let mut st = self.inner.state.lock();
            if st.closed {
                return;
            }
            st.closed = true;
            self.inner.pending.store(0, Relaxed);
            std::mem::take(&mut st.batch).waiters
        };
        let n: u32 = waiters.iter().map(Waiter::records).sum();
        self.inner
            .metrics
            .closed_records
            .fetch_add(u64::from(n), Relaxed);
        complete_waiters(waiters, &Err(self.inner.closed_error()), n);
    }

    /// Whether `close()` was called.
    pub fn is_closed(&self) -> bool {
        self.inner.state.lock().closed
    }

    /// Waits until every entry handed to storage has completed (their
    /// callbacks have run). `None`, or a timeout too long to be a point in
    /// time, waits without limit. True when idle.
    pub fn wait_idle(&self, timeout: Option<Duration>) -> bool {
        if self.inner.check_process().is_err() {
            // Made before fork(): what the parent had in flight never
            // settles here (no threads), and this process wrote nothing.
            return true;
        }
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let mut n = self.inner.in_flight.lock();
        while *n > 0 {
            match deadline {
                None => self.inner.idle.wait(&mut n),
                Some(d) => {
                    if self.inner.idle.wait_until(&mut n, d).timed_out() {
                        return *n == 0;
                    }
                }
            }
        }
        true
    }

    /// Counters and histograms, read without taking the writer's lock.
    pub fn stats(&self) -> WriterStats {
        let inner = &self.inner;
        inner.metrics.snapshot(
            &inner.name,
            inner.batch_enabled.load(Relaxed),
            inner.pending.load(Relaxed),
            *inner.in_flight.lock(),
        )
    }
}

impl Drop for BufferedWriter {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_place_framing_matches_codec() {
        let recs: Vec<Vec<u8>> = vec![vec![], vec![8, 1], vec![7; 300], vec![1; 20_000]];
        let mut b = Batch::default();
        for r in &recs {
            b.push(r, 0);
        }
        assert_eq!(b.entry, frame::encode_batch(&recs));
        assert_eq!(b.records, 4);
        assert_eq!(b.bytes, 20_302);
    }
}
