//! The one process-wide completion thread resolving append futures.
//!
//! Ledger writer threads and BufferedWriter completions must never wait for
//! the GIL, so they hand (future, outcome) jobs to this thread, which takes
//! the GIL once per burst of jobs and resolves every
//! `concurrent.futures.Future` in it. At interpreter shutdown it can no
//! longer attach; the remaining futures are then unobservable and leaked.

use crate::errors::{to_pyerr, BindResult};
use crate::position::{PyPosition, PyTxnPosition};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyList, PyString, PyType};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::OnceLock;
use txnstream_core::{Error, Position, Result, TxnPosition};

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

static COMPLETER: OnceLock<Sender<Job>> = OnceLock::new();

/// The completion thread's queue, starting the thread on first use.
pub fn completer() -> BindResult<&'static Sender<Job>> {
    if let Some(tx) = COMPLETER.get() {
        return Ok(tx);
    }
    let (tx, rx) = mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name("txnstream-completion".into())
        .spawn(move || completion_loop(&rx))
        .map_err(|e| Error::io("starting the completion thread", &e))?;
    // A racing initialiser's thread simply idles on a channel nobody feeds.
    Ok(COMPLETER.get_or_init(|| tx))
}

fn completion_loop(rx: &Receiver<Job>) {
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
            settle(py, &f, intern!(py, "set_exception"), exc);
            return;
        }
    };
    match outcome {
        Ok(value) => settle(py, &future, intern!(py, "set_result"), value),
        Err(e) => settle(
            py,
            &future,
            intern!(py, "set_exception"),
            e.into_value(py).into_any(),
        ),
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

fn settle(py: Python<'_>, future: &Py<PyAny>, method: &Bound<'_, PyString>, value: Py<PyAny>) {
    if let Err(e) = future.bind(py).call_method1(method, (value,)) {
        // Only possible if user code resolved our future itself.
        e.write_unraisable(py, Some(future.bind(py)));
    }
}

/// A new `concurrent.futures.Future`, already RUNNING so it cannot be
/// cancelled: once submitted, a write happens whatever the caller does.
pub fn new_future(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    static FUTURE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    let fut = FUTURE.import(py, "concurrent.futures", "Future")?.call0()?;
    fut.call_method0(intern!(py, "set_running_or_notify_cancel"))?;
    Ok(fut)
}
