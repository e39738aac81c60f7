"""Broker recovery of n topics in one namespace: shared snapshot reader vs one reader per topic.

Group ``broker-recovery-<n>-topics``. The data directory holds n topics of
one namespace, each with several snapshots (3 rounds of sends, each followed
by a snapshot of every topic: x = 3n entries in the snapshot topic, fewer
once the broker compacted it, as it does past 4096 + 2n records) and a short
ledger tail after its last snapshot (2 entries; the close-time snapshot is
suppressed, as after a crash). Each round opens a broker on it and recovers
every topic (transaction buffer and deduplication from the snapshot, then the
tail, then reconciliation) on the same bounded pool of
``BROKER_RECOVERY_THREADS`` threads (default 4):

- baseline, one reader per topic (Pulsar before seed 003): each topic opens
  its own reader and reads the whole snapshot topic (n * x entries). Above
  ``BROKER_RECOVERY_SAMPLE`` topics (default 500) only that many topics are
  recovered and the time is scaled to n (each topic's cost does not depend on
  the others'; the entry count is exact); ``extra_info["extrapolated_from"]``
  says so;
- shared: ``topicRecoveryMode=eager``, the broker's own wave through one
  shared reader for the namespace (x entries).

Each recovery runs in a fresh process (so its peak RSS and descriptors are
its own, not the builder's); ``extra_info`` records the recovery's own seconds
(the benchmark's time also counts the process start), snapshot entries read,
ledger entries replayed, open descriptors (sampled every 5 ms) and the peak
RSS of the process (VmHWM). Topic counts: ``BROKER_RECOVERY_TOPICS``
(default ``200``; the RESULTS run uses ``1000,10000``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import procstats
import pytest

from txnstream import Broker, BrokerConfig, ManagedLedger
from txnstream.broker.recovery import TopicRecovery
from txnstream.broker.topic_name import TopicName
from txnstream.buffer.snapshot_reader import SnapshotReaders, snapshot_topic
from txnstream.proto import TransactionBufferSnapshot

TOPICS = [int(s) for s in os.environ.get("BROKER_RECOVERY_TOPICS", "200").split(",")]
SAMPLE = int(os.environ.get("BROKER_RECOVERY_SAMPLE", "500"))
THREADS = int(os.environ.get("BROKER_RECOVERY_THREADS", "4"))
SNAPSHOT_ROUNDS = 3
ROUNDS = 3


class _FdSampler:
    """The most descriptors open at once while it runs (sampled)."""

    def __init__(self) -> None:
        self.peak = procstats.fds()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, procstats.fds())

    def __enter__(self) -> _FdSampler:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, procstats.fds())


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


def _build(path: Path, n: int) -> tuple[list[str], int]:
    """The directory; returns the topic names and the snapshot topic's entry count."""
    cfg = BrokerConfig(tb_snapshot_max_changes=1 << 30, tb_snapshot_min_time_ms=1 << 40)
    names = [TopicName.parse(f"public/bench/t{i}").full for i in range(n)]
    with Broker.open(path, cfg, registry=None) as b:
        client = b.client("w")
        producers = [client.producer(name, name="p") for name in names]
        for r in range(SNAPSHOT_ROUNDS):
            for f in [p.send_async(b"r%d" % r) for p in producers]:
                f.result()
            assert b.write_snapshots(due_only=False) == n
        for tail in (b"tail-1", b"tail-2"):
            for f in [p.send_async(tail) for p in producers]:
                f.result()
        for t in b.loaded_topics():
            t.tb.changes = 0  # no snapshot on close: the tail stays, as after a crash
    # The snapshot topic may have been compacted meanwhile (as in production).
    ml = ManagedLedger.open(path, snapshot_topic("public/bench"), read_only=True)
    entries = ml.entry_count()
    ml.close()
    return names, entries


