"""Spark decode of a transaction log (SPEC §6, issue 13): Rust-backed vs Python vs Parquet.

One coordinator log of ``TXNSTREAM_BENCH_SPARK_RECORDS`` records (default 200,000;
the RESULTS figure uses 10,000,000), written by the engine's storage in batched
entries of 512 records (5 records per transaction: NEW, ADD_PARTITION,
ADD_SUBSCRIPTION, COMMITTING, COMMITTED), in ledgers of 2,000 entries. Every
path turns the stored log into the same decoded rows, and Spark materializes
every column of every row (the ``noop`` sink), in one session on ``local[2]``:

- ``datasource_rust``: ``spark.read.format("txnstream-log")`` (Rust scanner,
  Arrow batches from the Rust columnar decoder);
- ``udf_rust``: raw entries (``mode=entries``) exploded through the Arrow UDF
  ``decode_txn_log_entry`` (Rust on whole Arrow buffers);
- ``udf_python_protobuf`` (baseline): the same raw entries through an
  Arrow-optimized Python UDF parsing each entry with the generated protobuf
  classes (upb) and building the rows in Python;
- ``parquet``: Spark's own vectorized Parquet reader on the same rows,
  written once by the data source (the ceiling for feeding Spark);
- ``python_source_no_decode``: the ceiling of the Python Data Source API
  itself for this schema: a Python data source that decodes nothing and
  yields the Parquet copy's rows as ready-made Arrow batches (one partition
  per Parquet file). What it costs is Spark's: Arrow from the Python worker
  to the JVM and the JVM's conversion to rows.

Run: ``TXNSTREAM_BENCH_SPARK_RECORDS=10000000 .venv/bin/pytest
benches/test_spark_decode.py --benchmark-only`` (items/s = records/s; the
ratios are against the Python UDF, the shares against Parquet). Under
``--benchmark-disable`` (``make test``) each path runs once on the small log
and its rows are checked.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import ArrayType, StructType

from txnstream import ManagedLedger, frame
from txnstream._native import (
    encode_txn_add_partitions,
    encode_txn_add_subscriptions,
    encode_txn_new,
    encode_txn_update,
)
from txnstream.proto import txn_log_pb2
from txnstream.spark import session
from txnstream.spark.udfs import TXN_LOG_RECORD, decode_txn_log_entry

#: Transactions of 5 records each: the log holds 5 * TXNS records.
TXNS = max(1, int(os.environ.get("TXNSTREAM_BENCH_SPARK_RECORDS", "200000")) // 5)
ROUNDS = int(os.environ.get("TXNSTREAM_BENCH_SPARK_ROUNDS", "3"))
PER_ENTRY = 512
PER_TXN = 5
RECORDS = TXNS * PER_TXN
LOG = "__transaction_log_0"
GROUP = f"spark-decode-{RECORDS}"
OPEN, COMMITTING, COMMITTED = 0, 1, 2


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    s = session("local[2]", app_name="txnstream-bench-spark")
    s.sparkContext.addPyFile(__file__)  # the Python workers import _py_decode from here
    yield s
    s.stop()


def _txn_records(n: int) -> list[bytes]:
    t0 = 1_700_000_000_000 + n
    return [
        encode_txn_new(0, n, t0, 30_000, f"etl-{n % 16}"),
        encode_txn_add_partitions(0, n, t0 + 1, [f"persistent://public/default/out-{n % 8}"]),
        encode_txn_add_subscriptions(0, n, t0 + 2, [("persistent://public/default/in", "etl")]),
        encode_txn_update(0, n, t0 + 3, OPEN, COMMITTING),
        encode_txn_update(0, n, t0 + 4, COMMITTING, COMMITTED),
    ]


@pytest.fixture(scope="module")
def data(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The log (and its Parquet copy, ``parquet/``) of RECORDS records."""
    d = tmp_path_factory.mktemp("spark-bench")
    ml = ManagedLedger.open(d, LOG, max_entries_per_ledger=2000)
    try:
        pending: list[bytes] = []
        for n in range(TXNS):
            pending.extend(_txn_records(n))
            last = n == TXNS - 1
            if len(pending) >= 256 * PER_ENTRY or last:
                # Whole entries of PER_ENTRY records; only the log's last one is short.
                cut = len(pending) if last else len(pending) - len(pending) % PER_ENTRY
                ml.append_many(
                    [
                        frame.encode_batch(pending[i : min(i + PER_ENTRY, cut)])
                        for i in range(0, cut, PER_ENTRY)
                    ]
                )
                del pending[:cut]
    finally:
        ml.close()
    datasource(spark, d).write.parquet(str(d / "parquet"))
    return d


def datasource(spark: SparkSession, d: Path) -> DataFrame:
    return spark.read.format("txnstream-log").option("path", str(d)).option("log", LOG).load()


