//! Test storage for the BufferedWriter: an in-memory sink whose completion
//! timing and failures the test controls (inline, on a worker thread,
//! gated, slow, always- or sometimes-failing).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::sync::Arc;
use std::thread;
use std::time::Duration;
use txnstream_core::sink::{AppendCallback, EntrySink};
use txnstream_core::sync::{Condvar, Mutex};
use txnstream_core::{Error, Position, Result, TxnPosition};

/// Decides whether the `n`-th append (0-based) fails.
pub type FailPolicy = Box<dyn Fn(u64) -> bool + Send + Sync>;

#[derive(Default)]
struct SinkState {
    /// Durable entries; entry id = index.
    entries: Vec<Vec<u8>>,
    /// Every append in call order (failed ones too).
    appended: Vec<Vec<u8>>,
    queue: VecDeque<(u64, Vec<u8>, AppendCallback)>,
    /// Completions the worker may still perform; `None` = unlimited.
    permits: Option<u64>,
    stop: bool,
}

pub struct MemSink {
    name: String,
    inline: bool,
    delay: Duration,
    fail: FailPolicy,
    state: Mutex<SinkState>,
    cv: Condvar,
}

pub fn io_error(n: u64) -> Error {
    Error::Io {
        context: format!("appending entry #{n}"),
        errno: Some(28),
        message: "No space left on device".into(),
    }
}

impl MemSink {
    fn build(inline: bool, delay: Duration, fail: FailPolicy, gated: bool) -> Arc<Self> {
        let sink = Arc::new(Self {
            name: "mem".into(),
            inline,
            delay,
            fail,
            state: Mutex::new(SinkState {
                permits: gated.then_some(0),
                ..Default::default()
            }),
            cv: Condvar::new(),
        });
        if !inline {
            let w = Arc::clone(&sink);
            thread::spawn(move || w.worker());
        }
        sink
    }

    /// Completes on a worker thread, in order, as the ledger does.
    pub fn new() -> Arc<Self> {
        Self::build(false, Duration::ZERO, Box::new(|_| false), false)
    }
    /// Completes inside `append_async` itself.
    pub fn inline() -> Arc<Self> {
        Self::build(true, Duration::ZERO, Box::new(|_| false), false)
    }
    /// Completes nothing until `release` is called.
    pub fn gated() -> Arc<Self> {
        Self::build(false, Duration::ZERO, Box::new(|_| false), true)
    }
    /// Each append takes `delay` (a slow disk).
    pub fn slow(delay: Duration) -> Arc<Self> {
        Self::build(false, delay, Box::new(|_| false), false)
    }
    /// Fails the appends chosen by `fail`.
    pub fn failing(fail: FailPolicy) -> Arc<Self> {
        Self::build(false, Duration::ZERO, fail, false)
    }

    pub fn as_sink(self: &Arc<Self>) -> Arc<dyn EntrySink> {
        Arc::clone(self) as Arc<dyn EntrySink>
    }

    /// Lets `n` more completions happen (gated sinks).
    pub fn release(&self, n: u64) {
        let mut st = self.state.lock();
        st.permits = st.permits.map(|p| p + n);
        self.cv.notify_all();
    }

    pub fn entries(&self) -> Vec<Vec<u8>> {
        self.state.lock().entries.clone()
    }

    pub fn appended(&self) -> Vec<Vec<u8>> {
        self.state.lock().appended.clone()
    }

    pub fn queued(&self) -> usize {
        self.state.lock().queue.len()
    }

    fn finish(&self, n: u64, entry: Vec<u8>, done: AppendCallback) {
        let res = if (self.fail)(n) {
            Err(io_error(n))
        } else {
            let mut st = self.state.lock();
            st.entries.push(entry);
            Ok(Position::new(1, st.entries.len() as u64 - 1))
        };
        done(res);
    }

    fn worker(&self) {
        loop {
            let (n, entry, done) = {
                let mut st = self.state.lock();
                loop {
                    if st.stop {
                        return;
                    }
                    let may = st.permits.is_none_or(|p| p > 0);
                    if may && !st.queue.is_empty() {
                        break;
                    }
                    self.cv.wait(&mut st);
                }
                if let Some(p) = st.permits.as_mut() {
                    *p -= 1;
                }
                st.queue.pop_front().unwrap()
            };
            if !self.delay.is_zero() {
                thread::sleep(self.delay);
            }
            self.finish(n, entry, done);
        }
    }
}

impl Drop for MemSink {
    fn drop(&mut self) {
        self.state.lock().stop = true;
        self.cv.notify_all();
    }
}

impl EntrySink for MemSink {
    fn append_async(&self, entry: Vec<u8>, done: AppendCallback) {
        let n = {
            let mut st = self.state.lock();
            st.appended.push(entry.clone());
            st.appended.len() as u64 - 1
        };
        if self.inline {
            self.finish(n, entry, done);
        } else {
            self.state.lock().queue.push_back((n, entry, done));
            self.cv.notify_all();
        }
    }

    fn name(&self) -> &str {
        &self.name
    }
}

type Completions = Vec<(usize, Result<TxnPosition>)>;
type ManyResult = Option<Result<Vec<TxnPosition>>>;

/// Collects completions `(tag, result)` in the order they happen.
#[derive(Clone, Default)]
pub struct Collector {
    inner: Arc<(Mutex<Completions>, Condvar)>,
}

impl Collector {
    pub fn callback(&self, tag: usize) -> Box<dyn FnOnce(Result<TxnPosition>) + Send> {
        let me = self.clone();
        Box::new(move |r| {
            let (m, cv) = &*me.inner;
            m.lock().push((tag, r));
            cv.notify_all();
        })
    }

    /// Waits (up to 10 s) until `n` completions arrived and returns them.
    pub fn wait(&self, n: usize) -> Completions {
        let (m, cv) = &*self.inner;
        let mut g = m.lock();
        while g.len() < n {
            assert!(
                !cv.wait_for(&mut g, Duration::from_secs(10)).timed_out(),
                "timed out waiting for {n} completions, have {}",
                g.len()
            );
        }
        g.clone()
    }

    pub fn len(&self) -> usize {
        self.inner.0.lock().len()
    }
}

/// A one-shot slot for a `write_many` result.
#[derive(Clone, Default)]
pub struct ManySlot {
    inner: Arc<(Mutex<ManyResult>, Condvar)>,
}

impl ManySlot {
    pub fn callback(&self) -> Box<dyn FnOnce(Result<Vec<TxnPosition>>) + Send> {
        let me = self.clone();
        Box::new(move |r| {
            let (m, cv) = &*me.inner;
            *m.lock() = Some(r);
            cv.notify_all();
        })
    }

    pub fn wait(&self) -> Result<Vec<TxnPosition>> {
        let (m, cv) = &*self.inner;
        let mut g = m.lock();
        while g.is_none() {
            assert!(
                !cv.wait_for(&mut g, Duration::from_secs(10)).timed_out(),
                "write_many never completed"
            );
        }
        g.clone().unwrap()
    }
}

pub fn tp(entry: u64, size: u32, index: u32) -> TxnPosition {
    TxnPosition {
        position: Position::new(1, entry),
        batch_size: size,
        batch_index: index,
    }
}

pub fn rec(i: usize, len: usize) -> Vec<u8> {
    let mut v = format!("rec-{i}-").into_bytes();
    v.resize(len.max(v.len()), b'x');
    v
}
