//! `txnstream.BufferedWriter`: the PIP-160 batched writer over a managed ledger.
//!
//! Records complete on the ledger's sync thread, which must never wait for
//! the GIL. Completions are therefore handed to the process-wide completion
//! thread ([`crate::completion`]); blocking calls wait with the GIL released
//! and need no Python at all.

use crate::args::{bool_arg, i64_arg, number_of, str_arg, timeout_ms_arg};
use crate::buffers::{bytes_list, record_bytes, with_slices};
use crate::completion::{completer, future_with_callback, object_list, on_completion_thread, Job};
use crate::errors::BindResult;
use crate::ledger::PyManagedLedger;
use crate::position::PyTxnPosition;
use pyo3::exceptions::PyTimeoutError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use std::sync::mpsc::{self, Receiver};
use std::sync::Arc;
use std::time::Duration;
use txnstream_core::sink::EntrySink;
use txnstream_core::writer::{BufferedWriter, HistogramSnapshot, WriterConfig, WriterStats};
use txnstream_core::{Error, Result, TxnPosition};

fn positions_list<'py>(py: Python<'py>, ps: &[TxnPosition]) -> PyResult<Bound<'py, PyList>> {
    object_list(py, ps.iter().copied().map(PyTxnPosition))
}

/// A completion callback and the receiver its one result arrives on (for
/// [`wait_for`]).
pub(crate) type Reply<T> = (Box<dyn FnOnce(Result<T>) + Send>, Receiver<Result<T>>);

/// A fresh [`Reply`]: the callback sends its result, which [`wait_for`] awaits.
pub(crate) fn reply<T: Send + 'static>() -> Reply<T> {
    let (tx, rx) = mpsc::sync_channel(1);
    (
        Box::new(move |r| {
            let _ = tx.send(r);
        }),
        rx,
    )
}

pub(crate) fn wait_for<T: Send>(
    rx: &Receiver<Result<T>>,
    timeout: Option<Duration>,
) -> BindResult<T> {
    match timeout {
        None => rx
            .recv()
            .map_err(|_| Error::invalid("writer dropped the record without completing it"))?
            .map_err(Into::into),
        Some(t) => match rx.recv_timeout(t) {
            Ok(r) => r.map_err(Into::into),
            Err(_) => Err(PyTimeoutError::new_err(format!(
                "record not durable within {} ms (it may still be written)",
                t.as_secs_f64() * 1000.0
            ))
            .into()),
        },
    }
}

/// Batches records into entries of a managed ledger (PIP-160).
///
/// ``BufferedWriter(ml, max_records=512, max_size=4 << 20, max_delay_ms=1,
/// batch_enabled=True, name=None)``. A batch is written when it holds
/// ``max_records`` records or ``max_size`` bytes, or when its first record
/// has waited ``max_delay_ms``. Every record completes with its
/// :class:`TxnPosition` ``(ledger_id, entry_id, batch_size, batch_index)``
/// in submission order; an unbatched record has ``batch_size == 1``.
/// Records may be ``bytes`` or any C-contiguous buffer (``bytearray``,
/// ``memoryview``, numpy arrays), taken as raw bytes.
#[pyclass(name = "BufferedWriter", module = "txnstream._native", weakref)]
#[derive(Debug)]
pub struct PyBufferedWriter {
    writer: BufferedWriter,
    /// Keeps the ledger object alive as long as the writer.
    _ledger: Py<PyAny>,
}

