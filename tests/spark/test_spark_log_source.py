"""Data source ``txnstream-log``: the same rows as the Python API, closed and live directories."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from tests.spark.engine import Participants, open_coordinator, workload
from tests.spark.reference import python_rows, spark_rows
from txnstream import ManagedLedger, TxnPosition, frame
from txnstream.errors import InvalidArgumentError
from txnstream.replay import replay
from txnstream.spark.log_source import LogSelection

ROOT = Path(__file__).resolve().parents[2]
PENDING = "in-sub__transaction_pending_ack"


def read(spark: SparkSession, directory: Path, **options: str) -> DataFrame:
    r = spark.read.format("txnstream-log").option("path", str(directory))
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


@pytest.fixture(scope="module")
def closed_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A closed directory: a coordinator (batched and unbatched entries) and a pending-ack log."""
    d = tmp_path_factory.mktemp("closed")
    parts = Participants(d)
    tc = open_coordinator(d, parts, batched_write_enabled=True, batched_write_max_records=16)
    workload(tc, parts, 60)
    tc.close()
    # The pending-ack log's own cursor: delete some records and whole entries.
    log = parts.subscription("in", "sub")
    cur = log.ml.open_cursor("pending-ack")
    first = log.ml.first_position
    assert first is not None
    cur.mark_delete(first)
    entries = log.ml.read_range(first, log.ml.last_position)  # type: ignore[arg-type]
    cur.delete([entries[3][0], TxnPosition(entries[5][0].ledger_id, entries[5][0].entry_id, 1, 0)])
    cur.flush()
    parts.close()
    return d


def test_coordinator_log_rows_equal_python_api(spark: SparkSession, closed_dir: Path) -> None:
    df = read(spark, closed_dir, log="__transaction_log_0")
    got = spark_rows(df)
    want = python_rows(closed_dir, "__transaction_log_0", "txn")
    assert got == want
    assert len(got) > 100
    # Both kinds of entries are there, and records of ended transactions are deleted.
    assert {r["batched"] for r in got} == {True, False}
    assert any(r["batch_size"] > 1 for r in got)
    assert {r["deleted"] for r in got} == {True, False}
    # The records not deleted are exactly what replay (recovery) reads.
    ml = ManagedLedger.open(closed_dir, "__transaction_log_0", read_only=True)
    live = replay(ml, "transaction-coordinator")
    ml.close()
    assert {(p.ledger_id, p.entry_id, p.batch_index) for p in live.positions()} == {
        (r["ledger_id"], r["entry_id"], r["batch_index"]) for r in got if not r["deleted"]
    }


def test_pending_ack_log_rows_equal_python_api(spark: SparkSession, closed_dir: Path) -> None:
    got = spark_rows(read(spark, closed_dir, log="*__transaction_pending_ack"))
    want = python_rows(closed_dir, PENDING, "pending_ack")
    assert got == want
    assert {r["op"] for r in got} == {"ACK", "COMMIT", "ABORT"}
    assert any(r["positions"] and r["positions"][0]["ack_set"] for r in got)
    deleted = [r for r in got if r["deleted"]]
    assert 0 < len(deleted) < len(got)
    # Choosing no cursor means nothing is deleted.
    kept = spark_rows(read(spark, closed_dir, log=PENDING, cursors=""))
    assert not any(r["deleted"] for r in kept)


def test_partitions_are_ledgers(spark: SparkSession, tmp_path: Path) -> None:
    parts = Participants(tmp_path)
    tc = open_coordinator(tmp_path, parts, log_options={"max_entries_per_ledger": 40})
    workload(tc, parts, 40)
    tc.close()
    parts.close()
    ml = ManagedLedger.open(tmp_path, "__transaction_log_0", read_only=True)
    ledgers = [lid for lid, n, _ in ml.ledgers() if n > 0]
    ml.close()
    assert len(ledgers) >= 3
    df = read(spark, tmp_path, allCoordinators="true")
    assert df.rdd.getNumPartitions() == len(ledgers)
    split = read(spark, tmp_path, allCoordinators="true", maxEntriesPerPartition="7")
    assert split.rdd.getNumPartitions() > len(ledgers)
    assert (
        spark_rows(split) == spark_rows(df) == python_rows(tmp_path, "__transaction_log_0", "txn")
    )
    small = read(spark, tmp_path, allCoordinators="true", maxRowsPerBatch="3")
    assert spark_rows(small) == spark_rows(df)


