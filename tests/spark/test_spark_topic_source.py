"""Data source ``txnstream``: the same messages as the client's consumers, closed and live.

The oracle is the broker itself: a READ_COMMITTED (or READ_UNCOMMITTED)
consumer of the same topic, whose filtering is the transaction buffer's
in-memory state. Spark reads the files read-only in other processes.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from txnstream import Broker
from txnstream.client import Consumer, Message
from txnstream.config import BrokerConfig
from txnstream.errors import InvalidArgumentError
from txnstream.spark.topic_source import TopicSelection

TOPIC = "persistent://public/default/orders"
DEADLINE_S = 30.0

#: (topic, partition, ledger_id, entry_id, batch_index, value, key, properties,
#: publish_time, producer_name, sequence_id)
Row = tuple[Any, ...]


def read(spark: SparkSession, directory: Path, **options: str) -> DataFrame:
    r = spark.read.format("txnstream").option("path", str(directory))
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def spark_rows(df: DataFrame) -> list[Row]:
    out = []
    for r in df.collect():
        out.append(
            (
                r["topic"],
                r["partition"],
                r["ledger_id"],
                r["entry_id"],
                r["batch_index"],
                bytes(r["value"]),
                r["key"],
                dict(r["properties"]),
                r["publish_time"],
                r["producer_name"],
                r["sequence_id"],
            )
        )
    return sorted(out)


def client_row(m: Message) -> Row:
    mid = m.message_id
    base = m.topic.rsplit("-partition-", 1)[0] if mid.partition >= 0 else m.topic
    return (
        base,
        mid.partition,
        mid.ledger_id,
        mid.entry_id,
        mid.batch_index,
        m.value,
        m.key,
        m.properties,
        m.publish_time,
        m.producer_name,
        m.sequence_id,
    )


def drain(consumer: Consumer, idle_ms: int = 300) -> list[Row]:
    """Every message that arrives until ``idle_ms`` pass without one (deadline: 30 s)."""
    out: list[Row] = []
    deadline = time.monotonic() + DEADLINE_S
    while got := consumer.receive_many(500, idle_ms):
        out.extend(client_row(m) for m in got)
        assert time.monotonic() < deadline, "the consumer never went idle"
    return sorted(out)


class Workload:
    """A partitioned topic with committed, aborted and one open transaction, batched sends too."""

    def __init__(self, directory: Path) -> None:
        config = BrokerConfig(max_entries_per_ledger=5)  # several ledgers per partition
        self.broker = Broker.open(directory, config, registry=None)
        self.broker.create_topic(TOPIC, 2)
        self.client = self.broker.client("writer")
        self.producer = self.client.producer(TOPIC, name="p")
        self.aborted: set[bytes] = set()
        self.open: set[bytes] = set()
        self.sent: set[bytes] = set()
        self.n = 0
        self.open_txn: Any = None

    def send(self, txn: Any = None, batch: int = 1) -> list[bytes]:
        values = [b"m%d" % (self.n + i) for i in range(batch)]
        key, props = f"k{self.n % 5}", {"n": str(self.n)}
        if batch == 1:
            self.producer.send(values[0], key=key, properties=props, txn=txn)
        else:
            self.producer.send_many(values, key=key, properties=props, txn=txn)
        self.n += batch
        self.sent.update(values)
        return values

    def round(self, commit: bool = True) -> None:
        txn = self.client.transaction(timeout_ms=600_000)
        got = [v for i in range(4) for v in self.send(txn, batch=1 + i % 2)]
        if commit:
            txn.commit()
        else:
            txn.abort()
            self.aborted.update(got)

    def write(self) -> None:
        for i in range(3):
            self.send()
            self.round(commit=i != 1)
        # A transaction left open, with committed work and plain sends after it.
        txn = self.open_txn = self.client.transaction(timeout_ms=600_000)
        self.open.update(self.send(txn) + self.send(txn))
        self.round()
        self.round(commit=False)
        self.send(batch=3)

    def close(self) -> None:
        self.broker.close()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Workload]]:
    """The workload's directory with its broker still running (the open transaction stays open)."""
    d = tmp_path_factory.mktemp("topic")
    w = Workload(d)
    try:
        w.write()
        yield d, w
    finally:
        w.close()


def test_read_committed_equals_the_client_consumer(
    spark: SparkSession, live: tuple[Path, Workload]
) -> None:
    d, w = live
    expected = drain(w.client.subscribe(TOPIC, "rc"))
    got = spark_rows(read(spark, d, topic="orders", maxEntriesPerPartition="2"))
    assert got == expected
    values = {r[5] for r in got}
    assert values and not values & (w.aborted | w.open)
    # The open transaction holds back what follows it on its partition only.
    assert values < w.sent - w.aborted - w.open
    assert {r[1] for r in got} == {0, 1}
    # Spark partitions are ledger ranges: several ledgers per partition were read.
    assert len({(r[1], r[2]) for r in got}) > 2


