"""Snapshot reads of a namespace's topics: one shared reader vs one reader per topic.

Group ``snapshot-recovery-<n>-topics``: a namespace snapshot topic holding 3
snapshots of each of n topics (3n entries, written through a CompactedTopic as
the broker does). Each round answers every topic's newest snapshot:

- baseline, one reader per topic (Pulsar before seed 003): each topic opens its
  own read-only handle and demux and reads the whole topic (n * 3n entries).
  Above ``SNAPSHOT_PER_TOPIC_SAMPLE`` topics (default 1000) only that many topics
  are read and the time is scaled to n (the entry count is exact: each reader
  reads all 3n entries); ``extra_info["extrapolated_from"]`` says so;
- shared: one :class:`SharedSnapshotReader` for the namespace (3n entries).

``extra_info`` records entries read, open descriptors and the peak RSS of the round
(VmHWM, reset before the round). Topic counts: ``SNAPSHOT_TOPICS`` (default
``300``; the RESULTS run uses ``1000,10000``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import procstats
import pytest

from txnstream import CompactedTopic, ManagedLedger
from txnstream._native import SnapshotDemux
from txnstream.buffer.snapshot_reader import SnapshotReaders, snapshot_topic
from txnstream.proto import TransactionBufferSnapshot
from txnstream.testing import ManualClock
from txnstream.timer import TimerService

NS = "public/default"
TOPICS = [int(s) for s in os.environ.get("SNAPSHOT_TOPICS", "300").split(",")]
SAMPLE = int(os.environ.get("SNAPSHOT_PER_TOPIC_SAMPLE", "1000"))
ROUNDS = 3


@pytest.fixture(scope="module", params=TOPICS, ids=lambda n: f"{n}topics")
def namespace(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, int]:
    n: int = request.param
    path = tmp_path_factory.mktemp(f"snap{n}")
    with CompactedTopic.open(path, snapshot_topic(NS)) as ct:
        for r in range(ROUNDS):
            recs = []
            for t in range(n):
                s = TransactionBufferSnapshot(
                    topic_name=f"persistent://{NS}/t{t}",
                    max_read_position_ledgerId=1,
                    max_read_position_entryId=r * n + t,
                )
                recs.append((f"persistent://{NS}/t{t}", s.SerializeToString()))
            for i in range(0, n, 1000):
                ct.put_many(recs[i : i + 1000])
    return path, n


def test_one_reader_per_topic(benchmark: Any, namespace: tuple[Path, int]) -> None:
    path, n = namespace
    benchmark.group = f"snapshot-recovery-{n}-topics"
    sample = min(n, SAMPLE)
    info: dict[str, Any] = {}

    def round_() -> None:
        procstats.peak_reset()
        entries = 0
        fds = 0
        started = time.perf_counter()
        for t in range(sample):
            ml = ManagedLedger.open(path, snapshot_topic(NS), read_only=True)
            d = SnapshotDemux()
            got = d.take(ml, f"persistent://{NS}/t{t}")
            assert got is not None
            entries += d.stats()["entries_read"]
            fds = max(fds, procstats.fds())
            ml.close()
        info.update(
            seconds_measured=time.perf_counter() - started,
            entries_read=entries * n // sample,
            peak_rss_kib=procstats.peak_kib(),
            fds=fds,
        )

    benchmark.pedantic(round_, rounds=1 if n > SAMPLE else 3, iterations=1)
    assert info["entries_read"] == n * ROUNDS * n
    if n > SAMPLE:
        # Timed for `sample` topics (items/s is per measured topic); the time
        # for all n topics is that scaled (each reader reads all 3n entries).
        info["extrapolated_from"] = sample
        info["seconds_all_topics"] = info["seconds_measured"] * n / sample
        benchmark.extra_info.update(items=sample, **info)
    else:
        benchmark.extra_info.update(items=n, baseline=True, **info)


def test_shared_reader(benchmark: Any, namespace: tuple[Path, int]) -> None:
    path, n = namespace
    benchmark.group = f"snapshot-recovery-{n}-topics"
    info: dict[str, Any] = {}

    def round_() -> None:
        procstats.peak_reset()
        clock = ManualClock()
        timers = TimerService(clock, start=False)
        readers = SnapshotReaders(
            lambda name: ManagedLedger.open(path, name, read_only=True), timers.scope(), clock
        )
        reader = readers.acquire(NS)
        fds = 0
        for t in range(n):
            s = reader.read(f"persistent://{NS}/t{t}")
            assert s is not None
            assert s.max_read_position_entryId == (ROUNDS - 1) * n + t
            if t % 1000 == 0:
                fds = max(fds, procstats.fds())
        info.update(
            entries_read=reader.stats()["entries_read"], peak_rss_kib=procstats.peak_kib(), fds=fds
        )
        reader.release()
        readers.close()
        timers.close()

    benchmark.pedantic(round_, rounds=3, iterations=1)
    assert info["entries_read"] == ROUNDS * n
    benchmark.extra_info.update(items=n, **info)
