//! Coordinator transaction-log helpers: records encoded from arguments (no
//! protobuf object per record) and the recovery fold's result as columns.
//!
//! This module knows nothing of the ledger binding: folding a log read from
//! a managed ledger is `replay::fold_txn_log` (the reading side), which
//! hands the fold to [`folded_dict`] here.

use crate::args::{
    bool_arg, i64_arg, id_arg, opt_str_ref, seq_arg, str_list_arg, str_pairs_arg, u32_arg,
};
use crate::buffers::{bytes_list, with_slices};
use crate::errors::BindResult;
use numpy::IntoPyArray;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};
use txnstream_core::txnlog_fold::{Folded, TxnLogFolder, NO_NAME};
use txnstream_core::txnlog_record::{
    Encode, OP_ADD_PARTITION, OP_ADD_SUBSCRIPTION, OP_NEW, OP_UPDATE, STATUS_OPEN,
};
use txnstream_core::{AckSet, Error, Position};

fn status_arg(obj: &Bound<'_, PyAny>, arg: &str) -> BindResult<i8> {
    let v = i64_arg(obj, arg)?;
    match i8::try_from(v) {
        Ok(s) if (0..=4).contains(&s) => Ok(s),
        _ => Err(Error::invalid(format!("{arg} must be a TxnStatus value 0..4, got {v}")).into()),
    }
}

fn bytes<'py>(py: Python<'py>, e: &Encode<'_>) -> Bound<'py, PyBytes> {
    let mut buf = Vec::with_capacity(64);
    e.encode_to(&mut buf);
    PyBytes::new(py, &buf)
}

/// `(most_bits, least_bits, now)`, the first arguments of every encoder.
fn txn_now(
    most_bits: &Bound<'_, PyAny>,
    least_bits: &Bound<'_, PyAny>,
    now: &Bound<'_, PyAny>,
) -> BindResult<(u64, u64, u64)> {
    Ok((
        id_arg(most_bits, "most_bits")?,
        id_arg(least_bits, "least_bits")?,
        id_arg(now, "now")?,
    ))
}

/// A NEW record (status OPEN), byte-identical to the protobuf encoding.
///
/// The encoders run once per record in the commit path: arguments are
/// checked by type tests and borrowed, not converted through objects.
#[pyfunction]
#[pyo3(signature = (most_bits, least_bits, now, timeout_ms, client_name = None))]
pub fn encode_txn_new<'py>(
    py: Python<'py>,
    most_bits: &Bound<'py, PyAny>,
    least_bits: &Bound<'py, PyAny>,
    now: &Bound<'py, PyAny>,
    timeout_ms: &Bound<'py, PyAny>,
    client_name: Option<&Bound<'py, PyAny>>,
) -> BindResult<Bound<'py, PyBytes>> {
    let (most_bits, least_bits, now) = txn_now(most_bits, least_bits, now)?;
    Ok(bytes(
        py,
        &Encode {
            op: OP_NEW,
            least_bits,
            most_bits,
            new_status: Some(STATUS_OPEN),
            timeout_ms: Some(id_arg(timeout_ms, "timeout_ms")?),
            start_time: Some(now),
            last_modification_time: Some(now),
            max_local_txn_id: Some(least_bits),
            client_name: opt_str_ref(client_name, "client_name")?,
            ..Encode::default()
        },
    ))
}

/// An ADD_PARTITION record for ``partitions`` (a list of str).
#[pyfunction]
pub fn encode_txn_add_partitions<'py>(
    py: Python<'py>,
    most_bits: &Bound<'py, PyAny>,
    least_bits: &Bound<'py, PyAny>,
    now: &Bound<'py, PyAny>,
    partitions: &Bound<'py, PyAny>,
) -> BindResult<Bound<'py, PyBytes>> {
    let (most_bits, least_bits, now) = txn_now(most_bits, least_bits, now)?;
    let partitions = str_list_arg(partitions, "partitions")?;
    let parts: Vec<&str> = partitions.iter().map(String::as_str).collect();
    Ok(bytes(
        py,
        &Encode {
            op: OP_ADD_PARTITION,
            least_bits,
            most_bits,
            partitions: &parts,
            last_modification_time: Some(now),
            ..Encode::default()
        },
    ))
}