@pytest.fixture(scope="module", params=TOPICS, ids=lambda n: f"{n}-topics")
def directory(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    n: int = request.param
    path = tmp_path_factory.mktemp(f"recovery-{n}") / "data"
    started = time.monotonic()
    names, entries = _build(path, n)
    yield n, path, names, entries, time.monotonic() - started
    shutil.rmtree(path.parent, ignore_errors=True)


def _check(b: Broker, names: list[str]) -> None:
    for name in names[:: max(1, len(names) // 50)]:
        t = b.topic(name)
        assert t.recovery["from_snapshot"] == 1, t.recovery
        assert t.recovery["entries"] == 2, t.recovery
        assert t.dedup.last_sequence_id("p") == SNAPSHOT_ROUNDS + 1


def _recover(path: Path, mode: str, names: list[str]) -> dict[str, Any]:
    """One recovery (in a fresh process: RSS and descriptors are its own); its figures."""
    procstats.peak_reset()
    with _FdSampler() as fds:
        if mode == "shared":
            cfg = BrokerConfig(topic_recovery="eager", topic_recovery_threads=THREADS)
            started = time.perf_counter()
            b = Broker.open(path, cfg, registry=None)
            assert b.wait_recovered(3_600_000)
            seconds = time.perf_counter() - started
            st = b.recovery_status()
            entries_read = st["snapshot_entries_read"]
        else:
            started = time.perf_counter()  # from open, as the shared mode
            pb = PerTopicReaderBroker.open(path, registry=None)
            assert isinstance(pb, PerTopicReaderBroker)
            b = pb
            wave = TopicRecovery(names, b.topic, THREADS)
            wave.start()
            assert wave.wait(3_600_000)
            seconds = time.perf_counter() - started
            st = wave.status()
            entries_read = pb.per_topic_entries_read
        try:
            assert st["recovered"] == len(names), st
            assert st["failed"] == 0, st
            _check(b, names)
            out = {
                "seconds": seconds,
                "recovered": st["recovered"],
                "snapshot_entries_read": entries_read,
                "entries_replayed": b.recovery_status()["entries_replayed"],
            }
            for t in b.loaded_topics():
                t.tb.changes = 0  # leave the directory as it was
        finally:
            b.close()
    out.update(fds=fds.peak, peak_rss_kib=procstats.peak_kib())
    return out


def _in_child(path: Path, mode: str, names: list[str]) -> dict[str, Any]:
    names_file = path.parent / f"names-{mode}.json"
    names_file.write_text(json.dumps(names))
    cmd = [sys.executable, __file__, str(path), mode, str(names_file)]
    env = dict(os.environ, BROKER_RECOVERY_THREADS=str(THREADS))
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


#: Seconds for all n topics with one reader per topic (scaled from the sample).
_PER_TOPIC_SECONDS: dict[int, float] = {}


def test_recovery_one_reader_per_topic(benchmark: Any, directory: Any) -> None:
    n, path, names, x, _ = directory
    sample = names if n <= SAMPLE else names[:SAMPLE]
    info: dict[str, Any] = {}
    benchmark.group = f"broker-recovery-{n}-topics"
    seconds: list[float] = []

    def round_() -> None:
        got = _in_child(path, "per-topic", sample)
        seconds.append(got.pop("seconds"))
        got["snapshot_entries_read"] = got["snapshot_entries_read"] * n // len(sample)
        got["entries_replayed"] = got["entries_replayed"] * n // len(sample)
        info.update(got)

    benchmark.pedantic(round_, rounds=1 if n > SAMPLE else ROUNDS, iterations=1)
    median = sorted(seconds)[len(seconds) // 2]
    info.update(seconds_measured=median, seconds_all_topics=median * n / len(sample))
    assert info["snapshot_entries_read"] == n * x  # each reader reads all x entries
    _PER_TOPIC_SECONDS[n] = info["seconds_all_topics"]
    if len(sample) < n:
        # Timed for the sample (the group's ratio table compares medians, so this
        # row is not its baseline); the shared row carries the scaled ratio.
        info["extrapolated_from"] = len(sample)
        benchmark.extra_info.update(items=len(sample), threads=THREADS, **info)
    else:
        benchmark.extra_info.update(items=n, baseline=True, threads=THREADS, **info)


def test_recovery_shared_reader(benchmark: Any, directory: Any) -> None:
    n, path, names, x, build_s = directory
    info: dict[str, Any] = {}
    benchmark.group = f"broker-recovery-{n}-topics"
    seconds: list[float] = []

    def round_() -> None:
        got = _in_child(path, "shared", names)
        seconds.append(got.pop("seconds"))
        info.update(got)

    benchmark.pedantic(round_, rounds=1 if n > SAMPLE else ROUNDS, iterations=1)
    assert info["snapshot_entries_read"] == x  # each entry once
    median = sorted(seconds)[len(seconds) // 2]
    if n in _PER_TOPIC_SECONDS:
        info["x_faster_than_per_topic"] = round(_PER_TOPIC_SECONDS[n] / median, 1)
    benchmark.extra_info.update(
        items=n, threads=THREADS, build_seconds=round(build_s, 1), seconds=median, **info
    )


if __name__ == "__main__":
    # The child of `_in_child`: DATA_DIR MODE NAMES_JSON -> one JSON line of figures.
    _names = json.loads(Path(sys.argv[3]).read_text())
    print(json.dumps(_recover(Path(sys.argv[1]), sys.argv[2], _names)))
