//! `txnstream.ManagedLedger`, its `Cursor` and `CompactedTopic`.
//!
//! Every call that touches the disk or waits (including on a lock some
//! thread may hold across an fsync) runs with the GIL released. A cursor's
//! in-memory checks and small acknowledgements (`is_deleted`,
//! `batch_ack_set`, `mark_delete`, `delete` of up to [`IN_PLACE_MAX`]
//! records, `rewind`) keep it: they take only locks that are never held
//! across I/O, for a few microseconds, and releasing the GIL for them cost
//! more than the call (another thread takes it, and the caller waits for it
//! back: ~8 us per `is_deleted` in the consume-transform-produce benchmark,
//! under 1 us without the hand-off). Async
//! appends resolve `concurrent.futures.Future`s; the ledger's writer thread
//! never takes the GIL: it hands (future, outcome) pairs to the completion
//! thread ([`crate::completion`]).

use crate::ackset::PyAckSet;
use crate::args::{array_arg, bool_arg, i64_arg, named, path_arg, str_arg, timeout_ms_arg};
use crate::buffers::{bytes_list, record_bytes, with_slices};
use crate::completion::{future_with_callback, object_list, Job};
use crate::errors::BindResult;
use crate::position::{position_of, PyPosition, PyTxnPosition};
use pyo3::exceptions::PyTimeoutError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use pyo3::IntoPyObjectExt;
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;
use txnstream_core::ledger::{CompactedTopic, Cursor, LedgerOptions, ManagedLedger};
use txnstream_core::sink::EntrySink;
use txnstream_core::{Error, Position, TxnPosition};

/// Most records a cursor `delete` applies without releasing the GIL.
const IN_PLACE_MAX: usize = 64;

// ---------------------------------------------------------------- results

fn positions<'py>(py: Python<'py>, ps: &[Position]) -> PyResult<Bound<'py, PyList>> {
    object_list(py, ps.iter().copied().map(PyPosition))
}

fn entries<'py>(py: Python<'py>, es: Vec<(Position, Vec<u8>)>) -> PyResult<Bound<'py, PyList>> {
    let items = es
        .into_iter()
        .map(|(p, d)| {
            let pos = Py::new(py, PyPosition(p))?.into_any();
            let data = PyBytes::new(py, &d).into_any().unbind();
            PyTuple::new(py, [pos, data])
        })
        .collect::<PyResult<Vec<_>>>()?;
    PyList::new(py, items)
}

// ---------------------------------------------------------------- arguments

pub(crate) use crate::args::id_arg;

/// A `Position`, a `TxnPosition` or a `(ledger_id, entry_id)` tuple.
pub(crate) fn pos_arg(obj: &Bound<'_, PyAny>, arg: &str) -> BindResult<Position> {
    if let Some(p) = position_of(obj) {
        return Ok(p);
    }
    if let Ok(t) = obj.cast::<PyTuple>() {
        if t.len() == 2 {
            let (l, e) = (t.get_item(0)?, t.get_item(1)?);
            let l = named(|n| id_arg(&l, n), || format!("{arg} ledger_id"))?;
            let e = named(|n| id_arg(&e, n), || format!("{arg} entry_id"))?;
            return Ok(Position::new(l, e));
        }
    }
    Err(Error::invalid(format!(
        "{arg} must be a Position, TxnPosition or (ledger_id, entry_id) tuple, not {}",
        obj.get_type().name()?
    ))
    .into())
}

/// Like [`pos_arg`] but keeps a `TxnPosition`'s batch fields.
fn record_arg(obj: &Bound<'_, PyAny>, arg: &str) -> BindResult<TxnPosition> {
    if let Ok(t) = obj.cast::<PyTxnPosition>() {
        return Ok(t.get().0);
    }
    Ok(TxnPosition::single(pos_arg(obj, arg)?))
}

/// An optional int option (`None`: the default), typed-checked by
/// [`crate::args::i64_arg`] so that a wrong type or a huge value names it.
fn int_opt(obj: Option<&Bound<'_, PyAny>>, what: &str) -> BindResult<Option<i64>> {
    obj.filter(|o| !o.is_none())
        .map(|o| crate::args::i64_arg(o, what))
        .transpose()
}

