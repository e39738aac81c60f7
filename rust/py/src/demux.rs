//! `SnapshotDemux` binding: the shared snapshot reader's routing (SPEC §4.6),
//! reading and decoding in bulk with the GIL released.
//!
//! `take` and `catch_up` hold the demux's lock for a whole read, so every
//! method waits for that lock with the GIL released: a `stats()` made
//! during a long read must not stop every other Python thread.

use crate::args::{id_arg, str_arg};
use crate::errors::BindResult;
use crate::ledger::PyManagedLedger;
use crate::position::PyPosition;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};
use txnstream_core::demux::{Routed, SnapshotDemux};
use txnstream_core::sync::Mutex;
use txnstream_core::Error;

/// Routes a namespace snapshot topic's records to the topics that recover.
#[derive(Debug, Default)]
#[pyclass(name = "SnapshotDemux", module = "txnstream._native", frozen)]
pub struct PySnapshotDemux {
    inner: Mutex<SnapshotDemux>,
}

fn answer<'py>(py: Python<'py>, r: Option<Routed>) -> PyResult<Option<Bound<'py, PyTuple>>> {
    match r {
        None => Ok(None),
        Some(Routed { position, value }) => {
            let value =
                value.map_or_else(|| py.None(), |v| PyBytes::new(py, &v).into_any().unbind());
            Ok(Some(PyTuple::new(
                py,
                [Py::new(py, PyPosition(position))?.into_any(), value],
            )?))
        }
    }
}

fn topic_arg(obj: &Bound<'_, PyAny>, arg: &str) -> BindResult<String> {
    let s = str_arg(obj, arg)?;
    if s.is_empty() {
        return Err(Error::invalid(format!("{arg} must be a non-empty str, got ''")).into());
    }
    Ok(s)
}

#[pymethods]
impl PySnapshotDemux {
    #[new]
    fn new() -> Self {
        Self::default()
    }

    /// The newest snapshot of `topic` as `(position, bytes)`, or None: reads
    /// `ml` forward to its current end first (routing every record passed).
    fn take<'py>(
        &self,
        py: Python<'py>,
        ml: &Bound<'py, PyManagedLedger>,
        topic: &Bound<'py, PyAny>,
    ) -> BindResult<Option<Bound<'py, PyTuple>>> {
        let topic = topic_arg(topic, "topic")?;
        let inner = &ml.get().inner;
        let r = py.detach(|| self.inner.lock().take(inner, &topic))?;
        Ok(answer(py, r)?)
    }

    /// Read about `max_entries` entries toward the end (GIL released); True at the end.
    fn catch_up(
        &self,
        py: Python<'_>,
        ml: &Bound<'_, PyManagedLedger>,
        max_entries: &Bound<'_, PyAny>,
    ) -> BindResult<bool> {
        let max_entries = id_arg(max_entries, "max_entries")?;
        let inner = &ml.get().inner;
        Ok(py.detach(|| self.inner.lock().catch_up_some(inner, max_entries))?)
    }

    /// What is routed for `topic`, without reading (call after `catch_up` reached the end).
    fn take_routed<'py>(
        &self,
        py: Python<'py>,
        topic: &Bound<'py, PyAny>,
    ) -> BindResult<Option<Bound<'py, PyTuple>>> {
        let topic = topic_arg(topic, "topic")?;
        // The lock may be held by a read (take, catch_up): wait without the GIL.
        let r = py.detach(|| self.inner.lock().take_routed(&topic));
        Ok(answer(py, r)?)
    }

    /// Let `topic` answer again (unloaded; it recovers anew): its later records are kept.
    fn reopen(&self, py: Python<'_>, topic: &Bound<'_, PyAny>) -> BindResult<()> {
        let topic = topic_arg(topic, "topic")?;
        py.detach(|| self.inner.lock().reopen(&topic));
        Ok(())
    }

    /// Forget `topic` (deleted while recovery runs): its records are not kept.
    fn forget(&self, py: Python<'_>, topic: &Bound<'_, PyAny>) -> BindResult<()> {
        let topic = topic_arg(topic, "topic")?;
        py.detach(|| self.inner.lock().forget(&topic));
        Ok(())
    }

    /// Counters: entries_read, reads, routed, dropped, answered.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = py.detach(|| self.inner.lock().stats());
        let d = PyDict::new(py);
        d.set_item("entries_read", s.entries_read)?;
        d.set_item("reads", s.reads)?;
        d.set_item("routed", s.routed)?;
        d.set_item("dropped", s.dropped)?;
        d.set_item("answered", s.answered)?;
        d.set_item("restarts", s.restarts)?;
        Ok(d)
    }
}
