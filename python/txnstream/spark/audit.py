"""The audit job (``txnstream audit DATA_DIR``): what the logs say happened, checked.

On Spark, from the files of a data directory (read-only, live or closed):

1. reads every coordinator log, then every pending-ack log, then the
   cursors of subscriptions that ack in transactions, then every user topic
   partition (messages READ_UNCOMMITTED and READ_COMMITTED, markers), in
   that order: a coordinator logs COMMITTED only after every participant's
   end is durable, so a COMMITTED seen first guarantees its pending-ack
   COMMIT and its markers are in the later reads even while a broker keeps
   running; the cursors before the topics, so an input committed after the
   topic read is not counted consumed while its outputs were not read. A
   transaction undecided at the coordinator read, or begun after it, is
   left out of the exactly-once count (its outputs and inputs both);
2. reconstructs each transaction's final state (:mod:`.transactions`);
3. runs the checks (:data:`CHECKS`), each reporting violations with the
   transaction and the positions involved;
4. measures batching efficiency (records per entry, inferred flush
   triggers), the latency distribution, stuck transactions and entries
   freed;
5. writes Parquet tables, ``summary.json`` and ``report.html``.

Checks are pluggable: a :class:`Check` names the tables it needs and returns
violations; one whose tables are missing is reported as skipped (a directory
without topics skips the topic checks). The topic checks are
:class:`TopicMarkers` (markers on every partition a decided transaction
wrote to, agreeing with its outcome), :class:`AbortedVisible` and
:class:`ExactlyOnce`, the consume-transform-produce verdict: outputs name
their input by key in property ``source``; output topics default to the
topics whose committed messages carry it, input topics to the other topics
holding a message keyed by a value the outputs name
(:attr:`AuditOptions.input_topics` / ``output_topics``, CLI
``--input-topic`` / ``--output-topic``, choose them). The verdict (``PASS``,
``FAIL`` or ``not_checked`` with a reason) and its counts are
``summary["exactly_once"]``; the pending-ack side of "a committed
transaction's acks are committed" is :class:`PendingAckOutcomes`'
``missing_pending_ack_commit``.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
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
from txnstream.broker.topic_name import TopicName
from txnstream.config import BatchedWriteConfig
from txnstream.datadir import pending_ack_owner_map
from txnstream.errors import InvalidArgumentError, InvalidTopicNameError
from txnstream.spark.log_source import (
    COORDINATOR_LOG_PREFIX,
    PENDING_ACK_LOG_SUFFIX,
    log_kind,
    schema_of,
)
from txnstream.spark.session import DEFAULT_MASTER, session
from txnstream.spark.topic_source import topic_partitions
from txnstream.spark.transactions import (
    TXN_KEY,
    final_states,
    invalid_transitions,
    position,
)
from txnstream.spark.udfs import ack_set_overlaps

__all__ = [
    "CHECKS",
    "EXACTLY_ONCE_VERDICTS",
    "VIOLATION_SCHEMA",
    "AuditContext",
    "AuditOptions",
    "AuditResult",
    "Check",
    "check_output_dir",
    "pending_ack_owners",
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
    #: The reference time (ms since the epoch); default now (or the latest
    #: time in the logs, if later: a clock behind the writer's).
    now_ms: int | None = None
    #: The writers' ``max_records``, to tell flush triggers apart; default the
    #: broker's default (:class:`~txnstream.config.BatchedWriteConfig`, 512).
    max_records: int | None = None
    #: Input topics of the exactly-once check (any form of topic name);
    #: default: the topics holding a message keyed by a value the outputs name.
    input_topics: tuple[str, ...] = ()
    #: Output topics of the exactly-once check; default: the topics whose
    #: READ_COMMITTED messages carry :attr:`source_property`.
    output_topics: tuple[str, ...] = ()
    #: The message property through which an output names its input (by key).
    source_property: str = "source"


@dataclass
class AuditContext:
    """What checks and measures see: the session, the tables, the options."""

    spark: SparkSession
    data_dir: str
    out_dir: Path
    options: AuditOptions
    tables: dict[str, DataFrame] = field(default_factory=dict)
    reference_time_ms: int = 0
    #: Figures checks record for the summary (``exactly_once``: verdict and counts).
    results: dict[str, Any] = field(default_factory=dict)

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
            "start_time",
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
                # Decided only: an OPEN one may still register it (live directory);
                # and only with its NEW record stored: the ADD records follow
                # it, so none of them was trimmed away.
                F.col("status").isin("COMMITTING", "COMMITTED", "ABORTING", "ABORTED")
                & F.col("start_time").isNotNull()
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


# ------------------------------------------------------------------ topics
#
# Tables (read after the coordinator and pending-ack logs, so every
# transaction decided in the coordinator read has its markers and pending-ack
# ends in these reads even while a broker keeps writing):
#
# - ``topic_messages``: every message of every user topic partition
#   (READ_UNCOMMITTED, without ``value``), plus ``ledger`` (the partition's
#   managed-ledger name);
# - ``topic_committed``: the same columns for what a READ_COMMITTED read
#   returns (the data source's own rules: ABORT markers, the read limit);
# - ``topic_markers``: one row per COMMIT/ABORT marker (mode ``markers``);
# - ``pending_ack_logs``: which partition and subscription each pending-ack
#   log belongs to (the broker's owner record, not the log's name);
# - ``cursor_deleted``: per (partition, subscription with a pending-ack log),
#   the entry ranges its cursor deleted (mark-delete and individually deleted
#   runs): acks that were applied, even once their pending-ack records are
#   trimmed.

#: Verdicts of the exactly-once check.
EXACTLY_ONCE_VERDICTS = ("PASS", "FAIL", "not_checked")
_DECIDED = ("COMMITTING", "COMMITTED", "ABORTING", "ABORTED")


def _partition_ledger() -> Column:
    """Return the managed-ledger name of a topic row's partition (the topic if unpartitioned)."""
    return F.when(
        F.col("partition") >= 0,
        F.concat(F.col("topic"), F.lit("-partition-"), F.col("partition").cast("string")),
    ).otherwise(F.col("topic"))


