"""The topic half of the audit: markers, aborted reads and the exactly-once verdict.

A real consume-transform-produce workload (:mod:`txnstream.workload`) passes
with exact counts. Then a directory written by the real engine with three
violations planted, each the way a bug would make it:

- **aborted message made visible**: the transaction buffers write COMMIT
  markers for a transaction its coordinator aborts (its inputs come back
  and are processed again, so its outputs are duplicated too);
- **duplicated output**: a second committed transaction sends a copy of a
  committed output with the same ``source``;
- **lost commit marker**: the buffers skip the COMMIT markers of a
  committed transaction (its outputs never become visible).

Each test asserts the kind, the transaction and the positions of its
violation; the check that reports it is the only one that could.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pyspark.sql import SparkSession

from txnstream import Broker, Position
from txnstream.buffer.transaction_buffer import TransactionBuffer
from txnstream.cli import main
from txnstream.client import Message, MessageId
from txnstream.config import BrokerConfig
from txnstream.coordinator import TxnID
from txnstream.demo import seed
from txnstream.errors import InvalidArgumentError
from txnstream.spark.audit import AuditOptions, AuditResult, run_audit, violation_rows
from txnstream.workload import INPUT, OUTPUTS
from txnstream.workload import main as run_workload

IN = "persistent://public/default/ctp-in"
OUT_A = "persistent://public/default/ctp-out-a"
OUT_B = "persistent://public/default/ctp-out-b"
SUB = "etl"
N_INPUTS = 24
#: (log, ledger_id, entry_id, batch_index) of a message.
Pos = tuple[str, int, int, int]


def _pos(topic: str, mid: MessageId) -> Pos:
    return (f"{topic}-partition-{mid.partition}", mid.ledger_id, mid.entry_id, mid.batch_index)


def _txn(v: dict[str, Any]) -> TxnID | None:
    if v["txnid_most_bits"] is None:
        return None
    return TxnID(v["txnid_most_bits"], v["txnid_least_bits"])


def _positions(v: dict[str, Any]) -> list[tuple[Pos, str]]:
    return [
        ((p["log"], p["ledger_id"], p["entry_id"], p["batch_index"]), p["role"])
        for p in v["positions"]
        if p is not None
    ]


# ------------------------------------------------------------- a clean run


@pytest.fixture(scope="module")
def clean(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> AuditResult:
    data = tmp_path_factory.mktemp("ctp") / "data"
    data.mkdir()
    seed(data, 60)
    status = run_workload(
        [
            "--data",
            str(data),
            "--seed",
            "7",
            "--abort-rate",
            "0.25",
            "--abandon-rate",
            "0.05",
            "--timeout-ms",
            "400",
            "--idle-ms",
            "800",
        ]
    )
    assert status == 0
    return run_audit(data, tmp_path_factory.mktemp("ctp-audit"), spark=spark)


def test_real_ctp_workload_passes_with_exact_counts(
    clean: AuditResult, spark: SparkSession
) -> None:
    assert clean.verdict == "PASS", violation_rows(clean, spark)
    eo = clean.summary["exactly_once"]
    inputs = f"persistent://{INPUT}"
    outputs = [f"persistent://{t}" for t in OUTPUTS]
    assert eo["verdict"] == "PASS"
    assert eo["topics_chosen"] == "detected"
    assert (eo["input_topics"], eo["output_topics"]) == ([inputs], outputs)
    assert eo["inputs_consumed_committed"] == 60
    assert (eo["outputs"], eo["duplicates"], eo["missing"], eo["untraceable"]) == (120, 0, 0, 0)
    for t in outputs:
        assert eo["by_output_topic"][t] == {
            "outputs": 60,
            "duplicates": 0,
            "missing": 0,
            "untraceable": 0,
        }
    topics = clean.summary["topics"]["by_topic"]
    assert topics[inputs]["messages"] == topics[inputs]["visible"] == 60
    for t in outputs:
        # Aborted attempts stay stored but invisible; every visible output is committed.
        assert topics[t]["visible"] == 60 <= topics[t]["messages"]
        assert topics[t]["commit_markers"] > 0
    ran = {c["name"]: c["status"] for c in clean.summary["checks"]}
    assert ran["topic_markers"] == ran["aborted_visible"] == ran["exactly_once"] == "ran"


def test_options_name_the_topics_and_bad_names_are_refused(
    clean: AuditResult, spark: SparkSession, tmp_path: Path
) -> None:
    data = clean.summary["data_dir"]
    wrong = run_audit(
        data,
        tmp_path / "wrong",
        spark=spark,
        options=AuditOptions(input_topics=(OUTPUTS[0],), output_topics=(OUTPUTS[1],)),
    )
    # Outputs of one output topic do not trace to the other's messages by key.
    eo = wrong.summary["exactly_once"]
    assert eo["topics_chosen"] == "options" and eo["verdict"] == "FAIL"
    assert eo["untraceable"] == 60
    with pytest.raises(InvalidArgumentError, match="no-such-topic"):
        run_audit(
            data,
            tmp_path / "x",
            spark=spark,
            options=AuditOptions(output_topics=("no-such-topic",)),
        )
    res = CliRunner().invoke(
        main,
        ["audit", data, "--out", str(tmp_path / "cli"), "--output-topic", OUTPUTS[0], "--json"],
    )
    assert res.exit_code == 0, res.output
    assert '"output_topics": [\n      "persistent://public/default/demo-out-a"\n    ]' in res.stdout


# ------------------------------------------------------------- planted violations


@dataclass
class Planted:
    """The planted directory, what was done to it and the audit's findings."""

    flipped: TxnID = field(default_factory=lambda: TxnID(0, 0))
    flipped_outputs: list[Pos] = field(default_factory=list)
    flipped_inputs: list[str] = field(default_factory=list)
    dup: TxnID = field(default_factory=lambda: TxnID(0, 0))
    dup_original: Pos = ("", 0, 0, 0)
    dup_copy: Pos = ("", 0, 0, 0)
    lost: TxnID = field(default_factory=lambda: TxnID(0, 0))
    lost_outputs: list[Pos] = field(default_factory=list)
    lost_inputs: list[Pos] = field(default_factory=list)
    #: Per input key, the transactions that processed it and their outcome.
    attempts: dict[str, list[tuple[TxnID, str]]] = field(default_factory=dict)
    outputs: dict[str, Pos] = field(default_factory=dict)
    result: AuditResult | None = None
    violations: list[dict[str, Any]] = field(default_factory=list)

    def of(self, kind: str, txn: TxnID | None = None) -> list[dict[str, Any]]:
        return [v for v in self.violations if v["kind"] == kind and (txn is None or _txn(v) == txn)]


