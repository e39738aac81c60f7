"""asyncio front end: lanes outlive closed event loops; each loop gets its own answers."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import pytest

from txnstream import TxnPosition, testing
from txnstream.coordinator import TransactionCoordinator, TxnID, TxnStatus
from txnstream.testing import InMemoryTransactionLog


class GatedLog(InMemoryTransactionLog):
    """Writes wait at a gate (so calls queue up behind one in flight)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def write_many_sync(
        self, records: Sequence[bytes], timeout_ms: int | None = None
    ) -> list[TxnPosition]:
        self.entered.set()
        assert self.gate.wait(30)
        return super().write_many_sync(records, timeout_ms)

    def write_sync(self, record: bytes, timeout_ms: int | None = None) -> TxnPosition:
        return self.write_many_sync([record], timeout_ms)[0]


def test_a_loop_closing_mid_batch_does_not_wedge_the_lane() -> None:
    log = GatedLog()
    tc = TransactionCoordinator(0, log)
    a = tc.aio()
    try:
        log.gate.clear()
        loop = asyncio.new_event_loop()
        task = loop.create_task(a.new_transaction())
        loop.run_until_complete(asyncio.sleep(0))  # the call is queued and draining
        assert log.entered.wait(30)
        task.cancel()
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()  # mid-batch: its answers can no longer be delivered
        log.gate.set()

        async def later() -> TxnID:
            return await asyncio.wait_for(a.new_transaction(), 30)

        txn = asyncio.run(later())  # hangs (TimeoutError) if the lane stayed busy
        assert tc.get_transaction(txn).txn_id == txn
    finally:
        log.gate.set()
        tc.close()


def test_futures_of_several_loops_are_settled_on_their_own_loops() -> None:
    log = GatedLog()
    tc = TransactionCoordinator(0, log)
    a = tc.aio()
    results: dict[int, object] = {}

    def run_loop(k: int, ready: threading.Event) -> None:
        async def main() -> object:
            asyncio.get_running_loop().set_debug(True)  # cross-thread use raises
            ready.set()
            try:
                return await asyncio.wait_for(a.new_transaction(client_name=f"c{k}"), 30)
            except BaseException as exc:
                return exc

        results[k] = asyncio.run(main())

    try:
        log.gate.clear()
        first = threading.Thread(target=run_loop, args=(0, threading.Event()))
        first.start()
        assert log.entered.wait(30)  # loop 0's batch is in flight, held at the gate
        readies = [threading.Event(), threading.Event()]
        others = [threading.Thread(target=run_loop, args=(k, readies[k - 1])) for k in (1, 2)]
        for th in others:
            th.start()
        for r in readies:
            assert r.wait(30)
        # Both queue behind loop 0's batch and go together in the next one.
        testing.wait_until(lambda: testing.queued_calls(a) == 2)
        log.gate.set()
        for th in (first, *others):
            th.join(60)
        assert sorted(results) == [0, 1, 2]
        for k, got in results.items():
            assert isinstance(got, TxnID), (k, got)
            assert tc.get_transaction(got).client_name == f"c{k}"
    finally:
        log.gate.set()
        tc.close()


@pytest.mark.parametrize("how", ["cancelled", "loop closed"])
def test_a_transaction_started_for_a_caller_who_left_is_aborted(how: str) -> None:
    """A cancelled ``new_transaction`` used to leave its transaction OPEN until its timeout.

    The bulk call goes on and starts it; nobody gets its id, so nobody can
    end it, and it held the low-water mark. Now it is aborted at once in
    the background, as the blocking path does for an interrupted start.
    """
    log = GatedLog()
    tc = TransactionCoordinator(0, log)
    a = tc.aio()
    try:
        log.gate.clear()
        loop = asyncio.new_event_loop()
        tasks = [loop.create_task(a.new_transaction(timeout_ms=600_000)) for _ in range(5)]
        loop.run_until_complete(asyncio.sleep(0))  # queued, and the bulk call is writing
        assert log.entered.wait(30)
        for t in tasks:
            t.cancel()  # e.g. the request handler timed out
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        if how == "loop closed":
            loop.close()
        log.gate.set()

        def aborted() -> bool:
            return not tc.list_transactions(status=TxnStatus.OPEN) and tc.stats()["aborted"] == 5

        if how == "cancelled":  # the answers reach the loop: it runs while we wait

            async def wait() -> None:
                deadline = time.monotonic() + 10
                while not aborted():
                    assert time.monotonic() < deadline, "the started transactions stay open"
                    await asyncio.sleep(0.005)

            loop.run_until_complete(wait())
            loop.close()
        testing.wait_until(aborted, 10_000)
    finally:
        log.gate.set()
        tc.close()


def test_a_new_transaction_cancelled_after_its_answer_arrived_is_aborted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cancel lands after the answer is set, before the awaiting task resumes.

    The task raises CancelledError and nobody gets the id: the transaction
    stayed OPEN until its timeout (here 10 minutes).
    """
    import txnstream.coordinator.aio as aio_mod

    tc = TransactionCoordinator(0, InMemoryTransactionLog())
    a = tc.aio()
    tasks: list[asyncio.Task[TxnID]] = []
    settle = aio_mod._settle

    def settle_then_cancel(*args: object) -> None:
        settle(*args)  # type: ignore[arg-type]
        tasks[0].cancel()  # its answer is set: the task resumes into the cancel

    monkeypatch.setattr(aio_mod, "_settle", settle_then_cancel)

    async def main() -> None:
        tasks.append(asyncio.create_task(a.new_transaction(timeout_ms=600_000)))
        with pytest.raises(asyncio.CancelledError):
            await tasks[0]

    try:
        asyncio.run(main())
        assert tc.stats()["created"] == 1  # it was started: it must end
        testing.wait_until(lambda: not tc.list_transactions(TxnStatus.OPEN), 10_000)
        ended = tc.stats()
        assert ended["aborted"] + ended["timed_out"] >= 1 and ended["committed"] == 0
    finally:
        tc.close()
