"""kill -9 at each step of ending a transaction, then recover (real files, real processes)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from txnstream.coordinator import TransactionCoordinator, TxnID, TxnStatus
from txnstream.errors import TransactionAlreadyAborted, TransactionAlreadyCommitted
from txnstream.testing import STEPS, RecordingParticipants

CHILD = Path(__file__).with_name("coordinator_crash_child.py")


def run_child(data: Path, step: str, action: str) -> dict[str, int]:
    proc = subprocess.run(
        [sys.executable, str(CHILD), str(data), step, action],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)
    assert "NOT KILLED" not in proc.stdout
    ids: dict[str, int] = json.loads(proc.stdout.splitlines()[0])
    return ids


def reopen(data: Path, parts: RecordingParticipants) -> TransactionCoordinator:
    return TransactionCoordinator.open(
        data, 0, participants=parts, transaction_meta_persist_count=10
    )


@pytest.mark.parametrize("action", ["commit", "abort"])
@pytest.mark.parametrize("step", STEPS)
def test_kill_at_step_then_recover(tmp_path: Path, step: str, action: str) -> None:
    ids = run_child(tmp_path, step, action)
    victim, bystander = TxnID(0, ids["victim"]), TxnID(0, ids["bystander"])
    earlier = TxnID(0, ids["earlier"])
    final = TxnStatus.COMMITTED if action == "commit" else TxnStatus.ABORTED
    opposite = "abort" if action == "commit" else "commit"
    opposite_error = (
        TransactionAlreadyCommitted if action == "commit" else TransactionAlreadyAborted
    )

    parts = RecordingParticipants()
    tc = reopen(tmp_path, parts)
    try:
        # The same end again returns the outcome decided before the crash.
        assert tc.end_transaction(victim, action) is final
        assert tc.end_transaction(victim, action) is final
        with pytest.raises(opposite_error):
            tc.end_transaction(victim, opposite)
        assert tc.get_transaction(victim).status is final
        if step == "final_logged":
            # Fully ended before the crash: recovery does not touch participants.
            assert parts.all() == []
        else:
            # Caught in COMMITTING/ABORTING: recovery ended it on every participant.
            for name in ("out-0", "out-1"):
                assert parts.partition(name).outcomes == {victim: action == "commit"}
            assert parts.subscription("in", "sub").outcomes == {victim: action == "commit"}
        info = tc.get_transaction(bystander)
        assert info.status is TxnStatus.OPEN
        assert info.partitions == ("out-1",)
        assert tc.end_transaction(earlier, "commit") is TxnStatus.COMMITTED
        assert tc.low_water_mark() == bystander.least_bits - 1
        new = tc.new_transaction()
        assert new.least_bits > victim.least_bits
    finally:
        tc.close()

    # And again after a clean restart: the store still answers.
    parts2 = RecordingParticipants()
    tc = reopen(tmp_path, parts2)
    try:
        assert tc.end_transaction(victim, action) is final
        with pytest.raises(opposite_error):
            tc.end_transaction(victim, opposite)
        assert parts2.all() == []
        assert tc.get_transaction(bystander).status is TxnStatus.OPEN
    finally:
        tc.close()


@pytest.mark.parametrize("step", STEPS)
def test_kill_during_timeout_abort_keeps_timed_out(tmp_path: Path, step: str) -> None:
    """A timer abort killed at any step: after restart a late commit learns it timed out."""
    ids = run_child(tmp_path, step, "timeout")
    victim = TxnID(0, ids["victim"])
    for _ in range(2):  # after the crash, then after a clean restart
        parts = RecordingParticipants()
        tc = reopen(tmp_path, parts)
        try:
            with pytest.raises(TransactionAlreadyAborted) as err:
                tc.commit(victim)
            assert err.value.details["timed_out"] is True
            assert tc.abort(victim) is TxnStatus.ABORTED
            info = tc.get_transaction(victim)
            assert (info.status, info.timed_out) == (TxnStatus.ABORTED, True)
        finally:
            tc.close()
