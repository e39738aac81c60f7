//! Topic entries (Pulsar message format) for the broker: encoding of
//! messages, batches and markers, and bulk reads that decode a run of
//! entries with the GIL released (`read_messages`, `scan_topic`).

use crate::args::{
    count_arg, flag_arg, id_arg, named, opt_str_ref, seq_arg, str_pairs_arg, str_ref, txn_arg,
    type_name,
};
use crate::buffers::record_bytes;
use crate::errors::BindResult;
use crate::ledger::PyManagedLedger;
use crate::log_scan::existing_cursor;
use crate::position::{position_of, PyPosition};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};
use pyo3::IntoPyObjectExt;
use txnstream_core::ledger::{Cursor, ManagedLedger};
use txnstream_core::message::{
    self, highest_sequence_id, txn_of, DecodedEntry, Header, OutMessage,
};
use txnstream_core::{AckSet, Error, Position, Result};

/// Most entries one bulk read returns.
const MAX_READ_ENTRIES: i64 = 1 << 16;
/// Largest payload total (bytes) encoded without releasing the GIL.
const ENCODE_IN_PLACE_MAX: usize = 64 * 1024;

/// `properties`: None or a sequence of `(str, str)` tuples.
fn props_arg(obj: Option<&Bound<'_, PyAny>>, what: &str) -> BindResult<Vec<(String, String)>> {
    match obj.filter(|o| !o.is_none()) {
        None => Ok(Vec::new()),
        Some(p) => str_pairs_arg(p, what),
    }
}

/// `txn`: None or a `(most_bits, least_bits)` tuple.
fn opt_txn_arg(obj: Option<&Bound<'_, PyAny>>) -> BindResult<Option<(u64, u64)>> {
    obj.filter(|o| !o.is_none())
        .map(|t| txn_arg(t, "txn"))
        .transpose()
}

/// One message as an entry of its own, in Pulsar's format.
///
/// Called once per message sent: arguments are checked by type tests and
/// borrowed (``bytes`` payload and ``str`` names are not copied).
#[pyfunction]
#[pyo3(signature = (payload, producer_name, sequence_id, publish_time, key = None,
    properties = None, txn = None))]
#[allow(clippy::too_many_arguments)]
pub fn encode_message<'py>(
    py: Python<'py>,
    payload: &Bound<'py, PyAny>,
    producer_name: &Bound<'py, PyAny>,
    sequence_id: &Bound<'py, PyAny>,
    publish_time: &Bound<'py, PyAny>,
    key: Option<&Bound<'py, PyAny>>,
    properties: Option<&Bound<'py, PyAny>>,
    txn: Option<&Bound<'py, PyAny>>,
) -> BindResult<Bound<'py, PyBytes>> {
    let payload = record_bytes(payload, "payload")?;
    let props = props_arg(properties, "properties")?;
    let h = Header {
        producer_name: str_ref(producer_name, "producer_name")?,
        publish_time: id_arg(publish_time, "publish_time")?,
        txn: opt_txn_arg(txn)?,
    };
    let m = OutMessage {
        payload: payload.as_bytes(),
        key: opt_str_ref(key, "key")?,
        properties: &props,
        sequence_id: id_arg(sequence_id, "sequence_id")?,
    };
    Ok(PyBytes::new(py, &message::encode_message(&h, &m)))
}

/// One message of a batch from Python: payload, key, properties, sequence id.
type BatchItem<'py> = (
    Bound<'py, PyBytes>,
    Option<String>,
    Vec<(String, String)>,
    u64,
);

fn batch_item<'py>(item: &Bound<'py, PyAny>, at: &str) -> BindResult<BatchItem<'py>> {
    let t = item
        .cast::<PyTuple>()
        .ok()
        .filter(|t| t.len() == 4)
        .ok_or_else(|| {
            Error::invalid(format!(
                "{at} must be a (payload, key, properties, sequence_id) tuple, not {}",
                type_name(item)
            ))
        })?;
    let (payload, key, props, seq) = (
        t.get_item(0)?,
        t.get_item(1)?,
        t.get_item(2)?,
        t.get_item(3)?,
    );
    Ok((
        named(|n| record_bytes(&payload, n), || format!("{at} payload"))?,
        named(|n| opt_str_ref(Some(&key), n), || format!("{at} key"))?.map(str::to_owned),
        named(
            |n| props_arg(Some(&props), n),
            || format!("{at} properties"),
        )?,
        named(|n| id_arg(&seq, n), || format!("{at} sequence_id"))?,
    ))
}

