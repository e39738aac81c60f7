"""asyncio front end: lanes outlive closed event loops; each loop gets its own answers."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

from txnstream import TxnPosition, testing
from txnstream.coordinator import TransactionCoordinator, TxnID
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
