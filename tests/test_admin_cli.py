"""``txnstream admin --data DIR ...`` on real data directories, live and closed (issue 11, item 4).

A broker runs a small consume-transform-produce workload (a committed, an
aborted and an open transaction); every admin command then runs with
``--json`` and its output, parsed back, must match what the workload did and
what ``broker.admin`` says in the broker's own process. Read commands run on
the live directory (the broker still open: the CLI must not take its lock);
changing commands must refuse there and work once it is closed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from txnstream import Broker, BrokerConfig, CompactedTopic
from txnstream._native import Position
from txnstream.broker.broker import PENDING_ACK_OWNERS as BROKER_PENDING_ACK_OWNERS
from txnstream.broker.broker import TOPICS_REGISTRY as BROKER_TOPICS_REGISTRY
from txnstream.broker.topic import SNAPSHOT_HOLD
from txnstream.buffer.snapshot_reader import snapshot_topic
from txnstream.cli import main
from txnstream.client import Consumer, Message
from txnstream.config import (
    DYNAMIC_CONFIG_FILE,
    apply_dynamic_config,
    read_dynamic_config,
    write_dynamic_config,
)
from txnstream.coordinator import TxnID
from txnstream.datadir import TOPICS_REGISTRY, is_live, transaction_dict
from txnstream.errors import ConfigError
from txnstream.proto import TransactionBufferSnapshot

DEADLINE_S = 10.0
IN = "persistent://public/default/in"
SUB = "etl"
BATCHED = BrokerConfig.from_dict(
    {
        "transactionLogBatchedWriteEnabled": True,
        "transactionPendingAckBatchedWriteEnabled": True,
    }
)


def wait_for(pred: Any, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def cli(data: Path, *args: str, code: int = 0) -> Any:
    """Run ``txnstream admin --data DATA ARGS --json``; return the parsed JSON."""
    res = CliRunner().invoke(main, ["admin", "--data", str(data), *args, "--json"])
    assert res.exit_code == code, res.output
    return json.loads(res.stdout) if code == 0 else res.output


def fail(data: Path | None, *args: str) -> tuple[int, str]:
    """Run an admin command expected to fail: its exit status and output."""
    pre = ["admin"] if data is None else ["admin", "--data", str(data)]
    res = CliRunner().invoke(main, [*pre, *args])
    assert res.exit_code != 0, res.output
    return res.exit_code, res.output


@dataclass
class Workload:
    data: Path
    broker: Broker
    committed: TxnID
    aborted: TxnID
    open: TxnID
    out_partition: str  # the partition of "out" the transactions wrote to
    acked_by_open: str  # "ledger:entry" of the message the open transaction acked


@pytest.fixture
def workload(tmp_path: Path) -> Iterator[Workload]:
    data = tmp_path / "data"
    broker = Broker.open(data, BATCHED, registry=None)
    try:
        broker.admin.create_topic("in", 0)
        broker.admin.create_topic("out", 2)
        client = broker.client("admin-cli-test")
        source = client.producer("in")
        for i in range(6):
            source.send(b"m%d" % i)
        out = client.producer("out")
        consumer = client.subscribe("in", SUB)
        ids = []
        for end in ("commit", "abort", None):
            txn = client.transaction(timeout_ms=600_000)
            msg = consumer.receive(1000)
            assert msg is not None
            out.send(msg.value.upper(), key="k", txn=txn)
            consumer.ack(msg, txn=txn)
            if end == "commit":
                txn.commit()
            elif end == "abort":
                txn.abort()
            else:
                acked = f"{msg.message_id.ledger_id}:{msg.message_id.entry_id}"
            ids.append(txn.txn_id)
        # The final COMMITTED/ABORTED records are written in the background.
        wait_for(lambda: len(broker.admin.open_transactions()) == 1, "the ended transactions")
        info = broker.admin.get_transaction(ids[2])
        assert len(info.partitions) == 1
        yield Workload(data, broker, ids[0], ids[1], ids[2], info.partitions[0], acked)
    finally:
        broker.close()


def test_topics_registry_name_matches_the_broker() -> None:
    from txnstream.datadir import PENDING_ACK_OWNERS

    assert TOPICS_REGISTRY == BROKER_TOPICS_REGISTRY
    assert PENDING_ACK_OWNERS == BROKER_PENDING_ACK_OWNERS


def test_every_read_command_on_a_live_directory_matches_broker_admin(workload: Workload) -> None:
    w, admin = workload, workload.broker.admin
    assert is_live(w.data)

    logs = {log["name"]: log for log in cli(w.data, "logs")}
    assert logs["__transaction_log_0"]["kind"] == "txn"
    assert logs[f"{IN}-{SUB}__transaction_pending_ack"]["kind"] == "pending_ack"
    assert logs[IN]["entries"] == 6

    # coordinator-stats: the counts the coordinator keeps in memory.
    [tc] = cli(w.data, "coordinator-stats")
    [live_tc] = admin.coordinator_stats()
    for key in ("tc_id", "live", "open", "ending", "low_water_mark", "terminated_remembered"):
        assert tc[key] == live_tc[key], key
    assert (tc["live"], tc["open"], tc["low_water_mark"]) == (1, 1, w.open.least_bits - 1)
    assert (tc["remembered_committed"], tc["remembered_aborted"]) == (1, 1)
    assert cli(w.data, "coordinator-stats", "-c", "0") == [tc]

    # open / slow / late transactions and transaction-metadata.
    expected = transaction_dict(admin.get_transaction(w.open))
    [txn] = cli(w.data, "open-transactions")
    assert [t["txn_id"] for t in cli(w.data, "open-transactions")] == [
        str(i.txn_id) for i in admin.open_transactions()
    ]
    for key in ("txn_id", "status", "client_name", "timeout_ms", "start_time", "partitions"):
        assert txn[key] == expected[key], key
    assert txn["subscriptions"] == [{"topic": IN, "subscription": SUB}]
    assert txn["status"] == "OPEN" and txn["timeout_at"] == txn["start_time"] + 600_000
    assert cli(w.data, "transaction-metadata", "--txn-id", str(w.open)) == txn
    assert [t["txn_id"] for t in cli(w.data, "slow-transactions", "--time", "0s")] == [str(w.open)]
    assert cli(w.data, "slow-transactions", "-t", "1d") == []
    assert cli(w.data, "late-transactions") == [] == admin.late_transactions()
    for tid, status in ((w.committed, "COMMITTED"), (w.aborted, "ABORTED")):
        meta = cli(w.data, "transaction-metadata", "-m", "0", "-l", str(tid.least_bits))
        assert meta["status"] == status == admin.get_transaction(tid).status.name
        assert meta["client_name"] == "admin-cli-test"

    # transaction-buffer-stats: both partitions of "out", as the live buffers say.
    tb = cli(w.data, "transaction-buffer-stats", "--topic", "out")
    live_tb = admin.transaction_buffer_stats("out")
    assert (
        [p["topic"] for p in tb]
        == [p["topic"] for p in live_tb]
        == [
            "persistent://public/default/out-partition-0",
            "persistent://public/default/out-partition-1",
        ]
    )
    for got, want in zip(tb, live_tb, strict=True):
        for key in (
            "max_read_position",
            "last_position",
            "lag",
            "ongoing",
            "aborted",
            "ongoing_transactions",
            "low_water_marks",
            "snapshot",
        ):
            assert got[key] == want[key], (got["topic"], key)
    [used] = [p for p in tb if p["topic"] == w.out_partition]
    assert (used["ongoing"], used["aborted"], used["committed"], used["markers"]) == (1, 1, 1, 2)
    assert used["ongoing_transactions"][0]["txn_id"] == str(w.open)
    # The open transaction's message pins READ_COMMITTED readers just before it.
    first = used["ongoing_transactions"][0]["first_position"]
    ledger, entry = map(int, first.split(":"))
    assert used["max_read_position"] == f"{ledger}:{entry - 1}" and used["lag"] == 1
    assert used["low_water_marks"] == {"0": w.open.least_bits - 1}

    # pending-ack-stats: the open transaction holds the message it acked.
    [pa] = cli(w.data, "pending-ack-stats", "-t", "in", "-s", SUB)
    [live_pa] = admin.pending_ack_stats("in", SUB)
    assert pa["ongoing"] == live_pa["ongoing"] == 1
    assert pa["ongoing_transactions"] == [
        {"txn_id": str(w.open), "ack_type": "individual", "acks": [{"position": w.acked_by_open}]}
    ]
    assert pa["log"]["records"] >= 1

    # topic-internal-stats: a topic, and a coordinator log by its ledger name.
    stats = cli(w.data, "topic-internal-stats", "-t", "in")
    live_stats = admin.internal_stats("in")
    for key in ("number_of_entries", "first_position", "last_position", "ledgers"):
        assert stats[IN][key] == live_stats[IN][key], key
    # The subscription, and the hold of what no durable snapshot covers yet.
    assert stats[IN]["number_of_entries"] == 6
    assert set(stats[IN]["cursors"]) == {SUB, SNAPSHOT_HOLD}
    tc_log = cli(w.data, "topic-internal-stats", "--topic", "__transaction_log_0")
    assert tc_log["__transaction_log_0"]["kind"] == "txn"
    assert set(tc_log["__transaction_log_0"]["cursors"]) == {"transaction-coordinator"}

    # batched-log stats: the stored entries are what the writers wrote.
    for log in ("coordinator", "pending-ack"):
        files = cli(w.data, "batched-log", "stats", "--log", log)
        writers = admin.batched_log_stats(log)
        assert files["enabled"] is None and writers["enabled"] is True
        total = files["total"]
        for key in ("entries", "batched_entries", "records", "bytes"):
            assert total[key] == sum(x[key] for x in writers["writers"]), (log, key)
        assert total["entries"] == total["batched_entries"] > 0  # batching is on
        assert sum(total["flush_triggers"].values()) == total["entries"]
        assert total["flush_triggers"]["unbatched"] == 0
        assert total["records_per_entry"]["sum"] == total["records"]
        assert total["records_per_entry"]["count"] == total["entries"]
        assert total["bytes_per_entry"]["sum"] == total["bytes"]
    coordinator = cli(w.data, "batched-log", "stats", "--log", "coordinator")
    # NEW, ADD_PARTITION, ADD_SUBSCRIPTION and two end records per ended transaction.
    assert coordinator["total"]["records"] >= 3 * 3 + 2 * 2
    assert coordinator["total"]["oldest_record_delay_seconds"]["count"] > 0
    assert (
        cli(w.data, "batched-log", "stats", "--log", "pending-ack")["total"][
            "oldest_record_delay_seconds"
        ]
        is None
    )

    # Changing commands refuse a live directory and change nothing.
    for args in (
        ["abort-transaction", "--txn-id", str(w.open)],
        ["batched-log", "disable", "--log", "coordinator"],
        ["batched-log", "enable", "--log", "pending-ack"],
    ):
        code, out = fail(w.data, *args)
        assert code == 2 and "is live" in out and "broker.admin" in out, out
    assert not (w.data / DYNAMIC_CONFIG_FILE).exists()
    assert admin.get_transaction(w.open).status.name == "OPEN"
    # The CLI took no lock: the broker goes on committing, and still holds the directory.
    with w.broker.client().transaction() as txn:
        w.broker.client().producer("in").send(b"after", txn=txn)
    assert is_live(w.data)


def test_read_command_from_another_process_on_a_live_directory(workload: Workload) -> None:
    argv = ["admin", "--data", str(workload.data), "open-transactions", "--json"]
    out = subprocess.run(
        [sys.executable, "-m", "txnstream.cli", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert out.returncode == 0, out.stderr
    assert [t["txn_id"] for t in json.loads(out.stdout)] == [str(workload.open)]
    assert workload.broker.admin.open_transactions()[0].txn_id == workload.open


def test_closed_directory_abort_transaction_and_batched_log_switch(workload: Workload) -> None:
    w = workload
    [live_pa] = w.broker.admin.pending_ack_stats("in", SUB)
    live_internal = w.broker.admin.internal_stats("in")[IN]
    w.broker.close()
    assert not is_live(w.data)

    # What the broker persisted at close is what the files show.
    [pa] = cli(w.data, "pending-ack-stats", "-t", "in", "-s", SUB)
    assert pa["mark_delete_position"] == live_pa["mark_delete_position"]
    internal = cli(w.data, "topic-internal-stats", "-t", "in")[IN]
    assert internal["cursors"][SUB] == live_internal["cursors"][SUB]

    # late-transactions: a closed directory's open transaction is late once its timeout passed.
    [txn] = cli(w.data, "open-transactions")
    assert cli(w.data, "late-transactions") == []
    late = cli(w.data, "late-transactions", "--now-ms", str(txn["timeout_at"]))
    assert [t["txn_id"] for t in late] == [str(w.open)]

    # abort-transaction: force-aborts through a broker opened on the closed directory.
    res = cli(w.data, "abort-transaction", "-m", "0", "-l", str(w.open.least_bits))
    assert res == {"txn_id": str(w.open), "status_before": "OPEN", "status": "ABORTED"}
    assert not is_live(w.data)
    assert cli(w.data, "open-transactions") == []
    assert cli(w.data, "transaction-metadata", "--txn-id", str(w.open))["status"] == "ABORTED"
    used = [p for p in cli(w.data, "transaction-buffer-stats", "-t", "out")]
    [part] = [p for p in used if p["topic"] == w.out_partition]
    assert (part["ongoing"], part["aborted"], part["lag"]) == (0, 2, 0)
    assert cli(w.data, "pending-ack-stats", "-t", "in", "-s", SUB)[0]["ongoing"] == 0
    # A transaction that already ended reports its outcome, and is not turned into an abort.
    res = cli(w.data, "abort-transaction", "--txn-id", str(w.committed))
    assert res["status"] == "COMMITTED"

    # batched-log disable persists; the next open applies it over the configuration.
    before = cli(w.data, "batched-log", "stats", "--log", "coordinator")["total"]
    res = cli(w.data, "batched-log", "disable", "--log", "coordinator")
    assert res["enabled"] is False and res["transactionLogBatchedWriteEnabled"] is False
    cli(w.data, "batched-log", "enable", "--log", "pending-ack")
    assert read_dynamic_config(w.data) == {
        "transactionLogBatchedWriteEnabled": False,
        "transactionPendingAckBatchedWriteEnabled": True,
    }
    assert cli(w.data, "batched-log", "stats", "--log", "coordinator")["enabled"] is False
    assert cli(w.data, "batched-log", "stats", "--log", "pending-ack")["enabled"] is True
    # Broker.open applies the persisted settings over the given configuration.
    with Broker.open(w.data, BATCHED, registry=None) as broker:
        assert BATCHED.transaction_log_batched_write.enabled  # the given config is not changed
        assert broker.admin.batched_log_stats("coordinator")["enabled"] is False
        with broker.client().transaction():
            pass
        wait_for(lambda: not broker.admin.open_transactions(), "the commit to finish")
    after = cli(w.data, "batched-log", "stats", "--log", "coordinator")["total"]
    # The new transaction's records went out one per entry, unbatched. (The
    # abort above opened the broker with the default configuration: unbatched too.)
    assert after["flush_triggers"]["unbatched"] > before["flush_triggers"]["unbatched"] > 0
    assert after["batched_entries"] == before["batched_entries"]


def test_snapshot_age_from_the_namespace_snapshot_topic(workload: Workload) -> None:
    w = workload
    live = {tn.full: w.broker.topic(tn).tb.stats() for tn in w.broker.partition_names("out")}
    w.broker.close()  # a clean close snapshots every changed partition
    written = 0
    for part in cli(w.data, "transaction-buffer-stats", "-t", "out"):
        snap = part["snapshot"]
        if part["entries"] == 0:
            assert snap is None, part  # nothing ever changed there: no snapshot
            continue
        written += 1
        assert snap["snapshot_time_ms"] > 0, part
        # The snapshot the close wrote holds the buffer's state at close (read
        # back from the snapshot topic, not recomputed from the ledger).
        want = live[part["topic"]]
        assert snap["aborted"] == want["aborted"]
        limit = want["max_read_position"]
        assert isinstance(limit, Position)
        assert snap["max_read_position"] == f"{limit.ledger_id}:{limit.entry_id}", part
        # ... and it agrees with the full replay the same command made.
        assert snap["max_read_position"] == part["max_read_position"], part
    assert written >= 1
    taken = time.time_ns() // 1_000_000 - 5_000
    snap = TransactionBufferSnapshot(
        topic_name=w.out_partition,
        max_read_position_ledgerId=1,
        max_read_position_entryId=2,
        snapshot_time_ms=taken,
    )
    snap.abort_txn_metadata.add(txnid_most_bits=0, txnid_least_bits=1, ledgerId=1, entryId=3)
    topic = CompactedTopic.open(w.data, snapshot_topic("public/default"))
    topic.put(w.out_partition, snap.SerializeToString())
    topic.close()
    stats = {p["topic"]: p for p in cli(w.data, "transaction-buffer-stats", "-t", "out")}
    got = stats[w.out_partition]["snapshot"]
    assert got["max_read_position"] == "1:2" and got["aborted"] == 1
    assert got["snapshot_time_ms"] == taken and 5_000 <= got["age_ms"] < 5_000 + 60_000
    others = [p["snapshot"] for t, p in stats.items() if t != w.out_partition]
    assert len(others) == 1  # the other partition's, as the broker left it


def test_table_output_renders(workload: Workload) -> None:
    runner = CliRunner()
    base = ["admin", "--data", str(workload.data)]
    for args, expect in (
        (["coordinator-stats"], "coordinators"),
        (["open-transactions"], str(workload.open)),
        (["transaction-metadata", "--txn-id", str(workload.open)], "OPEN"),
        (["transaction-buffer-stats", "-t", "out"], "transaction buffer"),
        (["pending-ack-stats", "-t", "in", "-s", SUB], "pending acks"),
        (["topic-internal-stats", "-t", "in"], "cursors"),
        (["batched-log", "stats", "--log", "coordinator"], "coordinator batched log"),
        (["logs"], "__transaction_log_0"),
    ):
        res = runner.invoke(main, [*base, *args], env={"COLUMNS": "250"})
        assert res.exit_code == 0, res.output
        assert expect in res.output, (args, res.output)


def test_bad_input_is_a_clear_error(workload: Workload, tmp_path: Path) -> None:
    d = workload.data
    code, out = fail(d, "transaction-metadata", "--txn-id", "(0,x)")
    assert code == 2 and "(0,x)" in out
    code, out = fail(d, "transaction-metadata", "-m", "0")
    assert code == 2 and "-l" in out
    code, out = fail(d, "transaction-metadata", "--txn-id", "(0,1)", "-m", "0", "-l", "1")
    assert code == 2 and "not both" in out
    code, out = fail(d, "transaction-metadata", "--txn-id", "(0,999)")
    assert code == 1 and "(0,999) not found" in out
    code, out = fail(d, "transaction-metadata", "--txn-id", "(7,1)")
    assert code == 1 and "no coordinator 7" in out
    code, out = fail(d, "transaction-buffer-stats", "-t", "nope")
    assert code == 2 and "persistent://public/default/nope does not exist" in out
    code, out = fail(d, "transaction-buffer-stats", "-t", "bad//name")
    assert code == 2 and "bad//name" in out
    code, out = fail(d, "pending-ack-stats", "-t", "in", "-s", "nosub")
    assert code == 2 and "'nosub' not found" in out
    code, out = fail(d, "topic-internal-stats", "-t", "nope")
    assert code == 2 and "nope" in out
    code, out = fail(d, "slow-transactions", "--time", "5x")
    assert code == 2 and "'5x' is not a duration" in out
    code, out = fail(d, "slow-transactions", "--time", "9" * 400)
    assert code == 2 and "longer than the longest duration" in out
    code, out = fail(d, "coordinator-stats", "-c", "3")
    assert code == 2 and "coordinator 3 not found" in out
    code, out = fail(d, "batched-log", "stats", "--log", "topic")
    assert code == 2 and "'topic'" in out
    code, out = fail(tmp_path / "missing", "logs")
    assert code == 2 and "does not exist" in out
    code, out = fail(None, "open-transactions")
    assert code == 2 and "Missing option '--data'" in out
    (tmp_path / "empty").mkdir()
    code, out = fail(tmp_path / "empty", "open-transactions")
    assert code == 2 and "not a txnstream data directory" in out
    workload.broker.close()
    code, out = fail(d, "abort-transaction", "--txn-id", "(0,999)")
    assert code == 1 and "not found" in out and not is_live(d)
    # A config file that cannot be read is a clear error, not a traceback.
    bad_conf = tmp_path / "bad.conf"
    bad_conf.write_bytes(b"\xff\xfe")
    code, out = fail(d, "abort-transaction", "--txn-id", "(0,1)", "--config", str(bad_conf))
    assert code == 2 and "cannot be read" in out and "Traceback" not in out


def test_a_damaged_registry_value_or_sequence_mark_is_a_typed_error(
    workload: Workload, tmp_path: Path
) -> None:
    """Read-only views on unusual content raise TxnStreamErrors naming it (not ValueError)."""
    from txnstream import CompactedTopic
    from txnstream.datadir import coordinator_stats, transaction_buffer_stats
    from txnstream.errors import CorruptEntryError, StorageError

    d = workload.data
    workload.broker.close()
    reg = CompactedTopic.open(d, TOPICS_REGISTRY)
    reg.put(IN, b"two")
    reg.close()
    with pytest.raises(CorruptEntryError, match=r"partition count of .* is b'two'"):
        transaction_buffer_stats(d, "in")
    mark = d / "coordinators" / "0" / "max_local_txn_id"
    mark.unlink(missing_ok=True)
    mark.mkdir(parents=True)
    with pytest.raises(StorageError, match="max_local_txn_id: cannot be read"):
        coordinator_stats(d)


# ------------------------------------------------------------ dynamic config


def test_dynamic_config_round_trip_and_validation(tmp_path: Path) -> None:
    assert read_dynamic_config(tmp_path) == {}
    base = BrokerConfig()
    assert apply_dynamic_config(tmp_path, base) is base  # nothing persisted: unchanged
    written = write_dynamic_config(tmp_path, {"transactionLogBatchedWriteEnabled": "true"})
    assert written == {"transactionLogBatchedWriteEnabled": True}
    write_dynamic_config(tmp_path, {"transactionPendingAckBatchedWriteMaxRecords": 64})
    assert read_dynamic_config(tmp_path) == {
        "transactionLogBatchedWriteEnabled": True,
        "transactionPendingAckBatchedWriteMaxRecords": 64,
    }
    applied = apply_dynamic_config(tmp_path, base)
    assert applied.transaction_log_batched_write.enabled
    assert applied.pending_ack_batched_write.max_records == 64
    assert not base.transaction_log_batched_write.enabled  # the given config is untouched
    assert applied == dataclasses.replace(
        base,
        transaction_log_batched_write=dataclasses.replace(
            base.transaction_log_batched_write, enabled=True
        ),
        pending_ack_batched_write=dataclasses.replace(
            base.pending_ack_batched_write, max_records=64
        ),
    )

    with pytest.raises(ConfigError, match="transactionCoordinatorCount"):
        write_dynamic_config(tmp_path, {"transactionCoordinatorCount": 2})
    with pytest.raises(ConfigError, match="transactionLogBatchedWriteEnabled"):
        write_dynamic_config(tmp_path, {"transactionLogBatchedWriteEnabled": "maybe"})
    assert read_dynamic_config(tmp_path)["transactionLogBatchedWriteEnabled"] is True

    # A persisted setting the configuration rejects names the file.
    low = BrokerConfig.from_dict({"transactionLogBatchedWriteMaxRecords": 5})
    with pytest.raises(ConfigError, match=DYNAMIC_CONFIG_FILE):
        apply_dynamic_config(tmp_path, low)
    (tmp_path / DYNAMIC_CONFIG_FILE).write_text("not toml [")
    with pytest.raises(ConfigError, match=DYNAMIC_CONFIG_FILE):
        read_dynamic_config(tmp_path)
    (tmp_path / DYNAMIC_CONFIG_FILE).write_text("somethingElse = 1\n")
    with pytest.raises(ConfigError, match="somethingElse"):
        read_dynamic_config(tmp_path)


def take(consumer: Consumer) -> Message:
    """The next message (there must be one)."""
    msg = consumer.receive(1000)
    assert msg is not None
    return msg


def test_pending_ack_stats_fold_repeated_cumulative_and_batch_index_acks(tmp_path: Path) -> None:
    """The CLI folds the log the way recovery does: what each transaction HOLDS.

    A transaction that acks cumulatively twice holds only its later position;
    one that acks two indexes of a batch in two calls holds one entry with
    both indexes. After a restart, the store's own recovery of the same
    records holds exactly that.
    """
    data = tmp_path / "data"
    with Broker.open(data, registry=None) as broker:
        client = broker.client("fold")
        client.producer("cum").send_many([b"a", b"b", b"c"])  # one batch: indexes 0-2
        for i in range(3):
            client.producer("cum").send(b"x%d" % i)
        client.producer("bat").send_many([b"p", b"q", b"r", b"s"])
        cum = client.subscribe("cum", SUB)
        msgs = [take(cum) for _ in range(6)]
        t1 = client.transaction(timeout_ms=600_000)
        cum.ack_cumulative(msgs[1], txn=t1)  # batch index 1
        cum.ack_cumulative(msgs[4], txn=t1)  # replaces it: the second single entry
        bat = client.subscribe("bat", SUB)
        parts = [take(bat) for _ in range(4)]
        t2 = client.transaction(timeout_ms=600_000)
        bat.ack(parts[0], txn=t2)
        bat.ack(parts[2], txn=t2)
        assert t1.wait_durable() and t2.wait_durable()

        [c] = cli(data, "pending-ack-stats", "-t", "cum", "-s", SUB)
        pos = msgs[4].message_id
        assert c["ongoing_transactions"] == [
            {
                "txn_id": str(t1.txn_id),
                "ack_type": "cumulative",
                "acks": [{"position": f"{pos.ledger_id}:{pos.entry_id}"}],
            }
        ]
        assert c["log"]["records"] == 2
        [b] = cli(data, "pending-ack-stats", "-t", "bat", "-s", SUB)
        entry = parts[0].message_id
        assert b["ongoing_transactions"] == [
            {
                "txn_id": str(t2.txn_id),
                "ack_type": "individual",
                "acks": [
                    {
                        "position": f"{entry.ledger_id}:{entry.entry_id}",
                        "batch_size": 4,
                        "batch_indexes": [0, 2],
                    }
                ],
            }
        ]
        assert b["log"]["records"] == 2
    # The store's recovery reads the same records into the same holdings.
    with Broker.open(data, registry=None) as broker:
        store = broker.topic("bat").subscription(SUB).pending
        at = Position(entry.ledger_id, entry.entry_id)
        assert store.is_held(at, 0) and store.is_held(at, 2)
        assert not store.is_held(at, 1) and not store.is_held(at, 3)
        [b2] = cli(data, "pending-ack-stats", "-t", "bat", "-s", SUB)
        assert b2["ongoing_transactions"] == b["ongoing_transactions"]


def test_flush_triggers_inferred_from_files_match_the_writers_counters(tmp_path: Path) -> None:
    """The file view tells count-triggered flushes from delay-triggered ones.

    The coordinator's writer batches up to 10 records or 200 ms; 25
    transactions begun at once (their NEW records queued without waiting)
    fill two batches by count and leave the rest to the delay. What the CLI
    infers from the stored entries must equal what the writer counted as
    it flushed.
    """
    data = tmp_path / "data"
    cfg = BrokerConfig.from_dict(
        {
            "transactionLogBatchedWriteEnabled": True,
            "transactionLogBatchedWriteMaxRecords": 10,
            "transactionLogBatchedWriteMaxDelayInMillis": 200,
        }
    )
    with Broker.open(data, cfg, registry=None) as broker:
        client = broker.client("triggers")
        txns = [client.transaction(timeout_ms=600_000) for _ in range(25)]
        assert all(t.wait_durable() for t in txns)
        [writer] = broker.admin.batched_log_stats("coordinator")["writers"]
        files = cli(data, "batched-log", "stats", "--log", "coordinator", "--max-records", "10")
    counted = writer["flush_triggers"]
    inferred = files["total"]["flush_triggers"]
    assert counted["max_records"] >= 2  # the 25 records did fill batches by count
    assert inferred["max_records"] == counted["max_records"]
    assert inferred["max_delay_or_forced"] == counted["max_delay"] + counted["forced"]
    assert inferred["max_size"] == counted["max_size"] == 0
    assert inferred["unbatched"] == 0
    assert files["total"]["records"] == writer["records"] == 25


def test_data_directory_helpers_refuse_bad_arguments_typed(tmp_path: Path) -> None:
    # Each raised AttributeError, ValueError or OSError (found in review).
    from txnstream import datadir
    from txnstream.errors import InvalidArgumentError, StorageError, TxnStreamError

    with Broker.open(tmp_path / "d", registry=None) as b:
        b.client().producer("t").send(b"x")
    d = tmp_path / "d"
    bad: Any = "not a ledger"
    calls: list[Callable[[], object]] = [
        lambda: datadir.histogram("abc", datadir.BATCH_RECORDS_BUCKETS),
        lambda: datadir.histogram([1, 2], bad),
        lambda: datadir.replay_partition(bad, "t"),
        lambda: datadir.ledger_internal_stats(bad),
    ]
    for call in calls:
        with pytest.raises(InvalidArgumentError):
            call()
    # A topic name is parsed (it was taken for a TopicName and failed).
    got = datadir.snapshot_info(d, "persistent://public/default/t")
    assert got is None or isinstance(got, dict)
    with pytest.raises(TxnStreamError):
        datadir.snapshot_info(d, "bad://x")
    lock = tmp_path / "linked" / datadir.LOCK_FILE
    lock.parent.mkdir()
    lock.symlink_to(d / datadir.LOCK_FILE)  # refused (O_NOFOLLOW): typed, not ELOOP
    with pytest.raises(StorageError, match="writer lock"):
        datadir.is_live(lock.parent)


def test_pending_ack_stats_use_the_recorded_owner_of_a_colliding_log_name(tmp_path: Path) -> None:
    """Topic ``in`` with subscription ``x-etl`` and topic ``in-x``: one log name, ``in-x-etl``.

    ``pending-ack-stats -t in-x -s etl`` reported ``in``/``x-etl``'s acks as
    its own (exit 0); the broker's owner record says whose the log is.
    """
    data = tmp_path / "data"
    with Broker.open(data, registry=None) as broker:
        client = broker.client("c")
        client.producer("in").send(b"a")
        client.producer("in-x").send(b"b")
        cons = client.subscribe("in", "x-etl")
        t = client.transaction(timeout_ms=600_000)
        cons.ack(take(cons), txn=t)
        assert t.wait_durable()
    [pa] = cli(data, "pending-ack-stats", "-t", "in", "-s", "x-etl")
    assert (pa["topic"], pa["subscription"], pa["ongoing"]) == (
        "persistent://public/default/in",
        "x-etl",
        1,
    )
    code, out = fail(data, "pending-ack-stats", "-t", "in-x", "-s", "etl")
    assert code == 2 and "'etl' not found" in out


def test_batched_log_stats_refuse_a_damaged_coordinator_log(tmp_path: Path) -> None:
    """Bytes flipped in a coordinator ledger file: the unreadable entries were counted, exit 0."""
    data = tmp_path / "data"
    with Broker.open(data, registry=None) as broker:
        client = broker.client("many")
        for _ in range(300):
            client.transaction(timeout_ms=600_000).commit()
    [log] = sorted((data / "ledgers").glob("__transaction_log_0@*.log"))
    raw = bytearray(log.read_bytes())
    at = len(raw) // 2
    raw[at : at + 40] = bytes(b ^ 0xFF for b in raw[at : at + 40])
    log.write_bytes(bytes(raw))
    code, out = fail(data, "batched-log", "stats", "--log", "coordinator")
    assert code == 1, out
    assert "CorruptEntryError" in out and "cannot be read" in out and "Traceback" not in out