def test_all_coordinators_and_entries_mode(spark: SparkSession, tmp_path: Path) -> None:
    parts = Participants(tmp_path)
    for tc_id in (0, 1):
        tc = open_coordinator(tmp_path, parts, tc_id=tc_id)
        workload(tc, parts, 10, first_msg=100 * tc_id)
        tc.close()
    parts.close()
    got = spark_rows(read(spark, tmp_path, allCoordinators="true"))
    assert {r["log"] for r in got} == {"__transaction_log_0", "__transaction_log_1"}
    assert got == python_rows(tmp_path, "__transaction_log_0", "txn") + python_rows(
        tmp_path, "__transaction_log_1", "txn"
    )
    entries = read(spark, tmp_path, log="__transaction_log_1", mode="entries").collect()
    ml = ManagedLedger.open(tmp_path, "__transaction_log_1", read_only=True)
    want = ml.read_range(ml.first_position, ml.last_position)  # type: ignore[arg-type]
    ml.close()
    assert [(r["ledger_id"], r["entry_id"], r["entry"]) for r in entries] == [
        (p.ledger_id, p.entry_id, e) for p, e in want
    ]


def test_malformed_entries_give_null_fields_and_an_error(
    spark: SparkSession, tmp_path: Path
) -> None:
    good = frame.decode_entry(
        frame.encode_batch([b"\x08\x00\x10\x01\x18\x00\x6a\x01c", b"\x08\x03\x10\x01"])
    )
    log = "custom-log"
    ml = ManagedLedger.open(tmp_path, log)
    ml.append(frame.encode_batch(good))  # 0: fine
    ml.append(b"\x0e\x01\x00\x09")  # 1: unknown batch version
    ml.append(b"\x0e\x01\x00\x01\x0a\x09ab")  # 2: truncated record
    ml.append(frame.encode_batch([good[0], b"\xff\xff", good[1]]))  # 3: one bad record
    ml.append(b"\x08\x01\x32\x05ab")  # 4: bare record, string runs past the end
    ml.append(b"\x08\x01\x10\x07\x6a\x0eCORRUPT-ME-XYZ")  # 5: stored bytes damaged below
    ml.append(good[1])  # 6: fine
    ml.close()
    # Flip a byte of entry 5 inside its ledger file: its checksum no longer matches.
    hits = [
        (p, data.index(b"CORRUPT-ME-XYZ"))
        for p in (tmp_path / "ledgers").rglob("*.log")
        if b"CORRUPT-ME-XYZ" in (data := p.read_bytes())
    ]
    assert len(hits) == 1
    path, at = hits[0]
    raw = bytearray(path.read_bytes())
    raw[at] ^= 0xFF
    path.write_bytes(bytes(raw))
    # Closing checkpointed it: the journal holds no other copy to read instead.
    assert not any(b"CORRUPT-ME-XYZ" in s.read_bytes() for s in (tmp_path / "journal").glob("*"))

    rows = spark_rows(read(spark, tmp_path, log=log, kind="txn"))
    by_entry: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        by_entry.setdefault(r["entry_id"], []).append(r)
    assert [len(by_entry[e]) for e in range(7)] == [2, 1, 1, 3, 1, 1, 1]
    fields = ("metadata_op", "txnid_least_bits", "partitions", "client_name")
    for e, why, batch in [
        (1, "unknown batch version", None),
        (2, "corrupt entry", None),
        (4, "record 0", 1),  # an unbatched entry is its one (bad) record
        (5, "corrupt", None),
    ]:
        (r,) = by_entry[e]
        assert why in r["error"], r["error"]
        assert all(r[f] is None for f in fields)
        assert r["batch_size"] == batch and r["batch_index"] == (None if batch is None else 0)
    ok1, bad, ok2 = by_entry[3]
    assert (ok1["metadata_op"], ok1["client_name"], ok1["error"]) == ("NEW", "c", None)
    assert ok2["metadata_op"] == "UPDATE"
    assert bad["batch_index"] == 1 and bad["batch_size"] == 3
    assert bad["error"].startswith("record 1") and bad["metadata_op"] is None
    assert [r["error"] for r in by_entry[0] + by_entry[6]] == [None, None, None]
    assert by_entry[6][0]["metadata_op"] == "UPDATE"
    # Entries mode: the damaged entry is an error row too, the others are intact.
    entries = read(spark, tmp_path, log=log, kind="txn", mode="entries").collect()
    assert [r["entry_id"] for r in entries] == list(range(7))
    assert [r["error"] is None for r in entries] == [True] * 5 + [False, True]
    assert entries[5]["entry"] is None and "corrupt" in entries[5]["error"]
    assert entries[6]["entry"] == good[1]


