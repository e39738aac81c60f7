//! Records from Python: any object with the buffer protocol.
//!
//! `bytes` are used in place (immutable, so safe to read with the GIL
//! released). Any other buffer (`bytearray`, `memoryview`, a numpy array,
//! ...) is copied once into a new `bytes` object while the GIL is held: a
//! mutable buffer could otherwise change under a write running without
//! the GIL. The buffer must be C-contiguous; its items are taken as raw
//! bytes whatever their type.

use crate::args::type_name;
use crate::errors::BindResult;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyMemoryView};
use txnstream_core::Error;

/// `obj` as `bytes` (itself, or a copy of its buffer); `what` names it in errors.
pub fn record_bytes<'py>(obj: &Bound<'py, PyAny>, what: &str) -> BindResult<Bound<'py, PyBytes>> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(b.clone());
    }
    let not_buffer = || {
        let kind = obj
            .get_type()
            .name()
            .map_or_else(|_| "?".to_owned(), |n| n.to_string());
        Error::invalid(format!(
            "{what} must be bytes or another buffer (bytearray, memoryview, numpy array), \
             not {kind}"
        ))
    };
    let view = PyMemoryView::from(obj).map_err(|_| not_buffer())?;
    let flat = view.call_method1("cast", ("B",)).map_err(|_| {
        Error::invalid(format!(
            "{what} must be a C-contiguous buffer (copy a strided view first)"
        ))
    })?;
    let copy = obj.py().get_type::<PyBytes>().call1((flat,))?;
    Ok(copy.cast_into::<PyBytes>().map_err(PyErr::from)?)
}

/// Most items preallocated for a Python sequence before its items are read:
/// ``__len__`` is the caller's claim, not a size (``range(2**36)`` is cheap
/// to make); the vector grows past it as items actually arrive.
const PREALLOC_MAX: usize = 4096;

/// A capacity for the items of ``seq``: its length, at most [`PREALLOC_MAX`].
pub fn capacity_hint(seq: &Bound<'_, PyAny>) -> usize {
    seq.len().unwrap_or(0).min(PREALLOC_MAX)
}

/// Collects a sequence of records (see [`record_bytes`]), naming the
/// argument and the index of a bad one.
pub fn bytes_list<'py>(seq: &Bound<'py, PyAny>, arg: &str) -> BindResult<Vec<Bound<'py, PyBytes>>> {
    if seq.is_instance_of::<PyBytes>() {
        return Err(Error::invalid(format!(
            "{arg} must be a sequence of bytes, not a single bytes object"
        ))
        .into());
    }
    let items = seq.try_iter().map_err(|_| {
        Error::invalid(format!(
            "{arg} must be a sequence of bytes-like records, not {}",
            type_name(seq)
        ))
    })?;
    let mut out = Vec::with_capacity(capacity_hint(seq));
    for (i, item) in items.enumerate() {
        let item = item?;
        // Per record of append_many / write_many: the name only for an error.
        out.push(crate::args::named(
            |n| record_bytes(&item, n),
            || format!("{arg}[{i}]"),
        )?);
    }
    Ok(out)
}

/// Borrowed views of immutable `bytes` objects; valid while `objs` lives,
/// and safe to use with the GIL released because `bytes` never change.
pub fn with_slices<'a>(objs: &'a [Bound<'_, PyBytes>]) -> PyResult<Vec<&'a [u8]>> {
    Ok(objs.iter().map(|b| b.as_bytes()).collect())
}
