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
import threading
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


# -- many ledgers, one journal -----------------------------------------------
#
# Every ledger of a data directory shares one journal and one group commit,
# so N ledgers with one append in flight each should sync like one ledger
# with N in flight. Counts (journal syncs per append) are reported next to
# the rates: they are stable on a noisy machine, seconds are not.

N_MANY = 4_000


def _syncs(ml: ManagedLedger) -> int:
    return ml.storage_stats()["journal_syncs"]


@pytest.fixture(scope="module")
def many_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("many-ledgers")


@pytest.fixture(scope="module")
def ledgers_1000(many_dir: Path) -> Iterator[list[ManagedLedger]]:
    mls = [ManagedLedger.open(many_dir, f"m/{i}") for i in range(1000)]
    yield mls
    for ml in mls:
        ml.close()


def one_in_flight_each(mls: list[ManagedLedger], n: int) -> Callable[[], None]:
    """Each ledger keeps exactly one ``append_async`` in flight: the next is
    issued from the completion callback of the previous, until ``n``."""

    def loop() -> None:
        lock = threading.Lock()
        issued = 0
        done = threading.Event()
        left = [len(mls)]

        def go(ml: ManagedLedger) -> None:
            nonlocal issued
            with lock:
                if issued >= n:
                    left[0] -= 1
                    if left[0] == 0:
                        done.set()
                    return
                issued += 1
            ml.append_async(SMALL).add_done_callback(lambda _f: go(ml))

        for ml in mls:
            go(ml)
        assert done.wait(120)

    return loop


@pytest.mark.benchmark(group="many-ledgers-100B")
def test_one_ledger_1000_in_flight(benchmark: Any, ledgers_1000: list[ManagedLedger]) -> None:
    """Baseline: one ledger with 1,000 ``append_async`` in flight."""
    ml = ledgers_1000[0]
    before = _syncs(ml)
    run(benchmark, windowed(ml, N_MANY, 1000, SMALL), N_MANY, baseline=True)
    benchmark.extra_info["syncs_per_append"] = (_syncs(ml) - before) / (N_MANY * 6)


@pytest.mark.parametrize("ledgers", [1, 100, 1000])
@pytest.mark.benchmark(group="many-ledgers-100B")
def test_ledgers_one_in_flight_each(
    benchmark: Any, ledgers_1000: list[ManagedLedger], ledgers: int
) -> None:
    """``ledgers`` ledgers of one data directory, one append in flight on each."""
    mls = ledgers_1000[:ledgers]
    before = _syncs(mls[0])
    run(benchmark, one_in_flight_each(mls, N_MANY), N_MANY)
    benchmark.extra_info["syncs_per_append"] = (_syncs(mls[0]) - before) / (N_MANY * 6)


# -- opening a data directory holding many bytes -----------------------------

OPEN_LEDGERS = 1000


@pytest.fixture(scope="module")
def big_dir(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    """1 GiB in 1,000 ledgers (64 MiB in smoke runs with --benchmark-disable),
    closed: the catalog, ledger files and indexes are on disk."""
    smoke = bool(request.config.getoption("benchmark_disable", default=False))
    total = (64 << 20) if smoke else int(os.environ.get("TXNSTREAM_BENCH_OPEN_BYTES", 1 << 30))
    d = tmp_path_factory.mktemp("open-1g")
    entry = os.urandom(16 << 10)
    per_ledger = max(1, total // OPEN_LEDGERS // len(entry))
    mls = [ManagedLedger.open(d, f"open/{i}") for i in range(OPEN_LEDGERS)]
    for _ in range(per_ledger):
        futs = [ml.append_async(entry) for ml in mls]
        for f in futs:
            f.result()
    for ml in mls:
        ml.close()
    (d / "BYTES").write_text(str(per_ledger * len(entry) * OPEN_LEDGERS))
    return d


@pytest.mark.benchmark(group="open-data-directory")
def test_open_1000_ledgers_holding_1gib(benchmark: Any, big_dir: Path) -> None:
    """Open every ledger of the directory and close them again (the store
    recovers once: catalog plus journal tail, never the bytes in ledgers)."""
    stored = int((big_dir / "BYTES").read_text())
    read: list[int] = []
    # I/O counters are process-wide: a ledger elsewhere reads them before.
    probe = ManagedLedger.open(big_dir.parent / f"{big_dir.name}-probe", "probe")

    def once() -> None:
        before = probe.storage_stats()["bytes_read"]
        mls = [ManagedLedger.open(big_dir, f"open/{i}") for i in range(OPEN_LEDGERS)]
        read.append(mls[0].storage_stats()["bytes_read"] - before)
        for ml in mls:
            ml.close()

    try:
        run(benchmark, once, OPEN_LEDGERS)
    finally:
        probe.close()
    benchmark.extra_info["stored_bytes"] = stored
    benchmark.extra_info["bytes_read_at_open"] = max(read)
    benchmark.extra_info["read_fraction"] = max(read) / stored


@pytest.mark.benchmark(group="open-data-directory")
def test_threads_and_descriptors_at_10000_open_ledgers(benchmark: Any, many_dir: Path) -> None:
    """Opening 10,000 ledgers (created once, then reopened idle): threads
    and descriptors of the process while they are all open."""
    names = [f"idle/{i}" for i in range(10_000)]
    # Keeps the data directory open between rounds (the last handle to
    # close would close the whole store).
    keeper = ManagedLedger.open(many_dir, "idle/keeper")
    for ml in [ManagedLedger.open(many_dir, n) for n in names]:
        ml.close()
    counts: dict[str, int] = {}

    def once() -> None:
        mls = [ManagedLedger.open(many_dir, n) for n in names]
        counts["threads"] = len(os.listdir("/proc/self/task"))
        counts["descriptors"] = len(os.listdir("/proc/self/fd"))
        for ml in mls:
            ml.close()

    try:
        run(benchmark, once, len(names))
    finally:
        keeper.close()
    benchmark.extra_info.update(counts)
