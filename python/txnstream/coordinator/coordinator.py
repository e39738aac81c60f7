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

:class:`TransactionCoordinator` is a facade: it holds no transaction state
and no state-machine logic (only argument conversion before delegating); it
wires these parts, each a small class with explicit collaborators sharing
the table's lock, and keeps the public API in one place:

- :mod:`.table` -- the lock, live transactions, sequence reservation, LWM;
- :mod:`.durable` -- durable writes and where the positions go;
- :mod:`.starting` / :mod:`.adding` -- new transactions, added partitions and
  subscriptions (one or many per call);
- :mod:`.ending` -- the five steps of an end (see there), one or many;
- :mod:`.end_requests` -- clients' commit/abort requests and their answers
  (:mod:`.answers`);
- :mod:`.background` -- timeouts, resumes after recovery, bounded retries;
- :mod:`.rebuild` -- the table rebuilt from the Rust fold at open;
- :mod:`.queries` / :mod:`.counters` -- snapshots, stats and metrics;
- :mod:`.maintenance` -- sweep and compaction of the PIP-255 store.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from prometheus_client.registry import REGISTRY, CollectorRegistry

from txnstream.coordinator.adding import PARTITIONS, SUBSCRIPTIONS, ParticipantAdder
from txnstream.coordinator.arguments import partition_names, subscription_pairs
from txnstream.coordinator.background import BackgroundEnds
from txnstream.coordinator.config import CoordinatorConfig
from txnstream.coordinator.counters import CoordinatorCounters
from txnstream.coordinator.durable import DurableWriter
from txnstream.coordinator.end_requests import EndRequests
from txnstream.coordinator.ending import STEPS, EndDriver, StepHook
from txnstream.coordinator.log import TransactionLog
from txnstream.coordinator.maintenance import StoreMaintenance
from txnstream.coordinator.metadata import TransactionInfo, TxnMeta
from txnstream.coordinator.participants import NullParticipants, ParticipantResolver
from txnstream.coordinator.queries import TransactionQueries
from txnstream.coordinator.rebuild import rebuild
from txnstream.coordinator.recovery import PositionTable
from txnstream.coordinator.sequence import SequenceFile, SequenceStore
from txnstream.coordinator.starting import TxnStarter
from txnstream.coordinator.status import TxnAction, TxnStatus
from txnstream.coordinator.table import TransactionTable
from txnstream.coordinator.terminated import TerminatedPersistence, TerminatedTxnStore
from txnstream.coordinator.timeouts import Clock, TimerService, wall_clock_ms
from txnstream.coordinator.txn_id import TxnID
from txnstream.errors import InvalidArgumentError, TransactionError
from txnstream.metrics import register_coordinator, unregister_coordinator
from txnstream.proto import Subscription

if TYPE_CHECKING:
    from txnstream.coordinator.aio import AsyncCoordinator

