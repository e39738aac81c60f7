//! `txnstream.frame` and the bulk log decoders.

use crate::args::i64_arg;
use crate::buffers::{bytes_list, record_bytes, with_slices};
use crate::errors::BindResult;
use numpy::{IntoPyArray, PyArray1};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use txnstream_core::columns::{self, Utf8Column};
use txnstream_core::frame;

/// Builds one batched entry (magic + version + protobuf) from records.
#[pyfunction]
pub fn encode_batch<'py>(
    py: Python<'py>,
    records: &Bound<'py, PyAny>,
) -> BindResult<Bound<'py, PyBytes>> {
    let records = bytes_list(records, "records")?;
    let slices = with_slices(&records)?;
    if slices.is_empty() {
        return Err(txnstream_core::Error::invalid(
            "records must hold at least one record: an empty batch is not a valid entry",
        )
        .into());
    }
    let len = frame::encoded_len(slices.iter().map(|s| s.len()));
    // Encode straight into the new bytes object: no intermediate buffer.
    let out = PyBytes::new_with(py, len, |buf| {
        frame::encode_batch_to(&slices, buf).map_err(|e| crate::errors::to_pyerr(py, &e))
    })?;
    Ok(out)
}

/// Splits an entry into its records; an unbatched entry is one record.
#[pyfunction]
pub fn decode_entry<'py>(
    py: Python<'py>,
    entry: &Bound<'py, PyAny>,
) -> BindResult<Bound<'py, PyList>> {
    let entry = record_bytes(entry, "entry")?; // any buffer (bytes: no copy)
    let data = entry.as_bytes();
    if !frame::is_batched(data) {
        return Ok(PyList::new(py, [entry])?);
    }
    let list = PyList::empty(py);
    let mut failure = None;
    frame::for_each_record(data, |r| {
        if failure.is_none() {
            if let Err(e) = list.append(PyBytes::new(py, r)) {
                failure = Some(e);
            }
        }
    })?;
    if let Some(e) = failure {
        return Err(e.into());
    }
    Ok(list)
}

/// True when the entry starts with the batch magic 0x0E01.
#[pyfunction]
pub fn is_batched(entry: &Bound<'_, PyAny>) -> BindResult<bool> {
    Ok(frame::is_batched(record_bytes(entry, "entry")?.as_bytes()))
}

fn utf8<'py>(py: Python<'py>, d: &Bound<'py, PyDict>, name: &str, c: Utf8Column) -> PyResult<()> {
    d.set_item(format!("{name}_data"), PyBytes::new(py, &c.data))?;
    d.set_item(format!("{name}_offsets"), c.offsets.into_pyarray(py))?;
    Ok(())
}

/// Flat records of a bulk decode: data, offsets, entry_index, batch_index, batch_size.
type FlatTuple<'py> = (
    Bound<'py, PyBytes>,
    Bound<'py, PyArray1<i64>>,
    Bound<'py, PyArray1<u32>>,
    Bound<'py, PyArray1<u32>>,
    Bound<'py, PyArray1<u32>>,
);

/// Decodes many entries at once into flat records (Arrow binary layout).
#[pyfunction]
pub fn decode_entries<'py>(
    py: Python<'py>,
    entries: &Bound<'py, PyAny>,
) -> BindResult<FlatTuple<'py>> {
    let entries = bytes_list(entries, "entries")?;
    let slices = with_slices(&entries)?;
    let flat = py.detach(|| frame::decode_entries(&slices))?;
    Ok((
        PyBytes::new(py, &flat.data),
        flat.offsets.into_pyarray(py),
        flat.origin.entry_index.into_pyarray(py),
        flat.origin.batch_index.into_pyarray(py),
        flat.origin.batch_size.into_pyarray(py),
    ))
}

