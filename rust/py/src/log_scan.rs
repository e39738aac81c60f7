//! `scan_log`: every stored record of a ledger range of a transaction or
//! pending-ack log as columns, with deleted flags and error rows (what the
//! Spark data source ``txnstream-log`` reads in each task).

use crate::args::{i64_arg, str_list_arg, str_ref};
use crate::errors::BindResult;
use crate::frame::{lenient_pending_ack_dict, lenient_txn_dict};
use crate::ledger::PyManagedLedger;
use numpy::IntoPyArray;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use txnstream_core::columns::{PendingAckColumns, RecordColumns, TxnLogColumns};
use txnstream_core::ledger::{Cursor, ManagedLedger};
use txnstream_core::log_scan::{scan_ledger, ScannedRows};
use txnstream_core::{Error, Result};

/// Rows per call unless told otherwise (an Arrow batch of a few MiB).
const DEFAULT_MAX_ROWS: usize = 65536;

fn u64_arg(obj: &Bound<'_, PyAny>, what: &str) -> BindResult<u64> {
    let v = i64_arg(obj, what)?;
    u64::try_from(v).map_err(|_| Error::invalid(format!("{what} must be >= 0, got {v}")).into())
}

/// Cursor `name` of `ml`, one of its `known` cursors: a name the ledger
/// does not have is an error rather than an empty new cursor (which would
/// be durable, and hold every ledger of the log back from trimming).
fn open_known(ml: &ManagedLedger, known: &[String], name: &str) -> Result<Cursor> {
    if !known.iter().any(|k| k == name) {
        return Err(Error::invalid(format!(
            "managed ledger {:?} has no cursor {name:?} (it has {known:?})",
            ml.name()
        )));
    }
    ml.open_cursor(name)
}

/// Existing cursor `name` of `ml` (see [`open_known`]), for readers that
/// must not create one.
pub(crate) fn existing_cursor(ml: &ManagedLedger, name: &str) -> Result<Cursor> {
    open_known(ml, &ml.cursor_names(), name)
}

/// The cursors named (all persisted ones when `names` is None); a name the
/// ledger does not have is an error rather than an empty new cursor.
fn cursors(ml: &ManagedLedger, names: Option<Vec<String>>) -> BindResult<Vec<Cursor>> {
    let known = ml.cursor_names();
    let names = names.unwrap_or_else(|| known.clone());
    Ok(names
        .iter()
        .map(|n| open_known(ml, &known, n))
        .collect::<Result<_>>()?)
}

fn scanned_into<'py, C>(
    py: Python<'py>,
    d: &Bound<'py, PyDict>,
    s: &mut ScannedRows<C>,
) -> PyResult<()> {
    d.set_item(
        "at_ledger_id",
        std::mem::take(&mut s.ledger_id).into_pyarray(py),
    )?;
    d.set_item(
        "at_entry_id",
        std::mem::take(&mut s.entry_id).into_pyarray(py),
    )?;
    d.set_item(
        "entry_size",
        std::mem::take(&mut s.entry_size).into_pyarray(py),
    )?;
    d.set_item("batched", std::mem::take(&mut s.batched).into_pyarray(py))?;
    d.set_item("deleted", std::mem::take(&mut s.deleted).into_pyarray(py))?;
    d.set_item("entries", s.entries)?;
    d.set_item("next_entry", s.next_entry)?;
    Ok(())
}

fn scan<C: RecordColumns + Send>(
    py: Python<'_>,
    ml: &ManagedLedger,
    range: (u64, u64, u64),
    names: Option<Vec<String>>,
    max_rows: usize,
) -> BindResult<ScannedRows<C>> {
    let (ledger_id, first, last) = range;
    let cs = cursors(ml, names)?;
    Ok(py.detach(|| scan_ledger::<C>(ml, ledger_id, first, last, &cs, max_rows))?)
}

/// Scans entries ``first_entry..=last_entry`` of ledger ``ledger_id`` of the
/// ``kind`` (``"txn"`` or ``"pending_ack"``) log ``ml``: the lenient columns
/// (``status``, ``error``) plus per-row ``at_ledger_id``, ``at_entry_id``,
/// ``entry_size``, ``batched`` and ``deleted`` (0, 1, 2 = unknown) by every
/// cursor in ``cursors`` (None: all of the log's cursors), and ``entries``,
/// ``next_entry`` (where to continue after ``max_rows``; None when done).
#[pyfunction]
#[pyo3(signature = (ml, kind, ledger_id, first_entry, last_entry, cursors = None, max_rows = None))]
#[allow(clippy::too_many_arguments)]
pub fn scan_log<'py>(
    py: Python<'py>,
    ml: &Bound<'py, PyManagedLedger>,
    kind: &Bound<'py, PyAny>,
    ledger_id: &Bound<'py, PyAny>,
    first_entry: &Bound<'py, PyAny>,
    last_entry: &Bound<'py, PyAny>,
    cursors: Option<&Bound<'py, PyAny>>,
    max_rows: Option<&Bound<'py, PyAny>>,
) -> BindResult<Bound<'py, PyDict>> {
    let kind = str_ref(kind, "kind")?;
    let cursors = cursors
        .filter(|c| !c.is_none())
        .map(|c| str_list_arg(c, "cursors"))
        .transpose()?;
    let range = (
        u64_arg(ledger_id, "ledger_id")?,
        u64_arg(first_entry, "first_entry")?,
        u64_arg(last_entry, "last_entry")?,
    );
    let max_rows = match max_rows {
        None => DEFAULT_MAX_ROWS,
        Some(m) => usize::try_from(u64_arg(m, "max_rows")?)
            .map_err(|_| Error::invalid("max_rows is too large"))?,
    };
    let ml = &ml.get().inner;
    match kind {
        "txn" => {
            let mut s = scan::<TxnLogColumns>(py, ml, range, cursors, max_rows)?;
            let rows = std::mem::take(&mut s.rows);
            let d = lenient_txn_dict(py, rows)?;
            scanned_into(py, &d, &mut s)?;
            Ok(d)
        }
        "pending_ack" => {
            let mut s = scan::<PendingAckColumns>(py, ml, range, cursors, max_rows)?;
            let rows = std::mem::take(&mut s.rows);
            let d = lenient_pending_ack_dict(py, rows)?;
            scanned_into(py, &d, &mut s)?;
            Ok(d)
        }
        other => Err(Error::invalid(format!(
            "kind must be \"txn\" or \"pending_ack\", got {other:?}"
        ))
        .into()),
    }
}
