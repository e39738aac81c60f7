"""kill -9 at every step of the commit path, then recovery (SPEC §4.5 commit path).

A real subprocess (``broker_crash_child.py``) commits one consume-transform-
produce transaction and SIGKILLs itself at a step; the parent reopens the
data directory and checks: a transaction killed before its decision was
durable is aborted (by its timeout: its input is redelivered, its output
never visible); one killed after it is committed exactly once (recovery
finishes the end: output visible once, input acknowledged). Either way no
transaction stays open and no partition stays pinned.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from txnstream import Broker
from txnstream.client import Client, Message

CHILD = Path(__file__).with_name("broker_crash_child.py")
DECIDED = (
    "ending_logged",
    "participants_done",
    "terminated_stored",
    "final_logged",
    "after_commit",
)
STEPS = ("before_commit", *DECIDED)


def drain(client: Client, topic: str, sub: str) -> list[Message]:
    c = client.subscribe(topic, sub)
    out = []
    while (m := c.receive(300)) is not None:
        out.append(m)
    c.close()
    return out


@pytest.mark.parametrize("step", STEPS)
def test_kill_at_commit_step_then_recover(tmp_path: Path, step: str) -> None:
    data = tmp_path / "data"
    with Broker.open(data, registry=None) as b:
        p = b.client().producer("in")
        for v in (b"in-0", b"in-1", b"in-2"):
            p.send(v)
    proc = subprocess.run(
        [sys.executable, str(CHILD), str(data), step],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -9, proc.stdout + proc.stderr
    victim = tuple(json.loads(proc.stdout.splitlines()[0])["victim"])

    started = time.monotonic()
    with Broker.open(data, registry=None) as b:
        client = b.client("check")
        # Recovery resolves everything: a decided end is finished, an open
        # transaction times out (1.5 s) and is aborted.
        while b.admin.open_transactions():
            assert time.monotonic() - started < 60, b.admin.open_transactions()
            time.sleep(0.02)
        assert set(b.admin.read_committed_lag("out").values()) == {0}
        outputs = [m.value for m in drain(client, "out", "audit")]
        consumer = client.subscribe("in", "ctp")
        remaining = []
        while (m := consumer.receive(300)) is not None:
            remaining.append(m.value)
        if step in DECIDED:
            assert outputs == [b"in-0", b"in-1"], (step, victim)
            assert remaining == [b"in-2"]
        else:
            assert outputs == [b"in-0"], (step, victim)
            assert remaining == [b"in-1", b"in-2"]
        info = b.admin.get_transaction(victim)
        assert info.status.name == ("COMMITTED" if step in DECIDED else "ABORTED")