def _msg_position(role: str | Column, batch_index: Column | None = None) -> Column:
    """Return the position of a topic row (message or marker) in violation form."""
    return F.struct(
        F.col("ledger").alias("log"),
        F.col("ledger_id"),
        F.col("entry_id"),
        (batch_index if batch_index is not None else F.col("batch_index"))
        .cast("int")
        .alias("batch_index"),
        (F.lit(role) if isinstance(role, str) else role).cast("string").alias("role"),
    )


def _marker_position() -> Column:
    return _msg_position(F.concat(F.col("marker"), F.lit(" marker")), F.lit(None))


def _load_topic(spark: SparkSession, data: str, out: Path, name: str, **options: str) -> DataFrame:
    """Read every user topic partition through the ``txnstream`` source into Parquet ``name``."""
    reader = spark.read.format("txnstream").option("path", data).option("topic", "persistent://*")
    for k, v in options.items():
        reader = reader.option(k, v)
    df = reader.load()
    if "value" in df.columns:
        df = df.drop("value")
    df = df.withColumn("ledger", _partition_ledger())
    df.write.mode("overwrite").parquet(str(out / name))
    return spark.read.schema(df.schema).parquet(str(out / name))


def pending_ack_owners(
    pending_logs: Sequence[str],
    partitions: Sequence[str],
    owner_map: Mapping[str, tuple[str, str]],
) -> list[tuple[str, str, str]]:
    """Return ``(log, partition, subscription)`` for each pending-ack log of one of ``partitions``.

    The owner comes from ``owner_map`` (the broker's record,
    :func:`txnstream.datadir.pending_ack_owner_map`), never from the log's
    name (``<partition>-<subscription>__transaction_pending_ack`` is the
    same for topic ``a`` with subscription ``b-c`` and topic ``a-b`` with
    subscription ``c``). A log the map does not name is left out.
    """
    stored = set(partitions)
    out = []
    for log in pending_logs:
        owner = owner_map.get(log)
        if owner is not None and owner[0] in stored:
            out.append((log, owner[0], owner[1]))
    return out


_CURSOR_SCHEMA = StructType(
    [
        StructField("ledger", StringType()),
        StructField("subscription", StringType()),
        StructField("first_ledger", LongType()),
        StructField("first_entry", LongType()),
        StructField("last_ledger", LongType()),
        StructField("last_entry", LongType()),
        StructField("kind", StringType()),
    ]
)


def _cursor_ranges(data: str, owners: Sequence[tuple[str, str, str]]) -> list[tuple[Any, ...]]:
    """Entry ranges deleted by the cursors of subscriptions that ack in transactions."""
    rows: list[tuple[Any, ...]] = []
    by_partition: dict[str, set[str]] = {}
    for _log, partition, sub in owners:
        by_partition.setdefault(partition, set()).add(sub)
    for partition, subs in sorted(by_partition.items()):
        ml = ManagedLedger.open(data, partition, read_only=True)
        try:
            known = set(ml.cursor_names())
            for sub in sorted(subs & known):
                cursor = ml.open_cursor(sub)
                md = cursor.mark_delete_position
                if md is not None:
                    rows.append((partition, sub, 0, 0, md.ledger_id, md.entry_id, "mark_delete"))
                for a, b in cursor.deleted_ranges():
                    rows.append(
                        (partition, sub, a.ledger_id, a.entry_id, b.ledger_id, b.entry_id, "range")
                    )
        finally:
            ml.close()
    return rows


