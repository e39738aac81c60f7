"""Data source ``txnstream`` over tiered storage: ledgers offloaded and trimmed locally.

The oracles: the broker's own READ_COMMITTED read over remote and local data
(``broker.tiered.read_committed``), and the same Spark read of the directory
taken before anything was offloaded (every column, both isolations).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from tests.spark.test_spark_topic_source import run_stream
from tests.test_tiered_broker import offload_consumed, swap_first_frames
from txnstream import Broker, Position
from txnstream._native import AbortedTxnIndex, ManagedLedger, encode_message
from txnstream.config import BrokerConfig
from txnstream.errors import CorruptEntryError, InvalidArgumentError, StorageError
from txnstream.spark.topic_source import (
    TopicRange,
    TopicSelection,
    TopicStreamReader,
    read_marker_range,
    read_topic_range,
)
from txnstream.tiered import object_name

TOPIC = "persistent://public/default/tiered"

Row = tuple[Any, ...]


def spark_rows(spark: SparkSession, directory: Path, isolation: str, **options: str) -> list[Row]:
    r = (
        spark.read.format("txnstream")
        .option("path", str(directory))
        .option("topic", TOPIC)
        .option("isolation", isolation)
    )
    for k, v in options.items():
        r = r.option(k, v)
    out = []
    for x in r.load().collect():
        out.append(
            (
                x["ledger_id"],
                x["entry_id"],
                x["batch_index"],
                x["batch_size"],
                bytes(x["value"]),
                x["key"],
                tuple(sorted(dict(x["properties"]).items())),
                x["publish_time"],
                x["producer_name"],
                x["sequence_id"],
                x["txnid_most_bits"],
                x["txnid_least_bits"],
            )
        )
    return sorted(out)


def workload(broker: Broker) -> tuple[set[bytes], set[bytes], set[bytes]]:
    """Plain, batched and transactional sends, some aborted, one transaction left open.

    Returns the committed, aborted and open payloads.
    """
    client = broker.client("w")
    producer = client.producer(TOPIC, name="tp")
    committed: set[bytes] = set()
    aborted: set[bytes] = set()
    for i in range(40):
        producer.send(b"plain%d" % i, key=f"k{i % 3}", properties={"i": str(i)})
        committed.add(b"plain%d" % i)
        t = client.transaction(timeout_ms=600_000)
        vals = [b"t%d-%d" % (i, k) for k in range(1 + i % 3)]
        if i % 2:
            producer.send_many(vals, key="batch", properties={"b": "1"}, txn=t)
        else:
            for v in vals:
                producer.send(v, txn=t)
        if i % 4 == 1:
            t.abort()
            aborted.update(vals)
        else:
            t.commit()
            committed.update(vals)
    open_txn = client.transaction(timeout_ms=600_000)
    producer.send(b"open", txn=open_txn)
    producer.send(b"after-open")  # committed, but past the read limit
    return committed, aborted, {b"open", b"after-open"}


def wait_trimmed_past(broker: Broker, ledger_id: int) -> None:
    ml = broker.topic(TOPIC).ml
    deadline = time.monotonic() + 30
    while (ml.first_position or Position(0, 0)).ledger_id <= ledger_id:
        assert time.monotonic() < deadline, f"ledgers up to {ledger_id} were not trimmed"
        broker.write_snapshots(due_only=False)  # trimming waits for a snapshot to cover it
        broker.maintain_now()
        ml.checkpoint()
        time.sleep(0.02)


def drain(broker: Broker) -> list[tuple[Any, ...]]:
    """What the READ_COMMITTED subscription ``rc`` receives (all acked)."""
    consumer = broker.client("r").subscribe(TOPIC, "rc")
    out = []
    deadline = time.monotonic() + 30
    while (m := consumer.receive(timeout_ms=300)) is not None:
        mid = m.message_id
        row = (mid.ledger_id, mid.entry_id, mid.batch_index, m.value, m.key, m.producer_name)
        out.append((*row, m.sequence_id))
        consumer.ack(m)
        assert time.monotonic() < deadline, "the consumer never went idle"
    consumer.close()
    return sorted(out)


def comparable(rows: list[Row]) -> list[tuple[Any, ...]]:
    return sorted((r[0], r[1], r[2], r[4], r[5], r[8], r[9]) for r in rows)


def test_offloaded_and_trimmed_ledgers_read_from_remote(
    spark: SparkSession, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    config = BrokerConfig(max_entries_per_ledger=10, transaction_timeout_ms=60_000)
    with Broker.open(data, config, registry=None) as broker:
        broker.create_topic(TOPIC, 0)
        broker.client("r").subscribe(TOPIC, "rc").close()  # keeps data local until consumed
        committed, aborted, late = workload(broker)
        before = {
            iso: spark_rows(spark, data, iso) for iso in ("read_committed", "read_uncommitted")
        }
        assert {r[4] for r in before["read_committed"]} == committed
        assert {r[4] for r in before["read_uncommitted"]} == committed | aborted | late

        segs = broker.admin.offload(TOPIC)
        assert len(segs) >= 5 and any(not s.txn_idx_empty for s in segs)
        consumed = drain(broker)
        assert comparable(before["read_committed"]) == consumed
        wait_trimmed_past(broker, segs[len(segs) // 2].ledger_id)
        first_local = broker.topic(TOPIC).ml.first_position
        assert first_local is not None

        sel = TopicSelection.from_options({"path": str(data), "topic": TOPIC})
        ranges = sel.ranges()
        remote = [r for r in ranges if r.segment_id is not None]
        assert remote and all(r.ledger_id < first_local.ledger_id for r in remote)
        assert len({r.segment_id for r in remote}) == len(remote)  # one per segment

        after = {iso: spark_rows(spark, data, iso) for iso in before}
        assert after == before  # the same rows, every column, trimmed ledgers from remote
        assert min(r[0] for r in after["read_committed"]) < first_local.ledger_id
        assert comparable(after["read_committed"]) == consumed

    # Remote storage somewhere else (the broker's fileSystemURI): option remote.
    moved = tmp_path / "elsewhere"
    shutil.move(str(data / "remote"), moved)
    with pytest.raises(InvalidArgumentError, match="remote"):
        TopicSelection.from_options({"path": str(data), "topic": TOPIC}).ranges()
    for iso, rows in before.items():
        assert spark_rows(spark, data, iso, remote=str(moved)) == rows

    # A damaged aborted-txn index: the segment's ABORT markers decide, nothing is written.
    seg = next(s for s in segs if not s.txn_idx_empty and s.ledger_id < first_local.ledger_id)
    index = moved / object_name(seg.topic, seg.ledger_id, seg.segment_id, "txn_index")
    damaged = bytearray(index.read_bytes())
    damaged[-1] ^= 0xFF
    index.write_bytes(bytes(damaged))
    assert spark_rows(spark, data, "read_committed", remote=str(moved)) == before["read_committed"]
    assert index.read_bytes() == bytes(damaged)


def test_a_task_checks_its_remote_segment_whole(tmp_path: Path) -> None:
    """Frames swapped inside a segment (each checksum holds) fail the task, rows and markers."""
    data = tmp_path / "data"
    config = BrokerConfig(max_entries_per_ledger=5, transaction_timeout_ms=60_000)
    with Broker.open(data, config, registry=None) as broker:
        seg = offload_consumed(broker, [b"ok%02d" % i for i in range(10)], trim=False)[0]
    remote = data / "remote"
    part = TopicRange(
        TOPIC,
        TOPIC,
        -1,
        seg.ledger_id,
        seg.first_entry,
        seg.last_entry,
        frozenset(),
        segment_id=seg.segment_id,
        remote=str(remote),
        segment_first_entry=seg.first_entry,
        segment_size=seg.size_bytes,
        segment_crc32c=seg.data_crc32c,
    )
    assert sum(b.num_rows for b in read_topic_range(str(data), part)) == 5
    swap_first_frames(remote / object_name(TOPIC, seg.ledger_id, seg.segment_id, "segment"))
    for read in (read_topic_range, read_marker_range):
        with pytest.raises(CorruptEntryError, match="crc32c of its data"):
            list(read(str(data), part))


def test_a_remote_txn_index_cut_short_is_rebuilt_from_the_markers(tmp_path: Path) -> None:
    """An index cut at a record boundary still decodes: it is counted against its metadata.

    The broker's reader did; Spark tasks trusted it and returned the lost
    records' aborted transactions as committed.
    """
    data = tmp_path / "data"
    config = BrokerConfig(max_entries_per_ledger=5, transaction_timeout_ms=60_000)
    with Broker.open(data, config, registry=None) as broker:
        client = broker.client("c")
        consumer = client.subscribe(TOPIC, "s")
        producer = client.producer(TOPIC)
        txn = client.transaction()
        producer.send(b"aborted-1", txn=txn)
        producer.send(b"aborted-2", txn=txn)
        txn.abort()
        for i in range(12):
            producer.send(b"plain%d" % i)
        while (m := consumer.receive(300)) is not None:
            consumer.ack(m)
        segments = broker.admin.offload(TOPIC)
        wait_trimmed_past(broker, segments[-1].ledger_id)
    seg = next(s for s in segments if not s.txn_idx_empty)
    assert seg.txn_idx_records == 1
    index = data / "remote" / object_name(seg.topic, seg.ledger_id, seg.segment_id, "txn_index")
    header = len(AbortedTxnIndex.rebuild(seg.ledger_id, []).encode())
    index.write_bytes(index.read_bytes()[:header])  # its one record cut off: still decodes
    sel = TopicSelection.from_options({"path": str(data), "topic": TOPIC})
    got = [v for part in sel.ranges() for v in _values(data, [part])]
    assert sorted(got) == sorted(b"plain%d" % i for i in range(12))


def test_damaged_entry_fails_the_task_naming_its_position(tmp_path: Path) -> None:
    name = "persistent://public/default/damaged"
    ml = ManagedLedger.open(str(tmp_path), name)
    good = encode_message(b"ok", "p", 1, 5)
    ml.append(good)
    bad = bytearray(good)
    bad[-1] ^= 1  # the payload no longer matches the checksum
    pos = ml.append(bytes(bad))
    ml.close()
    part = TopicRange(name, name, -1, pos.ledger_id, 0, pos.entry_id, frozenset())
    with pytest.raises(CorruptEntryError) as e:
        list(read_topic_range(str(tmp_path), part))
    assert e.value.position == (pos.ledger_id, pos.entry_id)


def test_streaming_reads_offloaded_ledgers_from_remote(spark: SparkSession, tmp_path: Path) -> None:
    """A query started at ``earliest`` after an offload and a trim loses nothing."""
    data = tmp_path / "data"
    config = BrokerConfig(max_entries_per_ledger=10, transaction_timeout_ms=60_000)
    with Broker.open(data, config, registry=None) as broker:
        broker.create_topic(TOPIC, 0)
        broker.client("r").subscribe(TOPIC, "rc").close()
        committed, _aborted, _late = workload(broker)
        segs = broker.admin.offload(TOPIC)
        drain(broker)
        wait_trimmed_past(broker, segs[len(segs) // 2].ledger_id)
        first_local = broker.topic(TOPIC).ml.first_position
        assert first_local is not None
        batch = spark_rows(spark, data, "read_committed")
        assert {r[4] for r in batch} == committed
        out = tmp_path / "out"
        run_stream(spark, data, out, tmp_path / "checkpoint", topic=TOPIC)
        streamed = spark.read.parquet(str(out)).collect()
        got = sorted((x["ledger_id"], x["entry_id"], x["batch_index"]) for x in streamed)
        assert got == sorted((r[0], r[1], r[2]) for r in batch)  # once each, remote part too
        assert min(g[0] for g in got) < first_local.ledger_id


# ------------------------------------------------------------------ review findings


def _sixty(tmp_path: Path) -> tuple[Broker, Path]:
    data = tmp_path / "data"
    broker = Broker.open(
        data, BrokerConfig(max_entries_per_ledger=10, transaction_timeout_ms=60_000), registry=None
    )
    broker.create_topic(TOPIC, 0)
    broker.client("r").subscribe(TOPIC, "rc").close()
    p = broker.client("w").producer(TOPIC, name="p")
    for i in range(60):
        p.send(b"m%d" % i)
    return broker, data


def _values(data: Path, ranges: list[TopicRange]) -> list[bytes]:
    return [
        v
        for r in ranges
        for b in read_topic_range(str(data), r)
        for v in b.column("value").to_pylist()
    ]


def _offload_and_trim(broker: Broker, offload: bool = True) -> None:
    segs = broker.admin.offload(TOPIC) if offload else []
    drain(broker)
    ml = broker.topic(TOPIC).ml
    last = ml.last_position
    assert last is not None
    wait_trimmed_past(broker, segs[-1].ledger_id if segs else last.ledger_id - 1)


def test_a_range_planned_local_and_trimmed_before_its_task_reads_the_remote_copy(
    tmp_path: Path,
) -> None:
    """Between planning and the task, the broker offloads and trims: nothing is lost."""
    broker, data = _sixty(tmp_path)
    try:
        ranges = TopicSelection.from_options({"path": str(data), "topic": TOPIC}).ranges()
        assert all(r.segment_id is None for r in ranges)  # planned: every ledger local
        _offload_and_trim(broker)
        assert _values(data, ranges) == [b"m%d" % i for i in range(60)]
    finally:
        broker.close()


def test_a_range_trimmed_before_its_task_without_a_remote_copy_raises(tmp_path: Path) -> None:
    broker, data = _sixty(tmp_path)
    try:
        ranges = TopicSelection.from_options({"path": str(data), "topic": TOPIC}).ranges()
        _offload_and_trim(broker, offload=False)
        with pytest.raises(StorageError, match="trimmed after the read was planned"):
            _values(data, ranges)
    finally:
        broker.close()


def test_planning_lists_local_ledgers_before_the_remote_metadata(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An offload and trim right after the local listing: the metadata read later has them."""
    broker, data = _sixty(tmp_path)
    try:
        broker.admin.offload(TOPIC)  # tiered storage exists
        scan = TopicSelection.scan

        def scan_then_trim(self: TopicSelection, ledger: str) -> Any:
            listed = scan(self, ledger)
            _offload_and_trim(broker)
            return listed

        monkeypatch.setattr(TopicSelection, "scan", scan_then_trim)
        ranges = TopicSelection.from_options({"path": str(data), "topic": TOPIC}).ranges()
        monkeypatch.undo()
        assert _values(data, ranges) == [b"m%d" % i for i in range(60)]
    finally:
        broker.close()


