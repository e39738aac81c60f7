"""Shared snapshot readers (SPEC §4.6): one forward read per namespace, shared, closed in time."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from txnstream import CompactedTopic, ManagedLedger
from txnstream.buffer.snapshot_reader import SnapshotReaders, snapshot_topic
from txnstream.errors import AlreadyClosedError, InvalidArgumentError
from txnstream.proto import AbortTxnMetadata, TransactionBufferSnapshot
from txnstream.testing import ManualClock
from txnstream.timer import TimerService

NS = "public/default"


def snap(topic: str, entry: int, aborted: int = 0) -> bytes:
    s = TransactionBufferSnapshot(
        topic_name=topic, max_read_position_ledgerId=1, max_read_position_entryId=entry
    )
    for i in range(aborted):
        s.abort_txn_metadata.append(
            AbortTxnMetadata(txnid_least_bits=i, txnid_most_bits=0, ledgerId=1, entryId=i)
        )
    return s.SerializeToString()


@pytest.fixture
def env(tmp_path: Path) -> Iterator[tuple[Path, SnapshotReaders, ManualClock, TimerService]]:
    clock = ManualClock()
    timers = TimerService(clock, start=False)
    readers = SnapshotReaders(
        lambda name: ManagedLedger.open(tmp_path, name, read_only=True),
        timers.scope(),
        clock,
        idle_timeout_ms=60_000,
    )
    yield tmp_path, readers, clock, timers
    readers.close()
    timers.close()


def write_snapshots(path: Path, topics: int, rounds: int) -> None:
    with CompactedTopic.open(path, snapshot_topic(NS)) as ct:
        for r in range(rounds):
            ct.put_many([(f"t{t}", snap(f"t{t}", r * 100 + t)) for t in range(topics)])


def test_concurrent_recoveries_read_each_entry_once(
    env: tuple[Path, SnapshotReaders, ManualClock, TimerService],
) -> None:
    path, readers, _, _ = env
    write_snapshots(path, 200, 3)
    with CompactedTopic.open(path, snapshot_topic(NS)) as ct:
        ct.put("t13", None)  # topic deleted: its snapshot too
    answers: dict[str, int | None] = {}
    lock = threading.Lock()
    topics = [f"t{t}" for t in range(200)] + ["no-snapshot-1", "no-snapshot-2"]
    random.Random(1).shuffle(topics)

    def recover(mine: list[str]) -> None:
        reader = readers.acquire(NS)
        try:
            for t in mine:
                s = reader.read(t)
                with lock:
                    answers[t] = None if s is None else s.max_read_position_entryId
        finally:
            reader.release()

    # Hold one user for the whole wave so the reader lives across threads.
    holder = readers.acquire(NS)
    threads = [threading.Thread(target=recover, args=(topics[i::8],)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
        assert not th.is_alive(), "a recovery thread did not finish"
    stats = holder.stats()
    holder.release()
    assert answers["t13"] is None and answers["no-snapshot-1"] is None
    for t in range(200):
        if t != 13:
            assert answers[f"t{t}"] == 200 + t  # the newest of three
    # x, not n*x: every entry of the snapshot topic read exactly once.
    assert stats["entries_read"] == 3 * 200 + 1
    assert stats["answered"] == len(topics)
    assert readers.namespaces() == []  # the last release closed it


def test_snapshots_written_during_recovery_and_topic_deleted(
    env: tuple[Path, SnapshotReaders, ManualClock, TimerService],
) -> None:
    path, readers, _, _ = env
    write_snapshots(path, 5, 1)
    reader = readers.acquire(NS)
    s0 = reader.read("t0")
    assert s0 is not None and s0.max_read_position_entryId == 0
    with CompactedTopic.open(path, snapshot_topic(NS)) as ct:
        ct.put("t1", snap("t1", 999))  # written while recovery runs
        ct.put("t0", snap("t0", 998))  # t0 already recovered: not kept
        ct.put("t2", None)  # t2 deleted
    reader.forget("t3")  # t3 deleted while recovery runs
    s1 = reader.read("t1")
    assert s1 is not None and s1.max_read_position_entryId == 999
    assert reader.read("t2") is None
    assert reader.read("t3") is None
    assert reader.stats()["dropped"] == 1
    reader.release()
    with pytest.raises(AlreadyClosedError):
        reader.read("t4")


def test_reader_closes_after_last_user_and_after_idle_timeout(
    env: tuple[Path, SnapshotReaders, ManualClock, TimerService],
) -> None:
    path, readers, clock, timers = env
    write_snapshots(path, 3, 1)
    a = readers.acquire(NS)
    b = readers.acquire(NS)
    assert a is b and a.users == 2
    assert a.read("t0") is not None
    assert a.is_open
    a.release()
    assert b.is_open  # one user left
    clock.advance(59_999)
    timers.run_due()
    assert b.is_open
    clock.advance(1)
    timers.run_due()
    assert not b.is_open  # idle for 60 s: closed although held
    s = b.read("t1")  # reading again reopens it transparently
    assert s is not None and b.opened == 2
    b.release()
    assert not b.is_open and readers.namespaces() == []


def test_compaction_while_a_reader_is_open_and_close_cancels(
    env: tuple[Path, SnapshotReaders, ManualClock, TimerService],
) -> None:
    path, readers, _, _ = env
    ct = CompactedTopic.open(path, snapshot_topic(NS))
    try:
        for r in range(2):
            ct.put_many([(f"t{t}", snap(f"t{t}", r * 10 + t)) for t in range(4)])
        reader = readers.acquire(NS)
        s0 = reader.read("t0")
        assert s0 is not None and s0.max_read_position_entryId == 10
        ct.put("t1", None)
        ct.compact()  # drops the deletion and rewrites the rest into a new ledger
        assert reader.read("t1") is None  # not the snapshot routed before the deletion
        s2 = reader.read("t2")
        assert s2 is not None and s2.max_read_position_entryId == 12
        assert reader.stats()["restarts"] >= 1
        readers.close()  # a broker closing: the held reader stops
        with pytest.raises(AlreadyClosedError):
            reader.read("t3")
        with pytest.raises(AlreadyClosedError):
            readers.acquire(NS)
    finally:
        ct.close()


def test_namespace_without_snapshot_topic_answers_none(
    env: tuple[Path, SnapshotReaders, ManualClock, TimerService],
) -> None:
    path, readers, _, _ = env
    ManagedLedger.open(path, "other").close()  # a data directory, no snapshot topic
    r = readers.acquire(NS)
    assert r.read("t0") is None and not r.is_open
    write_snapshots(path, 2, 1)  # it appears later: the next read finds it
    s = r.read("t1")
    assert s is not None and s.topic_name == "t1"
    r.release()


def test_bad_input_is_typed(env: tuple[Path, SnapshotReaders, ManualClock, TimerService]) -> None:
    _, readers, clock, timers = env
    with pytest.raises(InvalidArgumentError, match="namespace"):
        readers.acquire("no-slash")
    r = readers.acquire(NS)
    with pytest.raises(InvalidArgumentError, match="topic"):
        r.read("")
    r.release()
    with pytest.raises(InvalidArgumentError, match="idle_timeout_ms"):
        SnapshotReaders(
            lambda n: ManagedLedger.open("x", n), timers.scope(), clock, idle_timeout_ms=0
        )


WRITER = r"""
import sys
from txnstream import CompactedTopic
from txnstream.proto import TransactionBufferSnapshot
path, name = sys.argv[1:3]
with CompactedTopic.open(path, name) as ct:
    print("ready", flush=True)
    n = 0
    while True:
        n += 1
        s = TransactionBufferSnapshot(topic_name=f"t{n % 50}", max_read_position_ledgerId=1,
                                      max_read_position_entryId=n)
        ct.put(f"t{n % 50}", s.SerializeToString())