@dataclass(frozen=True)
class TopicMarkers:
    """Topic markers agree with the coordinators' outcomes.

    Every COMMITTED transaction has a COMMIT marker on each partition where
    it has messages (a partition it added but never wrote to gets none: the
    transaction buffer ends such a transaction at once), every ABORTED one a
    marker there (else READ_COMMITTED readers stay stuck at its first
    message); no marker contradicts the outcome; and a decided transaction's
    messages are on partitions its coordinator registered (ADD_PARTITION).
    """

    name: str = "topic_markers"
    description: str = (
        "COMMIT markers on every partition a committed transaction wrote to;"
        " markers match outcomes; partitions registered"
    )
    requires: tuple[str, ...] = ("transactions", "topic_messages", "topic_markers")

    def run(self, ctx: AuditContext) -> DataFrame:
        """Return missing or contradicting markers and unregistered partitions."""
        txns = ctx.table("transactions").select(
            *TXN_KEY, "status", "partitions", "start_time", "final_position"
        )
        msgs = ctx.table("topic_messages").filter(F.col("txnid_most_bits").isNotNull())
        per = msgs.groupBy("ledger", *TXN_KEY).agg(
            F.count(F.lit(1)).alias("messages"),
            F.min(F.struct(_at().alias("k"), _msg_position("first message").alias("p"))).alias(
                "first"
            ),
            F.max(F.struct(_at().alias("k"), _msg_position("last message").alias("p"))).alias(
                "last"
            ),
        )
        markers = ctx.table("topic_markers").filter(F.col("txnid_most_bits").isNotNull())
        marks = markers.groupBy("ledger", *TXN_KEY).agg(
            F.collect_list(F.when(F.col("marker") == "COMMIT", _marker_position())).alias(
                "commits"
            ),
            F.collect_list(F.when(F.col("marker") == "ABORT", _marker_position())).alias("aborts"),
        )
        j = per.join(txns, TXN_KEY, "inner").join(marks, ["ledger", *TXN_KEY], "left")
        n_commits = F.size(F.coalesce(F.col("commits"), F.array()))
        n_aborts = F.size(F.coalesce(F.col("aborts"), F.array()))
        final = F.array(F.col("final_position"))
        span = F.array(F.col("first.p"), F.col("last.p"))
        registered = F.array_contains(
            F.coalesce(F.col("partitions"), F.array().cast("array<string>")), F.col("ledger")
        )
        led = F.col("ledger")
        missing_commit = _violations(
            j.filter((F.col("status") == "COMMITTED") & (n_commits == 0)),
            "missing_commit_marker",
            "safety",
            F.concat(span, final),
            F.format_string(
                "committed transaction %s has %d message(s) on %s but no COMMIT marker there"
                " (partition registered: %s): READ_COMMITTED readers never see them and stop"
                " at its first message",
                _txn(),
                F.col("messages"),
                led,
                registered.cast("string"),
            ),
            log=led,
        )
        missing_abort = _violations(
            j.filter((F.col("status") == "ABORTED") & (n_commits == 0) & (n_aborts == 0)),
            "missing_abort_marker",
            "liveness",
            F.concat(span, final),
            F.format_string(
                "aborted transaction %s has %d message(s) on %s but no ABORT marker there:"
                " READ_COMMITTED readers stay stuck at its first message",
                _txn(),
                F.col("messages"),
                led,
            ),
            log=led,
        )
        unregistered = _violations(
            # Only with its NEW record stored: the ADD records follow it, none trimmed.
            j.filter(
                F.col("status").isin(*_DECIDED) & F.col("start_time").isNotNull() & ~registered
            ),
            "unregistered_partition",
            "liveness",
            F.concat(span, final),
            F.format_string(
                "transaction %s wrote %d message(s) to %s, a partition its coordinator never"
                " registered (no ADD_PARTITION): its end never reaches that partition",
                _txn(),
                F.col("messages"),
                led,
            ),
            log=led,
        )
        mt = marks.join(txns, TXN_KEY, "inner")
        contradicts = _violations(
            mt.filter(
                (F.col("status").isin("ABORTING", "ABORTED") & (n_commits > 0))
                | (F.col("status").isin("COMMITTING", "COMMITTED") & (n_aborts > 0))
            ),
            "marker_contradicts_outcome",
            "safety",
            F.concat(
                F.when(F.col("status").isin("ABORTING", "ABORTED"), F.col("commits")).otherwise(
                    F.col("aborts")
                ),
                final,
            ),
            F.format_string(
                "transaction %s ended %s but %s holds a %s marker for it",
                _txn(),
                F.col("status"),
                led,
                F.when(F.col("status").isin("ABORTING", "ABORTED"), F.lit("COMMIT")).otherwise(
                    F.lit("ABORT")
                ),
            ),
            log=led,
        )
        return (
            missing_commit.unionByName(missing_abort)
            .unionByName(unregistered)
            .unionByName(contradicts)
        )


#: Most message positions listed in one violation (the detail gives the count).
_MAX_LISTED = 20


@dataclass(frozen=True)
class AbortedVisible:
    """Nothing aborted is visible to READ_COMMITTED readers.

    A message returned by a READ_COMMITTED read (the data source's rules)
    whose transaction the coordinator aborted, or that has an ABORT marker
    on any partition, is a violation (Jepsen's *aborted read*, G1a).
    """

    name: str = "aborted_visible"
    description: str = "no message of an aborted transaction is visible to READ_COMMITTED"
    requires: tuple[str, ...] = ("transactions", "topic_committed", "topic_markers")

    def run(self, ctx: AuditContext) -> DataFrame:
        """Return one violation per (partition, aborted transaction) with visible messages."""
        aborted = (
            ctx.table("transactions")
            .filter(F.col("status").isin("ABORTING", "ABORTED"))
            .select(*TXN_KEY, "status", "final_position")
        )
        markers = ctx.table("topic_markers").filter(F.col("txnid_most_bits").isNotNull())
        abort_marks = (
            markers.filter(F.col("marker") == "ABORT")
            .groupBy(*TXN_KEY)
            .agg(F.collect_list(_marker_position()).alias("abort_markers"))
        )
        commit_marks = (
            markers.filter(F.col("marker") == "COMMIT")
            .groupBy("ledger", *TXN_KEY)
            .agg(F.collect_list(_marker_position()).alias("commit_markers"))
        )
        visible = (
            ctx.table("topic_committed")
            .filter(F.col("txnid_most_bits").isNotNull())
            .join(aborted, TXN_KEY, "left")
            .join(abort_marks, TXN_KEY, "left")
            .filter(F.col("status").isNotNull() | F.col("abort_markers").isNotNull())
        )
        per = (
            visible.groupBy("ledger", *TXN_KEY)
            .agg(
                F.count(F.lit(1)).alias("n"),
                F.sort_array(
                    F.collect_list(F.struct(_at().alias("k"), _msg_position("visible").alias("p")))
                ).alias("ps"),
                F.first("status", ignorenulls=True).alias("status"),
                F.first("final_position", ignorenulls=True).alias("final_position"),
                F.first("abort_markers", ignorenulls=True).alias("abort_markers"),
            )
            .join(commit_marks, ["ledger", *TXN_KEY], "left")
        )
        empty = F.array().cast(ArrayType(POSITION_TYPE))
        return _violations(
            per,
            "aborted_visible",
            "safety",
            F.concat(
                F.transform(F.slice("ps", 1, _MAX_LISTED), lambda x: x["p"]),
                F.coalesce(F.col("commit_markers").cast(ArrayType(POSITION_TYPE)), empty),
                F.coalesce(F.col("abort_markers").cast(ArrayType(POSITION_TYPE)), empty),
                F.when(
                    F.col("final_position").isNotNull(), F.array(F.col("final_position"))
                ).otherwise(empty),
            ),
            F.format_string(
                "aborted transaction %s: %d of its message(s) on %s are visible to"
                " READ_COMMITTED readers (%s)",
                _txn(),
                F.col("n"),
                F.col("ledger"),
                F.when(
                    F.col("status").isNotNull(),
                    F.concat(F.lit("its coordinator says "), F.col("status")),
                ).otherwise(F.lit("it has an ABORT marker on another partition")),
            ),
            log=F.col("ledger"),
        )


