"""Clients' end requests: commit/abort of one or many transactions, admin abort.

A request claims the transaction (or finds another thread driving it, or
finds it gone), lets the :class:`~.ending.EndDriver` run the end, and turns
the outcome into the answer (:mod:`.answers`): the same result when the
same end is asked again, also after the transaction left memory when the
PIP-255 store remembers it (SPEC §4.4). Bulk requests claim every
transaction under one lock acquisition and drive the claimed ones together
(one batched write per step); those another thread drives, or that left
memory, are answered one by one afterwards.
"""

from __future__ import annotations

from collections.abc import Iterable

from txnstream.coordinator.answers import end_answer, end_answer_or_error, remembered_answer
from txnstream.coordinator.ending import EndDriver
from txnstream.coordinator.metadata import TxnMeta
from txnstream.coordinator.status import TxnAction, TxnStatus
from txnstream.coordinator.table import TransactionTable
from txnstream.coordinator.terminated import TerminatedTxnStore
from txnstream.coordinator.txn_id import TxnID
from txnstream.errors import TransactionError, TransactionNotFound


class EndRequests:
    """Answers ``end_transaction``, ``end_transactions`` and ``abort_transaction``."""

    def __init__(
        self, table: TransactionTable, driver: EndDriver, store: TerminatedTxnStore
    ) -> None:
        self._table = table
        self._driver = driver
        self._store = store

    def end_one(self, txn_id: TxnID, action: TxnAction | str) -> TxnStatus:
        """End one transaction; its final status or a refusal raised."""
        act = TxnAction.parse(action)
        seq = self._table.seq_of(txn_id)
        meta = self._driver.end(seq, act, timed_out=False)
        if meta is None:
            return remembered_answer(self._store, txn_id, act)
        return end_answer(txn_id, act, meta.status, meta.timed_out)

    def abort_stuck(self, txn_id: TxnID) -> TxnStatus:
        """Abort an OPEN transaction or finish one stuck while ending (admin)."""
        seq = self._table.seq_of(txn_id)
        meta = self._driver.end(seq, TxnAction.ABORT, timed_out=False)
        if meta is None:
            rec = self._store.lookup(txn_id)
            if rec is None:
                raise TransactionNotFound(f"transaction {txn_id} not found", txn_id=txn_id)
            return rec.status
        return meta.status

    def end_many(
        self, items: Iterable[tuple[TxnID, TxnAction | str]]
    ) -> list[TxnStatus | TransactionError]:
        """End many transactions; per item the final status or the refusal."""
        table = self._table
        reqs = [(txn, table.seq_of(txn), TxnAction.parse(act)) for txn, act in items]
        results: list[TxnStatus | TransactionError | None] = [None] * len(reqs)
        driven: list[int] = []
        claimed: list[tuple[TxnMeta, bytes | None]] = []
        later: list[int] = []
        with table.lock:
            table.check_open()
            for i, (txn, seq, act) in enumerate(reqs):
                meta, record, drive, done = self._driver.claim(seq, act, False)
                if drive:
                    assert meta is not None
                    driven.append(i)
                    claimed.append((meta, record))
                elif meta is not None and done is None:
                    results[i] = end_answer_or_error(txn, act, meta)
                else:
                    later.append(i)  # not in memory, or another thread drives
        if claimed:
            refusals = self._driver.drive_many(claimed)
            for i, (meta, _), refusal in zip(driven, claimed, refusals, strict=True):
                txn, _, act = reqs[i]
                results[i] = refusal if refusal is not None else end_answer_or_error(txn, act, meta)
        for i in later:
            txn, _, act = reqs[i]
            try:
                results[i] = self.end_one(txn, act)
            except TransactionError as exc:
                results[i] = exc
        out: list[TxnStatus | TransactionError] = []
        for r in results:
            assert r is not None  # every item was answered above
            out.append(r)
        return out


__all__ = ["EndRequests"]
