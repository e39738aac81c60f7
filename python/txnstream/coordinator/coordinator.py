"""The transaction coordinator (SPEC §4.3, §4.4): state machine over a durable log.

Every change is a ``TransactionMetadataEntry`` written through the log's
BufferedWriter; a call returns only once its record is durable. The status
check and the in-memory change happen under one lock; the record is written
and waited for outside it, so many transactions share each batched entry and
sync. Records of one transaction may thus reach the log in a different order
than their in-memory changes (an ADD racing the end's UPDATE); that is safe:
recovery folds a transaction's records order-independently, the end reads the
partitions from memory after its UPDATE is durable, and a record that becomes
durable after its transaction ended is deleted at once.

Ending a transaction (one *driver* thread per transaction; other callers wait
for it and get the same answer):

1. OPEN -> COMMITTING/ABORTING, logged;
2. every produced partition and acked subscription is ended, transient
   failures retried with backoff;
3. the outcome is recorded in the TerminatedTxnStore (PIP-255), durably;
4. COMMITTED/ABORTED is logged;
5. the transaction leaves memory and all its log records are deleted by
   position and batch index.

A crash anywhere is repaired by recovery: step 1 not durable -> still OPEN
(it times out); steps 2-4 -> recovered as COMMITTING/ABORTING and finished
(participants and the store are idempotent); after 4 -> its leftover records
are purged.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import logging
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from prometheus_client.registry import REGISTRY, CollectorRegistry

from txnstream._native import (
    TxnPosition,
    encode_txn_add_partitions,
    encode_txn_add_subscriptions,
    encode_txn_new,
    encode_txn_update,
)
from txnstream.coordinator.arguments import (
    client_arg,
    partition_names,
    subscription_pairs,
    timeout_arg,
)
from txnstream.coordinator.config import CoordinatorConfig
from txnstream.coordinator.log import TransactionLog
from txnstream.coordinator.metadata import TransactionInfo, TxnMeta
from txnstream.coordinator.participants import (
    NullParticipants,
    ParticipantResolver,
    ParticipantsFailed,
    end_participants,
)
from txnstream.coordinator.recovery import PositionColumns, PositionTable
from txnstream.coordinator.sequence import SequenceFile, SequenceStore
from txnstream.coordinator.status import TxnAction, TxnStatus, check_transition
from txnstream.coordinator.terminated import TerminatedPersistence, TerminatedTxnStore
from txnstream.coordinator.timeouts import Clock, TimerService, wall_clock_ms
from txnstream.coordinator.txn_id import TxnID
from txnstream.errors import (
    CoordinatorNotFound,
    InvalidArgumentError,
    InvalidTxnStatusError,
    TransactionAlreadyAborted,
    TransactionAlreadyCommitted,
    TransactionError,
    TransactionNotFound,
    TransactionTimedOut,
)
from txnstream.metrics import END_LATENCY_BOUNDS_MS, register_coordinator, unregister_coordinator
from txnstream.proto import Subscription

if TYPE_CHECKING:
    from txnstream.coordinator.aio import AsyncCoordinator

log = logging.getLogger(__name__)

#: Named steps of ending, reported to ``step_hook`` (crash tests stop there).
STEPS = ("ending_logged", "participants_done", "terminated_stored", "final_logged")

StepHook = Callable[[str, TxnID], None]

#: Shortest delay before a background end whose participants failed runs again.
BACKGROUND_RETRY_MIN_MS = 20


def log_name(tc_id: int) -> str:
    """Managed-ledger name of coordinator ``tc_id``'s transaction log."""
    return f"__transaction_log_{tc_id}"


def terminated_topic_name(tc_id: int) -> str:
    """Compacted-topic name of coordinator ``tc_id``'s terminated-transaction store."""
    return f"__terminated_txn_state_{tc_id}"


