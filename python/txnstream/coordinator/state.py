"""A coordinator's state: live transactions in memory, their log on disk, recovery.

Kafka keeps this in its TransactionStateManager; here it is, in order:

1. :class:`TransactionLog` -- where every change becomes durable: a PIP-160
   ``BufferedWriter`` over one managed ledger (:class:`LedgerTransactionLog`);
   finished transactions' records are deleted by position and batch index.
2. :class:`DurableWriter` -- writes records and tells a *definite* failure
   (a ``TxnStreamError``: nothing was written) from an *unknown* outcome
   (an interrupt while the write was in flight: it may be durable).
3. :class:`SequenceFile` -- the durable mark below which ids were issued,
   so ids never repeat across restarts even once the log is empty.
4. :class:`TransactionTable` -- the live transactions under one lock, the
   sequence, the low-water mark, and the count of calls in flight that
   ``close()`` drains.
5. :func:`recover` -- the log folded in Rust (:class:`FoldResult`, columnar)
   and turned into the table at open.

Rule for everything here (see :mod:`.metadata`): memory changes only after
the write that makes the change durable succeeded. Log I/O never happens
under the table lock; the sequence mark's fsync (once per
``sequence_reserve_block`` ids) is the exception, because no id may be
handed out before it is covered.
"""

from __future__ import annotations

import errno as errno_mod
import logging
import os
import stat
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

import numpy as np
import numpy.typing as npt
from prometheus_client.registry import CollectorRegistry

from txnstream._native import (
    BufferedWriter,
    CompactedTopic,
    ManagedLedger,
    TxnPosition,
    fold_txn_log,
)
from txnstream.config import BatchedWriteConfig
from txnstream.coordinator.metadata import TxnID, TxnMeta, TxnStatus
from txnstream.durable_file import fsync_dir
from txnstream.errors import (
    CoordinatorNotFound,
    CorruptEntryError,
    InvalidArgumentError,
    StorageError,
    TxnStreamError,
)
from txnstream.metrics import END_LATENCY_BOUNDS_MS, register_writer, unregister_writer
from txnstream.timer import Clock

log = logging.getLogger(__name__)

#: Name of the coordinator's durable cursor on its log.
CURSOR = "transaction-coordinator"
#: Largest sequence: ids are unsigned 64-bit.
MAX_SEQ = (1 << 64) - 1


#: Managed-ledger names of coordinators' transaction logs: this prefix and the id.
LOG_PREFIX = "__transaction_log_"


def log_name(tc_id: int) -> str:
    """Managed-ledger name of coordinator ``tc_id``'s transaction log."""
    return f"{LOG_PREFIX}{tc_id}"


def log_ids(names: Iterable[str]) -> list[int]:
    """Ids of the coordinators whose transaction log is among ``names``, ascending."""
    return sorted(
        int(n[len(LOG_PREFIX) :])
        for n in names
        if n.startswith(LOG_PREFIX) and n[len(LOG_PREFIX) :].isdigit()
    )


def terminated_topic_name(tc_id: int) -> str:
    """Compacted-topic name of coordinator ``tc_id``'s terminated-transaction store."""
    return f"__terminated_txn_state_{tc_id}"


# ------------------------------------------------------------ recovered records


