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
        refusal = self._add([(txn_id, values)], [seq], kind, bulk=False)[0]
        if refusal is not None:
            raise refusal

    def add_many(
        self, items: list[tuple[TxnID, list[Any]]], kind: AddKind
    ) -> list[TransactionError | None]:
        """Add to many transactions with one log write; a refusal per item or None."""
        seqs = [self._table.seq_of(txn) for txn, _ in items]
        return self._add(items, seqs, kind, bulk=True)

    def _add(
        self,
        items: list[tuple[TxnID, list[Any]]],
        seqs: list[int],
        kind: AddKind,
        *,
        bulk: bool,
    ) -> list[TransactionError | None]:
        table = self._table
        results: list[TransactionError | None] = [None] * len(items)
        now = self._clock()
        metas: list[TxnMeta] = []
        records: list[bytes] = []
        with table.lock:
            table.check_open()
            for i, ((txn, values), seq) in enumerate(zip(items, seqs, strict=True)):
                try:
                    meta = live_meta(table.txns, self._store, txn, seq, kind.want)
                    require_open(txn, meta, kind.want)
                except TransactionError as exc:
                    results[i] = exc
                    continue
                new = kind.add(meta, values)
                if new:
                    meta.last_modified = now
                    metas.append(meta)
                    records.append(kind.encode(table.tc_id, seq, now, new))
        if records:
            positions = self._writer.write_all(records, bulk=bulk)
            self._writer.attach(zip(metas, positions, strict=True))
        return results


__all__ = ["PARTITIONS", "SUBSCRIPTIONS", "AddKind", "ParticipantAdder"]