def _entries(spark: SparkSession, d: Path) -> DataFrame:
    return (
        spark.read.format("txnstream-log")
        .option("path", str(d))
        .option("log", LOG)
        .option("mode", "entries")
        .load()
    )


_OP = txn_log_pb2.TransactionMetadataEntry.TransactionMetadataOp.Name
_STATUS = txn_log_pb2.TxnStatus.Name


def _py_decode(entry: bytes) -> list[tuple[Any, ...]]:
    """What a Python user writes: the protobuf classes (upb) and a loop building rows."""
    if entry[:2] == b"\x0e\x01":
        records = list(
            txn_log_pb2.BatchedTransactionMetadataEntry.FromString(entry[4:]).transaction_log
        )
    else:
        records = [txn_log_pb2.TransactionMetadataEntry.FromString(entry)]
    n = len(records)
    return [
        (
            n,
            i,
            _OP(m.metadata_op) if m.HasField("metadata_op") else None,
            m.txnid_most_bits,
            m.txnid_least_bits,
            _STATUS(m.expected_status) if m.HasField("expected_status") else None,
            _STATUS(m.new_status) if m.HasField("new_status") else None,
            list(m.partitions),
            [(s.topic, s.subscription) for s in m.subscriptions],
            m.timeout_ms,
            m.start_time,
            m.last_modification_time,
            m.max_local_txn_id,
            m.owner or None,
            m.client_name or None,
            m.timed_out,
            None,
        )
        for i, m in enumerate(records)
    ]


class _ParquetFile(InputPartition):
    def __init__(self, path: str) -> None:
        self.path = path


class _ArrowReplayReader(DataSourceReader):
    def __init__(self, files: list[str]) -> None:
        self.files = files

    def partitions(self) -> list[InputPartition]:
        return [_ParquetFile(f) for f in self.files]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        import pyarrow.parquet as pq

        assert isinstance(partition, _ParquetFile)
        yield from pq.read_table(partition.path).to_batches(max_chunksize=65536)


class ArrowReplaySource(DataSource):
    """Rows already decoded, as Arrow batches: the Python Data Source API's own ceiling."""

    @classmethod
    def name(cls) -> str:
        return "txnstream-bench-arrow-replay"

    def schema(self) -> StructType:
        return StructType.fromJson(json.loads(self.options["schema"]))

    def reader(self, schema: StructType) -> DataSourceReader:
        return _ArrowReplayReader(json.loads(self.options["files"]))


def _replay(spark: SparkSession, d: Path) -> DataFrame:
    spark.dataSource.register(ArrowReplaySource)
    parquet = spark.read.parquet(str(d / "parquet"))
    files = sorted(str(p) for p in (d / "parquet").glob("*.parquet"))
    return (
        spark.read.format(ArrowReplaySource.name())
        .option("schema", parquet.schema.json())
        .option("files", json.dumps(files))
        .load()
    )


def _paths(spark: SparkSession, d: Path) -> dict[str, DataFrame]:
    py_udf = F.udf(_py_decode, ArrayType(TXN_LOG_RECORD), useArrow=True)
    return {
        "datasource_rust": datasource(spark, d),
        "udf_rust": _entries(spark, d)
        .select(F.explode(decode_txn_log_entry("entry")).alias("r"))
        .select("r.*"),
        "udf_python_protobuf": _entries(spark, d)
        .select(F.explode(py_udf("entry")).alias("r"))
        .select("r.*"),
        "parquet": spark.read.parquet(str(d / "parquet")),
        "python_source_no_decode": _replay(spark, d),
    }


def _check(df: DataFrame) -> None:
    """The decoded rows are the log's: every record, every transaction committed once."""
    row = df.agg(
        F.count(F.lit(1)).alias("n"),
        F.sum("txnid_least_bits").alias("ids"),
        F.sum((F.col("new_status") == "COMMITTED").cast("long")).alias("committed"),
        F.sum(F.size("partitions")).alias("partitions"),
        F.count("client_name").alias("named"),
        F.count("error").alias("errors"),
    ).collect()[0]
    assert row["n"] == RECORDS
    assert row["ids"] == PER_TXN * TXNS * (TXNS - 1) // 2
    assert (row["committed"], row["partitions"], row["named"]) == (TXNS, TXNS, TXNS)
    assert row["errors"] == 0


@pytest.mark.parametrize(
    "path",
    ["datasource_rust", "udf_rust", "udf_python_protobuf", "parquet", "python_source_no_decode"],
)
def test_spark_decode(benchmark: Any, spark: SparkSession, data: Path, path: str) -> None:
    df = _paths(spark, data)[path]
    _check(df)
    benchmark.group = GROUP
    benchmark.extra_info["items"] = RECORDS
    benchmark.extra_info["baseline"] = path == "udf_python_protobuf"
    benchmark.extra_info["ceiling"] = path == "parquet"
    benchmark.pedantic(
        lambda: df.write.format("noop").mode("overwrite").save(), rounds=ROUNDS, iterations=1
    )