@dataclass(frozen=True)
class PositionColumns:
    """Record positions as columns.

    Record ``i`` is entry ``(ledger_id[i], entry_id[i])``, index
    ``batch_index[i]`` of ``batch_size[i]``.
    """

    ledger_id: npt.NDArray[np.uint64]
    entry_id: npt.NDArray[np.uint64]
    batch_size: npt.NDArray[np.uint32]
    batch_index: npt.NDArray[np.uint32]

    def __len__(self) -> int:
        """Return the number of records."""
        return len(self.ledger_id)

    def slice(self, start: int, end: int) -> PositionColumns:
        """Rows ``start..end`` (views, no copy)."""
        return PositionColumns(
            self.ledger_id[start:end],
            self.entry_id[start:end],
            self.batch_size[start:end],
            self.batch_index[start:end],
        )

    def to_positions(self) -> list[TxnPosition]:
        """One :class:`TxnPosition` per record (for tools and tests)."""
        return list(
            map(
                TxnPosition,
                self.ledger_id.tolist(),
                self.entry_id.tolist(),
                self.batch_size.tolist(),
                self.batch_index.tolist(),
            )
        )

    @classmethod
    def from_positions(cls, positions: Sequence[TxnPosition]) -> PositionColumns:
        """Columns of ``positions``."""
        return cls(
            np.array([p.ledger_id for p in positions], np.uint64),
            np.array([p.entry_id for p in positions], np.uint64),
            np.array([p.batch_size for p in positions], np.uint32),
            np.array([p.batch_index for p in positions], np.uint32),
        )

    @classmethod
    def concat(cls, parts: Sequence[PositionColumns]) -> PositionColumns:
        """One set of columns holding every part's rows, in order."""
        return cls(
            np.concatenate([p.ledger_id for p in parts]).astype(np.uint64, copy=False),
            np.concatenate([p.entry_id for p in parts]).astype(np.uint64, copy=False),
            np.concatenate([p.batch_size for p in parts]).astype(np.uint32, copy=False),
            np.concatenate([p.batch_index for p in parts]).astype(np.uint32, copy=False),
        )


class PositionTable:
    """The log positions of many recovered transactions in one flat table.

    Span ``i`` (one transaction) is rows ``offsets[i]:offsets[i + 1]`` of
    :attr:`columns`: no ``TxnPosition`` object per recovered record.
    """

    __slots__ = ("columns", "live", "offsets")

    def __init__(self, offsets: list[int], columns: PositionColumns) -> None:
        self.offsets = offsets
        self.columns = columns
        #: Spans not yet released; the table is dropped when none is left.
        self.live = len(offsets) - 1

    def count(self, i: int) -> int:
        """Return how many records span ``i`` holds."""
        return self.offsets[i + 1] - self.offsets[i]

    def span(self, i: int) -> PositionColumns:
        """Return the positions of span ``i`` (views)."""
        return self.columns.slice(self.offsets[i], self.offsets[i + 1])


@dataclass(frozen=True)
class FoldResult:
    """Live transactions of a folded log (sorted by sequence), columnar.

    Made by the Rust fold (``rust/core/src/txnlog_fold.rs``, rules there):
    UPDATEs apply in log order with transition checks, and a log holding
    both outcomes for one transaction is a ``CorruptEntryError``.
    """

    seq: list[int]
    status: list[int]
    timeout_ms: list[int]
    start_time: list[int]
    last_modified: list[int]
    timed_out: list[bool]
    client_name: list[str | None]
    partitions: list[list[str] | None]
    subscriptions: list[list[tuple[str, str]] | None]
    positions: PositionTable
    purge: PositionColumns
    max_seq: int
    records: int
    live_records: int
    foreign_records: int

    def __len__(self) -> int:
        """Return the number of live transactions."""
        return len(self.seq)

    @classmethod
    def from_native(cls, d: dict[str, Any]) -> FoldResult:
        """Wrap the dict returned by ``_native.fold_txn_log``/``fold_txn_entries``."""
        return cls(
            seq=d["seq"].tolist(),
            status=d["status"].tolist(),
            timeout_ms=d["timeout_ms"].tolist(),
            start_time=d["start_time"].tolist(),
            last_modified=d["last_modified"].tolist(),
            timed_out=d["timed_out"].tolist(),
            client_name=d["client_name"],
            partitions=d["partitions"],
            subscriptions=d["subscriptions"],
            positions=PositionTable(
                d["pos_offsets"].tolist(),
                PositionColumns(d["ledger_id"], d["entry_id"], d["batch_size"], d["batch_index"]),
            ),
            purge=PositionColumns(
                d["purge_ledger_id"],
                d["purge_entry_id"],
                d["purge_batch_size"],
                d["purge_batch_index"],
            ),
            max_seq=int(d["max_seq"]),
            records=int(d["records"]),
            live_records=int(d["live_records"]),
            foreign_records=int(d["foreign_records"]),
        )


