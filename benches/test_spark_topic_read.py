"""Spark reads of topic messages (issue 13): columnar data source vs row-wise vs Parquet.

One topic partition of ``TXNSTREAM_BENCH_TOPIC_MESSAGES`` messages (default
200,000), written straight into its managed ledger with the engine's
encoders: batched entries of 16 messages (key, two properties each), every
fourth entry in a transaction, with a COMMIT marker after it except one in
eight (ABORT: READ_COMMITTED drops those), in ledgers of 2,000 entries.
Every path turns the stored topic into the same READ_COMMITTED rows of the
``txnstream`` schema, and Spark materializes every column of every row (the
``noop`` sink), in one session on ``local[2]``:

- ``columnar``: ``spark.read.format("txnstream")``, tasks read with the Rust
  columnar scan (``scan_topic_columns``) and wrap its buffers as Arrow arrays;
- ``rowwise`` (baseline): the same data source and planning, tasks read as
  the source did before (``read_messages``: one Python tuple per message,
  Arrow arrays built from Python lists), kept here as ``rowwise_range``;
- ``parquet``: Spark's vectorized Parquet reader on the same rows, written
  once by the data source (the ceiling for feeding Spark).

Group ``topic-worker`` times what a Python worker does without Spark: every
record batch of every partition, columnar vs row-wise.

Run: ``TXNSTREAM_BENCH_TOPIC_MESSAGES=2000000 .venv/bin/pytest
benches/test_spark_topic_read.py --benchmark-only`` (items/s = messages/s).
Under ``--benchmark-disable`` each path runs once and its rows are checked.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSourceReader, InputPartition

from txnstream import ManagedLedger
from txnstream._native import Position, encode_batch_message, encode_marker, read_messages
from txnstream.spark import session
from txnstream.spark.columns import arrow_type
from txnstream.spark.topic_source import (
    TOPIC_FIELDS,
    TopicDataSource,
    TopicRange,
    TopicSelection,
    arrow_schema,
    read_topic_range,
)

MESSAGES = max(16, int(os.environ.get("TXNSTREAM_BENCH_TOPIC_MESSAGES", "200000")))
ROUNDS = int(os.environ.get("TXNSTREAM_BENCH_TOPIC_ROUNDS", "3"))
PER_ENTRY = 16
ENTRIES = MESSAGES // PER_ENTRY
TOPIC = "persistent://public/default/bench-topic"
GROUP = f"spark-topic-read-{ENTRIES * PER_ENTRY}"
_READ_CHUNK = 1024
_U64 = 1 << 64


def _aborted_entry(i: int) -> bool:
    return i % 4 == 0 and (i // 4) % 8 == 7


#: Messages READ_COMMITTED returns (aborted transactions' entries dropped).
VISIBLE = sum(PER_ENTRY for i in range(ENTRIES) if not _aborted_entry(i))


# ------------------------------------------------- the row-wise path, as it was


def _i64(values: list[int]) -> pa.Array:
    return pa.array(np.array(values, dtype=np.uint64).view(np.int64), pa.int64())


def _rowwise_batch(part: TopicRange, rows: list[Any]) -> pa.RecordBatch:
    n = len(rows)
    txns = [r[10] for r in rows]
    no_txn = np.array([t is None for t in txns], dtype=np.bool_)
    most = np.array([0 if t is None else t[0] for t in txns], dtype=np.uint64).view(np.int64)
    least = np.array([0 if t is None else t[1] for t in txns], dtype=np.uint64).view(np.int64)
    props_type = arrow_type(TOPIC_FIELDS[-1].dataType)
    arrays = [
        pa.array([r[4] for r in rows], pa.binary()),
        pa.array([r[5] for r in rows], pa.string()),
        pa.array([part.topic] * n, pa.string()),
        pa.array(np.full(n, part.partition, dtype=np.int32)),
        pa.array(np.full(n, part.ledger_id, dtype=np.uint64).view(np.int64)),
        pa.array(np.array([r[1] for r in rows], dtype=np.int64)),
        pa.array(np.array([r[2] for r in rows], dtype=np.int32)),
        pa.array(np.array([r[3] for r in rows], dtype=np.int32)),
        _i64([r[7] for r in rows]),
        pa.array([r[8] for r in rows], pa.string()),
        _i64([r[9] for r in rows]),
        pa.array(most, pa.int64(), mask=no_txn),
        pa.array(least, pa.int64(), mask=no_txn),
        pa.array([list(r[6].items()) if r[6] else [] for r in rows], props_type),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema())


def rowwise_range(path: str, part: TopicRange) -> Iterator[pa.RecordBatch]:
    """The task of the data source before the columnar scan (local ledgers only)."""
    ml = ManagedLedger.open(path, part.ledger, read_only=True)
    try:
        ledger, entry = part.ledger_id, part.first_entry
        after = (
            Position(ledger, entry - 1)
            if entry > 0
            else (Position(ledger - 1, _U64 - 1) if ledger > 0 else None)
        )
        limit = Position(part.ledger_id, part.last_entry + 1)
        while True:
            last, scanned, rows, _markers = read_messages(ml, None, after, limit, _READ_CHUNK)
            if part.aborted:
                rows = [r for r in rows if r[10] is None or r[10] not in part.aborted]
            if rows:
                yield _rowwise_batch(part, rows)
            if scanned == 0 or last is None:
                return
            after = last
    finally:
        ml.close()


class _RowwiseReader(DataSourceReader):
    def __init__(self, sel: TopicSelection) -> None:
        self.sel = sel

    def partitions(self) -> Sequence[InputPartition]:
        return self.sel.ranges()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, TopicRange)
        return rowwise_range(self.sel.path, partition)


class RowwiseTopicDataSource(TopicDataSource):
    """``txnstream`` with the row-wise task reader (the baseline)."""

    @classmethod
    def name(cls) -> str:
        return "txnstream-rowwise"

    def reader(self, schema: Any) -> DataSourceReader:
        return _RowwiseReader(self.selection)


# ------------------------------------------------- data and paths


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    s = session("local[2]", app_name="txnstream-bench-topic")
    s.sparkContext.addPyFile(__file__)  # the Python workers import rowwise_range from here
    s.dataSource.register(RowwiseTopicDataSource)
    yield s
    s.stop()


def _entry(i: int) -> list[bytes]:
    txn = (0, i) if i % 4 == 0 else None
    items = [
        (
            b"value-%d-%d-%s" % (i, k, b"x" * (k % 7) * 8),
            f"key-{(i + k) % 97}",
            [("source", "bench"), ("n", str(i * PER_ENTRY + k))],
            i * PER_ENTRY + k,
        )
        for k in range(PER_ENTRY)
    ]
    out = [encode_batch_message(items, "bench-producer", 1_700_000_000_000 + i, txn)]
    if txn is not None:
        out.append(encode_marker(not _aborted_entry(i), 0, i, 1_700_000_000_000 + i))
    return out


def read(spark: SparkSession, d: Path, fmt: str = "txnstream") -> DataFrame:
    return spark.read.format(fmt).option("path", str(d)).option("topic", TOPIC).load()


@pytest.fixture(scope="module")
def data(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The topic (and its Parquet copy, ``parquet/``)."""
    d = tmp_path_factory.mktemp("topic-bench")
    ml = ManagedLedger.open(d, TOPIC, max_entries_per_ledger=2000)
    try:
        pending: list[bytes] = []
        for i in range(ENTRIES):
            pending.extend(_entry(i))
            if len(pending) >= 512 or i == ENTRIES - 1:
                ml.append_many(pending)
                pending = []
    finally:
        ml.close()
    read(spark, d).write.parquet(str(d / "parquet"))
    return d


