//! The one process-wide completion thread resolving append futures.
//!
//! Ledger writer threads and BufferedWriter completions must never wait for
//! the GIL, so they hand (future, outcome) jobs to this thread, which takes
//! the GIL once per burst of jobs and resolves every
//! `concurrent.futures.Future` in it. At interpreter shutdown it can no
//! longer attach; the remaining futures are then unobservable and leaked.
//! After `fork()` the child has no such thread: it is started again there
//! on first use (one per fork generation, see `txnstream_core::fork`).

use crate::errors::{to_pyerr, BindResult};
use crate::position::{PyPosition, PyTxnPosition};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyList, PyType};
use std::cell::RefCell;
use std::sync::mpsc::{self, Receiver, Sender};
use txnstream_core::{fork, Error, Position, Result, TxnPosition};

/// Work for the completion thread.
pub enum Job {
    /// A ledger append: `Future[Position]`.
    Position(Py<PyAny>, Result<Position>),
    /// A ledger group append: `Future[list[Position]]`.
    Positions(Py<PyAny>, Result<Vec<Position>>),
    /// A BufferedWriter record: `Future[TxnPosition]`.
    TxnPosition(Py<PyAny>, Result<TxnPosition>),
    /// BufferedWriter records: `Future[list[TxnPosition]]`.
    TxnPositions(Py<PyAny>, Result<Vec<TxnPosition>>),
    /// Signals once every job queued before it has run.
    Barrier(mpsc::SyncSender<()>),
}

/// Most jobs run per GIL acquisition, so other threads get the GIL too.
const JOBS_PER_GIL: usize = 4096;

/// The completion thread's queue of the current fork generation.
static COMPLETER: txnstream_core::sync::Mutex<Option<(u64, Sender<Job>)>> =
    txnstream_core::sync::Mutex::new(None);

thread_local! {
    /// Per-thread copy of the queue, so the hot path takes no lock.
    static LOCAL: RefCell<Option<(u64, Sender<Job>)>> = const { RefCell::new(None) };
    /// True on the completion thread itself (future callbacks run there).
    static ON_COMPLETER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// True when called from the completion thread, i.e. from a future's
/// done-callback: a wait for the completion thread would wait on itself.
pub fn on_completion_thread() -> bool {
    ON_COMPLETER.with(std::cell::Cell::get)
}

/// The completion thread's queue, starting the thread on first use (in
/// this process: a forked child starts its own).
pub fn completer() -> BindResult<Sender<Job>> {
    let gen = fork::generation();
    let cached = LOCAL.with(|l| match &*l.borrow() {
        Some((g, tx)) if *g == gen => Some(tx.clone()),
        _ => None,
    });
    if let Some(tx) = cached {
        return Ok(tx);
    }
    let tx = {
        let _gate = fork::gate();
        let mut c = COMPLETER.lock();
        match &*c {
            Some((g, tx)) if *g == gen => tx.clone(),
            _ => {
                // A parent's queue leads to a thread this process lacks;
                // forget it without running anything of it.
                if let Some(old) = c.take() {
                    std::mem::forget(old);
                }
                let (tx, rx) = mpsc::channel::<Job>();
                std::thread::Builder::new()
                    .name("txnstream-completion".into())
                    .spawn(move || completion_loop(&rx))
                    .map_err(|e| Error::io("starting the completion thread", &e))?;
                *c = Some((gen, tx.clone()));
                tx
            }
        }
    };
    LOCAL.with(|l| {
        if let Some(old) = l.borrow_mut().replace((gen, tx.clone())) {
            if old.0 != gen {
                std::mem::forget(old);
            }
        }
    });
    Ok(tx)
}

fn completion_loop(rx: &Receiver<Job>) {
    ON_COMPLETER.with(|c| c.set(true));
    while let Ok(first) = rx.recv() {
        let mut first = Some(first);
        let attached = Python::try_attach(|py| {
            if let Some(job) = first.take() {
                run_job(py, job);
            }
            for _ in 1..JOBS_PER_GIL {
                match rx.try_recv() {
                    Ok(job) => run_job(py, job),
                    Err(_) => break,
                }
            }
        });
        if attached.is_none() {
            // The interpreter is shutting down: nobody can observe the
            // futures any more, and touching their objects now would be
            // unsound, so they are leaked.
            std::mem::forget(first);
        }
    }
}

fn run_job(py: Python<'_>, job: Job) {
    let (future, outcome) = match job {
        Job::Barrier(done) => {
            let _ = done.send(());
            return;
        }
        Job::Position(f, Ok(p)) => (f, Py::new(py, PyPosition(p)).map(Py::into_any)),
        Job::Positions(f, Ok(ps)) => (f, any_list(py, ps.into_iter().map(PyPosition))),
        Job::TxnPosition(f, Ok(p)) => (f, Py::new(py, PyTxnPosition(p)).map(Py::into_any)),
        Job::TxnPositions(f, Ok(ps)) => (f, any_list(py, ps.into_iter().map(PyTxnPosition))),
        Job::Position(f, Err(e))
        | Job::Positions(f, Err(e))
        | Job::TxnPosition(f, Err(e))
        | Job::TxnPositions(f, Err(e)) => {
            let exc = to_pyerr(py, &e).into_value(py).into_any();
            settle(py, &f, Outcome::Exception, exc);
            return;
        }
    };
    match outcome {
        Ok(value) => settle(py, &future, Outcome::Result, value),
        Err(e) => settle(py, &future, Outcome::Exception, e.into_value(py).into_any()),
    }
}

/// A list of new pyclass objects (positions of a group append).
pub fn object_list<'py, T>(
    py: Python<'py>,
    items: impl Iterator<Item = T>,
) -> PyResult<Bound<'py, PyList>>
where
    T: pyo3::PyClass + Into<pyo3::PyClassInitializer<T>>,
{
    let items = items
        .map(|v| Py::new(py, v))
        .collect::<PyResult<Vec<_>>>()?;
    PyList::new(py, items)
}

