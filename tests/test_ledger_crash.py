"""kill -9 a process appending under load; every acknowledged entry survives."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import storage_crash_child
from tests.ledger_crash_child import payload
from txnstream import ManagedLedger, Position

CHILD = Path(__file__).with_name("ledger_crash_child.py")
MANY_CHILD = Path(__file__).with_name("storage_crash_child.py")
NAME = "crash/topic"


def crash_round(data: Path, rnd: int, rng: random.Random) -> dict[Position, tuple[int, int]]:
    """Runs the child until it acknowledged some appends, SIGKILLs it mid-load."""
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), str(data), NAME, str(rnd)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    want = rng.randint(20, 1500)
    acked: dict[Position, tuple[int, int]] = {}
    buf = b""
    deadline = time.monotonic() + 30
    fd = proc.stdout.fileno()
    while len(acked) < want and time.monotonic() < deadline:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            r, s, lid, eid = map(int, line.split())
            acked[Position(lid, eid)] = (r, s)
    time.sleep(rng.random() * 0.01)
    proc.send_signal(signal.SIGKILL)
    # Lines written before the kill were acknowledged too.
    rest, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL, err.decode()
    for line in (buf + rest).split(b"\n"):
        if line.count(b" ") == 3:
            r, s, lid, eid = map(int, line.split())
            acked[Position(lid, eid)] = (r, s)
    assert acked, err.decode()
    return acked


def run_rounds(data: Path, rounds: int, seed: int) -> None:
    rng = random.Random(seed)
    all_acked: dict[Position, tuple[int, int]] = {}
    for rnd in range(rounds):
        acked = crash_round(data, rnd, rng)
        # A position is never handed out twice.
        assert not set(acked) & set(all_acked)
        all_acked.update(acked)
        with ManagedLedger.open(data, NAME) as ml:
            first = min(all_acked)
            stored = dict(ml.read_range(first, (2**64 - 1, 2**64 - 1)))
            for pos, (r, s) in all_acked.items():
                assert stored.get(pos) == payload(r, s), (rnd, pos, r, s)


def test_kill9_while_appending(tmp_path: Path) -> None:
    run_rounds(tmp_path, rounds=4, seed=1)


@pytest.mark.slow
def test_kill9_while_appending_many_rounds(tmp_path: Path) -> None:
    run_rounds(tmp_path, rounds=50, seed=2)


LEDGERS = 24


def many_round(data: Path, rnd: int, rng: random.Random) -> dict[tuple[int, Position], int]:
    """Runs the many-ledger child, SIGKILLs it mid-load; its acknowledgements."""
    proc = subprocess.Popen(
        [sys.executable, str(MANY_CHILD), str(data), str(LEDGERS), str(rnd)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    want = rng.randint(50, 3000)
    acked: dict[tuple[int, Position], int] = {}
    buf = b""
    deadline = time.monotonic() + 30
    fd = proc.stdout.fileno()
    while len(acked) < want and time.monotonic() < deadline:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            _, k, s, lid, eid = map(int, line.split())
            acked[(k, Position(lid, eid))] = s
    time.sleep(rng.random() * 0.01)
    proc.send_signal(signal.SIGKILL)
    rest, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL, err.decode()
    for line in (buf + rest).split(b"\n"):
        if line.count(b" ") == 4:
            _, k, s, lid, eid = map(int, line.split())
            acked[(k, Position(lid, eid))] = s
    assert acked, err.decode()
    return acked


def run_many_rounds(data: Path, rounds: int, seed: int) -> None:
    rng = random.Random(seed)
    all_acked: dict[tuple[int, Position], tuple[int, int]] = {}
    for rnd in range(rounds):
        acked = many_round(data, rnd, rng)
        assert not set(acked) & set(all_acked), "a position was handed out twice"
        all_acked.update({key: (rnd, s) for key, s in acked.items()})
        for k in range(LEDGERS):
            with ManagedLedger.open(data, f"crash/t{k}") as ml:
                first = ml.first_position
                mine = {p: v for (kk, p), v in all_acked.items() if kk == k}
                if not mine:
                    continue
                assert first is not None, (rnd, k)
                stored = dict(ml.read_range(first, (2**64 - 1, 2**64 - 1)))
                for pos, (r, s) in mine.items():
                    if k == 0 and pos < first:
                        continue  # trimmed after its cursor passed it
                    assert stored.get(pos) == storage_crash_child.payload(r, k, s), (rnd, k, pos)


def test_kill9_with_many_ledgers_appending(tmp_path: Path) -> None:
    run_many_rounds(tmp_path, rounds=4, seed=3)


@pytest.mark.slow
def test_kill9_with_many_ledgers_many_rounds(tmp_path: Path) -> None:
    run_many_rounds(tmp_path, rounds=40, seed=4)
