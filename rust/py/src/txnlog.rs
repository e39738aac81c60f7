//! Coordinator transaction-log helpers: records encoded from arguments (no
//! protobuf object per record) and the recovery fold's result as columns.
//!
//! This module knows nothing of the ledger binding: folding a log read from
//! a managed ledger is `replay::fold_txn_log` (the reading side), which
//! hands the fold to [`folded_dict`] here.

use crate::errors::BindResult;
use numpy::IntoPyArray;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};
use txnstream_core::txnlog_fold::{Folded, TxnLogFolder, NO_NAME};
use txnstream_core::txnlog_record::{
    Encode, OP_ADD_PARTITION, OP_ADD_SUBSCRIPTION, OP_NEW, OP_UPDATE, STATUS_OPEN,
};
use txnstream_core::{AckSet, Error, Position};

fn status_arg(v: i64, arg: &str) -> BindResult<i8> {
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

/// A NEW record (status OPEN), byte-identical to the protobuf encoding.
#[pyfunction]
#[pyo3(signature = (most_bits, least_bits, now, timeout_ms, client_name = None))]
pub fn encode_txn_new<'py>(
    py: Python<'py>,
    most_bits: u64,
    least_bits: u64,
    now: u64,
    timeout_ms: u64,
    client_name: Option<&str>,
) -> Bound<'py, PyBytes> {
    bytes(
        py,
        &Encode {
            op: OP_NEW,
            least_bits,
            most_bits,
            new_status: Some(STATUS_OPEN),
            timeout_ms: Some(timeout_ms),
            start_time: Some(now),
            last_modification_time: Some(now),
            max_local_txn_id: Some(least_bits),
            client_name,
            ..Encode::default()
        },
    )
}

/// An ADD_PARTITION record for ``partitions`` (a list of str).
#[pyfunction]
pub fn encode_txn_add_partitions<'py>(
    py: Python<'py>,
    most_bits: u64,
    least_bits: u64,
    now: u64,
    partitions: Vec<String>,
) -> Bound<'py, PyBytes> {
    let parts: Vec<&str> = partitions.iter().map(String::as_str).collect();
    bytes(
        py,
        &Encode {
            op: OP_ADD_PARTITION,
            least_bits,
            most_bits,
            partitions: &parts,
            last_modification_time: Some(now),
            ..Encode::default()
        },
    )
}

/// An ADD_SUBSCRIPTION record for ``(topic, subscription)`` pairs.
#[pyfunction]
pub fn encode_txn_add_subscriptions<'py>(
    py: Python<'py>,
    most_bits: u64,
    least_bits: u64,
    now: u64,
    subscriptions: Vec<(String, String)>,
) -> Bound<'py, PyBytes> {
    let subs: Vec<(&str, &str)> = subscriptions
        .iter()
        .map(|(t, s)| (t.as_str(), s.as_str()))
        .collect();
    bytes(
        py,
        &Encode {
            op: OP_ADD_SUBSCRIPTION,
            least_bits,
            most_bits,
            subscriptions: &subs,
            last_modification_time: Some(now),
            ..Encode::default()
        },
    )
}

/// An UPDATE record ``expected_status -> new_status``; ``timed_out`` marks
/// an abort caused by the timeout (txnstream field 1000, written only when
/// true).
#[pyfunction]
#[pyo3(signature = (most_bits, least_bits, now, expected_status, new_status, timed_out = false))]
pub fn encode_txn_update<'py>(
    py: Python<'py>,
    most_bits: u64,
    least_bits: u64,
    now: u64,
    expected_status: i64,
    new_status: i64,
    timed_out: bool,
) -> BindResult<Bound<'py, PyBytes>> {
    Ok(bytes(
        py,
        &Encode {
            op: OP_UPDATE,
            least_bits,
            most_bits,
            expected_status: Some(status_arg(expected_status, "expected_status")?),
            new_status: Some(status_arg(new_status, "new_status")?),
            last_modification_time: Some(now),
            timed_out,
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
    entries: Vec<Vec<u8>>,
    ledger_id: Vec<u64>,
    entry_id: Vec<u64>,
    deleted: Vec<Vec<u32>>,
    tc_id: u64,
) -> BindResult<Bound<'py, PyDict>> {
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
