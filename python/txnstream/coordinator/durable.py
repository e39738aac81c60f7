"""Durable writes of a coordinator's records, and where their positions go.

Every state change is answered only once its record is durable (SPEC §4.3).
:class:`DurableWriter` writes one record (the writer's batching applies) or
many at once (one forced batch: a bulk call already is the batch), counts
failed appends, and attaches each durable record's position to its
transaction so the end can delete it. A record that became durable after
its transaction ended (an ADD racing the end) is deleted at once instead.
"""

from __future__ import annotations

from collections.abc import Iterable

from txnstream._native import TxnPosition
from txnstream.coordinator.counters import CoordinatorCounters
from txnstream.coordinator.log import TransactionLog
from txnstream.coordinator.metadata import TxnMeta
from txnstream.coordinator.table import TransactionTable


class DurableWriter:
    """Writes to the transaction log and waits; never holds the table lock while waiting."""

    def __init__(
        self, log: TransactionLog, table: TransactionTable, counters: CoordinatorCounters
    ) -> None:
        self.log = log
        self._table = table
        self._counts = counters.counts

    def write(self, record: bytes) -> TxnPosition:
        """Append ``record`` and return its position once durable."""
        try:
            return self.log.write_sync(record)
        except Exception:
            self._failed()
            raise

    def write_many(self, records: list[bytes]) -> list[TxnPosition]:
        """Append ``records`` as one batch and return their positions once durable."""
        try:
            return self.log.write_many_sync(records)
        except Exception:
            self._failed()
            raise

    def _failed(self) -> None:
        with self._table.lock:
            self._counts["append_errors"] += 1

    def attach_one(self, meta: TxnMeta, pos: TxnPosition) -> None:
        """:meth:`attach` for one record (the single calls' hot path)."""
        with self._table.lock:
            if not meta.status.is_final:
                meta.positions.append(pos)
                return
        self.log.delete([pos])  # ended while in flight: delete now

    def attach(self, written: Iterable[tuple[TxnMeta, TxnPosition]]) -> None:
        """Record each position with its transaction; delete those that already ended."""
        late: list[TxnPosition] = []
        with self._table.lock:
            for meta, pos in written:
                if meta.status.is_final:
                    late.append(pos)  # ended while in flight: delete now
                else:
                    meta.positions.append(pos)
        if late:
            self.log.delete(late)


__all__ = ["DurableWriter"]
