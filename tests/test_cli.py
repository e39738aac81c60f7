"""The ``txnstream`` command line: ``admin logs`` and ``bench`` (``demo``, ``audit``, the other
admin commands: elsewhere)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from txnstream import ManagedLedger, TransactionCoordinator
from txnstream.cli import main


def test_admin_logs_lists_every_log_with_its_cursors(tmp_path: Path) -> None:
    tc = TransactionCoordinator.open(tmp_path, 3, registry=None)
    t = tc.new_transaction(timeout_ms=60_000)
    tc.end_transaction(t, "commit")
    tc.close()
    ml = ManagedLedger.open(tmp_path, "in-sub__transaction_pending_ack", max_entries_per_ledger=2)
    positions = [ml.append(b"x%d" % i) for i in range(5)]
    cur = ml.open_cursor("pending-ack")
    cur.mark_delete(positions[0])  # a ledger only part consumed: nothing trimmed
    cur.flush()
    ml.close()
    ManagedLedger.open(tmp_path, "plain").close()

    res = CliRunner().invoke(main, ["admin", "--data", str(tmp_path), "logs", "--json"])
    assert res.exit_code == 0, res.output
    logs = {log["name"]: log for log in json.loads(res.stdout)}
    assert set(logs) == {
        "__transaction_log_3",
        "__terminated_txn_state_3",  # the coordinator's record of ended transactions
        "in-sub__transaction_pending_ack",
        "plain",
    }
    assert {n: log["kind"] for n, log in logs.items()} == {
        "__transaction_log_3": "txn",
        "__terminated_txn_state_3": "other",
        "in-sub__transaction_pending_ack": "pending_ack",
        "plain": "other",
    }
    pa = logs["in-sub__transaction_pending_ack"]
    assert (pa["ledgers"], pa["entries"]) == (3, 5)
    assert pa["first"] == f"{positions[0].ledger_id}:{positions[0].entry_id}"
    assert pa["last"] == f"{positions[4].ledger_id}:{positions[4].entry_id}"
    assert pa["cursors"] == {"pending-ack": f"{positions[0].ledger_id}:{positions[0].entry_id}"}
    assert logs["plain"]["entries"] == 0 and logs["plain"]["last"] is None
    assert logs["__transaction_log_3"]["entries"] > 0

    table = CliRunner().invoke(
        main, ["admin", "--data", str(tmp_path), "logs"], env={"COLUMNS": "250"}
    )
    assert table.exit_code == 0 and "in-sub__transaction_pending_ack" in table.output
    missing = CliRunner().invoke(main, ["admin", "--data", str(tmp_path / "nope"), "logs"])
    assert missing.exit_code == 2 and "does not exist" in missing.output


def test_bench_reports_what_it_ran() -> None:
    res = CliRunner().invoke(main, ["bench", "--txns", "300", "--threads", "3", "--json"])
    assert res.exit_code == 0, res.output
    figures = json.loads(res.stdout)
    assert (figures["transactions"], figures["threads"]) == (300, 3)
    # NEW, ADD_PARTITION, COMMITTING, COMMITTED per transaction, all read back.
    assert figures["log_records"] == 4 * 300
    assert 1 <= figures["log_entries"] <= figures["log_records"]
    assert figures["transactions_per_second"] > 0 and figures["scan_records_per_second"] > 0
    bad = CliRunner().invoke(main, ["bench", "--txns", "0"])
    assert bad.exit_code == 2 and "--txns" in bad.output


def test_audit_of_a_directory_without_logs_is_an_error_not_a_verdict(tmp_path: Path) -> None:
    # Fails before Spark starts: no SparkSession is needed to see it.
    (tmp_path / "data").mkdir()
    res = CliRunner().invoke(main, ["audit", str(tmp_path / "data"), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2, res.output
    assert "StorageError" in res.output and "no CATALOG" in res.output
    assert not (tmp_path / "o").exists()
