"""The asyncio face of a client: ``client.aio()`` (SPEC §4.9).

The same operations as the sync API, awaitable and never blocking the
event loop: sends, and a producer's ``close``, await the storage futures
directly (one loop future and one timer per send, :func:`_settled`);
``commit`` awaits the transaction's writes
through a callback and hands the end to the coordinator's asyncio front
end, which ends all commits queued meanwhile in one bulk call; ``receive``
waits on the loop for a wake-up; blocking calls (``abort``, ``send_many``,
the rest of a cancelled commit) run on the client's bounded thread pool
(:data:`AIO_THREADS` threads at most, made on demand), and a cancelled
await leaves them to finish. Many loops and threads may share one client.

```python
aclient = broker.client("etl").aio()
producer = aclient.producer("out")
consumer = aclient.subscribe("in", "etl")
async with aclient.transaction(timeout_ms=30_000) as txn:
    msg = await consumer.receive(timeout_ms=1000)
    await producer.send(msg.value, txn=txn)
    await consumer.ack(msg, txn=txn)
```
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Final, TypeVar

from txnstream.broker.broker import fork_count
from txnstream.client.message import Message, MessageId
from txnstream.client.transaction import Transaction
from txnstream.coordinator import TxnAction, TxnID
from txnstream.coordinator.ending import EndTrace
from txnstream.errors import (
    TransactionAlreadyAborted,
    TransactionEndPending,
    TransactionWriteFailed,
    TxnStreamError,
    send_timed_out,
)

if TYPE_CHECKING:
    from txnstream.client.client import Client, Consumer, Producer

log = logging.getLogger(__name__)

#: Most threads an async client uses for blocking calls (abort, a failed commit's
#: clean-up, ``send_many``); receives wait on the event loop, holding none.
AIO_THREADS: Final = 64
#: Longest an asyncio receive waits before it looks again without a wake-up (s).
RECHECK_S: Final = 0.5

T = TypeVar("T")


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _time_out(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError())


def _copy_outcome(waiter: asyncio.Future[T], src: Future[T]) -> None:
    if waiter.done():  # timed out or cancelled meanwhile
        return
    if src.cancelled():
        waiter.cancel()
    elif (exc := src.exception()) is not None:
        waiter.set_exception(exc)
    else:
        waiter.set_result(src.result())


async def _bounded(fut: asyncio.Future[T], timeout_s: float) -> T:
    """``await fut``, raising :class:`TimeoutError` after ``timeout_s``.

    One timer; ``asyncio.wait_for`` adds a second future and a task hook per
    await, which the hot path (every send, every commit) does not need.
    """
    timer = asyncio.get_running_loop().call_later(max(0.0, timeout_s), _time_out, fut)
    try:
        return await fut
    finally:
        timer.cancel()


async def _settled(src: Future[T], timeout_s: float | None) -> T:
    """Await ``src``, a future another thread completes, for at most ``timeout_s``.

    The completing thread posts the outcome to the loop with one
    ``call_soon_threadsafe``: one loop future per await, where
    ``asyncio.wait_for(asyncio.wrap_future(src))`` makes three futures and two
    chained callbacks. A cancelled await leaves ``src`` alone (the work goes
    on). ``timeout_s`` None: no timer, for work that bounds its own waits.
    """
    if src.done():
        return src.result()
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[T] = loop.create_future()

    def post(done: Future[T]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
            loop.call_soon_threadsafe(_copy_outcome, waiter, done)

    src.add_done_callback(post)
    if timeout_s is None:
        return await waiter
    return await _bounded(waiter, timeout_s)


def _log_failure(done: Future[Any]) -> None:
    # A pool call nobody awaits (the rest of a cancelled commit): its failure is logged.
    if not done.cancelled() and (exc := done.exception()) is not None:
        log.error("finishing a cancelled commit failed", exc_info=exc)


class _LoopWaker:
    """A subscription waker (``set()`` from any thread) that resolves a future on a loop."""

    __slots__ = ("_fired", "_loop", "woken")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._fired = False
        self.woken: asyncio.Future[None] = loop.create_future()

    def set(self) -> None:
        if self._fired:  # one wake-up is enough; the receive looks again
            return
        self._fired = True
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
            self._loop.call_soon_threadsafe(_resolve, self.woken)


def _sync_txn(txn: AsyncTransaction | Transaction | None) -> Transaction | None:
    return txn.sync if isinstance(txn, AsyncTransaction) else txn


class AsyncTransaction:
    """A transaction for asyncio code; ``async with`` commits on success, aborts on exception."""

    def __init__(self, client: AsyncClient, txn: Transaction) -> None:
        self._client = client
        #: The underlying :class:`~txnstream.client.transaction.Transaction`.
        self.sync = txn

    @property
    def txn_id(self) -> TxnID:
        """The transaction's id."""
        return self.sync.txn_id

    @property
    def durable_waits(self) -> int:
        """Sequential durable waits of its end (see the sync transaction)."""
        return self.sync.durable_waits

    async def commit(self) -> None:
        """Commit; returns once the outcome is durable and visible.

        The same steps and errors as ``Transaction.commit``, without a
        thread per call: the transaction's writes are awaited through a
        callback, and the end goes to the coordinator's asyncio front end,
        whose one worker ends every commit queued meanwhile in one bulk call
        (one batched write per step).

        Cancelling the await (or the task leaving ``async with``) does not
        leave the transaction half-ended: the commit goes on without the
        caller, as the sync ``commit()`` on the client's pool (every wait
        bounded by the end timeout), until it is committed or aborted; the
        caller gets the ``CancelledError``.
        """
        txn = self.sync
        if not txn._begin_end(commit=True):
            return
        try:
            await self._commit(txn)
        except asyncio.CancelledError:
            self._client._submit(self._finish_cancelled_commit).add_done_callback(_log_failure)
            raise

    async def _commit(self, txn: Transaction) -> None:
        started = time.monotonic()
        waits, phases = 0, []
        deadline = started + txn.client.end_timeout_ms / 1000.0
        loop = asyncio.get_running_loop()
        written: asyncio.Future[None] = loop.create_future()

        def on_written() -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                loop.call_soon_threadsafe(_resolve, written)

        if txn.when_written(on_written):
            waits += 1
            phases.append("written")
            try:
                await _bounded(written, deadline - time.monotonic())
            except TimeoutError:
                raise txn._writes_pending() from None
        if txn._failed is not None:
            raise await self._client._run(txn._aborted_after_failure)
        trace = EndTrace()
        try:
            await txn._tc.aio().end_transaction(txn.txn_id, TxnAction.COMMIT, trace=trace)
        except TransactionAlreadyAborted:
            txn._commit_refused()
            raise
        except TransactionWriteFailed:
            await self._client._run(txn._abort_after_failure)
            raise
        finally:
            txn.durable_waits = waits + trace.waits
            txn.wait_phases = phases + trace.phases
        txn._committed(started)

    def _finish_cancelled_commit(self) -> None:
        # On a pool thread: the rest of a commit whose await was cancelled. Nobody
        # asks again, so an end that could not even be decided in time is aborted
        # (the transaction would stay open, holding readers, until its timeout).
        txn = self.sync
        try:
            txn.commit()
        except TransactionEndPending as exc:
            if exc.outcome is not None:  # decided: the coordinator finishes it
                log.warning("the cancelled commit of %s is finished in the background", txn)
                return
            try:
                txn.abort()
            except TxnStreamError:
                log.warning("aborting %s after its cancelled commit failed", txn, exc_info=True)
        except TxnStreamError:  # refused or aborted: its state is settled
            log.info("the cancelled commit of %s failed", txn, exc_info=True)

    async def abort(self) -> None:
        """Abort; returns once the outcome is durable."""
        await self._client._run(self.sync.abort)

    async def __aenter__(self) -> AsyncTransaction:
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            await self.commit()
            return
        await self._client._run(self.sync.__exit__, exc_type, exc, tb)

    def __repr__(self) -> str:
        return f"AsyncTransaction({self.sync!r})"


