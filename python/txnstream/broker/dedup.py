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

**Snapshots** (issue 11): :meth:`Deduplication.snapshot` writes, per
producer, the highest sequence id durable at the snapshot and where its
last :data:`SNAPSHOT_RECENT` messages went (txnstream's fields of the
transaction-buffer snapshot); :meth:`Deduplication.restore` reads them back
before the ledger tail after the snapshot is replayed. Only messages whose
entry is durable at the snapshot are in it: one still in flight is after
the snapshot's position and comes back with the tail (or was never written).
A retry of an id older than those recent ones, after a restart, raises
:class:`DuplicateSequenceError`: it is not written again either way.

The caller holds the partition's publish lock around :meth:`claim` and the
append that follows it, so a claimed id is placed (:meth:`placed`) before
anyone else looks. Memory is bounded: ``window`` ids per producer and
``max_producers`` producers per partition, the least recently used
forgotten first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection
from concurrent.futures import Future
from typing import Final

from txnstream._native import Position
from txnstream.errors import DuplicateSequenceError, TransactionConflictError
from txnstream.proto import ProducerSequence, TransactionBufferSnapshot, TxnRef

TxnKey = tuple[int, int]
#: ``(ledger_id, entry_id, batch_index, batch_size)`` of a persisted message.
Where = tuple[int, int, int, int]

#: A transaction's state as the partition's transaction buffer sees it.
OPEN: Final = "open"
ABORTED: Final = "aborted"
ENDED: Final = "ended"
#: Recent messages per producer kept in a snapshot (their original ids survive a restart).
SNAPSHOT_RECENT: Final = 128