def _index_acked(words: str, size: str, index: str) -> Column:
    """Return whether an ack (``size`` records, ack-set ``words``: 1 = present) covers ``index``."""
    return F.expr(
        f"coalesce({size}, 1) <= 1 OR coalesce(shiftright(coalesce(try_element_at({words},"
        f" cast(floor({index} / 64) as int) + 1), 0L), {index} % 64) & 1, 0) = 0"
    )


@dataclass(frozen=True)
class ExactlyOnce:
    """Exactly-once of a consume-transform-produce workload, traced through message properties.

    Outputs are the READ_COMMITTED messages of the output topics; each names
    its input in property ``source`` (:attr:`AuditOptions.source_property`)
    by the input's key. Inputs are the READ_COMMITTED messages of the input
    topics that were consumed and committed: acked by a COMMITTED
    transaction (pending-ack ACK records; a cumulative ack covers everything
    up to it) or deleted by the cursor of a subscription that acks in
    transactions (its mark-delete and deleted ranges: applied acks, still
    known once their pending-ack records are trimmed). Per output topic,
    each input id must appear as many times as consumed-and-committed inputs
    carry it (once, with unique keys): more is ``duplicate_output``, fewer
    ``lost_input``; an output naming no such input, or without the
    property, is ``untraceable_output``.

    Output topics default to those whose READ_COMMITTED messages carry the
    property; input topics to the other topics holding a message keyed by a
    value the outputs name. Outputs of transactions still OPEN or
    COMMITTING at the coordinator read, or begun after it (a live
    directory), are left out (``outputs_after_cut``), and so are the input
    ids they name, inputs and other outputs alike.
    The verdict and its counts go to ``ctx.results["exactly_once"]``.
    """

    name: str = "exactly_once"
    description: str = (
        "every consumed-and-committed input appears exactly once in each output topic"
    )
    requires: tuple[str, ...] = (
        "transactions",
        "pending_ack_records",
        "topic_committed",
        "pending_ack_logs",
        "cursor_deleted",
    )

    def run(self, ctx: AuditContext) -> DataFrame:
        """Return duplicated, lost and untraceable outputs; record the verdict and counts."""
        spark, opts = ctx.spark, ctx.options
        prop = opts.source_property
        committed = ctx.table("topic_committed").withColumn(
            "sid", F.try_element_at(F.col("properties"), F.lit(prop))
        )
        none = spark.createDataFrame([], VIOLATION_SCHEMA)
        outputs_t = list(opts.output_topics) or sorted(
            r["topic"]
            for r in committed.filter(F.col("sid").isNotNull()).select("topic").distinct().collect()
        )
        if not outputs_t:
            ctx.results["exactly_once"] = _not_checked(
                f"no READ_COMMITTED message carries property {prop!r}: no consume-transform-"
                "produce output to trace (name them with --output-topic)"
            )
            return none
        outs = committed.filter(F.col("topic").isin(*outputs_t))
        inputs_t = list(opts.input_topics) or sorted(
            r["topic"]
            for r in committed.filter(~F.col("topic").isin(*outputs_t))
            .join(
                outs.select(F.col("sid").alias("key")).filter(F.col("key").isNotNull()).distinct(),
                "key",
                "left_semi",
            )
            .select("topic")
            .distinct()
            .collect()
        )
        if not inputs_t:
            ctx.results["exactly_once"] = _not_checked(
                f"outputs in {outputs_t} carry {prop!r} but no other topic holds a message"
                " keyed by one of its values (name the inputs with --input-topic)",
                output_topics=outputs_t,
            )
            return none

        txns = ctx.table("transactions")
        outs = outs.join(txns.select(*TXN_KEY, "status"), TXN_KEY, "left").join(
            _highest_seen(txns), "txnid_most_bits", "left"
        )
        # After the cut: undecided at the coordinator read, or begun after it
        # (absent from the read with an id above every id it showed), as
        # ``_consumed`` leaves out their inputs.
        begun_later = (
            F.col("txnid_most_bits").isNotNull()
            & F.col("status").isNull()
            & (F.col("seen").isNull() | (F.col("txnid_least_bits") > F.col("seen")))
        )
        undecided = F.col("status").isin("OPEN", "COMMITTING")
        in_flight = F.coalesce(undecided, F.lit(False)) | F.coalesce(begun_later, F.lit(False))
        after_cut = outs.filter(in_flight).count()
        # An input id such an output names is left out on both sides: its
        # input may show consumed (its cursor) without its acks having been
        # read, and a committed output of an earlier attempt is no violation.
        late_ids = outs.filter(in_flight & F.col("sid").isNotNull()).select(
            F.col("sid").alias("id")
        )
        outs = (
            outs.filter(~in_flight)
            .drop("seen")
            .join(late_ids.withColumnRenamed("id", "sid"), "sid", "left_anti")
        )

        ins = committed.filter(F.col("topic").isin(*inputs_t))
        consumed = _consumed(ctx, ins).join(late_ids, "id", "left_anti")
        consumed = _save(consumed, ctx.out_dir, "ctp_inputs")
        in_pos = _msg_position("input")
        expected = consumed.groupBy("id").agg(
            F.count(F.lit(1)).alias("e"),
            F.sort_array(F.collect_list(F.struct(_at().alias("k"), in_pos.alias("p")))).alias(
                "in_ps"
            ),
            F.min(
                F.when(
                    F.col("ack_most").isNotNull(), F.struct(F.col("ack_most"), F.col("ack_least"))
                )
            ).alias("acker"),
        )
        topics = spark.createDataFrame([(t,) for t in outputs_t], "topic string")
        expected = topics.crossJoin(expected)

        out_item = F.struct(
            F.struct("publish_time", "ledger_id", "entry_id", "batch_index").alias("k"),
            _msg_position("output").alias("p"),
            F.col("txnid_most_bits").alias("most"),
            F.col("txnid_least_bits").alias("least"),
        )
        actual = (
            outs.filter(F.col("sid").isNotNull())
            .groupBy("topic", F.col("sid").alias("id"))
            .agg(
                F.count(F.lit(1)).alias("a"),
                F.sort_array(F.collect_list(out_item)).alias("out_ps"),
            )
        )
        lineage = _save(
            expected.join(actual, ["topic", "id"], "full_outer").select(
                "topic",
                "id",
                F.coalesce(F.col("e"), F.lit(0)).alias("expected"),
                F.coalesce(F.col("a"), F.lit(0)).alias("actual"),
                "in_ps",
                "out_ps",
                "acker",
            ),
            ctx.out_dir,
            "ctp_lineage",
        )
        violations = _ctp_violations(lineage, outs.filter(F.col("sid").isNull()), prop)

        by_topic: dict[str, dict[str, int]] = {t: {} for t in outputs_t}
        for r in (
            lineage.groupBy("topic")
            .agg(
                F.sum("actual").alias("outputs"),
                F.sum(
                    F.when(
                        (F.col("expected") > 0) & (F.col("actual") > F.col("expected")),
                        F.col("actual") - F.col("expected"),
                    ).otherwise(0)
                ).alias("duplicates"),
                F.sum(
                    F.when(
                        F.col("expected") > F.col("actual"), F.col("expected") - F.col("actual")
                    ).otherwise(0)
                ).alias("missing"),
                F.sum(F.when(F.col("expected") == 0, F.col("actual")).otherwise(0)).alias(
                    "untraceable"
                ),
            )
            .collect()
        ):
            by_topic[r["topic"]] = {
                k: int(r[k] or 0) for k in ("outputs", "duplicates", "missing", "untraceable")
            }
        for r in outs.filter(F.col("sid").isNull()).groupBy("topic").count().collect():
            t = by_topic.setdefault(r["topic"], {})
            t["outputs"] = t.get("outputs", 0) + int(r["count"])
            t["untraceable"] = t.get("untraceable", 0) + int(r["count"])
        ways = {str(r["via"]): int(r["count"]) for r in consumed.groupBy("via").count().collect()}
        totals = {
            k: sum(t.get(k, 0) for t in by_topic.values())
            for k in ("outputs", "duplicates", "missing", "untraceable")
        }
        inputs_n = sum(ways.values())
        bad = totals["duplicates"] + totals["missing"] + totals["untraceable"]
        ctx.results["exactly_once"] = {
            "verdict": "FAIL" if bad else "PASS",
            "reason": (
                f"{inputs_n} consumed-and-committed input(s) traced into {len(outputs_t)}"
                f" output topic(s) through property {prop!r}"
            ),
            "input_topics": inputs_t,
            "output_topics": outputs_t,
            "source_property": prop,
            "topics_chosen": "options" if opts.output_topics or opts.input_topics else "detected",
            "inputs_consumed_committed": inputs_n,
            "inputs_by_evidence": ways,
            "outputs_after_cut": after_cut,
            **totals,
            "by_output_topic": by_topic,
        }
        return violations