"""


def test_kill_9_during_snapshot_writes_then_every_answer_is_a_whole_snapshot(
    tmp_path: Path,
) -> None:
    rng = random.Random(4)
    for _ in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path), snapshot_topic(NS)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        threading.Event().wait(rng.uniform(0.05, 0.3))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        clock = ManualClock()
        timers = TimerService(clock, start=False)
        readers = SnapshotReaders(
            lambda n: ManagedLedger.open(tmp_path, n, read_only=True), timers.scope(), clock
        )
        r = readers.acquire(NS)
        with CompactedTopic.open(tmp_path, snapshot_topic(NS), read_only=True) as ct:
            for t in range(50):
                s = r.read(f"t{t}")
                want = ct.get(f"t{t}")
                assert (s is None) == (want is None)
                if s is not None and want is not None:
                    assert s.SerializeToString() == want  # the newest durable one, whole
        r.release()
        readers.close()
        timers.close()


DEMUX_LOCK_CHILD = r"""
import sys, threading
import txnstream._native as n
from txnstream import testing

ct = n.CompactedTopic.open(sys.argv[1], "snap")
ct.put_many([(f"t{i}", b"v%d" % i) for i in range(10)])
ct.close()
ml = n.ManagedLedger.open(sys.argv[1], "snap")
dm = n.SnapshotDemux()
# No forced GIL hand-offs: a thread gives the GIL up only where it blocks or
# releases it, so each waiter below is inside its call when start() returns.
sys.setswitchinterval(1000.0)
testing.hold_fault(ml, "read")
reader = threading.Thread(target=dm.catch_up, args=(ml, 1000))
reader.start()
assert testing.wait_fault_held(ml, "read")  # catch_up holds the demux lock, at a read
done = []
calls = [dm.stats, lambda: dm.take_routed("t1"), lambda: dm.forget("t2")]
waiters = [threading.Thread(target=lambda c=c: done.append(c())) for c in calls]
for w in waiters:
    w.start()
ticks = sum(1 for _ in range(1000))  # Python runs while all three wait
print("ticks", ticks, "finished", len(done), flush=True)
testing.release_fault(ml, "read")
for t in [reader, *waiters]:
    t.join()
print("finished", len(done), flush=True)
ml.close()
"""


def test_demux_calls_wait_for_a_reads_lock_without_the_gil(tmp_path: Path) -> None:
    # stats/take_routed/forget took the demux lock holding the GIL while
    # take/catch_up hold it for a whole read: every Python thread stopped
    # until the read ended (here, the read is held at a gate: a deadlock).
    # The child's timeout only keeps a regression from hanging the run.
    try:
        r = subprocess.run(
            [sys.executable, "-c", DEMUX_LOCK_CHILD, str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"Python threads froze while demux calls waited for its lock: {e.stdout!r}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == ["ticks 1000 finished 0", "finished 3"], r.stdout


def test_demux_catch_up_checks_max_entries(tmp_path: Path) -> None:
    from txnstream._native import SnapshotDemux

    with CompactedTopic.open(tmp_path, "snap") as ct:
        ct.put("t", b"v")
    ml = ManagedLedger.open(tmp_path, "snap", read_only=True)
    dm = SnapshotDemux()
    for bad, match in ((-1, "max_entries must be >= 0, got -1"), (True, "not bool")):
        with pytest.raises(InvalidArgumentError, match=match):
            dm.catch_up(ml, bad)
    assert dm.catch_up(ml, 10)
    ml.close()