def test_read_uncommitted_shows_aborted_and_open_but_no_marker(
    spark: SparkSession, live: tuple[Path, Workload]
) -> None:
    d, w = live
    expected = drain(w.client.subscribe(TOPIC, "ru", "read_uncommitted"))
    df = read(spark, d, topic="public/default/orders", isolation="READ_UNCOMMITTED")
    got = spark_rows(df)
    assert got == expected
    assert sorted(r[5] for r in got) == sorted(w.sent)  # every message once, no marker rows
    txn_rows = df.where("txnid_least_bits IS NOT NULL").collect()
    assert {bytes(r["value"]) for r in txn_rows} >= w.aborted | w.open


def test_starting_and_ending_positions(spark: SparkSession, live: tuple[Path, Workload]) -> None:
    d, _w = live
    everything = spark_rows(read(spark, d, topic="orders", isolation="read_uncommitted"))
    p0 = [r for r in everything if r[1] == 0]
    p1 = [r for r in everything if r[1] == 1]
    mid = p0[len(p0) // 2]
    at = f"{mid[2]}:{mid[3]}"
    start = json.dumps({"orders": {"0": at}})
    got = spark_rows(
        read(spark, d, topic="orders", isolation="read_uncommitted", startingPositions=start)
    )
    assert got == [r for r in p0 if r[2:4] >= mid[2:4]] + p1
    end = json.dumps({TOPIC: {"0": [mid[2], mid[3]], "1": "earliest"}})
    got = spark_rows(
        read(spark, d, topic="orders", isolation="read_uncommitted", endingPositions=end)
    )
    assert got == [r for r in p0 if r[2:4] < mid[2:4]]
    assert read(spark, d, topic="orders", startingPositions="latest").count() == 0
    # An ending position past READ_COMMITTED's limit is cut at the limit.
    far = json.dumps({"orders": {"0": "99999:0", "1": "99999:0"}})
    committed = spark_rows(read(spark, d, topic="orders"))
    assert spark_rows(read(spark, d, topic="orders", endingPositions=far)) == committed


def test_topic_lists_and_patterns(spark: SparkSession, live: tuple[Path, Workload]) -> None:
    d, _w = live
    everything = spark_rows(read(spark, d, topic="orders"))
    one = spark_rows(read(spark, d, topic="orders-partition-1"))
    assert one == [r for r in everything if r[1] == 1]
    both = spark_rows(read(spark, d, topic="orders-partition-1, orders-partition-0"))
    assert both == everything
    assert spark_rows(read(spark, d, topic="ord*")) == everything
    assert spark_rows(read(spark, d, topic="persistent://public/*/orders-partition-?")) == (
        everything
    )


def test_live_directory_while_a_writer_commits(spark: SparkSession, tmp_path: Path) -> None:
    d = tmp_path / "live"
    w = Workload(d)
    stop = threading.Event()
    failure: list[BaseException] = []

    def writer() -> None:
        deadline = time.monotonic() + 120
        try:
            i = 0
            while not stop.is_set() and time.monotonic() < deadline:
                w.round(commit=i % 3 != 2)
                w.send()
                i += 1
        except BaseException as e:  # reported by the test
            failure.append(e)

    t = threading.Thread(target=writer, daemon=True)
    try:
        for _ in range(3):
            w.round()
        consumer = w.client.subscribe(TOPIC, "live")
        t.start()
        snapshots = []
        for _ in range(2):
            got = spark_rows(read(spark, d, topic="orders"))
            snapshots.append(got)
            assert t.is_alive() and not failure, failure
        seen: list[Row] = []
        last = {r[1]: r[2:5] for r in snapshots[-1]}
        deadline = time.monotonic() + DEADLINE_S
        # The client catches up past what Spark saw on each partition.
        while any(not any(r[1] == p and r[2:5] >= pos for r in seen) for p, pos in last.items()):
            assert time.monotonic() < deadline, "the client never caught up with Spark"
            seen.extend(client_row(m) for m in consumer.receive_many(500, 200))
        seen.sort()
        for got in snapshots:
            ends = {p: max(r[2:5] for r in got if r[1] == p) for p in {r[1] for r in got}}
            assert got == [r for r in seen if r[1] in ends and r[2:5] <= ends[r[1]]]
            assert not {r[5] for r in got} & (w.aborted | w.open)
        assert len(snapshots[1]) >= len(snapshots[0]) > 0
    finally:
        stop.set()
        t.join(timeout=DEADLINE_S)
        w.close()
    assert not t.is_alive() and not failure, failure


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"topic": "orders"}, "path"),
        ({"path": "DIR"}, "topic"),
        ({"path": "DIR/none", "topic": "orders"}, "path"),
        ({"path": "DIR", "topic": "nothing"}, "topic"),
        ({"path": "DIR", "topic": "orders,"}, "topic"),
        ({"path": "DIR", "topic": "bad://x/y/z"}, "topic"),
        ({"path": "DIR", "topic": "orders", "isolation": "serializable"}, "isolation"),
        ({"path": "DIR", "topic": "orders", "isolation": ""}, "isolation"),
        ({"path": "DIR", "topic": "orders", "mode": " "}, "mode"),
        ({"path": "DIR", "topic": "orders-["}, "topic"),
        ({"path": "DIR", "topic": "orders[1]-["}, "topic"),
        ({"path": "DIR", "topic": "orders[!]"}, "topic"),
        (
            {"path": "DIR", "topic": "orders", "startingPositions": '{"orders": {"0": -2.0}}'},
            "startingPositions",
        ),
        ({"path": "DIR", "topic": "orders", "maxEntriesPerPartition": "0"}, "maxEntries"),
        ({"path": "DIR", "topic": "orders", "startingPositions": "first"}, "startingPositions"),
        ({"path": "DIR", "topic": "orders", "startingPositions": "[1]"}, "startingPositions"),
        *(  # int() raised TypeError on these (not a typed error)
            ({"path": "DIR", "topic": "orders", "startingPositions": json}, "startingPositions")
            for json in (
                '{"orders": {"0": [null, 0]}}',
                '{"orders": {"0": [[1], 0]}}',
                '{"orders": {"0": [0, {}]}}',
            )
        ),
        (
            {"path": "DIR", "topic": "orders", "startingPositions": '{"orders": {"0": "1-2"}}'},
            "startingPositions",
        ),
        (
            {"path": "DIR", "topic": "orders", "endingPositions": '{"orders": {"7": "latest"}}'},
            "endingPositions",
        ),
        (
            {"path": "DIR", "topic": "orders", "endingPositions": '{"other": {"0": "1:2"}}'},
            "endingPositions",
        ),
        (
            {"path": "DIR", "topic": "orders", "endingPositions": '{"orders": {"x": "1:2"}}'},
            "endingPositions",
        ),
    ],
)
def test_bad_options_name_the_option(
    live: tuple[Path, Workload], options: dict[str, str], option: str
) -> None:
    d, _w = live
    opts = {k: v.replace("DIR", str(d)) for k, v in options.items()}
    with pytest.raises(InvalidArgumentError, match=f"option {option}") as err:
        TopicSelection.from_options(opts)
    assert err.value.argument.startswith(option)  # type: ignore[attr-defined]


