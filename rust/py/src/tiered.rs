//! Tiered storage bindings: the aborted-transaction index, the remote
//! segment offset index, and the export of a closed ledger as a segment
//! (read, encoded and scanned for ABORT markers with the GIL released).

use crate::args::{bool_arg, named, txn_arg, type_name};
use crate::buffers::record_bytes;
use crate::errors::BindResult;
use crate::ledger::{id_arg, pos_arg, PyManagedLedger};
use crate::position::PyPosition;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};
use txnstream_core::message::{self, txn_of, MARKER_TXN_ABORT};
use txnstream_core::sync::Mutex;
use txnstream_core::tiered::{
    decode_frames, encode_segment, AbortedTxn, AbortedTxnIndex, SegmentIndex,
};
use txnstream_core::{Error, Position, Result};

fn pos(py: Python<'_>, p: Position) -> PyResult<Py<PyPosition>> {
    Py::new(py, PyPosition(p))
}

fn record<'py>(py: Python<'py>, r: &AbortedTxn) -> PyResult<Bound<'py, PyTuple>> {
    PyTuple::new(
        py,
        [
            PyTuple::new(py, [r.txn.0, r.txn.1])?.into_any().unbind(),
            pos(py, r.first)?.into_any(),
            pos(py, r.last)?.into_any(),
            pos(py, r.last_stable)?.into_any(),
        ],
    )
}

fn aborts_arg(seq: &Bound<'_, PyAny>) -> BindResult<Vec<((u64, u64), Position)>> {
    let mut out = Vec::new();
    let items = seq.try_iter().map_err(|_| {
        Error::invalid(format!(
            "aborts must be an iterable of (txn, position) tuples, got {}",
            type_name(seq)
        ))
    })?;
    for (i, item) in items.enumerate() {
        let item = item?;
        let t = item
            .cast::<PyTuple>()
            .ok()
            .filter(|t| t.len() == 2)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "aborts[{i}] must be a (txn, position) tuple, got {item}"
                ))
            })?;
        out.push((
            named(
                |n| txn_arg(&t.get_item(0)?, n),
                || format!("aborts[{i}] txn"),
            )?,
            named(
                |n| pos_arg(&t.get_item(1)?, n),
                || format!("aborts[{i}] position"),
            )?,
        ));
    }
    Ok(out)
}

/// The aborted-transaction index of one topic ledger (SPEC §3.4).
#[derive(Debug)]
#[pyclass(name = "AbortedTxnIndex", module = "txnstream._native", frozen)]
pub struct PyAbortedTxnIndex {
    inner: Mutex<AbortedTxnIndex>,
}

#[pymethods]
impl PyAbortedTxnIndex {
    #[new]
    fn new(ledger_id: &Bound<'_, PyAny>) -> BindResult<Self> {
        Ok(Self {
            inner: Mutex::new(AbortedTxnIndex::new(id_arg(ledger_id, "ledger_id")?)),
        })
    }

    /// Decodes and checks index bytes (any buffer); damage raises `CorruptIndexError`.
    #[staticmethod]
    fn decode(data: &Bound<'_, PyAny>) -> BindResult<Self> {
        let b = record_bytes(data, "data")?;
        Ok(Self {
            inner: Mutex::new(AbortedTxnIndex::decode(b.as_bytes())?),
        })
    }

    /// A conservative index from the ABORT markers of a ledger.
    #[staticmethod]
    fn rebuild(ledger_id: &Bound<'_, PyAny>, aborts: &Bound<'_, PyAny>) -> BindResult<Self> {
        let id = id_arg(ledger_id, "ledger_id")?;
        Ok(Self {
            inner: Mutex::new(AbortedTxnIndex::rebuild(id, &aborts_arg(aborts)?)?),
        })
    }

