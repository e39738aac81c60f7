"""Transaction-buffer snapshots, recovery from snapshot plus tail, and eager recovery (issue 11)."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest

from txnstream import Broker, BrokerConfig
from txnstream._native import CompactedTopic, ManagedLedger, Position
from txnstream.broker.dedup import Deduplication
from txnstream.broker.topic_name import TopicName
from txnstream.buffer import TransactionBuffer
from txnstream.buffer.snapshot_reader import snapshot_topic
from txnstream.client import Transaction
from txnstream.coordinator import TxnID
from txnstream.errors import InvalidArgumentError, TxnStreamError
from txnstream.proto import AbortTxnMetadata, TransactionBufferSnapshot
from txnstream.testing import wait_until


class _NoOutcomes:
    """Recovery alone never asks the coordinators (reconcile does)."""

    def low_water_mark(self, tc_id: int) -> int:
        return -1

    def participant_outcome(self, txn_id: TxnID) -> bool | None:
        raise AssertionError("recovery must not ask for outcomes")


def _snapshot(path: Path, partition: str) -> TransactionBufferSnapshot | None:
    ns = TopicName.parse(partition).namespace_name
    with CompactedTopic.open(path, snapshot_topic(ns), read_only=True) as t:
        raw = t.get(partition)
    if raw is None:
        return None
    snap = TransactionBufferSnapshot()
    snap.ParseFromString(raw)
    return snap


def _recovered(
    path: Path, partition: str, snap: TransactionBufferSnapshot | None
) -> tuple[TransactionBuffer, Deduplication, dict[str, int]]:
    """A read-only recovery of ``partition``: from ``snap`` plus the tail, or all of it."""
    ml = ManagedLedger.open(path, partition, read_only=True)
    tb = TransactionBuffer(partition, ml, _NoOutcomes())
    dedup = Deduplication()
    if snap is not None:
        dedup.restore(snap)
    counts = tb.recover(
        lambda pos, producer, seqs, txn: dedup.replayed(producer, seqs, txn, pos), snap
    )
    return tb, dedup, counts


def _dedup_state(d: Deduplication) -> dict[str, tuple[int, dict[int, Any]]]:
    return {
        name: (p.last, {seq: (s.entry, s.index, s.size, s.txn) for seq, s in p.window.items()})
        for name, p in d._producers.items()
    }


def _random_workload(b: Broker, rng: random.Random, rounds: int) -> list[Transaction]:
    """Sends in and out of transactions on 3 partitions; commits, aborts, some left open.

    Snapshots are written at random points in between. Returns the open ones.
    """
    client = b.client("w")
    b.create_topic("multi", 2)
    topics = ["a", "multi", "other/ns/c"]
    producers = [client.producer(t, name=f"p{i}") for i, t in enumerate(topics) for _ in (0,)]
    producers += [client.producer("a", name="p-extra")]
    open_txns: list[Transaction] = []
    for r in range(rounds):
        roll = rng.random()
        if roll < 0.3:
            rng.choice(producers).send(b"plain-%d" % r, key=f"k{rng.randrange(4)}")
        else:
            txn = client.transaction(timeout_ms=600_000)
            for _ in range(rng.randrange(1, 4)):
                rng.choice(producers).send(b"t-%d" % r, key=f"k{rng.randrange(4)}", txn=txn)
            end = rng.random()
            if end < 0.55:
                txn.commit()
            elif end < 0.9:
                txn.abort()
            else:
                open_txns.append(txn)
        if rng.random() < 0.08:
            b.write_snapshots(due_only=False)
    return open_txns


def _partitions(b: Broker) -> list[str]:
    return [tn.full for base, _ in b.topic_names() for tn in b.partition_names(base)]


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_snapshot_plus_tail_equals_full_replay(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    b = Broker.open(tmp_path, registry=None)
    try:
        open_txns = _random_workload(b, rng, 120)
        partitions = _partitions(b)
        used = 0
        for part in partitions:
            snap = _snapshot(tmp_path, part)
            full_tb, full_dedup, full_counts = _recovered(tmp_path, part, None)
            assert full_counts["from_snapshot"] == 0
            if snap is None:
                continue
            used += 1
            tb, dedup, counts = _recovered(tmp_path, part, snap)
            assert counts["from_snapshot"] == 1
            assert counts["entries"] <= full_counts["entries"]
            assert tb.ongoing == full_tb.ongoing, part
            assert tb.aborted == full_tb.aborted, part
            assert tb.read_limit == full_tb.read_limit, part
            assert tb.max_read_position == full_tb.max_read_position, part
            # Deduplication: the same highest ids; every remembered message where the full
            # replay has it (the snapshot keeps each producer's most recent ones).
            snap_state, full_state = _dedup_state(dedup), _dedup_state(full_dedup)
            assert {k: v[0] for k, v in snap_state.items()} == {
                k: v[0] for k, v in full_state.items()
            }
            for name, (_, window) in snap_state.items():
                for seq, where in window.items():
                    assert full_state[name][1][seq] == where, (part, name, seq)
            # And the live broker agrees with both.
            live = b.topic(part).tb
            with live.lock:
                assert dict(live.ongoing) == full_tb.ongoing
                assert live.aborted == full_tb.aborted
        assert used >= 2, "the workload wrote too few snapshots to compare"
        for txn in open_txns:
            txn.abort()
    finally:
        b.close()


def test_clean_close_snapshots_every_changed_partition_and_reopen_replays_nothing(
    tmp_path: Path,
) -> None:
    with Broker.open(tmp_path, registry=None) as b:
        client = b.client("c")
        p = client.producer("t", name="p")
        ids = [p.send(b"%d" % i) for i in range(5)]
        with client.transaction() as txn:
            p.send(b"in-txn", txn=txn)
        aborted = client.transaction()
        p.send(b"aborted", txn=aborted)
        aborted.abort()
        pending = client.transaction(timeout_ms=600_000)
        p.send(b"left open", txn=pending)
        limit_before = b.topic("t").tb.max_read_position
    snap = _snapshot(tmp_path, "persistent://public/default/t")
    assert snap is not None and snap.dedup_complete
    assert len(snap.abort_txn_metadata) == 1
    assert snap.producer_sequences[0].producer_name == "p"
    with Broker.open(tmp_path, registry=None) as b:
        t = b.topic("t")
        assert t.recovery["from_snapshot"] == 1
        # Only the open transaction's message and what follows it are replayed.
        assert t.recovery["entries"] == 1
        assert t.tb.max_read_position == limit_before
        assert len(t.tb.aborted) == 1
        p = b.client("c").producer("t", name="p")
        assert p.send(b"1", sequence_id=1) == ids[1]  # the original id, from the snapshot
        assert b.recovery_status()["from_snapshot"] == 1


def test_snapshot_after_crash_plus_tail_keeps_dedup(tmp_path: Path) -> None:
    cfg = BrokerConfig(tb_snapshot_max_changes=1_000_000, tb_snapshot_min_time_ms=1 << 40)
    b = Broker.open(tmp_path, cfg, registry=None)
    p = b.client("c").producer("t", name="p")
    before = [p.send(b"%d" % i) for i in range(3)]
    assert b.write_snapshots(due_only=False) == 1
    after = [p.send(b"%d" % i) for i in range(3, 6)]
    # A crash: the broker is dropped without close (no snapshot on close), then
    # the directory is reopened by a fresh process image (read-only recovery).
    snap = _snapshot(tmp_path, "persistent://public/default/t")
    assert snap is not None
    _, dedup, counts = _recovered(tmp_path, "persistent://public/default/t", snap)
    assert counts == {
        "entries": 3,
        "markers": 0,
        "committed": 0,
        "ongoing": 0,
        "aborted": 0,
        "from_snapshot": 1,
        "aborted_trimmed": 0,
    }
    assert dedup.last_sequence_id("p") == 5
    for seq, mid in enumerate(before + after):
        sent = dedup._producers["p"].window[seq]
        assert sent.entry is not None
        assert (sent.entry.ledger_id, sent.entry.entry_id) == (mid.ledger_id, mid.entry_id)
    b.close()


def test_snapshot_that_does_not_fit_is_not_used(tmp_path: Path) -> None:
    with Broker.open(tmp_path, registry=None) as b:
        p = b.client().producer("t", name="p")
        for i in range(4):
            p.send(b"%d" % i)
    part = "persistent://public/default/t"
    ml = ManagedLedger.open(tmp_path, part, read_only=True)
    end = ml.last_position
    assert end is not None
    ml.close()
    bad_cases = [
        TransactionBufferSnapshot(topic_name="persistent://public/default/other"),
        TransactionBufferSnapshot(
            topic_name=part,
            max_read_position_ledgerId=end.ledger_id,
            max_read_position_entryId=end.entry_id + 5,
        ),
        TransactionBufferSnapshot(topic_name=part, max_read_position_ledgerId=end.ledger_id),
    ]
    for bad in bad_cases:
        tb = TransactionBuffer(
            part, ManagedLedger.open(tmp_path, part, read_only=True), _NoOutcomes()
        )
        with pytest.raises(ValueError, match=r"snapshot|max_read_position"):
            tb.recover(None, bad)
    # Through the broker: a snapshot without deduplication state is replaced by a full replay.
    ns = "public/default"
    with CompactedTopic.open(tmp_path, snapshot_topic(ns), write_only=True) as w:
        w.put(part, TransactionBufferSnapshot(topic_name=part).SerializeToString())
    with Broker.open(tmp_path, registry=None) as b:
        t = b.topic("t")
        assert t.recovery["from_snapshot"] == 0 and t.recovery["entries"] == 4
        assert b.client().producer("t", name="p").send(b"2", sequence_id=2).entry_id == 2


def test_aborted_transactions_of_trimmed_ledgers_leave_the_set(tmp_path: Path) -> None:
    with Broker.open(tmp_path, BrokerConfig(max_entries_per_ledger=2), registry=None) as b:
        p = b.client().producer("t", name="p")
        for i in range(6):
            p.send(b"%d" % i)
    part = "persistent://public/default/t"
    ml = ManagedLedger.open(tmp_path, part, read_only=True)
    first = ml.first_position
    assert first is not None and first.ledger_id > 0
    snap = TransactionBufferSnapshot(topic_name=part)
    # One abort whose marker lies before the first ledger (trimmed), one inside.
    snap.abort_txn_metadata.append(
        AbortTxnMetadata(txnid_most_bits=0, txnid_least_bits=1, ledgerId=0, entryId=0)
    )
    snap.abort_txn_metadata.append(
        AbortTxnMetadata(
            txnid_most_bits=0,
            txnid_least_bits=2,
            ledgerId=first.ledger_id,
            entryId=first.entry_id,
        )
    )
    tb = TransactionBuffer(part, ml, _NoOutcomes())
    counts = tb.recover(None, snap)
    assert counts["aborted_trimmed"] == 1
    assert tb.aborted == {(0, 2): Position(first.ledger_id, first.entry_id)}
    ml.close()


def test_snapshots_due_by_count_and_by_time(tmp_path: Path) -> None:
    from txnstream.testing import ManualClock

    clock = ManualClock()
    cfg = BrokerConfig(tb_snapshot_max_changes=5, tb_snapshot_min_time_ms=10_000)
    with Broker.open(tmp_path, cfg, registry=None, clock=clock) as b:
        p = b.client().producer("t", name="p")
        t = b.topic("t")
        for i in range(4):
            p.send(b"%d" % i)
        assert b.write_snapshots() == 0  # 4 changes, not yet 5, no time passed
        p.send(b"4")
        assert b.write_snapshots() == 1  # the 5th change
        assert t.tb.changes == 0 and t.tb.snapshots_written == 1
        p.send(b"5")
        assert b.write_snapshots() == 0
        clock.advance(10_000)
        assert b.write_snapshots() == 1  # time passed with a change pending
        clock.advance(10_000)
        assert b.write_snapshots() == 0  # nothing changed
        assert t.stats()["transaction_buffer"]["snapshots_written"] == 2  # type: ignore[index]


def test_maintenance_writes_due_snapshots(tmp_path: Path) -> None:
    cfg = BrokerConfig(tb_snapshot_max_changes=3, pending_ack_trim_interval_ms=10)
    with Broker.open(tmp_path, cfg, registry=None) as b:
        p = b.client().producer("t", name="p")
        for i in range(3):
            p.send(b"%d" % i)
        tb = b.topic("t").tb
        wait_until(lambda: tb.snapshots_written >= 1, 10_000)
        assert b.snapshot_writer.stats()["records_written"] >= 1


# ------------------------------------------------------------------ recovery at scale


def _many_topics(path: Path, n: int, namespaces: int = 2, snapshots: bool = True) -> list[str]:
    cfg = BrokerConfig(tb_snapshot_max_changes=1 << 30, tb_snapshot_min_time_ms=1 << 40)
    names = []
    with Broker.open(path, cfg, registry=None) as b:
        client = b.client("w")
        for i in range(n):
            name = f"public/ns{i % namespaces}/t{i}"
            p = client.producer(name, name="p")
            p.send(b"x")
            if i % 3 == 0:
                with client.transaction() as txn:
                    p.send(b"y", txn=txn)
            names.append(TopicName.parse(name).full)
        if not snapshots:
            for t in b.loaded_topics():
                t.tb.changes = 0  # nothing to snapshot on close
    return names


@pytest.fixture
def many(tmp_path: Path) -> tuple[Path, list[str]]:
    return tmp_path, _many_topics(tmp_path, 120)


def test_eager_recovery_recovers_every_partition_through_the_shared_readers(
    many: tuple[Path, list[str]],
) -> None:
    path, names = many
    cfg = BrokerConfig(topic_recovery="eager", topic_recovery_threads=3)
    with Broker.open(path, cfg, registry=None) as b:
        assert b.wait_recovered(60_000)
        st = b.recovery_status()
        assert (st["total"], st["recovered"], st["failed"], st["pending"]) == (120, 120, 0, 0)
        assert st["loaded"] == 120 and st["from_snapshot"] == 120
        # One snapshot record per topic, each read once (2 namespaces): x, not n·x.
        assert st["snapshot_entries_read"] == 120
        assert st["entries_replayed"] == 0
        assert {t.full for t in b.loaded_topics()} == set(names)


def test_lazy_recovery_shares_the_namespace_reader(many: tuple[Path, list[str]]) -> None:
    path, names = many
    with Broker.open(path, registry=None) as b:
        for name in names[:30]:
            b.topic(name)
        st = b.recovery_status()
        assert st["mode"] == "lazy" and st["loaded"] == 30 and st["from_snapshot"] == 30
        assert st["snapshot_entries_read"] == 120  # each namespace's topic read once


def test_a_failing_partition_is_reported_and_does_not_block_the_others(
    many: tuple[Path, list[str]],
) -> None:
    path, names = many
    broken = names[7]
    ml = ManagedLedger.open(path, broken)
    ml.append(b"\xff not a message")
    ml.close()
    cfg = BrokerConfig(topic_recovery="eager", topic_recovery_threads=2)
    with Broker.open(path, cfg, registry=None) as b:
        assert b.wait_recovered(60_000)
        st = b.recovery_status()
        assert st["failed"] == 1 and st["recovered"] == 119
        assert list(st["errors"]) == [broken]
        assert "CorruptEntryError" in st["errors"][broken]


def test_close_cancels_recovery_in_progress(tmp_path: Path) -> None:
    names = _many_topics(tmp_path, 400, namespaces=1, snapshots=False)
    cfg = BrokerConfig(topic_recovery="eager", topic_recovery_threads=1)
    b = Broker.open(tmp_path, cfg, registry=None)
    started = time.monotonic()
    b.close()
    assert time.monotonic() - started < 60
    st = b.recovery_status()
    assert st["cancelled"] and st["pending"] == 0
    assert st["skipped"] > 0  # not started: skipped, not recovered
    assert st["recovered"] + st["skipped"] + st["failed"] == len(names)
    assert st["failed"] == 0  # one stopped mid-replay by the close counts as skipped


def test_wait_recovered_bad_input(tmp_path: Path) -> None:
    with Broker.open(tmp_path, registry=None) as b:
        assert b.wait_recovered(0)  # lazy: nothing to wait for
        with pytest.raises(InvalidArgumentError) as e:
            b.wait_recovered(-1)
        assert "-1" in str(e.value)


def test_reader_refreshes_only_when_the_writer_wrote(tmp_path: Path) -> None:
    from txnstream.buffer.snapshot_reader import SnapshotReaders
    from txnstream.testing import ManualClock
    from txnstream.timer import TimerService

    ns = "public/default"
    writer = CompactedTopic.open(tmp_path, snapshot_topic(ns), write_only=True)
    writer.put("persistent://public/default/a", b"")
    written = [1]
    clock = ManualClock()
    timers = TimerService(clock, start=False)
    readers = SnapshotReaders(
        lambda name: ManagedLedger.open(tmp_path, name, read_only=True),
        timers.scope(),
        clock,
        generation=lambda: written[0],
    )
    reader = readers.acquire(ns)
    try:
        assert reader.read("persistent://public/default/a") is not None
        # Written in this process after the reader caught up: seen once counted...
        writer.put("persistent://public/default/b", b"")
        writer.put("persistent://public/default/c", b"")
        written[0] += 1
        assert reader.read("persistent://public/default/b") is not None
        # ... and not looked for while the count stands still (no refresh).
        writer.put("persistent://public/default/d", b"")
        assert reader.read("persistent://public/default/d") is None
        assert reader.read("persistent://public/default/c") is not None
    finally:
        reader.release()
        readers.close()
        timers.close()
        writer.close()


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_kill_9_during_snapshot_writes_then_snapshot_recovery_equals_full_replay(
    tmp_path: Path, seed: int
) -> None:
    import subprocess
    import sys

    child = Path(__file__).with_name("snapshot_crash_child.py")
    rng = random.Random(seed)
    for round_ in range(2):  # a second run over the first one's crash
        proc = subprocess.Popen(
            [sys.executable, str(child), str(tmp_path), str(seed * 10 + round_)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
            time.sleep(rng.uniform(0.05, 0.4))
        finally:
            proc.kill()
            proc.wait(30)
    partitions = [TopicName.parse(f"public/ns{i % 2}/t{i}").full for i in range(6)]
    for part in partitions:
        snap = _snapshot(tmp_path, part)
        assert snap is not None, part
        full_tb, full_dedup, _ = _recovered(tmp_path, part, None)
        tb, dedup, counts = _recovered(tmp_path, part, snap)
        assert counts["from_snapshot"] == 1
        assert (tb.ongoing, tb.aborted, tb.read_limit) == (
            full_tb.ongoing,
            full_tb.aborted,
            full_tb.read_limit,
        ), part
        assert {n: p.last for n, p in dedup._producers.items()} == {
            n: p.last for n, p in full_dedup._producers.items()
        }
    # And the broker recovers every partition from its snapshot.
    with Broker.open(tmp_path, BrokerConfig(topic_recovery="eager"), registry=None) as b:
        assert b.wait_recovered(60_000)
        st = b.recovery_status()
        assert st["recovered"] == 6 and st["from_snapshot"] == 6


def test_eager_recovery_skips_partitions_never_written(tmp_path: Path) -> None:
    with Broker.open(tmp_path, registry=None) as b:
        b.create_topic("wide", 8)
        b.client().producer("wide-partition-3").send(b"only one partition gets this")
    before = set(ManagedLedger.names(tmp_path))
    with Broker.open(tmp_path, BrokerConfig(topic_recovery="eager"), registry=None) as b:
        assert b.wait_recovered(60_000)
        st = b.recovery_status()
        assert (st["total"], st["recovered"]) == (1, 1)
    assert set(ManagedLedger.names(tmp_path)) == before  # no empty ledgers created


# ------------------------------------------------------------------ review findings


def test_a_transactional_send_whose_write_failed_is_not_in_the_snapshot(tmp_path: Path) -> None:
    """Its position was assigned, its write failed: a retry after a restart must write it."""
    import contextlib

    from txnstream import testing
    from txnstream.errors import StorageError

    cfg = BrokerConfig(tb_snapshot_max_changes=1 << 30, tb_snapshot_min_time_ms=1 << 40)
    part = "persistent://public/default/t"
    b = Broker.open(tmp_path, cfg, registry=None)
    try:
        client = b.client("c")
        p = client.producer("t", name="p")
        for i in range(3):
            p.send(b"%d" % i)
        txn = client.transaction(timeout_ms=600_000)
        p.send(b"3", txn=txn, sequence_id=3)  # the transaction's own records are written
        txn.wait_durable(10_000)
        testing.inject_fault(b.topic("t").ml, "write", errno=5)  # only this send is in flight
        with contextlib.suppress(StorageError):
            p.send(b"4", txn=txn, sequence_id=4)
        with contextlib.suppress(StorageError, TxnStreamError):
            txn.wait_durable(10_000)  # the failed group is over
        client.producer("t", name="q").send(b"later")  # durable, in the next ledger
        assert b.write_snapshots(due_only=False) == 1
        snap = _snapshot(tmp_path, part)
        assert snap is not None
        ps = {x.producer_name: x for x in snap.producer_sequences}
        assert ps["p"].last_sequence_id == 3
        assert list(ps["p"].sequence_ids) == [0, 1, 2, 3]
        _, dedup, _ = _recovered(tmp_path, part, snap)
        _, full, _ = _recovered(tmp_path, part, None)
        assert dedup.last_sequence_id("p") == full.last_sequence_id("p") == 3
        # In this process too: a retry in another transaction writes it.
        with client.transaction() as t2:
            again = p.send(b"4", txn=t2, sequence_id=4)
        assert again.ledger_id > 0 and b.topic("t").ml.entry_count() >= 6
    finally:
        b.close()


def test_an_aborted_transaction_of_many_messages_can_be_sent_again_after_a_restart(
    tmp_path: Path,
) -> None:
    n = 300  # more than the recent ids a snapshot keeps per producer
    with Broker.open(tmp_path, registry=None) as b:
        client = b.client("c")
        p = client.producer("t", name="p")
        txn = client.transaction(timeout_ms=600_000)
        for i in range(n):
            p.send(b"v%d" % i, txn=txn, sequence_id=i)
        txn.abort()
    with Broker.open(tmp_path, registry=None) as b:
        assert b.topic("t").recovery["from_snapshot"] == 1
        client = b.client("c")
        p = client.producer("t", name="p")
        with client.transaction() as txn:
            ids = [p.send(b"v%d" % i, txn=txn, sequence_id=i) for i in range(n)]
        assert len(set(ids)) == n
        c = client.subscribe("t", "s")
        got: list[bytes] = []
        while len(got) < n and (m := c.receive(10_000)) is not None:
            got.append(m.value)
        assert got == [b"v%d" % i for i in range(n)]
        assert c.receive(100) is None


def test_recovery_stops_between_chunks_when_cancelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from txnstream.buffer import transaction_buffer
    from txnstream.errors import AlreadyClosedError

    with Broker.open(tmp_path, registry=None) as b:
        p = b.client().producer("t", name="p")
        for i in range(40):
            p.send_async(b"%d" % i)
        p.flush()
    monkeypatch.setattr(transaction_buffer, "REPLAY_CHUNK", 10)
    part = "persistent://public/default/t"
    tb = TransactionBuffer(part, ManagedLedger.open(tmp_path, part, read_only=True), _NoOutcomes())
    seen: list[int] = []
    asked = [0]

    def cancelled() -> bool:
        asked[0] += 1
        return asked[0] > 2  # two chunks read, then the broker closes

    with pytest.raises(AlreadyClosedError, match="cancelled"):
        tb.recover(lambda pos, *_: seen.append(pos.entry_id), None, cancelled)
    assert len(seen) == 20  # stopped mid-replay, not at the end


def test_a_failed_open_keeps_its_snapshot_for_the_retry(
    many: tuple[Path, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from txnstream.broker.topic import Topic

    path, names = many
    real = Topic.recover
    failures = [1]

    def flaky(self: Topic, *args: Any, **kwargs: Any) -> None:
        if failures[0]:
            failures[0] -= 1
            raise OSError(5, "transient")
        real(self, *args, **kwargs)

    monkeypatch.setattr(Topic, "recover", flaky)
    with Broker.open(path, registry=None) as b:
        with pytest.raises(OSError, match="transient"):
            b.topic(names[0])
        t = b.topic(names[0])
        assert t.recovery["from_snapshot"] == 1


def test_compaction_of_the_snapshot_topic_under_a_shared_reader(
    many: tuple[Path, list[str]],
) -> None:
    path, names = many
    ns0 = [n for n in names if "/ns0/" in n]
    with Broker.open(path, registry=None) as b:
        b.topic(ns0[0])  # the namespace's reader has caught up
        b.client().producer(ns0[0], name="p2").send(b"changed")
        b.snapshot_writer.compact_after = -100  # the next write compacts
        assert b.write_snapshots(due_only=False) == 1
        assert b.snapshot_writer.stats()["compactions"] == 1
        t = b.topic(ns0[1])  # read after the log was rewritten under the reader
        assert t.recovery["from_snapshot"] == 1


@pytest.mark.parametrize("restart", [False, True])
def test_an_aborted_message_can_be_sent_again_after_its_marker_was_trimmed(
    tmp_path: Path, restart: bool
) -> None:
    """Once its ledger is trimmed the buffer forgets the abort; deduplication must not."""
    cfg = BrokerConfig(max_entries_per_ledger=2, pending_ack_trim_interval_ms=10)
    b = Broker.open(tmp_path, cfg, registry=None)
    try:
        client = b.client("c")
        p = client.producer("t", name="p")
        c = client.subscribe("t", "s")
        txn = client.transaction()
        p.send(b"lost?", txn=txn, sequence_id=0)
        txn.abort()
        for i in range(1, 8):
            p.send(b"plain%d" % i, sequence_id=i)
        got: list[bytes] = []
        while len(got) < 7 and (m := c.receive(10_000)) is not None:
            got.append(m.value)
            c.ack(m)
        assert got == [b"plain%d" % i for i in range(1, 8)]
        t = b.topic("t")
        deadline = time.monotonic() + 20
        while t.tb.aborted:  # the ABORT marker's ledger is trimmed; the buffer forgets it
            assert time.monotonic() < deadline, "the aborted transaction's ledger was not trimmed"
            b.maintain_now()
            t.ml.checkpoint()
            time.sleep(0.02)
        if restart:
            b.close()
            b = Broker.open(tmp_path, cfg, registry=None)
            client = b.client("c")
            p = client.producer("t", name="p")
            c = client.subscribe("t", "s")
        with client.transaction() as t2:
            again = p.send(b"sent again", txn=t2, sequence_id=0)
        m = c.receive(5_000)
        assert m is not None and m.value == b"sent again" and m.message_id == again
    finally:
        b.close()


def _trim_cfg() -> BrokerConfig:
    # Two entries per ledger, and no snapshot unless the test writes one.
    return BrokerConfig(
        max_entries_per_ledger=2,
        tb_snapshot_max_changes=1_000_000,
        tb_snapshot_min_time_ms=1 << 40,
    )


def _send_and_consume_all(b: Broker) -> list[Any]:
    """``p`` sends sequence ids 0-3, then ``q`` sends 6; ``s`` takes and acks all 10."""
    client = b.client("c")
    consumer = client.subscribe("t", "s")
    p = client.producer("t", name="p")
    q = client.producer("t", name="q")
    ids = [p.send(b"p%d" % i, sequence_id=i) for i in range(4)]
    for i in range(6):
        q.send(b"q%d" % i)
    for _ in range(10):
        msg = consumer.receive(5_000)
        assert msg is not None
        consumer.ack(msg)
    # Journal the subscription's position now: trimming follows it.
    b.topic("t").ml.open_cursor("s").flush()
    return ids


def test_trimming_keeps_what_no_durable_snapshot_covers(tmp_path: Path) -> None:
    """Acked ledgers go only once a durable snapshot covers them (dedup state survives).

    Without the hold, the ledgers holding all of ``p``'s messages are trimmed
    once ``s`` acks them, and a restart forgets ``p``'s sequence ids: its
    retry is written a second time.
    """
    part = "persistent://public/default/t"
    with Broker.open(tmp_path, _trim_cfg(), registry=None) as b:
        ids = _send_and_consume_all(b)
        ml = b.topic("t").ml
        first = ml.first_position
        assert first is not None and (first.ledger_id, first.entry_id) == (
            ids[0].ledger_id,
            ids[0].entry_id,
        )
        # A crash now: recovery (no snapshot) replays all of p's messages.
        _, dedup, _ = _recovered(tmp_path, part, None)
        assert dedup.last_sequence_id("p") == 3
        assert b.write_snapshots(due_only=False) == 1
        ml.open_cursor("s").flush()
        first = ml.first_position
        assert first is not None and first.ledger_id > ids[3].ledger_id  # now trimmed
        # A crash now: the snapshot has p's ids; the trimmed ledgers are not needed.
        snap = _snapshot(tmp_path, part)
        assert snap is not None
        _, dedup, counts = _recovered(tmp_path, part, snap)
        assert counts["from_snapshot"] == 1
        assert dedup.last_sequence_id("p") == 3
        assert dedup._producers["p"].window[3].entry == Position(ids[3].ledger_id, ids[3].entry_id)


_TRIM_CHILD = """
import os, signal, sys
sys.path.insert(0, sys.argv[2])
from test_tb_snapshots import _send_and_consume_all, _trim_cfg
from txnstream import Broker