/// Many messages as ONE batched entry (Pulsar batch format); each item is
/// ``(payload, key | None, properties | None, sequence_id)``.
#[pyfunction]
#[pyo3(signature = (messages, producer_name, publish_time, txn = None))]
pub fn encode_batch_message<'py>(
    py: Python<'py>,
    messages: &Bound<'py, PyAny>,
    producer_name: &Bound<'py, PyAny>,
    publish_time: &Bound<'py, PyAny>,
    txn: Option<&Bound<'py, PyAny>>,
) -> BindResult<Bound<'py, PyBytes>> {
    let messages = seq_arg(
        messages,
        "messages",
        "a sequence of (payload, key, properties, sequence_id) tuples",
        batch_item,
    )?;
    let out: Vec<OutMessage<'_>> = messages
        .iter()
        .map(|m| OutMessage {
            payload: m.0.as_bytes(), // immutable bytes: readable without the GIL
            key: m.1.as_deref(),
            properties: &m.2,
            sequence_id: m.3,
        })
        .collect();
    let h = Header {
        producer_name: str_ref(producer_name, "producer_name")?,
        publish_time: id_arg(publish_time, "publish_time")?,
        txn: opt_txn_arg(txn)?,
    };
    // Encoding is pure CPU: a small entry is cheaper than a GIL hand-off.
    let bytes: usize = out.iter().map(|m| m.payload.len()).sum();
    let entry = if bytes <= ENCODE_IN_PLACE_MAX {
        message::encode_batch(&h, &out)?
    } else {
        py.detach(|| message::encode_batch(&h, &out))?
    };
    Ok(PyBytes::new(py, &entry))
}

/// A transaction marker: COMMIT (``commit=True``, marker type 21) or ABORT (22).
#[pyfunction]
pub fn encode_marker<'py>(
    py: Python<'py>,
    commit: &Bound<'py, PyAny>,
    most_bits: &Bound<'py, PyAny>,
    least_bits: &Bound<'py, PyAny>,
    publish_time: &Bound<'py, PyAny>,
) -> BindResult<Bound<'py, PyBytes>> {
    let txn = (
        id_arg(most_bits, "most_bits")?,
        id_arg(least_bits, "least_bits")?,
    );
    Ok(PyBytes::new(
        py,
        &message::encode_marker(
            flag_arg(commit, "commit")?,
            txn,
            id_arg(publish_time, "publish_time")?,
        ),
    ))
}

fn opt_pos(obj: Option<&Bound<'_, PyAny>>, arg: &str) -> BindResult<Option<Position>> {
    match obj.filter(|o| !o.is_none()) {
        None => Ok(None),
        Some(o) => position_of(o).map(Some).ok_or_else(|| {
            Error::invalid(format!("{arg} must be a Position, TxnPosition or None")).into()
        }),
    }
}

/// Decode one topic entry into a dict (tools and tests): ``producer_name``,
/// ``sequence_id``, ``publish_time``, ``marker_type``, ``txn``, ``batch_size``,
/// ``batched`` and ``messages`` (dicts with ``payload``, ``key``,
/// ``properties``, ``sequence_id``, ``batch_index``).
#[pyfunction]
pub fn decode_topic_entry<'py>(
    py: Python<'py>,
    entry: &Bound<'py, PyAny>,
) -> BindResult<Bound<'py, PyDict>> {
    let entry = record_bytes(entry, "entry")?;
    let entry = entry.as_bytes();
    let d = message::decode(entry)?;
    let out = PyDict::new(py);
    out.set_item("producer_name", &d.meta.producer_name)?;
    out.set_item("sequence_id", d.meta.sequence_id)?;
    out.set_item("highest_sequence_id", highest_sequence_id(&d.meta))?;
    out.set_item("publish_time", d.meta.publish_time)?;
    out.set_item("marker_type", d.meta.marker_type)?;
    out.set_item("txn", d.txn())?;
    out.set_item("batch_size", d.batch_size)?;
    out.set_item("batched", d.batched)?;
    let msgs = PyList::empty(py);
    for m in &d.messages {
        let md = PyDict::new(py);
        md.set_item("payload", PyBytes::new(py, &entry[m.payload.clone()]))?;
        md.set_item("key", m.key.as_deref())?;
        md.set_item("properties", m.properties.clone())?;
        md.set_item("sequence_id", m.sequence_id)?;
        md.set_item("batch_index", m.batch_index)?;
        msgs.append(md)?;
    }
    out.set_item("messages", msgs)?;
    Ok(out)
}

