"""Background work of a coordinator: timeouts, stalled ends, the sweep, store compaction."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from txnstream import CompactedTopic
from txnstream.coordinator import (
    CoordinatorConfig,
    RecordingParticipants,
    RetryPolicy,
    TransactionCoordinator,
    TxnStatus,
)
from txnstream.coordinator import terminated as terminated_mod
from txnstream.coordinator.coordinator import terminated_topic_name
from txnstream.coordinator.log import InMemoryTransactionLog
from txnstream.coordinator.terminated import InMemoryTerminatedPersistence
from txnstream.errors import TransactionNotFound


def wait_until(cond: Callable[[], bool], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.005)
    return cond()


def test_participants_failing_forever_do_not_block_timeouts_or_sweep() -> None:
    """More stuck ends than pool threads: timeouts, the sweep and retries still run."""
    parts = RecordingParticipants()
    dead = parts.partition("dead")
    dead.fail_next(10**9)  # unreachable until told otherwise
    cfg = CoordinatorConfig(
        end_workers=4,
        retry=RetryPolicy(initial_backoff_ms=1, max_backoff_ms=20),  # retries until close
        transaction_meta_persist_count=10,
        transaction_meta_persist_time_in_hour=0.2 / 3600,  # 200 ms
        transaction_meta_expire_check_interval_in_second=0.02,
    )
    topic = InMemoryTerminatedPersistence()
    tc = TransactionCoordinator(
        0, InMemoryTransactionLog(), config=cfg, participants=parts, terminated=topic
    )
    try:
        stuck = [tc.new_transaction(timeout_ms=10, client_name="c") for _ in range(6)]
        for txn in stuck:
            tc.add_produced_partitions(txn, ["dead"])
        assert wait_until(
            lambda: all(tc.get_transaction(t).status is TxnStatus.ABORTING for t in stuck)
        )
        # Every pool thread has met the dead participant; a new timeout still fires.
        healthy = tc.new_transaction(timeout_ms=10, client_name="c")
        tc.add_produced_partitions(healthy, ["ok"])

        # (Its remembered outcome may already have expired: judge by effects.)
        assert wait_until(
            lambda: (
                parts.partition("ok").outcomes == {healthy: False} and tc.stats()["timed_out"] == 1
            )
        )

        # The sweep runs too: the remembered outcome expires after 200 ms.
        def forgotten() -> bool:
            try:
                tc.get_transaction(healthy)
            except TransactionNotFound:
                return True
            return False

        assert wait_until(forgotten)
        # The stuck ends are retried in the background and finish once it answers.
        seen = dead.failures
        assert wait_until(lambda: dead.failures > seen + len(stuck))
        dead.fail_next(0)
        assert wait_until(
            lambda: tc.stats()["live"] == 0 and dead.outcomes == dict.fromkeys(stuck, False)
        )
        for txn in stuck:
            info = tc.get_transaction(txn)
            assert (info.status, info.timed_out) == (TxnStatus.ABORTED, True)
    finally:
        tc.close()


def test_terminated_topic_is_compacted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every end writes to the store's topic; compaction keeps it O(live keys)."""
    monkeypatch.setattr(terminated_mod, "COMPACT_SLACK", 16)
    count, ends = 5, 200
    tc = TransactionCoordinator.open(tmp_path, 0, transaction_meta_persist_count=count)
    try:
        txns = tc.new_transactions(ends, client_name="one-client")
        for txn in txns:
            assert tc.commit(txn) is TxnStatus.COMMITTED
        assert wait_until(lambda: tc.store.compactions >= 1)
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
    tc = TransactionCoordinator.open(tmp_path, 0, transaction_meta_persist_count=count)
    try:
        assert tc.commit(txns[-1]) is TxnStatus.COMMITTED
        with pytest.raises(TransactionNotFound):
            tc.commit(txns[-count - 1])
    finally:
        tc.close()