/// An ADD_SUBSCRIPTION record for ``(topic, subscription)`` pairs.
#[pyfunction]
pub fn encode_txn_add_subscriptions<'py>(
    py: Python<'py>,
    most_bits: &Bound<'py, PyAny>,
    least_bits: &Bound<'py, PyAny>,
    now: &Bound<'py, PyAny>,
    subscriptions: &Bound<'py, PyAny>,
) -> BindResult<Bound<'py, PyBytes>> {
    let (most_bits, least_bits, now) = txn_now(most_bits, least_bits, now)?;
    let subscriptions = str_pairs_arg(subscriptions, "subscriptions")?;
    let subs: Vec<(&str, &str)> = subscriptions
        .iter()
        .map(|(t, s)| (t.as_str(), s.as_str()))
        .collect();
    Ok(bytes(
        py,
        &Encode {
            op: OP_ADD_SUBSCRIPTION,
            least_bits,
            most_bits,
            subscriptions: &subs,
            last_modification_time: Some(now),
            ..Encode::default()
        },
    ))
}

/// An UPDATE record ``expected_status -> new_status``; ``timed_out`` marks
/// an abort caused by the timeout (txnstream field 1000, written only when
/// true).
#[pyfunction]
#[pyo3(signature = (most_bits, least_bits, now, expected_status, new_status, timed_out = None))]
pub fn encode_txn_update<'py>(
    py: Python<'py>,
    most_bits: &Bound<'py, PyAny>,
    least_bits: &Bound<'py, PyAny>,
    now: &Bound<'py, PyAny>,
    expected_status: &Bound<'py, PyAny>,
    new_status: &Bound<'py, PyAny>,
    timed_out: Option<&Bound<'py, PyAny>>,
) -> BindResult<Bound<'py, PyBytes>> {
    let (most_bits, least_bits, now) = txn_now(most_bits, least_bits, now)?;
    Ok(bytes(
        py,
        &Encode {
            op: OP_UPDATE,
            least_bits,
            most_bits,
            expected_status: Some(status_arg(expected_status, "expected_status")?),
            new_status: Some(status_arg(new_status, "new_status")?),
            last_modification_time: Some(now),
            timed_out: bool_arg(timed_out, "timed_out", false)?,
            ..Encode::default()
        },
    ))
}

/// The fold as the dict ``txnstream.coordinator.state.FoldResult`` reads.
pub fn folded_dict<'py>(py: Python<'py>, f: Folded) -> PyResult<Bound<'py, PyDict>> {
    // Interned names become shared str objects (memory and time).
    let strings: Vec<Bound<'py, PyString>> =
        f.strings.iter().map(|s| PyString::new(py, s)).collect();
    let pairs: Vec<Bound<'py, PyTuple>> = f
        .pairs
        .iter()
        .map(|&(t, s)| PyTuple::new(py, [&strings[t as usize], &strings[s as usize]]))
        .collect::<PyResult<_>>()?;
    let n = f.txns.len();
    let mut seq = Vec::with_capacity(n);
    let mut status = Vec::with_capacity(n);
    let mut timeout = Vec::with_capacity(n);
    let mut start = Vec::with_capacity(n);
    let mut modified = Vec::with_capacity(n);
    let mut timed_out = Vec::with_capacity(n);
    let mut offsets = Vec::with_capacity(n + 1);
    offsets.push(0i64);
    let none = py.None();
    let clients = PyList::empty(py);
    let parts = PyList::empty(py);
    let subs = PyList::empty(py);
    let total: usize = f.txns.iter().map(|t| t.positions.len()).sum();
    let (mut led, mut ent) = (Vec::with_capacity(total), Vec::with_capacity(total));
    let (mut bsz, mut bix) = (Vec::with_capacity(total), Vec::with_capacity(total));
    for t in &f.txns {
        seq.push(t.seq);
        status.push(t.status);
        timeout.push(t.timeout_ms);
        start.push(t.start_time);
        modified.push(t.last_modified);
        timed_out.push(t.timed_out);
        if t.client_name == NO_NAME {
            clients.append(&none)?;
        } else {
            clients.append(&strings[t.client_name as usize])?;
        }
        if t.partitions.is_empty() {
            parts.append(&none)?;
        } else {
            parts.append(PyList::new(
                py,
                t.partitions.iter().map(|&i| &strings[i as usize]),
            )?)?;
        }
        if t.subscriptions.is_empty() {
            subs.append(&none)?;
        } else {
            subs.append(PyList::new(
                py,
                t.subscriptions.iter().map(|&i| &pairs[i as usize]),
            )?)?;
        }
        for p in &t.positions {
            led.push(p.position.ledger_id);
            ent.push(p.position.entry_id);
            bsz.push(p.batch_size);
            bix.push(p.batch_index);
        }
        offsets.push(led.len() as i64);
    }
    let d = PyDict::new(py);
    d.set_item("seq", seq.into_pyarray(py))?;
    d.set_item("status", status.into_pyarray(py))?;
    d.set_item("timeout_ms", timeout.into_pyarray(py))?;
    d.set_item("start_time", start.into_pyarray(py))?;
    d.set_item("last_modified", modified.into_pyarray(py))?;
    d.set_item("timed_out", timed_out.into_pyarray(py))?;
    d.set_item("client_name", clients)?;
    d.set_item("partitions", parts)?;
    d.set_item("subscriptions", subs)?;
    d.set_item("pos_offsets", offsets.into_pyarray(py))?;
    d.set_item("ledger_id", led.into_pyarray(py))?;
    d.set_item("entry_id", ent.into_pyarray(py))?;
    d.set_item("batch_size", bsz.into_pyarray(py))?;
    d.set_item("batch_index", bix.into_pyarray(py))?;
    let purge = &f.purge;
    d.set_item(
        "purge_ledger_id",
        purge
            .iter()
            .map(|p| p.position.ledger_id)
            .collect::<Vec<_>>()
            .into_pyarray(py),
    )?;
    d.set_item(
        "purge_entry_id",
        purge
            .iter()
            .map(|p| p.position.entry_id)
            .collect::<Vec<_>>()
            .into_pyarray(py),
    )?;
    d.set_item(
        "purge_batch_size",
        purge
            .iter()
            .map(|p| p.batch_size)
            .collect::<Vec<_>>()
            .into_pyarray(py),
    )?;
    d.set_item(
        "purge_batch_index",
        purge
            .iter()
            .map(|p| p.batch_index)
            .collect::<Vec<_>>()
            .into_pyarray(py),
    )?;
    d.set_item("max_seq", f.max_seq.map_or(-1i128, i128::from))?;
    d.set_item("records", f.records)?;
    d.set_item("live_records", f.live_records)?;
    d.set_item("foreign_records", f.foreign_records)?;
    Ok(d)
}