/// Puts the transaction-log columns into `d` (names of ``TxnLogColumns``).
pub(crate) fn txn_columns_into<'py>(
    py: Python<'py>,
    d: &Bound<'py, PyDict>,
    c: columns::TxnLogColumns,
) -> PyResult<()> {
    d.set_item("entry_index", c.origin.entry_index.into_pyarray(py))?;
    d.set_item("batch_index", c.origin.batch_index.into_pyarray(py))?;
    d.set_item("batch_size", c.origin.batch_size.into_pyarray(py))?;
    d.set_item("metadata_op", c.metadata_op.into_pyarray(py))?;
    d.set_item("txnid_most_bits", c.txnid_most_bits.into_pyarray(py))?;
    d.set_item("txnid_least_bits", c.txnid_least_bits.into_pyarray(py))?;
    d.set_item("expected_status", c.expected_status.into_pyarray(py))?;
    d.set_item("new_status", c.new_status.into_pyarray(py))?;
    d.set_item("timeout_ms", c.timeout_ms.into_pyarray(py))?;
    d.set_item("start_time", c.start_time.into_pyarray(py))?;
    d.set_item(
        "last_modification_time",
        c.last_modification_time.into_pyarray(py),
    )?;
    d.set_item("max_local_txn_id", c.max_local_txn_id.into_pyarray(py))?;
    d.set_item("timed_out", c.timed_out.into_pyarray(py))?;
    utf8(py, d, "owner", c.owner)?;
    utf8(py, d, "client_name", c.client_name)?;
    d.set_item("partition_offsets", c.partition_offsets.into_pyarray(py))?;
    utf8(py, d, "partitions", c.partitions)?;
    d.set_item(
        "subscription_offsets",
        c.subscription_offsets.into_pyarray(py),
    )?;
    utf8(py, d, "subscription_topics", c.subscription_topics)?;
    utf8(py, d, "subscription_names", c.subscription_names)?;
    Ok(())
}

/// Puts the pending-ack columns into `d` (names of ``PendingAckColumns``).
pub(crate) fn pending_ack_columns_into<'py>(
    py: Python<'py>,
    d: &Bound<'py, PyDict>,
    c: columns::PendingAckColumns,
) -> PyResult<()> {
    d.set_item("entry_index", c.origin.entry_index.into_pyarray(py))?;
    d.set_item("batch_index", c.origin.batch_index.into_pyarray(py))?;
    d.set_item("batch_size", c.origin.batch_size.into_pyarray(py))?;
    d.set_item("op", c.op.into_pyarray(py))?;
    d.set_item("ack_type", c.ack_type.into_pyarray(py))?;
    d.set_item("txnid_most_bits", c.txnid_most_bits.into_pyarray(py))?;
    d.set_item("txnid_least_bits", c.txnid_least_bits.into_pyarray(py))?;
    d.set_item("position_offsets", c.position_offsets.into_pyarray(py))?;
    d.set_item("ledger_id", c.ledger_id.into_pyarray(py))?;
    d.set_item("entry_id", c.entry_id.into_pyarray(py))?;
    d.set_item("position_batch_size", c.batch_size.into_pyarray(py))?;
    d.set_item("ack_set_offsets", c.ack_set_offsets.into_pyarray(py))?;
    d.set_item("ack_set_words", c.ack_set_words.into_pyarray(py))?;
    Ok(())
}

/// Decodes transaction-log entries into numpy columns.
#[pyfunction]
pub fn decode_txn_log_columns<'py>(
    py: Python<'py>,
    entries: &Bound<'py, PyAny>,
) -> BindResult<Bound<'py, PyDict>> {
    let entries = bytes_list(entries, "entries")?;
    let slices = with_slices(&entries)?;
    let c = py.detach(|| columns::decode_txn_log(&slices))?;
    let d = PyDict::new(py);
    txn_columns_into(py, &d, c)?;
    Ok(d)
}

/// Decodes pending-ack log entries into numpy columns.
#[pyfunction]
pub fn decode_pending_ack_columns<'py>(
    py: Python<'py>,
    entries: &Bound<'py, PyAny>,
) -> BindResult<Bound<'py, PyDict>> {
    let entries = bytes_list(entries, "entries")?;
    let slices = with_slices(&entries)?;
    let c = py.detach(|| columns::decode_pending_ack_log(&slices))?;
    let d = PyDict::new(py);
    pending_ack_columns_into(py, &d, c)?;
    Ok(d)
}

