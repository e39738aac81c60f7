//! Borrowing byte buffers from Python without copying.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// Collects a sequence of `bytes` objects, naming the argument on a type error.
pub fn bytes_list<'py>(seq: &Bound<'py, PyAny>, arg: &str) -> PyResult<Vec<Bound<'py, PyBytes>>> {
    if seq.is_instance_of::<PyBytes>() {
        return Err(PyTypeError::new_err(format!(
            "{arg} must be a sequence of bytes, not a single bytes object"
        )));
    }
    let mut out = Vec::with_capacity(seq.len().unwrap_or(0));
    for (i, item) in seq.try_iter()?.enumerate() {
        let item = item?;
        match item.cast_into::<PyBytes>() {
            Ok(b) => out.push(b),
            Err(e) => {
                return Err(PyTypeError::new_err(format!(
                    "{arg}[{i}] must be bytes, not {}",
                    e.into_inner().get_type().name()?
                )))
            }
        }
    }
    Ok(out)
}

/// Borrowed views of immutable `bytes` objects; valid while `objs` lives,
/// and safe to use with the GIL released because `bytes` never change.
pub fn with_slices<'a>(objs: &'a [Bound<'_, PyBytes>]) -> PyResult<Vec<&'a [u8]>> {
    Ok(objs.iter().map(|b| b.as_bytes()).collect())
}
