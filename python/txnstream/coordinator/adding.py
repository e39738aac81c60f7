"""Recording what a transaction touched: produced partitions, acked subscriptions.

The single calls (``add_produced_partitions``...) and the bulk ones
(``add_*_many``) are the same operation over one or many items: under the
table lock each live OPEN transaction takes the names it does not have yet
and an ADD record is encoded for them; outside the lock the records are
written and waited for (one through the writer's batching, or many as one
batch); then each position is attached to its transaction, or deleted at
once if the transaction ended meanwhile (:mod:`.durable`). Nothing new to
add writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from txnstream._native import encode_txn_add_partitions, encode_txn_add_subscriptions
from txnstream.coordinator.answers import live_meta, require_open
from txnstream.coordinator.durable import DurableWriter
from txnstream.coordinator.metadata import TxnMeta
from txnstream.coordinator.table import TransactionTable
from txnstream.coordinator.terminated import TerminatedTxnStore
from txnstream.coordinator.timeouts import Clock
from txnstream.coordinator.txn_id import TxnID
from txnstream.errors import TransactionError


@dataclass(frozen=True)
class AddKind:
    """One kind of addition: its wording in refusals, state update and record codec."""

    want: str
    add: Callable[[TxnMeta, list[Any]], list[Any]]
    encode: Callable[[int, int, int, list[Any]], bytes]


PARTITIONS = AddKind("add partitions to", TxnMeta.add_partitions, encode_txn_add_partitions)
SUBSCRIPTIONS = AddKind(
    "add subscriptions to", TxnMeta.add_subscriptions, encode_txn_add_subscriptions
)


class ParticipantAdder:
    """Adds partitions or subscriptions to live OPEN transactions, durably."""

    def __init__(
        self,
        table: TransactionTable,
        writer: DurableWriter,
        store: TerminatedTxnStore,
        clock: Clock,
    ) -> None:
        self._table = table
        self._writer = writer
        self._store = store
        self._clock = clock

    def add_one(self, txn_id: TxnID, seq: int, values: list[Any], kind: AddKind) -> None:
        """Add ``values`` to one transaction (already checked); raise its refusal."""
        table = self._table
        now = self._clock()
        with table.lock:
            table.check_open()
            meta = live_meta(table.txns, self._store, txn_id, seq, kind.want)
            record = self._take(txn_id, seq, meta, values, kind, now)
        if record is not None:
            self._writer.attach_one(meta, self._writer.write(record))

    def add_many(
        self, items: list[tuple[TxnID, list[Any]]], kind: AddKind
    ) -> list[TransactionError | None]:
        """Add to many transactions with one log write; a refusal per item or None."""
        table = self._table
        seqs = [table.seq_of(txn) for txn, _ in items]
        results: list[TransactionError | None] = [None] * len(items)
        now = self._clock()
        metas: list[TxnMeta] = []
        records: list[bytes] = []
        with table.lock:
            table.check_open()
            for i, ((txn, values), seq) in enumerate(zip(items, seqs, strict=True)):
                try:
                    meta = live_meta(table.txns, self._store, txn, seq, kind.want)
                    record = self._take(txn, seq, meta, values, kind, now)
                except TransactionError as exc:
                    results[i] = exc
                    continue
                if record is not None:
                    metas.append(meta)
                    records.append(record)
        if records:
            positions = self._writer.write_many(records)
            self._writer.attach(zip(metas, positions, strict=True))
        return results

    def _take(
        self, txn_id: TxnID, seq: int, meta: TxnMeta, values: list[Any], kind: AddKind, now: int
    ) -> bytes | None:
        # Under the lock: refuse unless OPEN; add what is new and return its
        # ADD record (None: nothing new, nothing to write).
        require_open(txn_id, meta, kind.want)
        new = kind.add(meta, values)
        if not new:
            return None
        meta.last_modified = now
        return kind.encode(self._table.tc_id, seq, now, new)


__all__ = ["PARTITIONS", "SUBSCRIPTIONS", "AddKind", "ParticipantAdder"]
