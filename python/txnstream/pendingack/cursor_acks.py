"""Acknowledgements applied to a subscription's cursor: individual, batch index, cumulative.

A subscription is one durable cursor on its partition's managed ledger.
An individual ack of a message deletes its entry (``batch_size == 1``) or
clears its index in the entry's ack set (SPEC §3.3); a cumulative ack of a
message deletes everything up to and including it, which for a message in
the middle of a batch is: mark-delete up to the previous entry, then clear
the indexes ``0..i`` of its own entry. Used by non-transactional acks and
by the pending-ack store when a transaction commits.
"""

from __future__ import annotations

from collections.abc import Iterable

from txnstream._native import AckSet, Cursor, ManagedLedger, Position, TxnPosition


class CursorAcks:
    """The ack operations of one subscription cursor (thread-safe: the cursor is)."""

    def __init__(self, ml: ManagedLedger, cursor: Cursor) -> None:
        self.ml = ml
        self.cursor = cursor

    def is_acked(self, pos: TxnPosition) -> bool:
        """Return True if the message at ``pos`` (its batch index) is already acknowledged."""
        entry = pos.position
        if self.cursor.is_deleted(entry):
            return True
        if pos.batch_size > 1:
            present = self.cursor.batch_ack_set(entry)
            return present is not None and not present.get(pos.batch_index)
        return False

    def acked_set(self, entry: Position) -> AckSet | None:
        """Return the cursor's ack set of a partially acknowledged batched entry."""
        return self.cursor.batch_ack_set(entry)

    def at_or_below_mark_delete(self, entry: Position) -> bool:
        """Return True if every entry up to ``entry`` is already deleted."""
        md = self.cursor.mark_delete_position
        return md is not None and entry <= md

    def individual(self, positions: Iterable[TxnPosition]) -> None:
        """Delete these messages (entries, or single batch indexes)."""
        recs = list(positions)
        if recs:
            self.cursor.delete(recs)

    def cumulative(self, pos: TxnPosition) -> None:
        """Delete every message up to and including ``pos``."""
        entry = pos.position
        if pos.batch_size <= 1 or pos.batch_index >= pos.batch_size - 1:
            self.cursor.mark_delete(entry)
            return
        prev = self.previous(entry)
        if prev is not None:
            self.cursor.mark_delete(prev)
        self.cursor.delete(
            [
                TxnPosition(entry.ledger_id, entry.entry_id, pos.batch_size, i)
                for i in range(pos.batch_index + 1)
            ]
        )

    def previous(self, entry: Position) -> Position | None:
        """Return the entry just before ``entry`` that still exists (None: none)."""
        first = self.ml.first_position
        if first is None or entry <= first:
            return None
        if entry.entry_id > 0:
            return Position(entry.ledger_id, entry.entry_id - 1)
        before = [(lid, n) for lid, n, _ in self.ml.ledgers() if lid < entry.ledger_id and n > 0]
        if not before:
            return None
        lid, n = before[-1]
        return Position(lid, n - 1)

    def flush(self) -> None:
        """Make the cursor's state durable now."""
        self.cursor.flush()


__all__ = ["CursorAcks"]
