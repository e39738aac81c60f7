"""The transaction table of one coordinator: live transactions, ids, sequence, LWM.

Every other part of the coordinator (starting, adding, ending, background
ends, queries, recovery) reads and changes live transactions only under
:attr:`TransactionTable.lock`, and does its log I/O outside it. Keeping the
lock, the live ``TxnMeta`` map, the sequence counter and the recovered
position table in one small object makes that rule explicit: a collaborator
that needs the lock is handed the table.

The table also issues sequences, reserving them durably in blocks
(:mod:`.sequence`) so ids never go back across restarts; turns TxnIDs into
sequences (refusing another coordinator's) and back; and knows the
low-water mark (SPEC §4.3).
"""

from __future__ import annotations

import threading

from txnstream.coordinator.arguments import txn_id_arg
from txnstream.coordinator.metadata import TxnMeta
from txnstream.coordinator.recovery import PositionColumns, PositionTable
from txnstream.coordinator.sequence import SequenceStore
from txnstream.coordinator.txn_id import TxnID
from txnstream.errors import CoordinatorNotFound


class TransactionTable:
    """Live transactions by sequence (insertion order = sequence order), under one lock.

    Attributes other than the lock are guarded by it: read or change them
    only while holding :attr:`lock` (or before any thread exists).
    """

    def __init__(self, tc_id: int, sequence: SequenceStore | None, reserve_block: int) -> None:
        self.tc_id = tc_id
        self.lock = threading.Lock()
        #: Live transactions by sequence; they leave once COMMITTED/ABORTED.
        self.txns: dict[int, TxnMeta] = {}
        #: Positions of recovered transactions' records (a span each), or None.
        self.recovered: PositionTable | None = None
        #: Set once by ``close``; no new work starts afterwards.
        self.closed = False
        #: The next sequence to issue.
        self.next_seq = 0
        self._sequence = sequence
        self._block = reserve_block
        self._reserved = 0

    def start_sequence(self, log_next: int) -> None:
        """At open: continue after the durable mark and the log (``log_next``)."""
        mark = self._sequence.load() if self._sequence is not None else 0
        self.next_seq = max(mark, log_next)
        self._reserved = self.next_seq
        self._reserve()

    def issue(self, count: int) -> int:
        """Under the lock: take ``count`` sequences; return the first."""
        first = self.next_seq
        self.next_seq += count
        self._reserve()
        return first

    def _reserve(self) -> None:
        if self._sequence is not None and self.next_seq >= self._reserved:
            self._reserved = self.next_seq + self._block
            self._sequence.store(self._reserved)

    def check_open(self) -> None:
        """Under the lock: raise :class:`CoordinatorNotFound` once closed."""
        if self.closed:
            raise CoordinatorNotFound(
                f"transaction coordinator {self.tc_id} is closed", tc_id=self.tc_id
            )

    def seq_of(self, txn_id: TxnID) -> int:
        """Return the sequence of ``txn_id``; refuse a non-id or another coordinator's."""
        if not isinstance(txn_id, TxnID):
            txn_id_arg(txn_id)  # raises; the check itself stays inline (hot path)
        if txn_id.most_bits != self.tc_id:
            raise CoordinatorNotFound(
                f"transaction {txn_id} belongs to coordinator {txn_id.most_bits}, not {self.tc_id}",
                tc_id=txn_id.most_bits,
                txn_id=txn_id,
            )
        return txn_id.least_bits

    def tid(self, seq: int) -> TxnID:
        """Return the TxnID of this coordinator's sequence ``seq``."""
        return TxnID._trusted(self.tc_id, seq)

    def low_water_mark(self) -> int:
        """Every transaction with ``least_bits <= LWM`` has ended (-1: none yet)."""
        with self.lock:
            if self.txns:
                return next(iter(self.txns)) - 1
            return self.next_seq - 1

    def span_records(self, meta: TxnMeta) -> int:
        """Under the lock: how many recovered records ``meta`` still holds."""
        table = self.recovered
        return table.count(meta.span) if meta.span >= 0 and table is not None else 0

    def release_span(self, meta: TxnMeta) -> PositionColumns | None:
        """Under the lock: take the recovered records of ended ``meta`` (to delete)."""
        table = self.recovered
        if meta.span < 0 or table is None:
            return None
        cols = table.span(meta.span)
        meta.span = -1
        table.live -= 1
        if table.live == 0:
            self.recovered = None  # every recovered transaction ended
        return cols


__all__ = ["TransactionTable"]
