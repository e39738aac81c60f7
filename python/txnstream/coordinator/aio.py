"""asyncio front end of a coordinator: many awaiting tasks, few log writes.

Each call is queued in a *lane* (one per operation kind). A lane's worker
thread takes everything queued so far, runs ONE bulk coordinator call for it
(:meth:`~.coordinator.TransactionCoordinator.end_transactions` etc.: one
batched log write per step, GIL released while it waits), and hands all the
answers back to the event loop with ONE ``call_soon_threadsafe``. While a
bulk call waits for its sync, new calls queue up for the next one, so the
batch size follows the load (group commit) and no thread per transaction
waits for the GIL.

Semantics are those of the blocking calls: an answer is given only once its
record is durable; bad arguments raise in the caller before anything is
queued; a refusal (``TransactionNotFound``...) raises in the awaiting task.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable, Hashable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, cast

from txnstream.coordinator.ending import trace_arg
from txnstream.coordinator.metadata import (
    TxnAction,
    TxnID,
    TxnStatus,
    client_arg,
    partition_names,
    subscription_pairs,
    timeout_arg,
)
from txnstream.errors import CoordinatorNotFound, TxnStreamError
from txnstream.proto import Subscription

if TYPE_CHECKING:
    from txnstream.coordinator.coordinator import TransactionCoordinator
    from txnstream.coordinator.ending import EndTrace

log = logging.getLogger(__name__)

# One bulk call: (key, items) -> one answer (value or exception) per item.
Batch = Callable[[Hashable, list[Any]], list[Any]]
Loop = asyncio.AbstractEventLoop


#: Told the answers nobody received (their await was cancelled, or their loop
#: closed): what the call made must not be left behind (a started transaction).
Orphans = Callable[[list[Any]], None]


def _orphan(answers: list[Any], orphaned: Orphans | None) -> None:
    # Hand the answers nobody receives (not the errors) to ``orphaned``; its
    # failure is logged, never let stop the delivery of the other answers.
    unreceived = [a for a in answers if not isinstance(a, BaseException)]
    if unreceived and orphaned is not None:
        try:
            orphaned(unreceived)
        except Exception:
            log.exception("cleaning up after %d answers nobody received", len(unreceived))


def _settle(
    futures: list[asyncio.Future[Any]], answers: list[Any], orphaned: Orphans | None
) -> None:
    # On the futures' own loop: one callback per loop per finished batch.
    unreceived = []
    for fut, answer in zip(futures, answers, strict=True):
        if fut.cancelled():
            unreceived.append(answer)
        elif isinstance(answer, BaseException):
            fut.set_exception(answer)
        else:
            fut.set_result(answer)
    _orphan(unreceived, orphaned)


def _deliver(
    calls: list[tuple[Loop, asyncio.Future[Any]]],
    answers: list[Any],
    orphaned: Orphans | None = None,
) -> None:
    # Hand each answer to the loop its future belongs to (calls may come from
    # several loops); a closed loop has nobody awaiting: its answers are orphans.
    by_loop: dict[Loop, tuple[list[asyncio.Future[Any]], list[Any]]] = {}
    for (loop, fut), answer in zip(calls, answers, strict=True):
        futs, ans = by_loop.setdefault(loop, ([], []))
        futs.append(fut)
        ans.append(answer)
    for loop, (futs, ans) in by_loop.items():
        try:
            loop.call_soon_threadsafe(_settle, futs, ans, orphaned)
        except RuntimeError:  # the loop is closed
            _orphan(ans, orphaned)


class _Lane:
    """Queued calls of one kind, drained by bulk calls on a worker thread.

    At most one drain runs per lane; it always clears ``_busy`` when it
    stops, whatever happened to the loops its callers came from.
    """

    def __init__(
        self, run: Batch, executor: ThreadPoolExecutor, orphaned: Orphans | None = None
    ) -> None:
        self._run = run
        self._executor = executor
        self._orphaned = orphaned
        self._lock = threading.Lock()
        self._queue: list[tuple[Hashable, Any, Loop, asyncio.Future[Any]]] = []
        self._busy = False

    def __len__(self) -> int:
        """Return how many calls are queued and not yet taken by a drain."""
        with self._lock:
            return len(self._queue)

    def submit(self, loop: Loop, key: Hashable, item: Any) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = loop.create_future()
        with self._lock:
            self._queue.append((key, item, loop, fut))
            start = not self._busy
            self._busy = True
        if start:
            try:
                self._executor.submit(self._drain)
            except RuntimeError:  # the coordinator closed: fail what is queued
                with self._lock:
                    queued, self._queue = self._queue, []
                    self._busy = False
                err = CoordinatorNotFound("transaction coordinator is closed")
                _deliver([(lp, f) for _, _, lp, f in queued], [err] * len(queued))
        return fut

    def _drain(self) -> None:
        try:
            while True:
                with self._lock:
                    queued, self._queue = self._queue, []
                    if not queued:
                        self._busy = False
                        return
                groups: dict[Hashable, list[tuple[Any, Loop, asyncio.Future[Any]]]] = {}
                for key, item, loop, fut in queued:
                    groups.setdefault(key, []).append((item, loop, fut))
                for key, calls in groups.items():
                    try:
                        answers = self._run(key, [i for i, _, _ in calls])
                    except BaseException as exc:  # e.g. a log write failure: every call fails
                        answers = [exc] * len(calls)
                    _deliver([(lp, f) for _, lp, f in calls], answers, self._orphaned)
        except BaseException:
            with self._lock:
                self._busy = False  # a later call starts a new drain
            raise


class AsyncCoordinator:
    """Awaitable calls on one :class:`~.coordinator.TransactionCoordinator`.

    Get it with ``tc.aio()``. Calls may come from several event loops (and
    threads) at once; each answer is delivered on its caller's loop.
    """

    def __init__(self, tc: TransactionCoordinator, workers: int = 4) -> None:
        self.tc = tc
        self._workers = workers
        self._start_lanes()

    def _start_lanes(self) -> None:
        tc = self.tc
        # The process the lanes' threads run in (one getpid, ~0.2 us, per call).
        self._pid = os.getpid()
        self._executor = ThreadPoolExecutor(
            self._workers, thread_name_prefix=f"txnstream-tc{tc.tc_id}-aio"
        )
        # A started transaction whose caller left is aborted at once (nobody
        # else has its id), as the blocking path does for an interrupted start.
        self._new = _Lane(self._run_new, self._executor, self._abandoned)
        self._partitions = _Lane(self._run_partitions, self._executor)
        self._subscriptions = _Lane(self._run_subscriptions, self._executor)
        self._ends = _Lane(self._run_ends, self._executor)
        self._lanes = (self._new, self._partitions, self._subscriptions, self._ends)

    def _abandoned(self, txn_ids: list[TxnID]) -> None:
        # Off the event loop's thread (it takes the coordinator's table lock,
        # which bulk calls hold): on a lane thread, or here once they stopped.
        try:
            self._executor.submit(self.tc._abandoned, txn_ids)
        except RuntimeError:  # the lanes stopped (the coordinator closed)
            self.tc._abandoned(txn_ids)

    def _here(self) -> None:
        # A child forked after the lanes started has none of their threads, and
        # may hold a lane's lock or "busy" flag as the fork found them: a queued
        # call would wait forever. The child gets lanes of its own, where each
        # call runs (and fails at once, or answers) as the blocking call does.
        if os.getpid() != self._pid:
            self._start_lanes()

    # Bulk calls run on the lane threads.

    def _run_new(self, key: Hashable, items: list[Any]) -> list[Any]:
        timeout_ms, client = cast("tuple[int, str | None]", key)
        return list(self.tc.new_transactions(len(items), timeout_ms, client))

    def _run_partitions(self, key: Hashable, items: list[Any]) -> list[Any]:
        return list(self.tc.add_produced_partitions_many(items))

    def _run_subscriptions(self, key: Hashable, items: list[Any]) -> list[Any]:
        return list(self.tc.add_acked_subscriptions_many(items))

    def _run_ends(self, key: Hashable, items: list[Any]) -> list[Any]:
        ends = [(txn, act) for txn, act, _ in items]
        traces: list[EndTrace | None] = [trace for _, _, trace in items]
        try:
            return list(self.tc.end_transactions(ends, traces=traces))
        except TxnStreamError:
            # One end's failure (e.g. a log write of a transaction ended one by
            # one) must not answer for the others, some of which may have
            # committed: end each again (ends are idempotent), each answered alone.
            out: list[Any] = []
            for (txn, act), trace in zip(ends, traces, strict=True):
                try:
                    out.append(self.tc.end_transaction(txn, act, trace=trace))
                except BaseException as exc:
                    out.append(exc)
            return out

    # Public API: the blocking calls' arguments and answers.

    async def new_transaction(
        self, timeout_ms: int | None = None, client_name: str | None = None
    ) -> TxnID:
        """Start a transaction; its id once the NEW record is durable."""
        cfg = self.tc.config
        timeout = timeout_arg(
            cfg.default_timeout_ms if timeout_ms is None else timeout_ms, cfg.max_timeout_ms
        )
        key = (timeout, client_arg(client_name))
        self._here()
        fut = self._new.submit(asyncio.get_running_loop(), key, None)
        try:
            txn: TxnID = await fut
        except asyncio.CancelledError:
            # Cancelled after its answer arrived but before this task resumed:
            # nobody receives the id, so the transaction must not stay open.
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self._abandoned([fut.result()])
            raise
        return txn

    async def add_produced_partitions(self, txn_id: TxnID, partitions: Iterable[str]) -> None:
        """Record (durably) that the transaction produced to ``partitions``."""
        self.tc._table.seq_of(txn_id)  # a bad id fails this call alone, not the batch
        names = partition_names(partitions)
        self._here()
        await self._partitions.submit(asyncio.get_running_loop(), None, (txn_id, names))

    async def add_acked_subscriptions(
        self, txn_id: TxnID, subscriptions: Iterable[tuple[str, str] | Subscription]
    ) -> None:
        """Record (durably) that the transaction acked on these subscriptions."""
        self.tc._table.seq_of(txn_id)
        subs = subscription_pairs(subscriptions)
        self._here()
        await self._subscriptions.submit(asyncio.get_running_loop(), None, (txn_id, subs))

    async def end_transaction(
        self, txn_id: TxnID, action: TxnAction | str, *, trace: EndTrace | None = None
    ) -> TxnStatus:
        """Commit or abort; the final status once it is durable (see ``end_transaction``).

        ``trace``, if given, counts the sequential durable waits of this end.
        """
        self.tc._table.seq_of(txn_id)
        act = TxnAction.parse(action)
        trace_arg(trace)
        loop = asyncio.get_running_loop()
        self._here()
        status: TxnStatus = await self._ends.submit(loop, None, (txn_id, act, trace))
        return status

    async def commit(self, txn_id: TxnID) -> TxnStatus:
        """Shorthand for ``end_transaction(txn_id, "commit")``."""
        return await self.end_transaction(txn_id, TxnAction.COMMIT)

    async def abort(self, txn_id: TxnID) -> TxnStatus:
        """Shorthand for ``end_transaction(txn_id, "abort")``."""
        return await self.end_transaction(txn_id, TxnAction.ABORT)

    def queued(self) -> int:
        """Return how many calls are queued in all lanes, not yet taken by a bulk call."""
        return sum(len(lane) for lane in self._lanes)

    def close(self) -> None:
        """Stop the lane threads once queued calls are answered."""
        if os.getpid() != self._pid:
            return  # a forked child: the lanes' threads are the parent's, not here
        self._executor.shutdown(wait=True)


__all__ = ["AsyncCoordinator"]