def _not_checked(reason: str, **extra: Any) -> dict[str, Any]:
    return {"verdict": "not_checked", "reason": reason, **extra}


def _acked_by(ctx: AuditContext, ins: DataFrame, txns: DataFrame) -> DataFrame:
    """Return the inputs ``ins`` covered by an ACK record of a transaction in ``txns``."""
    owners = ctx.table("pending_ack_logs")
    acks = (
        ctx.table("pending_ack_records")
        .filter(F.col("op") == "ACK")
        .join(txns, TXN_KEY, "inner")
        .join(owners, "log", "inner")
        .select(
            F.col("ledger").alias("a_ledger"),
            F.col("txnid_most_bits").alias("ack_most"),
            F.col("txnid_least_bits").alias("ack_least"),
            (F.col("ack_type") == "Cumulative").alias("cumulative"),
            F.explode("positions").alias("m"),
        )
        .select(
            "a_ledger",
            "ack_most",
            "ack_least",
            "cumulative",
            F.col("m.ledger_id").alias("m_ledger"),
            F.col("m.entry_id").alias("m_entry"),
            F.col("m.batch_size").alias("m_size"),
            F.col("m.ack_set").alias("m_acks"),
        )
    )
    covered = _index_acked("m_acks", "m_size", "batch_index")
    here = F.struct("ledger_id", "entry_id")
    at_ack = F.struct(F.col("m_ledger").alias("ledger_id"), F.col("m_entry").alias("entry_id"))
    same_entry = (F.col("ledger_id") == F.col("m_ledger")) & (F.col("entry_id") == F.col("m_entry"))
    return ins.join(
        acks,
        (F.col("ledger") == F.col("a_ledger"))
        & ((same_entry & covered) | (F.col("cumulative") & (here < at_ack))),
        "inner",
    ).select("ledger", "ledger_id", "entry_id", "batch_index", "ack_most", "ack_least")