fn opt_u64(key: &str, v: Option<i64>, default: u64) -> BindResult<u64> {
    match v {
        None => Ok(default),
        Some(v) if v >= 0 => Ok(v as u64),
        Some(v) => Err(Error::Config {
            key: key.to_owned(),
            value: v.to_string(),
            reason: "must be >= 0".to_owned(),
        }
        .into()),
    }
}

/// Keyword options of `ManagedLedger.open` (`None`: the default).
#[derive(Debug, Default)]
struct OpenArgs {
    max_entries_per_ledger: Option<i64>,
    max_bytes_per_ledger: Option<i64>,
    read_only: bool,
    preallocate_bytes: Option<i64>,
    cursor_flush_interval_ms: Option<i64>,
    max_batch_bytes: Option<i64>,
    journal_segment_bytes: Option<i64>,
    checkpoint_bytes: Option<i64>,
    checkpoint_interval_ms: Option<i64>,
    max_pending_bytes: Option<i64>,
    append_timeout_ms: Option<i64>,
    close_timeout_ms: Option<i64>,
    max_open_files: Option<i64>,
    storage_threads: Option<i64>,
    direct_entry_bytes: Option<i64>,
}

fn options(a: OpenArgs) -> BindResult<LedgerOptions> {
    let d = LedgerOptions::default();
    let ms = |key: &str, v: Option<i64>, default: Duration| -> BindResult<Duration> {
        Ok(Duration::from_millis(opt_u64(
            key,
            v,
            default.as_millis() as u64,
        )?))
    };
    let o = LedgerOptions {
        max_entries_per_ledger: opt_u64(
            "max_entries_per_ledger",
            a.max_entries_per_ledger,
            d.max_entries_per_ledger,
        )?,
        max_bytes_per_ledger: opt_u64(
            "max_bytes_per_ledger",
            a.max_bytes_per_ledger,
            d.max_bytes_per_ledger,
        )?,
        read_only: a.read_only,
        preallocate_bytes: opt_u64(
            "preallocate_bytes",
            a.preallocate_bytes,
            d.preallocate_bytes,
        )?,
        cursor_flush_interval: ms(
            "cursor_flush_interval_ms",
            a.cursor_flush_interval_ms,
            d.cursor_flush_interval,
        )?,
        max_batch_bytes: opt_u64(
            "max_batch_bytes",
            a.max_batch_bytes,
            d.max_batch_bytes as u64,
        )? as usize,
        journal_segment_bytes: opt_u64(
            "journal_segment_bytes",
            a.journal_segment_bytes,
            d.journal_segment_bytes,
        )?,
        checkpoint_bytes: opt_u64("checkpoint_bytes", a.checkpoint_bytes, d.checkpoint_bytes)?,
        checkpoint_interval: ms(
            "checkpoint_interval_ms",
            a.checkpoint_interval_ms,
            d.checkpoint_interval,
        )?,
        max_pending_bytes: opt_u64(
            "max_pending_bytes",
            a.max_pending_bytes,
            d.max_pending_bytes,
        )?,
        append_timeout: ms("append_timeout_ms", a.append_timeout_ms, d.append_timeout)?,
        close_timeout: ms("close_timeout_ms", a.close_timeout_ms, d.close_timeout)?,
        max_open_files: opt_u64("max_open_files", a.max_open_files, d.max_open_files as u64)?
            .min(usize::MAX as u64) as usize,
        direct_entry_bytes: opt_u64(
            "direct_entry_bytes",
            a.direct_entry_bytes,
            d.direct_entry_bytes as u64,
        )?
        .min(usize::MAX as u64) as usize,
        storage_threads: opt_u64(
            "storage_threads",
            a.storage_threads,
            d.storage_threads as u64,
        )?
        .min(usize::MAX as u64) as usize,
        ..d
    };
    o.validate()?;
    Ok(o)
}

// ---------------------------------------------------------------- ManagedLedger

/// A durable, ordered log of entries with cursors (see ``txnstream.ledger``).
#[pyclass(name = "ManagedLedger", module = "txnstream._native", frozen)]
#[derive(Debug)]
pub struct PyManagedLedger {
    /// The core ledger; other bindings (BufferedWriter) write through it.
    pub inner: Arc<ManagedLedger>,
}

