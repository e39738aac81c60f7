//! `txnstream.AckSet` and the numpy bulk ack-set operations.

use crate::args::{array_arg, i64_arg};
use crate::errors::BindResult;
use numpy::{
    IntoPyArray, PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2,
    PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use pyo3::types::PyType;
use txnstream_core::ackset::{self, lists, rows};

/// Present/deleted state of the records of one batched entry (bit = 1:
/// present). Words are Java ``BitSet.toLongArray()`` compatible. Mutable
/// (``clear``, ``and_``), so compared by value but not hashable.
#[pyclass(name = "AckSet", module = "txnstream._native", eq)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PyAckSet(pub ackset::AckSet);

#[pymethods]
impl PyAckSet {
    #[new]
    fn new(batch_size: &Bound<'_, PyAny>) -> BindResult<Self> {
        Ok(Self(ackset::AckSet::new(i64_arg(
            batch_size,
            "batch_size",
        )?)?))
    }

    /// Rebuilds a set from signed 64-bit words and its batch size.
    #[staticmethod]
    fn from_words(words: &Bound<'_, PyAny>, batch_size: &Bound<'_, PyAny>) -> BindResult<Self> {
        let ws = words_arg(words)?;
        let size = i64_arg(batch_size, "batch_size")?;
        Ok(Self(ackset::AckSet::from_words(&ws, size)?))
    }

    /// The set of a batch of ``batch_size`` with only ``index`` deleted.
    #[staticmethod]
    fn single_deleted(batch_size: &Bound<'_, PyAny>, index: &Bound<'_, PyAny>) -> BindResult<Self> {
        Ok(Self(ackset::AckSet::single_deleted(
            i64_arg(batch_size, "batch_size")?,
            i64_arg(index, "index")?,
        )?))
    }

    #[getter]
    fn batch_size(&self) -> u32 {
        self.0.batch_size()
    }

    fn clear(&mut self, index: &Bound<'_, PyAny>) -> BindResult<()> {
        Ok(self.0.clear(i64_arg(index, "index")?)?)
    }

    fn get(&self, index: &Bound<'_, PyAny>) -> BindResult<bool> {
        Ok(self.0.get(i64_arg(index, "index")?)?)
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn cardinality(&self) -> u32 {
        self.0.cardinality()
    }

    fn overlaps(&self, other: &Bound<'_, PyAny>) -> BindResult<bool> {
        let other = ackset_arg(other, "other")?;
        Ok(self
            .0
            .overlaps(&other.try_borrow().map_err(PyErr::from)?.0)?)
    }

    /// Deletes in place what ``other`` deletes (AND of the words).
    fn and_(slf: &Bound<'_, Self>, other: &Bound<'_, PyAny>) -> BindResult<()> {
        let other = ackset_arg(other, "other")?;
        if other.is(slf) {
            return Ok(()); // x AND x is x (and a second borrow of x would fail)
        }
        let other = other.try_borrow().map_err(PyErr::from)?;
        let mut this = slf.try_borrow_mut().map_err(PyErr::from)?;
        Ok(this.0.and_assign(&other.0)?)
    }

    fn __and__(&self, other: &Self) -> BindResult<Self> {
        let mut out = self.0.clone();
        out.and_assign(&other.0)?;
        Ok(Self(out))
    }

    fn to_words(&self) -> Vec<i64> {
        self.0.to_words()
    }

    fn present(&self) -> Vec<u32> {
        self.0.present()
    }

    fn copy(&self) -> Self {
        self.clone()
    }

    fn __copy__(&self) -> Self {
        self.clone()
    }

    fn __deepcopy__(&self, _memo: &Bound<'_, PyAny>) -> Self {
        self.clone()
    }

    /// Pickles as ``AckSet(batch_size)`` with the words as its state. (No
    /// ``__hash__``: the set changes in place, so it is unhashable, as a
    /// Python ``set`` is.)
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyType>, (u32,), Vec<i64>)> {
        let s = slf.try_borrow()?;
        Ok((slf.get_type(), (s.0.batch_size(),), s.0.to_words()))
    }

    /// Restores the words saved by ``__reduce__`` (checked as ``from_words`` checks them).
    fn __setstate__(&mut self, words: &Bound<'_, PyAny>) -> BindResult<()> {
        let ws = words_arg(words)?;
        self.0 = ackset::AckSet::from_words(&ws, i64::from(self.0.batch_size()))?;
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!(
            "AckSet(batch_size={}, present={:?})",
            self.0.batch_size(),
            self.0.present()
        )
    }
}

/// A ``(rows, words)`` int64 array argument.
fn rows_arg<'py>(obj: &Bound<'py, PyAny>, what: &str) -> BindResult<PyReadonlyArray2<'py, i64>> {
    array_arg(obj, what, "2-D int64 array")
}

