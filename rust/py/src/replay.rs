//! Reading logs written by a BufferedWriter, in one call with the GIL
//! released: `replay_log` (live records as numpy columns) and
//! `fold_txn_log` (a coordinator's log folded into live transactions).

use crate::args::{i64_arg, id_arg, str_arg, str_ref, type_name};
use crate::errors::BindResult;
use crate::ledger::{PyCursor, PyManagedLedger};
use crate::position::position_of;
use crate::txnlog::folded_dict;
use numpy::IntoPyArray;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString};
use txnstream_core::ledger::Cursor;
use txnstream_core::replay::{self, LiveRecords};
use txnstream_core::txnlog_fold::{fold_cursor, Folded};
use txnstream_core::{Error, Position};

/// The cursor `cursor` on `ml`: a `Cursor` opened on `ml`, or a name
/// (opening by name returns the ledger's existing cursor state, or creates
/// the cursor). Another ledger's `Cursor` is refused: its deletions are not
/// this ledger's, and opening its name here would create a cursor.
fn cursor_of(ml: &PyManagedLedger, cursor: &Bound<'_, PyAny>) -> BindResult<Cursor> {
    if let Ok(c) = cursor.cast::<PyCursor>() {
        let c = c.get();
        return match c.on(&ml.inner) {
            Some(inner) => Ok(inner.clone()),
            None => Err(Error::invalid(format!(
                "cursor {:?} is a Cursor of {}, not of managed ledger {:?}",
                c.cursor_name(),
                c.ledger_name()
                    .map_or_else(|| "a closed ledger".to_owned(), |n| format!("{n:?}")),
                ml.inner.name()
            ))
            .into()),
        };
    }
    if !cursor.is_instance_of::<PyString>() {
        return Err(Error::invalid(format!(
            "cursor must be a Cursor of this ledger or a cursor name (str), not {}",
            type_name(cursor)
        ))
        .into());
    }
    let name = str_arg(cursor, "cursor")?;
    // A new cursor is made durable (a journal write and sync): not under the GIL.
    Ok(cursor.py().detach(|| ml.inner.open_cursor(&name))?)
}

fn pos(obj: Option<&Bound<'_, PyAny>>, arg: &str) -> BindResult<Option<Position>> {
    match obj {
        None => Ok(None),
        Some(o) => match position_of(o) {
            Some(p) => Ok(Some(p)),
            None => Err(Error::invalid(format!(
                "{arg} must be a Position or TxnPosition, not {}",
                o.get_type().name()?
            ))
            .into()),
        },
    }
}

fn columns<'py>(py: Python<'py>, r: LiveRecords) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("ledger_id", r.ledger_id.into_pyarray(py))?;
    d.set_item("entry_id", r.entry_id.into_pyarray(py))?;
    d.set_item("batch_size", r.batch_size.into_pyarray(py))?;
    d.set_item("batch_index", r.batch_index.into_pyarray(py))?;
    d.set_item("offsets", r.offsets.into_pyarray(py))?;
    d.set_item("data", PyBytes::new(py, &r.data))?;
    d.set_item("entries", r.entries)?;
    d.set_item("skipped", r.skipped)?;
    Ok(d)
}

/// Live records of ``ml`` as columns (see ``txnstream.replay``).
///
/// With ``cursor`` and no bounds: every record after the cursor's
/// mark-delete position, skipping deleted entries and batch indexes (the
/// cursor's read position is rewound and moved to the end). With ``start``
/// / ``end`` (inclusive, default: the whole log): that range, filtered by
/// the cursor if one is given. ``max_entries`` reads at most that many
/// entries from the cursor's read position instead (chunked replay).
#[pyfunction]
#[pyo3(signature = (ml, cursor = None, *, start = None, end = None, max_entries = None))]
pub fn replay_log<'py>(
    py: Python<'py>,
    ml: &Bound<'py, PyManagedLedger>,
    cursor: Option<&Bound<'py, PyAny>>,
    start: Option<&Bound<'py, PyAny>>,
    end: Option<&Bound<'py, PyAny>>,
    max_entries: Option<&Bound<'py, PyAny>>,
) -> BindResult<Bound<'py, PyDict>> {
    let ml = ml.get();
    // Every argument is checked before the cursor is opened (which may create it).
    let (start, end) = (pos(start, "start")?, pos(end, "end")?);
    let max_entries = max_entries
        .filter(|n| !n.is_none())
        .map(|n| i64_arg(n, "max_entries"))
        .transpose()?;
    let ranged = start.is_some() || end.is_some();
    if let Some(n) = max_entries {
        if n < 1 {
            return Err(Error::invalid(format!("max_entries must be >= 1, got {n}")).into());
        }
        if ranged {
            return Err(Error::invalid("give either max_entries or start/end, not both").into());
        }
        if cursor.is_none() {
            return Err(Error::invalid("max_entries needs a cursor").into());
        }
    }
    let cur = cursor.map(|c| cursor_of(ml, c)).transpose()?;
    let records = match (cur, max_entries) {
        (None, Some(_)) => return Err(Error::invalid("max_entries needs a cursor").into()),
        (Some(c), Some(n)) => py.detach(|| replay::replay_next(&c, n as usize))?,
        (Some(c), None) if !ranged => py.detach(|| replay::replay_all(&c))?,
        (c, None) => {
            let inner = &ml.inner;
            let (Some(first), Some(last)) = (inner.first_position(), inner.last_position()) else {
                return Ok(columns(py, LiveRecords::default())?);
            };
            let (s, e) = (start.unwrap_or(first).max(first), end.unwrap_or(last));
            if s > e || s > last {
                return Ok(columns(py, LiveRecords::default())?);
            }
            py.detach(|| replay::replay_range(inner, s, e, c.as_ref()))?
        }
    };
    Ok(columns(py, records)?)
}

/// Fold the transaction log ``ml`` as seen by cursor ``cursor`` (a name)
/// into the live transactions of coordinator ``tc_id`` (see
/// ``txnstream.coordinator.state``). Rewinds the cursor.
#[pyfunction]
pub fn fold_txn_log<'py>(
    py: Python<'py>,
    ml: &Bound<'py, PyManagedLedger>,
    cursor: &Bound<'py, PyAny>,
    tc_id: &Bound<'py, PyAny>,
) -> BindResult<Bound<'py, PyDict>> {
    let cursor = str_ref(cursor, "cursor")?;
    let tc_id = id_arg(tc_id, "tc_id")?;
    let inner = &ml.get().inner;
    let folded = py.detach(|| -> txnstream_core::Result<Folded> {
        let c = inner.open_cursor(cursor)?;
        fold_cursor(&c, tc_id)
    })?;
    Ok(folded_dict(py, folded)?)
}