#[pymethods]
impl PyManagedLedger {
    /// Open (creating if needed) managed ledger ``name`` under ``directory``.
    ///
    /// Every managed ledger of a data directory shares its journal; the
    /// data-directory options (``preallocate_bytes`` and below) are fixed by
    /// the directory's first open in the process.
    #[staticmethod]
    #[pyo3(signature = (directory, name, *, max_entries_per_ledger=None, max_bytes_per_ledger=None,
        read_only=None, preallocate_bytes=None, cursor_flush_interval_ms=None, max_batch_bytes=None,
        journal_segment_bytes=None, checkpoint_bytes=None, checkpoint_interval_ms=None,
        max_pending_bytes=None, append_timeout_ms=None, max_open_files=None, storage_threads=None,
        direct_entry_bytes=None, close_timeout_ms=None))]
    #[allow(clippy::too_many_arguments)]
    fn open(
        py: Python<'_>,
        directory: &Bound<'_, PyAny>,
        name: &Bound<'_, PyAny>,
        max_entries_per_ledger: Option<Bound<'_, PyAny>>,
        max_bytes_per_ledger: Option<Bound<'_, PyAny>>,
        read_only: Option<Bound<'_, PyAny>>,
        preallocate_bytes: Option<Bound<'_, PyAny>>,
        cursor_flush_interval_ms: Option<Bound<'_, PyAny>>,
        max_batch_bytes: Option<Bound<'_, PyAny>>,
        journal_segment_bytes: Option<Bound<'_, PyAny>>,
        checkpoint_bytes: Option<Bound<'_, PyAny>>,
        checkpoint_interval_ms: Option<Bound<'_, PyAny>>,
        max_pending_bytes: Option<Bound<'_, PyAny>>,
        append_timeout_ms: Option<Bound<'_, PyAny>>,
        max_open_files: Option<Bound<'_, PyAny>>,
        storage_threads: Option<Bound<'_, PyAny>>,
        direct_entry_bytes: Option<Bound<'_, PyAny>>,
        close_timeout_ms: Option<Bound<'_, PyAny>>,
    ) -> BindResult<Self> {
        let directory = path_arg(directory, "directory")?;
        let name = str_arg(name, "name")?;
        let opts = options(OpenArgs {
            max_entries_per_ledger: int_opt(
                max_entries_per_ledger.as_ref(),
                "max_entries_per_ledger",
            )?,
            max_bytes_per_ledger: int_opt(max_bytes_per_ledger.as_ref(), "max_bytes_per_ledger")?,
            read_only: bool_arg(read_only.as_ref(), "read_only", false)?,
            preallocate_bytes: int_opt(preallocate_bytes.as_ref(), "preallocate_bytes")?,
            cursor_flush_interval_ms: int_opt(
                cursor_flush_interval_ms.as_ref(),
                "cursor_flush_interval_ms",
            )?,
            max_batch_bytes: int_opt(max_batch_bytes.as_ref(), "max_batch_bytes")?,
            journal_segment_bytes: int_opt(
                journal_segment_bytes.as_ref(),
                "journal_segment_bytes",
            )?,
            checkpoint_bytes: int_opt(checkpoint_bytes.as_ref(), "checkpoint_bytes")?,
            checkpoint_interval_ms: int_opt(
                checkpoint_interval_ms.as_ref(),
                "checkpoint_interval_ms",
            )?,
            max_pending_bytes: int_opt(max_pending_bytes.as_ref(), "max_pending_bytes")?,
            append_timeout_ms: int_opt(append_timeout_ms.as_ref(), "append_timeout_ms")?,
            close_timeout_ms: int_opt(close_timeout_ms.as_ref(), "close_timeout_ms")?,
            max_open_files: int_opt(max_open_files.as_ref(), "max_open_files")?,
            storage_threads: int_opt(storage_threads.as_ref(), "storage_threads")?,
            direct_entry_bytes: int_opt(direct_entry_bytes.as_ref(), "direct_entry_bytes")?,
        })?;
        let inner = py.detach(|| ManagedLedger::open(&directory, &name, opts))?;
        Ok(Self { inner })
    }

    /// Names of the managed ledgers in data directory ``directory`` (read
    /// only: a live directory of another process, or a closed one).
    #[staticmethod]
    fn names(py: Python<'_>, directory: &Bound<'_, PyAny>) -> BindResult<Vec<String>> {
        let directory = path_arg(directory, "directory")?;
        Ok(py.detach(|| ManagedLedger::list(&directory))?)
    }

    /// Append one entry; returns its position once it is durable.
    fn append(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> BindResult<PyPosition> {
        let b = record_bytes(data, "data")?;
        let d = b.as_bytes();
        Ok(PyPosition(py.detach(|| self.inner.append(d))?))
    }

    /// Append entries in one group commit; their positions once all are durable.
    fn append_many(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> BindResult<Py<PyList>> {
        let objs = bytes_list(data, "data")?;
        let slices = with_slices(&objs)?;
        let ps = py.detach(|| {
            self.inner
                .append_many(slices.iter().map(|s| s.to_vec()).collect())
        })?;
        Ok(positions(py, &ps)?.unbind())
    }

    /// Queue one entry: a ``concurrent.futures.Future[Position]`` resolved
    /// once it is durable.
    fn append_async<'py>(
        &self,
        py: Python<'py>,
        data: &Bound<'py, PyAny>,
    ) -> BindResult<Bound<'py, PyAny>> {
        let b = record_bytes(data, "data")?;
        let (fut, done) = future_with_callback(py, Job::Position)?;
        let entry = b.as_bytes().to_vec();
        // Queueing waits only when the journal queue is full (backpressure):
        // then not with the GIL held; otherwise no GIL hand-off per append.
        if EntrySink::has_room(&*self.inner, entry.len()) {
            self.inner.append_async(entry, done);
        } else {
            py.detach(|| self.inner.append_async(entry, done));
        }
        Ok(fut)
    }

    /// Queue one entry: ``(assigned, durable)``, two
    /// ``concurrent.futures.Future[Position]``. ``assigned`` resolves as soon
    /// as the journal writer gives the entry its position (before the sync:
    /// it is neither durable nor readable yet), ``durable`` once it is
    /// durable (or with the error; then ``assigned`` too if it had not
    /// resolved). For writes whose durability is only needed later, as a
    /// transaction's before its commit decision.
    fn append_positioned<'py>(
        &self,
        py: Python<'py>,
        data: &Bound<'py, PyAny>,
    ) -> BindResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let b = record_bytes(data, "data")?;
        let (assigned, at) = future_with_callback(py, Job::Position)?;
        let (durable, done) = future_with_callback(py, Job::Position)?;
        let entry = b.as_bytes().to_vec();
        if EntrySink::has_room(&*self.inner, entry.len()) {
            self.inner.append_positioned(entry, at, done);
        } else {
            py.detach(|| self.inner.append_positioned(entry, at, done));
        }
        Ok((assigned, durable))
    }

    /// Queue entries for one group commit: ONE ``Future[list[Position]]``.
    fn append_many_async<'py>(
        &self,
        py: Python<'py>,
        data: &Bound<'py, PyAny>,
    ) -> BindResult<Bound<'py, PyAny>> {
        let objs = bytes_list(data, "data")?;
        let owned: Vec<Vec<u8>> = objs.iter().map(|b| b.as_bytes().to_vec()).collect();
        let (fut, done) = future_with_callback(py, Job::Positions)?;
        py.detach(|| self.inner.append_many_async(owned, done));
        Ok(fut)
    }

    /// The entry at ``position``.
    fn read<'py>(
        &self,
        py: Python<'py>,
        position: &Bound<'py, PyAny>,
    ) -> BindResult<Bound<'py, PyBytes>> {
        let p = pos_arg(position, "position")?;
        let d = py.detach(|| self.inner.read(p))?;
        Ok(PyBytes::new(py, &d))
    }

    /// Existing entries with ``start <= position <= end`` as ``(Position, bytes)``.
    fn read_range<'py>(
        &self,
        py: Python<'py>,
        start: &Bound<'py, PyAny>,
        end: &Bound<'py, PyAny>,
    ) -> BindResult<Bound<'py, PyList>> {
        let (s, e) = (pos_arg(start, "start")?, pos_arg(end, "end")?);
        let es = py.detach(|| self.inner.read_range(s, e))?;
        Ok(entries(py, es)?)
    }

    /// First readable entry, or ``None``.
    #[getter]
    fn first_position(&self) -> Option<PyPosition> {
        self.inner.first_position().map(PyPosition)
    }

    /// Last durable entry, or ``None``.
    #[getter]
    fn last_position(&self) -> Option<PyPosition> {
        self.inner.last_position().map(PyPosition)
    }

    /// Number of readable entries.
    fn entry_count(&self) -> u64 {
        self.inner.entry_count()
    }

    #[getter]
    fn name(&self) -> &str {
        self.inner.name()
    }

    /// The data directory it lives in (shared with other managed ledgers).
    #[getter]
    fn directory(&self) -> PathBuf {
        self.inner.data_dir().to_path_buf()
    }

    /// Path prefix of its ledger files: ``<prefix>@<ledger_id>.log`` (data)
    /// and ``.idx`` (index), under ``<directory>/ledgers``.
    #[getter]
    fn file_prefix(&self) -> PathBuf {
        self.inner.file_prefix().to_path_buf()
    }

    /// Counters of the data directory's storage: journal syncs and groups,
    /// bytes read and written, file syncs, checkpoints, open ledger files…
    fn storage_stats<'py>(&self, py: Python<'py>) -> BindResult<Bound<'py, PyDict>> {
        let stats = py.detach(|| self.inner.storage_stats());
        let d = PyDict::new(py);
        for (k, v) in stats {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    /// Make everything written so far durable in ledger files and the
    /// data directory's catalog now (the flusher does so periodically).
    fn checkpoint(&self, py: Python<'_>) -> BindResult<()> {
        Ok(py.detach(|| self.inner.checkpoint())?)
    }

    /// Remove this managed ledger with all its entries and cursors, and
    /// close the handle.
    fn delete(&self, py: Python<'_>) -> BindResult<()> {
        Ok(py.detach(|| self.inner.delete())?)
    }

    #[getter]
    fn read_only(&self) -> bool {
        self.inner.is_read_only()
    }

    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// ``(ledger_id, entries, sealed)`` for each ledger.
    fn ledgers(&self, py: Python<'_>) -> Vec<(u64, u64, bool)> {
        py.detach(|| self.inner.ledgers())
    }

    /// Open (or create) cursor ``name``.
    fn open_cursor(&self, py: Python<'_>, name: &Bound<'_, PyAny>) -> BindResult<PyCursor> {
        let name = str_arg(name, "name")?;
        let c = py.detach(|| self.inner.open_cursor(&name))?;
        Ok(PyCursor {
            inner: c,
            ledger: Arc::downgrade(&self.inner),
        })
    }

    /// Names of the cursors, opened or persisted.
    fn cursor_names(&self, py: Python<'_>) -> Vec<String> {
        py.detach(|| self.inner.cursor_names())
    }

    /// Remove cursor ``name`` so it no longer holds back trimming.
    fn delete_cursor(&self, py: Python<'_>, name: &Bound<'_, PyAny>) -> BindResult<()> {
        let name = str_arg(name, "name")?;
        Ok(py.detach(|| self.inner.delete_cursor(&name))?)
    }

    /// Persist cursor states now and trim ledgers every cursor has passed.
    fn flush(&self, py: Python<'_>) -> BindResult<()> {
        Ok(py.detach(|| self.inner.flush())?)
    }

    /// Read-only opens: pick up entries and cursor states written since.
    fn refresh(&self, py: Python<'_>) -> BindResult<()> {
        Ok(py.detach(|| self.inner.refresh())?)
    }

    /// Wait for queued appends, seal, persist cursors, release the ledger.
    fn close(&self, py: Python<'_>) -> BindResult<()> {
        Ok(py.detach(|| self.inner.close())?)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> BindResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!(
            "ManagedLedger({:?}, last_position={:?}, read_only={}, closed={})",
            self.inner.name(),
            self.inner
                .last_position()
                .map(|p| (p.ledger_id, p.entry_id)),
            self.inner.is_read_only(),
            self.inner.is_closed()
        )
    }
}

