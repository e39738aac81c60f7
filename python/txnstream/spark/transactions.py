"""Every transaction's final state, reconstructed from coordinator-log records.

Input: the rows of data source ``txnstream-log`` over the coordinator logs
(deleted records included: an ended transaction's records stay readable until
their ledger is trimmed). Output: one row per transaction, and the records
whose status changes break the state machine.

The rules are those of the coordinator's recovery fold
(``rust/core/src/txnlog_fold.rs``), applied to everything still stored:
records count in log order (ledger, entry, batch index); the status starts
OPEN at the NEW record and follows each UPDATE's ``new_status``; allowed
changes are OPEN -> COMMITTING | ABORTING | COMMITTED | ABORTED (a deciding
record may have been trimmed), COMMITTING -> COMMITTED, ABORTING ->
ABORTED, and the same status again. Timeout, start time and client name come
from the NEW record; partitions and subscriptions are the union of the ADD
records. A transaction whose NEW record is gone (trimmed) still gets its
status from its UPDATEs; without UPDATE and NEW its status is unknown (null).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

__all__ = [
    "ALLOWED_TRANSITIONS",
    "ENDED",
    "TXN_KEY",
    "final_states",
    "invalid_transitions",
    "position",
]

#: A transaction's identity: its id (``most_bits`` is the coordinator).
TXN_KEY = ["txnid_most_bits", "txnid_least_bits"]

#: Final statuses.
ENDED = ("COMMITTED", "ABORTED")

#: (from, to) pairs an UPDATE may make, besides repeating the current status.
ALLOWED_TRANSITIONS = (
    ("OPEN", "COMMITTING"),
    ("OPEN", "ABORTING"),
    ("OPEN", "COMMITTED"),
    ("OPEN", "ABORTED"),
    ("COMMITTING", "COMMITTED"),
    ("ABORTING", "ABORTED"),
)

_ORDER = ["ledger_id", "entry_id", "batch_index"]


def position(role: str | Column | None = None) -> Column:
    """Return a record's position as a struct (``log``, ledger, entry, batch index, ``role``)."""
    role_col = F.lit(role) if role is None or isinstance(role, str) else role
    return F.struct(
        F.col("log"),
        F.col("ledger_id"),
        F.col("entry_id"),
        F.col("batch_index"),
        role_col.cast("string").alias("role"),
    )


def _allowed(prev: Column, new: Column) -> Column:
    ok = prev == new
    for a, b in ALLOWED_TRANSITIONS:
        ok = ok | ((prev == a) & (new == b))
    return ok


def _updates(records: DataFrame) -> DataFrame:
    """UPDATE records with their previous status in log order (``prev``)."""
    good = records.filter(F.col("error").isNull() | F.col("metadata_op").isNotNull())
    has_new = (
        good.filter(F.col("metadata_op") == "NEW")
        .groupBy(*TXN_KEY)
        .agg(F.min(F.struct(*_ORDER)).alias("new_at"))
    )
    w = Window.partitionBy(*TXN_KEY).orderBy(*_ORDER)
    upd = good.filter((F.col("metadata_op") == "UPDATE") & F.col("new_status").isNotNull())
    upd = upd.join(has_new, TXN_KEY, "left").withColumn("seq", F.row_number().over(w))
    # Before the first UPDATE the status is OPEN if the NEW record precedes
    # it; unknown (no check) when the NEW record is gone.
    first_prev = F.when(
        F.col("new_at").isNotNull() & (F.col("new_at") < F.struct(*_ORDER)), F.lit("OPEN")
    )
    return upd.withColumn(
        "prev", F.coalesce(F.lag("new_status").over(w), F.when(F.col("seq") == 1, first_prev))
    )


def invalid_transitions(records: DataFrame) -> DataFrame:
    """UPDATE records that break the state machine (``prev`` -> ``new_status``)."""
    u = _updates(records)
    return u.filter(F.col("prev").isNotNull() & ~_allowed(F.col("prev"), F.col("new_status")))


