//! `txnstream._native._testing`: fault hooks for txnstream's own tests,
//! compiled only with the cargo feature `testing` (never in a release
//! wheel). `txnstream.testing` wraps them.
//!
//! The hooks act on the data directory of a managed ledger (every ledger of
//! it shares one journal): the next N writes, syncs, reads, preallocations
//! or catalog writes fail with a chosen errno (or panic), or every call of a
//! kind waits at a gate until released.

use crate::args::timeout_ms_arg;
use crate::errors::BindResult;
use crate::ledger::PyManagedLedger;
use pyo3::prelude::*;
use std::time::Duration;
use txnstream_core::ledger::FaultKind;
use txnstream_core::Error;

fn fault_kind(kind: &str) -> BindResult<FaultKind> {
    Ok(FaultKind::parse(kind).ok_or_else(|| {
        Error::invalid(format!(
            "fault kind must be 'write', 'sync', 'preallocate', 'read', 'meta' or 'checkpoint', got {kind:?}"
        ))
    })?)
}

/// The next ``times`` calls of ``kind`` fail with ``errno``.
#[pyfunction]
#[pyo3(signature = (ml, kind, errno=5, times=1))]
fn inject_fault(ml: &PyManagedLedger, kind: &str, errno: i32, times: u32) -> BindResult<()> {
    ml.inner.inject_fault(fault_kind(kind)?, errno, times);
    Ok(())
}

/// The next call of ``kind`` panics on the storage thread making it (a
/// bug's worst case).
#[pyfunction]
fn inject_panic(ml: &PyManagedLedger, kind: &str) -> BindResult<()> {
    ml.inner.fault_injector().inject_panic(fault_kind(kind)?);
    Ok(())
}

/// Every later call of ``kind`` waits at a gate until :func:`release_fault`.
#[pyfunction]
fn hold_fault(ml: &PyManagedLedger, kind: &str) -> BindResult<()> {
    ml.inner.fault_injector().hold(fault_kind(kind)?);
    Ok(())
}

/// Lets calls held by :func:`hold_fault` go on.
#[pyfunction]
fn release_fault(ml: &PyManagedLedger, kind: &str) -> BindResult<()> {
    ml.inner.fault_injector().release(fault_kind(kind)?);
    Ok(())
}

/// Waits (GIL released) until a call of ``kind`` is held at its gate;
/// False after ``timeout_ms``.
#[pyfunction]
#[pyo3(signature = (ml, kind, timeout_ms=None))]
fn wait_fault_held(
    py: Python<'_>,
    ml: &PyManagedLedger,
    kind: &str,
    timeout_ms: Option<Bound<'_, PyAny>>,
) -> BindResult<bool> {
    let k = fault_kind(kind)?;
    let t = timeout_ms_arg(timeout_ms.as_ref())?.unwrap_or(Duration::from_secs(3600));
    let inj = ml.inner.fault_injector();
    Ok(py.detach(|| inj.wait_held(k, t)))
}

/// Disarms every injected fault and opens every gate.
#[pyfunction]
fn clear_faults(ml: &PyManagedLedger) {
    ml.inner.fault_injector().clear();
}

/// Adds the `_testing` submodule to `txnstream._native`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let t = PyModule::new(m.py(), "_testing")?;
    t.add_function(wrap_pyfunction!(inject_fault, &t)?)?;
    t.add_function(wrap_pyfunction!(inject_panic, &t)?)?;
    t.add_function(wrap_pyfunction!(hold_fault, &t)?)?;
    t.add_function(wrap_pyfunction!(release_fault, &t)?)?;
    t.add_function(wrap_pyfunction!(wait_fault_held, &t)?)?;
    t.add_function(wrap_pyfunction!(clear_faults, &t)?)?;
    m.add_submodule(&t)?;
    Ok(())
}