#[pymethods]
impl PyBufferedWriter {
    #[new]
    #[pyo3(signature = (ml, max_records = None, max_size = None, max_delay_ms = None, batch_enabled = None, name = None))]
    fn new(
        ml: &Bound<'_, PyAny>,
        max_records: Option<&Bound<'_, PyAny>>,
        max_size: Option<&Bound<'_, PyAny>>,
        max_delay_ms: Option<&Bound<'_, PyAny>>,
        batch_enabled: Option<&Bound<'_, PyAny>>,
        name: Option<&Bound<'_, PyAny>>,
    ) -> BindResult<Self> {
        let ml = ml.cast::<PyManagedLedger>().map_err(|_| {
            Error::invalid(format!(
                "ml must be a ManagedLedger, got {}",
                ml.repr().map_or_else(|_| "?".to_owned(), |r| r.to_string())
            ))
        })?;
        let batch_enabled = bool_arg(batch_enabled, "batch_enabled", true)?;
        let name = name
            .filter(|n| !n.is_none())
            .map(|n| str_arg(n, "name"))
            .transpose()?;
        let config = config_from(
            WriterConfig {
                batch_enabled,
                ..WriterConfig::default()
            },
            max_records,
            max_size,
            max_delay_ms,
        )?;
        completer()?;
        let sink: Arc<dyn EntrySink> = ml.borrow().inner.clone();
        let writer = BufferedWriter::new(sink, config, name)?;
        Ok(Self {
            writer,
            _ledger: ml.clone().into_any().unbind(),
        })
    }

    /// Write one record: a ``Future[TxnPosition]`` resolved once it is durable.
    fn write(&self, py: Python<'_>, record: &Bound<'_, PyAny>) -> BindResult<Py<PyAny>> {
        let record = record_bytes(record, "record")?;
        let (fut, done) = future_with_callback(py, Job::TxnPosition)?;
        let bytes = record.as_bytes();
        if self.writer.has_room(bytes.len()) {
            self.writer.write(bytes, done)?; // no GIL hand-off per record
        } else {
            // `bytes` are immutable and `record` keeps them alive: safe without
            // the GIL while queueing waits for room (backpressure).
            py.detach(|| self.writer.write(bytes, done))?;
        }
        Ok(fut.unbind())
    }

    /// Write many records, contiguous and in order: ONE ``Future[list[TxnPosition]]``.
    ///
    /// If any entry holding them fails, the future fails with that error
    /// (records in other entries may be durable).
    fn write_many(&self, py: Python<'_>, records: &Bound<'_, PyAny>) -> BindResult<Py<PyAny>> {
        let objs = bytes_list(records, "records")?;
        let slices = with_slices(&objs)?;
        let (fut, done) = future_with_callback(py, Job::TxnPositions)?;
        // `bytes` are immutable and `objs` keeps them alive: safe without the GIL.
        py.detach(|| self.writer.write_many(&slices, done))?;
        Ok(fut.unbind())
    }

    /// Write one record and wait (GIL released) until it is durable.
    ///
    /// Raises the write's error, or ``TimeoutError`` after ``timeout_ms``
    /// milliseconds (``None`` or ``inf``: no limit; the record may still be
    /// written after a timeout).
    #[pyo3(signature = (record, timeout_ms = None))]
    fn write_blocking(
        &self,
        py: Python<'_>,
        record: &Bound<'_, PyAny>,
        timeout_ms: Option<&Bound<'_, PyAny>>,
    ) -> BindResult<PyTxnPosition> {
        let timeout = timeout_ms_arg(timeout_ms)?;
        let record = record_bytes(record, "record")?;
        let data = record.as_bytes();
        let p = py.detach(|| {
            let (done, rx) = reply();
            self.writer.write(data, done)?;
            wait_for(&rx, timeout)
        })?;
        Ok(PyTxnPosition(p))
    }

    /// Write many records and wait (GIL released): ``list[TxnPosition]``.
    #[pyo3(signature = (records, timeout_ms = None))]
    fn write_many_blocking(
        &self,
        py: Python<'_>,
        records: &Bound<'_, PyAny>,
        timeout_ms: Option<&Bound<'_, PyAny>>,
    ) -> BindResult<Py<PyList>> {
        let timeout = timeout_ms_arg(timeout_ms)?;
        let objs = bytes_list(records, "records")?;
        let slices = with_slices(&objs)?;
        let ps = py.detach(|| {
            let (done, rx) = reply();
            self.writer.write_many(&slices, done)?;
            wait_for(&rx, timeout)
        })?;
        Ok(positions_list(py, &ps)?.unbind())
    }