# --------------------------------------------------------------------- the log


class TransactionLog(Protocol):
    """Storage of one coordinator's ``TransactionMetadataEntry`` records."""

    def write(self, record: bytes) -> Future[TxnPosition]:
        """Append ``record``; the future completes once it is durable."""

    def write_sync(self, record: bytes, timeout_ms: int | None = None) -> TxnPosition:
        """Append ``record`` and wait until it is durable.

        Raises the built-in ``TimeoutError`` after ``timeout_ms`` (None: no
        limit); the record may still become durable.
        """

    def write_many_sync(
        self, records: Sequence[bytes], timeout_ms: int | None = None
    ) -> list[TxnPosition]:
        """Append ``records`` (contiguous, in order) and wait until all are durable.

        ``timeout_ms`` as for :meth:`write_sync`.
        """

    def delete(self, records: PositionColumns | Sequence[TxnPosition]) -> None:
        """Delete records (one batch index each) in one operation; whole entries free up."""

    def fold(self, tc_id: int) -> FoldResult:
        """Fold the whole log into coordinator ``tc_id``'s live transactions (Rust)."""

    def set_batch_enabled(self, enabled: bool) -> None:
        """Switch batching of records into shared entries on or off."""

    def stats(self) -> dict[str, Any]:
        """Counters of the log and its writer."""

    def close(self) -> None:
        """Flush nothing new, fail pending writes, release files."""


#: Longest a clean close waits for batched records to become durable.
CLOSE_FLUSH_MS: Final = 10_000