    /// The header bytes that open an index file of `ledger_id`.
    #[staticmethod]
    fn encode_header<'py>(
        py: Python<'py>,
        ledger_id: &Bound<'_, PyAny>,
    ) -> BindResult<Bound<'py, PyBytes>> {
        Ok(PyBytes::new(
            py,
            &AbortedTxnIndex::encode_header(id_arg(ledger_id, "ledger_id")?),
        ))
    }

    #[getter]
    fn ledger_id(&self) -> u64 {
        self.inner.lock().ledger_id()
    }

    fn is_empty(&self) -> bool {
        self.inner.lock().is_empty()
    }

    fn __len__(&self) -> usize {
        self.inner.lock().records().len()
    }

    /// Appends a record and returns its bytes (to append to the index file).
    fn append<'py>(
        &self,
        py: Python<'py>,
        txn: &Bound<'py, PyAny>,
        first: &Bound<'py, PyAny>,
        last: &Bound<'py, PyAny>,
        last_stable: &Bound<'py, PyAny>,
    ) -> BindResult<Bound<'py, PyBytes>> {
        let r = AbortedTxn {
            txn: txn_arg(txn, "txn")?,
            first: pos_arg(first, "first")?,
            last: pos_arg(last, "last")?,
            last_stable: pos_arg(last_stable, "last_stable")?,
        };
        self.inner.lock().append(r)?;
        Ok(PyBytes::new(py, &AbortedTxnIndex::encode_record(&r)))
    }

    /// `(records, complete)` for a fetch of `[fetch_start, upper_bound)`.
    fn collect<'py>(
        &self,
        py: Python<'py>,
        fetch_start: &Bound<'py, PyAny>,
        upper_bound: &Bound<'py, PyAny>,
    ) -> BindResult<(Bound<'py, PyList>, bool)> {
        let c = self.inner.lock().collect(
            pos_arg(fetch_start, "fetch_start")?,
            pos_arg(upper_bound, "upper_bound")?,
        );
        let rows = c
            .aborted
            .iter()
            .map(|r| record(py, r))
            .collect::<PyResult<Vec<_>>>()?;
        Ok((PyList::new(py, rows)?, c.complete))
    }

    /// Every record as `((most, least), first, last, last_stable)`.
    fn records<'py>(&self, py: Python<'py>) -> BindResult<Bound<'py, PyList>> {
        let g = self.inner.lock();
        let rows = g
            .records()
            .iter()
            .map(|r| record(py, r))
            .collect::<PyResult<Vec<_>>>()?;
        Ok(PyList::new(py, rows)?)
    }

    fn sanity_check(&self) -> BindResult<()> {
        Ok(self.inner.lock().sanity_check()?)
    }

    /// True when the index holds exactly these `(txn, marker position)` aborts.
    fn matches(&self, aborts: &Bound<'_, PyAny>) -> BindResult<bool> {
        Ok(self.inner.lock().matches(&aborts_arg(aborts)?))
    }

    fn encode<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.inner.lock().encode())
    }

    fn __repr__(&self) -> String {
        let g = self.inner.lock();
        format!(
            "AbortedTxnIndex(ledger_id={}, records={})",
            g.ledger_id(),
            g.records().len()
        )
    }
}

/// The offset index of an uploaded segment.
#[derive(Debug)]
#[pyclass(name = "SegmentIndex", module = "txnstream._native", frozen)]
pub struct PySegmentIndex {
    inner: SegmentIndex,
}

#[pymethods]
impl PySegmentIndex {
    /// Decodes and checks offset-index bytes; damage raises `CorruptIndexError`.
    #[staticmethod]
    fn decode(data: &Bound<'_, PyAny>) -> BindResult<Self> {
        let b = record_bytes(data, "data")?;
        Ok(Self {
            inner: SegmentIndex::decode(b.as_bytes())?,
        })
    }

    #[getter]
    fn ledger_id(&self) -> u64 {
        self.inner.ledger_id
    }

    #[getter]
    fn first_entry(&self) -> u64 {
        self.inner.first_entry
    }

    #[getter]
    fn last_entry(&self) -> Option<u64> {
        self.inner.last_entry()
    }

    #[getter]
    fn entry_count(&self) -> u64 {
        self.inner.entry_count()
    }

    #[getter]
    fn data_len(&self) -> u64 {
        self.inner.data_len
    }
}