// ------------------------------------------------- Arrow-batched (Spark UDFs)

/// The bytes of a buffer object (``bytes``, a ``pyarrow.Buffer``, a
/// memoryview, a numpy array...), its items taken as raw bytes whatever
/// their type (an offsets buffer is int32 or int64 items), as
/// [`record_bytes`] takes records. ``bytes`` are used in place
/// (immutable); any other buffer is copied once while the GIL is held. A
/// read-only flag is no promise: a read-only memoryview of a ``bytearray``
/// changes whenever the ``bytearray`` does, and the work on these bytes
/// runs with the GIL released.
pub(crate) struct RawBytes<'py>(Bound<'py, PyBytes>);

impl<'py> RawBytes<'py> {
    /// Takes the bytes of `obj`; `what` names the argument in errors.
    pub(crate) fn of(obj: &Bound<'py, PyAny>, what: &str) -> BindResult<Self> {
        Ok(Self(record_bytes(obj, what)?))
    }

    /// The bytes: immutable while `self` lives, so slices of them may be
    /// read with the GIL released.
    pub(crate) fn as_slice(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

/// An Arrow ``binary``/``large_binary`` array given by its buffers.
struct ArrowBinary<'py> {
    offsets: RawBytes<'py>,
    data: RawBytes<'py>,
    width: usize,
    start: usize,
    len: usize,
}

impl<'py> ArrowBinary<'py> {
    fn of(
        offsets: &Bound<'py, PyAny>,
        data: &Bound<'py, PyAny>,
        offset_width: &Bound<'_, PyAny>,
        start: &Bound<'_, PyAny>,
        length: &Bound<'_, PyAny>,
    ) -> BindResult<Self> {
        let count = |obj: &Bound<'_, PyAny>, what: &str| -> BindResult<usize> {
            let v = i64_arg(obj, what)?;
            usize::try_from(v).map_err(|_| {
                txnstream_core::Error::invalid(format!("{what} must be >= 0, got {v}")).into()
            })
        };
        Ok(Self {
            offsets: RawBytes::of(offsets, "offsets")?,
            data: RawBytes::of(data, "data")?,
            width: count(offset_width, "offset_width")?,
            start: count(start, "offset")?,
            len: count(length, "length")?,
        })
    }

    fn values(&self) -> txnstream_core::Result<Vec<&[u8]>> {
        columns::arrow_binary_values(
            self.offsets.as_slice(),
            self.width,
            self.start,
            self.len,
            self.data.as_slice(),
        )
    }
}

/// Puts a lenient decode's row status, origin and errors into `d`.
pub(crate) fn lenient_into<'py, C>(
    py: Python<'py>,
    d: &Bound<'py, PyDict>,
    l: &mut columns::Lenient<C>,
) -> PyResult<()> {
    d.set_item("status", std::mem::take(&mut l.status).into_pyarray(py))?;
    utf8(py, d, "error", std::mem::take(&mut l.error))?;
    Ok(())
}

/// Lenient transaction-log columns of a lenient decode as a dict.
pub(crate) fn lenient_txn_dict<'py>(
    py: Python<'py>,
    mut l: columns::Lenient<columns::TxnLogColumns>,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    lenient_into(py, &d, &mut l)?;
    let mut c = l.columns;
    c.origin = l.origin;
    txn_columns_into(py, &d, c)?;
    Ok(d)
}

/// Lenient pending-ack columns of a lenient decode as a dict.
pub(crate) fn lenient_pending_ack_dict<'py>(
    py: Python<'py>,
    mut l: columns::Lenient<columns::PendingAckColumns>,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    lenient_into(py, &d, &mut l)?;
    let mut c = l.columns;
    c.origin = l.origin;
    pending_ack_columns_into(py, &d, c)?;
    Ok(d)
}

