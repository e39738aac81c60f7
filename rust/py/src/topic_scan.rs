//! Columnar topic scans for the Spark data source `txnstream`: a ledger
//! range (`scan_topic_columns`) or a remote segment's data
//! (`scan_segment_columns`) decoded with the GIL released into numpy
//! arrays and bytes (names of `TopicColumns`).

use crate::args::i64_arg;
use crate::buffers::record_bytes;
use crate::errors::BindResult;
use crate::ledger::PyManagedLedger;
use crate::position::{id_arg, position_of, PyPosition};
use numpy::IntoPyArray;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use std::collections::HashSet;
use txnstream_core::columns::Utf8Column;
use txnstream_core::topic_scan::{
    self, ScanLimits, SegmentCursor, SegmentScan, TopicColumns, TopicScan, TxnId,
};
use txnstream_core::{Error, Position};

/// Most entries one call may look at.
const MAX_ENTRIES: i64 = 1 << 20;
/// Payload bytes after which a call stops unless told otherwise.
const DEFAULT_MAX_BYTES: i64 = 32 << 20;
/// Largest `max_bytes` (the int32 offsets of Arrow `binary`).
const MAX_BYTES: i64 = 1 << 30;

fn bounded(
    obj: Option<&Bound<'_, PyAny>>,
    what: &str,
    default: i64,
    max: i64,
) -> BindResult<usize> {
    let v = match obj {
        None => default,
        Some(o) => i64_arg(o, what)?,
    };
    if !(1..=max).contains(&v) {
        return Err(Error::invalid(format!("{what} must be in 1..={max}, got {v}")).into());
    }
    Ok(v as usize)
}

fn opt_pos(obj: Option<&Bound<'_, PyAny>>, arg: &str) -> BindResult<Option<Position>> {
    match obj.filter(|o| !o.is_none()) {
        None => Ok(None),
        Some(o) => position_of(o).map(Some).ok_or_else(|| {
            Error::invalid(format!("{arg} must be a Position, TxnPosition or None")).into()
        }),
    }
}

/// The `aborted` argument: any iterable of `(most_bits, least_bits)`.
fn aborted_arg(obj: Option<&Bound<'_, PyAny>>) -> BindResult<Option<HashSet<TxnId>>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    let items = obj.try_iter().map_err(|_| {
        Error::invalid("aborted must be an iterable of (most_bits, least_bits) tuples or None")
    })?;
    let mut out = HashSet::new();
    for item in items {
        let item = item?;
        let t: (u64, u64) = item.extract().map_err(|_| {
            Error::invalid(format!(
                "aborted holds {item}, not a (most_bits, least_bits) pair of ints in 0..2**64"
            ))
        })?;
        out.insert(t);
    }
    Ok(Some(out))
}

fn utf8<'py>(py: Python<'py>, d: &Bound<'py, PyDict>, name: &str, c: Utf8Column) -> PyResult<()> {
    d.set_item(format!("{name}_data"), PyBytes::new(py, &c.data))?;
    d.set_item(format!("{name}_offsets"), c.offsets.into_pyarray(py))?;
    Ok(())
}

fn columns_dict(py: Python<'_>, c: TopicColumns) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("rows", c.len())?;
    d.set_item("value_data", PyBytes::new(py, &c.value.data))?;
    d.set_item("value_offsets", c.value.offsets.into_pyarray(py))?;
    utf8(py, &d, "key", c.key)?;
    d.set_item("key_valid", c.key_valid.into_pyarray(py))?;
    d.set_item("ledger_id", c.ledger_id.into_pyarray(py))?;
    d.set_item("entry_id", c.entry_id.into_pyarray(py))?;
    d.set_item("batch_index", c.batch_index.into_pyarray(py))?;
    d.set_item("batch_size", c.batch_size.into_pyarray(py))?;
    d.set_item("publish_time", c.publish_time.into_pyarray(py))?;
    utf8(py, &d, "producer_name", c.producer_name)?;
    d.set_item("sequence_id", c.sequence_id.into_pyarray(py))?;
    d.set_item("txnid_most_bits", c.txnid_most_bits.into_pyarray(py))?;
    d.set_item("txnid_least_bits", c.txnid_least_bits.into_pyarray(py))?;
    d.set_item("txn_valid", c.txn_valid.into_pyarray(py))?;
    d.set_item("property_offsets", c.property_offsets.into_pyarray(py))?;
    utf8(py, &d, "property_keys", c.property_keys)?;
    utf8(py, &d, "property_values", c.property_values)?;
    Ok(d)
}

