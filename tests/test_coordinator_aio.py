"""asyncio front end: queued calls answered by bulk coordinator calls."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.test_coordinator_state import Env
from txnstream import testing
from txnstream.coordinator import TransactionCoordinator, TxnID, TxnStatus
from txnstream.errors import (
    CoordinatorNotFound,
    InvalidArgumentError,
    TransactionAlreadyCommitted,
    TransactionNotFound,
)


def test_many_tasks_commit_and_abort() -> None:
    env = Env(persist_count=10)
    a = env.tc.aio()
    assert env.tc.aio() is a

    async def one(k: int) -> tuple[TxnID, TxnStatus]:
        txn = await a.new_transaction(timeout_ms=10_000, client_name=f"c{k % 3}")
        await a.add_produced_partitions(txn, [f"out-{k % 2}"])
        await a.add_acked_subscriptions(txn, [("in", "sub")])
        return txn, await (a.commit(txn) if k % 3 else a.abort(txn))

    async def main() -> list[tuple[TxnID, TxnStatus]]:
        return await asyncio.gather(*(one(k) for k in range(60)))

    done = asyncio.run(main())
    assert len({t for t, _ in done}) == 60
    for k, (txn, st) in enumerate(done):
        assert st is (TxnStatus.COMMITTED if k % 3 else TxnStatus.ABORTED)
        assert env.parts.partition(f"out-{k % 2}").outcomes[txn] is (k % 3 != 0)
    stats = env.tc.stats()
    assert (stats["committed"], stats["aborted"], stats["live"]) == (40, 20, 0)
    assert env.log.live_entries() == 0
    # Far fewer entries than records: calls queued together share a write.
    assert env.log.stats()["entries"] < 5 * 60
    env.tc.close()


def test_refusals_and_bad_arguments_fail_only_their_call() -> None:
    env = Env(persist_count=10)
    a = env.tc.aio()

    async def main() -> list[TxnStatus | BaseException]:
        txn = await a.new_transaction(client_name="c")
        assert await a.commit(txn) is TxnStatus.COMMITTED
        with pytest.raises(InvalidArgumentError):
            await a.add_produced_partitions(txn, [""])
        with pytest.raises(CoordinatorNotFound):
            await a.commit(TxnID(7, 1))
        with pytest.raises(InvalidArgumentError):
            await a.new_transaction(timeout_ms=-5)
        other = await a.new_transaction()
        got = await asyncio.gather(
            a.abort(txn),
            a.commit(TxnID(0, 12345)),
            a.commit(other),
            a.commit(txn),
            return_exceptions=True,
        )
        return list(got)

    res = asyncio.run(main())
    assert isinstance(res[0], TransactionAlreadyCommitted)
    assert isinstance(res[1], TransactionNotFound)
    assert res[2:] == [TxnStatus.COMMITTED, TxnStatus.COMMITTED]
    env.tc.close()
    with pytest.raises(CoordinatorNotFound):
        env.tc.aio()

    async def after_close() -> None:
        with pytest.raises(CoordinatorNotFound):
            await a.new_transaction()
        with pytest.raises(CoordinatorNotFound):
            await a.new_transaction()  # the lane is not left busy

    asyncio.run(after_close())


def test_async_ends_are_durable(tmp_path: Path) -> None:
    async def main(tc: TransactionCoordinator) -> list[TxnID]:
        a = tc.aio()
        txns = list(await asyncio.gather(*(a.new_transaction(client_name="c") for _ in range(20))))
        await asyncio.gather(*(a.add_produced_partitions(t, ["out"]) for t in txns))
        await asyncio.gather(*(a.commit(t) for t in txns[:10]))
        return txns

    with TransactionCoordinator.open(tmp_path, 0, transaction_meta_persist_count=50) as tc:
        txns = asyncio.run(main(tc))
    with TransactionCoordinator.open(tmp_path, 0, transaction_meta_persist_count=50) as tc:
        assert tc.recovery["open"] == 10
        assert tc.recovery["live_records"] == 20
        assert tc.commit(txns[3]) is TxnStatus.COMMITTED
        assert tc.get_transaction(txns[15]).partitions == ("out",)


def test_a_forked_child_gets_the_blocking_calls_error_at_once(tmp_path: Path) -> None:
    """After fork() ``tc.aio()`` calls hung in the child: their lanes were the parent's threads.

    Each now fails as the same blocking call does in the child (the log's
    writer was made before the fork), without waiting.
    """
    import os

    tc = TransactionCoordinator.open(tmp_path, 0)

    async def warm() -> list[TxnID]:  # the lanes' threads exist, idle, at the fork
        a = tc.aio()
        txns = [await a.new_transaction() for _ in range(5)]
        await a.add_produced_partitions(txns[0], ["p"])
        await a.commit(txns[0])
        return txns[1:]

    open_txns = asyncio.run(warm())
    sync_txns, async_txns = open_txns[:2], open_txns[2:]
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 3

        def error_of(call: Any) -> type[BaseException] | None:
            try:
                call()
            except BaseException as exc:
                return type(exc)
            return None

        def run(coro: Any) -> Any:
            return lambda: asyncio.run(asyncio.wait_for(coro(), 5))

        try:
            a = tc.aio()
            pairs = [
                (tc.new_transaction, run(a.new_transaction)),
                (
                    lambda: tc.add_produced_partitions(sync_txns[0], ["q"]),
                    run(lambda: a.add_produced_partitions(async_txns[0], ["q"])),
                ),
                (lambda: tc.commit(sync_txns[1]), run(lambda: a.commit(async_txns[1]))),
            ]
            got = [(error_of(sync), error_of(aio)) for sync, aio in pairs]
            hung = any(aio is TimeoutError for _, aio in got)  # wait_for cut it
            same = all(s is not None and s is aio for s, aio in got)
            code = 0 if same and not hung else 2
        except BaseException:
            code = 4
        os._exit(code)
    exit_code = testing.wait_child(pid, 30_000)
    assert exit_code is not None, "the forked child hung"
    assert exit_code == 0
    tc.close()
