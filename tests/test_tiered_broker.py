"""Tiered storage through the broker: indexes written as aborts happen, offload, remote reads."""

from __future__ import annotations

import importlib
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec  # type: ignore[import-untyped]
import pytest
from fsspec.implementations.memory import MemoryFileSystem  # type: ignore[import-untyped]
from prometheus_client import CollectorRegistry, generate_latest

from txnstream import Broker, ManagedLedger, Position
from txnstream._native import AbortedTxnIndex, crc32c, decode_segment, decode_topic_entry
from txnstream.client import Transaction
from txnstream.config import BrokerConfig
from txnstream.errors import (
    ConfigError,
    CorruptEntryError,
    InvalidArgumentError,
    InvalidTopicNameError,
    StorageError,
)
from txnstream.testing import set_remote_call_hook
from txnstream.tiered import (
    METADATA_LEDGER,
    RemoteLogMetadataManager,
    RemoteStorage,
    SegmentInfo,
    object_name,
)
from txnstream.tiered.offload import HOLD_CURSOR, LEGACY_HOLD_CURSOR, release_trimming

TOPIC = "persistent://public/default/tiered"


def _config(**kw: object) -> BrokerConfig:
    return BrokerConfig(max_entries_per_ledger=10, transaction_timeout_ms=60_000, **kw)  # type: ignore[arg-type]


def _workload(broker: Broker, txns: int, seed: int = 5) -> tuple[set[bytes], set[bytes]]:
    """Interleaved transactions on one partition, some aborted; returns (committed, aborted)."""
    rng = random.Random(seed)
    client = broker.client("tiered-test")
    producer = client.producer(TOPIC)
    committed: set[bytes] = set()
    aborted: set[bytes] = set()
    open_txns: list[tuple[object, list[bytes]]] = []
    for i in range(txns):
        t = client.transaction()
        vals = [f"t{i}-{k}".encode() for k in range(rng.randint(1, 3))]
        for v in vals:
            producer.send(v, txn=t)
        open_txns.append((t, vals))
        producer.send(f"plain{i}".encode())
        committed.add(f"plain{i}".encode())
        if len(open_txns) > 2 or i == txns - 1:
            while open_txns:
                t2, v2 = open_txns.pop(rng.randrange(len(open_txns)))
                if rng.random() < 0.3:
                    t2.abort()  # type: ignore[attr-defined]
                    aborted.update(v2)
                else:
                    t2.commit()  # type: ignore[attr-defined]
                    committed.update(v2)
    producer.send(b"last")
    committed.add(b"last")
    return committed, aborted


def _drain(broker: Broker, sub: str) -> list[bytes]:
    consumer = broker.client(f"reader-{sub}").subscribe(TOPIC, sub)
    out: list[bytes] = []
    while (m := consumer.receive(timeout_ms=300)) is not None:
        out.append(m.value)
        consumer.ack(m)
    consumer.close()
    return out


def _wait_trimmed_past(broker: Broker, ledger_id: int) -> None:
    ml = broker.topic(TOPIC).ml
    deadline = time.monotonic() + 20
    while (ml.first_position or Position(0, 0)).ledger_id <= ledger_id:
        assert time.monotonic() < deadline, f"ledgers up to {ledger_id} were not trimmed"
        broker.write_snapshots(due_only=False)  # trimming waits for a snapshot to cover it
        broker.maintain_now()
        ml.checkpoint()
        time.sleep(0.02)


def _consume_then_check_indexes_pruned(broker: Broker, closed: list[int]) -> None:
    """Once consumed and trimmed, ledgers' local aborted-transaction indexes are deleted."""
    full = broker.topic(TOPIC).full
    indexed = [lid for lid in closed if broker.txn_indexes.path(full, lid).exists()]
    assert indexed, "the workload aborts transactions in closed ledgers"
    _drain(broker, "all")
    _wait_trimmed_past(broker, max(indexed))
    broker.maintain_now()
    assert [lid for lid in indexed if broker.txn_indexes.path(full, lid).exists()] == []


