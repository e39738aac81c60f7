"""The audit job (``txnstream audit DATA_DIR``): what the logs say happened, checked.

On Spark, from the files of a data directory (read-only, live or closed):

1. reads every coordinator log, then every pending-ack log (in that order: a
   coordinator logs COMMITTED only after every participant's end is durable,
   so a COMMITTED seen first guarantees its pending-ack COMMIT is in the
   later read even while a broker keeps running);
2. reconstructs each transaction's final state (:mod:`.transactions`);
3. runs the checks (:data:`CHECKS`), each reporting violations with the
   transaction and the positions involved;
4. measures batching efficiency (records per entry, inferred flush
   triggers), the latency distribution, stuck transactions and entries
   freed;
5. writes Parquet tables, ``summary.json`` and ``report.html``.

Checks are pluggable: a :class:`Check` names the tables it needs and returns
violations; one whose tables are missing is reported as skipped. The topic
half of the pipeline adds its tables (messages, markers) and checks (commit
markers on produced partitions, the exactly-once verdict) the same way.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from txnstream._native import ManagedLedger
from txnstream.spark.log_source import (
    COORDINATOR_LOG_PREFIX,
    PENDING_ACK_LOG_SUFFIX,
    log_kind,
    schema_of,
)
from txnstream.spark.session import DEFAULT_MASTER, session
from txnstream.spark.transactions import (
    TXN_KEY,
    final_states,
    invalid_transitions,
    position,
)
from txnstream.spark.udfs import ack_set_overlaps

__all__ = [
    "CHECKS",
    "VIOLATION_SCHEMA",
    "AuditContext",
    "AuditOptions",
    "AuditResult",
    "Check",
    "run_audit",
    "violation_rows",
]

#: Positions in a violation: which log, which record, what it is.
POSITION_TYPE = StructType(
    [
        StructField("log", StringType()),
        StructField("ledger_id", LongType()),
        StructField("entry_id", LongType()),
        StructField("batch_index", IntegerType()),
        StructField("role", StringType()),
    ]
)

#: Every check returns rows of this schema.
VIOLATION_SCHEMA = StructType(
    [
        StructField("kind", StringType()),
        StructField("severity", StringType()),
        StructField("log", StringType()),
        StructField("txnid_most_bits", LongType()),
        StructField("txnid_least_bits", LongType()),
        StructField("positions", ArrayType(POSITION_TYPE)),
        StructField("detail", StringType()),
    ]
)

#: Severity of a broken promise: atomicity / exactly-once (``safety``), something
#: held forever (``liveness``), or damaged or impossible log content (``integrity``).
SEVERITIES = ("safety", "liveness", "integrity")


@dataclass(frozen=True)
class AuditOptions:
    """Knobs of the audit."""

    #: A COMMITTING/ABORTING transaction older than this (at the reference
    #: time) is stuck; an OPEN one is stuck once past its own timeout.
    stuck_after_ms: int = 60_000
    #: The reference time (ms since the epoch); default the latest time in the logs.
    now_ms: int | None = None
    #: The writers' ``max_records``, to tell flush triggers apart; default the
    #: largest batch seen per log.
    max_records: int | None = None


@dataclass
class AuditContext:
    """What checks and measures see: the session, the tables, the options."""

    spark: SparkSession
    data_dir: str
    out_dir: Path
    options: AuditOptions
    tables: dict[str, DataFrame] = field(default_factory=dict)
    reference_time_ms: int = 0

    def table(self, name: str) -> DataFrame:
        """Return table ``name`` (KeyError if the audit has none)."""
        return self.tables[name]


class Check(Protocol):
    """One audit check: a name, the tables it needs, violations it finds."""

    @property
    def name(self) -> str:
        """The check's name (in ``summary.json`` and the report)."""
        ...

    @property
    def description(self) -> str:
        """What the check verifies, in one line."""
        ...

    @property
    def requires(self) -> tuple[str, ...]:
        """Tables the check reads; it is skipped when one is missing."""
        ...

    def run(self, ctx: AuditContext) -> DataFrame:
        """Return the violations found (rows of :data:`VIOLATION_SCHEMA`)."""
        ...


