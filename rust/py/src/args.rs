//! Numeric arguments crossing the binding, checked before any work.
//!
//! PyO3's own conversions raise a bare `OverflowError`/`TypeError` that
//! does not say which argument was wrong, and `Duration::from_secs_f64`
//! panics on infinities. Every int and duration argument of the bindings
//! goes through these helpers instead: a wrong type or an out-of-range
//! value is an `InvalidArgumentError` naming the argument and the value.

use crate::errors::BindResult;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt, PyString};
use std::path::PathBuf;
use std::time::Duration;
use txnstream_core::Error;

/// Timeouts at or above this many milliseconds (about 31,700 years) mean
/// "no limit": no clock can reach them, and `Instant + them` would overflow.
pub const UNBOUNDED_MS: f64 = 1e15;

/// The name of `obj`'s type, for error messages.
pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "?".to_owned(), |n| n.to_string())
}

/// `obj` as an `i64`: an int (not a bool) in the `i64` range.
pub fn i64_arg(obj: &Bound<'_, PyAny>, what: &str) -> BindResult<i64> {
    if obj.is_instance_of::<PyBool>() || !obj.is_instance_of::<PyInt>() {
        return Err(
            Error::invalid(format!("{what} must be an int, not {}", type_name(obj))).into(),
        );
    }
    obj.extract::<i64>().map_err(|_| {
        Error::invalid(format!("{what} must be an int in -2**63..2**63, got {obj}")).into()
    })
}

/// `obj` as a number of milliseconds (an int or a float, not a bool, not NaN).
pub fn millis_arg(obj: &Bound<'_, PyAny>, what: &str) -> BindResult<f64> {
    if obj.is_instance_of::<PyBool>()
        || !(obj.is_instance_of::<PyInt>() || obj.is_instance_of::<PyFloat>())
    {
        return Err(Error::invalid(format!(
            "{what} must be a number of milliseconds, not {}",
            type_name(obj)
        ))
        .into());
    }
    // An int too large for a float is beyond any limit anyway.
    let ms = obj.extract::<f64>().unwrap_or(f64::INFINITY);
    if ms.is_nan() {
        return Err(Error::invalid(format!("{what} must be a number, got NaN")).into());
    }
    Ok(ms)
}

/// An optional timeout in milliseconds: `None`, `inf` or anything at least
/// [`UNBOUNDED_MS`] means no limit; negative values and NaN are refused.
pub fn timeout_ms_arg(obj: Option<&Bound<'_, PyAny>>) -> BindResult<Option<Duration>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    let ms = millis_arg(obj, "timeout_ms")?;
    if ms < 0.0 {
        return Err(Error::invalid(format!("timeout_ms must be >= 0, got {obj}")).into());
    }
    if ms >= UNBOUNDED_MS {
        return Ok(None);
    }
    Ok(Some(Duration::from_secs_f64(ms / 1000.0)))
}

/// `obj` as a `String`: a `str` only (bytes are not a name).
pub fn str_arg(obj: &Bound<'_, PyAny>, what: &str) -> BindResult<String> {
    if !obj.is_instance_of::<PyString>() {
        return Err(Error::invalid(format!(
            "{what} must be a str, not {} ({})",
            type_name(obj),
            short_repr(obj)
        ))
        .into());
    }
    Ok(obj.extract::<String>().map_err(|_| {
        Error::invalid(format!(
            "{what} must be encodable text, got {}",
            short_repr(obj)
        ))
    })?)
}

/// An optional `bool` flag (`None`: `default`); ints are not flags.
pub fn bool_arg(obj: Option<&Bound<'_, PyAny>>, what: &str, default: bool) -> BindResult<bool> {
    match obj.filter(|o| !o.is_none()) {
        None => Ok(default),
        Some(o) if o.is_instance_of::<PyBool>() => Ok(o.is_truthy()?),
        Some(o) => Err(Error::invalid(format!(
            "{what} must be a bool, not {} ({})",
            type_name(o),
            short_repr(o)
        ))
        .into()),
    }
}

/// `obj` as a directory path: a `str` or `os.PathLike` of text, without NUL.
pub fn path_arg(obj: &Bound<'_, PyAny>, what: &str) -> BindResult<PathBuf> {
    let bad = || {
        Error::invalid(format!(
            "{what} must be a path (str or os.PathLike of text, without NUL), got {}",
            short_repr(obj)
        ))
    };
    let text = if obj.is_instance_of::<PyString>() {
        obj.clone()
    } else {
        let fspath = obj.py().import("os")?.getattr("fspath")?;
        let t = fspath.call1((obj,)).map_err(|_| bad())?;
        if !t.is_instance_of::<PyString>() {
            return Err(bad().into());
        }
        t
    };
    let s: String = text.extract().map_err(|_| bad())?;
    if s.contains('\0') {
        return Err(bad().into()); // (an empty path is the core's to refuse, by its own words)
    }
    Ok(PathBuf::from(s))
}

fn short_repr(obj: &Bound<'_, PyAny>) -> String {
    let r = obj
        .repr()
        .map_or_else(|_| "?".to_owned(), |r| r.to_string());
    if r.chars().count() > 80 {
        let cut: String = r.chars().take(77).collect();
        format!("{cut}...")
    } else {
        r
    }
}