// ---------------------------------------------------------------- Cursor

/// A named, durable reader of a managed ledger.
#[pyclass(name = "Cursor", module = "txnstream._native", frozen)]
#[derive(Debug)]
pub struct PyCursor {
    inner: Cursor,
    /// The ledger object it was opened on: its identity tells a cursor of
    /// this ledger from one of another (the allocation outlives the ledger,
    /// so the address is never reused while the cursor lives).
    ledger: Weak<ManagedLedger>,
}

impl PyCursor {
    /// The cursor, if it was opened on `ml` (the same ledger object).
    pub(crate) fn on(&self, ml: &Arc<ManagedLedger>) -> Option<&Cursor> {
        std::ptr::eq(self.ledger.as_ptr(), Arc::as_ptr(ml)).then_some(&self.inner)
    }

    /// The cursor's name.
    pub(crate) fn cursor_name(&self) -> &str {
        self.inner.name()
    }

    /// Name of the ledger it was opened on (None once that ledger is gone).
    pub(crate) fn ledger_name(&self) -> Option<String> {
        self.ledger.upgrade().map(|ml| ml.name().to_owned())
    }
}

#[pymethods]
impl PyCursor {
    #[getter]
    fn name(&self) -> &str {
        self.inner.name()
    }

    /// Up to ``max_entries`` entries after the read position, skipping deleted ones.
    #[pyo3(signature = (max_entries=None))]
    fn read_next<'py>(
        &self,
        py: Python<'py>,
        max_entries: Option<Bound<'py, PyAny>>,
    ) -> BindResult<Bound<'py, PyList>> {
        let max_entries = match max_entries {
            Some(n) => i64_arg(&n, "max_entries")?,
            None => 100,
        };
        if max_entries < 0 {
            return Err(
                Error::invalid(format!("max_entries must be >= 0, got {max_entries}")).into(),
            );
        }
        let es = py.detach(|| self.inner.read_next(max_entries as usize))?;
        Ok(entries(py, es)?)
    }

    /// Move the read position back to just after the mark-delete position.
    fn rewind(&self) {
        self.inner.rewind(); // a brief lock, never held across I/O: no GIL hand-off
    }

    /// Delete every entry at or before ``position``.
    fn mark_delete(&self, position: &Bound<'_, PyAny>) -> BindResult<()> {
        let p = pos_arg(position, "position")?;
        Ok(self.inner.mark_delete(p)?) // brief locks, no I/O (the flusher persists it)
    }

    /// Every entry at or before it is deleted; ``None`` while nothing is.
    #[getter]
    fn mark_delete_position(&self) -> Option<PyPosition> {
        self.inner.mark_delete_position().map(PyPosition)
    }

    /// Delete entries (``Position``) or single records of batched entries
    /// (``TxnPosition`` with ``batch_size > 1``); all or nothing.
    fn delete(&self, py: Python<'_>, positions: &Bound<'_, PyAny>) -> BindResult<()> {
        let mut recs = Vec::with_capacity(crate::buffers::capacity_hint(positions));
        let items = positions.try_iter().map_err(|_| {
            Error::invalid(
                "positions must be an iterable of positions (Position, TxnPosition or pairs)",
            )
        })?;
        for (i, item) in items.enumerate() {
            let item = item?;
            recs.push(named(
                |n| record_arg(&item, n),
                || format!("positions[{i}]"),
            )?);
        }
        if recs.len() <= IN_PLACE_MAX {
            return Ok(self.inner.delete_batch_indexes(&recs)?);
        }
        Ok(py.detach(|| self.inner.delete_batch_indexes(&recs))?)
    }

    /// Bulk :meth:`delete`: records as numpy columns (``uint64`` ledger and
    /// entry ids, ``uint32`` batch sizes and indexes); all or nothing.
    fn delete_records(
        &self,
        py: Python<'_>,
        ledger_id: &Bound<'_, PyAny>,
        entry_id: &Bound<'_, PyAny>,
        batch_size: &Bound<'_, PyAny>,
        batch_index: &Bound<'_, PyAny>,
    ) -> BindResult<()> {
        let recs = crate::position::records_from_columns(
            &array_arg(ledger_id, "ledger_id", "1-D uint64 array")?,
            &array_arg(entry_id, "entry_id", "1-D uint64 array")?,
            &array_arg(batch_size, "batch_size", "1-D uint32 array")?,
            &array_arg(batch_index, "batch_index", "1-D uint32 array")?,
        )?;
        Ok(py.detach(|| self.inner.delete_batch_indexes(&recs))?)
    }

    /// True if the whole entry at ``position`` is deleted.
    fn is_deleted(&self, position: &Bound<'_, PyAny>) -> BindResult<bool> {
        let p = pos_arg(position, "position")?;
        Ok(self.inner.is_deleted(p))
    }

    /// The entry's ``AckSet`` if some but not all of its records are deleted.
    fn batch_ack_set(&self, position: &Bound<'_, PyAny>) -> BindResult<Option<PyAckSet>> {
        let p = pos_arg(position, "position")?;
        Ok(self.inner.batch_ack_set(p).map(PyAckSet))
    }

    /// Individually deleted runs beyond the mark-delete as ``(first, last)``.
    fn deleted_ranges(&self, py: Python<'_>) -> Vec<(PyPosition, PyPosition)> {
        py.detach(|| self.inner.deleted_ranges())
            .into_iter()
            .map(|(a, b)| (PyPosition(a), PyPosition(b)))
            .collect()
    }

    /// Persist the cursor state now (durably).
    fn flush(&self, py: Python<'_>) -> BindResult<()> {
        Ok(py.detach(|| self.inner.flush())?)
    }

    fn __repr__(&self) -> String {
        format!(
            "Cursor({:?}, mark_delete_position={:?})",
            self.inner.name(),
            self.inner
                .mark_delete_position()
                .map(|p| (p.ledger_id, p.entry_id))
        )
    }
}