    /// Write the current batch now (counted as a forced flush).
    fn flush(&self, py: Python<'_>) {
        py.detach(|| self.writer.flush());
    }

    /// Switch batching on or off; takes effect for the next record.
    fn set_batch_enabled(&self, py: Python<'_>, enabled: &Bound<'_, PyAny>) -> BindResult<()> {
        if enabled.is_none() {
            return Err(Error::invalid("enabled must be a bool, not None").into());
        }
        let enabled = bool_arg(Some(enabled), "enabled", true)?;
        py.detach(|| self.writer.set_batch_enabled(enabled));
        Ok(())
    }

    /// Whether batching is on.
    #[getter]
    fn batch_enabled(&self) -> bool {
        self.writer.batch_enabled()
    }

    /// Change thresholds at runtime (omitted ones keep their value).
    #[pyo3(signature = (*, max_records = None, max_size = None, max_delay_ms = None, batch_enabled = None))]
    fn reconfigure(
        &self,
        py: Python<'_>,
        max_records: Option<&Bound<'_, PyAny>>,
        max_size: Option<&Bound<'_, PyAny>>,
        max_delay_ms: Option<&Bound<'_, PyAny>>,
        batch_enabled: Option<&Bound<'_, PyAny>>,
    ) -> BindResult<()> {
        let mut cur = self.writer.config();
        cur.batch_enabled = bool_arg(batch_enabled, "batch_enabled", cur.batch_enabled)?;
        let config = config_from(cur, max_records, max_size, max_delay_ms)?;
        py.detach(|| self.writer.reconfigure(config))?;
        Ok(())
    }

    /// The thresholds: ``{"max_records", "max_size", "max_delay_ms", "batch_enabled"}``.
    #[getter]
    fn config<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.writer.config();
        let d = PyDict::new(py);
        d.set_item("max_records", c.max_records)?;
        d.set_item("max_size", c.max_size)?;
        d.set_item("max_delay_ms", c.max_delay.as_secs_f64() * 1000.0)?;
        d.set_item("batch_enabled", c.batch_enabled)?;
        Ok(d)
    }

    /// The writer's name (its metrics label).
    #[getter]
    fn name(&self) -> &str {
        self.writer.name()
    }

    /// Whether :meth:`close` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.writer.is_closed()
    }

    /// Close: unflushed records fail with ``WriterClosedError``; flushed
    /// ones complete. Waits (GIL released, up to ``timeout_ms``; ``None``
    /// or ``inf``: no limit) until every future of this writer is resolved;
    /// returns False on timeout.
    #[pyo3(signature = (timeout_ms = None))]
    fn close(&self, py: Python<'_>, timeout_ms: Option<&Bound<'_, PyAny>>) -> BindResult<bool> {
        let timeout = timeout_ms_arg(timeout_ms)?;
        self.writer.close();
        Ok(self.drain(py, timeout)?)
    }

    /// Wait until every entry handed to the ledger has completed and its
    /// futures are resolved (up to ``timeout_ms``). Returns False on timeout.
    #[pyo3(signature = (timeout_ms = None))]
    fn wait_idle(&self, py: Python<'_>, timeout_ms: Option<&Bound<'_, PyAny>>) -> BindResult<bool> {
        let timeout = timeout_ms_arg(timeout_ms)?;
        Ok(self.drain(py, timeout)?)
    }

    /// Counters and histograms (a snapshot; no lock taken).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        stats_dict(py, &self.writer.stats())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _t: &Bound<'_, PyAny>,
        _v: &Bound<'_, PyAny>,
        _tb: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        self.writer.close();
        self.drain(py, None)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        let c = self.writer.config();
        format!(
            "BufferedWriter(name={:?}, max_records={}, max_size={}, max_delay_ms={}, batch_enabled={})",
            self.writer.name(),
            c.max_records,
            c.max_size,
            c.max_delay.as_secs_f64() * 1000.0,
            c.batch_enabled
        )
    }
}

