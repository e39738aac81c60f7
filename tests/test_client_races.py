"""Client calls racing a transaction's end, cancelled awaits, a closed client (SPEC §4.9).

Each test pins down a defect an independent review reproduced; each fails
on the code before its fix.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from txnstream import Broker, testing
from txnstream.client.aio import AsyncClient
from txnstream.client.transaction import Transaction
from txnstream.coordinator import TxnStatus
from txnstream.errors import (
    AlreadyClosedError,
    InvalidTxnStatusError,
    StorageError,
    TransactionWriteFailed,
    TxnStreamError,
)

DEADLINE_S = 10.0


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker.open(tmp_path, registry=None)
    yield b
    b.close()


def _read_committed(broker: Broker, topic: str) -> list[bytes]:
    c = broker.client().subscribe(topic, f"check-{time.monotonic_ns()}")
    out = []
    while (m := c.receive(300)) is not None:
        out.append(m.value)
    return out


def test_a_send_started_before_commit_is_waited_for_and_its_failure_aborts(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A send that joined the transaction before ``commit()`` started is part of it.

    The commit waits for it; when its write fails, the commit aborts
    (``TransactionWriteFailed``) instead of committing without it.
    """
    client = broker.client("race")
    producer = client.producer("out")
    txn = client.transaction()
    producer.send(b"first", txn=txn)
    joined, go = threading.Event(), threading.Event()
    real_join = Transaction._join

    def slow_join(self: Transaction) -> None:
        real_join(self)  # the transaction is open: this send is in it
        if threading.current_thread().name == "late-sender":
            joined.set()
            go.wait(DEADLINE_S)  # a thread switch right after the check

    monkeypatch.setattr(Transaction, "_join", slow_join)
    late: dict[str, Any] = {}

    def send_late() -> None:
        try:
            late["id"] = producer.send(b"late", txn=txn)
        except TxnStreamError as exc:
            late["error"] = exc

    sender = threading.Thread(target=send_late, name="late-sender")
    sender.start()
    assert joined.wait(DEADLINE_S)
    outcome: dict[str, Any] = {}

    def commit() -> None:
        try:
            txn.commit()
            outcome["ok"] = True
        except TxnStreamError as exc:
            outcome["error"] = exc

    committer = threading.Thread(target=commit)
    committer.start()
    deadline = time.monotonic() + DEADLINE_S
    while txn.state != "committing":
        assert time.monotonic() < deadline
        time.sleep(0.005)
    time.sleep(0.05)
    assert committer.is_alive(), "commit must wait for the send that joined before it"
    testing.inject_fault(broker.topic("out").ml, "write", errno=5)
    go.set()
    sender.join(DEADLINE_S)
    committer.join(DEADLINE_S)
    testing.clear_faults(broker.topic("out").ml)
    assert isinstance(outcome.get("error"), TransactionWriteFailed), outcome
    assert txn.state == "aborted"
    assert _read_committed(broker, "out") == []


def test_a_send_after_commit_started_is_refused(broker: Broker) -> None:
    client = broker.client("race")
    producer = client.producer("out")
    txn = client.transaction()
    producer.send(b"first", txn=txn)
    txn.commit()
    with pytest.raises(InvalidTxnStatusError, match="committed"):
        producer.send(b"late", txn=txn)
    assert _read_committed(broker, "out") == [b"first"]


