//! Arguments crossing the binding, checked before any work.
//!
//! PyO3's own conversions raise a bare `OverflowError`/`TypeError` that
//! does not say which argument was wrong (and take `True` for 1), and
//! `Duration::from_secs_f64` panics on infinities. Every int, str, flag,
//! duration and numpy-array argument of the bindings goes through these
//! helpers instead: a wrong type or an out-of-range value is an
//! `InvalidArgumentError` naming the argument and the value. Public
//! binding functions therefore take such arguments as `&Bound<PyAny>`
//! rather than as `u64`, `&str`, `Vec<...>` or `PyReadonlyArray`
//! parameters (only the test hooks of `testing.rs` keep PyO3's own).

use crate::errors::{BindError, BindResult};
use numpy::ndarray::Dimension;
use numpy::{
    Element, PyArray, PyArrayMethods, PyReadonlyArray, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt, PyString, PyTuple};
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

/// `obj` as a Python `int`: an int (not a bool), or an integer-like
/// object with `__index__` (a numpy integer: what every decoded column
/// holds), as `operator.index` takes it. Floats are not ints.
fn int_of<'py>(obj: &Bound<'py, PyAny>, what: &str) -> BindResult<Bound<'py, PyInt>> {
    if let Ok(i) = obj.cast_exact::<PyInt>() {
        return Ok(i.clone()); // the common case: one type test
    }
    let not_int = || Error::invalid(format!("{what} must be an int, not {}", type_name(obj)));
    if obj.is_instance_of::<PyBool>() {
        return Err(not_int().into());
    }
    if let Ok(i) = obj.cast::<PyInt>() {
        return Ok(i.clone()); // a subclass (an IntEnum)
    }
    let py = obj.py();
    let index = py
        .import(intern!(py, "operator"))?
        .getattr(intern!(py, "index"))?;
    // numpy.bool_ has no __index__: refused here like bool.
    let i = index.call1((obj,)).map_err(|_| not_int())?;
    Ok(i.cast_into::<PyInt>().map_err(|_| not_int())?)
}

/// `obj` as an `i64`: an int (not a bool; see [`int_of`]) in the `i64` range.
pub fn i64_arg(obj: &Bound<'_, PyAny>, what: &str) -> BindResult<i64> {
    int_of(obj, what)?.extract::<i64>().map_err(|_| {
        Error::invalid(format!("{what} must be an int in -2**63..2**63, got {obj}")).into()
    })
}

/// `obj` as an unsigned int of at most `bits` bits: an int (not a bool;
/// see [`int_of`]); a negative or too large one is refused naming `what`
/// and the value.
fn uint_arg(obj: &Bound<'_, PyAny>, what: &str, bits: u32) -> BindResult<u64> {
    let i = int_of(obj, what)?;
    match i.extract::<u64>() {
        Ok(v) if bits >= 64 || v < 1u64 << bits => Ok(v),
        _ if i.lt(0)? => Err(Error::invalid(format!("{what} must be >= 0, got {obj}")).into()),
        _ => {
            Err(Error::invalid(format!("{what} must be an int in 0..2**{bits}, got {obj}")).into())
        }
    }
}

/// An id, a sequence, a time in ms since the epoch...: an int in `0..2**64`.
pub fn id_arg(obj: &Bound<'_, PyAny>, what: &str) -> BindResult<u64> {
    uint_arg(obj, what, 64)
}

/// A batch size or index: an int in `0..2**32`.
pub fn u32_arg(obj: &Bound<'_, PyAny>, what: &str) -> BindResult<u32> {
    Ok(uint_arg(obj, what, 32)? as u32)
}

/// An optional count (`None`: `default`) in `range`, e.g. ``max_entries``.
pub fn count_arg(
    obj: Option<&Bound<'_, PyAny>>,
    what: &str,
    range: std::ops::RangeInclusive<i64>,
    default: i64,
) -> BindResult<i64> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(default);
    };
    let n = i64_arg(obj, what)?;
    if !range.contains(&n) {
        return Err(Error::invalid(format!(
            "{what} must be in {}..={}, got {n}",
            range.start(),
            range.end()
        ))
        .into());
    }
    Ok(n)
}

/// A `(most_bits, least_bits)` transaction id tuple.
pub fn txn_arg(obj: &Bound<'_, PyAny>, what: &str) -> BindResult<(u64, u64)> {
    let t = obj
        .cast::<PyTuple>()
        .ok()
        .filter(|t| t.len() == 2)
        .ok_or_else(|| {
            Error::invalid(format!(
                "{what} must be a (most_bits, least_bits) tuple, got {}",
                short_repr(obj)
            ))
        })?;
    let (most, least) = (t.get_item(0)?, t.get_item(1)?);
    Ok((
        named(|n| id_arg(&most, n), || format!("{what} most_bits"))?,
        named(|n| id_arg(&least, n), || format!("{what} least_bits"))?,
    ))
}

/// `obj` as a number: a float, or an int (see [`int_of`]; one too large
/// for a float is infinity); `None` for anything else (bools included).
pub fn number_of(obj: &Bound<'_, PyAny>) -> Option<f64> {
    let number = if obj.is_instance_of::<PyFloat>() {
        obj.clone()
    } else {
        int_of(obj, "number").ok()?.into_any()
    };
    Some(number.extract::<f64>().unwrap_or(f64::INFINITY))
}

/// `obj` as a number of milliseconds (see [`number_of`]; not NaN).
pub fn millis_arg(obj: &Bound<'_, PyAny>, what: &str) -> BindResult<f64> {
    // An int too large for a float (infinity) is beyond any limit anyway.
    let ms = number_of(obj).ok_or_else(|| {
        Error::invalid(format!(
            "{what} must be a number of milliseconds, not {}",
            type_name(obj)
        ))
    })?;
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
    Ok(str_ref(obj, what)?.to_owned())
}