def _violations(
    df: DataFrame,
    kind: str,
    severity: str,
    positions: Column,
    detail: Column,
    log: Column | None = None,
) -> DataFrame:
    assert severity in SEVERITIES
    return df.select(
        F.lit(kind).alias("kind"),
        F.lit(severity).alias("severity"),
        (log if log is not None else F.col("log")).cast("string").alias("log"),
        F.col("txnid_most_bits").cast("long").alias("txnid_most_bits"),
        F.col("txnid_least_bits").cast("long").alias("txnid_least_bits"),
        positions.cast(ArrayType(POSITION_TYPE)).alias("positions"),
        detail.cast("string").alias("detail"),
    )


def _txn(prefix: str = "") -> Column:
    return F.format_string(
        "(%d,%d)", F.col(f"{prefix}txnid_most_bits"), F.col(f"{prefix}txnid_least_bits")
    )


@dataclass(frozen=True)
class CorruptRecords:
    """Records that could not be read or decoded (error rows of the data source)."""

    name: str = "corrupt_records"
    description: str = "every stored record decodes and its cursor state fits its entry"
    requires: tuple[str, ...] = ()

    def run(self, ctx: AuditContext) -> DataFrame:
        """Return one violation per error row of either record table."""
        out: DataFrame | None = None
        for table in ("txn_log_records", "pending_ack_records"):
            if table not in ctx.tables:
                continue
            bad = ctx.table(table).filter(F.col("error").isNotNull())
            v = _violations(
                bad,
                "corrupt_record",
                "integrity",
                F.array(position("record")),
                F.col("error"),
            )
            out = v if out is None else out.unionByName(v)
        return out if out is not None else ctx.spark.createDataFrame([], VIOLATION_SCHEMA)


@dataclass(frozen=True)
class StateMachine:
    """Coordinator logs follow the state machine.

    Every UPDATE is an allowed status change; a transaction lives in one
    coordinator log and begins once (one NEW: an id is never handed out
    twice); partitions and subscriptions are added before the decision.
    """

    name: str = "state_machine"
    description: str = (
        "allowed status changes; one log and one NEW per transaction; no add after the decision"
    )
    requires: tuple[str, ...] = ("txn_log_records", "transactions")

    def run(self, ctx: AuditContext) -> DataFrame:
        """Return invalid transitions, split or reused transactions, late adds."""
        bad = invalid_transitions(ctx.table("txn_log_records"))
        v1 = _violations(
            bad,
            "invalid_transition",
            "integrity",
            F.array(position(F.concat(F.col("prev"), F.lit("->"), F.col("new_status")))),
            F.format_string(
                "transaction %s goes from %s to %s", _txn(), F.col("prev"), F.col("new_status")
            ),
        )
        multi = ctx.table("transactions").filter(F.col("logs") > 1)
        v2 = _violations(
            multi,
            "transaction_in_several_logs",
            "integrity",
            F.array(F.col("first_position"), F.col("final_position")),
            F.format_string("transaction %s appears in %d coordinator logs", _txn(), F.col("logs")),
        )
        return v1.unionByName(v2).unionByName(_reused_ids(ctx)).unionByName(_late_adds(ctx))


def _at() -> Column:
    """Return a record's place in its log, comparable (ledger, entry, batch index)."""
    return F.struct("ledger_id", "entry_id", "batch_index")


def _reused_ids(ctx: AuditContext) -> DataFrame:
    """Transactions begun twice (two NEW records): a coordinator handed an id out again."""
    news = (
        ctx.table("txn_log_records")
        .filter(F.col("metadata_op") == "NEW")
        .groupBy("log", *TXN_KEY)
        .agg(
            F.sort_array(
                F.collect_list(F.struct(_at().alias("k"), position("NEW").alias("p")))
            ).alias("ps")
        )
        .filter(F.size("ps") > 1)
    )
    return _violations(
        news,
        "reused_transaction_id",
        "safety",
        F.transform("ps", lambda x: x["p"]),
        F.format_string(
            "transaction id %s begun %d times in %s: two transactions share it",
            _txn(),
            F.size("ps"),
            F.col("log"),
        ),
    )


