//! `txnstream.frame` and the bulk log decoders.

use crate::buffers::{bytes_list, with_slices};
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
    entry: &Bound<'py, PyBytes>,
) -> BindResult<Bound<'py, PyList>> {
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
pub fn is_batched(entry: &[u8]) -> bool {
    frame::is_batched(entry)
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
    utf8(py, &d, "owner", c.owner)?;
    utf8(py, &d, "client_name", c.client_name)?;
    d.set_item("partition_offsets", c.partition_offsets.into_pyarray(py))?;
    utf8(py, &d, "partitions", c.partitions)?;
    d.set_item(
        "subscription_offsets",
        c.subscription_offsets.into_pyarray(py),
    )?;
    utf8(py, &d, "subscription_topics", c.subscription_topics)?;
    utf8(py, &d, "subscription_names", c.subscription_names)?;
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
    Ok(d)
}