/// Up to `max` existing positions after `after`, below `limit` (exclusive).
fn positions_after(
    ml: &ManagedLedger,
    after: Option<Position>,
    limit: Option<Position>,
    max: usize,
) -> Vec<Position> {
    let mut out = Vec::new();
    let mut cur = after;
    while out.len() < max {
        let Some(n) = ml.next_after(cur) else { break };
        if limit.is_some_and(|l| n >= l) {
            break;
        }
        out.push(n);
        cur = Some(n);
    }
    out
}

/// Reads the entries at `positions` (contiguous in the ledger's order).
fn read_entries(ml: &ManagedLedger, positions: &[Position]) -> Result<Vec<(Position, Vec<u8>)>> {
    let (Some(&first), Some(&last)) = (positions.first(), positions.last()) else {
        return Ok(Vec::new());
    };
    ml.read_range(first, last)
}

/// What a bulk read found: the last position looked at, how many entries,
/// the message entries, and the positions of markers (for the cursor).
type Run = (Option<Position>, usize, Vec<ReadEntry>, Vec<Position>);

/// What a bulk read found in one entry.
struct ReadEntry {
    pos: Position,
    data: Vec<u8>,
    decoded: DecodedEntry,
    /// The cursor's ack set of a partially acknowledged batch.
    acks: Option<AckSet>,
}

/// Read and decode a run of entries, GIL released.
fn read_run(
    ml: &ManagedLedger,
    cursor: Option<&Cursor>,
    after: Option<Position>,
    limit: Option<Position>,
    max: usize,
) -> Result<Run> {
    let positions = positions_after(ml, after, limit, max);
    let last = positions.last().copied();
    let scanned = positions.len();
    let mut out = Vec::with_capacity(positions.len());
    let mut markers = Vec::new();
    for (pos, data) in read_entries(ml, &positions)? {
        if cursor.is_some_and(|c| c.is_deleted(pos)) {
            continue;
        }
        let decoded = message::decode(&data).map_err(|e| e.at(pos))?;
        if decoded.marker().is_some() {
            markers.push(pos);
            continue;
        }
        let acks = cursor.and_then(|c| c.batch_ack_set(pos));
        out.push(ReadEntry {
            pos,
            data,
            decoded,
            acks,
        });
    }
    Ok((last.or(after), scanned, out, markers))
}