class LedgerTransactionLog:
    """:class:`TransactionLog` over a managed ledger and a PIP-160 BufferedWriter.

    One managed ledger per coordinator (``__transaction_log_<tc_id>``) with
    one durable cursor. Many records share an entry and a sync. A finished
    transaction's records are deleted on the cursor by position and batch
    index (an AckSet per partially deleted entry), so mark-delete advances
    and old ledgers are trimmed once every record in them ended. Recovery
    reads and folds the log from the cursor in Rust, skipping batch indexes
    already deleted.
    """

    def __init__(
        self,
        ml: ManagedLedger,
        writer: BufferedWriter,
        *,
        name: str | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.ml = ml
        self.writer = writer
        self.cursor = ml.open_cursor(CURSOR)
        self._closed = False
        #: ``writer`` label of the exported writer metrics (None: not exported).
        self.metrics_name = name if registry is not None else None
        self._registry = registry
        if registry is not None and name is not None:
            register_writer(writer, "transaction_log", name=name, registry=registry, exclusive=True)

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        name: str,
        *,
        batched_write: BatchedWriteConfig | None = None,
        registry: CollectorRegistry | None = None,
        **ledger_options: Any,
    ) -> LedgerTransactionLog:
        """Open (creating) the log ``name`` under ``directory``.

        ``batched_write`` sets the BufferedWriter's thresholds (default
        :class:`~txnstream.config.BatchedWriteConfig`: batching off, as in
        Pulsar). Its metrics are exported to ``registry`` (SPEC §4.2, label
        ``writer=name``; None: not exported) until :meth:`close`.
        """
        ml = ManagedLedger.open(os.fspath(directory), name, **ledger_options)
        try:
            writer = BufferedWriter(ml, **(batched_write or BatchedWriteConfig()).writer_kwargs())
            return cls(ml, writer, name=name, registry=registry)
        except BaseException:
            ml.close()
            raise

    def write(self, record: bytes) -> Future[TxnPosition]:
        """Append ``record``; the future completes once it is durable."""
        return self.writer.write(record)

    def write_sync(self, record: bytes, timeout_ms: int | None = None) -> TxnPosition:
        """Append ``record`` and wait (GIL released, no Python future) until durable."""
        return self.writer.write_blocking(record, timeout_ms=timeout_ms)

    def write_many_sync(
        self, records: Sequence[bytes], timeout_ms: int | None = None
    ) -> list[TxnPosition]:
        """Append ``records`` contiguously and wait until they are durable.

        The batch is written at once (a forced flush) instead of after
        ``max_delay``: a bulk call already IS the batch its callers queued,
        and they all wait for it. Durability is unchanged.
        """
        fut = self.writer.write_many(records)
        self.writer.flush()
        return fut.result(None if timeout_ms is None else timeout_ms / 1000.0)

    def delete(self, records: PositionColumns | Sequence[TxnPosition]) -> None:
        """Delete records by position and batch index, in one cursor operation."""
        if not len(records):
            return
        if isinstance(records, PositionColumns):
            self.cursor.delete_records(
                records.ledger_id, records.entry_id, records.batch_size, records.batch_index
            )
        else:
            self.cursor.delete(list(records))

    def fold(self, tc_id: int) -> FoldResult:
        """Read and fold the whole log from the cursor in Rust (GIL released)."""
        return FoldResult.from_native(fold_txn_log(self.ml, CURSOR, tc_id))

    def set_batch_enabled(self, enabled: bool) -> None:
        """Switch batching on/off for the next record."""
        self.writer.set_batch_enabled(enabled)

    def stats(self) -> dict[str, Any]:
        """Writer statistics (``entries``: entries it wrote) plus ``ledger_entries``.

        ``ledger_entries`` is what the ledger holds now (trimmed ledgers gone).
        """
        out: dict[str, Any] = dict(self.writer.stats())
        out["ledger_entries"] = self.ml.entry_count()
        return out

    def close(self) -> None:
        """Write what is batched, close the writer, persist the cursor, close the ledger.

        A clean close makes every record written before it durable (up to
        :data:`CLOSE_FLUSH_MS`): an open transaction's ADD record still in a
        batch would otherwise fail, and after the next open its coordinator
        would not know that partition or subscription.
        """
        if self._closed:
            return
        self._closed = True
        if self._registry is not None and self.metrics_name is not None:
            unregister_writer(self.metrics_name, "transaction_log", self._registry, self.writer)
        try:
            self.writer.flush()
            if not self.writer.wait_idle(CLOSE_FLUSH_MS):
                log.warning("%s: records still in flight at close fail", self.ml.name)
            self.writer.close()
        finally:
            try:
                self.cursor.flush()
            finally:
                self.ml.close()


def open_terminated_topic(directory: str | os.PathLike[str], name: str) -> CompactedTopic:
    """Open the compacted topic holding the PIP-255 terminated-transaction state."""
    return CompactedTopic.open(os.fspath(directory), name)


class CoordinatorCounters:
    """Event counts plus an end-latency histogram; callers hold the table lock.

    They change on the hot paths, so they are plain ints guarded by the
    table's lock (every change already happens under it).
    """

    NAMES = ("created", "committed", "aborted", "timed_out", "recovered", "append_errors")

    __slots__ = ("counts", "latency", "latency_sum")

    def __init__(self) -> None:
        self.counts = dict.fromkeys(self.NAMES, 0)
        # End latency (ms): one bucket count per bound, last = +Inf.
        self.latency = [0] * (len(END_LATENCY_BOUNDS_MS) + 1)
        self.latency_sum = 0

    def ended(self, commit: bool, timed_out: bool, latency_ms: int) -> None:
        """Count one finished end that took ``latency_ms`` after its decision."""
        import bisect

        self.latency[bisect.bisect_left(END_LATENCY_BOUNDS_MS, latency_ms)] += 1
        self.latency_sum += latency_ms
        self.counts["committed" if commit else "aborted"] += 1
        if timed_out:
            self.counts["timed_out"] += 1

    def histogram(self) -> dict[str, Any]:
        """Return a copy of the end-latency histogram (bounds, counts, sum)."""
        return {
            "bounds": END_LATENCY_BOUNDS_MS,
            "counts": list(self.latency),
            "sum": self.latency_sum,
        }


