//! `txnstream.Position` and `txnstream.TxnPosition` value types.

pub use crate::args::{id_arg, u32_arg};
use crate::errors::BindResult;
use numpy::PyReadonlyArray1;
use pyo3::basic::CompareOp;
use pyo3::prelude::*;
use pyo3::IntoPyObjectExt;
use txnstream_core::{Error, Position, TxnPosition};

/// Address of an entry: ``(ledger_id, entry_id)``, totally ordered and hashable.
#[pyclass(name = "Position", module = "txnstream._native", frozen)]
#[derive(Debug, Clone, Copy)]
pub struct PyPosition(pub Position);

#[pymethods]
impl PyPosition {
    #[new]
    fn new(ledger_id: &Bound<'_, PyAny>, entry_id: &Bound<'_, PyAny>) -> BindResult<Self> {
        Ok(Self(Position::new(
            id_arg(ledger_id, "ledger_id")?,
            id_arg(entry_id, "entry_id")?,
        )))
    }

    #[getter]
    fn ledger_id(&self) -> u64 {
        self.0.ledger_id
    }

    #[getter]
    fn entry_id(&self) -> u64 {
        self.0.entry_id
    }

    fn __richcmp__(&self, other: &Bound<'_, PyAny>, op: CompareOp) -> PyResult<Py<PyAny>> {
        compare(self.0, other, op)
    }

    fn __hash__(&self) -> u64 {
        hash(self.0)
    }

    fn __repr__(&self) -> String {
        format!("Position({}, {})", self.0.ledger_id, self.0.entry_id)
    }

    fn __getnewargs__(&self) -> (u64, u64) {
        (self.0.ledger_id, self.0.entry_id)
    }
}

/// A record's address: entry position plus ``batch_size`` and ``batch_index``.
///
/// As in Pulsar, ordering, equality and hash look at the entry position only,
/// so a ``TxnPosition`` and a ``Position`` of the same entry are the same map
/// key. Use :meth:`key` to tell records of one batch apart.
#[pyclass(name = "TxnPosition", module = "txnstream._native", frozen)]
#[derive(Debug, Clone, Copy)]
pub struct PyTxnPosition(pub TxnPosition);

#[pymethods]
impl PyTxnPosition {
    #[new]
    #[pyo3(signature = (ledger_id, entry_id, batch_size = None, batch_index = None))]
    fn new(
        ledger_id: &Bound<'_, PyAny>,
        entry_id: &Bound<'_, PyAny>,
        batch_size: Option<&Bound<'_, PyAny>>,
        batch_index: Option<&Bound<'_, PyAny>>,
    ) -> BindResult<Self> {
        let ledger_id = id_arg(ledger_id, "ledger_id")?;
        let entry_id = id_arg(entry_id, "entry_id")?;
        let batch_size = batch_size.map_or(Ok(1), |b| u32_arg(b, "batch_size"))?;
        let batch_index = batch_index.map_or(Ok(0), |b| u32_arg(b, "batch_index"))?;
        if batch_size == 0 || batch_index >= batch_size {
            return Err(Error::invalid(format!(
                "batch_index {batch_index} must be < batch_size {batch_size} (>= 1)"
            ))
            .into());
        }
        Ok(Self(TxnPosition {
            position: Position::new(ledger_id, entry_id),
            batch_size,
            batch_index,
        }))
    }

    #[getter]
    fn ledger_id(&self) -> u64 {
        self.0.position.ledger_id
    }

    #[getter]
    fn entry_id(&self) -> u64 {
        self.0.position.entry_id
    }

    #[getter]
    fn batch_size(&self) -> u32 {
        self.0.batch_size
    }

    #[getter]
    fn batch_index(&self) -> u32 {
        self.0.batch_index
    }

    /// The entry's position (batch fields dropped).
    #[getter]
    fn position(&self) -> PyPosition {
        PyPosition(self.0.position)
    }

    /// ``(ledger_id, entry_id, batch_index)``: identity of the record.
    fn key(&self) -> (u64, u64, u32) {
        let p = self.0.position;
        (p.ledger_id, p.entry_id, self.0.batch_index)
    }

    fn __richcmp__(&self, other: &Bound<'_, PyAny>, op: CompareOp) -> PyResult<Py<PyAny>> {
        compare(self.0.position, other, op)
    }

    fn __hash__(&self) -> u64 {
        hash(self.0.position)
    }

    fn __repr__(&self) -> String {
        let p = self.0.position;
        format!(
            "TxnPosition({}, {}, batch_size={}, batch_index={})",
            p.ledger_id, p.entry_id, self.0.batch_size, self.0.batch_index
        )
    }

    fn __getnewargs__(&self) -> (u64, u64, u32, u32) {
        let p = self.0.position;
        (
            p.ledger_id,
            p.entry_id,
            self.0.batch_size,
            self.0.batch_index,
        )
    }
}

/// Extracts a plain position from a `Position` or a `TxnPosition`.
pub fn position_of(obj: &Bound<'_, PyAny>) -> Option<Position> {
    if let Ok(p) = obj.cast::<PyPosition>() {
        return Some(p.get().0);
    }
    obj.cast::<PyTxnPosition>().ok().map(|t| t.get().0.position)
}

fn compare(a: Position, other: &Bound<'_, PyAny>, op: CompareOp) -> PyResult<Py<PyAny>> {
    let py = other.py();
    match position_of(other) {
        Some(b) => op.matches(a.cmp(&b)).into_py_any(py),
        None => Ok(py.NotImplemented()),
    }
}

fn hash(p: Position) -> u64 {
    p.ledger_id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ p.entry_id
}

fn column<T: numpy::Element + Copy>(a: &PyReadonlyArray1<'_, T>) -> Vec<T> {
    match a.as_slice() {
        Ok(s) => s.to_vec(),
        // Not contiguous (a strided view): copy element by element.
        Err(_) => a.as_array().iter().copied().collect(),
    }
}

/// Records given as four equally long columns (the bulk form of a list of
/// `TxnPosition`), for `Cursor.delete_records`.
pub fn records_from_columns(
    ledger_id: &PyReadonlyArray1<'_, u64>,
    entry_id: &PyReadonlyArray1<'_, u64>,
    batch_size: &PyReadonlyArray1<'_, u32>,
    batch_index: &PyReadonlyArray1<'_, u32>,
) -> BindResult<Vec<TxnPosition>> {
    let (l, e, s, i) = (
        column(ledger_id),
        column(entry_id),
        column(batch_size),
        column(batch_index),
    );
    if e.len() != l.len() || s.len() != l.len() || i.len() != l.len() {
        return Err(Error::invalid(format!(
            "ledger_id, entry_id, batch_size and batch_index must have the same length, \
             got {}, {}, {}, {}",
            l.len(),
            e.len(),
            s.len(),
            i.len()
        ))
        .into());
    }
    Ok((0..l.len())
        .map(|k| TxnPosition {
            position: Position::new(l[k], e[k]),
            batch_size: s[k],
            batch_index: i[k],
        })
        .collect())
}
