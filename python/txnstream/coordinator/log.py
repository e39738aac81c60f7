"""The coordinator's transaction log: where every state change becomes durable.

:class:`TransactionLog` is what the coordinator needs from its log: durable
writes (through a PIP-160 ``BufferedWriter``, so many records share an entry
and a sync), deletion of a finished transaction's records by position and
batch index, and recovery: :meth:`TransactionLog.fold` (in Rust).

:class:`InMemoryTransactionLog` keeps the same records (same framing and
codec) in memory: for tests of the state machine and for tools; it is not
durable; its :meth:`InMemoryTransactionLog.replay` feeds the Python
reference fold (:mod:`.replay`) in tests. The managed-ledger
implementation lives in :mod:`.ledger_log`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from typing import Any, Protocol

import numpy as np

from txnstream import frame
from txnstream._native import TxnPosition, fold_txn_entries
from txnstream.coordinator.recovery import FoldResult, PositionColumns
from txnstream.coordinator.replay import LogChunk
from txnstream.errors import WriterClosedError


class TransactionLog(Protocol):
    """Storage of one coordinator's ``TransactionMetadataEntry`` records."""

    def write(self, record: bytes) -> Future[TxnPosition]:
        """Append ``record``; the future completes once it is durable."""

    def write_sync(self, record: bytes) -> TxnPosition:
        """Append ``record`` and wait until it is durable."""

    def write_many_sync(self, records: Sequence[bytes]) -> list[TxnPosition]:
        """Append ``records`` (contiguous, in order) and wait until all are durable."""

    def delete(self, positions: Sequence[TxnPosition]) -> None:
        """Delete records (one batch index each); whole entries free up."""

    def delete_columns(self, records: PositionColumns) -> None:
        """Bulk :meth:`delete` of records given as columns."""

    def fold(self, tc_id: int) -> FoldResult:
        """Fold the whole log into coordinator ``tc_id``'s live transactions (Rust)."""

    def set_batch_enabled(self, enabled: bool) -> None:
        """Switch batching of records into shared entries on or off."""

    def stats(self) -> dict[str, Any]:
        """Counters of the log and its writer."""

    def close(self) -> None:
        """Flush nothing new, fail pending writes, release files."""


class InMemoryTransactionLog:
    """A :class:`TransactionLog` held in memory (not durable).

    Each record becomes its own entry unless written with
    :meth:`write_many`, which frames them as one batched entry, so replay
    sees the same mix of batched and unbatched entries as a real log.
    """

    def __init__(self) -> None:
        self._entries: list[bytes | None] = []
        self._deleted: dict[int, set[int]] = {}
        self._sizes: list[int] = []
        self._lock = threading.Lock()
        self._closed = False
        self.batch_enabled = True

    def reopen(self) -> InMemoryTransactionLog:
        """Return a new log over the same records (simulates a restart)."""
        other = InMemoryTransactionLog()
        other._entries = self._entries
        other._deleted = self._deleted
        other._sizes = self._sizes
        return other

    def _done(self, pos: TxnPosition) -> Future[TxnPosition]:
        fut: Future[TxnPosition] = Future()
        fut.set_result(pos)
        return fut

    def write(self, record: bytes) -> Future[TxnPosition]:
        """Store ``record`` as its own entry."""
        with self._lock:
            if self._closed:
                raise WriterClosedError("in-memory transaction log is closed")
            self._entries.append(record)
            self._sizes.append(1)
            return self._done(TxnPosition(0, len(self._entries) - 1, 1, 0))

    def write_sync(self, record: bytes) -> TxnPosition:
        """Store ``record`` as its own entry and return its position."""
        return self.write(record).result()

    def write_many(self, records: Sequence[bytes]) -> list[Future[TxnPosition]]:
        """Store ``records`` as one batched entry."""
        with self._lock:
            if self._closed:
                raise WriterClosedError("in-memory transaction log is closed")
            self._entries.append(frame.encode_batch(list(records)))
            self._sizes.append(len(records))
            eid = len(self._entries) - 1
            n = len(records)
            return [self._done(TxnPosition(0, eid, n, i)) for i in range(n)]

    def write_many_sync(self, records: Sequence[bytes]) -> list[TxnPosition]:
        """Store ``records`` as one batched entry and return their positions."""
        return [f.result() for f in self.write_many(records)]

    def delete(self, positions: Sequence[TxnPosition]) -> None:
        """Delete records; an entry whose records are all deleted is dropped."""
        with self._lock:
            for p in positions:
                eid = p.entry_id
                if eid >= len(self._entries) or self._entries[eid] is None:
                    continue
                gone = self._deleted.setdefault(eid, set())
                gone.add(p.batch_index)
                if len(gone) >= self._sizes[eid]:
                    self._entries[eid] = None
                    del self._deleted[eid]

    def delete_columns(self, records: PositionColumns) -> None:
        """Delete records given as columns."""
        self.delete(records.to_positions())

    def fold(self, tc_id: int) -> FoldResult:
        """Fold the live entries in Rust (as the ledger log does)."""
        with self._lock:
            live = [(i, e) for i, e in enumerate(self._entries) if e is not None]
            deleted = [sorted(self._deleted.get(i, ())) for i, _ in live]
        return FoldResult.from_native(
            fold_txn_entries(
                [e for _, e in live],
                [0] * len(live),
                [i for i, _ in live],
                deleted,
                tc_id,
            )
        )

    def live_entries(self) -> int:
        """Return how many entries still hold a live record."""
        with self._lock:
            return sum(e is not None for e in self._entries)

    def replay(self) -> Iterator[LogChunk]:
        """Yield the live entries as one chunk."""
        with self._lock:
            live = [(i, e) for i, e in enumerate(self._entries) if e is not None]
            deleted = {k: set(v) for k, v in self._deleted.items()}
        if not live:
            return
        cols = frame.decode_txn_log_columns([e for _, e in live])
        ent = cols["entry_index"]
        bidx = cols["batch_index"]
        ids = [i for i, _ in live]
        mask = np.array(
            [
                b in deleted.get(ids[e], ())
                for e, b in zip(ent.tolist(), bidx.tolist(), strict=True)
            ],
            dtype=np.bool_,
        )
        yield LogChunk(
            cols,
            np.zeros(len(ids), np.uint64),
            np.array(ids, dtype=np.uint64),
            mask,
        )

    def set_batch_enabled(self, enabled: bool) -> None:
        """Record the switch (the in-memory log never delays records)."""
        self.batch_enabled = enabled

    def stats(self) -> dict[str, Any]:
        """Return entry counts."""
        return {"entries": len(self._entries), "live_entries": self.live_entries()}

    def close(self) -> None:
        """Reject further writes."""
        with self._lock:
            self._closed = True


__all__ = ["InMemoryTransactionLog", "TransactionLog"]
