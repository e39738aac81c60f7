"""Message deduplication of one topic partition (Pulsar's MessageDeduplication).

Every message carries its producer's name and a sequence id that grows per
producer. The partition remembers, per producer, the highest sequence id
it took and where the last ``window`` ones went. A send whose sequence id
was taken before is not written again: a recent one answers with the
ORIGINAL message id (also after a restart: the state is rebuilt from the
partition's entries by the transaction buffer's replay); an older one
raises :class:`~txnstream.errors.DuplicateSequenceError`.

Transactions: a retry inside the same transaction, or of a message that
committed or was sent outside any transaction, is a duplicate. A message
whose transaction aborted is gone, so its sequence id may be sent again
(the new message replaces it here). A retry from another transaction while
the first one is still open conflicts
(:class:`~txnstream.errors.TransactionConflictError`).

The caller holds the partition's publish lock around :meth:`claim` and the
append that follows it, so a claimed id is placed (:meth:`placed`) before
anyone else looks. Memory is bounded: ``window`` ids per producer and
``max_producers`` producers per partition, the least recently used
forgotten first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from typing import Final

from txnstream._native import Position
from txnstream.errors import DuplicateSequenceError, TransactionConflictError

TxnKey = tuple[int, int]
#: ``(ledger_id, entry_id, batch_index, batch_size)`` of a persisted message.
Where = tuple[int, int, int, int]

#: A transaction's state as the partition's transaction buffer sees it.
OPEN: Final = "open"
ABORTED: Final = "aborted"
ENDED: Final = "ended"


class Sent:
    """One remembered message: its entry (known, or the append's future), index, transaction."""

    __slots__ = ("entry", "index", "pending", "size", "txn")

    def __init__(
        self,
        entry: Position | None,
        index: int,
        size: int,
        txn: TxnKey | None,
        pending: Future[Position] | None = None,
    ) -> None:
        self.entry = entry
        self.index = index
        self.size = size
        self.txn = txn
        self.pending = pending

    def where(self, timeout_s: float | None = None) -> Where:
        """Where the message is; waits for an append still in flight (raises its error)."""
        entry = self.entry
        if entry is None:
            assert self.pending is not None
            entry = self.pending.result(timeout_s)
        return (entry.ledger_id, entry.entry_id, self.index, self.size)


class _Producer:
    __slots__ = ("last", "window")

    def __init__(self) -> None:
        self.last = -1
        self.window: OrderedDict[int, Sent] = OrderedDict()


class Deduplication:
    """Per-producer sequence state of one partition (under the caller's publish lock)."""

    def __init__(self, window: int = 1024, max_producers: int = 10_000) -> None:
        self.window = window
        self.max_producers = max_producers
        self._producers: OrderedDict[str, _Producer] = OrderedDict()
        self.duplicates = 0

    def _get(self, name: str) -> _Producer:
        p = self._producers.get(name)
        if p is None:
            p = self._producers[name] = _Producer()
            while len(self._producers) > self.max_producers:
                self._producers.popitem(last=False)
        else:
            self._producers.move_to_end(name)
        return p

    def last_sequence_id(self, producer: str) -> int:
        """Return the highest sequence id ``producer`` sent here (-1: none)."""
        p = self._producers.get(producer)
        return -1 if p is None else p.last

    def claim(
        self,
        producer: str,
        sequence_ids: list[int],
        txn: TxnKey | None,
        txn_state: Callable[[TxnKey], str],
    ) -> Sent | None:
        """Before a send: None to write it (the ids are now taken), or the original.

        ``sequence_ids`` are the messages of one entry (ascending). Raises
        :class:`DuplicateSequenceError` for an id below the window and
        :class:`TransactionConflictError` for one held by another open
        transaction.
        """
        first = sequence_ids[0]
        p = self._get(producer)
        if first > p.last:
            p.last = sequence_ids[-1]
            return None
        sent = p.window.get(first)
        if sent is not None and sent.pending is not None and sent.pending.done():
            if sent.pending.exception() is not None:  # never written: send it again
                for seq in sequence_ids:
                    p.window.pop(seq, None)
                return None
            sent.entry, sent.pending = sent.pending.result(), None
        if sent is None:
            raise DuplicateSequenceError(
                f"producer {producer!r} already sent sequence id {first} (the highest is "
                f"{p.last}); it is older than the deduplication window of {self.window} "
                "and is not written again",
                producer_name=producer,
                sequence_id=first,
            )
        if sent.txn is not None and sent.txn != txn:
            state = txn_state(sent.txn)
            if state == ABORTED:
                for seq in sequence_ids:
                    p.window.pop(seq, None)
                p.last = max(p.last, sequence_ids[-1])
                return None
            if state == OPEN:
                raise TransactionConflictError(
                    f"producer {producer!r} sent sequence id {first} in transaction "
                    f"{sent.txn}, which is still open; a retry must use that transaction",
                    producer_name=producer,
                    sequence_id=first,
                )
        self.duplicates += 1
        return sent

    def placed(
        self,
        producer: str,
        sequence_ids: list[int],
        txn: TxnKey | None,
        pending: Future[Position] | None,
        entry: Position | None = None,
        batched: bool = False,
    ) -> None:
        """Remember the entry (or its append's future) of claimed ids."""
        p = self._get(producer)
        size = len(sequence_ids) if batched else 1
        for i, seq in enumerate(sequence_ids):
            p.window[seq] = Sent(entry, i if batched else 0, size, txn, pending)
            p.window.move_to_end(seq)
        while len(p.window) > self.window:
            p.window.popitem(last=False)
        if sequence_ids[-1] > p.last:
            p.last = sequence_ids[-1]

    def failed(self, producer: str, sequence_ids: list[int]) -> None:
        """Free the ids of a claimed send that failed to be queued (they may be sent again)."""
        p = self._producers.get(producer)
        if p is None:
            return
        for seq in sequence_ids:
            p.window.pop(seq, None)
        if p.last == sequence_ids[-1]:
            rest = [s for s in p.window if s < sequence_ids[0]]
            p.last = max(rest) if rest else sequence_ids[0] - 1

    def replayed(
        self, producer: str, sequence_ids: list[int], txn: TxnKey | None, entry: Position
    ) -> None:
        """Recovery: an entry of ``producer`` holding these messages sits at ``entry``."""
        if sequence_ids:
            self.placed(producer, sequence_ids, txn, None, entry, len(sequence_ids) > 1)

    def stats(self) -> dict[str, int]:
        """Return the producers tracked and the duplicates answered."""
        return {"producers": len(self._producers), "duplicates": self.duplicates}


__all__ = ["ABORTED", "ENDED", "OPEN", "Deduplication", "Sent", "Where"]