class AsyncProducer:
    """:class:`~txnstream.client.client.Producer` for asyncio."""

    def __init__(self, producer: Producer, client: AsyncClient | None = None) -> None:
        #: The sync producer.
        self.sync = producer
        # Its pool runs the blocking send_many.
        self._client = producer.client.aio() if client is None else client

    async def send(
        self,
        value: bytes,
        key: str | None = None,
        properties: Mapping[str, str] | None = None,
        txn: AsyncTransaction | Transaction | None = None,
        *,
        sequence_id: int | None = None,
    ) -> MessageId:
        """Send one message (see ``Producer.send``)."""
        sync = self.sync
        where, published = sync._queue_one(value, key, properties, _sync_txn(txn), sequence_id)
        src = published.assigned if published.assigned is not None else published.durable
        timeout_ms = sync.client.end_timeout_ms
        try:
            if src is None:  # a duplicate: its original id
                ids = await _settled(sync._message_ids(where, published, 1), timeout_ms / 1000)
                return ids[0]
            # Straight from the storage future: no intermediate futures per send.
            pos = await _settled(src, timeout_ms / 1000)
        except TimeoutError:  # a stalled disk: bounded as the sync send is
            raise send_timed_out(f"send to {sync.topic}", timeout_ms) from None
        return MessageId(pos.ledger_id, pos.entry_id, 0, 1, *where)

    async def send_many(
        self,
        values: Iterable[bytes],
        key: str | None = None,
        properties: Mapping[str, str] | None = None,
        txn: AsyncTransaction | Transaction | None = None,
        *,
        keys: Sequence[str | None] | None = None,
        sequence_id: int | None = None,
    ) -> list[MessageId]:
        """Send many messages as one batched entry (see ``Producer.send_many``).

        The blocking call runs on the client's bounded pool (never the
        loop's default executor, which ``asyncio.to_thread`` and DNS share).
        """
        call = functools.partial(
            self.sync.send_many,
            values,
            key,
            properties,
            _sync_txn(txn),
            keys=keys,
            sequence_id=sequence_id,
        )
        return await self._client._run(call)

    async def close(self) -> None:
        """Close the producer: refuse further sends, await the queued ones' durability.

        As ``Producer.close``, bounded by the client's ``end_timeout_ms``,
        without blocking the event loop or holding a thread: the storage
        futures of the queued sends are awaited on the loop.
        """
        sync = self.sync
        waiting = sync._begin_close()
        if waiting is None:
            return
        deadline = time.monotonic() + sync.client.end_timeout_ms / 1000.0
        try:
            for fut in waiting:
                # A failed send was reported to its caller; out of time: they
                # complete (or fail) on their own, as after the sync close.
                with contextlib.suppress(Exception):
                    await _settled(fut, max(0.0, deadline - time.monotonic()))
        finally:
            sync._end_close()