def final_states(records: DataFrame) -> DataFrame:
    """One row per transaction in coordinator-log ``records``.

    Columns: the id, ``log``, ``logs`` (how many coordinator logs hold it: 1),
    ``status`` (final; null when unknown), ``timed_out``, ``client_name``,
    ``timeout_ms``, ``start_time``, ``decision_time`` (the COMMITTING/ABORTING
    record's modification time), ``end_time`` (the final record's),
    ``latency_ms`` (end - start for ended transactions), ``partitions``,
    ``subscriptions``, ``records``, ``deleted_records``, ``first_position``,
    ``final_position`` (the record that set the status).
    """
    good = records.filter(F.col("error").isNull() | F.col("metadata_op").isNotNull())
    stats = good.groupBy(*TXN_KEY).agg(
        F.min("log").alias("log"),
        F.countDistinct("log").alias("logs"),
        F.count(F.lit(1)).alias("records"),
        F.sum(F.col("deleted").cast("long")).alias("deleted_records"),
        F.min(position("first")).alias("first_position"),
    )
    new_w = Window.partitionBy(*TXN_KEY).orderBy(*_ORDER)
    news = (
        good.filter(F.col("metadata_op") == "NEW")
        .withColumn("k", F.row_number().over(new_w))
        .filter(F.col("k") == 1)
        .select(
            *TXN_KEY,
            F.lit(True).alias("has_new"),
            "client_name",
            "timeout_ms",
            "start_time",
        )
    )
    adds = good.groupBy(*TXN_KEY).agg(
        F.array_distinct(
            F.flatten(
                F.collect_list(F.when(F.col("metadata_op") == "ADD_PARTITION", F.col("partitions")))
            )
        ).alias("partitions"),
        F.array_distinct(
            F.flatten(
                F.collect_list(
                    F.when(F.col("metadata_op") == "ADD_SUBSCRIPTION", F.col("subscriptions"))
                )
            )
        ).alias("subscriptions"),
        F.max(F.coalesce(F.col("timed_out"), F.lit(False))).alias("timed_out"),
    )
    last_w = Window.partitionBy(*TXN_KEY).orderBy(*[F.col(c).desc() for c in _ORDER])
    upd = good.filter((F.col("metadata_op") == "UPDATE") & F.col("new_status").isNotNull())
    final = (
        upd.withColumn("k", F.row_number().over(last_w))
        .filter(F.col("k") == 1)
        .select(
            *TXN_KEY,
            F.col("new_status").alias("final_status"),
            F.col("last_modification_time").alias("final_time"),
            position(F.col("new_status")).alias("final_position"),
        )
    )
    decision = upd.groupBy(*TXN_KEY).agg(
        F.min(
            F.when(
                F.col("new_status").isin("COMMITTING", "ABORTING"),
                F.col("last_modification_time"),
            )
        ).alias("decision_time")
    )
    t = (
        stats.join(news, TXN_KEY, "left")
        .join(adds, TXN_KEY, "left")
        .join(final, TXN_KEY, "left")
        .join(decision, TXN_KEY, "left")
    )
    status = F.coalesce(F.col("final_status"), F.when(F.col("has_new"), F.lit("OPEN")))
    ended = status.isin(*ENDED)
    end_time = F.when(ended, F.col("final_time"))
    latency = F.when(
        ended & F.col("start_time").isNotNull() & (F.col("start_time") > 0),
        end_time - F.col("start_time"),
    )
    return t.select(
        *TXN_KEY,
        "log",
        "logs",
        status.alias("status"),
        "timed_out",
        "client_name",
        "timeout_ms",
        "start_time",
        "decision_time",
        end_time.alias("end_time"),
        latency.alias("latency_ms"),
        "partitions",
        "subscriptions",
        "records",
        "deleted_records",
        "first_position",
        "final_position",
    )
