"""Managed-ledger benchmarks (SPEC §6), side by side with the disk's own limit.

Durable appends of 100-byte entries with 1, 16 and 256 appends in flight
(``append`` / ``append_async`` futures) against a loop of write + fdatasync
of the same record measured in the same run; sequential bandwidth of 64 KiB
entries against a plain write + fsync of the same bytes.

Run: ``.venv/bin/pytest benches/test_ledger.py --benchmark-only``
"""

from __future__ import annotations

import collections
import itertools
import os
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from txnstream import ManagedLedger, Position

SMALL = b"x" * 100
RECORD = 8 + len(SMALL)  # what the ledger writes per 100-byte entry
BIG = os.urandom(64 << 10)
BIG_ENTRIES = 256  # 16 MiB per round
BENCH_DIR = os.environ.get("TXNSTREAM_BENCH_DIR")
# Appends per round, the same in every test of a group so that the
# per-round ratios printed by conftest compare like with like.
N_SMALL = 4_000


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where files go (``TXNSTREAM_BENCH_DIR`` to pick a disk)."""
    if BENCH_DIR:
        d = Path(BENCH_DIR)
        d.mkdir(parents=True, exist_ok=True)
        return d
    return tmp_path_factory.mktemp("ledger-bench")


_names = itertools.count()


@pytest.fixture
def ledger(data_dir: Path) -> Iterator[ManagedLedger]:
    """A fresh managed ledger with default options."""
    ml = ManagedLedger.open(data_dir, f"bench-{os.getpid()}-{next(_names)}")
    yield ml
    ml.close()


def run(benchmark: Any, fn: Callable[[], object], items: int, *, baseline: bool = False) -> None:
    benchmark.extra_info["items"] = items
    if baseline:
        benchmark.extra_info["baseline"] = True
    benchmark.pedantic(fn, rounds=5, iterations=1, warmup_rounds=1)


# -- durable appends of 100-byte entries ------------------------------------


def fdatasync_loop(path: Path, n: int, preallocate: bool) -> Callable[[], None]:
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    if preallocate:
        os.posix_fallocate(fd, 0, 64 << 20)
    off = 0
    rec = b"r" * RECORD

    def loop() -> None:
        nonlocal off
        for _ in range(n):
            os.pwrite(fd, rec, off)
            off += RECORD
            os.fdatasync(fd)

    return loop


@pytest.mark.benchmark(group="durable-append-100B")
def test_baseline_pwrite_fdatasync_preallocated(benchmark: Any, data_dir: Path) -> None:
    """One record, one fdatasync, on a preallocated file: the disk's sync limit."""
    n = N_SMALL
    run(benchmark, fdatasync_loop(data_dir / "prealloc.raw", n, True), n, baseline=True)


@pytest.mark.benchmark(group="durable-append-100B")
def test_baseline_write_fdatasync_growing(benchmark: Any, data_dir: Path) -> None:
    """The same on a growing file (each sync also commits the new size)."""
    n = N_SMALL
    run(benchmark, fdatasync_loop(data_dir / "growing.raw", n, False), n)


@pytest.mark.benchmark(group="durable-append-100B")
def test_append_1_in_flight(benchmark: Any, ledger: ManagedLedger) -> None:
    """``append`` from one thread: the latency of one durable append."""
    n = N_SMALL

    def loop() -> None:
        for _ in range(n):
            ledger.append(SMALL)

    run(benchmark, loop, n)


def windowed(ml: ManagedLedger, n: int, window: int, data: bytes) -> Callable[[], None]:
    def loop() -> None:
        q: collections.deque[Future[Position]] = collections.deque()
        for _ in range(n):
            if len(q) >= window:
                q.popleft().result()
            q.append(ml.append_async(data))
        for f in q:
            f.result()

    return loop


@pytest.mark.parametrize("window", [16, 256])
@pytest.mark.benchmark(group="durable-append-100B")
def test_append_async_in_flight(benchmark: Any, ledger: ManagedLedger, window: int) -> None:
    """``append_async`` futures from one thread, ``window`` kept in flight."""
    run(benchmark, windowed(ledger, N_SMALL, window, SMALL), N_SMALL)


@pytest.mark.benchmark(group="durable-append-100B")
def test_append_many_256(benchmark: Any, ledger: ManagedLedger) -> None:
    """``append_many`` of 256 entries per call (one group commit each)."""
    batch = [SMALL] * 256

    def loop() -> None:
        for _ in range(N_SMALL // 256):
            ledger.append_many(batch)

    run(benchmark, loop, N_SMALL // 256 * 256)


# -- sequential bandwidth, 64 KiB entries -----------------------------------


@pytest.mark.benchmark(group="bandwidth-64KiB")
def test_baseline_sequential_write_fsync(benchmark: Any, data_dir: Path) -> None:
    """Plain 64 KiB writes of the same bytes appended to one file, one fsync
    per round (the ledger too keeps appending to its files)."""
    fd = os.open(data_dir / "seq.raw", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)

    def once() -> None:
        for _ in range(BIG_ENTRIES):
            os.write(fd, BIG)
        os.fsync(fd)

    try:
        run(benchmark, once, BIG_ENTRIES, baseline=True)
    finally:
        os.close(fd)
    benchmark.extra_info["bytes"] = BIG_ENTRIES * len(BIG)


@pytest.mark.benchmark(group="bandwidth-64KiB")
def test_ledger_sequential_64k(benchmark: Any, ledger: ManagedLedger) -> None:
    """The same bytes as durable ledger entries, a round's worth in flight
    (as the baseline has them all in the page cache before its fsync)."""
    run(benchmark, windowed(ledger, BIG_ENTRIES, BIG_ENTRIES, BIG), BIG_ENTRIES)
    benchmark.extra_info["bytes"] = BIG_ENTRIES * len(BIG)
