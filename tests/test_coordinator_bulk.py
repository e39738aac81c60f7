"""Bulk coordinator calls: same state machine, one log write per step."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_coordinator_state import Env, full_txn
from txnstream.coordinator import RetryPolicy, TransactionCoordinator, TxnID, TxnStatus
from txnstream.errors import (
    InvalidArgumentError,
    InvalidTxnStatusError,
    ParticipantsFailed,
    TransactionAlreadyAborted,
    TransactionAlreadyCommitted,
    TransactionNotFound,
)


@pytest.fixture
def env() -> Iterator[Env]:
    e = Env(persist_count=10)
    yield e
    e.tc.close()


def bulk_txns(tc: TransactionCoordinator, n: int) -> list[TxnID]:
    txns = tc.new_transactions(n, timeout_ms=10_000, client_name="bulk")
    assert tc.add_produced_partitions_many([(t, ["out-0", "out-1"]) for t in txns]) == [None] * n
    assert tc.add_acked_subscriptions_many([(t, [("in", "sub")]) for t in txns]) == [None] * n
    return txns


def test_bulk_flow_one_entry_per_step(env: Env) -> None:
    tc = env.tc
    base = tc.stats()["timers"]  # the store's expiry sweep
    txns = bulk_txns(tc, 6)
    assert [t.least_bits for t in txns] == list(range(6))
    assert env.log.stats()["entries"] == 3  # NEW x6, ADD_PARTITION x6, ADD_SUBSCRIPTION x6
    assert tc.stats()["timers"] == base + 6
    info = tc.get_transaction(txns[2])
    assert (info.status, info.partitions, info.log_records) == (
        TxnStatus.OPEN,
        ("out-0", "out-1"),
        3,
    )
    acts = ["commit" if i % 2 else "abort" for i in range(6)]
    res = tc.end_transactions(list(zip(txns, acts, strict=True)))
    assert res == [TxnStatus.COMMITTED if i % 2 else TxnStatus.ABORTED for i in range(6)]
    assert env.log.stats()["entries"] == 5
    assert env.log.live_entries() == 0  # every record of every txn deleted
    assert env.parts.partition("out-1").outcomes == {t: i % 2 == 1 for i, t in enumerate(txns)}
    assert tc.stats()["timers"] == base
    assert (tc.stats()["committed"], tc.stats()["aborted"], tc.stats()["live"]) == (3, 3, 0)
    # Idempotent ends answered by the store, opposite ones refused per item.
    again = tc.end_transactions([(txns[1], "commit"), (txns[0], "commit")])
    assert again[0] is TxnStatus.COMMITTED
    assert isinstance(again[1], TransactionAlreadyAborted)


def test_bulk_refusals_are_per_item(env: Env) -> None:
    tc = env.tc
    a, b = bulk_txns(tc, 2)
    assert tc.commit(b) is TxnStatus.COMMITTED
    ghost = TxnID(0, 999)
    res = tc.add_produced_partitions_many([(a, ["x"]), (b, ["x"]), (ghost, ["x"])])
    assert res[0] is None
    assert isinstance(res[1], InvalidTxnStatusError)  # ended, known to the store
    assert isinstance(res[2], TransactionNotFound)
    assert tc.get_transaction(a).partitions == ("out-0", "out-1", "x")
    # Duplicate in one call: the second waits for the first and gets its answer.
    out = tc.end_transactions([(a, "commit"), (a, "commit"), (ghost, "abort"), (b, "abort")])
    assert out[:2] == [TxnStatus.COMMITTED, TxnStatus.COMMITTED]
    assert isinstance(out[2], TransactionNotFound)
    assert isinstance(out[3], TransactionAlreadyCommitted)


def test_bulk_bad_arguments_change_nothing(env: Env) -> None:
    tc = env.tc
    (a,) = tc.new_transactions(1)
    for bad in (-1, 1.5, True):
        with pytest.raises(InvalidArgumentError):
            tc.new_transactions(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        tc.new_transactions(2, timeout_ms=0)
    with pytest.raises(InvalidArgumentError):
        tc.add_produced_partitions_many([(a, ["ok"]), (a, [""])])
    with pytest.raises(InvalidArgumentError):
        tc.add_acked_subscriptions_many([(a, [("t", "")])])
    with pytest.raises(InvalidArgumentError):
        tc.end_transactions([(a, "commit"), ("nope", "commit")])  # type: ignore[list-item]
    assert tc.new_transactions(0) == []
    info = tc.get_transaction(a)
    assert (info.status, info.partitions, info.subscriptions) == (TxnStatus.OPEN, (), ())
    assert tc.stats()["live"] == 1


def test_bulk_participant_failure_leaves_only_that_txn_ending() -> None:
    e = Env(persist_count=5, retry=RetryPolicy(initial_backoff_ms=0, max_attempts=1))
    tc = e.tc
    ok = bulk_txns(tc, 2)
    bad = full_txn(tc)
    e.parts.partition("out-0").fail_next(1)  # the first end call on out-0 fails
    res = tc.end_transactions([(bad, "commit"), (ok[0], "commit"), (ok[1], "abort")])
    assert isinstance(res[0], ParticipantsFailed)
    assert res[1:] == [TxnStatus.COMMITTED, TxnStatus.ABORTED]
    assert tc.get_transaction(bad).status is TxnStatus.COMMITTING
    assert tc.end_transactions([(bad, "abort")])[0].__class__ is TransactionAlreadyCommitted
    e.advance(60_000)  # the background finishes the decided commit
    assert tc.get_transaction(bad).status is TxnStatus.COMMITTED
    tc.close()


def test_bulk_created_txns_time_out(env: Env) -> None:
    txns = env.tc.new_transactions(3, timeout_ms=1_000, client_name="c")
    env.advance(1_001)
    assert env.tc.stats()["aborted"] == 3
    res = env.tc.end_transactions([(t, "commit") for t in txns])
    for r in res:
        assert isinstance(r, TransactionAlreadyAborted)
        assert r.details["timed_out"]


def test_bulk_on_ledger_survives_restart(tmp_path: Path) -> None:
    with TransactionCoordinator.open(tmp_path, 0, transaction_meta_persist_count=10) as tc:
        txns = bulk_txns(tc, 20)
        res = tc.end_transactions([(t, "commit") for t in txns[:10]])
        assert res == [TxnStatus.COMMITTED] * 10
    with TransactionCoordinator.open(tmp_path, 0, transaction_meta_persist_count=10) as tc:
        assert tc.recovery["open"] == 10
        assert tc.recovery["live_records"] == 30
        assert tc.commit(txns[0]) is TxnStatus.COMMITTED  # remembered by the store
        res = tc.end_transactions([(t, "abort") for t in txns[10:]])
        assert res == [TxnStatus.ABORTED] * 10
        assert tc.new_transactions(1)[0].least_bits >= 20
    with TransactionCoordinator.open(tmp_path, 0) as tc:
        assert tc.recovery["open"] == 1
        assert tc.recovery["live_records"] == 1


def test_bulk_end_answers_each_item_when_one_ended_alone_fails(tmp_path: Path) -> None:
    """A log failure of a transaction ended on its own is its answer, not the call's.

    The other item of the batch committed: its answer must reach its caller
    (before, the whole call raised and, with no terminated store, asking
    again said TransactionNotFound for a commit that happened).
    """
    import errno

    from txnstream import testing
    from txnstream.errors import StorageError

    tc = TransactionCoordinator.open(
        tmp_path,
        0,
        registry=None,
        batched_write_enabled=True,
        batched_write_max_delay_ms=2000,
    )
    try:
        t1 = tc.new_transaction(timeout_ms=600_000)
        t2 = tc.new_transaction(timeout_ms=600_000)
        tc.add_partition_nowait(t2, "p")  # an ADD in flight: t2 is ended alone, after t1
        ml = testing.log_ledger(tc)

        def hook(step: str, txn: TxnID) -> None:
            if step == "final_logged" and txn == t1:
                testing.inject_fault(ml, "sync", errno=errno.ENOSPC, times=3)

        testing.set_step_hook(tc, hook)
        got = tc.end_transactions([(t1, "commit"), (t2, "commit")])
        testing.set_step_hook(tc, None)
        testing.clear_faults(ml)
        assert got[0] is TxnStatus.COMMITTED
        assert isinstance(got[1], StorageError)
    finally:
        tc.close()


def test_bulk_end_of_the_same_transaction_twice_gets_one_answer(env: Env) -> None:
    tc = env.tc
    [t] = bulk_txns(tc, 1)
    assert tc.end_transactions([(t, "commit"), (t, "commit")]) == [TxnStatus.COMMITTED] * 2


def test_bulk_end_traces_must_be_a_list_per_item(env: Env) -> None:
    [t] = bulk_txns(env.tc, 1)
    with pytest.raises(InvalidArgumentError, match="traces"):
        env.tc.end_transactions([(t, "commit")], traces=5)  # type: ignore[arg-type]
    assert env.tc.get_transaction(t).status is TxnStatus.OPEN


@pytest.mark.parametrize("bad", [0, -5, 2.5, True])
def test_timer_service_refuses_a_wait_that_would_spin(bad: object) -> None:
    from txnstream.timer import TimerService

    with pytest.raises(InvalidArgumentError, match="max_wait_ms"):
        TimerService(max_wait_ms=bad)  # type: ignore[arg-type]