def definite(exc: BaseException) -> bool:
    """Whether a failed write definitely wrote nothing.

    Storage and writer errors (``TxnStreamError``: ENOSPC, a closed writer,
    ...) fail every record of the batch they hit, and the ledger cuts back
    to its synced end. Anything else (``KeyboardInterrupt`` while waiting, a
    timeout) leaves the outcome unknown: the record may still become durable.
    """
    return isinstance(exc, TxnStreamError)


class DurableWriter:
    """Writes records and waits; counts failures. Never called under the table lock."""

    def __init__(
        self, txn_log: TransactionLog, table: TransactionTable, counters: CoordinatorCounters
    ) -> None:
        self.log = txn_log
        self._table = table
        self._counts = counters.counts

    def write(self, record: bytes, timeout_ms: int | None = None) -> TxnPosition:
        """Append ``record`` and return its position once durable.

        The built-in ``TimeoutError`` after ``timeout_ms`` (None: no limit)
        leaves the record's fate unknown (see :func:`definite`).
        """
        try:
            return self.log.write_sync(record, timeout_ms)
        except TxnStreamError:
            self._failed()
            raise

    def write_many(self, records: list[bytes], timeout_ms: int | None = None) -> list[TxnPosition]:
        """Append ``records`` as one batch and return their positions once durable."""
        try:
            return self.log.write_many_sync(records, timeout_ms)
        except TxnStreamError:
            self._failed()
            raise

    def _failed(self) -> None:
        with self._table.lock:
            self._counts["append_errors"] += 1

    def delete(self, records: PositionColumns | Sequence[TxnPosition]) -> None:
        """Delete finished records; best effort (recovery purges what is left)."""
        try:
            self.log.delete(records)
        except Exception:
            if not self._table.closed:
                log.warning(
                    "deleting %d records of ended transactions failed; recovery purges them",
                    len(records),
                    exc_info=True,
                )


# ---------------------------------------------------------------- sequence mark


class SequenceStore(Protocol):
    """Durable storage of the reserved-sequence mark."""

    def load(self) -> int:
        """Return the reserved mark (0 when never reserved)."""

    def store(self, mark: int) -> None:
        """Durably replace the mark (raise if it is not durable)."""


def make_dirs_durable(path: Path, root: Path) -> None:
    """Create ``path`` (below existing ``root``) and missing parents, durably.

    Each directory created gets its parent fsynced. A path component below
    ``root`` that exists but is a symlink or not a directory is refused: the
    mark must not be written outside the data directory.
    """
    missing: list[Path] = []
    at = path
    while True:
        inside = at != root and at.is_relative_to(root)
        try:
            # Below the data directory a symlink is refused; the data
            # directory itself (and above) may be one.
            st = os.lstat(at) if inside else os.stat(at)
        except FileNotFoundError:
            missing.append(at)
            if at.parent == at:
                break
            at = at.parent
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise StorageError(
                f"{at} exists and is not a directory (symlinks are refused)",
                path=str(at),
                errno=errno_mod.ENOTDIR,
            )
        break
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(d).st_mode):
                raise
        fsync_dir(d.parent)