/// Scans the entries of ``ml`` after ``after`` (exclusive; None: from the
/// first) and before ``limit`` (exclusive; None: to the end), at most
/// ``max_entries`` entries and stopping once the payloads hold
/// ``max_bytes``, into columns, GIL released. Markers are never rows;
/// messages of the transactions in ``aborted`` (``(most, least)`` pairs)
/// are dropped; acknowledgements play no part.
///
/// Returns a dict: ``rows``; ``value_data``/``value_offsets``,
/// ``key_data``/``key_offsets``/``key_valid``, ``ledger_id``, ``entry_id``,
/// ``batch_index``, ``batch_size``, ``publish_time``,
/// ``producer_name_data``/``producer_name_offsets``, ``sequence_id``,
/// ``txnid_most_bits``/``txnid_least_bits``/``txn_valid``,
/// ``property_offsets``, ``property_keys_*``, ``property_values_*``
/// (numpy arrays, bytes), and ``last`` (last position looked at, ``after``
/// when none), ``entries``, ``markers``. A damaged entry raises
/// ``CorruptEntryError`` naming its position.
#[pyfunction]
#[pyo3(signature = (ml, after = None, limit = None, max_entries = None, max_bytes = None,
    aborted = None))]
pub fn scan_topic_columns<'py>(
    py: Python<'py>,
    ml: &Bound<'py, PyManagedLedger>,
    after: Option<&Bound<'py, PyAny>>,
    limit: Option<&Bound<'py, PyAny>>,
    max_entries: Option<&Bound<'py, PyAny>>,
    max_bytes: Option<&Bound<'py, PyAny>>,
    aborted: Option<&Bound<'py, PyAny>>,
) -> BindResult<Bound<'py, PyDict>> {
    let limits = ScanLimits {
        max_entries: bounded(max_entries, "max_entries", 1024, MAX_ENTRIES)?,
        max_bytes: bounded(max_bytes, "max_bytes", DEFAULT_MAX_BYTES, MAX_BYTES)?,
    };
    let after = opt_pos(after, "after")?;
    let limit = opt_pos(limit, "limit")?;
    let aborted = aborted_arg(aborted)?;
    let inner = &ml.get().inner;
    let s: TopicScan = py
        .detach(|| topic_scan::scan_topic_columns(inner, after, limit, limits, aborted.as_ref()))?;
    let d = columns_dict(py, s.columns)?;
    d.set_item("last", s.last.map(PyPosition))?;
    d.set_item("entries", s.entries)?;
    d.set_item("markers", s.markers)?;
    Ok(d)
}

/// Scans remote segment ``data`` (any buffer) of ledger ``ledger_id`` from
/// the frame at byte ``offset`` whose entry id is ``entry_id`` (0 and the
/// segment's first entry to start): entries ``start_entry..=last_entry``
/// into the columns of :func:`scan_topic_columns`, GIL released, markers
/// and ``aborted`` transactions dropped. The dict also holds ``entries``,
/// ``markers`` and ``next_offset`` / ``next_entry`` (where to go on; None
/// when the range or the data ended). A frame that fails its checksum or
/// an entry that does not decode raises ``CorruptEntryError`` naming its
/// position.
#[pyfunction]
#[pyo3(signature = (data, ledger_id, offset, entry_id, start_entry, last_entry,
    max_entries = None, max_bytes = None, aborted = None))]
#[allow(clippy::too_many_arguments)]
pub fn scan_segment_columns<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyAny>,
    ledger_id: &Bound<'py, PyAny>,
    offset: &Bound<'py, PyAny>,
    entry_id: &Bound<'py, PyAny>,
    start_entry: &Bound<'py, PyAny>,
    last_entry: &Bound<'py, PyAny>,
    max_entries: Option<&Bound<'py, PyAny>>,
    max_bytes: Option<&Bound<'py, PyAny>>,
    aborted: Option<&Bound<'py, PyAny>>,
) -> BindResult<Bound<'py, PyDict>> {
    let limits = ScanLimits {
        max_entries: bounded(max_entries, "max_entries", 1024, MAX_ENTRIES)?,
        max_bytes: bounded(max_bytes, "max_bytes", DEFAULT_MAX_BYTES, MAX_BYTES)?,
    };
    let ledger_id = id_arg(ledger_id, "ledger_id")?;
    let offset = usize::try_from(id_arg(offset, "offset")?)
        .map_err(|_| Error::invalid("offset is too large"))?;
    let from = SegmentCursor {
        offset,
        entry_id: id_arg(entry_id, "entry_id")?,
    };
    let start_entry = id_arg(start_entry, "start_entry")?;
    let last_entry = id_arg(last_entry, "last_entry")?;
    let aborted = aborted_arg(aborted)?;
    let b = record_bytes(data, "data")?;
    let bytes = b.as_bytes();
    let s: SegmentScan = py.detach(|| {
        topic_scan::scan_segment_columns(
            ledger_id,
            bytes,
            from,
            start_entry,
            last_entry,
            limits,
            aborted.as_ref(),
        )
    })?;
    let d = columns_dict(py, s.columns)?;
    d.set_item("next_offset", s.next.map(|c| c.offset))?;
    d.set_item("next_entry", s.next.map(|c| c.entry_id))?;
    d.set_item("entries", s.entries)?;
    d.set_item("markers", s.markers)?;
    Ok(d)
}
