"""The main job (make demo): CTP workload, kill -9, recovery, exactly-once verification."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from txnstream import demo
from txnstream.broker import Broker
from txnstream.workload import OUTPUTS, broker_config


def test_main_job_passes_on_fresh_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = demo.main(str(tmp_path / "data"), inputs=300, kill_fraction=0.4)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "exactly-once verdict: PASS" in out
    assert "durable waits per commit" in out


def test_refuses_to_delete_a_foreign_directory(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    assert demo.main(str(tmp_path), inputs=10) == 2
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def test_a_data_path_that_is_a_file_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "afile"
    f.write_text("keep me")
    assert demo.main(str(f), inputs=10) == 2
    assert "is not a directory" in capsys.readouterr().out
    assert f.read_text() == "keep me"


def test_a_foreign_audit_directory_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``<data>-audit`` holding files an audit did not write: refused up front, not after a run."""
    pytest.importorskip("pyspark")
    (tmp_path / "data-audit").mkdir()
    (tmp_path / "data-audit" / "precious.txt").write_text("keep me")
    assert demo.main(str(tmp_path / "data"), inputs=10) == 2
    out = capsys.readouterr().out
    assert "data-audit" in out and "an audit did not write" in out
    assert not (tmp_path / "data").exists()
    assert (tmp_path / "data-audit" / "precious.txt").read_text() == "keep me"


def test_an_audit_that_fails_is_a_failure_of_the_run_and_the_report_still_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The steps before the audit are stubbed: only the audit step's failure is under test."""
    from txnstream.errors import StorageError

    def broken(*_args: Any, **_kw: Any) -> None:
        raise StorageError("disk on fire [/x]")

    for step in ("seed", "recover", "verify"):
        monkeypatch.setattr(demo, step, lambda *_a: None)
    monkeypatch.setattr(demo, "_child", lambda *_a: None)
    monkeypatch.setattr(demo, "_follow", lambda *_a: None)
    monkeypatch.setattr(demo, "audit", broken)
    assert demo.main(str(tmp_path / "data"), inputs=10) == 1
    out = capsys.readouterr().out
    assert "the audit failed: StorageError: disk on fire [/x]" in out
    assert "exactly-once verdict: FAIL" in out


def test_verifier_detects_a_duplicate_and_a_missing_output(tmp_path: Path) -> None:
    # A finished run, then one output is written twice and an input's outputs
    # are missing from the other topic (read_committed sees only what the
    # outputs say): the verification must fail, naming both.
    data = tmp_path / "data"
    demo._prepare(data)
    run = demo.Run(inputs=5)
    demo.seed(data, 5)
    with Broker.open(data, broker_config()) as broker:
        client = broker.client("planted")
        a, b = (client.producer(t) for t in OUTPUTS)
        for i in range(5):
            a.send(b"x", key=f"in-{i}", properties={"source": f"in-{i}"})
            if i != 3:
                b.send(b"x", key=f"in-{i}", properties={"source": f"in-{i}"})
        a.send(b"x", key="in-1", properties={"source": "in-1"})
        inputs = client.subscribe(demo.INPUT, demo.SUBSCRIPTION)
        for m in inputs.receive_many(10, timeout_ms=2000):
            inputs.ack(m)
    demo.verify(data, run)
    assert any("1 inputs duplicated" in f and "in-1" in f for f in run.failures), run.failures
    assert any("1 inputs missing" in f and "in-3" in f for f in run.failures), run.failures
    assert run.backlog == 0


def test_a_hung_workload_child_fails_the_job_instead_of_hanging_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import subprocess
    import sys

    from rich.console import Console
    from rich.progress import Progress

    monkeypatch.setattr(demo, "CHILD_DEADLINE_S", 0.5)
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"], stdout=subprocess.PIPE, text=True
    )
    run = demo.Run(inputs=10)
    with Progress(console=Console(quiet=True)) as progress:
        demo._follow(child, run, progress, progress.add_task("x", total=10), None)
    assert child.returncode is not None  # killed, reaped
    assert any("ran past" in f for f in run.failures), run.failures