/// `obj`'s text, borrowed (no copy): a `str` only.
pub fn str_ref<'a>(obj: &'a Bound<'_, PyAny>, what: &str) -> BindResult<&'a str> {
    let Ok(s) = obj.cast::<PyString>() else {
        return Err(Error::invalid(format!(
            "{what} must be a str, not {} ({})",
            type_name(obj),
            short_repr(obj)
        ))
        .into());
    };
    Ok(s.to_str().map_err(|_| {
        Error::invalid(format!(
            "{what} must be encodable text, got {}",
            short_repr(obj)
        ))
    })?)
}

/// An optional str (`None` or absent: `None`), borrowed.
pub fn opt_str_ref<'a>(
    obj: Option<&'a Bound<'_, PyAny>>,
    what: &str,
) -> BindResult<Option<&'a str>> {
    obj.filter(|o| !o.is_none())
        .map(|o| str_ref(o, what))
        .transpose()
}

/// The items of a sequence argument (a `str` is not a sequence of items
/// here), each converted by `item` with its index in the name.
pub fn seq_arg<'py, T>(
    obj: &Bound<'py, PyAny>,
    what: &str,
    expected: &str,
    mut item: impl FnMut(&Bound<'py, PyAny>, &str) -> BindResult<T>,
) -> BindResult<Vec<T>> {
    let not_seq = || {
        Error::invalid(format!(
            "{what} must be {expected}, not {} ({})",
            type_name(obj),
            short_repr(obj)
        ))
    };
    if obj.is_instance_of::<PyString>() {
        return Err(not_seq().into());
    }
    let items = obj.try_iter().map_err(|_| not_seq())?;
    let mut out = Vec::with_capacity(crate::buffers::capacity_hint(obj));
    for (i, x) in items.enumerate() {
        let x = x?;
        out.push(named(|at| item(&x, at), || format!("{what}[{i}]"))?);
    }
    Ok(out)
}

/// The placeholder [`named`] checks with; an error naming it is renamed.
const UNNAMED: &str = "\u{0}arg";

/// Runs `check` once on an argument whose name must be built (an item of a
/// sequence, a field of a tuple) with a placeholder name, and builds the
/// name only for an error that names the placeholder. Per-message and
/// per-record encoders call this for every item, and good input must not
/// pay for formatting names. (Running `check` again with the name would
/// read a one-shot iterator twice, and accept it empty the second time.)
pub fn named<T>(
    check: impl FnOnce(&str) -> BindResult<T>,
    name: impl FnOnce() -> String,
) -> BindResult<T> {
    check(UNNAMED).map_err(|e| match e {
        BindError::Core(Error::InvalidArgument(msg)) if msg.contains(UNNAMED) => {
            BindError::Core(Error::InvalidArgument(msg.replace(UNNAMED, &name())))
        }
        other => other,
    })
}

/// A sequence of str.
pub fn str_list_arg(obj: &Bound<'_, PyAny>, what: &str) -> BindResult<Vec<String>> {
    seq_arg(obj, what, "a sequence of str", str_arg)
}

/// A sequence of `(str, str)` tuples (properties, subscriptions).
pub fn str_pairs_arg(obj: &Bound<'_, PyAny>, what: &str) -> BindResult<Vec<(String, String)>> {
    seq_arg(obj, what, "a sequence of (str, str) tuples", |x, at| {
        let t = x
            .cast::<PyTuple>()
            .ok()
            .filter(|t| t.len() == 2)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "{at} must be a (str, str) tuple, got {}",
                    short_repr(x)
                ))
            })?;
        let (a, b) = (t.get_item(0)?, t.get_item(1)?);
        Ok((
            named(|n| str_arg(&a, n), || format!("{at}[0]"))?,
            named(|n| str_arg(&b, n), || format!("{at}[1]"))?,
        ))
    })
}

/// A required flag: a `bool` only (ints and None are not flags).
pub fn flag_arg(obj: &Bound<'_, PyAny>, what: &str) -> BindResult<bool> {
    if !obj.is_instance_of::<PyBool>() {
        return Err(Error::invalid(format!(
            "{what} must be a bool, not {} ({})",
            type_name(obj),
            short_repr(obj)
        ))
        .into());
    }
    Ok(obj.is_truthy()?)
}

/// A numpy array of `T` with the dimensions of `D`, borrowed read-only; a
/// list, another dtype or another number of dimensions is refused naming
/// the argument and what was given (`expected`, e.g. "2-D int64 array").
pub fn array_arg<'py, T: Element, D: Dimension>(
    obj: &Bound<'py, PyAny>,
    what: &str,
    expected: &str,
) -> BindResult<PyReadonlyArray<'py, T, D>> {
    let Ok(a) = obj.cast::<PyArray<T, D>>() else {
        let got = match obj.cast::<PyUntypedArray>() {
            Ok(u) => format!("a {}-D {} array", u.ndim(), u.dtype()),
            Err(_) => format!("{} ({})", type_name(obj), short_repr(obj)),
        };
        return Err(Error::invalid(format!("{what} must be a numpy {expected}, not {got}")).into());
    };
    a.try_readonly()
        .map_err(|e| Error::invalid(format!("{what} cannot be read: {e}")).into())
}

/// An optional `bool` flag (`None`: `default`); ints are not flags.
pub fn bool_arg(obj: Option<&Bound<'_, PyAny>>, what: &str, default: bool) -> BindResult<bool> {
    obj.filter(|o| !o.is_none())
        .map_or(Ok(default), |o| flag_arg(o, what))
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