def _highest_seen(txns: DataFrame) -> DataFrame:
    """Per coordinator (``txnid_most_bits``), the highest id its log showed (``seen``)."""
    return txns.groupBy("txnid_most_bits").agg(F.max("txnid_least_bits").alias("seen"))


def _consumed(ctx: AuditContext, ins: DataFrame) -> DataFrame:
    """Input messages consumed and committed: one row each, ``via`` ack or cursor.

    On a live directory the cursors are read after the coordinator logs: an
    input acked by a transaction still in flight at that cut (or begun after
    it) may show as consumed through its cursor while its outputs are after
    the cut. Such an input is left out, as its outputs are.
    """
    txns = ctx.table("transactions")
    committed = txns.filter(F.col("status") == "COMMITTED").select(*TXN_KEY)
    by_ack = _acked_by(ctx, ins, committed)
    # In flight at the cut: undecided there, or begun after it (an id above
    # every id its coordinator's log showed). One the logs no longer hold
    # with a lower id was decided and trimmed before the cut: not in flight.
    undecided = txns.filter(F.col("status").isin("OPEN", "COMMITTING", "ABORTING"))
    highest = _highest_seen(txns)
    acked_txns = (
        ctx.table("pending_ack_records").filter(F.col("op") == "ACK").select(*TXN_KEY).distinct()
    )
    later = (
        acked_txns.join(txns.select(*TXN_KEY), TXN_KEY, "left_anti")
        .join(highest, "txnid_most_bits", "left")
        .filter(F.col("seen").isNull() | (F.col("txnid_least_bits") > F.col("seen")))
        .select(*TXN_KEY)
    )
    in_flight = _acked_by(ctx, ins, undecided.select(*TXN_KEY).unionByName(later)).select(
        "ledger", "ledger_id", "entry_id", "batch_index"
    )
    here = F.struct("ledger_id", "entry_id")
    cursors = ctx.table("cursor_deleted").withColumnRenamed("ledger", "c_ledger")
    by_cursor = ins.join(
        cursors,
        (F.col("ledger") == F.col("c_ledger"))
        & (
            here
            >= F.struct(
                F.col("first_ledger").alias("ledger_id"), F.col("first_entry").alias("entry_id")
            )
        )
        & (
            here
            <= F.struct(
                F.col("last_ledger").alias("ledger_id"), F.col("last_entry").alias("entry_id")
            )
        ),
        "left_semi",
    )
    by_cursor = by_cursor.join(
        in_flight, ["ledger", "ledger_id", "entry_id", "batch_index"], "left_anti"
    ).select(
        "ledger",
        "ledger_id",
        "entry_id",
        "batch_index",
        F.lit(None).cast("long").alias("ack_most"),
        F.lit(None).cast("long").alias("ack_least"),
    )
    evidence = (
        by_ack.unionByName(by_cursor)
        .groupBy("ledger", "ledger_id", "entry_id", "batch_index")
        .agg(
            F.min(F.when(F.col("ack_most").isNotNull(), F.struct("ack_most", "ack_least"))).alias(
                "t"
            )
        )
    )
    return ins.join(evidence, ["ledger", "ledger_id", "entry_id", "batch_index"], "inner").select(
        "topic",
        "partition",
        "ledger",
        "ledger_id",
        "entry_id",
        "batch_index",
        "publish_time",
        F.coalesce(F.col("key"), F.lit("")).alias("id"),
        F.col("t.ack_most").alias("ack_most"),
        F.col("t.ack_least").alias("ack_least"),
        F.when(F.col("t").isNotNull(), F.lit("ack")).otherwise(F.lit("cursor")).alias("via"),
    )


def _ctp_violations(lineage: DataFrame, unnamed: DataFrame, prop: str) -> DataFrame:
    """Duplicate, lost and untraceable outputs from the per (output topic, input id) table."""
    empty = F.array().cast(ArrayType(POSITION_TYPE))
    ins = F.coalesce(F.transform("in_ps", lambda x: x["p"]), empty)
    outs = F.coalesce(F.transform("out_ps", lambda x: x["p"]), empty)
    last = F.element_at("out_ps", -1)
    dup = lineage.filter((F.col("expected") > 0) & (F.col("actual") > F.col("expected"))).select(
        "*",
        last["most"].alias("txnid_most_bits"),
        last["least"].alias("txnid_least_bits"),
    )
    duplicate = _violations(
        dup,
        "duplicate_output",
        "safety",
        F.concat(outs, ins),
        F.format_string(
            "input %s appears %d times in the committed output of %s (expected %d)",
            F.col("id"),
            F.col("actual"),
            F.col("topic"),
            F.col("expected"),
        ),
        log=F.col("topic"),
    )
    lost_rows = lineage.filter(F.col("expected") > F.col("actual")).select(
        "*",
        F.col("acker.ack_most").alias("txnid_most_bits"),
        F.col("acker.ack_least").alias("txnid_least_bits"),
    )
    lost = _violations(
        lost_rows,
        "lost_input",
        "safety",
        F.concat(ins, outs),
        F.format_string(
            "input %s was consumed and committed %d time(s) but appears %d time(s) in the"
            " committed output of %s",
            F.col("id"),
            F.col("expected"),
            F.col("actual"),
            F.col("topic"),
        ),
        log=F.col("topic"),
    )
    stray = (
        lineage.filter(F.col("expected") == 0)
        .select("topic", "id", F.explode("out_ps").alias("o"))
        .select(
            "topic",
            "id",
            F.col("o.most").alias("txnid_most_bits"),
            F.col("o.least").alias("txnid_least_bits"),
            F.col("o.p").alias("p"),
        )
    )
    untraceable = _violations(
        stray,
        "untraceable_output",
        "safety",
        F.array(F.col("p")),
        F.format_string(
            "output in %s names input %s, which no committed transaction consumed from the"
            " input topics",
            F.col("topic"),
            F.col("id"),
        ),
        log=F.col("topic"),
    )
    no_source = _violations(
        unnamed,
        "untraceable_output",
        "safety",
        F.array(_msg_position("output")),
        F.format_string(
            "output in %s has no %s property: it cannot be traced to an input",
            F.col("topic"),
            F.lit(prop),
        ),
        log=F.col("topic"),
    )
    return duplicate.unionByName(lost).unionByName(untraceable).unionByName(no_source)