def _late_adds(ctx: AuditContext) -> DataFrame:
    """Partitions or subscriptions added after the transaction was decided.

    The coordinator sends the end to the participants it knows when it
    decides; one added later never hears of it (Pulsar refuses the add).
    """
    records = ctx.table("txn_log_records").filter(F.col("error").isNull())
    decided = (
        records.filter((F.col("metadata_op") == "UPDATE") & (F.col("new_status") != F.lit("OPEN")))
        .groupBy("log", *TXN_KEY)
        .agg(F.min(F.struct(_at().alias("k"), position("DECISION").alias("p"))).alias("d"))
    )
    adds = records.filter(F.col("metadata_op").isin("ADD_PARTITION", "ADD_SUBSCRIPTION"))
    late = adds.join(decided, ["log", *TXN_KEY], "inner").filter(_at() > F.col("d.k"))
    return _violations(
        late,
        "added_after_decision",
        "safety",
        F.array(F.col("d.p"), position(F.col("metadata_op"))),
        F.format_string(
            "transaction %s: %s %s after its decision (%s): that participant never gets the end",
            _txn(),
            F.col("metadata_op"),
            F.array_join(
                F.concat(
                    F.coalesce(F.col("partitions"), F.array().cast("array<string>")),
                    F.transform(
                        F.coalesce(F.col("subscriptions"), F.array()),
                        lambda x: F.concat(x["topic"], F.lit("/"), x["subscription"]),
                    ),
                ),
                ",",
            ),
            F.col("d.p.role"),
        ),
    )


def _pending_by_txn(pending: DataFrame) -> DataFrame:
    """Per (pending-ack log, transaction): positions of its ACK, COMMIT and ABORT records."""
    good = pending.filter(F.col("op").isNotNull())

    def where(op: str) -> Column:
        return F.collect_list(F.when(F.col("op") == op, position(op)))

    return good.groupBy("log", *TXN_KEY).agg(
        where("ACK").alias("acks"),
        where("COMMIT").alias("commits"),
        where("ABORT").alias("aborts"),
    )


def _expected_logs() -> Column:
    """Pending-ack log names of a transaction's registered subscriptions."""
    return F.transform(
        F.coalesce(F.col("subscriptions"), F.array()),
        lambda s: F.concat(
            s["topic"], F.lit("-"), s["subscription"], F.lit(PENDING_ACK_LOG_SUFFIX)
        ),
    )


