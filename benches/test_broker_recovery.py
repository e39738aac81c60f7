"""Broker recovery of n topics in one namespace: shared snapshot reader vs one reader per topic.

Group ``broker-recovery-<n>-topics``. The data directory holds n topics of
one namespace, each with several snapshots (3 rounds of sends, each followed
by a snapshot of every topic: 3n entries in the snapshot topic) and a short
ledger tail after its last snapshot (2 entries; the close-time snapshot is
suppressed, as after a crash). Each round opens a broker on it and recovers
every topic (transaction buffer and deduplication from the snapshot, then the
tail, then reconciliation) on the same bounded pool of
``BROKER_RECOVERY_THREADS`` threads (default 4):

- baseline, one reader per topic (Pulsar before seed 003): each topic opens
  its own reader and reads the whole snapshot topic (n * 3n entries). Above
  ``BROKER_RECOVERY_SAMPLE`` topics (default 500) only that many topics are
  recovered and the time is scaled to n (each topic's cost does not depend on
  the others'; the entry count is exact); ``extra_info["extrapolated_from"]``
  says so;
- shared: ``topicRecoveryMode=eager``, the broker's own wave through one
  shared reader for the namespace (3n entries).

``extra_info`` records snapshot entries read, ledger entries replayed, topics
recovered from a snapshot, open descriptors (sampled every 5 ms) and the peak
RSS of the round (VmHWM, reset first). Topic counts: ``BROKER_RECOVERY_TOPICS``
(default ``200``; the RESULTS run uses ``1000,10000``).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from txnstream import Broker, BrokerConfig
from txnstream.broker.recovery import TopicRecovery
from txnstream.broker.topic_name import TopicName
from txnstream.buffer.snapshot_reader import SnapshotReaders
from txnstream.proto import TransactionBufferSnapshot

TOPICS = [int(s) for s in os.environ.get("BROKER_RECOVERY_TOPICS", "200").split(",")]
SAMPLE = int(os.environ.get("BROKER_RECOVERY_SAMPLE", "500"))
THREADS = int(os.environ.get("BROKER_RECOVERY_THREADS", "4"))
SNAPSHOT_ROUNDS = 3
ROUNDS = 3


def _peak_reset() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM (the peak RSS) to the current RSS
    except OSError:
        pass


def _peak_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


class _FdSampler:
    """The most descriptors open at once while it runs (sampled)."""

    def __init__(self) -> None:
        self.peak = _fds()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _fds())

    def __enter__(self) -> _FdSampler:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, _fds())


class PerTopicReaderBroker(Broker):
    """The baseline: every topic reads the snapshot topic with a reader of its own."""

    per_topic_entries_read = 0
    _count_lock = threading.Lock()

    def _snapshot_of(self, tn: TopicName) -> TransactionBufferSnapshot | None:
        own = SnapshotReaders(self._open_ledger_ro, self._scope, self._clock)
        reader = own.acquire(tn.namespace_name)
        try:
            snap = reader.read(tn.full)
            with self._count_lock:
                self.per_topic_entries_read += reader.stats().get("entries_read", 0)
            return snap
        finally:
            reader.release()  # the only user: the reader and what it read are dropped
            own.close()


def _build(path: Path, n: int) -> list[str]:
    cfg = BrokerConfig(tb_snapshot_max_changes=1 << 30, tb_snapshot_min_time_ms=1 << 40)
    names = [TopicName.parse(f"public/bench/t{i}").full for i in range(n)]
    with Broker.open(path, cfg, registry=None) as b:
        client = b.client("w")
        producers = [client.producer(name, name="p") for name in names]
        for r in range(SNAPSHOT_ROUNDS):
            for p in producers:
                p.send(b"r%d" % r)
            assert b.write_snapshots(due_only=False) == n
        for p in producers:
            p.send(b"tail-1")
            p.send(b"tail-2")
        for t in b.loaded_topics():
            t.tb.changes = 0  # no snapshot on close: the tail stays, as after a crash
    return names


@pytest.fixture(scope="module", params=TOPICS, ids=lambda n: f"{n}-topics")
def directory(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    n: int = request.param
    path = tmp_path_factory.mktemp(f"recovery-{n}") / "data"
    started = time.monotonic()
    names = _build(path, n)
    yield n, path, names, time.monotonic() - started
    shutil.rmtree(path.parent, ignore_errors=True)


def _check(b: Broker, names: list[str]) -> None:
    for name in names[:: max(1, len(names) // 50)]:
        t = b.topic(name)
        assert t.recovery["from_snapshot"] == 1, t.recovery
        assert t.recovery["entries"] == 2, t.recovery
        assert t.dedup.last_sequence_id("p") == SNAPSHOT_ROUNDS + 1


#: Seconds for all n topics with one reader per topic (scaled from the sample).
_PER_TOPIC_SECONDS: dict[int, float] = {}


def test_recovery_one_reader_per_topic(benchmark: Any, directory: Any) -> None:
    n, path, names, _ = directory
    sample = names if n <= SAMPLE else names[:SAMPLE]
    info: dict[str, Any] = {}
    benchmark.group = f"broker-recovery-{n}-topics"

    def round_() -> None:
        _peak_reset()
        with _FdSampler() as fds:
            b = PerTopicReaderBroker.open(path, registry=None)
            assert isinstance(b, PerTopicReaderBroker)
            try:
                started = time.perf_counter()
                wave = TopicRecovery(sample, b.topic, THREADS)
                wave.start()
                assert wave.wait(3_600_000)
                seconds = time.perf_counter() - started
                st = wave.status()
                assert st["recovered"] == len(sample), st
                _check(b, sample)
                info.update(
                    seconds_measured=seconds,
                    seconds_all_topics=seconds * n / len(sample),
                    snapshot_entries_read=b.per_topic_entries_read * n // len(sample),
                    entries_replayed=b.recovery_status()["entries_replayed"] * n // len(sample),
                )
                for t in b.loaded_topics():
                    t.tb.changes = 0  # leave the directory as it was
            finally:
                b.close()
        info.update(fds=fds.peak, peak_rss_kib=_peak_kib())

    benchmark.pedantic(round_, rounds=1 if n > SAMPLE else ROUNDS, iterations=1)
    assert info["snapshot_entries_read"] == n * SNAPSHOT_ROUNDS * n
    _PER_TOPIC_SECONDS[n] = info["seconds_all_topics"]
    if len(sample) < n:
        # Timed for the sample (the group's ratio table compares medians, so this
        # row is not its baseline); the shared row carries the scaled ratio.
        info["extrapolated_from"] = len(sample)
        benchmark.extra_info.update(items=len(sample), threads=THREADS, **info)
    else:
        benchmark.extra_info.update(items=n, baseline=True, threads=THREADS, **info)


def test_recovery_shared_reader(benchmark: Any, directory: Any) -> None:
    n, path, names, build_s = directory
    info: dict[str, Any] = {}
    benchmark.group = f"broker-recovery-{n}-topics"
    cfg = BrokerConfig(topic_recovery="eager", topic_recovery_threads=THREADS)
    seconds: list[float] = []

    def round_() -> None:
        _peak_reset()
        with _FdSampler() as fds:
            started = time.perf_counter()
            b = Broker.open(path, cfg, registry=None)
            try:
                assert b.wait_recovered(3_600_000)
                seconds.append(time.perf_counter() - started)
                st = b.recovery_status()
                assert st["recovered"] == n, st
                assert st["failed"] == 0, st
                assert st["from_snapshot"] == n
                _check(b, names)
                info.update(
                    snapshot_entries_read=st["snapshot_entries_read"],
                    entries_replayed=st["entries_replayed"],
                )
                for t in b.loaded_topics():
                    t.tb.changes = 0
            finally:
                b.close()
        info.update(fds=fds.peak, peak_rss_kib=_peak_kib())

    benchmark.pedantic(round_, rounds=1 if n > SAMPLE else ROUNDS, iterations=1)
    assert info["snapshot_entries_read"] == SNAPSHOT_ROUNDS * n
    median = sorted(seconds)[len(seconds) // 2]
    if n in _PER_TOPIC_SECONDS:
        info["x_faster_than_per_topic"] = round(_PER_TOPIC_SECONDS[n] / median, 1)
    benchmark.extra_info.update(
        items=n, threads=THREADS, build_seconds=round(build_s, 1), seconds=median, **info
    )