/// Read up to ``max_entries`` entries after ``after`` (None: from the
/// start) and below ``limit`` (exclusive; None: to the end), decode them in
/// Rust with the GIL released, and return ``(last, scanned, messages,
/// markers)``.
///
/// ``last`` is the last position looked at (markers and deleted entries
/// included; ``after`` when nothing was), ``scanned`` how many entries were
/// looked at. Markers never appear in ``messages``; with ``cursor`` (the
/// name of a cursor the ledger has: an unknown name is an
/// ``InvalidArgumentError``, not a new cursor) entries it deleted and batch indexes its ack sets deleted
/// are left out. Each message is a tuple ``(ledger_id, entry_id,
/// batch_index, batch_size, payload, key, properties, publish_time,
/// producer_name, sequence_id, txn)`` with ``properties`` a dict or None and
/// ``txn`` a ``(most_bits, least_bits)`` tuple or None; ``markers`` lists
/// the positions of the markers seen (not deleted by the cursor), so a
/// subscription can acknowledge them. A damaged entry raises
/// ``CorruptEntryError`` naming its position.
#[pyfunction]
#[pyo3(signature = (ml, cursor = None, after = None, limit = None, max_entries = None))]
pub fn read_messages<'py>(
    py: Python<'py>,
    ml: &Bound<'py, PyManagedLedger>,
    cursor: Option<&Bound<'py, PyAny>>,
    after: Option<&Bound<'py, PyAny>>,
    limit: Option<&Bound<'py, PyAny>>,
    max_entries: Option<&Bound<'py, PyAny>>,
) -> BindResult<Bound<'py, PyTuple>> {
    let max_entries = count_arg(max_entries, "max_entries", 1..=MAX_READ_ENTRIES, 256)?;
    let cursor = opt_str_ref(cursor, "cursor")?;
    let inner = &ml.get().inner;
    let after = opt_pos(after, "after")?;
    let limit = opt_pos(limit, "limit")?;
    let (last, scanned, entries, markers) = py.detach(|| -> Result<Run> {
        let cur = cursor.map(|c| existing_cursor(inner, c)).transpose()?;
        read_run(inner, cur.as_ref(), after, limit, max_entries as usize)
    })?;
    let msgs = PyList::empty(py);
    for e in &entries {
        let producer = PyString::new(py, &e.decoded.meta.producer_name);
        let txn = match txn_of(&e.decoded.meta) {
            Some(t) => t.into_bound_py_any(py)?,
            None => py.None().into_bound(py),
        };
        for m in &e.decoded.messages {
            if let Some(a) = &e.acks {
                if !a.get(i64::from(m.batch_index)).unwrap_or(true) {
                    continue;
                }
            }
            let props = if m.properties.is_empty() {
                py.None().into_bound(py)
            } else {
                let d = PyDict::new(py);
                for (k, v) in &m.properties {
                    d.set_item(k, v)?;
                }
                d.into_any()
            };
            let item = PyTuple::new(
                py,
                [
                    e.pos.ledger_id.into_bound_py_any(py)?,
                    e.pos.entry_id.into_bound_py_any(py)?,
                    m.batch_index.into_bound_py_any(py)?,
                    e.decoded.batch_size.into_bound_py_any(py)?,
                    PyBytes::new(py, &e.data[m.payload.clone()]).into_any(),
                    m.key.as_deref().into_bound_py_any(py)?,
                    props,
                    e.decoded.meta.publish_time.into_bound_py_any(py)?,
                    producer.clone().into_any(),
                    m.sequence_id.into_bound_py_any(py)?,
                    txn.clone(),
                ],
            )?;
            msgs.append(item)?;
        }
    }
    let last = last.map(PyPosition);
    let markers = markers
        .into_iter()
        .map(|p| Py::new(py, PyPosition(p)))
        .collect::<PyResult<Vec<_>>>()?;
    Ok(PyTuple::new(
        py,
        [
            last.into_bound_py_any(py)?,
            scanned.into_bound_py_any(py)?,
            msgs.into_any(),
            PyList::new(py, markers)?.into_any(),
        ],
    )?)
}

/// Read up to ``max_entries`` entries after ``after`` (exclusive; None:
/// from the first) and return their metadata only, GIL released: a list of
/// tuples ``(ledger_id, entry_id, marker_type, txn, producer_name,
/// sequence_ids)`` with ``marker_type`` an int or None, ``txn`` ``(most,
/// least)`` or None and ``sequence_ids`` the sequence id of each message
/// (batch-index order; empty for a marker). Used to rebuild a partition's
/// transaction buffer and deduplication state at recovery.
#[pyfunction]
#[pyo3(signature = (ml, after = None, max_entries = None))]
pub fn scan_topic<'py>(
    py: Python<'py>,
    ml: &Bound<'py, PyManagedLedger>,
    after: Option<&Bound<'py, PyAny>>,
    max_entries: Option<&Bound<'py, PyAny>>,
) -> BindResult<Bound<'py, PyList>> {
    let max_entries = count_arg(max_entries, "max_entries", 1..=MAX_READ_ENTRIES, 4096)?;
    let inner = &ml.get().inner;
    let after = opt_pos(after, "after")?;
    type Row = (u64, u64, Option<i32>, Option<(u64, u64)>, String, Vec<u64>);
    let rows = py.detach(|| -> Result<Vec<Row>> {
        let positions = positions_after(inner, after, None, max_entries as usize);
        let mut out = Vec::with_capacity(positions.len());
        for (pos, data) in read_entries(inner, &positions)? {
            let d = message::decode(&data).map_err(|e| e.at(pos))?;
            let seqs = d.messages.iter().map(|m| m.sequence_id).collect();
            out.push((
                pos.ledger_id,
                pos.entry_id,
                d.meta.marker_type,
                txn_of(&d.meta),
                d.meta.producer_name,
                seqs,
            ));
        }
        Ok(out)
    })?;
    Ok(PyList::new(py, rows)?)
}