/// Fold in-memory entries: ``entries[i]`` at ``(ledger_id[i], entry_id[i])``,
/// with the batch indexes ``deleted[i]`` already deleted.
#[pyfunction]
pub fn fold_txn_entries<'py>(
    py: Python<'py>,
    entries: &Bound<'py, PyAny>,
    ledger_id: &Bound<'py, PyAny>,
    entry_id: &Bound<'py, PyAny>,
    deleted: &Bound<'py, PyAny>,
    tc_id: &Bound<'py, PyAny>,
) -> BindResult<Bound<'py, PyDict>> {
    let entries = bytes_list(entries, "entries")?;
    let entries = with_slices(&entries)?;
    let ledger_id = seq_arg(ledger_id, "ledger_id", "a sequence of ints", id_arg)?;
    let entry_id = seq_arg(entry_id, "entry_id", "a sequence of ints", id_arg)?;
    let deleted = seq_arg(
        deleted,
        "deleted",
        "a sequence of sequences of batch indexes",
        |d, at| seq_arg(d, at, "a sequence of batch indexes", u32_arg),
    )?;
    let tc_id = id_arg(tc_id, "tc_id")?;
    let n = entries.len();
    if ledger_id.len() != n || entry_id.len() != n || deleted.len() != n {
        return Err(Error::invalid(format!(
            "entries, ledger_id, entry_id and deleted must have the same length, got {n}, {}, {}, {}",
            ledger_id.len(),
            entry_id.len(),
            deleted.len()
        ))
        .into());
    }
    let folded = py.detach(|| -> txnstream_core::Result<Folded> {
        let mut folder = TxnLogFolder::new(tc_id);
        for (i, entry) in entries.iter().enumerate() {
            let pos = Position::new(ledger_id[i], entry_id[i]);
            let acks = if deleted[i].is_empty() {
                None
            } else {
                let size =
                    txnstream_core::frame::for_each_record(entry, |_| {}).map_err(|e| e.at(pos))?;
                let mut a = AckSet::new(size as i64)?;
                for &b in &deleted[i] {
                    a.clear(i64::from(b))?;
                }
                Some(a)
            };
            folder.push_entry(pos, entry, acks.as_ref())?;
        }
        Ok(folder.finish())
    })?;
    Ok(folded_dict(py, folded)?)
}
