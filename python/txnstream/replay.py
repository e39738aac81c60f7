"""Replay of logs written by a :class:`~txnstream.BufferedWriter`.

A transaction or pending-ack log may mix batched and unbatched entries
(batching can be switched at runtime), and records are deleted one batch
index at a time as transactions end. :func:`replay` returns every record
that is still live for a cursor, with its :class:`~txnstream.TxnPosition`,
as numpy columns read by the Rust core in one call (recovery of a
million-record log does not build a million Python objects unless asked).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, SupportsIndex

import numpy as np
import numpy.typing as npt

from txnstream._native import Cursor, ManagedLedger, Position, TxnPosition, replay_log
from txnstream.frame import record_index

__all__ = ["LiveRecords", "replay", "replay_chunks"]


@dataclass(frozen=True)
class LiveRecords:
    """Live records in log order, columnar.

    Record ``i`` is ``data[offsets[i]:offsets[i + 1]]`` at entry
    ``(ledger_id[i], entry_id[i])``, index ``batch_index[i]`` of
    ``batch_size[i]`` (1 for an unbatched entry). ``entries`` counts the
    entries read, ``skipped`` the records left out because their batch
    index was deleted.
    """

    ledger_id: npt.NDArray[np.uint64]
    entry_id: npt.NDArray[np.uint64]
    batch_size: npt.NDArray[np.uint32]
    batch_index: npt.NDArray[np.uint32]
    offsets: npt.NDArray[np.int64]
    data: bytes
    entries: int
    skipped: int

    @classmethod
    def _from_native(cls, d: dict[str, Any]) -> LiveRecords:
        return cls(
            ledger_id=d["ledger_id"],
            entry_id=d["entry_id"],
            batch_size=d["batch_size"],
            batch_index=d["batch_index"],
            offsets=d["offsets"],
            data=d["data"],
            entries=int(d["entries"]),
            skipped=int(d["skipped"]),
        )

    def __len__(self) -> int:
        """Return the number of live records."""
        return len(self.batch_index)

    def record(self, i: SupportsIndex) -> bytes:
        """Return the bytes of record ``i``; a negative ``i`` counts from the end.

        Raises :class:`IndexError` out of range, as :meth:`position` does.
        """
        k = record_index(i, len(self))
        return self.data[int(self.offsets[k]) : int(self.offsets[k + 1])]

    def position(self, i: int) -> TxnPosition:
        """Return the position of record ``i``."""
        return TxnPosition(
            int(self.ledger_id[i]),
            int(self.entry_id[i]),
            int(self.batch_size[i]),
            int(self.batch_index[i]),
        )

    def records(self) -> list[bytes]:
        """Return every record's bytes (one object each)."""
        offs = self.offsets.tolist()
        data = self.data
        return [data[a:b] for a, b in itertools.pairwise(offs)]

    def positions(self) -> list[TxnPosition]:
        """Return every record's position (one object each)."""
        return [
            TxnPosition(lid, eid, size, idx)
            for lid, eid, size, idx in zip(
                self.ledger_id.tolist(),
                self.entry_id.tolist(),
                self.batch_size.tolist(),
                self.batch_index.tolist(),
                strict=True,
            )
        ]

    def __iter__(self) -> Iterator[tuple[TxnPosition, bytes]]:
        """Yield ``(position, record)`` pairs in log order."""
        return iter(zip(self.positions(), self.records(), strict=True))


def replay(
    ml: ManagedLedger,
    cursor: Cursor | str | None = None,
    *,
    start: Position | TxnPosition | None = None,
    end: Position | TxnPosition | None = None,
) -> LiveRecords:
    """Return the live records of ``ml``.

    With ``cursor`` (a :class:`Cursor` or its name) and no bounds: every
    record after the cursor's mark-delete position, skipping entries and
    batch indexes it deleted (the cursor's read position ends at the log's
    end). With ``start``/``end`` (inclusive; default the whole log): that
    range, filtered by the cursor if given.
    """
    return LiveRecords._from_native(replay_log(ml, cursor, start=start, end=end))


def replay_chunks(
    ml: ManagedLedger, cursor: Cursor | str, chunk_entries: int = 4096
) -> Iterator[LiveRecords]:
    """Yield the live records for ``cursor`` in chunks of ``chunk_entries`` entries.

    The cursor is rewound to its mark-delete position first.
    """
    cur = ml.open_cursor(cursor) if isinstance(cursor, str) else cursor
    cur.rewind()
    while True:
        chunk = LiveRecords._from_native(replay_log(ml, cur, max_entries=chunk_entries))
        if chunk.entries == 0:
            return
        yield chunk