@dataclass(frozen=True)
class PendingAckOutcomes:
    """Pending-ack logs agree with the coordinators' outcomes.

    A COMMITTED transaction that acked a subscription has a COMMIT record
    there; an ABORTED one an ABORT record; nothing aborted is applied
    (COMMIT) and nothing committed released (ABORT); acks happen only in
    subscriptions the coordinator was told about (else its end never comes).
    """

    name: str = "pending_ack_outcomes"
    description: str = "pending-ack COMMIT/ABORT records match the coordinators' outcomes"
    requires: tuple[str, ...] = ("transactions", "pending_ack_records")

    def run(self, ctx: AuditContext) -> DataFrame:
        """Return the disagreements between pending-ack logs and coordinators."""
        per = _pending_by_txn(ctx.table("pending_ack_records"))
        txns = ctx.table("transactions").select(
            *TXN_KEY,
            F.col("log").alias("coordinator_log"),
            "status",
            "subscriptions",
            "final_position",
        )
        j = per.join(txns, TXN_KEY, "inner")
        n = F.size
        final = F.array(F.col("final_position"))
        cases = [
            (
                "missing_pending_ack_commit",
                "safety",
                (F.col("status") == "COMMITTED") & (n("acks") > 0) & (n("commits") == 0),
                F.concat(F.col("acks"), final),
                "committed transaction %s acked in %s but the log has no COMMIT for it",
            ),
            (
                "aborted_ack_committed",
                "safety",
                F.col("status").isin("ABORTING", "ABORTED") & (n("commits") > 0),
                F.concat(F.col("commits"), final),
                "aborted transaction %s has a pending-ack COMMIT in %s (acks applied)",
            ),
            (
                "committed_ack_aborted",
                "safety",
                F.col("status").isin("COMMITTING", "COMMITTED") & (n("aborts") > 0),
                F.concat(F.col("aborts"), final),
                "committed transaction %s has a pending-ack ABORT in %s (acks released)",
            ),
            (
                "missing_pending_ack_abort",
                "liveness",
                (F.col("status") == "ABORTED") & (n("acks") > 0) & (n("aborts") == 0),
                F.concat(F.col("acks"), final),
                "aborted transaction %s acked in %s but the log has no ABORT:"
                " the messages stay held",
            ),
            (
                "unregistered_subscription",
                "liveness",
                # Decided only: an OPEN one may still register it (live directory).
                F.col("status").isin("COMMITTING", "COMMITTED", "ABORTING", "ABORTED")
                & (n("acks") > 0)
                & ~F.array_contains(_expected_logs(), F.col("log")),
                F.col("acks"),
                "transaction %s acked in %s, a subscription its coordinator never registered",
            ),
        ]
        out: DataFrame | None = None
        for kind, severity, cond, positions, text in cases:
            v = _violations(
                j.filter(cond),
                kind,
                severity,
                positions,
                F.format_string(text, _txn(), F.col("log")),
            )
            out = v if out is None else out.unionByName(v)
        assert out is not None
        return out


@dataclass(frozen=True)
class PendingAckOrder:
    """No transaction acks in a subscription after its end there.

    An ACK record after the transaction's COMMIT or ABORT record in the same
    pending-ack log is never resolved: the message stays held by a
    transaction that is over (Pulsar's pending-ack handle refuses it).
    """

    name: str = "pending_ack_order"
    description: str = "no pending-ack ACK after the transaction's COMMIT/ABORT in that log"
    requires: tuple[str, ...] = ("pending_ack_records",)

    def run(self, ctx: AuditContext) -> DataFrame:
        """Return one violation per ACK record that follows its transaction's end."""
        good = ctx.table("pending_ack_records").filter(F.col("op").isNotNull())
        ends = (
            good.filter(F.col("op").isin("COMMIT", "ABORT"))
            .groupBy("log", *TXN_KEY)
            .agg(F.min(F.struct(_at().alias("k"), position(F.col("op")).alias("p"))).alias("e"))
        )
        late = (
            good.filter(F.col("op") == "ACK")
            .join(ends, ["log", *TXN_KEY], "inner")
            .filter(_at() > F.col("e.k"))
        )
        return _violations(
            late,
            "ack_after_end",
            "safety",
            F.array(F.col("e.p"), position("ACK")),
            F.format_string(
                "transaction %s acks in %s after its %s there: the ack is never resolved",
                _txn(),
                F.col("log"),
                F.col("e.p.role"),
            ),
        )


