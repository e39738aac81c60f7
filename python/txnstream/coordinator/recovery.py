"""Recovery of a coordinator's log, folded in Rust (SPEC §4.3).

``_native.fold_txn_log`` reads the log from the coordinator's cursor and
folds every record into the live transactions in one call with the GIL
released (rules in ``rust/core/src/txnlog_fold.rs``, the same as the
Python reference :func:`txnstream.coordinator.replay.fold`). What
comes back is columnar: one numpy array per field, names as shared ``str``
objects, and the log positions of all live transactions in ONE flat table
(:class:`PositionTable`, a slice per transaction) instead of a
``TxnPosition`` object per record. Ending a recovered transaction deletes
its slice through the cursor's bulk ``delete_records``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from txnstream._native import TxnPosition


@dataclass(frozen=True)
class PositionColumns:
    """Record positions as columns.

    Record ``i`` is entry ``(ledger_id[i], entry_id[i])``, index
    ``batch_index[i]`` of ``batch_size[i]``.
    """

    ledger_id: npt.NDArray[np.uint64]
    entry_id: npt.NDArray[np.uint64]
    batch_size: npt.NDArray[np.uint32]
    batch_index: npt.NDArray[np.uint32]

    def __len__(self) -> int:
        """Return the number of records."""
        return len(self.ledger_id)

    def slice(self, start: int, end: int) -> PositionColumns:
        """Rows ``start..end`` (views, no copy)."""
        return PositionColumns(
            self.ledger_id[start:end],
            self.entry_id[start:end],
            self.batch_size[start:end],
            self.batch_index[start:end],
        )

    def to_positions(self) -> list[TxnPosition]:
        """One :class:`TxnPosition` per record (for tools and tests)."""
        return list(
            map(
                TxnPosition,
                self.ledger_id.tolist(),
                self.entry_id.tolist(),
                self.batch_size.tolist(),
                self.batch_index.tolist(),
            )
        )

    @classmethod
    def from_positions(cls, positions: list[TxnPosition]) -> PositionColumns:
        """Columns of ``positions``."""
        return cls(
            np.array([p.ledger_id for p in positions], np.uint64),
            np.array([p.entry_id for p in positions], np.uint64),
            np.array([p.batch_size for p in positions], np.uint32),
            np.array([p.batch_index for p in positions], np.uint32),
        )


class PositionTable:
    """The log positions of many transactions in one flat table.

    Span ``i`` (one transaction) is rows ``offsets[i]:offsets[i + 1]`` of
    :attr:`columns`.
    """

    __slots__ = ("columns", "live", "offsets")

    def __init__(self, offsets: list[int], columns: PositionColumns) -> None:
        self.offsets = offsets
        self.columns = columns
        #: Spans not yet released; the table is dropped when none is left.
        self.live = len(offsets) - 1

    def count(self, i: int) -> int:
        """Return how many records span ``i`` holds."""
        return self.offsets[i + 1] - self.offsets[i]

    def span(self, i: int) -> PositionColumns:
        """Return the positions of span ``i`` (views)."""
        return self.columns.slice(self.offsets[i], self.offsets[i + 1])


@dataclass(frozen=True)
class FoldResult:
    """Live transactions of a folded log (sorted by sequence), columnar."""

    seq: list[int]
    status: list[int]
    timeout_ms: list[int]
    start_time: list[int]
    last_modified: list[int]
    timed_out: list[bool]
    client_name: list[str | None]
    partitions: list[list[str] | None]
    subscriptions: list[list[tuple[str, str]] | None]
    positions: PositionTable
    purge: PositionColumns
    max_seq: int
    records: int
    live_records: int
    foreign_records: int

    def __len__(self) -> int:
        """Return the number of live transactions."""
        return len(self.seq)

    @classmethod
    def from_native(cls, d: dict[str, Any]) -> FoldResult:
        """Wrap the dict returned by ``_native.fold_txn_log``/``fold_txn_entries``."""
        return cls(
            seq=d["seq"].tolist(),
            status=d["status"].tolist(),
            timeout_ms=d["timeout_ms"].tolist(),
            start_time=d["start_time"].tolist(),
            last_modified=d["last_modified"].tolist(),
            timed_out=d["timed_out"].tolist(),
            client_name=d["client_name"],
            partitions=d["partitions"],
            subscriptions=d["subscriptions"],
            positions=PositionTable(
                d["pos_offsets"].tolist(),
                PositionColumns(d["ledger_id"], d["entry_id"], d["batch_size"], d["batch_index"]),
            ),
            purge=PositionColumns(
                d["purge_ledger_id"],
                d["purge_entry_id"],
                d["purge_batch_size"],
                d["purge_batch_index"],
            ),
            max_seq=int(d["max_seq"]),
            records=int(d["records"]),
            live_records=int(d["live_records"]),
            foreign_records=int(d["foreign_records"]),
        )


__all__ = ["FoldResult", "PositionColumns", "PositionTable"]