/// A closed ledger of `ml` as a segment: `(data, offset_index_bytes, aborts)`
/// where `aborts` lists the ABORT markers found, `((most, least), Position)`
/// in log order (`scan_markers=False` for ledgers that are not topics).
#[pyfunction]
#[pyo3(signature = (ml, ledger_id, scan_markers = None))]
pub fn export_segment<'py>(
    py: Python<'py>,
    ml: &Bound<'py, PyAny>,
    ledger_id: &Bound<'py, PyAny>,
    scan_markers: Option<&Bound<'py, PyAny>>,
) -> BindResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>, Bound<'py, PyList>)> {
    let scan_markers = bool_arg(scan_markers, "scan_markers", true)?;
    let ml = ml.cast::<PyManagedLedger>().map_err(|_| {
        Error::invalid(format!("ml must be a ManagedLedger, not {}", type_name(ml)))
    })?;
    let id = id_arg(ledger_id, "ledger_id")?;
    let inner = &ml.get().inner;
    type Aborts = Vec<((u64, u64), Position)>;
    let (data, index, aborts) = py.detach(|| -> Result<(Vec<u8>, Vec<u8>, Aborts)> {
        let Some((_, count, sealed)) = inner.ledgers().into_iter().find(|l| l.0 == id) else {
            return Err(Error::invalid(format!(
                "ledger {id} is not in {}",
                inner.name()
            )));
        };
        if !sealed {
            return Err(Error::invalid(format!(
                "ledger {id} of {} is not closed; only closed ledgers are exported",
                inner.name()
            )));
        }
        let entries = if count == 0 {
            Vec::new()
        } else {
            inner.read_range(Position::new(id, 0), Position::new(id, count - 1))?
        };
        let first_entry = entries.first().map_or(0, |(p, _)| p.entry_id);
        let mut aborts = Vec::new();
        if scan_markers {
            for (p, e) in &entries {
                let meta = message::peek(e).map_err(|err| err.at(*p))?;
                if meta.marker_type == Some(MARKER_TXN_ABORT) {
                    if let Some(txn) = txn_of(&meta) {
                        aborts.push((txn, *p));
                    }
                }
            }
        }
        let (data, index) =
            encode_segment(id, first_entry, entries.iter().map(|(_, e)| e.as_slice()))?;
        Ok((data, index.encode(), aborts))
    })?;
    let aborts = aborts
        .into_iter()
        .map(|(t, p)| {
            PyTuple::new(
                py,
                [
                    PyTuple::new(py, [t.0, t.1])?.into_any().unbind(),
                    pos(py, p)?.into_any(),
                ],
            )
        })
        .collect::<PyResult<Vec<_>>>()?;
    Ok((
        PyBytes::new(py, &data),
        PyBytes::new(py, &index),
        PyList::new(py, aborts)?,
    ))
}

/// The entries of segment data (whole, or frames fetched from an entry's
/// offset), each checked against its frame checksum; `first` is the entry
/// id of the first frame (names a damaged entry in the error).
#[pyfunction]
pub fn decode_segment<'py>(
    py: Python<'py>,
    ledger_id: &Bound<'py, PyAny>,
    first: &Bound<'py, PyAny>,
    data: &Bound<'py, PyAny>,
) -> BindResult<Bound<'py, PyList>> {
    let ledger_id = id_arg(ledger_id, "ledger_id")?;
    let first = id_arg(first, "first")?;
    let b = record_bytes(data, "data")?;
    let bytes = b.as_bytes();
    let parts = py.detach(|| -> Result<Vec<(usize, usize)>> {
        let base = bytes.as_ptr() as usize;
        Ok(decode_frames(ledger_id, first, bytes)?
            .iter()
            .map(|e| (e.as_ptr() as usize - base, e.len()))
            .collect())
    })?;
    let items = parts
        .into_iter()
        .map(|(at, len)| PyBytes::new(py, &bytes[at..at + len]))
        .collect::<Vec<_>>();
    Ok(PyList::new(py, items)?)
}

/// crc32c (Castagnoli) of a whole buffer: the checksum a remote segment's
/// metadata records for its data, so frames reordered or swapped inside the
/// object (each still passing its own frame checksum) are caught on read.
#[pyfunction]
#[pyo3(name = "crc32c")]
pub fn buffer_crc32c<'py>(py: Python<'py>, data: &Bound<'py, PyAny>) -> BindResult<u32> {
    let b = record_bytes(data, "data")?;
    let bytes = b.as_bytes();
    Ok(py.detach(|| ::crc32c::crc32c(bytes)))
}