#: The checks a default audit runs, in order.
CHECKS: list[Check] = [
    CorruptRecords(),
    StateMachine(),
    PendingAckOutcomes(),
    PendingAckOrder(),
    DoubleAck(),
    TopicMarkers(),
    AbortedVisible(),
    ExactlyOnce(),
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
    """Return the batch-size bucket of ``size`` records: ``1``, ``2-9``, ``10-49`` ... ``1000+``."""
    if size <= 1:
        return "1"
    lo = max(b for b in _SIZE_BUCKETS if b <= size)
    higher = [b for b in _SIZE_BUCKETS if b > size]
    first = max(lo, 2)
    return f"{first}-{higher[0] - 1}" if higher else f"{first}+"


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
        cap = (
            ctx.options.max_records
            if ctx.options.max_records is not None
            else BatchedWriteConfig().max_records
        )
        histogram: dict[str, int] = {}
        triggers = {"max_records": 0, "max_delay_or_max_size": 0, "unbatched": 0}
        for s in sizes:
            if s["log"] != name:
                continue
            label = _bucket_label(int(s["records"]))
            histogram[label] = histogram.get(label, 0) + int(s["count"])
            if not s["batched"]:
                triggers["unbatched"] += int(s["count"])
            elif s["records"] >= cap:
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


#: A file in every audit output directory: a later audit may replace the directory.
AUDIT_MARKER = ".txnstream-audit"


#: Characters Hadoop's paths glob (``*?[]{}\\``) or parse (``:``) in an audit output path.
_UNSAFE_PATH_CHARS = "*?[]{}\\:"


def check_output_dir(out: Path, data_dir: Path) -> None:
    """Refuse an output directory whose replacement would delete what it must not.

    The audit replaces ``out`` whole: it must not be, hold or lie inside the
    data directory, and an existing one must be empty or an earlier audit's
    output (its marker, or the report an audit writes); otherwise an
    :class:`InvalidArgumentError` naming it. Its absolute path must not
    hold a character Spark's file paths glob or parse (:data:`_UNSAFE_PATH_CHARS`:
    Hadoop reads ``[1]`` as a pattern and ``:`` as a URI scheme's end).
    """
    o, d = out.resolve(), data_dir.resolve()
    unsafe = sorted(set(str(o)) & set(_UNSAFE_PATH_CHARS))
    if unsafe:
        raise InvalidArgumentError(
            f"audit output {str(o)!r} holds {''.join(unsafe)!r}, which Spark's file paths"
            " read as a glob pattern or URI; choose another output directory (--out)",
            argument="out_dir",
            value=str(out),
        )
    if o == d or d in o.parents or o in d.parents:
        raise InvalidArgumentError(
            f"audit output {str(out)!r} must neither be, hold nor lie inside the data "
            f"directory {str(data_dir)!r} (the output is replaced whole)",
            argument="out_dir",
            value=str(out),
        )
    if o.exists():
        if not o.is_dir():
            raise InvalidArgumentError(
                f"audit output {str(out)!r} exists and is not a directory",
                argument="out_dir",
                value=str(out),
            )
        earlier = (o / AUDIT_MARKER).exists() or (o / "summary.json").exists()
        if not earlier and any(o.iterdir()):
            raise InvalidArgumentError(
                f"audit output {str(out)!r} is a directory an audit did not write, and not "
                "empty: it would be replaced whole; give a new or empty directory",
                argument="out_dir",
                value=str(out),
            )


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
    partitions = topic_partitions(names)
    opts = _checked_topics(opts, partitions)
    check_output_dir(out, Path(data_dir))
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / AUDIT_MARKER).write_text("written by txnstream audit; replaced by the next one\n")
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
    if partitions:
        # After the coordinator logs: a transaction decided there has its
        # markers here, even while a broker keeps writing.
        step(f"reading {len(partitions)} topic partition(s)")
        _load_topics(ctx, partitions, pending_logs)

    step("reconstructing transactions")
    ctx.tables["transactions"] = _save(final_states(txn_records), out, "transactions")
    latest = txn_records.agg(
        F.max(F.greatest("last_modification_time", "start_time")).alias("t")
    ).collect()[0]["t"]
    # Now, unless given: a closed directory audited later still shows the
    # transactions left open past their timeout as stuck (the latest time in
    # the logs would hide those whose timeout ends after the last record).
    ctx.reference_time_ms = (
        opts.now_ms if opts.now_ms is not None else max(latest or 0, int(time.time() * 1000))
    )

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
        "exactly_once": _exactly_once_summary(ctx, ran),
        "topics": _topic_counts(ctx, partitions),
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
        "tables": {name: name + "/" for name in sorted(_tables_written(out))},
    }
    step("writing the report")
    summary["seconds"] = round(time.monotonic() - started, 3)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    report = write_report(out / "report.html", summary, _rows(violations, 500), _rows(stuck, 200))
    return AuditResult(out, summary, report)