def test_asyncio_end_lane_answers_each_end_alone_when_the_bulk_call_fails(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure of the bulk end call does not answer for ends that committed."""
    client = broker.client("lane")
    tc = broker._coordinators().get(0)
    real = tc.end_transactions
    calls: list[int] = []

    def ends_then_fail(items: Any, *, traces: Any = None) -> Any:
        items = list(items)
        calls.append(len(items))
        real(items, traces=traces)  # every one of them ends...
        raise StorageError("a later write of the batch failed", errno=5)  # ...then a failure

    monkeypatch.setattr(tc, "end_transactions", ends_then_fail)
    txns = [client.aio().transaction() for _ in range(4)]

    async def main() -> list[Any]:
        return await asyncio.gather(*(t.commit() for t in txns), return_exceptions=True)

    got = asyncio.run(main())
    assert calls, "the asyncio commits went through the bulk lane"
    assert got == [None] * 4, got
    assert [t.sync.state for t in txns] == ["committed"] * 4
    for t in txns:
        assert tc.get_transaction(t.txn_id).status in (TxnStatus.COMMITTED,)


def test_cancelled_asyncio_receive_loses_no_message(broker: Broker) -> None:
    client = broker.client("cancel")
    aclient = client.aio()
    consumer = aclient.subscribe("in", "s")

    async def main() -> bytes | None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(consumer.receive(timeout_ms=3_000), 0.1)
        client.producer("in").send(b"only-message")
        await asyncio.sleep(0.3)  # the abandoned receive's thread takes it meanwhile
        m = await consumer.receive(timeout_ms=5_000)
        return None if m is None else m.value

    started = time.monotonic()
    assert asyncio.run(main()) == b"only-message"
    assert time.monotonic() - started < 3.0  # not after the abandoned receive's timeout


def test_asyncio_receive_checks_its_arguments_when_a_message_is_ready(broker: Broker) -> None:
    client = broker.client("args")
    client.producer("in").send(b"ready")
    consumer = client.aio().subscribe("in", "s")

    async def main() -> None:
        for bad in ("soon", -5, 2.5):
            with pytest.raises(TxnStreamError, match="timeout_ms"):
                await consumer.receive(timeout_ms=bad)  # type: ignore[arg-type]
            with pytest.raises(TxnStreamError, match="timeout_ms"):
                await consumer.receive_many(1, timeout_ms=bad)  # type: ignore[arg-type]
        m = await consumer.receive(timeout_ms=1_000)
        assert m is not None and m.value == b"ready"

    asyncio.run(main())


def test_asyncio_abort_and_async_with_still_work_after_the_client_closed(broker: Broker) -> None:
    client = broker.client("closed")
    aclient = client.aio()
    tc = broker._coordinators().get(0)

    async def main() -> tuple[Any, Any]:
        t1, t2 = aclient.transaction(), aclient.transaction()
        await aclient.producer("t").send(b"x", txn=t1)
        client.close()
        await t1.abort()
        with pytest.raises(KeyError, match="user error"):
            async with t2:
                raise KeyError("user error")
        return t1, t2

    t1, t2 = asyncio.run(main())
    assert (t1.sync.state, t2.sync.state) == ("aborted", "aborted")
    assert tc.get_transaction(t1.txn_id).status in (TxnStatus.ABORTING, TxnStatus.ABORTED)
    assert _read_committed(broker, "t") == []


def test_two_threads_committing_one_transaction_count_one_commit(broker: Broker) -> None:
    client = broker.client("twice")
    producer = client.producer("out")
    for _ in range(20):
        txn = client.transaction()
        producer.send(b"x", txn=txn)
        barrier = threading.Barrier(2)

        def commit(t: Transaction = txn, b: threading.Barrier = barrier) -> None:
            b.wait()
            t.commit()

        threads = [threading.Thread(target=commit) for _ in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(DEADLINE_S)
    assert client.commit_stats()["commits"] == 20


# ------------------------------------------------------------ review fixes (stop 20)


def test_cancelled_asyncio_receives_do_not_hold_the_clients_threads(broker: Broker) -> None:
    """A cancelled await wakes its pool thread: 100 of them leave the pool free."""
    client = broker.client("cancels")
    aclient = client.aio()
    idle = aclient.subscribe("idle", "s")
    other = aclient.subscribe("other", "s")

    async def main() -> tuple[Any, float]:
        for _ in range(100):  # more than the pool's threads
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(idle.receive(), 0.01)
        started = time.monotonic()
        got = await asyncio.wait_for(other.receive(timeout_ms=100), DEADLINE_S)
        return got, time.monotonic() - started

    got, took = asyncio.run(main())
    assert got is None and took < DEADLINE_S / 2
    busy = [t for t in threading.enumerate() if t.name.startswith("txnstream-aio")]
    assert len(busy) < 64


def test_a_commit_and_an_abort_racing_count_one_end(broker: Broker) -> None:
    client = broker.client("race")
    for _ in range(20):
        txn = client.transaction()
        barrier = threading.Barrier(2)

        def end(fn: Any, b: threading.Barrier = barrier) -> None:
            b.wait()
            with contextlib.suppress(TxnStreamError):  # the loser is told the other outcome
                fn()

        threads = [threading.Thread(target=end, args=(f,)) for f in (txn.commit, txn.abort)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(DEADLINE_S)
    stats = client.commit_stats()
    assert stats["commits"] + stats["aborts"] == 20


@pytest.mark.parametrize("api", ["sync", "asyncio"])
def test_a_forked_child_fails_fast_on_the_parents_transaction(broker: Broker, api: str) -> None:
    """Its NEW record may still be in flight at fork(): nothing in the child waits for it."""
    import os

    client = broker.client("fork")
    txn = client.transaction()
    aclient = client.aio()
    atxn = aclient.transaction()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 3
        started = time.monotonic()
        try:
            if api == "sync":
                txn.abort()
            else:
                asyncio.run(asyncio.wait_for(atxn.abort(), 5))
        except AlreadyClosedError as exc:
            code = 0 if "fork" in str(exc) and time.monotonic() - started < 5 else 2
        except BaseException:
            code = 4
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    txn.abort()
    asyncio.run(atxn.abort())


def _fingerprint(root: Path) -> dict[str, tuple[int, int]]:
    # Every file's size and modification time (ns) under ``root``.
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_closing_a_broker_in_a_forked_child_neither_hangs_nor_writes(tmp_path: Path) -> None:
    """A child leaving ``with Broker.open(...)`` ran the whole shutdown on the parent's handles.

    It hung on a lock a parent thread held at fork() (here a producer's), and
    once the parent had closed, it took the directory again and wrote its
    stale transaction-buffer snapshot into it.
    """
    import os

    data = tmp_path / "data"
    b = Broker.open(data, registry=None)
    p = b.client("c").producer("t")
    p.send(b"m0")
    r, w = os.pipe()
    with p._lock:  # a parent thread is inside a send at fork()
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 3
        try:
            os.read(r, 1)  # the parent has sent more and closed
            started = time.monotonic()
            b.close()
            code = 0 if time.monotonic() - started < 5 else 2
        except BaseException:
            code = 4
        os._exit(code)
    for i in range(1, 4):
        p.send(b"m%d" % i)
    b.close()
    before = _fingerprint(data)
    os.write(w, b"x")
    exit_code = testing.wait_child(pid, int(DEADLINE_S * 1000))
    assert exit_code is not None, "the child's Broker.close() hung"
    assert exit_code == 0
    assert _fingerprint(data) == before, "the child wrote into the parent's directory"
    with Broker.open(data, registry=None) as again:
        c = again.client("r").subscribe("t", "s", initial_position="earliest")
        got = [c.receive(2_000) for _ in range(4)]
        assert [m.value if m else None for m in got] == [b"m0", b"m1", b"m2", b"m3"]


# ------------------------------------------------------ review fixes (asyncio client)


def _until_state(txn: Transaction, state: str) -> None:
    testing.wait_until(lambda: txn.state == state, int(DEADLINE_S * 1000))


def test_a_commit_cancelled_while_its_writes_are_pending_still_settles(broker: Broker) -> None:
    """``async with`` cancelled in its commit's first wait: the commit goes on without it.

    It used to leave the transaction "committing" in the client and OPEN in
    the coordinator (READ_COMMITTED readers held) until its timeout.
    """
    from concurrent.futures import Future

    client = broker.client("cancelled-commit")
    aclient = client.aio()
    producer = aclient.producer("t")
    slow: Future[None] = Future()  # a write of the transaction, not durable yet
    holder: list[Any] = []

    async def main() -> None:
        async def work() -> None:
            async with aclient.transaction(timeout_ms=600_000) as txn:
                holder.append(txn)
                await producer.send(b"in-txn", txn=txn)
                txn.sync.track(slow)

        task = asyncio.create_task(work())
        deadline = time.monotonic() + DEADLINE_S
        while not holder or holder[0].sync.state != "committing":  # waiting for the write
            assert time.monotonic() < deadline, "the commit never started"
            await asyncio.sleep(0.001)
        task.cancel()  # e.g. an outer wait_for timing out
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())  # the loop is gone before the write finishes
    slow.set_result(None)
    txn = holder[0].sync
    _until_state(txn, "committed")
    tc = broker._coordinators().get(txn.txn_id.most_bits)
    testing.wait_until(lambda: tc.get_transaction(txn.txn_id).status is TxnStatus.COMMITTED)
    assert client.commit_stats()["commits"] == 1
    assert _read_committed(broker, "t") == [b"in-txn"]


def test_a_commit_cancelled_in_the_end_lane_settles_and_is_counted(broker: Broker) -> None:
    """Cancelled while the coordinator ends it: it used to commit yet say "committing" forever."""
    client = broker.client("cancelled-end")
    aclient = client.aio()
    producer = aclient.producer("t")

    async def main() -> Any:
        txn = aclient.transaction()
        await producer.send(b"x", txn=txn)
        assert txn.sync.wait_durable(int(DEADLINE_S * 1000))  # nothing left for the first wait
        task = asyncio.create_task(txn.commit())
        await asyncio.sleep(0)  # queued in the coordinator's end lane
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return txn

    txn = asyncio.run(main())
    _until_state(txn.sync, "committed")
    assert client.commit_stats()["commits"] == 1
    assert _read_committed(broker, "t") == [b"x"]


@pytest.fixture
def one_thread_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """Async clients made in the test get a pool of one thread (easy to fill)."""
    from txnstream.client import aio

    monkeypatch.setattr(aio, "AIO_THREADS", 1)


def _fill_pool(aclient: AsyncClient) -> threading.Event:
    """Hold the pool's one thread until the returned gate is set (or DEADLINE_S)."""
    gate = threading.Event()
    aclient._submit(functools.partial(gate.wait, DEADLINE_S))
    return gate


@pytest.mark.usefixtures("one_thread_pool")
def test_closing_the_client_lets_its_queued_aborts_run(broker: Broker) -> None:
    """``client.close()`` used to cancel the pool's queued calls.

    Aborts queued there were dropped (their transactions stayed OPEN) and
    their tasks, never cancelled, got ``CancelledError``.
    """
    client = broker.client("close-queued")
    aclient = client.aio()
    txns = [aclient.transaction(timeout_ms=600_000) for _ in range(3)]
    tc = broker._coordinators().get(0)

    async def main() -> list[Any]:
        gate = _fill_pool(aclient)
        tasks = [asyncio.create_task(t.abort()) for t in txns]
        await asyncio.sleep(0)  # queued behind the busy thread
        client.close()  # e.g. the application shutting down
        gate.set()
        done = asyncio.gather(*tasks, return_exceptions=True)
        return list(await asyncio.wait_for(done, DEADLINE_S))

    assert asyncio.run(main()) == [None] * 3
    assert [t.sync.state for t in txns] == ["aborted"] * 3
    for t in txns:
        assert tc.get_transaction(t.txn_id).status in (TxnStatus.ABORTING, TxnStatus.ABORTED)


@pytest.mark.usefixtures("one_thread_pool")
@pytest.mark.parametrize("how", ["abort", "async with"])
def test_a_cancelled_task_does_not_drop_its_queued_abort(broker: Broker, how: str) -> None:
    """Cancelling the await of a queued abort used to cancel the abort itself.

    ``asyncio.wrap_future`` passed the cancel on to the pool's future: the
    abort never ran and the transaction stayed OPEN until its timeout.
    """
    aclient = broker.client("cancel-queued").aio()
    txn = aclient.transaction(timeout_ms=600_000)

    async def handler() -> None:
        if how == "abort":
            await txn.abort()
            return
        async with txn:
            raise ValueError("bad input")  # __aexit__ queues the abort

    async def main() -> None:
        gate = _fill_pool(aclient)
        task = asyncio.create_task(handler())
        await asyncio.sleep(0)  # the abort is queued behind the busy thread
        task.cancel()  # e.g. the request's deadline
        with pytest.raises(asyncio.CancelledError):
            await task
        gate.set()

    asyncio.run(main())
    _until_state(txn.sync, "aborted")
    tc = broker._coordinators().get(0)
    assert tc.get_transaction(txn.txn_id).status in (TxnStatus.ABORTING, TxnStatus.ABORTED)


def test_asyncio_send_many_runs_on_the_clients_pool(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It ran on the loop's default executor, shared with ``asyncio.to_thread`` and DNS.

    A few ``send_many`` waiting on a slow disk froze those.
    """
    aclient = broker.client("many").aio()
    producer = aclient.producer("t")
    ran_on: list[str] = []

    def send_many(*args: Any, **kwargs: Any) -> list[Any]:
        ran_on.append(threading.current_thread().name)
        return []

    monkeypatch.setattr(producer.sync, "send_many", send_many)
    assert asyncio.run(producer.send_many([b"a", b"b"])) == []
    assert len(ran_on) == 1 and ran_on[0].startswith("txnstream-aio"), ran_on