class SequenceFile:
    """The reserved-sequence mark of one coordinator, in the data directory.

    ``<data_dir>/coordinators/<tc_id>/max_local_txn_id`` holds ASCII digits,
    replaced atomically: a temp file created with ``O_EXCL | O_NOFOLLOW``
    (a file or symlink planted at its name is removed, never followed),
    fsynced, renamed over the mark, and the directory fsynced. Other
    processes (Spark readers) can read it. After a restart issuing resumes
    at the mark, so ids may jump forward but never repeat.
    """

    def __init__(
        self, directory: str | os.PathLike[str], tc_id: int, *, log_has_history: bool = False
    ) -> None:
        root = Path(directory)
        #: The coordinator's log was written before: the mark must exist
        #: (it is stored before the first id is issued).
        self.log_has_history = log_has_history
        self.dir = root / "coordinators" / str(tc_id)
        self.path = self.dir / "max_local_txn_id"
        self._tmp = self.dir / "max_local_txn_id.tmp"
        try:
            make_dirs_durable(self.dir, root)
        except OSError as exc:
            raise StorageError(
                f"cannot create {self.dir}: {exc}", path=str(self.dir), errno=exc.errno
            ) from exc

    def load(self) -> int:
        """Return the reserved mark (0 when never reserved).

        Missing while the log has history, it is lost: ids issued before
        could be issued again (a new transaction then shares the id of an
        old one some partition remembers as aborted, which hides its
        messages), so that is refused with :class:`CorruptEntryError`.
        """
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            if self.log_has_history:
                raise CorruptEntryError(
                    f"{self.path} is missing but this coordinator's log was written before: "
                    "ids it issued could be issued again. Restore the file, or write into it "
                    "a number above every transaction id this coordinator issued",
                    path=str(self.path),
                ) from None
            return 0
        except OSError as exc:
            raise StorageError(
                f"cannot read {self.path} (symlinks are refused): {exc}",
                path=str(self.path),
                errno=exc.errno,
            ) from exc
        try:
            text = os.read(fd, 64).decode("ascii")
        except (OSError, UnicodeDecodeError) as exc:
            raise StorageError(f"cannot read {self.path}: {exc}", path=str(self.path)) from exc
        finally:
            os.close(fd)
        try:
            value = int(text.strip())
            if not 0 <= value <= MAX_SEQ + 1:
                raise ValueError
        except ValueError:
            raise CorruptEntryError(
                f"{self.path} does not hold a sequence number: {text[:40]!r}",
                path=str(self.path),
            ) from None
        return value

    def store(self, mark: int) -> None:
        """Durably replace the mark with ``mark``."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            try:
                fd = os.open(self._tmp, flags, 0o644)
            except FileExistsError:
                os.unlink(self._tmp)  # left by a crash, or planted: never followed
                fd = os.open(self._tmp, flags, 0o644)
            try:
                os.write(fd, f"{mark}\n".encode("ascii"))
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(self._tmp, self.path)
            fsync_dir(self.dir)
        except OSError as exc:
            raise StorageError(
                f"cannot persist sequence mark to {self.path}: {exc}",
                path=str(self.path),
                errno=exc.errno,
            ) from exc


# --------------------------------------------------------------------- the table


class TransactionTable:
    """Live transactions by sequence, the sequence, the LWM; all under :attr:`lock`.

    Every part of the coordinator reads and changes live transactions only
    under the lock and does its log I/O outside it. ``txns`` is ordered by
    sequence: entries are inserted when their sequence is issued (under the
    lock, so in increasing order; a transaction whose NEW record is still in
    flight is present but not visible) and recovery inserts in order.
    """

    def __init__(self, tc_id: int, sequence: SequenceStore | None, reserve_block: int) -> None:
        self.tc_id = tc_id
        self.lock = threading.Lock()
        #: Live transactions by sequence; they leave once COMMITTED/ABORTED.
        self.txns: dict[int, TxnMeta] = {}
        #: Positions of recovered transactions' records (a span each), or None.
        self.recovered: PositionTable | None = None
        #: Set once by ``close``; no new call starts afterwards.
        self.closed = False
        #: The next sequence to issue.
        self.next_seq = 0
        self._sequence = sequence
        self._block = reserve_block
        self._reserved = 0
        # Calls in flight (``close`` waits for them) and its condition.
        self._active = 0
        self._idle = threading.Condition(self.lock)

    # -- ids

    def start_sequence(self, log_next: int) -> None:
        """At open: continue after the durable mark and the log (``log_next``)."""
        mark = self._sequence.load() if self._sequence is not None else 0
        self.next_seq = max(mark, log_next)
        self._reserved = self.next_seq
        self._reserve(0)

    def issue(self, count: int) -> int:
        """Under the lock: take ``count`` sequences, durably covered; return the first.

        The mark is raised (durably) before any id at or above it is handed
        out; if that fails nothing changes and the error is raised.
        """
        first = self.next_seq
        if count > MAX_SEQ + 1 - first:
            raise InvalidArgumentError(
                f"coordinator {self.tc_id} has only {MAX_SEQ + 1 - first} ids left, "
                f"asked for {count}",
                argument="count",
                value=count,
            )
        self._reserve(count)
        self.next_seq = first + count
        return first

    def _reserve(self, count: int) -> None:
        if self._sequence is None or self.next_seq + count <= self._reserved:
            return
        mark = min(MAX_SEQ + 1, self.next_seq + count + self._block)
        self._sequence.store(mark)  # raises: nothing changed
        self._reserved = mark

    def seq_of(self, txn_id: TxnID) -> int:
        """Return the sequence of ``txn_id``; refuse a non-id or another coordinator's."""
        if not isinstance(txn_id, TxnID):
            raise InvalidArgumentError(
                f"txn_id must be a TxnID, got {txn_id!r}", argument="txn_id", value=txn_id
            )
        if txn_id.most_bits != self.tc_id:
            raise CoordinatorNotFound(
                f"transaction {txn_id} belongs to coordinator {txn_id.most_bits}, not {self.tc_id}",
                tc_id=txn_id.most_bits,
                txn_id=txn_id,
            )
        return txn_id.least_bits

    def tid(self, seq: int) -> TxnID:
        """Return the TxnID of this coordinator's sequence ``seq``."""
        return TxnID._trusted(self.tc_id, seq)

    def low_water_mark(self) -> int:
        """Every transaction with ``least_bits <= LWM`` has ended (-1: none yet)."""
        with self.lock:
            if self.txns:
                return next(iter(self.txns)) - 1
            return self.next_seq - 1

    # -- calls in flight

    def enter(self) -> None:
        """Under the lock: refuse once closed, else count a call in flight."""
        if self.closed:
            raise CoordinatorNotFound(
                f"transaction coordinator {self.tc_id} is closed", tc_id=self.tc_id
            )
        self._active += 1

    def hold(self) -> None:
        """Under the lock: count work in flight that ``close`` must drain, even once closed.

        For work a call started and hands over (a client's end completed in
        the background); finish it with :meth:`leave`.
        """
        self._active += 1

    def leave(self) -> None:
        """Count a call from :meth:`enter` as finished (takes the lock)."""
        with self.lock:
            self.leave_locked()

    def leave_locked(self) -> None:
        """Under the lock: :meth:`leave`."""
        self._active -= 1
        if self._active == 0 and self.closed:
            self._idle.notify_all()

    def check_open(self) -> None:
        """Under the lock: raise :class:`CoordinatorNotFound` once closed."""
        if self.closed:
            raise CoordinatorNotFound(
                f"transaction coordinator {self.tc_id} is closed", tc_id=self.tc_id
            )

    def drain(self, timeout_s: float) -> bool:
        """After ``closed`` is set: wait until no call is in flight; False on timeout."""
        with self.lock:
            return self._idle.wait_for(lambda: self._active == 0, timeout_s)

    # -- waiting for a transaction to change

    @staticmethod
    def changed(meta: TxnMeta) -> threading.Event:
        """Under the lock: the event set at ``meta``'s next change (see :meth:`notify`)."""
        if meta.done is None:
            meta.done = threading.Event()
        return meta.done

    @staticmethod
    def notify(meta: TxnMeta) -> None:
        """Under the lock: wake everyone waiting for ``meta`` to change."""
        done, meta.done = meta.done, None
        if done is not None:
            done.set()

    # -- recovered records

    def span_records(self, meta: TxnMeta) -> int:
        """Under the lock: how many recovered records ``meta`` still holds."""
        table = self.recovered
        return table.count(meta.span) if meta.span >= 0 and table is not None else 0

    def release(self, meta: TxnMeta) -> list[TxnPosition] | PositionColumns | None:
        """Under the lock: take every record position of ended ``meta`` (to delete).

        Its own records as a list; with recovered ones, all as columns (one
        cursor operation either way, so a crash cannot leave half of them).
        """
        positions, meta.positions = meta.positions, []
        table = self.recovered
        if meta.span < 0 or table is None:
            return positions or None
        span = table.span(meta.span)
        meta.span = -1
        table.live -= 1
        if table.live == 0:
            self.recovered = None  # every recovered transaction ended
        if not positions:
            return span
        return PositionColumns.concat([span, PositionColumns.from_positions(positions)])