def _check(df: DataFrame) -> None:
    row = df.agg(
        F.count(F.lit(1)).alias("n"),
        F.count("txnid_least_bits").alias("in_txn"),
        F.sum(F.size("properties")).alias("props"),
        F.count("key").alias("keys"),
        F.sum(F.length("value")).alias("bytes"),
    ).collect()[0]
    visible_txn = sum(PER_ENTRY for i in range(0, ENTRIES, 4) if not _aborted_entry(i))
    assert row["n"] == VISIBLE
    assert row["in_txn"] == visible_txn
    assert (row["props"], row["keys"]) == (2 * VISIBLE, VISIBLE)
    assert row["bytes"] > 0


def _paths(spark: SparkSession, d: Path) -> dict[str, DataFrame]:
    return {
        "columnar": read(spark, d),
        "rowwise": read(spark, d, "txnstream-rowwise"),
        "parquet": spark.read.parquet(str(d / "parquet")),
    }


@pytest.mark.parametrize("path", ["columnar", "rowwise", "parquet"])
def test_spark_topic_read(benchmark: Any, spark: SparkSession, data: Path, path: str) -> None:
    df = _paths(spark, data)[path]
    _check(df)
    benchmark.group = GROUP
    benchmark.extra_info["items"] = VISIBLE
    benchmark.extra_info["baseline"] = path == "rowwise"
    benchmark.extra_info["ceiling"] = path == "parquet"
    benchmark.pedantic(
        lambda: df.write.format("noop").mode("overwrite").save(), rounds=ROUNDS, iterations=1
    )


@pytest.mark.parametrize("path", ["columnar", "rowwise"])
def test_topic_worker(benchmark: Any, data: Path, path: str) -> None:
    sel = TopicSelection.from_options({"path": str(data), "topic": TOPIC})
    ranges = sel.ranges()
    fn = read_topic_range if path == "columnar" else rowwise_range

    def run() -> list[pa.RecordBatch]:
        return [b for r in ranges for b in fn(str(data), r)]

    batches = run()
    assert sum(b.num_rows for b in batches) == VISIBLE
    if path == "rowwise":  # both paths give the same table
        columnar = pa.Table.from_batches(
            [b for r in ranges for b in read_topic_range(str(data), r)]
        )
        assert pa.Table.from_batches(batches).equals(columnar)
    benchmark.group = f"topic-worker-{ENTRIES * PER_ENTRY}"
    benchmark.extra_info["items"] = VISIBLE
    benchmark.extra_info["baseline"] = path == "rowwise"
    benchmark.pedantic(run, rounds=ROUNDS, iterations=1)