// ---------------------------------------------------------------- CompactedTopic

/// Keyed records where reads see only the newest value per key.
#[pyclass(name = "CompactedTopic", module = "txnstream._native", frozen)]
#[derive(Debug)]
pub struct PyCompactedTopic {
    inner: Arc<CompactedTopic>,
}

#[pymethods]
impl PyCompactedTopic {
    /// Open (creating if needed) compacted topic ``name`` under ``directory``.
    #[staticmethod]
    ///
    /// ``write_only`` keeps no key index: nothing is read at open and
    /// ``get``/``items``/``keys``/``len`` raise (see the Rust docs).
    #[pyo3(signature = (directory, name, *, read_only=None, max_entries_per_ledger=None,
        max_bytes_per_ledger=None, preallocate_bytes=None, write_only=None))]
    #[allow(clippy::too_many_arguments)]
    fn open(
        py: Python<'_>,
        directory: &Bound<'_, PyAny>,
        name: &Bound<'_, PyAny>,
        read_only: Option<Bound<'_, PyAny>>,
        max_entries_per_ledger: Option<Bound<'_, PyAny>>,
        max_bytes_per_ledger: Option<Bound<'_, PyAny>>,
        preallocate_bytes: Option<Bound<'_, PyAny>>,
        write_only: Option<Bound<'_, PyAny>>,
    ) -> BindResult<Self> {
        let directory = path_arg(directory, "directory")?;
        let name = str_arg(name, "name")?;
        let read_only = bool_arg(read_only.as_ref(), "read_only", false)?;
        let write_only = bool_arg(write_only.as_ref(), "write_only", false)?;
        let opts = options(OpenArgs {
            max_entries_per_ledger: int_opt(
                max_entries_per_ledger.as_ref(),
                "max_entries_per_ledger",
            )?,
            max_bytes_per_ledger: int_opt(max_bytes_per_ledger.as_ref(), "max_bytes_per_ledger")?,
            read_only,
            preallocate_bytes: int_opt(preallocate_bytes.as_ref(), "preallocate_bytes")?,
            ..OpenArgs::default()
        })?;
        let t = py.detach(|| {
            if write_only {
                CompactedTopic::open_write_only(&directory, &name, opts)
            } else {
                CompactedTopic::open(&directory, &name, opts)
            }
        })?;
        Ok(Self { inner: Arc::new(t) })
    }

    /// Durably set ``key`` to ``value`` (``None`` deletes the key).
    fn put(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: Option<&Bound<'_, PyAny>>,
    ) -> BindResult<PyPosition> {
        let key = str_arg(key, "key")?;
        let value = value
            .filter(|v| !v.is_none())
            .map(|v| record_bytes(v, "value"))
            .transpose()?;
        let v = value.as_ref().map(|b| b.as_bytes());
        Ok(PyPosition(py.detach(|| self.inner.put(&key, v))?))
    }

    /// Write many ``(key, value | None)`` records in one group commit.
    ///
    /// Waits (GIL released) until they are durable; ``timeout_ms`` (None: no
    /// limit) bounds the wait with the built-in ``TimeoutError`` (the records
    /// may still be written, and then read back).
    #[pyo3(signature = (records, timeout_ms = None))]
    fn put_many(
        &self,
        py: Python<'_>,
        records: &Bound<'_, PyAny>,
        timeout_ms: Option<&Bound<'_, PyAny>>,
    ) -> BindResult<Py<PyList>> {
        let timeout = timeout_ms_arg(timeout_ms)?;
        let bad = || {
            Error::invalid("records must be an iterable of (key: str, value: bytes | None) pairs")
        };
        let mut out: Vec<(String, Option<Vec<u8>>)> = Vec::new();
        for item in records.try_iter().map_err(|_| bad())? {
            let item = item?;
            let pair = item.cast::<PyTuple>().map_err(|_| bad())?;
            if pair.len() != 2 {
                return Err(bad().into());
            }
            let key = str_arg(&pair.get_item(0)?, "records key")?;
            let value = pair.get_item(1)?;
            let value = if value.is_none() {
                None
            } else {
                Some(record_bytes(&value, "records value")?.as_bytes().to_vec())
            };
            out.push((key, value));
        }
        let ps = py.detach(|| {
            let deadline = timeout.map(|t| std::time::Instant::now() + t);
            let (done, rx) = crate::writer::reply();
            let queued = self.inner.put_many_async(out, deadline, done);
            if !queued {
                return Err(PyTimeoutError::new_err(
                    "a compaction held the topic past the deadline: nothing was written",
                )
                .into());
            }
            crate::writer::wait_for(&rx, timeout)
        })?;
        Ok(positions(py, &ps)?.unbind())
    }

    /// The newest value of ``key``, or ``None``.
    fn get<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
    ) -> BindResult<Option<Bound<'py, PyBytes>>> {
        let key = str_arg(key, "key")?;
        Ok(self.inner.get(&key)?.map(|v| PyBytes::new(py, &v)))
    }

    /// ``(key, value)`` of every live key, in key order.
    fn items<'py>(&self, py: Python<'py>) -> BindResult<Bound<'py, PyList>> {
        let items = self
            .inner
            .items()?
            .into_iter()
            .map(|(k, v)| (k, PyBytes::new(py, &v)).into_bound_py_any(py))
            .collect::<PyResult<Vec<_>>>()?;
        Ok(PyList::new(py, items)?)
    }

    /// Live keys in order.
    fn keys(&self) -> BindResult<Vec<String>> {
        Ok(self.inner.items()?.into_iter().map(|(k, _)| k).collect())
    }

    fn __len__(&self) -> BindResult<usize> {
        Ok(self.inner.len()?)
    }

    fn __contains__(&self, key: &str) -> BindResult<bool> {
        Ok(self.inner.get(key)?.is_some())
    }

    /// True if opened with ``write_only=True``.
    #[getter]
    fn write_only(&self) -> bool {
        self.inner.is_write_only()
    }

    /// Rewrite live records into one new ledger; returns counts before/after.
    fn compact<'py>(&self, py: Python<'py>) -> BindResult<Bound<'py, PyDict>> {
        let s = py.detach(|| self.inner.compact())?;
        let d = PyDict::new(py);
        d.set_item("entries_before", s.entries_before)?;
        d.set_item("entries_after", s.entries_after)?;
        Ok(d)
    }

    /// Read-only opens: pick up records written since.
    fn refresh(&self, py: Python<'_>) -> BindResult<()> {
        Ok(py.detach(|| self.inner.refresh())?)
    }

    fn close(&self, py: Python<'_>) -> BindResult<()> {
        Ok(py.detach(|| self.inner.close())?)
    }

    #[getter]
    fn name(&self) -> String {
        self.inner.ledger().name().to_owned()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> BindResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        match self.inner.len() {
            Ok(keys) => format!(
                "CompactedTopic({:?}, keys={keys})",
                self.inner.ledger().name()
            ),
            Err(_) => format!(
                "CompactedTopic({:?}, write_only)",
                self.inner.ledger().name()
            ),
        }
    }
}