class AsyncConsumer:
    """:class:`~txnstream.client.client.Consumer` for asyncio."""

    def __init__(self, client: AsyncClient, consumer: Consumer) -> None:
        self._client = client
        #: The sync consumer.
        self.sync = consumer

    async def receive(self, timeout_ms: int | None = None) -> Message | None:
        """Return the next message, or None when none arrives in time.

        Cancelling the await (e.g. ``asyncio.wait_for`` timing out) loses
        nothing: a message the pool thread takes afterwards is given back to
        the subscription, first in line.
        """
        self.sync._deadline(timeout_ms)  # bad arguments raise even when a message is ready
        got = self.sync.receive_many(1, 0)
        if got:
            return got[0]
        if timeout_ms == 0:
            return None
        msgs = await self._wait(1, timeout_ms)
        return msgs[0] if msgs else None

    async def receive_many(
        self, max_messages: int = 100, timeout_ms: int | None = 0
    ) -> list[Message]:
        """Up to ``max_messages`` messages (see ``Consumer.receive_many``; cancel-safe)."""
        self.sync._deadline(timeout_ms)
        got = self.sync.receive_many(max_messages, 0)
        if got or timeout_ms == 0:
            return got
        return await self._wait(max_messages, timeout_ms)

    async def _wait(self, n: int, timeout_ms: int | None) -> list[Message]:
        # Wait on the event loop, holding no thread: a waker registered on every
        # partition's subscription resolves a loop future when receivers are woken
        # (data, a redelivery, a release, a close); then take without blocking.
        # Registered before each look, so no wake-up between the look and the
        # wait is lost. A cancelled await has taken nothing, so it loses nothing.
        deadline = self.sync._deadline(timeout_ms)
        loop = asyncio.get_running_loop()
        subs = self.sync._subscriptions()
        while True:
            waker = _LoopWaker(loop)
            for sub in subs:
                sub.add_waker(waker)
            try:
                got = self.sync.receive_many(n, 0)
                if got:
                    return got
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    return []
                # Negative acks fall due without a wake-up: look again then, and
                # at least every RECHECK_S whatever happens.
                wait = min(RECHECK_S, *(sub.next_due(now) for sub in subs))
                if deadline is not None:
                    wait = min(wait, deadline - now)
                # asyncio.wait, not wait_for: wait_for (3.11) swallows a cancel that
                # arrives as the waker resolves, and the receive would go on.
                await asyncio.wait((waker.woken,), timeout=max(wait, 0.0))
            finally:
                for sub in subs:
                    sub.remove_waker(waker)

    async def ack(
        self, msg: Message | MessageId, txn: AsyncTransaction | Transaction | None = None
    ) -> None:
        """Acknowledge (does not block: a transactional ack's record is awaited by commit)."""
        self.sync.ack(msg, _sync_txn(txn))

    async def ack_cumulative(
        self, msg: Message | MessageId, txn: AsyncTransaction | Transaction | None = None
    ) -> None:
        """Acknowledge cumulatively."""
        self.sync.ack_cumulative(msg, _sync_txn(txn))

    def negative_ack(self, msg: Message | MessageId) -> None:
        """Deliver again after the negative-ack delay."""
        self.sync.negative_ack(msg)

    def redeliver_unacknowledged(self) -> int:
        """Deliver again every unacknowledged message."""
        return self.sync.redeliver_unacknowledged()

    def close(self) -> None:
        """Close the consumer."""
        self.sync.close()