impl PyBufferedWriter {
    fn drain(&self, py: Python<'_>, limit: Option<Duration>) -> PyResult<bool> {
        let tx = completer()?.clone();
        Ok(py.detach(|| {
            let start = std::time::Instant::now();
            if !self.writer.wait_idle(limit) {
                return false;
            }
            // Futures resolve on the completion thread: wait for it to pass
            // everything queued so far -- unless this IS the completion
            // thread (a close in a future's callback): it would wait on
            // itself; what it queued resolves once this callback returns.
            if on_completion_thread() {
                return true;
            }
            let (btx, brx) = mpsc::sync_channel(1);
            if tx.send(Job::Barrier(btx)).is_err() {
                return false;
            }
            match limit {
                None => brx.recv().is_ok(),
                Some(l) => brx.recv_timeout(l.saturating_sub(start.elapsed())).is_ok(),
            }
        }))
    }
}

/// `base` with the given thresholds replaced; a bad one is a `ConfigError`
/// naming its key and value.
fn config_from(
    base: WriterConfig,
    max_records: Option<&Bound<'_, PyAny>>,
    max_size: Option<&Bound<'_, PyAny>>,
    max_delay_ms: Option<&Bound<'_, PyAny>>,
) -> BindResult<WriterConfig> {
    let bad = |key: &str, value: String, reason: &str| Error::Config {
        key: key.into(),
        value,
        reason: reason.into(),
    };
    let int = |obj: &Bound<'_, PyAny>, key: &str| -> BindResult<i64> {
        i64_arg(obj, key).map_err(|_| bad(key, obj.to_string(), "must be an int").into())
    };
    let mut config = base;
    if let Some(v) = max_records {
        let n = int(v, "max_records")?;
        config.max_records =
            u32::try_from(n).map_err(|_| bad("max_records", n.to_string(), "must be >= 1"))?;
    }
    if let Some(v) = max_size {
        let n = int(v, "max_size")?;
        config.max_size =
            usize::try_from(n).map_err(|_| bad("max_size", n.to_string(), "must be >= 1"))?;
    }
    if let Some(v) = max_delay_ms {
        // NaN and infinities go on to `delay_from_millis`, which names them.
        let ms = number_of(v).ok_or_else(|| {
            bad(
                "max_delay_ms",
                v.to_string(),
                "must be a number of milliseconds",
            )
        })?;
        config.max_delay = WriterConfig::delay_from_millis(ms)?;
    }
    config.validate()?;
    Ok(config)
}

fn hist_dict<'py>(py: Python<'py>, h: &HistogramSnapshot) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("bounds", h.bounds.to_vec())?;
    d.set_item("counts", h.counts.clone())?;
    d.set_item("sum", h.sum)?;
    d.set_item("count", h.count)?;
    Ok(d)
}

/// The stats snapshot as the dict `txnstream.metrics` reads.
pub fn stats_dict<'py>(py: Python<'py>, s: &WriterStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("name", &s.name)?;
    d.set_item("batch_enabled", s.batch_enabled)?;
    let counters = [
        ("flush_max_records", s.flush_max_records),
        ("flush_max_size", s.flush_max_size),
        ("flush_max_delay", s.flush_max_delay),
        ("flush_large_data", s.flush_large_data),
        ("flush_forced", s.flush_forced),
        ("entries", s.entries),
        ("batched_entries", s.batched_entries),
        ("records", s.records),
        ("bytes", s.bytes),
        ("failed_entries", s.failed_entries),
        ("failed_records", s.failed_records),
        ("closed_records", s.closed_records),
        ("pending_records", s.pending_records),
        ("in_flight_entries", s.in_flight_entries),
    ];
    for (k, v) in counters {
        d.set_item(k, v)?;
    }
    d.set_item("batch_records", hist_dict(py, &s.batch_records)?)?;
    d.set_item("batch_size_bytes", hist_dict(py, &s.batch_size_bytes)?)?;
    d.set_item(
        "oldest_record_delay_seconds",
        hist_dict(py, &s.oldest_record_delay)?,
    )?;
    Ok(d)
}