@dataclass(frozen=True)
class DoubleAck:
    """No message is acknowledged by two committed transactions (consumed twice).

    Individual acks only; a batched message counts as the same one when both
    ack sets delete a common batch index (the Rust ``ack_set_overlaps`` UDF).
    """

    name: str = "double_ack"
    description: str = "no message individually acked by two committed transactions"
    requires: tuple[str, ...] = ("transactions", "pending_ack_records")

    def run(self, ctx: AuditContext) -> DataFrame:
        """Return one violation per pair of committed transactions acking the same message."""
        committed = (
            ctx.table("transactions").filter(F.col("status") == "COMMITTED").select(*TXN_KEY)
        )
        acks = (
            ctx.table("pending_ack_records")
            .filter((F.col("op") == "ACK") & (F.col("ack_type") == "Individual"))
            .join(committed, TXN_KEY, "inner")
            .select(
                "log",
                *TXN_KEY,
                position("ACK").alias("record"),
                F.explode("positions").alias("p"),
            )
            .select(
                "log",
                *TXN_KEY,
                "record",
                F.col("p.ledger_id").alias("m_ledger"),
                F.col("p.entry_id").alias("m_entry"),
                F.col("p.batch_size").alias("m_size"),
                F.col("p.ack_set").alias("m_acks"),
            )
        )
        a, b = acks.alias("a"), acks.alias("b")
        pairs = a.join(
            b,
            (F.col("a.log") == F.col("b.log"))
            & (F.col("a.m_ledger") == F.col("b.m_ledger"))
            & (F.col("a.m_entry") == F.col("b.m_entry"))
            & (
                F.struct(F.col("a.txnid_most_bits"), F.col("a.txnid_least_bits"))
                < F.struct(F.col("b.txnid_most_bits"), F.col("b.txnid_least_bits"))
            ),
        )

        def whole(side: str) -> Column:
            return F.coalesce(F.col(f"{side}.m_size"), F.lit(1)) <= 1

        same_size = F.col("a.m_size") == F.col("b.m_size")
        overlap = (
            whole("a")
            | whole("b")
            | ~same_size
            | ack_set_overlaps(F.col("a.m_acks"), F.col("b.m_acks"), F.col("a.m_size"))
        )
        hits = pairs.filter(overlap).select(
            F.col("a.log").alias("log"),
            F.col("a.txnid_most_bits").alias("txnid_most_bits"),
            F.col("a.txnid_least_bits").alias("txnid_least_bits"),
            F.col("b.txnid_most_bits").alias("other_most"),
            F.col("b.txnid_least_bits").alias("other_least"),
            F.col("a.m_ledger").alias("m_ledger"),
            F.col("a.m_entry").alias("m_entry"),
            F.col("a.record").alias("ra"),
            F.col("b.record").alias("rb"),
        )
        return _violations(
            hits,
            "double_ack",
            "safety",
            F.array(F.col("ra"), F.col("rb")),
            F.format_string(
                "message %d:%d acked in %s by committed transactions %s and (%d,%d)",
                F.col("m_ledger"),
                F.col("m_entry"),
                F.col("log"),
                _txn(),
                F.col("other_most"),
                F.col("other_least"),
            ),
        )


#: The checks a default audit runs, in order.
CHECKS: list[Check] = [
    CorruptRecords(),
    StateMachine(),
    PendingAckOutcomes(),
    PendingAckOrder(),
    DoubleAck(),
]


# ------------------------------------------------------------------ measures


def _stuck(ctx: AuditContext) -> DataFrame:
    now = F.lit(ctx.reference_time_ms)
    t = ctx.table("transactions")
    open_late = (F.col("status") == "OPEN") & (F.col("start_time") + F.col("timeout_ms") < now)
    since = F.coalesce(F.col("decision_time"), F.col("start_time"))
    ending_late = F.col("status").isin("COMMITTING", "ABORTING") & (
        now - since > F.lit(ctx.options.stuck_after_ms)
    )
    return t.filter(open_late | ending_late).select(
        *TXN_KEY,
        "log",
        "status",
        "client_name",
        "timeout_ms",
        (now - F.col("start_time")).alias("age_ms"),
        F.when(open_late, F.lit("open past its timeout"))
        .otherwise(F.lit("decided but not finished"))
        .alias("reason"),
        "first_position",
        "final_position",
    )


