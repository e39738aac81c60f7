"""The transaction coordinator (SPEC §4.3, §4.4, §4.9): the API clients call.

:class:`TransactionCoordinator` validates every argument (before any side
effect), then starts transactions, records what they touched, and hands
ends to the :class:`~.ending.EndDriver`. Every change is a
``TransactionMetadataEntry`` written through the log's BufferedWriter, and
a call returns only once its record is durable; memory changes only after
that write succeeded (see :mod:`.metadata`). Checks and memory changes
happen under the table lock, the writes outside it, so concurrent calls
share batched entries and syncs.

:class:`TransactionCoordinators` is several coordinators of one broker
(ids 0..N-1) sharing one timer service, routing calls by TxnID.

Files of the package, in dependency order: :mod:`.metadata` (what a
transaction is), :mod:`.config`, :mod:`.state` (table, log, recovery),
:mod:`.terminated` (PIP-255 store), :mod:`.ending` (how it ends), this
module, :mod:`.aio` (asyncio front end).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client.registry import REGISTRY, CollectorRegistry

from txnstream._native import (
    ManagedLedger,
    TxnPosition,
    encode_txn_add_partitions,
    encode_txn_add_subscriptions,
    encode_txn_new,
)
from txnstream.coordinator.config import CoordinatorConfig
from txnstream.coordinator.ending import (
    BackgroundEnds,
    Completions,
    EndDriver,
    EndTrace,
    NullParticipants,
    ParticipantResolver,
    end_answer,
    trace_arg,
    write_failed,
)
from txnstream.coordinator.metadata import (
    TransactionInfo,
    TxnAction,
    TxnID,
    TxnMeta,
    TxnStatus,
    bad_argument,
    client_arg,
    count_arg,
    is_int,
    is_text,
    items_arg,
    partition_names,
    subscription_pairs,
    tc_id_arg,
    timeout_arg,
    txn_id_arg,
)
from txnstream.coordinator.state import (
    CoordinatorCounters,
    DurableWriter,
    LedgerTransactionLog,
    SequenceFile,
    SequenceStore,
    TransactionLog,
    TransactionTable,
    definite,
    log_name,
    open_terminated_topic,
    recover,
    terminated_topic_name,
)
from txnstream.coordinator.terminated import (
    StoreMaintenance,
    TerminatedPersistence,
    TerminatedTxnStore,
)
from txnstream.errors import (
    CoordinatorNotFound,
    InvalidArgumentError,
    InvalidTxnStatusError,
    OperationTimeoutError,
    TransactionError,
    TransactionNotFound,
    TransactionTimedOut,
    TxnStreamError,
)
from txnstream.metrics import (
    check_coordinator_label,
    check_writer_label,
    register_coordinator,
    register_writer,
    unregister_coordinator,
)
from txnstream.proto import Subscription
from txnstream.timer import Clock, TimerService, clock_arg

if TYPE_CHECKING:
    from txnstream.coordinator.aio import AsyncCoordinator

log = logging.getLogger(__name__)

#: ``ManagedLedger.open`` options a coordinator passes through.
LOG_OPTIONS = frozenset(
    {
        "max_entries_per_ledger",
        "max_bytes_per_ledger",
        "preallocate_bytes",
        "cursor_flush_interval_ms",
        "max_batch_bytes",
    }
)


def directory_arg(directory: object) -> str:
    """Return ``directory`` as a path string; it must be a directory if it exists."""
    if not isinstance(directory, str | os.PathLike):
        raise bad_argument(
            "directory", directory, "a path (str or os.PathLike) of a data directory"
        )
    path = os.fspath(directory)
    if not isinstance(path, str) or not path or "\0" in path:
        raise bad_argument(
            "directory", directory, "a non-empty text path of a data directory (no NUL)"
        )
    if os.path.exists(path) and not os.path.isdir(path):
        raise bad_argument("directory", directory, "a directory (it is a file)")
    return path


# -------------------------------------------------------------- the coordinator


@dataclass(frozen=True)
class _AddKind:
    """One kind of addition: its wording in refusals, its names and its record."""

    want: str
    new: Callable[[TxnMeta, list[Any]], list[Any]]
    apply: Callable[[TxnMeta, list[Any]], None]
    encode: Callable[[int, int, int, list[Any]], bytes]


_PARTITIONS = _AddKind(
    "add partitions to", TxnMeta.new_partitions, TxnMeta.add_partitions, encode_txn_add_partitions
)
_SUBSCRIPTIONS = _AddKind(
    "add subscriptions to",
    TxnMeta.new_subscriptions,
    TxnMeta.add_subscriptions,
    encode_txn_add_subscriptions,
)


def _raise_if_slow(exc: BaseException, what: str, timeout_ms: int) -> None:
    """Raise a typed timeout if a record write failed by not finishing in ``timeout_ms``.

    A write the disk did not answer within the end timeout may still become
    durable; the caller's state already treats it as in doubt (a NEW one is
    aborted, an ADD one's names are kept). Other failures are re-raised as
    they are by the caller.
    """
    if isinstance(exc, TimeoutError) and not isinstance(exc, TxnStreamError):
        raise OperationTimeoutError(
            f"the transaction log did not make the {what} record durable within {timeout_ms} ms "
            "(end_timeout_ms); it may still be written",
            what="transaction log",
        ) from exc


class TransactionCoordinator:
    """One transaction coordinator: ids ``(tc_id, seq)``, its own log and store.

    Build with :meth:`open` on a data directory; the constructor takes
    ready-made parts (a log, a sequence store, a store persistence) and
    recovers from the log. With a ``registry`` its metrics are exported
    there (label ``coordinator=<metrics_label or tc_id>``) until
    :meth:`close`. Thread-safe; ``timers`` is the broker's shared timer
    service (one is made and owned when None).
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
        clock: Clock | None = None,
        timers: TimerService | None = None,
        closers: Iterable[Callable[[], None]] = (),
        registry: CollectorRegistry | None = None,
        metrics_label: str | None = None,
        **settings: Any,
    ) -> None:
        self.tc_id = tc_id_arg(tc_id)
        self.config = cfg = _config(config, settings)
        participants = _participants_arg(participants)
        self._clock = clock = clock_arg(clock)
        if timers is not None and not isinstance(timers, TimerService):
            raise bad_argument("timers", timers, "a TimerService or None")
        label = _label_arg(metrics_label, tc_id)
        if registry is not None:
            check_coordinator_label(label, registry)
        self._log = txn_log
        self._closers = list(closers)
        self._aio: AsyncCoordinator | None = None
        self._stop = threading.Event()
        self.store = TerminatedTxnStore(
            cfg.transaction_meta_persist_count,
            cfg.persist_time_ms,
            persistence=terminated,
            clock=clock,
        )
        table = self._table = TransactionTable(tc_id, sequence, cfg.sequence_reserve_block)
        counters = self._counters = CoordinatorCounters()
        self._writer = writer = DurableWriter(txn_log, table, counters)
        self._own_timers = timers is None
        if timers is None:
            timers = TimerService(clock, name=f"txnstream-tc{tc_id}-timer")
        self._timers = timers
        self._scope = timers.scope()
        self._executor = ThreadPoolExecutor(
            cfg.end_workers, thread_name_prefix=f"txnstream-tc{tc_id}-end"
        )
        self._driver = EndDriver(
            table, writer, self.store, counters, config=cfg, stop=self._stop, clock=clock
        )
        self._driver.participants = participants or NullParticipants()
        self._background = BackgroundEnds(
            table, self._driver, self._scope, self._executor, cfg.retry
        )
        if cfg.complete_in_background:
            self._driver.completions = Completions(table, self._driver, self._executor)
        self._maintenance = StoreMaintenance(
            self.store, self._scope, cfg.expire_check_interval_ms, name=f"txnstream-tc{tc_id}-maint"
        )
        self._registry: CollectorRegistry | None = None
        self._label = label
        try:
            found = recover(table, txn_log, clock)
            self.store.restore()  # before anything can end
            counters.counts["recovered"] = len(found.open) + len(found.ending)
            self._background.arm_all(found.open, found.deadlines)
            self._background.resume_all(found.ending)
            #: What recovery found (records, purged records, open and ending transactions).
            self.recovery: dict[str, Any] = found.summary
            self._maintenance.start_sweeps()
            if registry is not None:
                register_coordinator(self, label, registry)
                self._registry = registry
        except BaseException:
            self._shutdown()
            raise

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        tc_id: int = 0,
        *,
        config: CoordinatorConfig | None = None,
        participants: ParticipantResolver | None = None,
        clock: Clock | None = None,
        timers: TimerService | None = None,
        log_options: dict[str, Any] | None = None,
        registry: CollectorRegistry | None = REGISTRY,
        metrics_label: str | None = None,
        **settings: Any,
    ) -> TransactionCoordinator:
        """Open (recovering) coordinator ``tc_id`` on data directory ``directory``.

        The log is the managed ledger ``__transaction_log_<tc_id>``, the
        terminated store the compacted topic ``__terminated_txn_state_<tc_id>``,
        the sequence mark ``coordinators/<tc_id>/max_local_txn_id``. Keyword
        ``settings`` override fields of ``config``
        (:class:`~.config.CoordinatorConfig`); ``log_options`` go to
        ``ManagedLedger.open`` (e.g. ``max_entries_per_ledger``). Metrics of
        the coordinator and of its log's writer are exported to ``registry``
        (None: not exported) until :meth:`close`. Every argument is checked
        before anything is created on disk.
        """
        tc_id = tc_id_arg(tc_id)
        path = directory_arg(directory)
        cfg = _config(config, settings)
        _participants_arg(participants)
        clock = clock_arg(clock)
        if timers is not None and not isinstance(timers, TimerService):
            raise bad_argument("timers", timers, "a TimerService or None")
        options = _log_options_arg(log_options)
        if registry is not None and not isinstance(registry, CollectorRegistry):
            raise bad_argument("registry", registry, "a prometheus CollectorRegistry or None")
        label = _label_arg(metrics_label, tc_id)
        writer_label = log_name(tc_id) if metrics_label is None else f"{log_name(tc_id)}@{label}"
        if registry is not None:
            check_coordinator_label(label, registry)
            check_writer_label(writer_label, "transaction_log", registry)
        txn_log = LedgerTransactionLog.open(
            path,
            log_name(tc_id),
            batched_write=cfg.batched_write,
            registry=None,
            **options,
        )
        closers: list[Callable[[], None]] = []
        try:
            topic = open_terminated_topic(path, terminated_topic_name(tc_id))
            closers.append(topic.close)
            tc = cls(
                tc_id,
                txn_log,
                config=cfg,
                participants=participants,
                sequence=SequenceFile(path, tc_id, log_has_history=_has_history(txn_log.ml)),
                terminated=topic,
                clock=clock,
                timers=timers,
                closers=closers,
                registry=registry,
                metrics_label=label,
            )
        except BaseException:
            closers.append(txn_log.close)
            for close in reversed(closers):
                try:
                    close()
                except Exception:
                    log.exception("closing after a failed open")
            raise
        if registry is not None:
            try:
                register_writer(
                    txn_log.writer,
                    "transaction_log",
                    name=writer_label,
                    registry=registry,
                    exclusive=True,
                )
            except BaseException:
                tc.close()
                raise
            txn_log.metrics_name = writer_label
            txn_log._registry = registry
        return tc

    # ------------------------------------------------------- collaborators

    @property
    def participants(self) -> ParticipantResolver:
        """Resolver of the partitions and subscriptions ends are sent to (settable)."""
        return self._driver.participants

    @participants.setter
    def participants(self, resolver: ParticipantResolver) -> None:
        self._driver.participants = _participants_arg(resolver) or NullParticipants()

    # ---------------------------------------------------------- starting

    def new_transaction(
        self, timeout_ms: int | None = None, client_name: str | None = None
    ) -> TxnID:
        """Start a transaction; return its id once the NEW record is durable.

        ``timeout_ms`` defaults to ``config.default_timeout_ms``;
        ``client_name`` enables idempotent end (PIP-255) for it when the
        terminated store is on.
        """
        # The same steps as _start for one transaction, without lists: it is
        # the hot path of every client thread.
        timeout = self._timeout(timeout_ms)
        client = client_arg(client_name)
        table, clock = self._table, self._clock
        now, mono = clock.wall_ms(), clock.monotonic_ms()
        with table.lock:
            table.enter()
            try:
                seq = table.issue(1)
            except BaseException:
                table.leave_locked()
                raise
            meta = table.txns[seq] = TxnMeta(
                seq, timeout, now, mono + timeout, client, pending=TxnStatus.OPEN
            )
        try:
            try:
                record = encode_txn_new(table.tc_id, seq, now, timeout, client)
            except BaseException:
                self._start_failed([meta], nothing_written=True)
                raise
            try:
                pos = self._writer.write(record, self.config.end_timeout_ms)
            except BaseException as exc:
                self._start_failed([meta], nothing_written=definite(exc))
                _raise_if_slow(exc, "NEW", self.config.end_timeout_ms)
                raise
            with table.lock:
                meta.pending = None
                meta.positions.append(pos)
                self._counters.counts["created"] += 1
                if not table.closed:
                    self._background.arm(meta)
                table.leave_locked()
        except BaseException:
            table.leave()
            raise
        return TxnID._trusted(table.tc_id, seq)

    def begin(
        self, timeout_ms: int | None = None, client_name: str | None = None
    ) -> tuple[TxnID, Future[TxnPosition]]:
        """Start a transaction without waiting: its id now, its NEW record's durability later.

        For the broker's client (SPEC §4.5 commit path): the transaction is
        OPEN and its timeout armed at once; the returned future completes once
        the NEW record is durable. Its end waits for that record before the
        decision; if the record failed, the transaction can only abort
        (:class:`~txnstream.errors.TransactionWriteFailed`). Failing to queue
        the record at all raises, and then no transaction exists.
        """
        timeout = self._timeout(timeout_ms)
        client = client_arg(client_name)
        table, clock = self._table, self._clock
        now, mono = clock.wall_ms(), clock.monotonic_ms()
        with table.lock:
            table.enter()
            try:
                seq = table.issue(1)
            except BaseException:
                table.leave_locked()
                raise
            meta = table.txns[seq] = TxnMeta(seq, timeout, now, mono + timeout, client)
            meta.adds = 1
        try:
            fut = self._log.write(encode_txn_new(table.tc_id, seq, now, timeout, client))
        except BaseException:
            with table.lock:
                table.txns.pop(seq, None)  # nothing was queued and nobody has the id
                table.leave_locked()
            raise
        with table.lock:
            self._counters.counts["created"] += 1
            if not table.closed:
                self._background.arm(meta)
        fut.add_done_callback(functools.partial(self._deferred_done, meta))
        table.leave()
        return TxnID._trusted(table.tc_id, seq), fut

    def add_partition_nowait(self, txn_id: TxnID, partition: str) -> Future[TxnPosition] | None:
        """Add one produced partition without waiting for its ADD record.

        Returns None when the transaction already has it, else the record's
        durability future. The name is taken at once (so an end reaches the
        partition whatever happens to the record); the end waits for the
        record before deciding, and a failed record lets the transaction
        only abort. Refusals (not OPEN, unknown, timed out) raise at once.
        """
        seq = self._table.seq_of(txn_id)
        return self._add_nowait(txn_id, seq, partition_names([partition]), _PARTITIONS)

    def add_subscription_nowait(
        self, txn_id: TxnID, topic: str, subscription: str
    ) -> Future[TxnPosition] | None:
        """:meth:`add_partition_nowait` for one acked ``(topic, subscription)``."""
        seq = self._table.seq_of(txn_id)
        pairs = subscription_pairs([(topic, subscription)])
        return self._add_nowait(txn_id, seq, pairs, _SUBSCRIPTIONS)

    def _add_nowait(
        self, txn_id: TxnID, seq: int, values: list[Any], kind: _AddKind
    ) -> Future[TxnPosition] | None:
        table = self._table
        now = self._clock.wall_ms()
        with table.lock:
            table.enter()
            try:
                meta = self._addable(txn_id, seq, kind.want)
                if meta.failed is not None:
                    raise write_failed(txn_id, meta.failed)
                new = kind.new(meta, values)
                if not new:
                    table.leave_locked()
                    return None
                kind.apply(meta, new)
                meta.adds += 1
            except BaseException:
                table.leave_locked()
                raise
        try:
            fut = self._log.write(kind.encode(table.tc_id, seq, now, new))
        except BaseException as exc:
            with table.lock:
                meta.adds -= 1
                if meta.failed is None:
                    meta.failed = exc
                table.notify(meta)
                table.leave_locked()
            raise
        with table.lock:
            meta.last_modified = now
        fut.add_done_callback(functools.partial(self._deferred_done, meta))
        table.leave()
        return fut

    def _deferred_done(self, meta: TxnMeta, fut: Future[TxnPosition]) -> None:
        # A no-wait record finished: keep its position (deleted with the
        # transaction's others), or remember that it failed.
        exc = fut.exception()
        table = self._table
        with table.lock:
            meta.adds -= 1
            if exc is None:
                meta.positions.append(fut.result())
            else:
                self._counters.counts["append_errors"] += 1
                if meta.failed is None:
                    meta.failed = exc
            if meta.done is not None:
                table.notify(meta)

    def new_transactions(
        self, count: int, timeout_ms: int | None = None, client_name: str | None = None
    ) -> list[TxnID]:
        """Start ``count`` transactions with one log write; their ids once all are durable."""
        return self._start(count_arg(count), timeout_ms, client_name)

    def _timeout(self, timeout_ms: object) -> int:
        cfg = self.config
        return timeout_arg(
            cfg.default_timeout_ms if timeout_ms is None else timeout_ms, cfg.max_timeout_ms
        )

    def _start(self, count: int, timeout_ms: object, client_name: object) -> list[TxnID]:
        # Issue ids and insert invisible metas (under the lock), write the
        # NEW records, then make them visible and arm their timeouts.
        timeout = self._timeout(timeout_ms)
        client = client_arg(client_name)
        if count == 0:
            return []
        table, clock = self._table, self._clock
        now, mono = clock.wall_ms(), clock.monotonic_ms()
        with table.lock:
            table.enter()
            try:
                first = table.issue(count)
            except BaseException:
                table.leave_locked()
                raise
            seqs = range(first, first + count)
            metas = [
                TxnMeta(seq, timeout, now, mono + timeout, client, pending=TxnStatus.OPEN)
                for seq in seqs
            ]
            table.txns.update(zip(seqs, metas, strict=True))
        try:
            tc = table.tc_id
            try:
                records = [encode_txn_new(tc, seq, now, timeout, client) for seq in seqs]
            except BaseException:
                self._start_failed(metas, nothing_written=True)
                raise
            bound = self.config.end_timeout_ms
            try:
                if count == 1:
                    positions = [self._writer.write(records[0], bound)]
                else:
                    positions = self._writer.write_many(records, bound)
            except BaseException as exc:
                self._start_failed(metas, nothing_written=definite(exc))
                _raise_if_slow(exc, "NEW", bound)
                raise
            with table.lock:
                for meta, pos in zip(metas, positions, strict=True):
                    meta.pending = None
                    meta.positions.append(pos)
                self._counters.counts["created"] += count
                if not table.closed:
                    self._background.arm_all(metas)
                table.leave_locked()
        except BaseException:
            table.leave()
            raise
        return [table.tid(seq) for seq in seqs]

    def _start_failed(self, metas: list[TxnMeta], *, nothing_written: bool) -> None:
        # NEW not written: as if never started. In doubt (an interrupt while in
        # flight): it may exist, and nobody has its id, so it is aborted now.
        table = self._table
        with table.lock:
            for meta in metas:
                if nothing_written:
                    table.txns.pop(meta.seq, None)
                else:
                    meta.pending = None
                    self._abort_now(meta)

    def _abandoned(self, txn_ids: Iterable[TxnID]) -> None:
        """Abort, in the background, started transactions nobody got the id of.

        E.g. an asyncio ``new_transaction`` whose await was cancelled while
        its NEW record was written: as :meth:`_start_failed` does for an
        interrupted start. One already being ended (an admin found it) is
        left to that end.
        """
        table = self._table
        with table.lock:
            for txn_id in txn_ids:
                meta = table.txns.get(table.seq_of(txn_id))
                if meta is not None and meta.pending is None and meta.status is TxnStatus.OPEN:
                    self._abort_now(meta)

    def _abort_now(self, meta: TxnMeta) -> None:
        # Under the lock: its timeout is due now (the background aborts it).
        meta.deadline = self._clock.monotonic_ms()
        if not self._table.closed:
            self._background.arm(meta)

    # ------------------------------------------------------------ adding

    def add_produced_partitions(self, txn_id: TxnID, partitions: Iterable[str]) -> None:
        """Record (durably) that the transaction produced to ``partitions``.

        Partitions it already has write nothing. If the write fails nothing
        changes, so the client's retry writes the record.
        """
        seq = self._table.seq_of(txn_id)
        self._add_one(txn_id, seq, partition_names(partitions), _PARTITIONS)

    def add_acked_subscriptions(
        self, txn_id: TxnID, subscriptions: Iterable[tuple[str, str] | Subscription]
    ) -> None:
        """Record (durably) that the transaction acked on ``(topic, subscription)`` pairs."""
        seq = self._table.seq_of(txn_id)
        self._add_one(txn_id, seq, subscription_pairs(subscriptions), _SUBSCRIPTIONS)

    def add_produced_partitions_many(
        self, items: Iterable[tuple[TxnID, Iterable[str]]]
    ) -> list[TransactionError | None]:
        """:meth:`add_produced_partitions` for many transactions, one log write.

        Returns, per item, None or the refusal (e.g. ``TransactionNotFound``);
        bad arguments and a failed log write raise (nothing changed then).
        """
        checked = [(txn, partition_names(parts)) for txn, parts in items_arg(items)]
        return self._add_many(checked, _PARTITIONS)

    def add_acked_subscriptions_many(
        self, items: Iterable[tuple[TxnID, Iterable[tuple[str, str] | Subscription]]]
    ) -> list[TransactionError | None]:
        """:meth:`add_acked_subscriptions` for many transactions, one log write."""
        checked = [(txn, subscription_pairs(subs)) for txn, subs in items_arg(items)]
        return self._add_many(checked, _SUBSCRIPTIONS)

    def _addable(self, txn_id: TxnID, seq: int, want: str) -> TxnMeta:
        # Under the lock: the live OPEN transaction ``seq``, or its refusal.
        meta = self._table.txns.get(seq)
        if meta is None or not meta.visible:
            rec = self.store.lookup(txn_id)
            if rec is not None:
                raise InvalidTxnStatusError(
                    f"cannot {want} transaction {txn_id}: it already ended {rec.status.name}",
                    txn_id=txn_id,
                    current=rec.status,
                    requested=TxnStatus.OPEN,
                )
            raise TransactionNotFound(f"transaction {txn_id} not found", txn_id=txn_id)
        if meta.status is TxnStatus.OPEN and meta.pending is None:
            return meta
        if meta.timed_out or meta.pending_timed_out:
            raise TransactionTimedOut(
                f"cannot {want} transaction {txn_id}: it timed out and is being aborted",
                txn_id=txn_id,
                status=meta.status,
            )
        doing = meta.status.name if meta.pending is None else f"becoming {meta.pending.name}"
        raise InvalidTxnStatusError(
            f"cannot {want} transaction {txn_id}: it is {doing}, not OPEN",
            txn_id=txn_id,
            current=meta.status,
            requested=TxnStatus.OPEN,
        )

    def _add_one(self, txn_id: TxnID, seq: int, values: list[Any], kind: _AddKind) -> None:
        table, clock = self._table, self._clock
        now = clock.wall_ms()
        with table.lock:
            table.enter()
            try:
                meta = self._addable(txn_id, seq, kind.want)
                new = kind.new(meta, values)
                if not new:
                    table.leave_locked()
                    return
                meta.adds += 1
            except BaseException:
                table.leave_locked()
                raise
        try:
            try:
                record = kind.encode(table.tc_id, seq, now, new)
            except BaseException:
                self._add_failed([meta], [new], kind, nothing_written=True)
                raise
            try:
                pos = self._writer.write(record, self.config.end_timeout_ms)
            except BaseException as exc:
                self._add_failed([meta], [new], kind, nothing_written=definite(exc))
                _raise_if_slow(exc, "ADD", self.config.end_timeout_ms)
                raise
            with table.lock:
                kind.apply(meta, new)
                meta.positions.append(pos)
                meta.last_modified = now
                meta.adds -= 1
                if meta.done is not None:  # an end waits for this ADD
                    table.notify(meta)
                table.leave_locked()
        except BaseException:
            table.leave()
            raise

    def _add_failed(
        self, metas: list[TxnMeta], news: list[list[Any]], kind: _AddKind, *, nothing_written: bool
    ) -> None:
        # A definite failure changes nothing. An unknown outcome: the record
        # may be durable, so the names are added (ending a participant that
        # holds nothing of the transaction is a no-op; missing one is not).
        with self._table.lock:
            for meta, new in zip(metas, news, strict=True):
                if not nothing_written:
                    kind.apply(meta, new)
                meta.adds -= 1
                self._table.notify(meta)

    def _add_many(
        self, items: list[tuple[TxnID, list[Any]]], kind: _AddKind
    ) -> list[TransactionError | None]:
        table, clock = self._table, self._clock
        seqs = [table.seq_of(txn) for txn, _ in items]
        results: list[TransactionError | None] = [None] * len(items)
        now = clock.wall_ms()
        metas: list[TxnMeta] = []
        news: list[list[Any]] = []
        taken: dict[int, set[Any]] = {}  # per transaction: names already in this call
        with table.lock:
            table.enter()
            for i, ((txn, values), seq) in enumerate(zip(items, seqs, strict=True)):
                try:
                    meta = self._addable(txn, seq, kind.want)
                except TransactionError as exc:
                    results[i] = exc
                    continue
                seen = taken.setdefault(seq, set())
                new = [v for v in kind.new(meta, values) if v not in seen]
                if new:
                    seen.update(new)
                    meta.adds += 1
                    metas.append(meta)
                    news.append(new)
        try:
            if metas:
                tc = table.tc_id
                try:
                    records = [
                        kind.encode(tc, m.seq, now, new) for m, new in zip(metas, news, strict=True)
                    ]
                except BaseException:
                    self._add_failed(metas, news, kind, nothing_written=True)
                    raise
                try:
                    positions = self._writer.write_many(records, self.config.end_timeout_ms)
                except BaseException as exc:
                    self._add_failed(metas, news, kind, nothing_written=definite(exc))
                    _raise_if_slow(exc, "ADD", self.config.end_timeout_ms)
                    raise
                with table.lock:
                    for meta, new, pos in zip(metas, news, positions, strict=True):
                        kind.apply(meta, new)
                        meta.positions.append(pos)
                        meta.last_modified = now
                        meta.adds -= 1
                        table.notify(meta)
        finally:
            table.leave()
        return results

    # ------------------------------------------------------------- ending

    def end_transaction(
        self, txn_id: TxnID, action: TxnAction | str, *, trace: EndTrace | None = None
    ) -> TxnStatus:
        """Commit or abort; return the final status once the outcome is durable.

        ``action`` is a :class:`TxnAction` or ``"commit"``/``"abort"``.
        Idempotent (SPEC §4.4): repeating the same end returns the same
        outcome, also after a restart when the terminated store is on; the
        opposite request raises :class:`TransactionAlreadyCommitted` /
        :class:`TransactionAlreadyAborted` at once (``timed_out=True`` when
        the timeout won); unknown everywhere raises
        :class:`TransactionNotFound`. If participants cannot be ended within
        ``end_timeout_ms`` it raises :class:`TransactionEndPending` /
        :class:`ParticipantsFailed` naming the decided ``outcome``; the end is
        completed in the background. If the decision cannot be logged, the
        log's error is raised and the transaction stays OPEN.

        With ``config.complete_in_background`` the call returns once every
        participant ended (the outcome is durable and visible); the final
        record and cleanup follow on a background thread. ``trace``, if
        given, counts the sequential durable waits this call made.
        """
        act = TxnAction.parse(action)
        seq = self._table.seq_of(txn_id)
        return self._end(txn_id, seq, act, force=False, trace=trace_arg(trace))

    def commit(self, txn_id: TxnID) -> TxnStatus:
        """Shorthand for ``end_transaction(txn_id, TxnAction.COMMIT)``."""
        return self.end_transaction(txn_id, TxnAction.COMMIT)

    def abort(self, txn_id: TxnID) -> TxnStatus:
        """Shorthand for ``end_transaction(txn_id, TxnAction.ABORT)``."""
        return self.end_transaction(txn_id, TxnAction.ABORT)

    def force_abort(self, txn_id: TxnID) -> TxnStatus:
        """Admin: end a transaction whatever state it is in; return its final status.

        An OPEN transaction is aborted. One whose end is already decided
        (COMMITTING/ABORTING, e.g. stuck on a participant) is finished now
        as decided, without waiting for its background retry: a decided
        commit may already be applied somewhere, so it is never turned into
        an abort (``ParticipantsFailed`` names the outcome if participants
        still fail). One that already ended reports its outcome (if the
        store remembers it). Unlike :meth:`abort` it never answers
        ``TransactionAlreadyCommitted``.
        """
        seq = self._table.seq_of(txn_id)
        return self._end(txn_id, seq, TxnAction.ABORT, force=True)

    def _end(
        self,
        txn_id: TxnID,
        seq: int,
        act: TxnAction,
        *,
        force: bool,
        trace: EndTrace | None = None,
    ) -> TxnStatus:
        table = self._table
        with table.lock:
            table.enter()
        try:
            status = self._driver.end(seq, act, force=force, trace=trace)
        finally:
            table.leave()
        if status is not None:
            return status
        rec = self.store.lookup(txn_id)
        if rec is None:
            raise TransactionNotFound(
                f"transaction {txn_id} not found (unknown, or ended and not remembered)",
                txn_id=txn_id,
            )
        if force:
            return rec.status
        return end_answer(txn_id, act, rec.status, rec.timed_out)

    def end_transactions(
        self,
        items: Iterable[tuple[TxnID, TxnAction | str]],
        *,
        traces: list[EndTrace | None] | None = None,
    ) -> list[TxnStatus | TxnStreamError]:
        """:meth:`end_transaction` for many transactions.

        The ending UPDATEs are written together, participants are ended per
        transaction, then the final UPDATEs are written together; a
        transaction another thread is ending is waited for. Returns, per
        item, the final status or that end's error (a refusal such as
        ``TransactionAlreadyAborted`` or ``TransactionNotFound``, or the log
        write failure of a transaction ended on its own); bad arguments and
        a failure of the batch's own writes raise. ``traces`` (one per item,
        or None) count each end's durable waits.
        """
        table = self._table
        reqs = [(txn, table.seq_of(txn), TxnAction.parse(act)) for txn, act in items_arg(items)]
        if traces is not None and (not isinstance(traces, list) or len(traces) != len(reqs)):
            raise bad_argument(
                "traces", traces, f"a list of one trace (or None) per item ({len(reqs)})"
            )
        for i, t in enumerate(traces or ()):
            trace_arg(t, f"traces[{i}]")
        with table.lock:
            table.enter()
        try:
            got = self._driver.end_many(reqs, traces)
        finally:
            table.leave()
        out: list[TxnStatus | TxnStreamError] = []
        for (txn, _, act), result in zip(reqs, got, strict=True):
            if result is None:
                rec = self.store.lookup(txn)
                try:
                    if rec is None:
                        raise TransactionNotFound(
                            f"transaction {txn} not found (unknown, or ended and not remembered)",
                            txn_id=txn,
                        )
                    result = end_answer(txn, act, rec.status, rec.timed_out)
                except TransactionError as exc:
                    result = exc
            out.append(result)
        return out

    # ------------------------------------------------------------ queries

    def get_transaction(self, txn_id: TxnID) -> TransactionInfo:
        """Return a snapshot of the transaction (live, or remembered by the store)."""
        table = self._table
        seq = table.seq_of(txn_id)
        with table.lock:
            meta = table.txns.get(seq)
            if meta is not None and meta.visible:
                return meta.info(table.tc_id, table.span_records(meta))
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

    def participant_outcome(self, txn_id: TxnID) -> bool | None:
        """How a participant holding ``txn_id``'s data must end it (recovery reconciliation).

        True: commit (the commit is decided, or the store remembers it
        committed); False: abort (decided or remembered aborted, or unknown
        -- an id nobody will end); None: leave it, the transaction is still
        open (or its decision in flight) and its end will reach the
        participant. A transaction leaves memory only after every
        participant it named ended it, so "unknown" never hides a commit a
        participant still needs.
        """
        seq = self._table.seq_of(txn_id)
        with self._table.lock:
            meta = self._table.txns.get(seq)
            if meta is not None:
                decision = meta.decision
                if decision is None or meta.in_doubt:
                    return None  # in doubt: its record may be lost; logged again, then ended
                return decision is TxnStatus.COMMITTING
        rec = self.store.lookup(txn_id)
        if rec is not None:
            return rec.status is TxnStatus.COMMITTED
        return False

    def list_transactions(self, status: TxnStatus | int | None = None) -> list[TransactionInfo]:
        """Snapshots of every live transaction (optionally only those in ``status``), by id."""
        want = None if status is None else TxnStatus.parse(status)
        table = self._table
        with table.lock:
            return [
                m.info(table.tc_id, table.span_records(m))
                for m in table.txns.values()
                if m.visible and (want is None or m.status is want)
            ]

    def slow_transactions(self, min_age_ms: int) -> list[TransactionInfo]:
        """Live transactions started at least ``min_age_ms`` ago (oldest first)."""
        if not is_int(min_age_ms) or not 0 <= min_age_ms <= 1 << 62:
            raise bad_argument("min_age_ms", min_age_ms, f"an integer in 0..{1 << 62}")
        table = self._table
        cutoff = self._clock.wall_ms() - min_age_ms
        with table.lock:
            slow = [
                m.info(table.tc_id, table.span_records(m))
                for m in table.txns.values()
                if m.visible and m.start_time <= cutoff
            ]
        slow.sort(key=lambda i: (i.start_time, i.txn_id))
        return slow

    def low_water_mark(self) -> int:
        """Every transaction with ``least_bits <= LWM`` has ended (-1: none yet)."""
        return self._table.low_water_mark()

    def _counts(self) -> tuple[dict[str, Any], int, int]:
        # Under the lock: a copy of the counters, live and ending transactions.
        live = ending = 0
        for m in self._table.txns.values():
            if m.visible:
                live += 1
                ending += m.status.is_ending
        return dict(self._counters.counts), live, ending

    def stats(self) -> dict[str, Any]:
        """Counters: open/ending/committed/aborted/timed-out, LWM, log and store."""
        table = self._table
        with table.lock:
            out, live, ending = self._counts()
            out.update(
                tc_id=table.tc_id,
                live=live,
                open=live - ending,
                ending=ending,
                next_seq=table.next_seq,
            )
        out["timers"] = self._scope.live_count()
        out["low_water_mark"] = table.low_water_mark()
        out["terminated_remembered"] = len(self.store)
        out["log"] = self._log.stats()
        return out

    def metrics(self) -> dict[str, Any]:
        """Scrape-time snapshot for :class:`txnstream.metrics.CoordinatorCollector`."""
        now = self._clock.monotonic_ms()
        with self._table.lock:
            out, live, ending = self._counts()
            out["active"] = live
            out["open"] = live - ending
            out["late"] = self._late_locked(now)
            out["end_latency_ms"] = self._counters.histogram()
        return out

    def _late_locked(self, now: int) -> int:
        # Under the lock: live transactions past their deadline.
        return sum(1 for m in self._table.txns.values() if m.visible and m.deadline <= now)

    def late_transactions(self) -> list[TransactionInfo]:
        """Live transactions past their timeout: not aborted yet, or stuck ending (oldest first)."""
        table = self._table
        now = self._clock.monotonic_ms()
        with table.lock:
            late = [
                m.info(table.tc_id, table.span_records(m))
                for m in table.txns.values()
                if m.visible and m.deadline <= now
            ]
        late.sort(key=lambda i: (i.start_time, i.txn_id))
        return late

    # -------------------------------------------------------------- admin

    def aio(self) -> AsyncCoordinator:
        """Return the asyncio front end (:class:`~.aio.AsyncCoordinator`), made once."""
        with self._table.lock:
            self._table.check_open()
            if self._aio is None:
                from txnstream.coordinator.aio import AsyncCoordinator

                self._aio = AsyncCoordinator(self)
            return self._aio

    def set_batch_enabled(self, enabled: bool) -> None:
        """Switch batched writes of the transaction log on or off at runtime."""
        if not isinstance(enabled, bool):
            raise bad_argument("enabled", enabled, "a bool")
        self._log.set_batch_enabled(enabled)

    def sweep_terminated(self) -> int:
        """Expire old terminated-transaction entries now; return how many went."""
        return self.store.sweep()

    # -------------------------------------------------------------- close

    def _shutdown(self) -> None:
        self._stop.set()
        self._scope.close()
        if self._own_timers:
            self._timers.close()
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._maintenance.shutdown()

    def close(self) -> None:
        """Stop intake, drain the calls in flight, then stop threads and close the logs.

        New calls fail with :class:`CoordinatorNotFound` at once. Ends in
        flight finish (participant retries stop; a decided end that cannot
        finish now is completed by the next open); the log is closed only
        after them. Transactions still live stay in the log and are
        recovered by the next open.
        """
        with self._table.lock:
            if self._table.closed:
                return
            self._table.closed = True
        self._stop.set()
        if self._aio is not None:
            self._aio.close()  # queued async calls are answered (or fail) first
        if not self._table.drain(self.config.end_timeout_ms / 1000.0 + 5.0):
            log.warning("coordinator %d: calls still in flight at close", self.tc_id)
        self._shutdown()
        if self._registry is not None:
            unregister_coordinator(self._label, self, self._registry)
        try:
            self._log.close()
        finally:
            for close in reversed(self._closers):
                try:
                    close()
                except Exception:
                    log.exception("closing coordinator %d", self.tc_id)

    def __enter__(self) -> TransactionCoordinator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _config(config: object, settings: dict[str, Any]) -> CoordinatorConfig:
    if config is not None and not isinstance(config, CoordinatorConfig):
        raise bad_argument("config", config, "a CoordinatorConfig or None")
    cfg = config or CoordinatorConfig()
    return cfg.replace(**settings) if settings else cfg


