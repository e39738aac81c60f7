"""Arrow-batched UDFs: the same answers as the Python API, nulls and damage handled."""

from __future__ import annotations

import random
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, LongType, StructField, StructType

from tests.spark.engine import Participants, open_coordinator, workload
from tests.spark.reference import python_rows
from txnstream import AckSet, frame
from txnstream.spark import udfs

ENTRIES = StructType([StructField("id", IntegerType()), StructField("entry", BinaryType())])


def test_decode_entry_and_is_batched_match_the_frame_codec(spark: SparkSession) -> None:
    rnd = random.Random(7)
    values: list[bytes | None] = [
        frame.encode_batch([bytes([8, rnd.randrange(4)]) * rnd.randrange(1, 5) for _ in range(n)])
        for n in range(1, 40)
    ]
    values += [b"\x08\x01", b"", None, b"\x0e\x01\x00\x09", b"\x0e\x01\x00\x01\x0a\x09ab"]
    df = spark.createDataFrame(list(enumerate(values)), ENTRIES).repartition(3)
    got = {
        r["id"]: (r["records"], r["batched"])
        for r in df.select(
            "id",
            udfs.decode_entry("entry").alias("records"),
            udfs.is_batched("entry").alias("batched"),
        ).collect()
    }
    for i, v in enumerate(values):
        if v is None:
            assert got[i] == (None, None)
            continue
        try:
            want: list[bytes] | None = frame.decode_entry(v)
        except ValueError:
            want = None  # malformed: null, not a failed task
        assert got[i] == (want, frame.is_batched(v)), i
    # SQL names work too.
    df.createOrReplaceTempView("entries")
    n = spark.sql(
        "select sum(size(txnstream_decode_entry(entry))) n from entries where entry is not null"
    ).collect()[0]["n"]
    assert n == sum(len(frame.decode_entry(v)) for v in values[:41] if v is not None)


def test_decode_txn_log_entry_equals_the_data_source(spark: SparkSession, tmp_path: Path) -> None:
    parts = Participants(tmp_path)
    tc = open_coordinator(tmp_path, parts, batched_write_enabled=True, batched_write_max_records=16)
    workload(tc, parts, 40)
    tc.close()
    parts.close()
    for log, kind, fn in [
        ("__transaction_log_0", "txn", udfs.decode_txn_log_entry),
        ("in-sub__transaction_pending_ack", "pending_ack", udfs.decode_pending_ack_entry),
    ]:
        entries = (
            spark.read.format("txnstream-log")
            .option("path", str(tmp_path))
            .option("log", log)
            .option("mode", "entries")
            .load()
        )
        rows = entries.select(
            "ledger_id", "entry_id", F.posexplode(fn("entry")).alias("i", "r")
        ).select("ledger_id", "entry_id", "r.*")
        got = sorted(
            (r.asDict(recursive=True) for r in rows.collect()),
            key=lambda r: (r["ledger_id"], r["entry_id"], r["batch_index"]),
        )
        drop = ("log", "entry_size", "batched", "deleted")
        want = [
            {k: v for k, v in r.items() if k not in drop} for r in python_rows(tmp_path, log, kind)
        ]
        assert got == want
        assert len(got) > 40


def test_decode_udf_keeps_good_records_next_to_bad_ones(spark: SparkSession) -> None:
    good = b"\x08\x00\x10\x05"
    values = [frame.encode_batch([good, b"\xff\xff", good]), b"\x0e\x01\x00\x09", None]
    df = spark.createDataFrame(list(enumerate(values)), ENTRIES)
    got = {
        r["id"]: r["recs"]
        for r in df.select("id", udfs.decode_txn_log_entry("entry").alias("recs")).collect()
    }
    assert got[2] is None
    a, bad, c = got[0]
    assert (a["txnid_least_bits"], c["txnid_least_bits"], a["error"]) == (5, 5, None)
    assert bad["metadata_op"] is None and bad["error"].startswith("record 1")
    (whole,) = got[1]
    assert "unknown batch version" in whole["error"] and whole["batch_index"] is None


def _words(s: AckSet | None) -> list[int] | None:
    return None if s is None else s.to_words()


def test_ack_set_udfs_match_ackset(spark: SparkSession) -> None:
    rnd = random.Random(11)
    rows: list[tuple[int, list[int] | None, list[int], int]] = []
    sizes: dict[int, int] = {}
    for i in range(300):
        size = rnd.choice([1, 2, 10, 63, 64, 65, 130, 500])
        a, b = AckSet(size), AckSet(size)
        for s in (a, b):
            for _ in range(rnd.randrange(0, size + 1)):
                s.clear(rnd.randrange(size))
        sizes[i] = size
        # Every 50th row: a null set; the next one an invalid batch size (null, not a failure).
        rows.append(
            (i, None if i % 50 == 0 else a.to_words(), b.to_words(), 0 if i % 50 == 1 else size)
        )
    schema = StructType(
        [
            StructField("id", IntegerType()),
            StructField("a", ArrayType(LongType())),
            StructField("b", ArrayType(LongType())),
            StructField("n", IntegerType()),
        ]
    )
    df = spark.createDataFrame(rows, schema).repartition(2)
    out = {
        r["id"]: r
        for r in df.select(
            "id",
            udfs.ack_set_cardinality("a").alias("card"),
            udfs.ack_set_is_empty("a").alias("empty"),
            udfs.ack_set_and("a", "b").alias("and_"),
            udfs.ack_set_overlaps("a", "b", "n").alias("overlap"),
        ).collect()
    }
    checked = 0
    for i, wa, wb, n in rows:
        r = out[i]
        if wa is None:
            assert (r["card"], r["empty"], r["and_"], r["overlap"]) == (None, None, None, None)
            continue
        sa, sb = AckSet.from_words(wa, sizes[i]), AckSet.from_words(wb, sizes[i])
        assert r["card"] == sa.cardinality()
        assert r["empty"] == sa.is_empty()
        assert r["and_"] == (sa & sb).to_words()
        assert r["overlap"] == (None if n == 0 else sa.overlaps(sb))
        checked += 1
    assert checked == 294
