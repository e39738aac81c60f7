"""Read-only views of a coordinator: transaction snapshots, stats, metrics.

Everything here copies state under the table lock and builds the answer
from the copy; nothing changes state or writes to the log.
"""

from __future__ import annotations

from typing import Any

from txnstream.coordinator.counters import CoordinatorCounters
from txnstream.coordinator.log import TransactionLog
from txnstream.coordinator.metadata import TransactionInfo
from txnstream.coordinator.status import TxnStatus
from txnstream.coordinator.table import TransactionTable
from txnstream.coordinator.terminated import TerminatedTxnStore
from txnstream.coordinator.timeouts import Clock, TimerService
from txnstream.coordinator.txn_id import TxnID
from txnstream.errors import TransactionNotFound


class TransactionQueries:
    """Snapshots of live (or remembered) transactions and the coordinator's counters."""

    def __init__(
        self,
        table: TransactionTable,
        store: TerminatedTxnStore,
        counters: CoordinatorCounters,
        timers: TimerService,
        log: TransactionLog,
        clock: Clock,
    ) -> None:
        self._table = table
        self._store = store
        self._counters = counters
        self._timers = timers
        self._log = log
        self._clock = clock

    def get(self, txn_id: TxnID) -> TransactionInfo:
        """Snapshot of one transaction, live or remembered by the store."""
        table = self._table
        seq = table.seq_of(txn_id)
        with table.lock:
            meta = table.txns.get(seq)
            if meta is not None:
                return meta.info(table.tc_id, table.span_records(meta))
        rec = self._store.lookup(txn_id)
        if rec is None:
            raise TransactionNotFound(f"transaction {txn_id} not found", txn_id=txn_id)
        return TransactionInfo(
            txn_id=txn_id,
            status=rec.status,
            timed_out=rec.timed_out,
            timeout_ms=0,
            start_time=0,
            last_modification_time=rec.end_time,
            client_name=rec.client_name,
            partitions=(),
            subscriptions=(),
        )

    def live(self, status: TxnStatus | None = None) -> list[TransactionInfo]:
        """Snapshots of every live transaction (optionally with ``status``), by id."""
        table = self._table
        with table.lock:
            return [
                m.info(table.tc_id, table.span_records(m))
                for m in table.txns.values()
                if status is None or m.status is status
            ]

    def slow(self, min_age_ms: int) -> list[TransactionInfo]:
        """Live transactions started at least ``min_age_ms`` ago (oldest first)."""
        table = self._table
        cutoff = self._clock() - min_age_ms
        with table.lock:
            slow = [
                m.info(table.tc_id, table.span_records(m))
                for m in table.txns.values()
                if m.start_time <= cutoff
            ]
        slow.sort(key=lambda i: (i.start_time, i.txn_id))
        return slow

    def _counts(self) -> tuple[dict[str, Any], int]:
        # Under the lock: a copy of the event counters, and how many live
        # transactions are ending (end decided, not finished).
        ending = sum(1 for m in self._table.txns.values() if m.status.is_ending)
        return dict(self._counters.counts), ending

    def stats(self) -> dict[str, Any]:
        """Counters: open/ending/committed/aborted/timed-out, LWM, log and store."""
        table = self._table
        with table.lock:
            out, ending = self._counts()
            out.update(
                tc_id=table.tc_id,
                live=len(table.txns),
                open=len(table.txns) - ending,
                ending=ending,
                next_seq=table.next_seq,
                timers=len(self._timers),
            )
        out["low_water_mark"] = table.low_water_mark()
        out["terminated_remembered"] = len(self._store)
        out["log"] = self._log.stats()
        return out

    def metrics(self) -> dict[str, Any]:
        """Scrape-time snapshot for :class:`txnstream.metrics.CoordinatorCollector`."""
        table = self._table
        with table.lock:
            out, ending = self._counts()
            out["active"] = len(table.txns)
            out["open"] = len(table.txns) - ending
            out["end_latency_ms"] = self._counters.histogram()
        return out


__all__ = ["TransactionQueries"]