def test_a_stream_starts_a_partition_its_checkpoint_lacks_at_the_earliest(tmp_path: Path) -> None:
    """A restarted query whose selection grew reads the new partition's existing messages."""
    broker, data = _sixty(tmp_path)
    try:
        reader = TopicStreamReader(TopicSelection.from_options({"path": str(data), "topic": TOPIC}))
        end = reader.latestOffset({}, None)  # type: ignore[arg-type]
        # The checkpointed start knows no partition (the query started with none).
        parts = reader.partitions({}, end)
        assert _values(data, list(parts)) == [b"m%d" % i for i in range(60)]  # type: ignore[arg-type]
    finally:
        broker.close()


def test_markers_of_offloaded_and_trimmed_ledgers_are_read_from_remote(tmp_path: Path) -> None:
    """Mode ``markers`` reads remote segments too (the audit found every such marker missing)."""
    data = tmp_path / "data"
    config = BrokerConfig(max_entries_per_ledger=10, transaction_timeout_ms=60_000)
    with Broker.open(data, config, registry=None) as broker:
        broker.create_topic(TOPIC, 0)
        broker.client("r").subscribe(TOPIC, "rc").close()
        workload(broker)

        def markers() -> list[tuple[int, int, str]]:
            opts = {"path": str(data), "topic": TOPIC, "mode": "markers"}
            sel = TopicSelection.from_options(opts)
            return sorted(
                (row["ledger_id"], row["entry_id"], row["marker"])
                for r in sel.ranges()
                for b in read_marker_range(str(data), r)
                for row in b.to_pylist()
            )

        before = markers()
        assert {m for _, _, m in before} == {"COMMIT", "ABORT"}
        opts = {"path": str(data), "topic": TOPIC, "mode": "markers"}
        planned = TopicSelection.from_options(opts).ranges()  # every ledger local
        segs = broker.admin.offload(TOPIC)
        drain(broker)
        wait_trimmed_past(broker, segs[len(segs) // 2].ledger_id)
        assert markers() == before  # planned now: remote segments
        # Planned before the trim, read after: the tasks read the remote copies.
        late = sorted(
            (row["ledger_id"], row["entry_id"], row["marker"])
            for r in planned
            for b in read_marker_range(str(data), r)
            for row in b.to_pylist()
        )
        assert late == before