def test_bad_option_through_spark(spark: SparkSession, live: tuple[Path, Workload]) -> None:
    d, _w = live
    with pytest.raises(Exception, match="option isolation must be one of"):
        read(spark, d, topic="orders", isolation="dirty").collect()


def run_stream(
    spark: SparkSession, directory: Path, out: Path, checkpoint: Path, topic: str = "orders"
) -> None:
    """One ``availableNow`` run of a streaming query into Parquet, from its checkpoint."""
    df = spark.readStream.format("txnstream").option("path", str(directory)).option("topic", topic)
    query = (
        df.load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(120), "the streaming query did not finish in 120 s"
    finally:
        query.stop()
    assert query.exception() is None, query.exception()


def test_streaming_query_restarted_from_its_checkpoint(spark: SparkSession, tmp_path: Path) -> None:
    d, out, ckpt = tmp_path / "data", tmp_path / "out", tmp_path / "ckpt"
    w = Workload(d)
    try:
        w.write()  # one transaction stays open: its partition is held back
        run_stream(spark, d, out, ckpt)
        first = spark_rows(spark.read.parquet(str(out)))
        assert first and not {r[5] for r in first} & (w.aborted | w.open)
        # More work, and the open transaction's end: the restarted query reads only what is new.
        w.round()
        w.round(commit=False)
        w.open_txn.commit()
        w.send(batch=2)
        run_stream(spark, d, out, ckpt)
        second = spark_rows(spark.read.parquet(str(out)))
        assert first == [
            r
            for r in second
            if r[2:5] <= max((x[2:5] for x in first if x[1] == r[1]), default=(-1,))
        ]
        assert {r[5] for r in second} >= w.open  # committed after the first run
        assert second == drain(w.client.subscribe(TOPIC, "stream-check"))
        assert len({(*r[2:5], r[1]) for r in second}) == len(second)  # no repeats
    finally:
        w.close()
    # The closed directory reads the same (nothing was open at the close).
    assert spark_rows(read(spark, d, topic="orders")) == second