class AsyncClient:
    """The asyncio face of a :class:`~txnstream.client.client.Client` (``client.aio()``)."""

    def __init__(self, client: Client) -> None:
        #: The sync client.
        self.sync = client
        self._pool = ThreadPoolExecutor(AIO_THREADS, thread_name_prefix="txnstream-aio")
        self._forks = fork_count()

    def _submit(self, call: Callable[[], T]) -> Future[T]:
        # The client's pool; once the client closed (the pool is shut down), a
        # thread of its own, so an abort or the end of ``async with`` still runs.
        if fork_count() != self._forks:
            # A forked child has none of the pool's threads (its queue would
            # never run): a new pool, where the call fails fast as in the parent.
            self._pool = ThreadPoolExecutor(AIO_THREADS, thread_name_prefix="txnstream-aio")
            self._forks = fork_count()
        try:
            return self._pool.submit(call)
        except RuntimeError:
            out: Future[T] = Future()

            def run() -> None:
                if out.set_running_or_notify_cancel():
                    try:
                        out.set_result(call())
                    except BaseException as exc:
                        out.set_exception(exc)

            threading.Thread(target=run, name="txnstream-aio-closed", daemon=True).start()
            return out

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        # ``fn`` on the pool. A cancelled await leaves it queued or running: an
        # abort or a clean-up still happens. Every call run here bounds its own
        # waits (the client's end timeout), so this await has no timer of its own.
        return await _settled(self._submit(functools.partial(fn, *args)), None)

    def producer(self, topic: str, name: str | None = None) -> AsyncProducer:
        """Return an async producer on ``topic``."""
        return AsyncProducer(self.sync.producer(topic, name), self)

    def subscribe(
        self, topic: str, subscription: str, isolation: str = "read_committed", **kwargs: Any
    ) -> AsyncConsumer:
        """Return an async consumer (same arguments as ``Client.subscribe``)."""
        return AsyncConsumer(self, self.sync.subscribe(topic, subscription, isolation, **kwargs))

    def transaction(self, timeout_ms: int | None = None) -> AsyncTransaction:
        """Begin a transaction (does not block)."""
        return AsyncTransaction(self, self.sync.transaction(timeout_ms))

    def close(self) -> None:
        """Stop the thread pool once the calls queued or running finished; does not wait.

        Queued calls still run (an abort asked before the close happens,
        and its task gets the answer); later calls each get a thread.
        """
        self._pool.shutdown(wait=False)


__all__ = ["AIO_THREADS", "AsyncClient", "AsyncConsumer", "AsyncProducer", "AsyncTransaction"]