class _Hooks:
    """Transaction-buffer misbehaviour, per transaction (a bug planted in the engine)."""

    def __init__(self) -> None:
        self.commit_on_abort: set[TxnID] = set()
        self.skip_commit: set[TxnID] = set()

    def install(self, mp: pytest.MonkeyPatch) -> None:
        real = TransactionBuffer.end
        hooks = self

        def end(tb: TransactionBuffer, txn_id: TxnID, commit: bool) -> Future[Any] | None:
            if commit and txn_id in hooks.skip_commit:
                return None  # as if the marker were never written
            if not commit and txn_id in hooks.commit_on_abort:
                commit = True
            return real(tb, txn_id, commit)

        mp.setattr(TransactionBuffer, "end", end)


@pytest.fixture(scope="module")
def planted(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Planted:
    data = tmp_path_factory.mktemp("planted-topics") / "data"
    hooks = _Hooks()
    p = Planted()
    with pytest.MonkeyPatch.context() as mp:
        hooks.install(mp)
        with Broker.open(data, BrokerConfig(), registry=None) as broker:
            broker.create_topic(IN, 2)
            broker.create_topic(OUT_A, 2)
            broker.create_topic(OUT_B, 2)
            client = broker.client("ctp")
            seeder = client.producer(IN)
            for i in range(N_INPUTS):
                seeder.send(b"input %d" % i, key=f"in-{i}")
            consumers = [client.subscribe(f"{IN}-partition-{i}", SUB) for i in range(2)]
            producers = [client.producer(OUT_A), client.producer(OUT_B)]

            def process(
                items: list[tuple[Any, Message]], plant: str = ""
            ) -> tuple[TxnID, list[Pos]]:
                txn = client.transaction(timeout_ms=600_000)
                sent: list[Pos] = []
                for consumer, m in items:
                    assert m.key is not None
                    for topic, prod in zip((OUT_A, OUT_B), producers, strict=True):
                        mid = prod.send(
                            m.value.upper(), key=m.key, properties={"source": m.key}, txn=txn
                        )
                        sent.append(_pos(topic, mid))
                        if plant != "flip" and topic == OUT_A:
                            p.outputs[m.key] = _pos(topic, mid)
                    consumer.ack(m, txn=txn)
                if plant == "flip":
                    hooks.commit_on_abort.add(txn.txn_id)
                    txn.abort()
                elif plant == "lost":
                    hooks.skip_commit.add(txn.txn_id)
                    txn.commit()
                else:
                    txn.commit()
                outcome = "ABORTED" if plant == "flip" else "COMMITTED"
                for _c, m in items:
                    assert m.key is not None
                    p.attempts.setdefault(m.key, []).append((txn.txn_id, outcome))
                return txn.txn_id, sent

            k = 0
            idle = 0
            while idle < 2:
                got = False
                for c in consumers:
                    msgs = c.receive_many(2, timeout_ms=200)
                    if not msgs:
                        continue
                    got = True
                    k += 1
                    if k == 3:  # an aborted transaction made visible
                        p.flipped, p.flipped_outputs = process([(c, m) for m in msgs], "flip")
                        p.flipped_inputs = [m.key or "" for m in msgs]
                    else:
                        process([(c, m) for m in msgs])
                idle = 0 if got else idle + 1
            assert len(p.attempts) == N_INPUTS
            # A duplicated output: a second transaction sends a copy of in-5's output.
            txn = client.transaction(timeout_ms=600_000)
            copy = producers[0].send(b"again", key="in-5", properties={"source": "in-5"}, txn=txn)
            txn.commit()
            p.dup, p.dup_original, p.dup_copy = txn.txn_id, p.outputs["in-5"], _pos(OUT_A, copy)
            # A committed transaction whose COMMIT markers are never written.
            for i in range(2):
                seeder.send(b"late %d" % i, key=f"late-{i}")
            late: list[tuple[Any, Message]] = []
            for c in consumers:
                late.extend((c, m) for m in c.receive_many(2, timeout_ms=500))
            assert len(late) == 2
            p.lost, p.lost_outputs = process(late, "lost")
            p.lost_inputs = [_pos(IN, m.message_id) for _c, m in late]
            assert len(p.lost_outputs) == 4
    # Not reopened: recovery reconciliation would write the missing markers.
    p.result = run_audit(data, tmp_path_factory.mktemp("planted-topics-audit"), spark=spark)
    p.violations = violation_rows(p.result, spark)
    return p


def _retry_of(p: Planted, key: str) -> TxnID:
    (retry,) = [t for t, s in p.attempts[key] if s == "COMMITTED"]
    return retry


def test_aborted_message_made_visible(planted: Planted) -> None:
    """The aborted transaction's outputs are visible: reported per partition with positions."""
    contra = planted.of("marker_contradicts_outcome", planted.flipped)
    found = planted.of("aborted_visible", planted.flipped)
    assert found, planted.violations
    visible = {pos for v in found for pos, role in _positions(v) if role == "visible"}
    assert visible == set(planted.flipped_outputs)
    assert all("its coordinator says ABORTED" in v["detail"] for v in found)
    assert all(
        {role for _p, role in _positions(v)} >= {"visible", "COMMIT marker", "ABORTED"}
        for v in found
    )
    assert {v["log"] for v in found} == {log for log, *_ in planted.flipped_outputs}
    assert contra and all("ended ABORTED" in v["detail"] for v in contra)


def test_duplicated_output(planted: Planted) -> None:
    """A second committed copy of in-5's output: duplicate_output names both copies."""
    (v,) = planted.of("duplicate_output", planted.dup)
    assert v["log"] == OUT_A and "input in-5 appears 2 times" in v["detail"]
    outs = [pos for pos, role in _positions(v) if role == "output"]
    assert outs == [planted.dup_original, planted.dup_copy]
    ins = [pos for pos, role in _positions(v) if role == "input"]
    assert len(ins) == 1 and ins[0][0].startswith(IN + "-partition-")


def test_inputs_of_the_visible_aborted_transaction_are_duplicated(planted: Planted) -> None:
    """Its inputs came back and were processed again: both attempts are visible."""
    for key in planted.flipped_inputs:
        retry = _retry_of(planted, key)
        found = [v for v in planted.of("duplicate_output", retry) if f"input {key} " in v["detail"]]
        assert {v["log"] for v in found} == {OUT_A, OUT_B}
        for v in found:
            outs = {pos for pos, role in _positions(v) if role == "output"}
            assert len(outs) == 2 and len(outs & set(planted.flipped_outputs)) == 1


def test_lost_commit_marker(planted: Planted) -> None:
    """A committed transaction without COMMIT markers: one violation per partition it wrote."""
    found = planted.of("missing_commit_marker", planted.lost)
    assert {v["log"] for v in found} == {log for log, *_ in planted.lost_outputs}
    for v in found:
        mine = sorted(pos for pos in planted.lost_outputs if pos[0] == v["log"])
        span = [pos for pos, role in _positions(v) if role in ("first message", "last message")]
        assert span == [mine[0], mine[-1]]
        assert [role for _p, role in _positions(v)][-1] == "COMMITTED"
        assert "partition registered: true" in v["detail"]
    # So its inputs, consumed and committed, are missing from both outputs.
    lost = planted.of("lost_input", planted.lost)
    assert {v["log"] for v in lost} == {OUT_A, OUT_B} and len(lost) == 4
    assert {pos for v in lost for pos, role in _positions(v) if role == "input"} == set(
        planted.lost_inputs
    )


def test_planted_audit_reports_exactly_the_planted_violations(planted: Planted) -> None:
    assert planted.result is not None
    expected = {
        ("aborted_visible", planted.flipped),
        ("marker_contradicts_outcome", planted.flipped),
        ("duplicate_output", planted.dup),
        ("missing_commit_marker", planted.lost),
        ("lost_input", planted.lost),
    } | {("duplicate_output", _retry_of(planted, k)) for k in planted.flipped_inputs}
    assert {(v["kind"], _txn(v)) for v in planted.violations} == expected
    eo = planted.result.summary["exactly_once"]
    dups = 1 + 2 * len(planted.flipped_inputs)
    assert (eo["verdict"], eo["duplicates"], eo["missing"], eo["untraceable"]) == (
        "FAIL",
        dups,
        4,
        0,
    )
    assert eo["inputs_consumed_committed"] == N_INPUTS + 2
    assert planted.result.verdict == "FAIL"
    html = planted.result.report.read_text()
    assert "Topics and exactly-once" in html and "duplicate_output" in html


def test_markers_table_is_what_the_buffers_wrote(planted: Planted, spark: SparkSession) -> None:
    """Mode ``markers`` of the topic source: one row per marker the transaction buffers wrote."""
    assert planted.result is not None
    rows = spark.read.parquet(str(planted.result.out_dir / "topic_markers")).collect()

    def markers(t: TxnID) -> set[tuple[str, str]]:
        return {
            (r["ledger"], r["marker"])
            for r in rows
            if (r["txnid_most_bits"], r["txnid_least_bits"]) == (t.most_bits, t.least_bits)
        }

    assert markers(planted.lost) == set()
    assert markers(planted.flipped) == {(log, "COMMIT") for log, *_ in planted.flipped_outputs}
    assert markers(planted.dup) == {(planted.dup_copy[0], "COMMIT")}
    assert {r["marker_type"] for r in rows} <= {21, 22}
    assert all(r["entry_id"] >= 0 and r["topic"] in (OUT_A, OUT_B) for r in rows)


def test_topic_source_refuses_an_unknown_mode(planted: Planted, spark: SparkSession) -> None:
    assert planted.result is not None
    with pytest.raises(Exception, match="option mode must be one of"):
        (
            spark.read.format("txnstream")
            .option("path", planted.result.summary["data_dir"])
            .option("topic", OUT_A)
            .option("mode", "entries")
            .load()
        )


class _HandCtp:
    """Consume-transform-produce units by hand: inputs keyed ``in-N``, outputs naming them."""

    IN = "persistent://public/default/in"
    OUT = "persistent://public/default/out"

    def __init__(self, broker: Broker, inputs: int) -> None:
        self.client = broker.client("w")
        self.consumer = self.client.subscribe(self.IN, "sub")
        self.out = self.client.producer(self.OUT, name="etl")
        seed = self.client.producer(self.IN, name="seed")
        for i in range(inputs):
            seed.send(b"v%d" % i, key=f"in-{i}")

    def process(self) -> Any:
        """Take one input, send its output and ack it in a new transaction (not ended)."""
        m = self.consumer.receive(timeout_ms=2000)
        assert m is not None
        t = self.client.transaction(timeout_ms=600_000)
        self.out.send(b"o", properties={"source": m.key or ""}, txn=t)
        self.consumer.ack(m, txn=t)
        return t


def test_live_commit_after_the_coordinator_cut_is_no_lost_input(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction in flight when the coordinator logs are read commits before the cursors are.

    Its outputs are after the cut; its input, consumed through the cursor
    (read last), used to count as committed: a ``lost_input`` safety
    violation on a clean, live directory. It is after the cut too now.
    """
    import time

    from txnstream.spark import audit

    with Broker.open(tmp_path / "data", BrokerConfig(), registry=None) as broker:
        ctp = _HandCtp(broker, 4)
        for _ in range(3):
            ctp.process().commit()
        late = ctp.process()  # in flight when the audit reads the coordinator logs
        load_topics = audit._load_topics

        def commit_then_load(*args: Any) -> Any:
            late.commit()
            broker.maintain_now()
            broker.topic(_HandCtp.IN).ml.checkpoint()
            time.sleep(1.5)  # the cursor's new position reaches the files
            return load_topics(*args)

        monkeypatch.setattr(audit, "_load_topics", commit_then_load)
        r = run_audit(tmp_path / "data", tmp_path / "a", spark=spark)
        assert r.verdict == "PASS", violation_rows(r, spark)
        ex = r.summary["exactly_once"]
        assert (ex["verdict"], ex["outputs_after_cut"]) == ("PASS", 1)


def test_a_committed_transaction_trimmed_from_the_coordinator_log_is_not_in_flight(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Its ACK record outlives its coordinator records (a later open ack pins that ledger).

    Missing from the coordinator table, it was taken for one in flight: its
    input left the cursor evidence and its committed output became an
    ``untraceable_output`` safety violation on clean data.
    """
    import time

    from txnstream._native import ManagedLedger

    data = tmp_path / "data"
    with Broker.open(data, BrokerConfig(max_entries_per_ledger=4), registry=None) as broker:
        ctp = _HandCtp(broker, 2)
        ctp.process().commit()
        for _ in range(6):  # its coordinator records roll into ledgers that get trimmed
            ctp.client.transaction(timeout_ms=600_000).commit()
        ctp.process()  # open: its ACK keeps the first one's pending-ack ledger stored
        for _ in range(12):
            ctp.client.transaction(timeout_ms=600_000).commit()
        log = ManagedLedger.open(data, "__transaction_log_0", read_only=True)
        deadline = time.monotonic() + 30
        while (log.first_position or Position(0, 0)).ledger_id <= 1:
            assert time.monotonic() < deadline, "the coordinator log was not trimmed"
            broker.maintain_now()
            time.sleep(0.05)
            log.close()
            log = ManagedLedger.open(data, "__transaction_log_0", read_only=True)
        log.close()
        broker.write_snapshots(due_only=False)
        broker.topic(_HandCtp.IN).ml.open_cursor("sub").flush()
    r = run_audit(data, tmp_path / "a", spark=spark)
    assert r.verdict == "PASS", violation_rows(r, spark)


def test_transactions_begun_and_committed_between_the_reads_give_no_violation(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live directory: a whole consume-transform-produce unit between every two reads.

    One begun after the coordinator read (so absent from it) and committed
    before the topic read had its outputs counted but its input left out:
    ``untraceable_output``; one committed after the topic read but before
    the cursors were read had its input counted consumed (its cursor) and
    its output never read: ``lost_input``. Both on a clean directory.
    """
    from txnstream.spark import audit

    with Broker.open(tmp_path / "data", BrokerConfig(), registry=None) as broker:
        ctp = _HandCtp(broker, 12)
        for _ in range(3):
            ctp.process().commit()
        done: list[str] = []

        def unit(where: str) -> None:
            ctp.process().commit()
            broker.topic(_HandCtp.IN).ml.open_cursor("sub").flush()
            done.append(where)

        load, load_topic, cursor_ranges = audit._load, audit._load_topic, audit._cursor_ranges

        def load_after(*args: Any) -> Any:
            if args[3] == "pending_ack":
                unit("after the coordinator logs")
            return load(*args)

        def load_topic_then(*args: Any, **kw: Any) -> Any:
            found = load_topic(*args, **kw)
            unit(f"after {args[3]}")
            return found

        def cursor_ranges_then(*args: Any) -> Any:
            found = cursor_ranges(*args)
            unit("after the cursors")
            return found

        monkeypatch.setattr(audit, "_load", load_after)
        monkeypatch.setattr(audit, "_load_topic", load_topic_then)
        monkeypatch.setattr(audit, "_cursor_ranges", cursor_ranges_then)
        r = run_audit(tmp_path / "data", tmp_path / "a", spark=spark)
        assert len(done) == 5
        assert r.verdict == "PASS", violation_rows(r, spark)
        assert r.summary["exactly_once"]["verdict"] == "PASS"


def test_pending_ack_log_goes_to_its_recorded_owner_not_a_name_prefix(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Topic ``in`` with subscription ``x-etl`` next to a topic ``in-x``.

    Its log ``in-x-etl__transaction_pending_ack`` was given to ``in-x`` /
    ``etl`` (the longest topic name prefixing it): no input consumed, every
    output ``untraceable_output``.
    """
    data = tmp_path / "data"
    with Broker.open(data, BrokerConfig(), registry=None) as broker:
        c = broker.client("etl")
        src = c.producer("in")
        for i in range(4):
            src.send(b"v%d" % i, key=f"in-{i}")
        c.producer("in-x").send(b"other", key="zzz")
        out = c.producer("out")
        cons = c.subscribe("in", "x-etl")
        for _ in range(4):
            m = cons.receive(timeout_ms=2000)
            assert m is not None
            with c.transaction() as t:
                out.send(m.value, properties={"source": m.key or ""}, txn=t)
                cons.ack(m, txn=t)
    r = run_audit(data, tmp_path / "a", spark=spark)
    assert r.verdict == "PASS", violation_rows(r, spark)
    ex = r.summary["exactly_once"]
    assert (ex["inputs_consumed_committed"], ex["outputs"]) == (4, 4)
    owners = spark.read.parquet(str(r.out_dir / "pending_ack_logs")).collect()
    assert [tuple(o) for o in owners] == [
        (
            "persistent://public/default/in-x-etl__transaction_pending_ack",
            "persistent://public/default/in",
            "x-etl",
        )
    ]