/// `obj` as an `AckSet`; `what` names it in the error.
fn ackset_arg<'a, 'py>(
    obj: &'a Bound<'py, PyAny>,
    what: &str,
) -> BindResult<&'a Bound<'py, PyAckSet>> {
    obj.cast::<PyAckSet>().map_err(|_| {
        txnstream_core::Error::invalid(format!(
            "{what} must be an AckSet, got {}",
            obj.repr()
                .map_or_else(|_| "?".to_owned(), |r| r.to_string())
        ))
        .into()
    })
}

/// Ack-set words: an iterable of signed 64-bit ints.
fn words_arg(words: &Bound<'_, PyAny>) -> BindResult<Vec<i64>> {
    crate::args::seq_arg(words, "words", "a sequence of signed 64-bit ints", i64_arg)
}

/// The rows of `a` back to back (row-major), and the row width.
fn flat2(a: &PyReadonlyArray2<'_, i64>) -> (Vec<i64>, usize) {
    let width = a.shape()[1];
    // as_slice takes any contiguous memory, Fortran order (a transpose)
    // too: only C order is the rows back to back. Anything else is copied
    // in logical order, element by element.
    match a.as_slice() {
        Ok(s) if a.is_c_contiguous() => (s.to_vec(), width),
        _ => (a.as_array().iter().copied().collect(), width),
    }
}

/// Like [`flat2`], but rows of zero words read as one zero word: every
/// record deleted (Java's ``toLongArray()`` drops trailing zero words), as
/// the Python wrapper ``txnstream.ackset`` reads them. Every row gets an
/// answer, and a batch size is checked against that word as for any row.
fn padded_rows(a: &PyReadonlyArray2<'_, i64>) -> (Vec<i64>, usize) {
    match flat2(a) {
        (_, 0) => (vec![0; a.shape()[0]], 1),
        rows => rows,
    }
}

/// Row-wise AND of two ``(n, words)`` int64 arrays.
#[pyfunction]
pub fn ackset_and_many<'py>(
    py: Python<'py>,
    a: &Bound<'py, PyAny>,
    b: &Bound<'py, PyAny>,
) -> BindResult<Bound<'py, PyArray2<i64>>> {
    let (a, b) = (rows_arg(a, "a")?, rows_arg(b, "b")?);
    let shape = [a.shape()[0], a.shape()[1]];
    if a.shape() != b.shape() {
        return Err(txnstream_core::Error::invalid(format!(
            "ackset_and_many: shapes differ ({:?} vs {:?})",
            a.shape(),
            b.shape()
        ))
        .into());
    }
    let ((wa, _), (wb, _)) = (flat2(&a), flat2(&b));
    let out = py.detach(|| rows::and(&wa, &wb))?;
    Ok(out.into_pyarray(py).reshape(shape)?)
}

/// Records still present in each row of an ``(n, words)`` int64 array.
#[pyfunction]
pub fn ackset_cardinality_many<'py>(
    py: Python<'py>,
    words: &Bound<'py, PyAny>,
) -> BindResult<Bound<'py, PyArray1<u32>>> {
    let (w, width) = padded_rows(&rows_arg(words, "words")?);
    Ok(py.detach(|| rows::cardinality(&w, width))?.into_pyarray(py))
}

/// Whether each row of an ``(n, words)`` int64 array has every record deleted.
#[pyfunction]
pub fn ackset_is_empty_many<'py>(
    py: Python<'py>,
    words: &Bound<'py, PyAny>,
) -> BindResult<Bound<'py, PyArray1<bool>>> {
    let (w, width) = padded_rows(&rows_arg(words, "words")?);
    Ok(py.detach(|| rows::is_empty(&w, width))?.into_pyarray(py))
}

/// Whether rows ``a[i]`` and ``b[i]`` delete a common index below ``batch_sizes[i]``.
#[pyfunction]
pub fn ackset_overlaps_many<'py>(
    py: Python<'py>,
    a: &Bound<'py, PyAny>,
    b: &Bound<'py, PyAny>,
    batch_sizes: &Bound<'py, PyAny>,
) -> BindResult<Bound<'py, PyArray1<bool>>> {
    let (a, b) = (rows_arg(a, "a")?, rows_arg(b, "b")?);
    let sizes = i64s(&array_arg(batch_sizes, "batch_sizes", "1-D int64 array")?);
    if a.shape() != b.shape() {
        return Err(txnstream_core::Error::invalid(format!(
            "ackset_overlaps_many: shapes differ ({:?} vs {:?})",
            a.shape(),
            b.shape()
        ))
        .into());
    }
    let ((wa, width), (wb, _)) = (padded_rows(&a), padded_rows(&b));
    Ok(py
        .detach(|| rows::overlaps(&wa, &wb, width, &sizes))?
        .into_pyarray(py))
}

