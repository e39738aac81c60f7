"""The main job (make demo): kill -9 mid-run, recovery, idempotent-end verification."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from txnstream import demo
from txnstream.coordinator import TransactionCoordinators


def test_main_job_passes_on_fresh_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = demo.main(str(tmp_path / "data"), txns=120, threads=4, kill_fraction=0.5)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "verdict: PASS" in out
    assert "idempotent retries answered" in out


def test_refuses_to_delete_a_foreign_directory(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    assert demo.main(str(tmp_path), txns=10, threads=1) == 2
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def test_verifier_detects_a_changed_outcome(tmp_path: Path) -> None:
    # A real workload run, then one acknowledged outcome is misreported:
    # the verification must flag it rather than pass.
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "txnstream.workload",
            "--data",
            str(tmp_path),
            "--txns",
            "20",
            "--threads",
            "2",
            "--coordinators",
            "1",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    res = demo.ModeResult("on")
    for line in proc.stdout.splitlines():
        msg = json.loads(line)
        if "o" in msg:
            res.outcomes[(msg["id"][0], msg["id"][1])] = msg["o"]
    committed = [k for k, v in res.outcomes.items() if v == "committed"]
    assert committed
    res.outcomes[committed[0]] = "aborted"
    tcs = TransactionCoordinators.open(tmp_path, 1, transaction_meta_persist_count=1000)
    try:
        demo._verify(tcs, res)
    finally:
        tcs.close()
    assert len(res.retry_failures) == 1
    assert res.retries_answered == 2 * (len(res.outcomes) - 1)


def test_workload_plan_is_deterministic_mix() -> None:
    from txnstream.workload import plan

    kinds = plan(2000, seed=3)
    assert kinds == plan(2000, seed=3)
    assert {"commit", "abort", "timeout"} == set(kinds)
    assert kinds.count("commit") > kinds.count("abort") > 0