/// Whether each value of an Arrow binary array (given by its ``offsets``
/// and ``data`` buffers, ``offset_width`` 4 or 8, slice ``offset`` and
/// ``length``) is a batched entry.
#[pyfunction]
pub fn arrow_is_batched<'py>(
    py: Python<'py>,
    offsets: &Bound<'py, PyAny>,
    data: &Bound<'py, PyAny>,
    offset_width: &Bound<'py, PyAny>,
    offset: &Bound<'py, PyAny>,
    length: &Bound<'py, PyAny>,
) -> BindResult<Bound<'py, PyArray1<bool>>> {
    let a = ArrowBinary::of(offsets, data, offset_width, offset, length)?;
    let values = a.values()?; // slices of immutable bytes: readable without the GIL
    let out: Vec<bool> = py.detach(|| values.iter().map(|e| frame::is_batched(e)).collect());
    Ok(out.into_pyarray(py))
}

/// Splits every entry of an Arrow binary array into its records: a dict of
/// ``data`` (bytes) + ``offsets`` (int64, n+1) of the records,
/// ``entry_offsets`` (int32, one list per entry) and ``failed`` (bool per
/// entry: malformed, no records).
#[pyfunction]
pub fn arrow_decode_entries<'py>(
    py: Python<'py>,
    offsets: &Bound<'py, PyAny>,
    data: &Bound<'py, PyAny>,
    offset_width: &Bound<'py, PyAny>,
    offset: &Bound<'py, PyAny>,
    length: &Bound<'py, PyAny>,
) -> BindResult<Bound<'py, PyDict>> {
    let a = ArrowBinary::of(offsets, data, offset_width, offset, length)?;
    let values = a.values()?;
    let l = py.detach(|| frame::decode_entry_lists(&values))?;
    let d = PyDict::new(py);
    d.set_item("data", PyBytes::new(py, &l.flat.data))?;
    d.set_item("offsets", l.flat.offsets.into_pyarray(py))?;
    d.set_item("entry_offsets", l.entry_offsets.into_pyarray(py))?;
    d.set_item("failed", l.failed.into_pyarray(py))?;
    Ok(d)
}

/// Decodes the transaction-log entries of an Arrow binary array leniently:
/// the columns of ``decode_txn_log_columns`` plus ``status`` (0 ok, 1 bad
/// record, 2 bad entry) and an ``error`` string column, one row per record
/// (one per malformed entry); ``entry_index`` maps rows to array values.
#[pyfunction]
pub fn arrow_txn_log_columns<'py>(
    py: Python<'py>,
    offsets: &Bound<'py, PyAny>,
    data: &Bound<'py, PyAny>,
    offset_width: &Bound<'py, PyAny>,
    offset: &Bound<'py, PyAny>,
    length: &Bound<'py, PyAny>,
) -> BindResult<Bound<'py, PyDict>> {
    let a = ArrowBinary::of(offsets, data, offset_width, offset, length)?;
    let values = a.values()?;
    let l = py.detach(|| columns::decode_lenient::<columns::TxnLogColumns>(&values))?;
    Ok(lenient_txn_dict(py, l)?)
}

/// The pending-ack counterpart of ``arrow_txn_log_columns``.
#[pyfunction]
pub fn arrow_pending_ack_columns<'py>(
    py: Python<'py>,
    offsets: &Bound<'py, PyAny>,
    data: &Bound<'py, PyAny>,
    offset_width: &Bound<'py, PyAny>,
    offset: &Bound<'py, PyAny>,
    length: &Bound<'py, PyAny>,
) -> BindResult<Bound<'py, PyDict>> {
    let a = ArrowBinary::of(offsets, data, offset_width, offset, length)?;
    let values = a.values()?;
    let l = py.detach(|| columns::decode_lenient::<columns::PendingAckColumns>(&values))?;
    Ok(lenient_pending_ack_dict(py, l)?)
}
