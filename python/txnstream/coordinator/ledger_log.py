"""The coordinator's log on a managed ledger, written through a BufferedWriter.

One managed ledger per coordinator (``__transaction_log_<tc_id>``) with one
durable cursor. Records go through a PIP-160 ``BufferedWriter``: many share
an entry and a sync. A finished transaction's records are deleted on the
cursor by position + batch index (an AckSet per partially deleted entry), so
mark-delete advances and old ledgers are trimmed once every record in them
ended. Recovery reads and folds the log from the cursor in Rust
(:meth:`LedgerTransactionLog.fold`), skipping batch indexes already deleted.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from prometheus_client.registry import REGISTRY, CollectorRegistry

from txnstream._native import (
    BufferedWriter,
    CompactedTopic,
    ManagedLedger,
    TxnPosition,
    fold_txn_log,
)
from txnstream.config import BatchedWriteConfig
from txnstream.coordinator.recovery import FoldResult, PositionColumns
from txnstream.metrics import register_writer, unregister_writer

CURSOR = "transaction-coordinator"


class LedgerTransactionLog:
    """:class:`~.log.TransactionLog` over a managed ledger + BufferedWriter."""

    def __init__(
        self,
        ml: ManagedLedger,
        writer: BufferedWriter,
        *,
        name: str | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.ml = ml
        self.writer = writer
        self.cursor = ml.open_cursor(CURSOR)
        self._closed = False
        #: ``writer`` label of the exported writer metrics (None: not exported).
        self.metrics_name = name if registry is not None else None
        self._registry = registry
        if registry is not None and name is not None:
            register_writer(writer, "transaction_log", name=name, registry=registry)

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        name: str,
        *,
        batched_write: BatchedWriteConfig | None = None,
        registry: CollectorRegistry | None = REGISTRY,
        **ledger_options: Any,
    ) -> LedgerTransactionLog:
        """Open (creating) the log ``name`` under ``directory``.

        ``batched_write`` sets the BufferedWriter's thresholds (default
        :class:`~txnstream.config.BatchedWriteConfig`: batching off, as in
        Pulsar). Its BufferedWriter's metrics are exported to ``registry`` (SPEC
        §4.2, label ``writer=name``; None: not exported) until :meth:`close`.
        """
        ml = ManagedLedger.open(os.fspath(directory), name, **ledger_options)
        try:
            writer = BufferedWriter(ml, **(batched_write or BatchedWriteConfig()).writer_kwargs())
            return cls(ml, writer, name=name, registry=registry)
        except BaseException:
            ml.close()
            raise

    def write(self, record: bytes) -> Future[TxnPosition]:
        """Append ``record``; the future completes once it is durable."""
        return self.writer.write(record)

    def write_sync(self, record: bytes) -> TxnPosition:
        """Append ``record`` and wait (GIL released, no Python future) until durable."""
        return self.writer.write_blocking(record)

    def write_many_sync(self, records: Sequence[bytes]) -> list[TxnPosition]:
        """Append ``records`` contiguously and wait until they are durable.

        The batch is written at once (a forced flush) instead of after
        ``max_delay``: a bulk call already IS the batch its callers queued
        (see :mod:`.aio`), and they all wait for it, so the delay would only
        add latency. Durability is unchanged.
        """
        fut = self.writer.write_many(records)
        self.writer.flush()
        return fut.result()

    def delete(self, positions: Sequence[TxnPosition]) -> None:
        """Delete records by position and batch index (persisted asynchronously)."""
        if positions:
            self.cursor.delete(list(positions))

    def delete_columns(self, records: PositionColumns) -> None:
        """Bulk delete (numpy columns; no object per record)."""
        if len(records):
            self.cursor.delete_records(
                records.ledger_id, records.entry_id, records.batch_size, records.batch_index
            )

    def fold(self, tc_id: int) -> FoldResult:
        """Read and fold the whole log from the cursor in Rust (GIL released)."""
        return FoldResult.from_native(fold_txn_log(self.ml, CURSOR, tc_id))

    def set_batch_enabled(self, enabled: bool) -> None:
        """Switch batching on/off for the next record."""
        self.writer.set_batch_enabled(enabled)

    def stats(self) -> dict[str, Any]:
        """Writer statistics (``entries``: entries it wrote) plus ``ledger_entries``.

        ``ledger_entries`` is what the ledger holds now (trimmed ledgers gone).
        """
        out: dict[str, Any] = dict(self.writer.stats())
        out["ledger_entries"] = self.ml.entry_count()
        return out

    def flush(self) -> None:
        """Persist the cursor's deletions now."""
        self.cursor.flush()

    def close(self) -> None:
        """Close the writer (pending records fail), persist the cursor, close the ledger."""
        if self._closed:
            return
        self._closed = True
        if self._registry is not None and self.metrics_name is not None:
            unregister_writer(self.metrics_name, "transaction_log", self._registry, self.writer)
        try:
            self.writer.close()
        finally:
            try:
                self.cursor.flush()
            finally:
                self.ml.close()


def open_terminated_topic(directory: str | os.PathLike[str], name: str) -> CompactedTopic:
    """Open the compacted topic holding the PIP-255 terminated-transaction state."""
    return CompactedTopic.open(os.fspath(directory), name)


__all__ = ["CURSOR", "LedgerTransactionLog", "open_terminated_topic"]