fn any_list<T>(py: Python<'_>, items: impl Iterator<Item = T>) -> PyResult<Py<PyAny>>
where
    T: pyo3::PyClass + Into<pyo3::PyClassInitializer<T>>,
{
    Ok(object_list(py, items)?.into_any().unbind())
}

#[derive(Clone, Copy)]
enum Outcome {
    Result,
    Exception,
}

fn settle(py: Python<'_>, future: &Py<PyAny>, how: Outcome, value: Py<PyAny>) {
    // The cached unbound method, not a bound-method lookup per future.
    let r = kit(py).and_then(|k| {
        let f = match how {
            Outcome::Result => &k.set_result,
            Outcome::Exception => &k.set_exception,
        };
        f.bind(py).call1((future.bind(py), value)).map(drop)
    });
    if let Err(e) = r {
        // Only possible if user code resolved our future itself.
        e.write_unraisable(py, Some(future.bind(py)));
    }
}

/// What resolving and creating futures needs, looked up once.
struct FutureKit {
    class: Py<PyType>,
    set_result: Py<PyAny>,
    set_exception: Py<PyAny>,
    set_running: Py<PyAny>,
    /// The RUNNING state object, if this Python's `Future` was verified to
    /// keep its state in `_state` (then a new future is made RUNNING with
    /// one attribute store instead of a locked method call).
    running: Option<Py<PyAny>>,
}

static KIT: PyOnceLock<FutureKit> = PyOnceLock::new();

fn kit(py: Python<'_>) -> PyResult<&FutureKit> {
    KIT.get_or_try_init(py, || {
        // A `concurrent.futures.Future` subclass with a cheaper lock
        // (python/txnstream/future.py).
        let class = py
            .import("txnstream.future")?
            .getattr("Future")?
            .cast_into::<PyType>()?;
        let get = |name: &str| class.getattr(name).map(Bound::unbind);
        let kit = FutureKit {
            set_result: get("set_result")?,
            set_exception: get("set_exception")?,
            set_running: get("set_running_or_notify_cancel")?,
            running: running_state(&class).ok().flatten(),
            class: class.unbind(),
        };
        Ok(kit)
    })
}

/// Probes `Future`: the value `set_running_or_notify_cancel` leaves in
/// `_state`, if storing it into a fresh future makes that one behave as
/// running too (not cancellable, not done). `None`: use the method.
fn running_state(class: &Bound<'_, PyType>) -> PyResult<Option<Py<PyAny>>> {
    let state = intern!(class.py(), "_state");
    let probe = class.call0()?;
    let pending = probe.getattr(state)?;
    probe.call_method0("set_running_or_notify_cancel")?;
    let running = probe.getattr(state)?;
    if running.eq(&pending)? {
        return Ok(None);
    }
    let fresh = class.call0()?;
    fresh.setattr(state, &running)?;
    let ok = fresh.call_method0("running")?.is_truthy()?
        && !fresh.call_method0("cancel")?.is_truthy()?
        && !fresh.call_method0("done")?.is_truthy()?;
    Ok(ok.then(|| running.unbind()))
}

/// Resolves one future with the core's result (runs on a core thread).
pub type Resolve<T> = Box<dyn FnOnce(Result<T>) + Send + 'static>;

/// A new RUNNING future plus the callback that resolves it on the completion
/// thread: `wrap` picks the [`Job`] variant (e.g. `Job::Position`).
pub fn future_with_callback<'py, T: Send + 'static>(
    py: Python<'py>,
    wrap: fn(Py<PyAny>, Result<T>) -> Job,
) -> BindResult<(Bound<'py, PyAny>, Resolve<T>)> {
    let fut = new_future(py)?;
    let pending = Pending {
        handle: Some(fut.clone().unbind()),
        tx: completer()?,
        wrap,
    };
    let done = Box::new(move |r: Result<T>| pending.resolve(r));
    Ok((fut, done))
}

/// A future's way to the completion thread. Dropped unused -- the core lost
/// the callback, e.g. a storage thread panicked and unwound -- it resolves
/// the future with an error, so no Python caller waits forever.
struct Pending<T> {
    handle: Option<Py<PyAny>>,
    tx: Sender<Job>,
    wrap: fn(Py<PyAny>, Result<T>) -> Job,
}

impl<T> Pending<T> {
    fn resolve(mut self, r: Result<T>) {
        if let Some(h) = self.handle.take() {
            // The receiver lives for the whole process; a send cannot fail.
            let _ = self.tx.send((self.wrap)(h, r));
        }
    }
}

impl<T> Drop for Pending<T> {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            let e = Error::Stopped(
                "the storage dropped this write without an outcome (a storage thread \
                 panicked); it may or may not be durable"
                    .into(),
            );
            let _ = self.tx.send((self.wrap)(h, Err(e)));
        }
    }
}

/// A new `concurrent.futures.Future`, already RUNNING so it cannot be
/// cancelled: once submitted, a write happens whatever the caller does.
fn new_future(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    let k = kit(py)?;
    let fut = k.class.bind(py).call0()?;
    match &k.running {
        // Nobody else holds the new future yet: no lock needed.
        Some(running) => fut.setattr(intern!(py, "_state"), running.bind(py))?,
        None => {
            k.set_running.bind(py).call1((&fut,))?;
        }
    }
    Ok(fut)
}