def _entries(records: DataFrame, kind: str) -> DataFrame:
    """One row per stored entry of a record table."""
    return records.groupBy("log", "ledger_id", "entry_id").agg(
        F.lit(kind).alias("kind"),
        F.count(F.lit(1)).alias("records"),
        F.max("entry_size").alias("entry_size"),
        F.max(F.col("batched").cast("int")).alias("batched"),
        F.min(F.coalesce(F.col("deleted"), F.lit(False)).cast("int")).alias("all_deleted"),
        F.max(F.coalesce(F.col("deleted"), F.lit(False)).cast("int")).alias("any_deleted"),
    )


_SIZE_BUCKETS = (1, 10, 50, 100, 200, 500, 1000)


def _bucket_label(size: int) -> str:
    lower = [b for b in _SIZE_BUCKETS if b <= size]
    lo = lower[-1] if lower else 1
    higher = [b for b in _SIZE_BUCKETS if b > size]
    return f"{lo}" if lo == 1 and size == 1 else (f"{lo}-{higher[0] - 1}" if higher else f"{lo}+")


def _batching(ctx: AuditContext, entries: DataFrame) -> list[dict[str, Any]]:
    per_log = entries.groupBy("log", "kind").agg(
        F.count(F.lit(1)).alias("entries"),
        F.sum("records").alias("records"),
        F.sum("entry_size").alias("bytes"),
        F.sum("batched").alias("batched_entries"),
        F.max("records").alias("max_batch"),
        F.sum("all_deleted").alias("freed"),
        F.sum(
            F.when((F.col("any_deleted") == 1) & (F.col("all_deleted") == 0), 1).otherwise(0)
        ).alias("partially_deleted"),
    )
    logs = {r["log"]: r.asDict() for r in per_log.collect()}
    sizes = entries.groupBy("log", "records", "batched").count().collect()
    out: list[dict[str, Any]] = []
    for name in sorted(logs):
        row = logs[name]
        cap = ctx.options.max_records or (row["max_batch"] if row["max_batch"] > 1 else None)
        histogram: dict[str, int] = {}
        triggers = {"max_records": 0, "max_delay_or_max_size": 0, "unbatched": 0}
        for s in sizes:
            if s["log"] != name:
                continue
            label = _bucket_label(int(s["records"]))
            histogram[label] = histogram.get(label, 0) + int(s["count"])
            if not s["batched"]:
                triggers["unbatched"] += int(s["count"])
            elif cap is not None and s["records"] >= cap:
                triggers["max_records"] += int(s["count"])
            else:
                triggers["max_delay_or_max_size"] += int(s["count"])
        entries_n, records_n = int(row["entries"]), int(row["records"] or 0)
        out.append(
            {
                "log": name,
                "kind": row["kind"],
                "entries": entries_n,
                "records": records_n,
                "bytes": int(row["bytes"] or 0),
                "records_per_entry": round(records_n / entries_n, 3) if entries_n else 0.0,
                "max_batch": int(row["max_batch"] or 0),
                "entries_saved_by_batching": records_n - entries_n,
                "entries_freed": int(row["freed"] or 0),
                "entries_partially_deleted": int(row["partially_deleted"] or 0),
                "batch_size_histogram": dict(
                    sorted(histogram.items(), key=lambda kv: int(kv[0].split("-")[0].rstrip("+")))
                ),
                "flush_triggers_inferred": triggers,
                "max_records_assumed": cap,
            }
        )
    return out


def _latency(ctx: AuditContext) -> dict[str, Any]:
    t = ctx.table("transactions").filter(F.col("latency_ms").isNotNull())
    stats = (
        t.groupBy("status")
        .agg(
            F.count(F.lit(1)).alias("count"),
            F.percentile_approx("latency_ms", [0.5, 0.9, 0.99], 10000).alias("p"),
            F.max("latency_ms").alias("max"),
            F.mean("latency_ms").alias("mean"),
        )
        .collect()
    )
    by_status = {
        r["status"]: {
            "count": int(r["count"]),
            "p50": int(r["p"][0]),
            "p90": int(r["p"][1]),
            "p99": int(r["p"][2]),
            "max": int(r["max"]),
            "mean": round(float(r["mean"]), 3),
        }
        for r in stats
    }
    # Five buckets per decade: bucket b holds latencies in [10^(b/5), 10^((b+1)/5)).
    hist = (
        t.select(
            "status",
            F.floor(F.log10(F.greatest(F.col("latency_ms").cast("double"), F.lit(1.0))) * 5)
            .cast("int")
            .alias("b"),
        )
        .groupBy("status", "b")
        .count()
        .collect()
    )
    histogram: dict[str, dict[str, int]] = {}
    for r in hist:
        histogram.setdefault(r["status"], {})[str(int(r["b"]))] = int(r["count"])
    return {"by_status": by_status, "log10_fifth_histogram": histogram}