class TransactionCoordinator:
    """One transaction coordinator: ids ``(tc_id, seq)``, its own log and store.

    Build with :meth:`open` on a data directory; the constructor takes
    ready-made parts (a log, a sequence file, a store persistence) and runs
    recovery from the log; with a ``registry`` its metrics are exported
    there (label ``coordinator=<tc_id>``) until :meth:`close`. Thread-safe.
    """

    def __init__(
        self,
        tc_id: int,
        txn_log: TransactionLog,
        *,
        config: CoordinatorConfig | None = None,
        participants: ParticipantResolver | None = None,
        sequence: SequenceStore | None = None,
        terminated: TerminatedPersistence | None = None,
        clock: Clock = wall_clock_ms,
        closers: Iterable[Callable[[], None]] = (),
        registry: CollectorRegistry | None = None,
    ) -> None:
        if isinstance(tc_id, bool) or not isinstance(tc_id, int) or not 0 <= tc_id < 1 << 64:
            raise InvalidArgumentError(
                f"coordinator id must be an unsigned 64-bit integer, got {tc_id!r}",
                argument="tc_id",
                value=tc_id,
            )
        self.tc_id = tc_id
        self.config = config or CoordinatorConfig()
        self.participants: ParticipantResolver = participants or NullParticipants()
        self.step_hook: StepHook | None = None
        self._log = txn_log
        self._sequence = sequence
        self._clock = clock
        self._closers = list(closers)
        self._lock = threading.Lock()
        self._txns: dict[int, TxnMeta] = {}
        self._recovered: PositionTable | None = None
        self._aio: AsyncCoordinator | None = None
        self._closed = False
        self._stop = threading.Event()
        self._counts = dict.fromkeys(
            ("created", "committed", "aborted", "timed_out", "recovered", "append_errors"), 0
        )
        # End latency (ms) histogram: one bucket count per bound, last = +Inf.
        self._latency = [0] * (len(END_LATENCY_BOUNDS_MS) + 1)
        self._latency_sum = 0
        self.store = TerminatedTxnStore(
            self.config.transaction_meta_persist_count,
            self.config.persist_time_ms,
            persistence=terminated,
            clock=clock,
        )
        self._timers = TimerService(clock, name=f"txnstream-tc{tc_id}-timer")
        self._fire_timeout_cb = self._fire_timeout
        self._fire_resume_cb = self._fire_resume
        # Background ends (timeouts, recovery resumes, retries) make at most
        # this many attempts per run, then reschedule through the timer, so a
        # participant that never answers cannot occupy the pool.
        retry = self.config.retry
        attempts = self.config.background_end_attempts
        if retry.max_attempts is not None:
            attempts = min(attempts, retry.max_attempts)
        self._bg_retry = dataclasses.replace(retry, max_attempts=attempts)
        self._executor = ThreadPoolExecutor(
            self.config.end_workers, thread_name_prefix=f"txnstream-tc{tc_id}-end"
        )
        # The sweep and compactions of the terminated store never queue
        # behind ends.
        self._maintenance = ThreadPoolExecutor(1, thread_name_prefix=f"txnstream-tc{tc_id}-maint")
        self.store.schedule_compaction = self._schedule_compaction
        try:
            self._recover()
        except BaseException:
            self._shutdown_threads()
            raise
        self._schedule_sweep()
        self._registry = registry
        if registry is not None:
            register_coordinator(self, str(tc_id), registry)

    # ------------------------------------------------------------------ open

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        tc_id: int = 0,
        *,
        config: CoordinatorConfig | None = None,
        participants: ParticipantResolver | None = None,
        clock: Clock = wall_clock_ms,
        log_options: dict[str, Any] | None = None,
        registry: CollectorRegistry | None = REGISTRY,
        **settings: Any,
    ) -> TransactionCoordinator:
        """Open (recovering) coordinator ``tc_id`` on data directory ``directory``.

        The log is the managed ledger ``__transaction_log_<tc_id>``; the
        terminated store the compacted topic ``__terminated_txn_state_<tc_id>``.
        Keyword ``settings`` override fields of ``config``
        (:class:`~.config.CoordinatorConfig`); ``log_options`` go to
        ``ManagedLedger.open`` (e.g. ``max_entries_per_ledger``). Metrics of
        the coordinator and of its log's writer are exported to ``registry``
        (prometheus-client; None: not exported) until :meth:`close`.
        """
        from txnstream.coordinator.ledger_log import (
            LedgerTransactionLog,
            open_terminated_topic,
        )

        cfg = (config or CoordinatorConfig()).replace(**settings) if settings else config
        cfg = cfg or CoordinatorConfig()
        txn_log = LedgerTransactionLog.open(
            directory,
            log_name(tc_id),
            batched_write=cfg.batched_write,
            registry=registry,
            **(log_options or {}),
        )
        closers: list[Callable[[], None]] = []
        try:
            topic = open_terminated_topic(directory, terminated_topic_name(tc_id))
            closers.append(topic.close)
            return cls(
                tc_id,
                txn_log,
                config=cfg,
                participants=participants,
                sequence=SequenceFile(directory, tc_id),
                terminated=topic,
                clock=clock,
                closers=closers,
                registry=registry,
            )
        except BaseException:
            closers.append(txn_log.close)
            for close in reversed(closers):
                try:
                    close()
                except Exception:
                    log.exception("closing after a failed open")
            raise

    def _recover(self) -> None:
        # Decoding and folding run in Rust over the whole log; here only one
        # TxnMeta per live transaction is built, timers are armed in bulk and
        # positions stay in one columnar table.
        rec = self._log.fold(self.tc_id)
        mark = self._sequence.load() if self._sequence is not None else 0
        self._next_seq = max(mark, rec.max_seq + 1)
        self._reserved = self._next_seq
        self._reserve()
        self.store.restore()
        if len(rec.purge):
            self._log.delete_columns(rec.purge)
        self._recovered = rec.positions if len(rec) else None
        resume: list[int] = []
        armed: list[TxnMeta] = []
        deadlines: list[int] = []
        now = self._clock()
        txns = self._txns
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
            meta = TxnMeta(seq, timeout, start, client, statuses[st])
            meta.last_modified = modified
            meta.timed_out = late  # logged with the ending UPDATE (field 1000)
            meta.partitions = parts
            meta.subscriptions = subs
            meta.span = span
            txns[seq] = meta
            if st == 0:  # OPEN
                armed.append(meta)
                deadlines.append(max(start + timeout, now))
            else:
                resume.append(seq)
        handles = self._timers.schedule_many(
            deadlines, self._fire_timeout_cb, [m.seq for m in armed]
        )
        for meta, handle in zip(armed, handles, strict=True):
            meta.timer = handle
        self._counts["recovered"] = len(rec)
        self.recovery = {
            "records": rec.records,
            "live_records": rec.live_records,
            "purged_records": len(rec.purge),
            "foreign_records": rec.foreign_records,
            "open": len(rec) - len(resume),
            "ending": len(resume),
            "next_seq": self._next_seq,
        }
        for seq in resume:
            self._executor.submit(self._resume, seq)

    def _schedule_compaction(self) -> None:
        # RuntimeError: the pool is shut down, the coordinator is closing.
        with contextlib.suppress(RuntimeError):
            self._maintenance.submit(self._compact_store)

    def _compact_store(self) -> None:
        try:
            self.store.compact()
        except Exception:
            if not self._closed:
                log.exception("compacting the terminated-transaction topic failed")

    def _release_span(self, meta: TxnMeta) -> PositionColumns | None:
        # Under the lock: the recovered records of an ended transaction.
        table = self._recovered
        if meta.span < 0 or table is None:
            return None
        cols = table.span(meta.span)
        meta.span = -1
        table.live -= 1
        if table.live == 0:
            self._recovered = None  # every recovered transaction ended
        return cols

    def _span_records(self, meta: TxnMeta) -> int:
        table = self._recovered
        return table.count(meta.span) if meta.span >= 0 and table is not None else 0

    def _reserve(self) -> None:
        # Called under the lock (or before any thread exists).
        if self._sequence is not None and self._next_seq >= self._reserved:
            self._reserved = self._next_seq + self.config.sequence_reserve_block
            self._sequence.store(self._reserved)

    # ------------------------------------------------------------- helpers

    def _check_open(self) -> None:
        if self._closed:
            raise CoordinatorNotFound(
                f"transaction coordinator {self.tc_id} is closed", tc_id=self.tc_id
            )

    def _seq_of(self, txn_id: TxnID) -> int:
        if not isinstance(txn_id, TxnID):
            raise InvalidArgumentError(
                f"expected a TxnID, got {txn_id!r}", argument="txn_id", value=txn_id
            )
        if txn_id.most_bits != self.tc_id:
            raise CoordinatorNotFound(
                f"transaction {txn_id} belongs to coordinator {txn_id.most_bits}, not {self.tc_id}",
                tc_id=txn_id.most_bits,
                txn_id=txn_id,
            )
        return txn_id.least_bits

    def _tid(self, seq: int) -> TxnID:
        return TxnID._trusted(self.tc_id, seq)

    def _durable(self, record: bytes) -> TxnPosition:
        try:
            return self._log.write_sync(record)
        except Exception:
            with self._lock:
                self._counts["append_errors"] += 1
            raise

    def _note_position(self, meta: TxnMeta, pos: TxnPosition) -> None:
        with self._lock:
            if not meta.status.is_final:
                meta.positions.append(pos)
                return
        # The transaction ended while this record was in flight: delete it now.
        self._log.delete([pos])

    def _hook(self, step: str, seq: int) -> None:
        if self.step_hook is not None:
            self.step_hook(step, self._tid(seq))

    def _live(self, txn_id: TxnID, seq: int, want: str) -> TxnMeta:
        meta = self._txns.get(seq)
        if meta is not None:
            return meta
        rec = self.store.lookup(txn_id)
        if rec is not None:
            raise InvalidTxnStatusError(
                f"cannot {want} transaction {txn_id}: it already ended {rec.status.name}",
                txn_id=txn_id,
                current=rec.status,
                requested=TxnStatus.OPEN,
            )
        raise TransactionNotFound(f"transaction {txn_id} not found", txn_id=txn_id)

    def _require_open(self, txn_id: TxnID, meta: TxnMeta, want: str) -> None:
        if meta.status is TxnStatus.OPEN:
            return
        if meta.timed_out:
            raise TransactionTimedOut(
                f"cannot {want} transaction {txn_id}: it timed out and is {meta.status.name}",
                txn_id=txn_id,
                status=meta.status,
            )
        raise InvalidTxnStatusError(
            f"cannot {want} transaction {txn_id}: it is {meta.status.name}, not OPEN",
            txn_id=txn_id,
            current=meta.status,
            requested=TxnStatus.OPEN,
        )

    # ------------------------------------------------------------ public API

    def new_transaction(
        self, timeout_ms: int | None = None, client_name: str | None = None
    ) -> TxnID:
        """Start a transaction; return its id once the NEW record is durable.

        ``client_name`` enables idempotent end (PIP-255) for it when the
        terminated store is on.
        """
        if timeout_ms is None:
            timeout_ms = self.config.default_timeout_ms
        timeout_ms = timeout_arg(timeout_ms, self.config.max_timeout_ms)
        client = client_arg(client_name)
        now = self._clock()
        with self._lock:
            self._check_open()
            seq = self._next_seq
            self._next_seq += 1
            self._reserve()
            meta = TxnMeta(seq, timeout_ms, now, client)
            self._txns[seq] = meta
            # The record is decided under the lock, written outside it.
            record = encode_txn_new(self.tc_id, seq, now, timeout_ms, client)
        try:
            pos = self._durable(record)
        except BaseException:
            with self._lock:
                self._txns.pop(seq, None)
            raise
        with self._lock:
            meta.positions.append(pos)
            self._counts["created"] += 1
            if meta.status is TxnStatus.OPEN and not self._closed:
                self._arm(meta, meta.deadline)
        return self._tid(seq)

    def add_produced_partitions(self, txn_id: TxnID, partitions: Iterable[str]) -> None:
        """Record that the transaction produced to ``partitions`` (durably)."""
        seq = self._seq_of(txn_id)
        names = partition_names(partitions)
        now = self._clock()
        with self._lock:
            self._check_open()
            meta = self._live(txn_id, seq, "add partitions to")
            self._require_open(txn_id, meta, "add partitions to")
            new = meta.add_partitions(names)
            if not new:
                return
            meta.last_modified = now
            record = encode_txn_add_partitions(self.tc_id, seq, now, new)
        self._note_position(meta, self._durable(record))

    def add_acked_subscriptions(
        self, txn_id: TxnID, subscriptions: Iterable[tuple[str, str] | Subscription]
    ) -> None:
        """Record that the transaction acked on ``(topic, subscription)`` pairs."""
        seq = self._seq_of(txn_id)
        subs = subscription_pairs(subscriptions)
        now = self._clock()
        with self._lock:
            self._check_open()
            meta = self._live(txn_id, seq, "add subscriptions to")
            self._require_open(txn_id, meta, "add subscriptions to")
            new = meta.add_subscriptions(subs)
            if not new:
                return
            meta.last_modified = now
            record = encode_txn_add_subscriptions(self.tc_id, seq, now, new)
        self._note_position(meta, self._durable(record))

    def end_transaction(self, txn_id: TxnID, action: TxnAction | str) -> TxnStatus:
        """Commit or abort; return the final status once it is durable.

        Idempotent (SPEC §4.4): repeating the same end returns the same
        outcome, also after a restart when the terminated store is on; the
        opposite request raises :class:`TransactionAlreadyCommitted` /
        :class:`TransactionAlreadyAborted` (``timed_out=True`` when the
        timeout won); unknown everywhere raises :class:`TransactionNotFound`.
        """
        act = TxnAction.parse(action)
        seq = self._seq_of(txn_id)
        meta = self._end(seq, act, timed_out=False)
        if meta is None:
            return self._ended_answer(txn_id, act)
        return self._answer(txn_id, act, meta.status, meta.timed_out)

    def commit(self, txn_id: TxnID) -> TxnStatus:
        """Shorthand for ``end_transaction(txn_id, "commit")``."""
        return self.end_transaction(txn_id, TxnAction.COMMIT)

    def abort(self, txn_id: TxnID) -> TxnStatus:
        """Shorthand for ``end_transaction(txn_id, "abort")``."""
        return self.end_transaction(txn_id, TxnAction.ABORT)

    def abort_transaction(self, txn_id: TxnID) -> TxnStatus:
        """Admin: abort a stuck transaction, or finish one stuck while ending.

        An OPEN transaction is aborted; one already COMMITTING/ABORTING (its
        outcome is decided) is driven to its end again. Returns the final status.
        """
        seq = self._seq_of(txn_id)
        meta = self._end(seq, TxnAction.ABORT, timed_out=False)
        if meta is None:
            rec = self.store.lookup(txn_id)
            if rec is None:
                raise TransactionNotFound(f"transaction {txn_id} not found", txn_id=txn_id)
            return rec.status
        return meta.status

    # ------------------------------------------------------------ bulk API
    #
    # The same state machine for many transactions per call: one batched
    # write (and one wait, GIL released) per step instead of one per
    # transaction, so a Python caller is not bound by thread handoffs.
    # Per-transaction refusals come back in the result list as exception
    # objects (as ``asyncio.gather(return_exceptions=True)``); bad arguments
    # and log write failures raise.

    def _durable_many(self, records: list[bytes]) -> list[TxnPosition]:
        try:
            return self._log.write_many_sync(records)
        except Exception:
            with self._lock:
                self._counts["append_errors"] += 1
            raise

    def new_transactions(
        self, count: int, timeout_ms: int | None = None, client_name: str | None = None
    ) -> list[TxnID]:
        """Start ``count`` transactions; return their ids once all NEW records are durable."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise InvalidArgumentError(
                f"count must be a non-negative integer, got {count!r}",
                argument="count",
                value=count,
            )
        if timeout_ms is None:
            timeout_ms = self.config.default_timeout_ms
        timeout_ms = timeout_arg(timeout_ms, self.config.max_timeout_ms)
        client = client_arg(client_name)
        if count == 0:
            return []
        now = self._clock()
        with self._lock:
            self._check_open()
            first = self._next_seq
            self._next_seq += count
            self._reserve()
            seqs = range(first, first + count)
            metas = [TxnMeta(seq, timeout_ms, now, client) for seq in seqs]
            self._txns.update(zip(seqs, metas, strict=True))
        tc = self.tc_id
        records = [encode_txn_new(tc, seq, now, timeout_ms, client) for seq in seqs]
        try:
            positions = self._durable_many(records)
        except BaseException:
            with self._lock:
                for seq in seqs:
                    self._txns.pop(seq, None)
            raise
        with self._lock:
            armed = []
            for meta, pos in zip(metas, positions, strict=True):
                meta.positions.append(pos)
                if meta.status is TxnStatus.OPEN:
                    armed.append(meta)
            self._counts["created"] += count
            if not self._closed:
                handles = self._timers.schedule_many(
                    [now + timeout_ms] * len(armed),
                    self._fire_timeout_cb,
                    [m.seq for m in armed],
                )
                for meta, handle in zip(armed, handles, strict=True):
                    meta.timer = handle
        return [self._tid(seq) for seq in seqs]

    def _add_many(
        self,
        items: list[tuple[TxnID, list[Any]]],
        want: str,
        add: Callable[[TxnMeta, list[Any]], list[Any]],
        encode: Callable[[int, int, int, list[Any]], bytes],
    ) -> list[TransactionError | None]:
        results: list[TransactionError | None] = [None] * len(items)
        seqs = [self._seq_of(txn) for txn, _ in items]
        now = self._clock()
        todo: list[tuple[TxnMeta, bytes]] = []
        with self._lock:
            self._check_open()
            for i, ((txn, values), seq) in enumerate(zip(items, seqs, strict=True)):
                try:
                    meta = self._live(txn, seq, want)
                    self._require_open(txn, meta, want)
                except TransactionError as exc:
                    results[i] = exc
                    continue
                new = add(meta, values)
                if new:
                    meta.last_modified = now
                    todo.append((meta, encode(self.tc_id, seq, now, new)))
        if todo:
            positions = self._durable_many([r for _, r in todo])
            late: list[TxnPosition] = []
            with self._lock:
                for (meta, _), pos in zip(todo, positions, strict=True):
                    if meta.status.is_final:
                        late.append(pos)  # ended while in flight: delete now
                    else:
                        meta.positions.append(pos)
            if late:
                self._log.delete(late)
        return results

    def add_produced_partitions_many(
        self, items: Iterable[tuple[TxnID, Iterable[str]]]
    ) -> list[TransactionError | None]:
        """:meth:`add_produced_partitions` for many transactions, one log write.

        Returns, per item, None or the refusal (e.g. ``TransactionNotFound``).
        """
        checked = [(txn, partition_names(parts)) for txn, parts in items]
        return self._add_many(
            checked, "add partitions to", TxnMeta.add_partitions, encode_txn_add_partitions
        )

    def add_acked_subscriptions_many(
        self, items: Iterable[tuple[TxnID, Iterable[tuple[str, str] | Subscription]]]
    ) -> list[TransactionError | None]:
        """:meth:`add_acked_subscriptions` for many transactions, one log write."""
        checked = [(txn, subscription_pairs(subs)) for txn, subs in items]
        return self._add_many(
            checked,
            "add subscriptions to",
            TxnMeta.add_subscriptions,
            encode_txn_add_subscriptions,
        )

    def end_transactions(
        self, items: Iterable[tuple[TxnID, TxnAction | str]]
    ) -> list[TxnStatus | TransactionError]:
        """:meth:`end_transaction` for many transactions.

        The ending UPDATEs are written together, participants are ended per
        transaction, then the final UPDATEs are written together; a
        transaction another thread is ending is waited for. Returns, per
        item, the final status or the refusal
        (``TransactionAlreadyAborted``, ``TransactionNotFound``...).
        """
        reqs = [(txn, self._seq_of(txn), TxnAction.parse(act)) for txn, act in items]
        results: list[TxnStatus | TransactionError | None] = [None] * len(reqs)
        drive: list[tuple[int, TxnMeta, bytes | None]] = []
        later: list[int] = []
        with self._lock:
            self._check_open()
            for i, (txn, seq, act) in enumerate(reqs):
                meta, record, driving, done = self._claim(seq, act, False)
                if driving:
                    assert meta is not None
                    drive.append((i, meta, record))
                elif meta is not None and done is None:
                    results[i] = self._answer_or_error(txn, act, meta)
                else:
                    later.append(i)  # not in memory, or another thread drives
        if drive:
            self._drive_many(drive, reqs, results)
        for i in later:
            txn, _, act = reqs[i]
            try:
                results[i] = self.end_transaction(txn, act)
            except TransactionError as exc:
                results[i] = exc
        out: list[TxnStatus | TransactionError] = []
        for r in results:
            assert r is not None  # every item was answered above
            out.append(r)
        return out

    def _answer_or_error(
        self, txn: TxnID, act: TxnAction, meta: TxnMeta
    ) -> TxnStatus | TransactionError:
        try:
            return self._answer(txn, act, meta.status, meta.timed_out)
        except TransactionError as exc:
            return exc

    def _drive_many(
        self,
        drive: list[tuple[int, TxnMeta, bytes | None]],
        reqs: list[tuple[TxnID, int, TxnAction]],
        results: list[TxnStatus | TransactionError | None],
    ) -> None:
        """Run steps 1-5 of ending for many transactions we drive (as :meth:`_drive`)."""
        try:
            # Step 1: the OPEN ones log their ending UPDATE (resumed ones did).
            fresh = [(m, r) for _, m, r in drive if r is not None]
            if fresh:
                try:
                    positions = self._durable_many([r for _, r in fresh])
                except BaseException:
                    for m, _ in fresh:
                        self._ending_not_logged(m)
                    raise
                with self._lock:
                    for (m, _), pos in zip(fresh, positions, strict=True):
                        m.positions.append(pos)
            # Steps 2-3 per transaction; one refused does not stop the others.
            finals: list[tuple[int, TxnMeta, bytes, int]] = []
            for i, meta, _ in drive:
                try:
                    record, now = self._end_participants(meta)
                except TransactionError as exc:
                    results[i] = exc
                    continue
                finals.append((i, meta, record, now))
            if not finals:
                return
            with self._lock:
                self._check_open()
            lasts = self._durable_many([r for _, _, r, _ in finals])
            for _, meta, _, _ in finals:
                self._hook("final_logged", meta.seq)
            deletes: list[TxnPosition] = []
            spans: list[PositionColumns] = []
            with self._lock:
                for (i, meta, _, now), last in zip(finals, lasts, strict=True):
                    positions, recovered = self._finish_locked(meta, last, now)
                    deletes.extend(positions)
                    if recovered is not None:
                        spans.append(recovered)
                    txn, _, act = reqs[i]
                    results[i] = self._answer_or_error(txn, act, meta)
            self._log.delete(deletes)
            for cols in spans:
                self._log.delete_columns(cols)
        finally:
            for _, meta, _ in drive:
                self._release(meta)

    @staticmethod
    def _answer(txn_id: TxnID, act: TxnAction, final: TxnStatus, timed_out: bool) -> TxnStatus:
        if final is act.final_status:
            return final
        if final is TxnStatus.COMMITTED:
            raise TransactionAlreadyCommitted(
                f"cannot abort transaction {txn_id}: it already committed",
                txn_id=txn_id,
                status=final,
            )
        why = " (timed out)" if timed_out else ""
        raise TransactionAlreadyAborted(
            f"cannot commit transaction {txn_id}: it already aborted{why}",
            txn_id=txn_id,
            status=final,
            timed_out=timed_out,
        )

    def _ended_answer(self, txn_id: TxnID, act: TxnAction) -> TxnStatus:
        rec = self.store.lookup(txn_id)
        if rec is None:
            raise TransactionNotFound(
                f"transaction {txn_id} not found (unknown, or ended and not remembered)",
                txn_id=txn_id,
            )
        return self._answer(txn_id, act, rec.status, rec.timed_out)

    def _claim(
        self, seq: int, act: TxnAction, timed_out: bool
    ) -> tuple[TxnMeta | None, bytes | None, bool, threading.Event | None]:
        """Under the lock: decide what the caller does about ending ``seq``.

        Returns ``(meta, record, drive, done)``: ``meta`` None -> not in
        memory; ``drive`` -> the caller drives the end (``record``: the
        ending UPDATE to log first, None when resuming); ``done`` -> another
        thread drives, wait for it; neither -> ``meta`` is the answer.
        """
        meta = self._txns.get(seq)
        if meta is None or meta.status.is_final:
            return meta, None, False, None
        if meta.status is TxnStatus.OPEN:
            if timed_out and self._clock() < meta.deadline:
                return meta, None, False, None  # fired early (clock moved back)
            target = act.ending_status
            check_transition(self._tid(seq), meta.status, target)
            now = self._clock()
            record = encode_txn_update(self.tc_id, seq, now, TxnStatus.OPEN, target, timed_out)
            meta.status = target
            meta.timed_out = timed_out
            meta.last_modified = now
            if meta.timer is not None:
                self._timers.cancel(meta.timer)  # type: ignore[arg-type]
                meta.timer = None
            meta.driver = True
            return meta, record, True, None
        if timed_out:
            return meta, None, False, None
        if not meta.driver:
            meta.driver = True  # resume an end stalled by failures
            return meta, None, True, None
        if meta.done is None:
            meta.done = threading.Event()
        return meta, None, False, meta.done

    def _end(
        self, seq: int, act: TxnAction, *, timed_out: bool, background: bool = False
    ) -> TxnMeta | None:
        """Drive or wait for the end of ``seq``; None if it is not in memory.

        With ``timed_out`` (the timer) nothing happens unless the transaction
        is still OPEN past its deadline. ``background`` (a pool thread):
        participants get a bounded number of attempts (``ParticipantsFailed``
        then), and an end another thread drives is not waited for.
        """
        while True:
            with self._lock:
                self._check_open()
                meta, record, drive, done = self._claim(seq, act, timed_out)
            if meta is None:
                return None
            if drive:
                self._drive(meta, record, background)
                return meta
            if done is None or background:
                return meta
            done.wait()
            if meta.status.is_final:
                return meta
            # The driver gave up (failure); loop to take over or report.

    def _release(self, meta: TxnMeta) -> None:
        with self._lock:
            meta.driver = False
            done, meta.done = meta.done, None
        if done is not None:
            done.set()

    def _ending_not_logged(self, meta: TxnMeta) -> None:
        # The ending UPDATE failed: as far as the log knows it is still OPEN.
        with self._lock:
            meta.status = TxnStatus.OPEN
            meta.timed_out = False
            if not self._closed:
                self._arm(meta, meta.deadline)

    def _end_participants(self, meta: TxnMeta, background: bool = False) -> tuple[bytes, int]:
        """Run steps 2-3 once the ending UPDATE is durable; return the final record."""
        seq = meta.seq
        tid = self._tid(seq)
        commit = meta.status is TxnStatus.COMMITTING
        self._hook("ending_logged", seq)
        end_participants(
            tid,
            commit,
            list(meta.partitions or ()),
            list(meta.subscriptions or ()),
            self.participants,
            self._bg_retry if background else self.config.retry,
            self._stop,
        )
        self._hook("participants_done", seq)
        final = TxnStatus.COMMITTED if commit else TxnStatus.ABORTED
        self.store.record(tid, meta.client_name, final, timed_out=meta.timed_out)
        self._hook("terminated_stored", seq)
        now = self._clock()
        record = encode_txn_update(self.tc_id, seq, now, meta.status, final, meta.timed_out)
        return record, now

    def _finish_locked(
        self, meta: TxnMeta, last: TxnPosition, now: int
    ) -> tuple[list[TxnPosition], PositionColumns | None]:
        # Step 5 under the lock: leave memory; return what to delete.
        commit = meta.status is TxnStatus.COMMITTING
        meta.status = TxnStatus.COMMITTED if commit else TxnStatus.ABORTED
        # last_modified is still the time of the ending UPDATE.
        latency = max(0, now - meta.last_modified)
        self._latency[bisect.bisect_left(END_LATENCY_BOUNDS_MS, latency)] += 1
        self._latency_sum += latency
        meta.last_modified = now
        self._txns.pop(meta.seq, None)
        positions = meta.positions
        positions.append(last)
        meta.positions = []
        meta.partitions = meta.subscriptions = None
        if meta.timer is not None:  # a pending background retry
            self._timers.cancel(meta.timer)  # type: ignore[arg-type]
            meta.timer = None
        self._counts["committed" if commit else "aborted"] += 1
        if meta.timed_out:
            self._counts["timed_out"] += 1
        return positions, self._release_span(meta)

    def _drive(self, meta: TxnMeta, record: bytes | None, background: bool = False) -> None:
        """Run steps 1-5 of ending (see module doc) for a transaction we drive."""
        try:
            if record is not None:
                try:
                    pos = self._durable(record)
                except BaseException:
                    self._ending_not_logged(meta)
                    raise
                self._note_position(meta, pos)
            final_record, now = self._end_participants(meta, background)
            with self._lock:
                self._check_open()
            last = self._durable(final_record)
            self._hook("final_logged", meta.seq)
            with self._lock:
                positions, recovered = self._finish_locked(meta, last, now)
            self._log.delete(positions)
            if recovered is not None:
                self._log.delete_columns(recovered)
        finally:
            self._release(meta)

    def _resume(self, seq: int) -> None:
        # A background run finishing an end decided earlier (recovery, retry).
        with self._lock:
            meta = self._txns.get(seq)
            if meta is None or self._closed or not meta.status.is_ending:
                return
            meta.timer = None  # this run is the scheduled retry
            act = TxnAction.COMMIT if meta.status is TxnStatus.COMMITTING else TxnAction.ABORT
        self._background_end(seq, act, timed_out=False)

    def _background_end(self, seq: int, act: TxnAction, *, timed_out: bool) -> TxnMeta | None:
        try:
            return self._end(seq, act, timed_out=timed_out, background=True)
        except ParticipantsFailed:
            self._retry_later(seq)
        except Exception:
            if not self._closed:
                log.exception("ending transaction %s in the background failed", self._tid(seq))
        return None

    def _retry_later(self, seq: int) -> None:
        """Reschedule a background end whose participants kept failing (backoff)."""
        with self._lock:
            meta = self._txns.get(seq)
            if meta is None or self._closed or not meta.status.is_ending:
                return
            if meta.timer is not None:
                return  # a retry is already scheduled
            meta.retries += 1
            policy = self._bg_retry
            attempt = meta.retries * (policy.max_attempts or 1)
            delay = max(BACKGROUND_RETRY_MIN_MS, policy.backoff_ms(attempt))
            meta.timer = self._timers.schedule(
                self._clock() + int(delay), self._fire_resume_cb, seq
            )

    def _fire_resume(self, seq: int) -> None:
        with contextlib.suppress(RuntimeError):
            self._executor.submit(self._resume, seq)

    def _arm(self, meta: TxnMeta, deadline: int) -> None:
        # Shared bound callback + the sequence as argument: no closure per transaction.
        meta.timer = self._timers.schedule(deadline, self._fire_timeout_cb, meta.seq)

    def _fire_timeout(self, seq: int) -> None:
        # RuntimeError: executor shut down, the coordinator is closing.
        with contextlib.suppress(RuntimeError):
            self._executor.submit(self._on_timeout, seq)

    def _on_timeout(self, seq: int) -> None:
        meta = self._background_end(seq, TxnAction.ABORT, timed_out=True)
        if meta is not None:
            with self._lock:
                if meta.status is TxnStatus.OPEN and not self._closed:
                    self._arm(meta, meta.deadline)

    # ------------------------------------------------------------ queries

    def get_transaction(self, txn_id: TxnID) -> TransactionInfo:
        """Return a snapshot of the transaction (live, or remembered by the store)."""
        seq = self._seq_of(txn_id)
        with self._lock:
            meta = self._txns.get(seq)
            if meta is not None:
                return meta.info(self.tc_id, self._span_records(meta))
        rec = self.store.lookup(txn_id)
        if rec is None:
            raise TransactionNotFound(f"transaction {txn_id} not found", txn_id=txn_id)
        return TransactionInfo(
            txn_id=txn_id,
            status=rec.status,
            timed_out=rec.timed_out,
            timeout_ms=0,
            start_time=0,
            last_modification_time=rec.end_time,
            client_name=rec.client_name,
            partitions=(),
            subscriptions=(),
        )

    def list_transactions(self, status: TxnStatus | None = None) -> list[TransactionInfo]:
        """Snapshots of every live transaction (optionally with ``status``), by id."""
        with self._lock:
            return [
                m.info(self.tc_id, self._span_records(m))
                for m in self._txns.values()
                if status is None or m.status is status
            ]

    def slow_transactions(self, min_age_ms: int) -> list[TransactionInfo]:
        """Live transactions started at least ``min_age_ms`` ago (oldest first)."""
        cutoff = self._clock() - min_age_ms
        with self._lock:
            slow = [
                m.info(self.tc_id, self._span_records(m))
                for m in self._txns.values()
                if m.start_time <= cutoff
            ]
        slow.sort(key=lambda i: (i.start_time, i.txn_id))
        return slow

    def low_water_mark(self) -> int:
        """Every transaction with ``least_bits <= LWM`` has ended (-1: none yet)."""
        with self._lock:
            if self._txns:
                return next(iter(self._txns)) - 1
            return self._next_seq - 1

    def stats(self) -> dict[str, Any]:
        """Counters: open/ending/committed/aborted/timed-out, LWM, log and store."""
        with self._lock:
            ending = sum(1 for m in self._txns.values() if m.status.is_ending)
            out: dict[str, Any] = dict(self._counts)
            out.update(
                tc_id=self.tc_id,
                live=len(self._txns),
                open=len(self._txns) - ending,
                ending=ending,
                next_seq=self._next_seq,
                timers=len(self._timers),
            )
        out["low_water_mark"] = self.low_water_mark()
        out["terminated_remembered"] = len(self.store)
        out["log"] = self._log.stats()
        return out

    def metrics(self) -> dict[str, Any]:
        """Scrape-time snapshot for :class:`txnstream.metrics.CoordinatorCollector`."""
        with self._lock:
            ending = sum(1 for m in self._txns.values() if m.status.is_ending)
            out: dict[str, Any] = dict(self._counts)
            out["active"] = len(self._txns)
            out["open"] = len(self._txns) - ending
            out["end_latency_ms"] = {
                "bounds": END_LATENCY_BOUNDS_MS,
                "counts": list(self._latency),
                "sum": self._latency_sum,
            }
        return out

    def aio(self) -> AsyncCoordinator:
        """Return the asyncio front end (:class:`~.aio.AsyncCoordinator`), made once."""
        with self._lock:
            self._check_open()
            if self._aio is None:
                from txnstream.coordinator.aio import AsyncCoordinator

                self._aio = AsyncCoordinator(self)
            return self._aio

    def set_batch_enabled(self, enabled: bool) -> None:
        """Switch batched writes of the transaction log on or off at runtime."""
        self._log.set_batch_enabled(bool(enabled))

    def sweep_terminated(self) -> int:
        """Expire old terminated-transaction entries now; return how many went."""
        return self.store.sweep()

    def _schedule_sweep(self) -> None:
        if not self.store.enabled:
            return

        def fire() -> None:
            with contextlib.suppress(RuntimeError):
                self._maintenance.submit(sweep)

        def sweep() -> None:
            try:
                self.store.sweep()
            except Exception:
                log.exception("terminated-transaction sweep failed")
            with self._lock:
                if not self._closed:
                    self._timers.schedule(
                        self._clock() + self.config.expire_check_interval_ms, fire
                    )

        self._timers.schedule(self._clock() + self.config.expire_check_interval_ms, fire)

    # ------------------------------------------------------------- close

    def _shutdown_threads(self) -> None:
        self._stop.set()
        self._timers.close()
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._maintenance.shutdown(wait=True, cancel_futures=True)

    def close(self) -> None:
        """Stop timers and background ends, close the log and the store topic.

        Transactions still live stay in the log and are recovered by the next open.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        if self._registry is not None:
            unregister_coordinator(str(self.tc_id), self, self._registry)
        if self._aio is not None:
            self._aio.close()  # queued async calls are answered (or fail) first
        self._timers.close()
        self._log.close()
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._maintenance.shutdown(wait=True, cancel_futures=True)
        for close in reversed(self._closers):
            try:
                close()
            except Exception:
                log.exception("closing coordinator %d", self.tc_id)

    def __enter__(self) -> TransactionCoordinator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["STEPS", "TransactionCoordinator", "log_name", "terminated_topic_name"]
