"""The audit job: reports every planted violation (and nothing else), passes a clean run,
and its HTML report renders in a real browser."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image
from pyspark.sql import SparkSession

from tests.spark.engine import Participants, Plant, open_coordinator, workload
from txnstream import ManagedLedger, frame
from txnstream._native import (
    encode_txn_add_partitions,
    encode_txn_new,
    encode_txn_update,
)
from txnstream.cli import main
from txnstream.coordinator import TxnID
from txnstream.datadir import batch_stats
from txnstream.errors import InvalidArgumentError
from txnstream.spark.audit import AuditOptions, AuditResult, run_audit, violation_rows

ROOT = Path(__file__).resolve().parents[2]
PENDING = "in-sub__transaction_pending_ack"
OPEN, COMMITTING, COMMITTED, ABORTED = 0, 1, 2, 4


@dataclass
class Planted:
    """A data directory with violations planted, what the audit must say, and its result."""

    data: Path
    expected: set[tuple[str, TxnID | None]]
    positions: dict[str, tuple[str, int, int, int]]
    outcome: dict[TxnID, str]
    result: AuditResult
    violations: list[dict[str, Any]]


def _txn(v: dict[str, Any]) -> TxnID | None:
    """The violation's transaction; None for a record too damaged to name one."""
    if v["txnid_most_bits"] is None:
        return None
    return TxnID(v["txnid_most_bits"], v["txnid_least_bits"])


