//! The one place where core errors become Python exceptions.
//!
//! The hierarchy itself is defined in Python (`txnstream/errors.py`) so that
//! classes can have several bases (`CorruptEntryError` is also a
//! `ValueError`); here each `txnstream_core::Error` variant picks its class
//! and the structured details become keyword attributes.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use txnstream_core::Error;

/// Error type of every binding function: a core error or a Python one.
#[derive(Debug)]
pub enum BindError {
    /// From the core.
    Core(Error),
    /// Already a Python exception.
    Py(PyErr),
}

impl From<Error> for BindError {
    fn from(e: Error) -> Self {
        BindError::Core(e)
    }
}

impl From<PyErr> for BindError {
    fn from(e: PyErr) -> Self {
        BindError::Py(e)
    }
}

/// Result type of binding functions.
pub type BindResult<T> = Result<T, BindError>;

impl From<BindError> for PyErr {
    fn from(e: BindError) -> PyErr {
        match e {
            BindError::Py(e) => e,
            BindError::Core(e) => Python::attach(|py| to_pyerr(py, &e)),
        }
    }
}

/// Builds the Python exception for a core error.
pub fn to_pyerr(py: Python<'_>, err: &Error) -> PyErr {
    match build(py, err) {
        Ok(e) => e,
        // The package's errors module could not be imported: still say what failed.
        Err(import_err) => PyRuntimeError::new_err(format!("{err} ({import_err})")),
    }
}

fn build(py: Python<'_>, err: &Error) -> PyResult<PyErr> {
    let details = PyDict::new(py);
    let class = match err {
        Error::CorruptEntry {
            position, offset, ..
        } => {
            details.set_item("offset", offset)?;
            details.set_item("position", position.map(|p| (p.ledger_id, p.entry_id)))?;
            "CorruptEntryError"
        }
        Error::CorruptLedger {
            path,
            position,
            offset,
            ..
        } => {
            details.set_item("path", path)?;
            details.set_item("position", (position.ledger_id, position.entry_id))?;
            details.set_item("offset", offset)?;
            "CorruptLedgerError"
        }
        Error::CorruptIndex { kind, offset, .. } => {
            details.set_item("kind", kind)?;
            details.set_item("offset", offset)?;
            "CorruptIndexError"
        }
        Error::Config { key, value, .. } => {
            details.set_item("key", key)?;
            details.set_item("value", value)?;
            "ConfigError"
        }
        Error::WriterClosed(_) => "WriterClosedError",
        Error::LedgerClosed(_) => "LedgerClosedError",
        Error::Stopped(_) => {
            details.set_item("errno", py.None())?;
            "StorageStoppedError"
        }
        Error::ReadOnly(_) => "ReadOnlyError",
        Error::PositionNotFound { position, .. } => {
            details.set_item("position", (position.ledger_id, position.entry_id))?;
            "PositionNotFoundError"
        }
        Error::InvalidArgument(_) => "InvalidArgumentError",
        Error::Io { errno, .. } => {
            details.set_item("errno", errno)?;
            "StorageError"
        }
    };
    let cls = py.import("txnstream.errors")?.getattr(class)?;
    let exc = cls.call((err.to_string(),), Some(&details))?;
    Ok(PyErr::from_value(exc))
}
