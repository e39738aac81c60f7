"""Waits on another thread's work end with a typed error, never Python's bare TimeoutError."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from txnstream import Broker
from txnstream.config import BrokerConfig
from txnstream.errors import OperationTimeoutError, TxnStreamError


def test_waiting_for_another_threads_topic_open_times_out_typed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Broker.open(tmp_path, BrokerConfig(end_timeout_ms=200), registry=None) as broker:
        real = broker._open_topic
        release = threading.Event()

        def slow_open(tn: Any) -> Any:
            release.wait(10)
            return real(tn)

        monkeypatch.setattr(broker, "_open_topic", slow_open)
        first = threading.Thread(target=broker.topic, args=("slow",))
        first.start()
        time.sleep(0.05)  # let the first thread own the open (not a timing assert)
        try:
            with pytest.raises(
                OperationTimeoutError, match="topic persistent://public/default/slow"
            ) as e:
                broker.topic("slow")
            assert isinstance(e.value, TxnStreamError) and isinstance(e.value, TimeoutError)
            assert e.value.retriable
        finally:
            release.set()
            first.join(10)
        assert broker.topic("slow").full == "persistent://public/default/slow"  # the retry works


def test_participant_end_failures_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    """A participant that fails an end is a warning on the first failed attempt."""
    from txnstream.coordinator import (
        CoordinatorConfig,
        ParticipantsFailed,
        RetryPolicy,
        TransactionCoordinator,
    )
    from txnstream.testing import (
        InMemoryTerminatedPersistence,
        InMemoryTransactionLog,
        ManualClock,
        RecordingParticipants,
    )
    from txnstream.timer import TimerService

    parts = RecordingParticipants()
    parts.partition("flaky").fail_next(10**9)
    clock = ManualClock()
    timers = TimerService(clock, start=False)
    tc = TransactionCoordinator(
        0,
        InMemoryTransactionLog(),
        config=CoordinatorConfig(retry=RetryPolicy(initial_backoff_ms=0, max_attempts=2)),
        participants=parts,
        terminated=InMemoryTerminatedPersistence(),
        clock=clock,
        timers=timers,
    )
    try:
        txn = tc.new_transaction(timeout_ms=60_000, client_name="c")
        tc.add_produced_partitions(txn, ["flaky"])
        caplog.set_level(logging.WARNING, logger="txnstream.coordinator.ending")
        with pytest.raises(ParticipantsFailed):
            tc.end_transaction(txn, "commit")
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any("1 participant(s) failed (attempt 1)" in m and "flaky" in m for m in warned)
    finally:
        parts.partition("flaky").fail_next(0)
        tc.close()
        timers.close()