log = logging.getLogger(__name__)


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
        self.config = cfg = config or CoordinatorConfig()
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
        writer = DurableWriter(txn_log, table, counters)
        self._timers = TimerService(clock, name=f"txnstream-tc{tc_id}-timer")
        self._executor = ThreadPoolExecutor(
            cfg.end_workers, thread_name_prefix=f"txnstream-tc{tc_id}-end"
        )
        # Background ends (timeouts, recovery resumes, retries) make at most
        # this many attempts per run, then reschedule through the timer, so a
        # participant that never answers cannot occupy the pool.
        attempts = cfg.background_end_attempts
        if cfg.retry.max_attempts is not None:
            attempts = min(attempts, cfg.retry.max_attempts)
        background = self._background = BackgroundEnds(
            table,
            self._timers,
            self._executor,
            clock,
            dataclasses.replace(cfg.retry, max_attempts=attempts),
        )
        driver = self._driver = EndDriver(
            table,
            writer,
            self.store,
            counters,
            background,
            retry=cfg.retry,
            stop=self._stop,
            clock=clock,
        )
        background.bind(driver)
        driver.participants = participants or NullParticipants()
        self._starter = TxnStarter(table, writer, background, counters, cfg, clock)
        self._adder = ParticipantAdder(table, writer, self.store, clock)
        self._ends = EndRequests(table, driver, self.store)
        self._queries = TransactionQueries(
            table, self.store, counters, self._timers, txn_log, clock
        )
        # The sweep and compactions of the terminated store never queue
        # behind ends.
        self._maintenance = StoreMaintenance(
            self.store,
            table,
            self._timers,
            clock,
            cfg.expire_check_interval_ms,
            name=f"txnstream-tc{tc_id}-maint",
        )
        try:
            self.recovery = rebuild(table, txn_log, self.store, background, counters, clock)
        except BaseException:
            self._shutdown_threads()
            raise
        self._maintenance.start_sweeps()
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

    # ------------------------------------------------------- collaborators

    @property
    def participants(self) -> ParticipantResolver:
        """Resolver of the partitions and subscriptions ends are sent to (settable)."""
        return self._driver.participants

    @participants.setter
    def participants(self, resolver: ParticipantResolver) -> None:
        self._driver.participants = resolver

    @property
    def step_hook(self) -> StepHook | None:
        """Called with each named step of an end (:data:`STEPS`); for crash tests."""
        return self._driver.step_hook

    @step_hook.setter
    def step_hook(self, hook: StepHook | None) -> None:
        self._driver.step_hook = hook

    # Internals some tests observe directly (kept stable for them).

    @property
    def _txns(self) -> dict[int, TxnMeta]:
        return self._table.txns

    @property
    def _recovered(self) -> PositionTable | None:
        return self._table.recovered

    def _seq_of(self, txn_id: TxnID) -> int:
        return self._table.seq_of(txn_id)

    def _on_timeout(self, seq: int) -> None:
        self._background.on_timeout(seq)

    # ------------------------------------------------------------ public API

    def new_transaction(
        self, timeout_ms: int | None = None, client_name: str | None = None
    ) -> TxnID:
        """Start a transaction; return its id once the NEW record is durable.

        ``client_name`` enables idempotent end (PIP-255) for it when the
        terminated store is on.
        """
        return self._starter.start_one(timeout_ms, client_name)

    def add_produced_partitions(self, txn_id: TxnID, partitions: Iterable[str]) -> None:
        """Record that the transaction produced to ``partitions`` (durably)."""
        seq = self._table.seq_of(txn_id)
        self._adder.add_one(txn_id, seq, partition_names(partitions), PARTITIONS)

    def add_acked_subscriptions(
        self, txn_id: TxnID, subscriptions: Iterable[tuple[str, str] | Subscription]
    ) -> None:
        """Record that the transaction acked on ``(topic, subscription)`` pairs."""
        seq = self._table.seq_of(txn_id)
        self._adder.add_one(txn_id, seq, subscription_pairs(subscriptions), SUBSCRIPTIONS)

    def end_transaction(self, txn_id: TxnID, action: TxnAction | str) -> TxnStatus:
        """Commit or abort; return the final status once it is durable.

        Idempotent (SPEC §4.4): repeating the same end returns the same
        outcome, also after a restart when the terminated store is on; the
        opposite request raises :class:`TransactionAlreadyCommitted` /
        :class:`TransactionAlreadyAborted` (``timed_out=True`` when the
        timeout won); unknown everywhere raises :class:`TransactionNotFound`.
        """
        return self._ends.end_one(txn_id, action)

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
        return self._ends.abort_stuck(txn_id)

    # ------------------------------------------------------------ bulk API
    #
    # The same state machine for many transactions per call: one batched
    # write (and one wait, GIL released) per step instead of one per
    # transaction, so a Python caller is not bound by thread handoffs.
    # Per-transaction refusals come back in the result list as exception
    # objects (as ``asyncio.gather(return_exceptions=True)``); bad arguments
    # and log write failures raise.

    def new_transactions(
        self, count: int, timeout_ms: int | None = None, client_name: str | None = None
    ) -> list[TxnID]:
        """Start ``count`` transactions; return their ids once all NEW records are durable."""
        return self._starter.start_many(count, timeout_ms, client_name)

    def add_produced_partitions_many(
        self, items: Iterable[tuple[TxnID, Iterable[str]]]
    ) -> list[TransactionError | None]:
        """:meth:`add_produced_partitions` for many transactions, one log write.

        Returns, per item, None or the refusal (e.g. ``TransactionNotFound``).
        """
        checked = [(txn, partition_names(parts)) for txn, parts in items]
        return self._adder.add_many(checked, PARTITIONS)

    def add_acked_subscriptions_many(
        self, items: Iterable[tuple[TxnID, Iterable[tuple[str, str] | Subscription]]]
    ) -> list[TransactionError | None]:
        """:meth:`add_acked_subscriptions` for many transactions, one log write."""
        checked = [(txn, subscription_pairs(subs)) for txn, subs in items]
        return self._adder.add_many(checked, SUBSCRIPTIONS)

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
        return self._ends.end_many(items)

    # ------------------------------------------------------------ queries

    def get_transaction(self, txn_id: TxnID) -> TransactionInfo:
        """Return a snapshot of the transaction (live, or remembered by the store)."""
        return self._queries.get(txn_id)

    def list_transactions(self, status: TxnStatus | None = None) -> list[TransactionInfo]:
        """Snapshots of every live transaction (optionally with ``status``), by id."""
        return self._queries.live(status)

    def slow_transactions(self, min_age_ms: int) -> list[TransactionInfo]:
        """Live transactions started at least ``min_age_ms`` ago (oldest first)."""
        return self._queries.slow(min_age_ms)

    def low_water_mark(self) -> int:
        """Every transaction with ``least_bits <= LWM`` has ended (-1: none yet)."""
        return self._table.low_water_mark()

    def stats(self) -> dict[str, Any]:
        """Counters: open/ending/committed/aborted/timed-out, LWM, log and store."""
        return self._queries.stats()

    def metrics(self) -> dict[str, Any]:
        """Scrape-time snapshot for :class:`txnstream.metrics.CoordinatorCollector`."""
        return self._queries.metrics()

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
        self._log.set_batch_enabled(bool(enabled))

    def sweep_terminated(self) -> int:
        """Expire old terminated-transaction entries now; return how many went."""
        return self.store.sweep()

    # ------------------------------------------------------------- close

    def _shutdown_threads(self) -> None:
        self._stop.set()
        self._timers.close()
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._maintenance.shutdown()

    def close(self) -> None:
        """Stop timers and background ends, close the log and the store topic.

        Transactions still live stay in the log and are recovered by the next open.
        """
        with self._table.lock:
            if self._table.closed:
                return
            self._table.closed = True
        self._stop.set()
        if self._registry is not None:
            unregister_coordinator(str(self.tc_id), self, self._registry)
        if self._aio is not None:
            self._aio.close()  # queued async calls are answered (or fail) first
        self._timers.close()
        self._log.close()
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._maintenance.shutdown()
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