b = Broker.open(sys.argv[1], _trim_cfg(), registry=None)
ids = _send_and_consume_all(b)
print(ids[3].ledger_id, ids[3].entry_id, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_retry_after_kill_9_is_not_written_twice_when_acked_ledgers_were_trimmable(
    tmp_path: Path,
) -> None:
    """A producer retries its last send after kill -9: the original id, nothing written."""
    import subprocess
    import sys

    data = tmp_path / "data"
    proc = subprocess.run(
        [sys.executable, "-c", _TRIM_CHILD, str(data), str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -9, proc.stderr
    ledger_id, entry_id = map(int, proc.stdout.split())
    with Broker.open(data, _trim_cfg(), registry=None) as b:
        ml = b.topic("t").ml
        end = ml.last_position
        p = b.client("c").producer("t", name="p")
        again = p.send(b"p3", sequence_id=3)
        assert (again.ledger_id, again.entry_id) == (ledger_id, entry_id)
        assert ml.last_position == end  # nothing written


def test_a_partition_failing_because_the_broker_closes_under_it_counts_as_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker closed the snapshot readers before cancelling the recovery wave.

    A partition mid-recovery then failed on the closed readers and was
    reported failed (with a warning) instead of skipped. Here the partition
    being recovered waits until the readers close, then fails.
    """
    import threading

    from txnstream.buffer.snapshot_reader import SnapshotReaders

    _many_topics(tmp_path, 3, namespaces=1, snapshots=False)
    inside, readers_closed = threading.Event(), threading.Event()
    real_close, real_topic = SnapshotReaders.close, Broker.topic

    opened: list[Broker] = []

    def close_readers(self: SnapshotReaders) -> None:
        real_close(self)
        readers_closed.set()
        # The partition fails on the closed readers and is counted before the
        # close goes on (as when the recovery thread runs first).
        deadline = time.monotonic() + 10
        while opened and time.monotonic() < deadline:
            st = opened[0].recovery_status()
            if st["total"] - st["pending"] >= 1:
                break
            time.sleep(0.005)

    def topic(self: Broker, name: Any, *args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name.startswith("txnstream-recovery"):
            inside.set()
            readers_closed.wait(10)  # the close comes meanwhile
        return real_topic(self, name, *args, **kwargs)

    monkeypatch.setattr(SnapshotReaders, "close", close_readers)
    monkeypatch.setattr(Broker, "topic", topic)
    cfg = BrokerConfig(topic_recovery="eager", topic_recovery_threads=1)
    b = Broker.open(tmp_path, cfg, registry=None)
    opened.append(b)
    assert inside.wait(10)
    b.close()
    st = b.recovery_status()
    assert st["failed"] == 0 and st["errors"] == {}, st["errors"]
    assert st["skipped"] == 3


def test_a_missing_snapshot_topic_is_looked_for_again_only_after_the_writer_wrote(
    tmp_path: Path,
) -> None:
    """Each partition's first open looked for the namespace's snapshot topic again.

    With no snapshot written yet, every try failed (ENOENT) after a look at
    the directory: a new partitioned topic's first use was quadratic in its
    partition count (39.7 s for 5,000 partitions).
    """
    from txnstream.buffer.snapshot_reader import SnapshotReaders
    from txnstream.testing import ManualClock
    from txnstream.timer import TimerService

    ns = "public/default"
    opens = [0]

    def open_ro(name: str) -> ManagedLedger:
        opens[0] += 1
        return ManagedLedger.open(tmp_path, name, read_only=True)

    written = [0]
    clock = ManualClock()
    timers = TimerService(clock, start=False)
    readers = SnapshotReaders(open_ro, timers.scope(), clock, generation=lambda: written[0])
    reader = readers.acquire(ns)
    try:
        for i in range(50):
            assert reader.read(f"persistent://public/default/big-partition-{i}") is None
        assert opens[0] == 1
        writer = CompactedTopic.open(tmp_path, snapshot_topic(ns), write_only=True)
        writer.put("persistent://public/default/a", b"")
        writer.close()
        written[0] += 1  # the broker's writer wrote: look again
        assert reader.read("persistent://public/default/a") is not None
        assert opens[0] == 2
    finally:
        reader.release()
        readers.close()
        timers.close()