class Sent:
    """One remembered message: its entry (known, or the append's future), index, transaction."""

    __slots__ = ("aborted", "durable", "entry", "index", "pending", "size", "txn")

    def __init__(
        self,
        entry: Position | None,
        index: int,
        size: int,
        txn: TxnKey | None,
        pending: Future[Position] | None = None,
        durable: Future[Position] | None = None,
    ) -> None:
        self.entry = entry
        self.index = index
        self.size = size
        self.txn = txn
        #: Where the entry goes (a transactional send knows it before it is durable).
        self.pending = pending
        #: The append's durability, when ``pending`` is only its placement.
        self.durable = durable
        #: Its transaction aborted and the buffer forgot it (marker trimmed away).
        self.aborted = False

    def failed(self) -> bool:
        """Return True if its append failed: the message was never written."""
        for fut in (self.pending, self.durable):
            if fut is not None and fut.done() and fut.exception() is not None:
                return True
        return False

    def durable_entry(self) -> Position | None:
        """Return its entry once known durable (None: still in flight, or failed)."""
        d = self.durable
        if d is not None:
            if not d.done() or d.exception() is not None:
                return None
            self.durable = None
        entry = self.entry
        if entry is None:
            p = self.pending
            if p is None or not p.done() or p.exception() is not None:
                return None
            entry = self.entry = p.result()
            self.pending = None
        return entry

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
        if sent is not None and sent.failed():  # never written: send it again
            for seq in sequence_ids:
                p.window.pop(seq, None)
            return None
        if sent is None:
            raise DuplicateSequenceError(
                f"producer {producer!r} already sent sequence id {first} (the highest is "
                f"{p.last}); it is not among the ids remembered with their message "
                f"(the last {self.window}; after a restart from a snapshot, the last "
                f"{SNAPSHOT_RECENT} and those of aborted or open transactions) "
                "and is not written again",
                producer_name=producer,
                sequence_id=first,
            )
        if sent.txn is not None and sent.txn != txn:
            state = ABORTED if sent.aborted else txn_state(sent.txn)
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
        self._check_same_entry(producer, p, sequence_ids, sent)
        self.duplicates += 1
        return sent

    def _check_same_entry(
        self, producer: str, p: _Producer, sequence_ids: list[int], sent: Sent
    ) -> None:
        # A retry is a duplicate only if ALL its ids went, in order, to the
        # entry its first one went to; a batch that also holds new ids (or
        # ids of other entries) must not be acknowledged as sent: raise.
        for k, seq in enumerate(sequence_ids[1:], start=1):
            other = p.window.get(seq)
            same = (
                other is not None
                and other.entry == sent.entry
                and other.pending is sent.pending
                and other.index == sent.index + k
            )
            if not same:
                new = [s for s in sequence_ids if s > p.last]
                raise DuplicateSequenceError(
                    f"producer {producer!r}: sequence ids {sequence_ids[0]}..{sequence_ids[-1]} "
                    f"are not one earlier send: {sequence_ids[0]} was sent before"
                    + (f", {new[0]}.. are new" if new else f", {seq} went elsewhere")
                    + "; nothing is written (send the new ids alone)",
                    producer_name=producer,
                    sequence_id=seq,
                )

    def placed(
        self,
        producer: str,
        sequence_ids: list[int],
        txn: TxnKey | None,
        pending: Future[Position] | None,
        entry: Position | None = None,
        batched: bool = False,
        durable: Future[Position] | None = None,
    ) -> None:
        """Remember the entry (or its append's futures) of claimed ids.

        ``pending`` gives the entry's position; ``durable``, when the
        position is known before the entry is durable (a transactional
        send), says when it is.
        """
        p = self._get(producer)
        size = len(sequence_ids) if batched else 1
        for i, seq in enumerate(sequence_ids):
            p.window[seq] = Sent(entry, i if batched else 0, size, txn, pending, durable)
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

    def snapshot(
        self,
        durable_end: Position | None,
        out: TransactionBufferSnapshot,
        keep_txn: Callable[[TxnKey], bool] = lambda _t: False,
    ) -> None:
        """Write the state durable up to ``durable_end`` into ``out`` (under the publish lock).

        Per producer: the highest durable sequence id, and where its last
        :data:`SNAPSHOT_RECENT` durable messages went, plus every remembered
        message of a transaction ``keep_txn`` names (the caller's aborted and
        open ones: an aborted message may be sent again after a restart, and
        an open one may still abort). A message whose append is in flight or
        failed is not in it: once durable, it is after the snapshot's
        position and comes back with the replayed tail.
        """
        out.dedup_complete = True
        if durable_end is None:
            return
        txn_refs: dict[tuple[int, int, bool], int] = {}
        for name, p in self._producers.items():
            durable: list[tuple[int, Position, Sent]] = []
            for seq, sent in p.window.items():
                entry = sent.durable_entry()
                if entry is not None and entry <= durable_end:
                    durable.append((seq, entry, sent))
            if not durable:
                continue
            recent = len(durable) - SNAPSHOT_RECENT
            kept = [
                d
                for i, d in enumerate(durable)
                if i >= recent or d[2].aborted or (d[2].txn is not None and keep_txn(d[2].txn))
            ]
            ps: ProducerSequence = out.producer_sequences.add()
            ps.producer_name = name
            ps.last_sequence_id = max(seq for seq, _, _ in durable)
            for seq, entry, sent in kept:
                ps.sequence_ids.append(seq)
                ps.ledger_ids.append(entry.ledger_id)
                ps.entry_ids.append(entry.entry_id)
                ps.batch_indexes.append(sent.index)
                ps.batch_sizes.append(sent.size)
                ref = 0
                if sent.txn is not None:
                    tk = (sent.txn[0], sent.txn[1], sent.aborted)
                    ref = txn_refs.get(tk, 0)
                    if not ref:
                        out.message_txns.append(
                            TxnRef(
                                txnid_most_bits=sent.txn[0],
                                txnid_least_bits=sent.txn[1],
                                aborted=sent.aborted,
                            )
                        )
                        ref = txn_refs[tk] = len(out.message_txns)
                ps.txn_refs.append(ref)

    def restore(self, snap: TransactionBufferSnapshot) -> None:
        """Load a snapshot's state (recovery, before the tail after it is replayed)."""
        txns = [(t.txnid_most_bits, t.txnid_least_bits) for t in snap.message_txns]
        aborted = [t.aborted for t in snap.message_txns]
        for ps in snap.producer_sequences:
            p = self._get(ps.producer_name)
            p.last = max(p.last, ps.last_sequence_id)
            n = len(ps.sequence_ids)
            if not (
                len(ps.ledger_ids)
                == len(ps.entry_ids)
                == len(ps.batch_indexes)
                == len(ps.batch_sizes)
                == len(ps.txn_refs)
                == n
            ):
                raise ValueError(
                    f"producer {ps.producer_name!r}: the snapshot's message arrays differ in length"
                )
            for i in range(n):
                ref = ps.txn_refs[i]
                if ref > len(txns):
                    raise ValueError(f"producer {ps.producer_name!r}: txn reference {ref} unknown")
                txn = txns[ref - 1] if ref else None
                sent = p.window[ps.sequence_ids[i]] = Sent(
                    Position(ps.ledger_ids[i], ps.entry_ids[i]),
                    ps.batch_indexes[i],
                    ps.batch_sizes[i],
                    txn,
                )
                sent.aborted = bool(ref) and aborted[ref - 1]
            while len(p.window) > self.window:
                p.window.popitem(last=False)

    def mark_aborted(self, txns: Collection[TxnKey]) -> None:
        """Remember messages of ``txns`` as aborted (the buffer forgot them: markers trimmed)."""
        if not txns:
            return
        gone = set(txns)
        for p in self._producers.values():
            for sent in p.window.values():
                if sent.txn is not None and sent.txn in gone:
                    sent.aborted = True

    def stats(self) -> dict[str, int]:
        """Return the producers tracked and the duplicates answered."""
        return {"producers": len(self._producers), "duplicates": self.duplicates}


__all__ = ["ABORTED", "ENDED", "OPEN", "SNAPSHOT_RECENT", "Deduplication", "Sent", "Where"]