// ---------------------------------------------- Arrow list<int64> columns

fn i32s(a: &PyReadonlyArray1<'_, i32>) -> Vec<i32> {
    a.as_array().to_vec()
}

fn i64s(a: &PyReadonlyArray1<'_, i64>) -> Vec<i64> {
    a.as_array().to_vec()
}

/// An Arrow ``list<int64>`` column: int32 ``offsets`` and int64 ``values``.
fn list_arg(
    offsets: &Bound<'_, PyAny>,
    values: &Bound<'_, PyAny>,
    names: (&str, &str),
) -> BindResult<(Vec<i32>, Vec<i64>)> {
    Ok((
        i32s(&array_arg(offsets, names.0, "1-D int32 array")?),
        i64s(&array_arg(values, names.1, "1-D int64 array")?),
    ))
}

/// Records still present in each ack set of an Arrow ``list<int64>`` column
/// given as ``offsets`` (int32, n+1) and ``values`` (int64 words).
#[pyfunction]
pub fn ackset_list_cardinality<'py>(
    py: Python<'py>,
    offsets: &Bound<'py, PyAny>,
    values: &Bound<'py, PyAny>,
) -> BindResult<Bound<'py, PyArray1<u32>>> {
    let (o, v) = list_arg(offsets, values, ("offsets", "values"))?;
    Ok(py.detach(|| lists::cardinality(&o, &v))?.into_pyarray(py))
}

/// Whether each ack set of a ``list<int64>`` column has every record deleted.
#[pyfunction]
pub fn ackset_list_is_empty<'py>(
    py: Python<'py>,
    offsets: &Bound<'py, PyAny>,
    values: &Bound<'py, PyAny>,
) -> BindResult<Bound<'py, PyArray1<bool>>> {
    let (o, v) = list_arg(offsets, values, ("offsets", "values"))?;
    Ok(py.detach(|| lists::is_empty(&o, &v))?.into_pyarray(py))
}

/// A ``list<int64>`` column: int32 offsets and int64 values.
type ListColumn<'py> = (Bound<'py, PyArray1<i32>>, Bound<'py, PyArray1<i64>>);

/// Row-wise AND of two ``list<int64>`` ack-set columns: ``(offsets, values)``.
#[pyfunction]
pub fn ackset_list_and<'py>(
    py: Python<'py>,
    a_offsets: &Bound<'py, PyAny>,
    a_values: &Bound<'py, PyAny>,
    b_offsets: &Bound<'py, PyAny>,
    b_values: &Bound<'py, PyAny>,
) -> BindResult<ListColumn<'py>> {
    let (ao, av) = list_arg(a_offsets, a_values, ("a_offsets", "a_values"))?;
    let (bo, bv) = list_arg(b_offsets, b_values, ("b_offsets", "b_values"))?;
    let (o, v) = py.detach(|| lists::and(&ao, &av, &bo, &bv))?;
    Ok((o.into_pyarray(py), v.into_pyarray(py)))
}

/// Whether ack sets ``a[i]`` and ``b[i]`` both delete an index below
/// ``batch_sizes[i]``.
#[pyfunction]
pub fn ackset_list_overlaps<'py>(
    py: Python<'py>,
    a_offsets: &Bound<'py, PyAny>,
    a_values: &Bound<'py, PyAny>,
    b_offsets: &Bound<'py, PyAny>,
    b_values: &Bound<'py, PyAny>,
    batch_sizes: &Bound<'py, PyAny>,
) -> BindResult<Bound<'py, PyArray1<bool>>> {
    let (ao, av) = list_arg(a_offsets, a_values, ("a_offsets", "a_values"))?;
    let (bo, bv) = list_arg(b_offsets, b_values, ("b_offsets", "b_values"))?;
    let sizes = i64s(&array_arg(batch_sizes, "batch_sizes", "1-D int64 array")?);
    Ok(py
        .detach(|| lists::overlaps(&ao, &av, &bo, &bv, &sizes))?
        .into_pyarray(py))
}