def _checked_topics(opts: AuditOptions, partitions: Sequence[str]) -> AuditOptions:
    """Options with input/output topics as full names; a name the directory lacks is an error."""
    stored = {TopicName.parse(p).base.full for p in partitions}

    def full(option: str, names: tuple[str, ...]) -> tuple[str, ...]:
        out = []
        for name in names:
            try:
                tn = TopicName.parse(name).base
            except InvalidTopicNameError as e:
                raise InvalidArgumentError(
                    f"{option}: bad topic name {name!r} ({e})", argument=option, value=name
                ) from None
            if tn.full not in stored:
                raise InvalidArgumentError(
                    f"{option}: topic {name!r} is not stored in the directory"
                    f" (topics: {sorted(stored)[:20]})",
                    argument=option,
                    value=name,
                )
            out.append(tn.full)
        return tuple(dict.fromkeys(out))

    inputs = full("input_topics", opts.input_topics)
    outputs = full("output_topics", opts.output_topics)
    if set(inputs) & set(outputs):
        raise InvalidArgumentError(
            f"a topic cannot be both input and output: {sorted(set(inputs) & set(outputs))}",
            argument="input_topics",
            value=inputs,
        )
    if not opts.source_property:
        raise InvalidArgumentError(
            "source_property must not be empty", argument="source_property", value=""
        )
    return replace(opts, input_topics=inputs, output_topics=outputs)


def _load_topics(ctx: AuditContext, partitions: Sequence[str], pending_logs: Sequence[str]) -> None:
    """Read the topic tables of ``ctx`` (see the topics section)."""
    spark, data, out = ctx.spark, ctx.data_dir, ctx.out_dir
    owners = pending_ack_owners(pending_logs, partitions, pending_ack_owner_map(data))
    ctx.tables["pending_ack_logs"] = _save(
        spark.createDataFrame(owners, "log string, ledger string, subscription string"),
        out,
        "pending_ack_logs",
    )
    # The cursors before the topic tables: an input they show consumed was
    # published before, so it is in the topic tables; one consumed by a
    # transaction committing after this read is not taken for consumed while
    # its outputs are after the topic read.
    ctx.tables["cursor_deleted"] = _save(
        spark.createDataFrame(_cursor_ranges(data, owners), _CURSOR_SCHEMA), out, "cursor_deleted"
    )
    ctx.tables["topic_markers"] = _load_topic(spark, data, out, "topic_markers", mode="markers")
    ctx.tables["topic_messages"] = _load_topic(
        spark, data, out, "topic_messages", isolation="read_uncommitted"
    )
    ctx.tables["topic_committed"] = _load_topic(
        spark, data, out, "topic_committed", isolation="read_committed"
    )


def _exactly_once_summary(ctx: AuditContext, ran: Sequence[dict[str, str]]) -> dict[str, Any]:
    found = ctx.results.get("exactly_once")
    if found is not None:
        return dict(found)
    if "topic_messages" not in ctx.tables:
        return _not_checked("no topic partition in the directory: no output to trace")
    why = next((c.get("reason", "") for c in ran if c["name"] == ExactlyOnce.name), None)
    return _not_checked(f"the exactly-once check did not run ({why or 'not selected'})")


def _topic_counts(ctx: AuditContext, partitions: Sequence[str]) -> dict[str, Any]:
    """Per topic: partitions, messages stored, READ_COMMITTED-visible, in transactions, markers."""
    by_topic: dict[str, dict[str, Any]] = {}
    for p in partitions:
        t = by_topic.setdefault(
            TopicName.parse(p).base.full,
            {
                "partitions": 0,
                "messages": 0,
                "visible": 0,
                "transactional": 0,
                "commit_markers": 0,
                "abort_markers": 0,
            },
        )
        t["partitions"] += 1
    if "topic_messages" in ctx.tables:
        for r in (
            ctx.table("topic_messages")
            .groupBy("topic")
            .agg(
                F.count(F.lit(1)).alias("messages"),
                F.count("txnid_most_bits").alias("transactional"),
            )
            .collect()
        ):
            if r["topic"] in by_topic:
                by_topic[r["topic"]].update(
                    messages=int(r["messages"]), transactional=int(r["transactional"])
                )
        for r in ctx.table("topic_committed").groupBy("topic").count().collect():
            if r["topic"] in by_topic:
                by_topic[r["topic"]]["visible"] = int(r["count"])
        for r in ctx.table("topic_markers").groupBy("topic", "marker").count().collect():
            key = {"COMMIT": "commit_markers", "ABORT": "abort_markers"}.get(r["marker"])
            if key and r["topic"] in by_topic:
                by_topic[r["topic"]][key] = int(r["count"])
    return {
        "partitions": len(partitions),
        "topics": len(by_topic),
        "messages": sum(t["messages"] for t in by_topic.values()),
        "visible": sum(t["visible"] for t in by_topic.values()),
        "by_topic": by_topic,
    }


def _tables_written(out: Path) -> list[str]:
    return [p.name for p in out.iterdir() if p.is_dir()]


def _rows(df: DataFrame, limit: int | None) -> list[dict[str, Any]]:
    if limit is not None:
        df = df.limit(limit)
    return [r.asDict(recursive=True) for r in df.collect()]


def violation_rows(result: AuditResult, spark: SparkSession) -> list[dict[str, Any]]:
    """Return every violation of ``result`` as plain dicts (reads its Parquet table)."""
    return _rows(spark.read.parquet(str(result.out_dir / "violations")), None)