def test_live_directory_while_a_writer_appends(spark: SparkSession, tmp_path: Path) -> None:
    data, stop = tmp_path / "data", tmp_path / "stop"
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.spark.live_writer", str(data), str(stop)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        ended = 0
        while ended < 400:
            line = child.stdout.readline()
            assert line, "the writer exited early"
            ended = int(line)
        seen = []
        for _ in range(2):
            got = spark_rows(read(spark, data, log="__transaction_log_0"))
            after = python_rows(data, "__transaction_log_0", "txn")
            # A consistent prefix: every row Spark saw is the same record later, ...
            later = {(r["ledger_id"], r["entry_id"], r["batch_index"]): r for r in after}
            for r in got:
                same = later[(r["ledger_id"], r["entry_id"], r["batch_index"])]
                assert {k: v for k, v in r.items() if k != "deleted"} == {
                    k: v for k, v in same.items() if k != "deleted"
                }
                assert same["deleted"] or not r["deleted"]  # deletions only grow
            # ... with nothing missing before its end.
            assert sorted(later)[: len(got)] == [
                (r["ledger_id"], r["entry_id"], r["batch_index"]) for r in got
            ]
            seen.append(len(got))
            assert child.poll() is None, "the writer must still be running"
        assert seen[1] > seen[0] > 0
    finally:
        stop.touch()
        child.wait(timeout=60)
    assert child.returncode == 0
    assert spark_rows(read(spark, data, log="__transaction_log_0")) == python_rows(
        data, "__transaction_log_0", "txn"
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "option path"),
        ({"path": "DIR"}, "option log"),
        ({"path": "DIR", "log": "nothing-here"}, "no log in"),
        ({"path": "DIR", "log": "*"}, "several or unknown kinds"),
        ({"path": "DIR", "log": "x", "allCoordinators": "true"}, "not both"),
        ({"path": "DIR", "allCoordinators": "yes"}, "allCoordinators"),
        ({"path": "DIR", "allCoordinators": "true", "mode": "rows"}, "option mode"),
        ({"path": "DIR", "allCoordinators": "true", "kind": "topic"}, "option kind"),
        ({"path": "DIR", "allCoordinators": "true", "maxRowsPerBatch": "0"}, "maxRowsPerBatch"),
        (
            {"path": "DIR", "allCoordinators": "true", "maxRowsPerBatch": str(1 << 63)},
            "maxRowsPerBatch",
        ),
        (
            {"path": "DIR", "log": "__transaction_log_*", "kind": "pending_ack"},
            "contradicts the logs",
        ),
    ],
)
def test_bad_options_name_the_option(
    closed_dir: Path, options: dict[str, str], message: str
) -> None:
    opts = {k: str(closed_dir) if v == "DIR" else v for k, v in options.items()}
    with pytest.raises(InvalidArgumentError, match=message):
        LogSelection.from_options(opts)


def test_unknown_cursor_is_an_error_not_an_empty_cursor(
    spark: SparkSession, closed_dir: Path
) -> None:
    with pytest.raises(Exception, match="has no cursor 'nope'"):
        read(spark, closed_dir, log=PENDING, cursors="nope").collect()


def test_no_match_with_a_kind_reads_nothing(spark: SparkSession, closed_dir: Path) -> None:
    assert read(spark, closed_dir, log="__transaction_log_9*").count() == 0