@pytest.mark.parametrize("seed", [1, 2, 3, 5])
def test_offload_then_remote_read_committed_equals_the_client(tmp_path: Path, seed: int) -> None:
    reg = CollectorRegistry()
    with Broker.open(tmp_path / "data", _config(), registry=reg) as broker:
        committed, aborted = _workload(broker, 60, seed)
        assert aborted
        # The subscription exists before the offload: its cursor keeps the data
        # local until it is consumed (consumers read local ledgers only).
        broker.client("reader-rc").subscribe(TOPIC, "rc").close()
        segs = broker.admin.offload(TOPIC)  # from now on trimming waits for offload
        assert len(segs) >= 5
        client_vals = _drain(broker, "rc")  # READ_COMMITTED through the client, all acked
        assert set(client_vals) == committed
        stats = broker.admin.tiered_stats()
        # The transaction buffer wrote exact index records as aborts happened:
        # the offloader found every index matching the ledger's ABORT markers.
        assert stats["offloader"].get("txn_index_rebuilt", 0) == 0
        assert stats["offloader"]["segments_offloaded"] == len(segs)
        assert any(not s.txn_idx_empty for s in segs)
        # Exact records: real first and last-stable positions, not the conservative lowest.
        seg = next(s for s in segs if not s.txn_idx_empty)
        raw = (
            tmp_path
            / "data"
            / "remote"
            / object_name(seg.topic, seg.ledger_id, seg.segment_id, "txn_index")
        ).read_bytes()
        recs = AbortedTxnIndex.decode(raw).records()
        assert recs and all(r[1] <= r[2] and r[3] <= r[2] for r in recs)
        assert any(r[3].ledger_id > 0 for r in recs)
        # An open transaction's messages are never read (the buffer's bound).
        client = broker.client("late")
        t = client.transaction()
        client.producer(TOPIC).send(b"uncommitted", txn=t)
        # The subscription acked everything: the offloaded ledgers go locally.
        _wait_trimmed_past(broker, segs[len(segs) // 2].ledger_id)
        before = broker.admin.tiered_stats()["calls"]
        topic = broker.topic(TOPIC)
        got = [m.payload for m in broker.tiered.read_committed(topic)]
        after = broker.admin.tiered_stats()["calls"]
        assert got == client_vals  # remote + local equals what the client read
        assert b"uncommitted" not in got and not set(got) & aborted
        calls = {k: after[k] - before[k] for k in after}
        assert calls["segment"] >= 1  # the trimmed part came from remote
        text = generate_latest(reg).decode()
        assert "txnstream_tiered_remote_calls_total" in text
        t.commit()
        assert b"uncommitted" in [m.payload for m in broker.tiered.read_committed(topic)]
        name: Any = TOPIC  # a name, not a Topic: it raised AttributeError
        with pytest.raises(InvalidArgumentError, match="topic must be a Topic"):
            broker.tiered.read_committed(name)
        # Offloading again uploads nothing new.
        uploaded = broker.admin.tiered_stats()["offloader"]["segments_offloaded"]
        again = broker.admin.offload(TOPIC)
        assert {s.segment_id for s in again} <= {s.segment_id for s in segs}
        assert broker.admin.tiered_stats()["offloader"]["segments_offloaded"] == uploaded
    with Broker.open(tmp_path / "data", _config(), registry=None) as broker:
        assert len(broker.admin.offloaded_segments(TOPIC)[TOPIC]) >= len(segs)


def test_local_ledgers_stay_until_offloaded(tmp_path: Path) -> None:
    # Policy on (but by size it never triggers): trimming waits for offload,
    # so a READ_COMMITTED read over remote + local data never has a gap.
    with Broker.open(
        tmp_path / "data", _config(offload_threshold_bytes=1 << 40), registry=None
    ) as broker:
        committed, _ = _workload(broker, 30)
        ml = broker.topic(TOPIC).ml
        first = ml.first_position
        assert first is not None
        assert set(_drain(broker, "all")) == committed  # everything acked
        for _ in range(5):
            broker.maintain_now()
            ml.checkpoint()
        assert ml.first_position == first  # nothing offloaded: nothing trimmed
        segs = broker.admin.offload(TOPIC)
        _wait_trimmed_past(broker, segs[0].ledger_id)  # offloaded: trimming goes on
        got = [m.payload for m in broker.tiered.read_committed(broker.topic(TOPIC))]
        assert set(got) == committed


@pytest.mark.parametrize("local", ["é" * 80, "a:" * 75])
def test_topics_whose_quoted_names_are_long_offload_and_read(tmp_path: Path, local: str) -> None:
    # Valid names whose percent-quoted form passes the file system's 255
    # bytes: the aborted-transaction index and the remote objects could not
    # be written (a raw OSError; such a topic could never be offloaded).
    topic = f"persistent://public/default/{local}"
    with Broker.open(tmp_path / "data", _config(), registry=None) as broker:
        client = broker.client("c")
        producer = client.producer(topic)
        t = client.transaction()
        producer.send(b"aborted", txn=t)
        t.abort()
        plain = [f"m{i}".encode() for i in range(25)]
        for v in plain:
            producer.send(v)
        full = broker.topic(topic).full
        assert broker.txn_indexes.load(full, 1) is not None  # the abort was indexed
        assert len(broker.txn_indexes.path(full, 1).name.encode()) <= 255
        segs = broker.admin.offload(topic)
        assert segs
        part = broker.topic(topic)
        remote = [
            m.payload
            for m in broker.tiered.reader().read_committed(
                full, None, max_read_position=part.ml.last_position, aborted=set(part.tb.aborted)
            )
        ]
        assert remote and remote == plain[: len(remote)]  # the offloaded ledgers, read back
        assert [m.payload for m in broker.tiered.read_committed(part)] == plain
        assert broker.txn_indexes.prune(full, 2) == 1  # found by its file name


def test_a_remote_location_that_cannot_work_is_a_typed_error(tmp_path: Path) -> None:
    # An unknown URL scheme is refused with the configuration (it made every
    # topic open raise a bare ValueError); a path that is a file, at first use.
    with pytest.raises(ConfigError, match=r"fileSystemURI.*foo"):
        BrokerConfig(tiered_storage_location="foo://bucket/x")
    with pytest.raises(ConfigError, match=r"fileSystemURI.*foo"):
        BrokerConfig(tiered_storage_location="simplecache::foo://bucket/x")
    # fsspec's chained URLs are fine (found in review: they were refused).
    BrokerConfig(tiered_storage_location=f"simplecache::file://{tmp_path}/r")
    (tmp_path / "afile").write_bytes(b"")
    cfg = _config(tiered_storage_location=str(tmp_path / "afile"), offload_threshold_bytes=0)
    with Broker.open(tmp_path / "data", cfg, registry=None) as broker:
        broker.client("c").producer(TOPIC).send(b"x")  # local sends never need the store
        broker.maintain_now()
        assert isinstance(broker.tiered_error, StorageError)
        assert "not a usable directory" in str(broker.tiered_error)
        with pytest.raises(StorageError, match="not a usable directory"):
            broker.admin.offload(TOPIC)


def test_offload_of_an_unknown_topic_is_an_error(tmp_path: Path) -> None:
    with Broker.open(tmp_path / "data", _config(), registry=None) as broker:
        with pytest.raises(InvalidTopicNameError, match="does not exist"):
            broker.admin.offload("persistent://public/default/typo")
        assert broker.admin.topics() == []  # not created by the call


def test_offload_by_policy_in_maintenance(tmp_path: Path) -> None:
    with Broker.open(
        tmp_path / "data", _config(offload_threshold_bytes=0), registry=None
    ) as broker:
        _workload(broker, 30)
        broker.maintain_now()
        segs = broker.admin.offloaded_segments(TOPIC)[TOPIC]
        closed = [lid for lid, n, sealed in broker.topic(TOPIC).ml.ledgers() if sealed and n]
        assert [s.ledger_id for s in segs] == closed
        # Once consumed, offloaded ledgers are trimmed, and the same maintenance
        # round deletes their local aborted-transaction indexes.
        _consume_then_check_indexes_pruned(broker, closed)


def test_tiered_settings_from_pulsar_keys(tmp_path: Path) -> None:
    cfg = BrokerConfig.from_dict(
        {
            "managedLedgerOffloadThresholdInBytes": "1048576",
            "fileSystemURI": str(tmp_path / "elsewhere"),
        }
    )
    assert cfg.offload_threshold_bytes == 1 << 20 and cfg.offload_threshold_ms == -1
    with Broker.open(tmp_path / "data", cfg, registry=None) as broker:
        assert broker.tiered.remote.location == str(tmp_path / "elsewhere")


def test_read_committed_when_an_open_transaction_starts_a_ledger_after_trimmed_ones(
    tmp_path: Path,
) -> None:
    """The read limit at entry 0 of a ledger, every earlier one trimmed: all is remote.

    The transaction buffer's ``max_read_position`` (found through the local
    ledgers) is None then; the remote read must still return everything
    before the open transaction.
    """
    with Broker.open(tmp_path / "data", _config(), registry=None) as broker:
        client = broker.client("c")
        client.subscribe(TOPIC, "rc").close()
        producer = client.producer(TOPIC)
        ml = broker.topic(TOPIC).ml
        plain: list[bytes] = []
        while len(plain) < 15 or (ml.last_position and ml.last_position.entry_id != 9):
            plain.append(f"plain{len(plain)}".encode())
            producer.send(plain[-1])  # until a ledger (10 entries) is full
        t = client.transaction()
        producer.send(b"uncommitted", txn=t)
        t.wait_durable(10_000)
        first_of_txn = ml.last_position
        assert first_of_txn is not None and first_of_txn.entry_id == 0  # starts a ledger
        broker.admin.offload(TOPIC)
        assert _drain(broker, "rc") == plain
        _wait_trimmed_past(broker, first_of_txn.ledger_id - 1)
        topic = broker.topic(TOPIC)
        assert topic.tb.max_read_position is None  # nothing readable is stored locally
        got = [m.payload for m in broker.tiered.read_committed(topic)]
        assert got == plain
        t.abort()


@pytest.mark.parametrize("given", ["broker", "ml only"])
def test_a_ledger_offloaded_out_of_order_hides_no_abort(tmp_path: Path, given: str) -> None:
    """L1 and L3 offloaded, L2 (holding L1's transaction's ABORT) only local.

    L3's index completes the remote collection, but L2 lies between: the
    local aborts must still count, or L1's aborted message is returned.
    Found in review (READ_COMMITTED returned it).
    """
    cfg = BrokerConfig(
        max_entries_per_ledger=4,
        transaction_timeout_ms=60_000,
        offload_threshold_bytes=1 << 40,  # a policy (the hold) that never triggers
    )
    with Broker.open(tmp_path / "data", cfg, registry=None) as broker:
        client = broker.client("c")
        consumer = client.subscribe(TOPIC, "s")
        producer = client.producer(TOPIC)
        ml = broker.topic(TOPIC).ml

        def fill() -> None:  # plain messages to the end of the current ledger
            # (a transaction's first send may not be stored yet: the
            # producer's order puts it before these)
            while (last := ml.last_position) is None or last.entry_id != 3:
                producer.send(b"plain")

        def abort(t: Transaction) -> None:  # and wait for its marker (written after)
            before = ml.entry_count()
            t.abort()
            deadline = time.monotonic() + 20
            while ml.entry_count() == before:
                assert time.monotonic() < deadline, "no ABORT marker"
                time.sleep(0.005)

        a = client.transaction()
        producer.send(b"aborted-a", txn=a)  # L1
        fill()
        abort(a)  # its ABORT marker starts L2
        fill()
        b = client.transaction()
        producer.send(b"aborted-b", txn=b)  # L3
        abort(b)
        fill()
        producer.send(b"tail")  # L4, open
        ledgers = [lid for lid, _, _ in ml.ledgers()]
        offloader = broker.tiered.offloader
        offloader.offload(ml, ledgers[0])
        offloader.offload(ml, ledgers[2])
        offloader.hold_trimming(ml)
        while (m := consumer.receive(timeout_ms=200)) is not None:
            consumer.ack(m)
        _wait_trimmed_past(broker, ledgers[0])
        topic = broker.topic(TOPIC)
        if given == "broker":  # the partition's aborted set
            got = [m.payload for m in broker.tiered.read_committed(topic)]
        else:  # the local ABORT markers
            got = [
                m.payload
                for m in broker.tiered.reader().read_committed(
                    topic.full, ml, max_read_position=ml.last_position
                )
            ]
        assert got == [b"plain"] * (len(got) - 1) + [b"tail"], got
        assert len(got) == 9, got  # 3 + 3 + 2 plain, the tail


def test_remote_files_cut_short_at_a_boundary_are_detected(tmp_path: Path) -> None:
    """An index cut to its header is rebuilt; segment data cut after a frame raises.

    Both still decode (the index as one with no record, the data as fewer
    entries): without the checks against the metadata, the aborted message
    was returned and committed ones went missing, silently.
    """
    cfg = BrokerConfig(max_entries_per_ledger=5, transaction_timeout_ms=60_000)
    with Broker.open(tmp_path, cfg, registry=None) as b:
        c = b.client("c")
        t = c.transaction()
        c.producer(TOPIC).send(b"ABORTED", txn=t)
        t.abort()
        want = [b"ok%d" % i for i in range(20)]
        segs = offload_consumed(b, want)
        topic = b.topic(TOPIC)
        assert [m.payload for m in b.tiered.read_committed(topic)] == want
        remote = tmp_path / "remote"
        with_abort = next(s for s in segs if not s.txn_idx_empty)
        assert with_abort.txn_idx_records == 1
        index = remote / object_name(
            TOPIC, with_abort.ledger_id, with_abort.segment_id, "txn_index"
        )
        header = len(AbortedTxnIndex(with_abort.ledger_id).encode())
        with open(index, "r+b") as f:
            f.truncate(header)  # a valid index with no record
        reader = b.tiered.reader()  # a fresh cache
        last = topic.ml.last_position
        got = reader.read_committed(TOPIC, topic.ml, max_read_position=last, aborted=set())
        assert [m.payload for m in got] == want
        assert reader.txn_indexes_rebuilt == 1
        cut = segs[1]
        data = remote / object_name(TOPIC, cut.ledger_id, cut.segment_id, "segment")
        first_frame = 8 + int.from_bytes(data.read_bytes()[0:4], "little")
        with open(data, "r+b") as f:
            f.truncate(first_frame)
        with pytest.raises(CorruptEntryError, match=r"holds \d+ bytes; its metadata says"):
            list(b.tiered.read_committed(topic))


def offload_consumed(b: Broker, values: list[bytes], *, trim: bool = True) -> list[SegmentInfo]:
    """Send ``values`` to TOPIC, consume and ack them all, offload, and wait for the trim."""
    c = b.client("c")
    consumer = c.subscribe(TOPIC, "s")
    p = c.producer(TOPIC)
    for v in values:
        p.send(v)
    while (m := consumer.receive(timeout_ms=300)) is not None:
        consumer.ack(m)
    segs = b.admin.offload(TOPIC)
    if trim:
        _wait_trimmed_past(b, segs[-1].ledger_id)
    return segs


def swap_first_frames(data: Path) -> None:
    """Swap the first two frames of remote segment data (they must be of one length)."""
    raw = data.read_bytes()
    first = 8 + int.from_bytes(raw[0:4], "little")
    second = 8 + int.from_bytes(raw[first : first + 4], "little")
    assert first == second, "the test needs two frames of one length"
    data.write_bytes(raw[first : first + second] + raw[:first] + raw[first + second :])


def test_remote_segment_frames_swapped_are_detected(tmp_path: Path) -> None:
    """Each frame still passes its own checksum; the whole data's crc32c does not."""
    cfg = BrokerConfig(max_entries_per_ledger=5, transaction_timeout_ms=60_000)
    with Broker.open(tmp_path, cfg, registry=None) as b:
        want = [b"ok%02d" % i for i in range(20)]
        segs = offload_consumed(b, want)
        topic = b.topic(TOPIC)
        assert [m.payload for m in b.tiered.read_committed(topic)] == want
        seg = segs[0]
        data = tmp_path / "remote" / object_name(TOPIC, seg.ledger_id, seg.segment_id, "segment")
        assert seg.data_crc32c == crc32c(data.read_bytes())
        swap_first_frames(data)
        # The frames decode (each checksum holds): before the check, ok01 came before ok00.
        entries = decode_segment(seg.ledger_id, seg.first_entry, data.read_bytes())
        first_two = [decode_topic_entry(e)["messages"][0]["payload"] for e in entries[:2]]
        assert first_two == [b"ok01", b"ok00"]
        reader = b.tiered.reader()  # a fresh cache
        last = topic.ml.last_position
        with pytest.raises(CorruptEntryError, match="crc32c of its data") as e:
            list(reader.read_committed(TOPIC, topic.ml, max_read_position=last, aborted=set()))
        assert e.value.position == (seg.ledger_id, seg.first_entry)
    # After a restart the metadata still carries the checksum.
    with (
        Broker.open(tmp_path, cfg, registry=None) as b,
        pytest.raises(CorruptEntryError, match="crc32c of its data"),
    ):
        list(b.tiered.read_committed(b.topic(TOPIC)))


def test_a_ledger_trimmed_while_a_read_runs_comes_from_its_remote_copy(tmp_path: Path) -> None:
    """The read lists local ledgers at its start; one offloaded and trimmed later is not skipped."""
    cfg = BrokerConfig(max_entries_per_ledger=5, transaction_timeout_ms=60_000)
    with Broker.open(tmp_path, cfg, registry=None) as b:
        c = b.client("c")
        consumer = c.subscribe(TOPIC, "s")
        p = c.producer(TOPIC)

        def ack_offload_trim() -> None:
            while (m := consumer.receive(timeout_ms=200)) is not None:
                consumer.ack(m)
            segs = b.admin.offload(TOPIC)
            _wait_trimmed_past(b, segs[-1].ledger_id)

        for i in range(12):
            p.send(b"a%d" % i)
        ack_offload_trim()
        for i in range(12):
            p.send(b"b%d" % i)
        topic = b.topic(TOPIC)
        local_before = [lid for lid, _, _ in topic.ml.ledgers()]
        it = b.tiered.read_committed(topic)
        out = [next(it).payload]  # the read started, in its remote part
        ack_offload_trim()
        assert [lid for lid, _, _ in topic.ml.ledgers()] != local_before
        out += [m.payload for m in it]
        assert out == [b"a%d" % i for i in range(12)] + [b"b%d" % i for i in range(12)]


def test_offload_hold_never_trims_a_topic_no_subscription_consumed(tmp_path: Path) -> None:
    """With a policy, offloaded ledgers of a topic with no subscription stay local.

    Subscriptions read local ledgers only: a later subscription from the
    earliest position must get everything. The hold replaces the cursor of
    the same job from before holds existed (``__tiered``), which let them go.
    """
    data = tmp_path / "data"
    cfg = _config(offload_threshold_bytes=0)
    with Broker.open(data, cfg, registry=None) as b:
        p = b.client("c").producer(TOPIC)
        for i in range(25):
            p.send(b"m%d" % i)
        b.topic(TOPIC).ml.open_cursor(LEGACY_HOLD_CURSOR)  # as an older version left it
    with Broker.open(data, cfg, registry=None) as b:
        ml = b.topic(TOPIC).ml
        assert HOLD_CURSOR in ml.cursor_names()
        assert LEGACY_HOLD_CURSOR not in ml.cursor_names()
        for _ in range(3):
            b.write_snapshots(due_only=False)
            b.maintain_now()
            ml.checkpoint()
        assert b.admin.offloaded_segments(TOPIC)[TOPIC], "the policy offloads"
        assert _drain(b, "late") == [b"m%d" % i for i in range(25)]


def test_without_a_policy_the_offload_hold_stays_until_the_admin_releases_it(
    tmp_path: Path,
) -> None:
    """A broker opened without the policy (a one-off admin run) must not trim un-offloaded data."""
    data = tmp_path / "data"
    with Broker.open(data, _config(offload_threshold_bytes=1 << 40), registry=None) as b:
        p = b.client("c").producer(TOPIC)
        b.client("s").subscribe(TOPIC, "all").close()
        for i in range(25):
            p.send(b"m%d" % i)
        assert HOLD_CURSOR in b.topic(TOPIC).ml.cursor_names()
    with Broker.open(data, _config(), registry=None) as b:  # the policy is off now
        ml = b.topic(TOPIC).ml
        assert HOLD_CURSOR in ml.cursor_names()
        first = ml.first_position
        assert len(_drain(b, "all")) == 25
        for _ in range(3):
            b.write_snapshots(due_only=False)
            b.maintain_now()
            ml.checkpoint()
        assert ml.first_position == first  # nothing offloaded: nothing trimmed
        assert b.admin.release_offload_hold(TOPIC) == 1
        assert HOLD_CURSOR not in ml.cursor_names()
        last = ml.last_position
        assert last is not None
        _wait_trimmed_past(b, last.ledger_id - 1)  # now trimming follows the subscription


def test_aborted_txn_indexes_of_trimmed_ledgers_are_deleted_without_a_policy(
    tmp_path: Path,
) -> None:
    with Broker.open(tmp_path / "data", _config(), registry=None) as b:
        _, aborted = _workload(b, 30)
        assert aborted
        closed = [lid for lid, n, sealed in b.topic(TOPIC).ml.ledgers() if sealed and n]
        _consume_then_check_indexes_pruned(b, closed)


def test_an_abort_whose_marker_follows_an_on_demand_offload_stays_hidden(tmp_path: Path) -> None:
    """No policy: L1 offloaded while its transaction is open; the ABORT lands in L2.

    L1's remote index cannot hold the abort (it had not happened). Found in
    review: without a policy nothing held L2, so once consumed it was trimmed
    without a remote copy, the transaction buffer forgot the abort and
    READ_COMMITTED returned the aborted message (after a restart too). From
    the first upload on, a later ledger stays local until it is offloaded.
    """
    cfg = BrokerConfig(max_entries_per_ledger=4, transaction_timeout_ms=60_000)
    data = tmp_path / "data"

    def rounds(b: Broker) -> None:  # what would trim the consumed ledgers
        ml = b.topic(TOPIC).ml
        for _ in range(5):
            b.write_snapshots(due_only=False)
            b.maintain_now()
            ml.checkpoint()

    def read(b: Broker) -> tuple[list[bytes], list[bytes]]:
        topic = b.topic(TOPIC)
        by_broker = [m.payload for m in b.tiered.read_committed(topic)]
        by_ledger = [  # the ledger's own ABORT markers, no aborted set given
            m.payload
            for m in b.tiered.reader().read_committed(
                topic.full, topic.ml, max_read_position=topic.ml.last_position
            )
        ]
        return by_broker, by_ledger

    with Broker.open(data, cfg, registry=None) as b:
        c = b.client("c")
        consumer = c.subscribe(TOPIC, "s")
        p = c.producer(TOPIC)
        ml = b.topic(TOPIC).ml
        a = c.transaction()
        p.send(b"aborted-a", txn=a)  # L1:0
        a.wait_durable(10_000)
        while (last := ml.last_position) is None or last.entry_id != 3:
            p.send(b"plain")
        p.send(b"plain")  # starts L2: L1 is closed, A still open
        segs = b.admin.offload(TOPIC)
        assert [s.ledger_id for s in segs] == [1] and segs[0].txn_idx_empty
        before = ml.entry_count()
        a.abort()  # its ABORT marker goes to L2
        deadline = time.monotonic() + 20
        while ml.entry_count() == before:
            assert time.monotonic() < deadline, "no ABORT marker"
            time.sleep(0.005)
        while (last := ml.last_position) is None or last.entry_id != 3:
            p.send(b"plain")
        p.send(b"tail")  # L3
        while (m := consumer.receive(timeout_ms=200)) is not None:
            consumer.ack(m)
        rounds(b)
        want = [b"plain"] * 6 + [b"tail"]
        assert read(b) == (want, want)
        assert 2 in [lid for lid, _, _ in ml.ledgers()]  # L2 waits for its upload
        assert 2 in [s.ledger_id for s in b.admin.offload(TOPIC)]
        _wait_trimmed_past(b, 2)  # uploaded: trimming goes on
        b.maintain_now()  # the buffer forgets the abort (its marker is remote now)
        assert not b.topic(TOPIC).tb.aborted
        assert read(b) == (want, want)
    with Broker.open(data, cfg, registry=None) as b:
        assert read(b) == (want, want)


def test_the_offload_hold_of_a_topic_with_remote_segments_stays(tmp_path: Path) -> None:
    """Releasing it is refused (naming the topic); a topic offloaded without it gets it back.

    An older version offloaded on demand without the hold; the next
    maintenance round puts it back, policy or not.
    """
    data = tmp_path / "data"
    with Broker.open(data, _config(), registry=None) as b:
        p = b.client("c").producer(TOPIC)
        for i in range(25):
            p.send(b"m%d" % i)
        assert b.admin.offload(TOPIC)
        ml = b.topic(TOPIC).ml
        assert HOLD_CURSOR in ml.cursor_names()
        with pytest.raises(InvalidArgumentError, match=r"tiered has remote segments") as e:
            b.admin.release_offload_hold(TOPIC)
        assert e.value.details["value"] == TOPIC
        assert HOLD_CURSOR in ml.cursor_names()
        release_trimming(ml)  # as an older version left it
    with Broker.open(data, _config(), registry=None) as b:
        ml = b.topic(TOPIC).ml
        assert HOLD_CURSOR not in ml.cursor_names()
        b.maintain_now()
        assert HOLD_CURSOR in ml.cursor_names()


class _UnreachableFS(MemoryFileSystem):  # type: ignore[misc]
    """An in-memory remote store that can be made unreachable (every call refused)."""

    protocol = "txnstream-unreachable"
    down = False

    def _check(self) -> None:
        if _UnreachableFS.down:
            raise ConnectionRefusedError(111, "remote store unreachable")

    def exists(self, path: str, **kw: Any) -> bool:
        self._check()
        return bool(super().exists(path, **kw))

    def rm_file(self, path: str) -> None:
        self._check()
        super().rm_file(path)

    def pipe_file(self, path: str, value: bytes, *args: Any, **kw: Any) -> None:
        self._check()
        super().pipe_file(path, value, *args, **kw)


@pytest.fixture
def unreachable_fs(tmp_path: Path) -> Iterator[type[_UnreachableFS]]:
    """``_UnreachableFS`` registered with fsspec for one test, and up; unregistered after.

    The test's objects are kept under ``tmp_path.name`` in the in-memory
    store (one table for the process): they are dropped after it too.
    """
    fsspec.register_implementation(_UnreachableFS.protocol, _UnreachableFS, clobber=True)
    try:
        yield _UnreachableFS
    finally:
        _UnreachableFS.down = False
        # fsspec has no unregister: its table behind the read-only ``registry`` view.
        importlib.import_module("fsspec.registry")._registry.pop(_UnreachableFS.protocol, None)
        for key in [k for k in MemoryFileSystem.store if tmp_path.name in k]:
            del MemoryFileSystem.store[key]


def _ok_sends(b: Broker) -> None:
    """A send to the tiered topic and one to a new topic both work."""
    b.client("c1").producer(TOPIC).send(b"x")
    b.client("c2").producer("persistent://public/default/another").send(b"y")


def test_a_remote_store_down_at_start_blocks_no_local_produce(
    tmp_path: Path, unreachable_fs: type[_UnreachableFS]
) -> None:
    """A crash-interrupted upload to clean up while the store is down fails no send.

    Found in review: every topic open ran the clean-up, so every send (even
    to a new topic) raised StorageError while the store was down. It runs in
    the maintenance round, which retries it until the store is back.
    """
    location = f"{_UnreachableFS.protocol}://{tmp_path.name}"
    cfg = _config(offload_threshold_bytes=1 << 40, tiered_storage_location=location)
    data = tmp_path / "data"
    with Broker.open(data, cfg, registry=None) as b:
        p = b.client("c").producer(TOPIC)
        for i in range(12):
            p.send(b"m%d" % i)
    # What kill -9 in the middle of an upload leaves: a STARTED record, a partial object.
    ml = ManagedLedger.open(data, METADATA_LEDGER)
    remote = RemoteStorage(location)
    started = RemoteLogMetadataManager(ml, remote).copy_started(TOPIC, 1, 0, 9, 10, 100)
    partial = object_name(TOPIC, 1, started.segment_id, "segment")
    remote.put(partial, b"partial", "segment")
    ml.close()
    _UnreachableFS.down = True
    with Broker.open(data, cfg, registry=None) as b:
        _ok_sends(b)
        b.maintain_now()  # the clean-up fails: recorded, the round goes on
        assert isinstance(b.tiered_error, StorageError)
        assert "unreachable" in str(b.tiered_error)
        assert b.tiered.clean_up_pending
        _ok_sends(b)
        _UnreachableFS.down = False
        b.maintain_now()  # retried
        assert b.tiered_error is None and not b.tiered.clean_up_pending
        assert b.tiered.metadata.unfinished() == []
        assert not remote._fs.exists(remote._path(partial))


def test_a_corrupt_remote_metadata_record_blocks_no_local_produce(tmp_path: Path) -> None:
    """The record's error comes from tiered reads and offloads, not from every send.

    Found in review: with a policy, every topic open loaded the metadata, so
    one record that does not decode made every send raise CorruptEntryError.
    """
    cfg = _config(offload_threshold_bytes=0)
    data = tmp_path / "data"
    with Broker.open(data, cfg, registry=None) as b:
        p = b.client("c").producer(TOPIC)
        for i in range(25):
            p.send(b"m%d" % i)
        b.maintain_now()
        assert b.admin.offloaded_segments(TOPIC)[TOPIC]
    ml = ManagedLedger.open(data, METADATA_LEDGER)
    bad = ml.append(b"\xff\xff\xff")  # not a RemoteLogSegmentMetadata
    ml.close()
    with Broker.open(data, cfg, registry=None) as b:
        _ok_sends(b)
        assert HOLD_CURSOR in b.topic(TOPIC).ml.cursor_names()  # the policy's hold, still
        b.maintain_now()  # recorded, not raised: trimming and snapshots go on
        assert isinstance(b.tiered_error, CorruptEntryError)
        assert b.tiered_error.position == (bad.ledger_id, bad.entry_id)
        with pytest.raises(CorruptEntryError, match=METADATA_LEDGER):
            b.admin.offloaded_segments(TOPIC)
        with pytest.raises(CorruptEntryError, match=METADATA_LEDGER):
            b.admin.offload(TOPIC)


def test_close_waits_for_the_upload_in_progress_not_the_whole_round(tmp_path: Path) -> None:
    """Found in review: close waited for every selected ledger of every topic (9.6 s slow)."""
    data = tmp_path / "data"
    with Broker.open(data, BrokerConfig(max_entries_per_ledger=4), registry=None) as b:
        p = b.client("c").producer(TOPIC)
        for i in range(50):
            p.send(b"m%d" % i)  # 12 closed ledgers for the policy to upload
    cfg = BrokerConfig(
        max_entries_per_ledger=4, offload_threshold_bytes=0, pending_ack_trim_interval_ms=20
    )
    b = Broker.open(data, cfg, registry=None)
    uploads: list[str] = []
    in_upload, closing = threading.Event(), threading.Event()

    def hold_the_first_upload(kind: str, op: str) -> None:
        if kind == "segment" and op == "put":
            uploads.append(kind)
            if not in_upload.is_set():
                in_upload.set()
                assert closing.wait(20), "close never began"

    set_remote_call_hook(b.tiered.remote, hold_the_first_upload)
    b.topic(TOPIC)  # loaded: the maintenance thread's next round offloads it
    assert in_upload.wait(20), "no offload round began"
    closer = threading.Thread(target=b.close)
    closer.start()
    deadline = time.monotonic() + 20
    while "closed" not in repr(b):
        assert time.monotonic() < deadline, "close did not begin"
        time.sleep(0.005)
    closing.set()  # the upload in progress goes on; the round stops after it
    closer.join(30)
    assert not closer.is_alive(), "close hung"
    assert uploads == ["segment"]


def test_brokers_sharing_a_registry_export_remote_calls_in_one_family(tmp_path: Path) -> None:
    """Found in review: each broker registered its own collector of the same names.

    The exposition then held two families of one name, which Prometheus
    rejects (OpenMetrics: "Clashing name"). One collector per registry
    exports every broker's remote store under its ``broker`` label.
    """
    from prometheus_client.openmetrics.exposition import generate_latest as om_latest
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse
    from prometheus_client.parser import text_string_to_metric_families

    reg = CollectorRegistry()
    brokers = {
        label: Broker.open(tmp_path / label, _config(), registry=reg, metrics_label=label)
        for label in ("one", "two")
    }
    try:
        for b in brokers.values():
            p = b.client("c").producer(TOPIC)
            for i in range(25):
                p.send(b"m%d" % i)
            assert b.admin.offload(TOPIC)
        text = generate_latest(reg).decode()
        assert text.count("# HELP txnstream_tiered_remote_calls_total ") == 1
        exposition = om_latest(reg).decode()  # type: ignore[no-untyped-call]
        parsed = om_parse(exposition)  # type: ignore[no-untyped-call]
        assert [f.name for f in parsed].count("txnstream_tiered_remote_calls") == 1
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        for label, b in brokers.items():
            remote = b.tiered.remote
            for family, counts in (
                ("txnstream_tiered_remote_calls", remote.calls()),
                ("txnstream_tiered_remote_read_bytes", remote.bytes_read()),
            ):
                got = {
                    s.labels["kind"]: s.value
                    for s in fams[family].samples
                    if s.name.endswith("_total") and s.labels["broker"] == label
                }
                assert got == {k: float(v) for k, v in counts.items()}, family
                assert {
                    s.labels["remote"] for s in fams[family].samples if s.labels["broker"] == label
                } == {remote.location}
        brokers.pop("one").close()
        assert 'broker="one"' not in generate_latest(reg).decode()
        assert 'broker="two",kind="segment"' in generate_latest(reg).decode()
    finally:
        for b in brokers.values():
            b.close()
