"""Background work of a coordinator: timeouts, stalled ends, the sweep, store compaction.

Time is a ManualClock and timers run only when the test settles them, so
nothing here sleeps or depends on how fast the machine is.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from txnstream import CompactedTopic, testing
from txnstream.coordinator import (
    CoordinatorConfig,
    RetryPolicy,
    TransactionCoordinator,
    TxnStatus,
    terminated_topic_name,
)
from txnstream.coordinator import terminated as terminated_mod
from txnstream.errors import TransactionNotFound
from txnstream.testing import (
    InMemoryTerminatedPersistence,
    InMemoryTransactionLog,
    ManualClock,
    RecordingParticipants,
)
from txnstream.timer import TimerService


def test_participants_failing_forever_do_not_block_timeouts_or_sweep() -> None:
    """More stuck ends than pool threads: timeouts, the sweep and retries still run."""
    parts = RecordingParticipants()
    dead = parts.partition("dead")
    dead.fail_next(10**9)  # unreachable until told otherwise
    clock = ManualClock()
    timers = TimerService(clock, start=False)
    cfg = CoordinatorConfig(
        end_workers=2,
        retry=RetryPolicy(initial_backoff_ms=10, max_backoff_ms=200),
        transaction_meta_persist_count=10,
        transaction_meta_persist_time_in_hour=1,
        transaction_meta_expire_check_interval_in_second=60,
    )
    topic = InMemoryTerminatedPersistence()
    tc = TransactionCoordinator(
        0,
        InMemoryTransactionLog(),
        config=cfg,
        participants=parts,
        terminated=topic,
        clock=clock,
        timers=timers,
    )
    try:
        stuck = [tc.new_transaction(timeout_ms=10, client_name="c") for _ in range(6)]
        for txn in stuck:
            tc.add_produced_partitions(txn, ["dead"])
        clock.advance(10)
        testing.settle(tc, timers)
        assert all(tc.get_transaction(t).status is TxnStatus.ABORTING for t in stuck)
        # Every pool thread has met the dead participant; a new timeout still fires.
        healthy = tc.new_transaction(timeout_ms=10, client_name="c")
        tc.add_produced_partitions(healthy, ["ok"])
        clock.advance(10)
        testing.settle(tc, timers)
        assert parts.partition("ok").outcomes == {healthy: False}
        assert tc.get_transaction(healthy).status is TxnStatus.ABORTED
        assert tc.stats()["timed_out"] == 1
        # The stuck ends are retried in the background with backoff...
        seen = dead.failures
        for _ in range(5):
            clock.advance(200)
            testing.settle(tc, timers)
        assert dead.failures >= seen + 5 * len(stuck)
        # ...the sweep runs too: an hour later the remembered outcome expired...
        clock.advance(3_600_000)
        testing.settle(tc, timers)
        with pytest.raises(TransactionNotFound):
            tc.get_transaction(healthy)
        # ...and once the participant answers, the stuck ends finish.
        dead.fail_next(0)
        clock.advance(200)
        testing.settle(tc, timers)
        assert tc.stats()["live"] == 0
        assert dead.outcomes == dict.fromkeys(stuck, False)
        for txn in stuck:
            info = tc.get_transaction(txn)
            assert (info.status, info.timed_out) == (TxnStatus.ABORTED, True)
    finally:
        tc.close()


def test_terminated_topic_is_compacted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every end writes to the store's topic; compaction keeps it O(live keys)."""
    monkeypatch.setattr(terminated_mod, "COMPACT_SLACK", 16)
    count, ends = 5, 200
    tc = TransactionCoordinator.open(
        tmp_path, 0, registry=None, transaction_meta_persist_count=count
    )
    try:
        txns = tc.new_transactions(ends, client_name="one-client")
        for txn in txns:
            assert tc.commit(txn) is TxnStatus.COMMITTED
        testing.wait_until(lambda: tc.store.compactions >= 1)
        assert tc.store.topic_entries() <= 2 * count + 16 + 2
        tc.sweep_terminated()  # compacts what is left over
        assert tc.store.topic_entries() == count
    finally:
        tc.close()
    topic = CompactedTopic.open(tmp_path, terminated_topic_name(0))
    try:
        assert len(topic) == count
        assert topic.compact()["entries_before"] == count
    finally:
        topic.close()
    tc = TransactionCoordinator.open(
        tmp_path, 0, registry=None, transaction_meta_persist_count=count
    )
    try:
        assert tc.commit(txns[-1]) is TxnStatus.COMMITTED
        with pytest.raises(TransactionNotFound):
            tc.commit(txns[-count - 1])
    finally:
        tc.close()
