"""Rebuilding a coordinator's transaction table at open (SPEC §4.3 recovery).

Decoding and folding the whole log run in Rust (:meth:`TransactionLog.fold`,
columnar result in :mod:`.recovery`); here only one ``TxnMeta`` per live
transaction is built, OPEN ones get their timeouts re-armed in bulk (a
deadline already past fires at once), the positions of every recovered
record stay in one shared columnar table, records of ended transactions are
purged, and transactions caught in COMMITTING/ABORTING are handed to the
background to finish. The sequence continues after both the durable mark
and the log; the PIP-255 store is restored before anything can end.
"""

from __future__ import annotations

from typing import Any

from txnstream.coordinator.background import BackgroundEnds
from txnstream.coordinator.counters import CoordinatorCounters
from txnstream.coordinator.log import TransactionLog
from txnstream.coordinator.metadata import TxnMeta
from txnstream.coordinator.status import TxnStatus
from txnstream.coordinator.table import TransactionTable
from txnstream.coordinator.terminated import TerminatedTxnStore
from txnstream.coordinator.timeouts import Clock


def rebuild(
    table: TransactionTable,
    log: TransactionLog,
    store: TerminatedTxnStore,
    background: BackgroundEnds,
    counters: CoordinatorCounters,
    clock: Clock,
) -> dict[str, Any]:
    """Fill ``table`` from ``log``, arm timeouts, resume ends; return the recovery summary.

    Runs before any other thread touches the table. The summary is what
    ``TransactionCoordinator.recovery`` exposes (records, live/purged/foreign
    records, open and ending transactions, next sequence).
    """
    rec = log.fold(table.tc_id)
    table.start_sequence(rec.max_seq + 1)
    store.restore()
    if len(rec.purge):
        log.delete_columns(rec.purge)
    table.recovered = rec.positions if len(rec) else None
    resume: list[int] = []
    armed: list[TxnMeta] = []
    deadlines: list[int] = []
    now = clock()
    txns = table.txns
    statuses = list(TxnStatus)
    rows = zip(
        rec.seq,
        rec.status,
        rec.timeout_ms,
        rec.start_time,
        rec.last_modified,
        rec.timed_out,
        rec.client_name,
        rec.partitions,
        rec.subscriptions,
        strict=True,
    )
    for span, (seq, st, timeout, start, modified, late, client, parts, subs) in enumerate(rows):
        meta = TxnMeta(seq, timeout, start, client, statuses[st])
        meta.last_modified = modified
        meta.timed_out = late  # logged with the ending UPDATE (field 1000)
        meta.partitions = parts
        meta.subscriptions = subs
        meta.span = span
        txns[seq] = meta
        if st == 0:  # OPEN
            armed.append(meta)
            deadlines.append(max(start + timeout, now))
        else:
            resume.append(seq)
    background.arm_all(armed, deadlines)
    counters.counts["recovered"] = len(rec)
    summary = {
        "records": rec.records,
        "live_records": rec.live_records,
        "purged_records": len(rec.purge),
        "foreign_records": rec.foreign_records,
        "open": len(rec) - len(resume),
        "ending": len(resume),
        "next_seq": table.next_seq,
    }
    background.resume_all(resume)
    return summary


__all__ = ["rebuild"]