# ------------------------------------------------------------------ the job


@dataclass
class AuditResult:
    """What an audit found and where it wrote it."""

    out_dir: Path
    summary: dict[str, Any]
    report: Path

    @property
    def verdict(self) -> str:
        """Return ``PASS`` (no violation) or ``FAIL``."""
        return str(self.summary["verdict"])

    @property
    def violations(self) -> int:
        """Return the number of violations found."""
        return int(self.summary["violations"]["total"])


def _load(
    spark: SparkSession, data_dir: str, log: str, kind: str, out: Path, name: str
) -> DataFrame:
    """Read logs matching ``log`` through the data source into Parquet table ``name``."""
    df = (
        spark.read.format("txnstream-log")
        .option("path", data_dir)
        .option("log", log)
        .option("kind", kind)
        .load()
    )
    df.write.mode("overwrite").parquet(str(out / name))
    return spark.read.schema(schema_of(kind)).parquet(str(out / name))


def _save(df: DataFrame, out: Path, name: str) -> DataFrame:
    df.write.mode("overwrite").parquet(str(out / name))
    return df.sparkSession.read.parquet(str(out / name))


def run_audit(
    data_dir: str | Path,
    out_dir: str | Path,
    *,
    spark: SparkSession | None = None,
    master: str = DEFAULT_MASTER,
    options: AuditOptions | None = None,
    checks: Sequence[Check] | None = None,
    progress: Callable[[str], None] | None = None,
) -> AuditResult:
    """Audit the data directory ``data_dir`` into ``out_dir`` (replaced) and return the result.

    ``spark`` defaults to :func:`txnstream.spark.session` on ``master``;
    ``checks`` to :data:`CHECKS`.
    """
    from txnstream.spark.report import write_report

    started = time.monotonic()
    step = progress or (lambda _s: None)
    opts = options or AuditOptions()
    data = str(Path(data_dir))
    out = Path(out_dir)
    names = ManagedLedger.names(data)  # before Spark starts: not a data directory fails fast
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    spark = spark or session(master)
    coordinator_logs = sorted(n for n in names if log_kind(n) == "txn")
    pending_logs = sorted(n for n in names if log_kind(n) == "pending_ack")
    ctx = AuditContext(spark, data, out, opts)

    # Coordinator logs strictly before pending-ack logs (see the module docs).
    step(f"reading {len(coordinator_logs)} coordinator log(s)")
    txn_records = _load(spark, data, COORDINATOR_LOG_PREFIX + "*", "txn", out, "txn_log_records")
    step(f"reading {len(pending_logs)} pending-ack log(s)")
    pending = _load(
        spark, data, "*" + PENDING_ACK_LOG_SUFFIX, "pending_ack", out, "pending_ack_records"
    )
    ctx.tables["txn_log_records"] = txn_records
    ctx.tables["pending_ack_records"] = pending

    step("reconstructing transactions")
    ctx.tables["transactions"] = _save(final_states(txn_records), out, "transactions")
    latest = txn_records.agg(
        F.max(F.greatest("last_modification_time", "start_time")).alias("t")
    ).collect()[0]["t"]
    ctx.reference_time_ms = int(opts.now_ms or latest or int(time.time() * 1000))

    step("running checks")
    ran: list[dict[str, str]] = []
    found: DataFrame = spark.createDataFrame([], VIOLATION_SCHEMA)
    for check in checks if checks is not None else CHECKS:
        missing = [t for t in check.requires if t not in ctx.tables]
        if missing:
            ran.append({"name": check.name, "status": "skipped", "reason": f"no {missing}"})
            continue
        found = found.unionByName(check.run(ctx))
        ran.append({"name": check.name, "status": "ran", "description": check.description})
    violations = _save(found, out, "violations")
    by_kind = {r["kind"]: int(r["count"]) for r in violations.groupBy("kind").count().collect()}
    by_severity = {
        r["severity"]: int(r["count"]) for r in violations.groupBy("severity").count().collect()
    }

    step("measuring")
    stuck = _save(_stuck(ctx), out, "stuck_transactions")
    entry_tables = [_entries(txn_records, "txn"), _entries(pending, "pending_ack")]
    entries = _save(entry_tables[0].unionByName(entry_tables[1]), out, "entries")
    batching = _batching(ctx, entries)
    status_counts = {
        str(r["status"]): int(r["count"])
        for r in ctx.table("transactions").groupBy("status").count().collect()
    }
    timed_out = ctx.table("transactions").filter(F.col("timed_out")).count()
    pending_ops = {str(r["op"]): int(r["count"]) for r in pending.groupBy("op").count().collect()}
    unknown = (
        pending.select(*TXN_KEY)
        .distinct()
        .join(ctx.table("transactions").select(*TXN_KEY), TXN_KEY, "left_anti")
        .count()
    )
    total_violations = sum(by_kind.values())
    summary: dict[str, Any] = {
        "data_dir": data,
        "out_dir": str(out),
        "generated_at_ms": int(time.time() * 1000),
        "reference_time_ms": ctx.reference_time_ms,
        "spark_master": spark.sparkContext.master,
        "verdict": "PASS" if total_violations == 0 else "FAIL",
        "violations": {"total": total_violations, "by_kind": by_kind, "by_severity": by_severity},
        "exactly_once": {
            "verdict": "not_checked",
            "reason": "topic messages and markers are not audited yet (no topic check ran)",
        },
        "checks": ran,
        "transactions": {
            "total": sum(status_counts.values()),
            "by_status": status_counts,
            "timed_out": int(timed_out),
            "coordinator_logs": coordinator_logs,
        },
        "latency_ms": _latency(ctx),
        "stuck": {"count": stuck.count(), "stuck_after_ms": opts.stuck_after_ms},
        "batching": batching,
        "entries": {
            "total": sum(b["entries"] for b in batching),
            "records": sum(b["records"] for b in batching),
            "saved_by_batching": sum(b["entries_saved_by_batching"] for b in batching),
            "freed": sum(b["entries_freed"] for b in batching),
            "partially_deleted": sum(b["entries_partially_deleted"] for b in batching),
        },
        "pending_ack": {
            "logs": pending_logs,
            "records_by_op": pending_ops,
            "transactions_unknown_to_coordinators": int(unknown),
        },
        "tables": {
            name: name + "/"
            for name in (
                "txn_log_records",
                "pending_ack_records",
                "transactions",
                "violations",
                "stuck_transactions",
                "entries",
            )
        },
    }
    step("writing the report")
    summary["seconds"] = round(time.monotonic() - started, 3)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    report = write_report(out / "report.html", summary, _rows(violations, 500), _rows(stuck, 200))
    return AuditResult(out, summary, report)


def _rows(df: DataFrame, limit: int | None) -> list[dict[str, Any]]:
    if limit is not None:
        df = df.limit(limit)
    return [r.asDict(recursive=True) for r in df.collect()]


def violation_rows(result: AuditResult, spark: SparkSession) -> list[dict[str, Any]]:
    """Return every violation of ``result`` as plain dicts (reads its Parquet table)."""
    return _rows(spark.read.parquet(str(result.out_dir / "violations")), None)
