"""Injected storage faults through the client: errors reach the caller, nothing acked is lost."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from txnstream import Broker, ManagedLedger, testing
from txnstream.client import Producer
from txnstream.errors import StorageError, StorageStoppedError, TransactionWriteFailed


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker.open(tmp_path, registry=None)
    yield b
    testing.clear_faults(b.topic("t").ml)
    b.close()


def test_failed_send_raises_retriable_and_loses_nothing(broker: Broker) -> None:
    client = broker.client()
    p = client.producer("t", name="p")
    kept = p.send(b"before")
    testing.inject_fault(broker.topic("t").ml, "write", errno=28)
    with pytest.raises(StorageError) as e:
        p.send(b"failed", sequence_id=5)
    assert e.value.retriable
    # The same sequence id may be sent again: the failed one was never persisted.
    again = p.send(b"failed", sequence_id=5)
    assert again > kept
    c = client.subscribe("t", "s")
    got = [c.receive(1000), c.receive(1000), c.receive(100)]
    assert [m.value if m else None for m in got] == [b"before", b"failed", None]


def test_failed_transactional_write_aborts_the_commit(broker: Broker) -> None:
    client = broker.client()
    p = client.producer("t")
    rc = client.subscribe("t", "rc")
    txn = client.transaction()
    testing.inject_fault(broker.topic("t").ml, "write", errno=5)
    # The failure surfaces at the send (no position) or only at the commit.
    with contextlib.suppress(StorageError):
        p.send(b"lost", txn=txn)
    with pytest.raises(TransactionWriteFailed) as e:
        txn.commit()
    assert e.value.abortable and "aborted" in str(e.value)
    assert txn.state == "aborted"
    # Nothing of it is visible, and the partition is not pinned.
    p.send(b"after")
    m = rc.receive(5000)
    assert m is not None and m.value == b"after"
    assert broker.admin.read_committed_lag("t")["persistent://public/default/t"] == 0


def test_late_transaction_listed_while_its_abort_is_stuck(broker: Broker) -> None:
    client = broker.client()
    p = client.producer("t")
    txn = client.transaction(timeout_ms=30)
    p.send(b"x", txn=txn)
    ml = broker.topic("t").ml
    testing.hold_fault(ml, "sync")  # the timeout abort cannot make anything durable
    try:
        testing.wait_until(lambda: bool(broker.admin.late_transactions()), 10_000)
        late = broker.admin.late_transactions()
        assert [i.txn_id for i in late] == [txn.txn_id]
    finally:
        testing.release_fault(ml, "sync")
    testing.wait_until(lambda: not broker.admin.late_transactions(), 10_000)
    testing.wait_until(lambda: not broker.admin.open_transactions(), 10_000)


@pytest.mark.parametrize("kind", ["sync", "write"])
def test_a_panicking_storage_thread_fails_the_commit_fast_and_close_returns(
    tmp_path: Path, kind: str
) -> None:
    # A bug that panics on a storage thread: the commit fails at once (the
    # stopped storage is not retried for the whole end timeout), every
    # later call fails the same way, close returns, and reopening recovers
    # everything acknowledged before; nothing of the transaction is visible
    # (its NEW record may have reached the file: then its timeout aborts it,
    # as after a kill -9 between a write and its sync).
    b = Broker.open(tmp_path, registry=None)
    client = b.client()
    p = client.producer("t")
    kept = p.send(b"before")
    testing.inject_panic(b.topic("t").ml, kind)
    started = time.monotonic()
    txn = client.transaction()
    # The send fails (no position) or only the commit does.
    with contextlib.suppress(StorageStoppedError):
        p.send(b"in txn", txn=txn)
    with pytest.raises((StorageStoppedError, TransactionWriteFailed)):
        txn.commit()
    with pytest.raises(StorageStoppedError):
        p.send(b"after")
    with pytest.raises(StorageStoppedError):
        b.close()
    assert time.monotonic() - started < b.config.end_timeout_ms / 1000.0
    with Broker.open(tmp_path, registry=None) as again:
        c = again.client().subscribe("t", "s", initial_position="earliest")
        got = c.receive(5000)
        assert got is not None and (got.value, got.message_id) == (b"before", kept)
        assert c.receive(300) is None
        assert {t.txn_id for t in again.admin.open_transactions()} <= {txn.txn_id}


@pytest.mark.parametrize("api", ["sync", "asyncio"])
def test_a_stalled_disk_does_not_hold_a_commit_past_its_end_timeout(
    tmp_path: Path, api: str
) -> None:
    """The decision record waits at most the end timeout; a retry then finishes the commit."""
    import asyncio
    import threading

    from txnstream.client.aio import AsyncTransaction
    from txnstream.config import BrokerConfig
    from txnstream.errors import TransactionEndPending

    with Broker.open(tmp_path, BrokerConfig(end_timeout_ms=1_000), registry=None) as b:
        client = b.client("stall")
        client.producer("in").send(b"x")
        consumer = client.subscribe("in", "s")
        out = client.producer("out")
        m = consumer.receive(5_000)
        assert m is not None
        txn = client.transaction(timeout_ms=60_000)
        out.send(b"y", txn=txn)
        consumer.ack(m, txn=txn)
        assert txn.wait_durable(5_000)
        ml = b.topic("in").ml
        testing.hold_fault(ml, "sync")  # every sync of the directory waits
        got: list[BaseException | None] = []

        def commit() -> None:
            try:
                if api == "sync":
                    txn.commit()
                else:  # the same transaction through the asyncio face
                    asyncio.run(AsyncTransaction(client.aio(), txn).commit())
                got.append(None)
            except BaseException as exc:
                got.append(exc)

        started = time.monotonic()
        th = threading.Thread(target=commit, daemon=True)
        th.start()
        th.join(20)
        try:
            assert not th.is_alive(), "the commit waited for the stalled disk"
            assert time.monotonic() - started < 15
            assert len(got) == 1 and isinstance(got[0], TransactionEndPending), got
            assert got[0].retriable
        finally:
            testing.release_fault(ml, "sync")
        txn.commit()  # asked again: the decision is logged again and the end completes
        assert txn.state == "committed"
        reader = client.subscribe("out", "r")
        r = reader.receive(5_000)
        assert r is not None and r.value == b"y"
        assert reader.receive(200) is None


def _stall_after_a_send(b: Broker) -> tuple[Producer, ManagedLedger]:
    """Producer ``p`` on topic t with one durable message; then every sync of the disk waits.

    The caller releases the stall (``testing.release_fault(ml, "sync")``).
    """
    p = b.client("stall").producer("t", name="p")
    p.send(b"warm")
    ml = b.topic("t").ml
    testing.hold_fault(ml, "sync")
    return p, ml


@pytest.mark.parametrize("api", ["sync", "asyncio"])
def test_a_send_the_stalled_disk_holds_times_out_typed_and_its_retry_is_deduplicated(
    tmp_path: Path, api: str
) -> None:
    """A send (sync or asyncio) waits at most the end timeout, then raises OperationTimeoutError.

    It used to raise TransactionEndPending (an end's error) from the sync
    send, and the asyncio send waited for the disk without a deadline.
    """
    import asyncio

    from txnstream.config import BrokerConfig
    from txnstream.errors import OperationTimeoutError

    with Broker.open(tmp_path, BrokerConfig(end_timeout_ms=500), registry=None) as b:
        p, ml = _stall_after_a_send(b)
        try:
            aio = b.client("aio").aio().producer("t")

            def send() -> object:
                if api == "sync":
                    return p.send(b"x", sequence_id=1)
                return asyncio.run(aio.send(b"x"))

            with pytest.raises(OperationTimeoutError, match="same sequence_id") as e:
                send()
            assert e.value.retriable
        finally:
            testing.release_fault(ml, "sync")
        if api == "sync":
            again = p.send(b"x", sequence_id=1)  # written once, whatever the timeout saw
            got = b.client().subscribe("t", "s")
            assert [m.value for m in iter(lambda: got.receive(300), None)] == [b"warm", b"x"]
            assert again.entry_id == 1


def test_an_asyncio_retry_of_a_send_in_flight_waits_without_blocking_the_loop(
    tmp_path: Path,
) -> None:
    """The retry finds the original still being written: the loop runs on while it waits.

    It used to wait for the original inside the event loop (the whole
    loop stalled up to the end timeout on a stalled disk).
    """
    import asyncio

    from txnstream.client.aio import AsyncProducer
    from txnstream.config import BrokerConfig
    from txnstream.errors import OperationTimeoutError

    with Broker.open(tmp_path, BrokerConfig(end_timeout_ms=1_000), registry=None) as b:
        p, ml = _stall_after_a_send(b)
        try:
            first = p.send_async(b"x", sequence_id=5)  # in flight: its sync is held
            assert not first.cancel()  # the send goes ahead whatever the caller does

            async def main() -> int:
                ticks = 0

                async def tick() -> None:
                    nonlocal ticks
                    while True:
                        await asyncio.sleep(0.01)
                        ticks += 1

                ticker = asyncio.create_task(tick())
                with pytest.raises(OperationTimeoutError):
                    await AsyncProducer(p).send(b"x", sequence_id=5)  # p's name: a retry
                ticker.cancel()
                return ticks

            assert asyncio.run(main()) >= 5  # the loop ran while the retry waited
        finally:
            testing.release_fault(ml, "sync")
        assert first.result(10) == p.send(b"x", sequence_id=5)  # one message, one id


def test_an_asyncio_send_cancelled_or_left_by_its_closed_loop_is_written_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Cancelling an awaited send, or closing its loop, leaves the write alone.

    The send's storage future finishes later, on the completion thread,
    after its awaiter is gone (cancelled) or its loop is closed: that
    completion must neither fail nor resolve a dead future, and each
    message is written exactly once.
    """
    import asyncio

    with Broker.open(tmp_path, registry=None) as b:
        p, ml = _stall_after_a_send(b)
        aio = b.client("aio").aio().producer("t")
        try:

            async def cancelled() -> None:
                task = asyncio.create_task(aio.send(b"cancelled"))
                await asyncio.sleep(0.05)  # queued; its sync is held
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task

            asyncio.run(cancelled())
            loop = asyncio.new_event_loop()
            left = loop.create_task(aio.send(b"left"))
            loop.run_until_complete(asyncio.sleep(0.05))
            assert not left.done()
            left.cancel()
            loop.run_until_complete(asyncio.sleep(0))
            loop.close()  # the write finishes after its loop is gone
        finally:
            testing.release_fault(ml, "sync")
        got = b.client().subscribe("t", "s")
        values = [m.value for m in iter(lambda: got.receive(500), None)]
        assert values == [b"warm", b"cancelled", b"left"]
        assert p.send(b"after").entry_id == 3  # the completion thread still runs
    assert not [r for r in caplog.records if "callback" in r.getMessage()]  # none raised


def _waits_until_released(call: Callable[[], object], ml: ManagedLedger, why: str) -> None:
    """Run ``call`` while syncs wait: still waiting 0.3 s in, and returning once released."""
    import threading

    returned = threading.Event()

    def run() -> None:
        call()
        returned.set()

    try:
        threading.Thread(target=run, daemon=True).start()
        assert not returned.wait(0.3), why
    finally:
        testing.release_fault(ml, "sync")
    assert returned.wait(10)


def test_flush_waits_until_a_transactional_send_is_durable_then_its_id_can_be_acked(
    tmp_path: Path,
) -> None:
    """A send in a transaction returns its id before the entry is durable.

    ``flush()`` returned at once ("nothing to flush"), so acking that id in
    another transaction right after was refused with a non-retriable
    PositionNotFoundError. Now flush waits for durability (as pulsar-client's
    does), and an ack of an id past the durable end is refused retriable.
    """

    from txnstream.config import BrokerConfig
    from txnstream.errors import OperationTimeoutError, PositionNotFoundError

    with Broker.open(tmp_path, BrokerConfig(end_timeout_ms=2_000), registry=None) as b:
        client = b.client("c")
        p = client.producer("t", name="p")
        p.send(b"warm")
        consumer = client.subscribe("t", "s")
        assert consumer.receive(5_000) is not None
        sent, acker = client.transaction(), client.transaction()
        p.send(b"first", txn=sent)  # the partition joins the transaction now
        # Nothing in flight when the disk stalls: a small write queued behind a
        # running sync (here, the partition's registration) waits for it, so m
        # would not be written and its id never assigned.
        assert sent.wait_durable(10_000) and acker.wait_durable(10_000)
        ml = b.topic("t").ml
        testing.hold_fault(ml, "sync")  # every sync of the directory waits
        try:
            mid = p.send(b"m", txn=sent)  # its id: assigned, not durable
            with pytest.raises(PositionNotFoundError, match="not durable yet") as refused:
                consumer.ack(mid, txn=acker)
            assert refused.value.retriable
            with pytest.raises(OperationTimeoutError, match="flush of producer"):
                p.flush()  # the disk does not answer: bounded, typed
        except BaseException:
            testing.release_fault(ml, "sync")
            raise
        _waits_until_released(p.flush, ml, "flush returned before the entry was durable")
        consumer.ack(mid, txn=acker)  # durable now: accepted
        sent.commit()
        acker.commit()
        consumer.redeliver_unacknowledged()
        got = consumer.receive(300)
        assert got is not None and got.value == b"warm"  # never acked
        got = consumer.receive(5_000)
        assert got is not None and got.value == b"first"  # committed, never acked
        assert consumer.receive(300) is None  # the committed ack of m sticks


def test_producer_close_waits_for_its_queued_sends_to_be_durable(tmp_path: Path) -> None:
    """close() returned while send_async writes were still queued (pulsar-client's waits)."""

    from txnstream.config import BrokerConfig

    with Broker.open(tmp_path, BrokerConfig(end_timeout_ms=5_000), registry=None) as b:
        p, ml = _stall_after_a_send(b)
        futs = [p.send_async(b"m%d" % i) for i in range(10)]
        _waits_until_released(p.close, ml, "close returned before its sends were durable")
        assert all(f.done() and f.exception() is None for f in futs)


def test_an_asyncio_producer_close_awaits_its_sends_without_blocking_the_loop(
    tmp_path: Path,
) -> None:
    """``AsyncProducer.close()`` waited for its queued sends on the loop's own thread.

    Every other task of the loop froze meanwhile, up to the end timeout.
    Here the disk is released by a callback queued on the loop before the
    close: it runs only if the close leaves the loop free, and the close
    must return with the queued send durable.
    """
    import asyncio

    from txnstream.client.aio import AsyncProducer
    from txnstream.config import BrokerConfig

    with Broker.open(tmp_path, BrokerConfig(end_timeout_ms=2_000), registry=None) as b:
        p, ml = _stall_after_a_send(b)
        try:

            async def main() -> bool:
                queued = p.send_async(b"queued")  # held at the stalled sync
                asyncio.get_running_loop().call_soon(testing.release_fault, ml, "sync")
                await asyncio.wait_for(AsyncProducer(p).close(), 10)
                return queued.done() and queued.exception() is None

            assert asyncio.run(main()), "close returned before its send was durable"
        finally:
            testing.release_fault(ml, "sync")
        b.client("again").producer("t", name="p").close()  # the name is free again