def _participants_arg(participants: object) -> ParticipantResolver | None:
    if participants is not None and not isinstance(participants, ParticipantResolver):
        raise bad_argument(
            "participants", participants, "a resolver with partition() and subscription()"
        )
    return participants


def _label_arg(label: object, tc_id: int) -> str:
    if label is None:
        return str(tc_id)
    if not is_text(label):
        raise bad_argument("metrics_label", label, "a non-empty string or None")
    return label  # type: ignore[return-value]


def _log_options_arg(options: object) -> dict[str, Any]:
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise bad_argument("log_options", options, "a dict of ManagedLedger.open options or None")
    unknown = sorted(set(options) - LOG_OPTIONS)
    if unknown:
        raise bad_argument("log_options", unknown, f"keys among {sorted(LOG_OPTIONS)}")
    for key, value in options.items():
        if value is not None and (not is_int(value) or not 0 <= value < 1 << 63):
            raise bad_argument(key, value, "an integer in 0..2**63-1")
    return dict(options)


# ----------------------------------------------------------- several of them


class TransactionCoordinators:
    """The coordinators of one broker, sharing one timer service, routing calls by TxnID.

    A client picks a coordinator per transaction (round robin, as Pulsar's
    client does); every later call is routed by the TxnID's ``most_bits``.
    """

    def __init__(
        self,
        coordinators: Iterable[TransactionCoordinator],
        *,
        closers: Iterable[Callable[[], None]] = (),
    ) -> None:
        self._by_id = {tc.tc_id: tc for tc in coordinators}
        if not self._by_id:
            raise InvalidArgumentError("at least one coordinator is required", argument="count")
        self._ids = sorted(self._by_id)
        self._next = 0
        self._lock = threading.Lock()
        self._closers = list(closers)

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        count: int = 1,
        *,
        config: CoordinatorConfig | None = None,
        participants: ParticipantResolver | None = None,
        clock: Clock | None = None,
        **settings: Any,
    ) -> TransactionCoordinators:
        """Open (recovering) coordinators ``0..count-1`` on ``directory``, one timer for all."""
        if not is_int(count) or not 1 <= count <= 1024:
            raise bad_argument("count", count, "an integer in 1..1024 (the number of coordinators)")
        directory_arg(directory)
        clock = clock_arg(clock)
        timers = TimerService(clock, name="txnstream-coordinators-timer")
        opened: list[TransactionCoordinator] = []
        try:
            for tc_id in range(count):
                opened.append(
                    TransactionCoordinator.open(
                        directory,
                        tc_id,
                        config=config,
                        participants=participants,
                        clock=clock,
                        timers=timers,
                        **settings,
                    )
                )
        except BaseException:
            for tc in opened:
                tc.close()
            timers.close()
            raise
        return cls(opened, closers=[timers.close])

    def __len__(self) -> int:
        """Return the number of coordinators."""
        return len(self._ids)

    def get(self, tc_id: int) -> TransactionCoordinator:
        """Return coordinator ``tc_id``; :class:`CoordinatorNotFound` if not served."""
        if not is_int(tc_id):
            raise bad_argument("tc_id", tc_id, "a coordinator id (int)")
        tc = self._by_id.get(tc_id)
        if tc is None:
            raise CoordinatorNotFound(
                f"transaction coordinator {tc_id} is not served here (have {self._ids})",
                tc_id=tc_id,
            )
        return tc

    def of(self, txn_id: TxnID) -> TransactionCoordinator:
        """Return the coordinator that owns ``txn_id``."""
        return self.get(txn_id_arg(txn_id).most_bits)

    def new_transaction(
        self, timeout_ms: int | None = None, client_name: str | None = None
    ) -> TxnID:
        """Start a transaction on the next coordinator (round robin)."""
        with self._lock:
            tc_id = self._ids[self._next % len(self._ids)]
            self._next += 1
        return self._by_id[tc_id].new_transaction(timeout_ms, client_name)

    def add_produced_partitions(self, txn_id: TxnID, partitions: Iterable[str]) -> None:
        """Route to the owner's ``add_produced_partitions``."""
        self.of(txn_id).add_produced_partitions(txn_id, partitions)

    def add_acked_subscriptions(
        self, txn_id: TxnID, subscriptions: Iterable[tuple[str, str]]
    ) -> None:
        """Route to the owner's ``add_acked_subscriptions``."""
        self.of(txn_id).add_acked_subscriptions(txn_id, subscriptions)

    def end_transaction(self, txn_id: TxnID, action: TxnAction | str) -> TxnStatus:
        """Route to the owner's ``end_transaction``."""
        return self.of(txn_id).end_transaction(txn_id, action)

    def force_abort(self, txn_id: TxnID) -> TxnStatus:
        """Route to the owner's ``force_abort``."""
        return self.of(txn_id).force_abort(txn_id)

    def get_transaction(self, txn_id: TxnID) -> TransactionInfo:
        """Route to the owner's ``get_transaction``."""
        return self.of(txn_id).get_transaction(txn_id)

    def participant_outcome(self, txn_id: TxnID) -> bool | None:
        """Route to the owner's ``participant_outcome``."""
        return self.of(txn_id).participant_outcome(txn_id)

    def coordinators(self) -> list[TransactionCoordinator]:
        """Return the coordinators, by id."""
        return [self._by_id[i] for i in self._ids]

    def next_coordinator(self) -> TransactionCoordinator:
        """Return the coordinator for a new transaction (round robin)."""
        with self._lock:
            tc_id = self._ids[self._next % len(self._ids)]
            self._next += 1
        return self._by_id[tc_id]

    def low_water_marks(self) -> dict[int, int]:
        """Return the LWM of every coordinator."""
        return {i: self._by_id[i].low_water_mark() for i in self._ids}

    def stats(self) -> list[dict[str, Any]]:
        """Return every coordinator's stats."""
        return [self._by_id[i].stats() for i in self._ids]

    def close(self) -> None:
        """Close every coordinator, then the shared timer service."""
        for i in self._ids:
            self._by_id[i].close()
        for close in self._closers:
            close()

    def __enter__(self) -> TransactionCoordinators:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _has_history(ml: ManagedLedger) -> bool:
    # Written before: entries now, or ledgers rolled over or trimmed since
    # the first (a log opened for the first time has one empty ledger, or
    # none).
    ledgers = ml.ledgers()
    return len(ledgers) > 1 or any(lid > 1 or n > 0 for lid, n, _ in ledgers)


__all__ = [
    "TransactionCoordinator",
    "TransactionCoordinators",
    "directory_arg",
    "log_name",
    "terminated_topic_name",
]