@pytest.fixture(scope="module")
def planted(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Planted:
    d = tmp_path_factory.mktemp("planted")
    plant = Plant()
    parts = Participants(d, plant)
    tc = open_coordinator(d, parts, batched_write_enabled=True, batched_write_max_records=16)
    outcome = workload(tc, parts, 40)  # a clean background the audit must not flag
    log = parts.subscription("in", "sub")
    expected: set[tuple[str, TxnID | None]] = set()
    positions: dict[str, tuple[str, int, int, int]] = {}

    def txn(subs: list[tuple[str, str]]) -> TxnID:
        t = tc.new_transaction(timeout_ms=600_000)
        if subs:
            tc.add_acked_subscriptions(t, subs)
        return t

    # A COMMITTED transaction whose pending-ack COMMIT record is missing.
    t = txn([("in", "sub")])
    p = log.ack(t, [(9, 0, 1, 0)])
    positions["missing_commit_ack"] = (PENDING, p.ledger_id, p.entry_id, p.batch_index)
    plant.skip_commit.add(t)
    tc.end_transaction(t, "commit")
    outcome[t] = "COMMITTED"
    expected.add(("missing_pending_ack_commit", t))
    # An aborted transaction whose acks were applied (COMMIT instead of ABORT).
    t = txn([("in", "sub")])
    log.ack(t, [(9, 1, 1, 0)])
    plant.commit_on_abort.add(t)
    tc.end_transaction(t, "abort")
    outcome[t] = "ABORTED"
    expected |= {("aborted_ack_committed", t), ("missing_pending_ack_abort", t)}
    # Two committed transactions ack the same batch index of one message (consumed twice)...
    a, b = txn([("in", "sub")]), txn([("in", "sub")])
    log.ack(a, [(9, 2, 8, 3)])
    log.ack(b, [(9, 2, 8, 3)])
    # ... while two others ack different indexes of another message: not a double ack.
    c, e = txn([("in", "sub")]), txn([("in", "sub")])
    log.ack(c, [(9, 3, 8, 4)])
    log.ack(e, [(9, 3, 8, 5)])
    tc.end_transactions([(x, "commit") for x in (a, b, c, e)])
    outcome.update({x: "COMMITTED" for x in (a, b, c, e)})
    expected.add(("double_ack", a))
    # Acks in a subscription the coordinator was never told about: nobody ends them.
    t = txn([])
    parts.subscription("in", "other").ack(t, [(9, 4, 1, 0)])
    tc.end_transaction(t, "commit")
    outcome[t] = "COMMITTED"
    expected |= {("unregistered_subscription", t), ("missing_pending_ack_commit", t)}
    # An ack after the transaction's COMMIT in the same log: never resolved.
    t = txn([("in", "sub")])
    log.ack(t, [(9, 5, 1, 0)])
    tc.end_transaction(t, "commit")
    late = log.ack(t, [(9, 6, 1, 0)])
    positions["late_ack"] = (PENDING, late.ledger_id, late.entry_id, late.batch_index)
    outcome[t] = "COMMITTED"
    expected.add(("ack_after_end", t))
    tc.close()
    parts.close()

    # A damaged record in the pending-ack log, and a commit that turns into an abort.
    ml = ManagedLedger.open(d, PENDING)
    bad = ml.append(frame.encode_batch([b"\x08\x01\x18\x00\x20\x05", b"\x08\x01\x2a\xff"]))
    ml.close()
    positions["corrupt"] = (PENDING, bad.ledger_id, bad.entry_id, 1)
    expected.add(("corrupt_record", None))
    victim = next(t for t, s in outcome.items() if s == "COMMITTED")
    ml = ManagedLedger.open(d, "__transaction_log_0")
    flip = ml.append(encode_txn_update(victim.most_bits, victim.least_bits, 1, COMMITTED, ABORTED))
    ml.close()
    positions["flip"] = ("__transaction_log_0", flip.ledger_id, flip.entry_id, 0)
    expected.add(("invalid_transition", victim))
    # ... so by the log the victim ended ABORTED while its acks were committed.
    expected |= {("aborted_ack_committed", victim), ("missing_pending_ack_abort", victim)}
    outcome[victim] = "ABORTED"  # the last record wins; the audit says it is invalid
    # Coordinator-log records a correct coordinator never writes, appended as
    # its storage would: an id begun a second time, a partition added after
    # the commit, and a transaction whose COMMITTED record was lost (it stays
    # COMMITTING: stuck, not a violation, since recovery finishes it).
    reused, added = [t for t, s in outcome.items() if s == "COMMITTED"][1:3]
    stuck = TxnID(0, 10_000)
    t0 = int(time.time() * 1000)
    ml = ManagedLedger.open(d, "__transaction_log_0")
    again = ml.append(encode_txn_new(reused.most_bits, reused.least_bits, t0, 600_000, "again"))
    late_add = ml.append(
        frame.encode_batch(
            [
                encode_txn_add_partitions(added.most_bits, added.least_bits, t0, ["late"]),
                encode_txn_new(stuck.most_bits, stuck.least_bits, t0, 600_000, "stuck"),
                encode_txn_update(stuck.most_bits, stuck.least_bits, t0 + 1, OPEN, COMMITTING),
            ]
        )
    )
    ml.close()
    positions["again"] = ("__transaction_log_0", again.ledger_id, again.entry_id, 0)
    positions["late_add"] = ("__transaction_log_0", late_add.ledger_id, late_add.entry_id, 0)
    expected |= {("reused_transaction_id", reused), ("added_after_decision", added)}
    outcome[stuck] = "COMMITTING"

    # Far enough in the future that every OPEN transaction is past its timeout.
    now = int(time.time() * 1000) + 3_600_000
    result = run_audit(
        d, tmp_path_factory.mktemp("planted-audit"), spark=spark, options=AuditOptions(now_ms=now)
    )
    return Planted(d, expected, positions, outcome, result, violation_rows(result, spark))


def test_audit_reports_each_planted_violation_and_nothing_else(planted: Planted) -> None:
    found = {(v["kind"], _txn(v)) for v in planted.violations}
    assert found == planted.expected
    assert planted.result.verdict == "FAIL"
    assert planted.result.summary["violations"]["total"] == len(planted.violations)


def test_each_violation_names_its_positions(planted: Planted) -> None:
    def at(kind: str) -> list[tuple[str, int, int, int]]:
        (v,) = [v for v in planted.violations if v["kind"] == kind]
        return [(p["log"], p["ledger_id"], p["entry_id"], p["batch_index"]) for p in v["positions"]]

    missing = [v for v in planted.violations if v["kind"] == "missing_pending_ack_commit"]
    assert any(
        planted.positions["missing_commit_ack"]
        in [(p["log"], p["ledger_id"], p["entry_id"], p["batch_index"]) for p in v["positions"]]
        for v in missing
    )
    assert all({p["role"] for p in v["positions"]} == {"ACK", "COMMITTED"} for v in missing)
    assert at("corrupt_record") == [planted.positions["corrupt"]]
    assert at("invalid_transition") == [planted.positions["flip"]]
    end, late = at("ack_after_end")
    assert late == planted.positions["late_ack"] and end < late
    again = at("reused_transaction_id")
    assert len(again) == 2 and again[1] == planted.positions["again"]
    decided, added = at("added_after_decision")
    assert added == planted.positions["late_add"] and decided < added
    (double,) = [v for v in planted.violations if v["kind"] == "double_ack"]
    assert "message 9:2" in double["detail"]
    assert [p["role"] for p in double["positions"]] == ["ACK", "ACK"]


def test_audit_summary_matches_the_engine(planted: Planted, spark: SparkSession) -> None:
    s = planted.result.summary
    want: dict[str, int] = {}
    for status in planted.outcome.values():
        want[status] = want.get(status, 0) + 1
    assert s["transactions"]["by_status"] == want
    # Stuck: every OPEN one (past its timeout at the reference time) and the
    # one whose COMMITTED record was lost.
    assert s["stuck"]["count"] == want["OPEN"] + 1
    stuck = spark.read.parquet(str(planted.result.out_dir / "stuck_transactions")).collect()
    assert {(r["txnid_least_bits"], r["reason"]) for r in stuck if r["status"] != "OPEN"} == {
        (10_000, "decided but not finished")
    }
    # Entries and records: what the ledgers hold.
    entries = records = 0
    for name in ("__transaction_log_0", PENDING, "in-other__transaction_pending_ack"):
        ml = ManagedLedger.open(planted.data, name, read_only=True)
        stored = ml.read_range(ml.first_position, ml.last_position)  # type: ignore[arg-type]
        ml.close()
        entries += len(stored)
        records += sum(len(frame.decode_entry(e)) for _, e in stored)
    assert (s["entries"]["total"], s["entries"]["records"]) == (entries, records)
    assert s["entries"]["saved_by_batching"] == records - entries > 0
    assert s["exactly_once"]["verdict"] == "not_checked"
    # The Parquet tables are there and agree with the summary.
    out = planted.result.out_dir
    assert spark.read.parquet(str(out / "transactions")).count() == len(planted.outcome)
    assert spark.read.parquet(str(out / "stuck_transactions")).count() == want["OPEN"] + 1
    assert json.loads((out / "summary.json").read_text())["verdict"] == "FAIL"


def test_clean_directory_passes_and_cli_prints_json(spark: SparkSession, tmp_path: Path) -> None:
    data = tmp_path / "data"
    parts = Participants(data)
    tc = open_coordinator(data, parts, batched_write_enabled=True, batched_write_max_records=16)
    outcome = workload(tc, parts, 30)
    tc.close()
    parts.close()
    res = CliRunner().invoke(main, ["audit", str(data), "--out", str(tmp_path / "a"), "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["verdict"] == "PASS"
    assert summary["violations"]["total"] == 0
    committed = sum(1 for s in outcome.values() if s == "COMMITTED")
    assert summary["transactions"]["by_status"]["COMMITTED"] == committed
    assert summary["latency_ms"]["by_status"]["COMMITTED"]["count"] == committed
    assert (tmp_path / "a" / "report.html").is_file()
    bad = CliRunner().invoke(main, ["audit", str(data), "--out", str(data / "x")])
    assert bad.exit_code == 2 and "inside DATA_DIR" in bad.output
    # The output is replaced whole: never a directory holding the data, nor
    # one an audit did not write (the API checks as the CLI does).
    (tmp_path / "keep.txt").write_text("keep")
    bad = CliRunner().invoke(main, ["audit", str(data), "--out", str(tmp_path)])
    assert bad.exit_code == 2 and "hold it" in bad.output
    with pytest.raises(InvalidArgumentError, match="neither be, hold nor lie inside"):
        run_audit(data, tmp_path, spark=spark)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(InvalidArgumentError, match="an audit did not write"):
        run_audit(data, mine, spark=spark)
    assert (tmp_path / "keep.txt").is_file() and (mine / "notes.txt").is_file() and data.is_dir()
    assert (tmp_path / "a" / ".txnstream-audit").is_file()  # an earlier audit's: replaceable


def test_audit_of_a_live_directory_finds_nothing_while_a_writer_commits(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Coordinator logs are read before pending-ack logs: no false alarm while they grow."""
    data, stop = tmp_path / "data", tmp_path / "stop"
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.spark.live_writer", str(data), str(stop), "acks"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        ended = 0
        while ended < 200:
            line = child.stdout.readline()  # the child gives up by itself after 300 s
            assert line, "the writer exited early"
            ended = int(line)
        # Mid-run: acks of transactions begun after the coordinator log was read
        # may be there (unknown to it), but nothing is a violation.
        live = run_audit(data, tmp_path / "live", spark=spark)
        assert live.verdict == "PASS", violation_rows(live, spark)
        assert live.summary["pending_ack"]["records_by_op"]["COMMIT"] > 0
        assert live.summary["transactions"]["total"] >= 200
        assert child.poll() is None, "the writer must still be running"
    finally:
        stop.touch()
        out, _ = child.communicate(timeout=60)
    assert child.returncode == 0
    last = int(out.split()[-1]) if out.split() else ended
    final = run_audit(data, tmp_path / "final", spark=spark)
    assert final.verdict == "PASS", violation_rows(final, spark)
    assert final.summary["transactions"]["total"] == last > live.summary["transactions"]["total"]
    assert final.summary["pending_ack"]["transactions_unknown_to_coordinators"] == 0


def _browser() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    return None


def test_report_renders_with_charts_in_headless_chromium(planted: Planted, tmp_path: Path) -> None:
    browser = _browser()
    if browser is None:
        pytest.skip(
            "no headless browser (chromium, chromium-browser or google-chrome on PATH): "
            "install Debian's chromium package (apt-get install chromium) to check that "
            "report.html renders with its charts"
        )
    # Every chart decodes in the browser: a copy of the page reports, once
    # loaded, each image's natural size (dumped with the DOM).
    html = planted.result.report.read_text()
    charts = re.findall(r"<img id='(chart-[a-z]+)'", html)
    assert len(charts) == 6
    probe = tmp_path / "probe.html"
    probe.write_text(
        html.replace(
            "</body>",
            "<script>window.addEventListener('load', () => document.body.setAttribute("
            "'data-loaded', [...document.images].filter(i => i.complete && i.naturalWidth > 0)"
            ".map(i => i.id + ':' + i.naturalWidth + 'x' + i.naturalHeight).join(' ')));"
            "</script></body>",
        )
    )
    dom = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", probe.as_uri()],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    (loaded,) = re.findall(r'data-loaded="([^"]*)"', dom)
    sizes = dict(item.split(":") for item in loaded.split())
    assert sorted(sizes) == sorted(charts)
    for size in sizes.values():
        w, h = map(int, size.split("x"))
        assert w > 200 and h > 150

    shot = tmp_path / "report.png"
    subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--window-size=1400,2600",
            f"--screenshot={shot}",
            planted.result.report.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    img = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    assert img.shape[:2] == (2600, 1400)

    def pixels(rgb: tuple[int, int, int]) -> int:
        return int((np.abs(img - np.array(rgb)).sum(axis=2) < 30).sum())

    # The red FAIL banner, the COMMITTED bars (green), the pending-ack bars
    # (matplotlib blue) and the freed-entries bars (grey) are all on screen.
    assert pixels((0xC6, 0x28, 0x28)) > 20_000
    assert pixels((0x2E, 0x7D, 0x32)) > 5_000
    assert pixels((0x1F, 0x77, 0xB4)) > 2_000
    assert pixels((0x9E, 0x9E, 0x9E)) > 2_000
    assert len(np.unique(img.reshape(-1, 3), axis=0)) > 200  # charts, not a blank page


def test_trimmed_registrations_are_no_violation_and_late_open_ones_are_stuck(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Two review findings on clean data.

    The coordinator log rolled over and the ledger with t1/t2's NEW and
    ADD_SUBSCRIPTION records was trimmed (their COMMITTED records and their
    acks are kept): not an ``unregistered_subscription``. And a transaction
    left OPEN past its timeout, audited after the logs went quiet, is
    stuck (the default reference time is now, not the latest record).
    """
    data = tmp_path / "data"
    parts = Participants(data)
    tc = open_coordinator(data, parts, log_options={"max_entries_per_ledger": 4})
    log = parts.subscription("in", "sub")
    registered = []
    for i in range(2):
        t = tc.new_transaction(timeout_ms=600_000)
        tc.add_acked_subscriptions(t, [("in", "sub")])
        log.ack(t, [(9, i, 1, 0)])
        registered.append(t)
    # Stays open: the coordinator closes before its timeout ends.
    tc.new_transaction(timeout_ms=2_000)
    for t in registered:
        tc.end_transaction(t, "commit")
    for _ in range(6):  # traffic: the coordinator moves its cursor and trims
        tc.end_transaction(tc.new_transaction(timeout_ms=600_000), "commit")
    tc.close()
    parts.close()
    ml = ManagedLedger.open(data, "__transaction_log_0", read_only=True)
    first = ml.first_position
    ml.close()
    assert first is not None and first.ledger_id > 1, "the first ledger was trimmed"
    time.sleep(2.1)  # past its timeout now; the logs' latest record is not
    r = run_audit(data, tmp_path / "a", spark=spark)
    assert r.verdict == "PASS", violation_rows(r, spark)
    assert r.summary["stuck"]["count"] == 1


def test_batch_size_buckets_do_not_overlap() -> None:
    from txnstream.spark.audit import _bucket_label

    labels = {n: _bucket_label(n) for n in (1, 2, 9, 10, 49, 50, 999, 1000, 5000)}
    assert labels == {
        1: "1",
        2: "2-9",
        9: "2-9",
        10: "10-49",
        49: "10-49",
        50: "50-99",
        999: "500-999",
        1000: "1000+",
        5000: "1000+",
    }


def test_flush_triggers_assume_the_broker_default_max_records(planted: Planted) -> None:
    """Without ``max_records``, the largest batch seen was taken for the limit.

    Its batches (16 records here, the writers' limit) always counted as
    flushed by ``max_records``; with the broker's default (512), which no
    batch here reaches, none does, as ``admin batched-log stats`` says.
    """
    batching = planted.result.summary["batching"]
    assert batching
    for b in batching:
        assert b["max_records_assumed"] == 512
        assert b["flush_triggers_inferred"]["max_records"] == 0, b
        assert "1-9" not in b["batch_size_histogram"]
    coordinator = next(b for b in batching if b["log"] == "__transaction_log_0")
    files = batch_stats(planted.data, "coordinator")["total"]
    assert coordinator["flush_triggers_inferred"]["max_records"] == 0
    assert files["flush_triggers"]["max_records"] == 0
    assert coordinator["max_batch"] > 1


def _closed_log(data: Path, n: int) -> Path:
    """A closed data directory with ``n`` workload transactions."""
    parts = Participants(data)
    tc = open_coordinator(data, parts)
    workload(tc, parts, n)
    tc.close()
    parts.close()
    return data


def test_now_ms_zero_is_used_and_the_help_says_what_the_default_is(tmp_path: Path) -> None:
    """``--now-ms 0`` was taken for "not given" (the default, now, was used instead)."""
    data = _closed_log(tmp_path / "data", 3)
    res = CliRunner().invoke(
        main, ["audit", str(data), "--out", str(tmp_path / "a"), "--now-ms", "0", "--json"]
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["reference_time_ms"] == 0
    text = CliRunner().invoke(main, ["audit", "--help"], terminal_width=200).output
    assert "Default: now, or the latest time in the logs if later." in text


@pytest.mark.parametrize("name", ["out[1]", "a:b", "x{y}"])
def test_an_output_path_spark_would_glob_or_parse_is_refused_up_front(
    tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hadoop read ``out[1]`` as a glob and (relative) ``a:b`` as a URI on the Parquet read-back."""
    monkeypatch.chdir(tmp_path)
    data = _closed_log(tmp_path / "data", 2)
    out = Path(name)
    res = CliRunner().invoke(main, ["audit", str(data), "--out", str(out)])
    assert res.exit_code == 2, res.output
    assert name in res.output and "(--out)" in res.output
    assert not out.exists()
    with pytest.raises(InvalidArgumentError, match="choose another output directory") as e:
        run_audit(data, out, master="local[1]")
    assert e.value.details["value"] == str(out)
    assert not out.exists()