# ---------------------------------------------------------------------- recovery


@dataclass
class Recovery:
    """What :func:`recover` found: a summary, and the work to start."""

    summary: dict[str, Any]
    #: OPEN transactions and their (monotonic) deadlines, to arm.
    open: list[TxnMeta]
    deadlines: list[int]
    #: Sequences caught in COMMITTING/ABORTING, to finish.
    ending: list[int]


def recover(table: TransactionTable, txn_log: TransactionLog, clock: Clock) -> Recovery:
    """Fill ``table`` from the folded log (SPEC §4.3 recovery); runs before any thread.

    Records of ended transactions are purged; the sequence continues after
    both the durable mark and the log. An OPEN transaction's deadline is
    rebuilt from the logged wall-clock start and timeout (the only clock
    that spans restarts) onto this process's monotonic clock; one already
    past fires at once.
    """
    rec = txn_log.fold(table.tc_id)
    table.start_sequence(rec.max_seq + 1)
    if len(rec.purge):
        txn_log.delete(rec.purge)
    table.recovered = rec.positions if len(rec) else None
    ending: list[int] = []
    armed: list[TxnMeta] = []
    deadlines: list[int] = []
    wall, mono = clock.wall_ms(), clock.monotonic_ms()
    txns = table.txns
    statuses = list(TxnStatus)
    rows = zip(
        rec.seq,
        rec.status,
        rec.timeout_ms,
        rec.start_time,
        rec.last_modified,
        rec.timed_out,
        rec.client_name,
        rec.partitions,
        rec.subscriptions,
        strict=True,
    )
    for span, (seq, st, timeout, start, modified, late, client, parts, subs) in enumerate(rows):
        deadline = mono + max(0, start + timeout - wall)
        meta = TxnMeta(seq, timeout, start, deadline, client, statuses[st])
        meta.last_modified = modified
        meta.timed_out = late  # logged with the ending UPDATE (field 1000)
        meta.partitions = parts if parts is None or len(parts) <= 8 else dict.fromkeys(parts)
        meta.subscriptions = subs if subs is None or len(subs) <= 8 else dict.fromkeys(subs)
        meta.span = span
        txns[seq] = meta
        if st == TxnStatus.OPEN:
            armed.append(meta)
            deadlines.append(deadline)
        else:
            meta.decided_at = mono
            ending.append(seq)
    summary = {
        "records": rec.records,
        "live_records": rec.live_records,
        "purged_records": len(rec.purge),
        "foreign_records": rec.foreign_records,
        "open": len(armed),
        "ending": len(ending),
        "next_seq": table.next_seq,
    }
    return Recovery(summary, armed, deadlines, ending)


__all__ = [
    "CURSOR",
    "CoordinatorCounters",
    "DurableWriter",
    "FoldResult",
    "LedgerTransactionLog",
    "PositionColumns",
    "PositionTable",
    "Recovery",
    "SequenceFile",
    "SequenceStore",
    "TransactionLog",
    "TransactionTable",
    "definite",
    "fsync_dir",
    "log_name",
    "make_dirs_durable",
    "open_terminated_topic",
    "recover",
    "terminated_topic_name",
]
