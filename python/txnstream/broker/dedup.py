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
(the new message replaces it here); so may one whose append failed. A batch
is written again only if every id in it is gone or new: one whose message
persisted makes the whole batch a :class:`DuplicateSequenceError`, written
nowhere. A re-send refused after its claim (its transaction ended, say)
puts back what the claim forgot, so the ids stay sendable. A retry from
another transaction while the first one is still open conflicts
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

import itertools
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable
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

    def placement(self) -> Position | Future[Position] | None:
        """Return its entry if known, else the append's future (None: it failed)."""
        if self.entry is not None:
            return self.entry
        p = self.pending
        if p is not None and p.done():
            return None if p.exception() is not None else p.result()
        return p

    def in_entry_of(self, other: Sent) -> bool:
        """Return True if it went to the same entry as ``other`` (known or in flight).

        Either one may have learned its entry already (:meth:`durable_entry`)
        and the other not: compare where they went, not how it is recorded.
        """
        if self.pending is not None and self.pending is other.pending:
            return True
        mine = self.placement()
        return mine is not None and mine == other.placement()

    def when_placed(self, done: Callable[[Where | BaseException], object]) -> None:
        """Call ``done`` with where the message is, or its append's error; never waits.

        At once when the entry is known, else when the append in flight is
        placed (from the thread that resolves it).
        """
        pending = self.pending  # before entry: durable_entry() sets entry, then clears this
        entry = self.entry
        if pending is None or entry is not None:
            assert entry is not None
            done((entry.ledger_id, entry.entry_id, self.index, self.size))
            return

        def placed(f: Future[Position]) -> None:
            exc = f.exception()
            if exc is not None:
                done(exc)
                return
            pos = f.result()
            done((pos.ledger_id, pos.entry_id, self.index, self.size))

        pending.add_done_callback(placed)


class _Producer:
    __slots__ = ("last", "ordered", "window")

    def __init__(self) -> None:
        self.last = -1
        self.window: OrderedDict[int, Sent] = OrderedDict()
        #: The window is in ascending sequence-id order (a re-sent id of an
        #: aborted or failed message can break that; a full scan restores it).
        self.ordered = True


class Deduplication:
    """Per-producer sequence state of one partition (under the caller's publish lock)."""

    def __init__(self, window: int = 1024, max_producers: int = 10_000) -> None:
        self.window = window
        self.max_producers = max_producers
        self._producers: OrderedDict[str, _Producer] = OrderedDict()
        self.duplicates = 0
        # Remembered messages by transaction: (producer, sequence id) of each
        # window entry sent in it, so a snapshot or an abort finds a
        # transaction's messages without scanning every window.
        self._by_txn: dict[TxnKey, set[tuple[str, int]]] = {}
        # Transactions marked aborted (the buffer forgot them) with messages remembered.
        self._forgotten: set[TxnKey] = set()
        #: Window entries the snapshots looked at (counts the work a snapshot does).
        self.snapshot_scanned = 0
        # What the last claim that said "write it" changed, until :meth:`placed`
        # or :meth:`failed` (the caller holds the publish lock from claim to
        # those): the producer, its previous highest id, the messages it
        # forgot, each with whether its transaction was marked aborted and
        # forgotten (``_forgotten``: what keeps it in snapshots). A failed
        # write puts them back: its ids stay sendable, after a restart too.
        self._undo: tuple[str, int, list[tuple[int, Sent, bool]]] | None = None

    def _get(self, name: str) -> _Producer:
        p = self._producers.get(name)
        if p is None:
            p = self._producers[name] = _Producer()
            while len(self._producers) > self.max_producers:
                gone, old = self._producers.popitem(last=False)
                for seq, sent in old.window.items():
                    self._unindex(gone, seq, sent)
        else:
            self._producers.move_to_end(name)
        return p

    def _put(self, name: str, p: _Producer, seq: int, sent: Sent) -> None:
        # Remember ``sent`` as ``seq`` (the newest), replacing what was there.
        window = p.window
        old = window.pop(seq, None)
        if old is not None:
            self._unindex(name, seq, old)
        if p.ordered and window and seq < next(reversed(window)):
            p.ordered = False
        window[seq] = sent
        if sent.txn is not None:
            self._by_txn.setdefault(sent.txn, set()).add((name, seq))
        while len(window) > self.window:
            s, evicted = window.popitem(last=False)
            self._unindex(name, s, evicted)

    def _drop(self, name: str, p: _Producer, seq: int) -> None:
        sent = p.window.pop(seq, None)
        if sent is not None:
            self._unindex(name, seq, sent)

    def _unindex(self, name: str, seq: int, sent: Sent) -> None:
        txn = sent.txn
        if txn is None:
            return
        members = self._by_txn.get(txn)
        if members is None:
            return
        members.discard((name, seq))
        if not members:
            del self._by_txn[txn]
            self._forgotten.discard(txn)

    def _messages_of(self, txn: TxnKey) -> list[tuple[str, _Producer, int, Sent]]:
        # The remembered messages of ``txn``: (producer name, producer, seq, message).
        out = []
        for name, seq in self._by_txn.get(txn, ()):
            p = self._producers.get(name)
            sent = None if p is None else p.window.get(seq)
            if p is not None and sent is not None and sent.txn == txn:
                out.append((name, p, seq, sent))
        return out

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
        self._undo = None
        first = sequence_ids[0]
        p = self._get(producer)
        if first > p.last:
            self._undo = (producer, p.last, [])
            p.last = sequence_ids[-1]
            return None
        sent = p.window.get(first)
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
        if sent.failed():  # never written: send it again
            self._send_again(producer, p, sequence_ids, txn_state)
            return None
        if sent.txn is not None and sent.txn != txn:
            state = ABORTED if sent.aborted else txn_state(sent.txn)
            if state == ABORTED:  # gone: its ids may be sent again
                self._send_again(producer, p, sequence_ids, txn_state)
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

    def _send_again(
        self,
        producer: str,
        p: _Producer,
        sequence_ids: list[int],
        txn_state: Callable[[TxnKey], str],
    ) -> None:
        # The first id's message is gone (its transaction aborted, or its
        # append failed): the send is written again if EVERY id of it is gone
        # or new. An id whose message persisted (or is unknown: older than the
        # window) must not be written twice: then nothing is, and it raises.
        states: dict[TxnKey, str] = {}
        for seq in sequence_ids:
            if seq > p.last:
                break  # ascending: the rest are new too
            old = p.window.get(seq)
            gone = old is not None and old.failed()
            if old is not None and not gone and old.txn is not None:
                if old.aborted:
                    gone = True
                else:
                    state = states.get(old.txn)
                    if state is None:
                        state = states[old.txn] = txn_state(old.txn)
                    gone = state == ABORTED
            if not gone:
                raise DuplicateSequenceError(
                    f"producer {producer!r}: sequence ids {sequence_ids[0]}..{sequence_ids[-1]} "
                    f"are not one earlier send: {sequence_ids[0]} may be sent again (its "
                    f"message is gone), but {seq} "
                    + ("was written" if old is not None else "is not remembered")
                    + "; nothing is written",
                    producer_name=producer,
                    sequence_id=seq,
                )
        dropped = []
        for seq in sequence_ids:
            old = p.window.get(seq)
            if old is not None:
                forgotten = old.txn is not None and old.txn in self._forgotten
                self._drop(producer, p, seq)
                dropped.append((seq, old, forgotten))
        self._undo = (producer, p.last, dropped)
        p.last = max(p.last, sequence_ids[-1])

    def _check_same_entry(
        self, producer: str, p: _Producer, sequence_ids: list[int], sent: Sent
    ) -> None:
        # A retry is a duplicate only if ALL its ids went, in order, to the
        # entry its first one went to; a batch that also holds new ids (or
        # ids of other entries) must not be acknowledged as sent: raise.
        for k, seq in enumerate(sequence_ids[1:], start=1):
            other = p.window.get(seq)
            same = other is not None and other.index == sent.index + k and other.in_entry_of(sent)
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
        self._undo = None
        p = self._get(producer)
        size = len(sequence_ids) if batched else 1
        for i, seq in enumerate(sequence_ids):
            sent = Sent(entry, i if batched else 0, size, txn, pending, durable)
            self._put(producer, p, seq, sent)
        if sequence_ids[-1] > p.last:
            p.last = sequence_ids[-1]

    def failed(self, producer: str, sequence_ids: list[int]) -> None:
        """Undo the claim of a send that failed to be queued: its ids may be sent again.

        What the claim changed comes back: the producer's highest id, and
        the gone messages (aborted or failed) it forgot to write them again.
        """
        undo, self._undo = self._undo, None
        if undo is None or undo[0] != producer:
            return
        _name, last, dropped = undo
        p = self._get(producer)
        for seq in sequence_ids:
            self._drop(producer, p, seq)
        for seq, old, forgotten in dropped:
            self._put(producer, p, seq, old)
            if forgotten and old.txn is not None:
                self._forgotten.add(old.txn)
        p.last = last

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
        keep: Iterable[TxnKey] = (),
    ) -> None:
        """Write the state durable up to ``durable_end`` into ``out`` (under the publish lock).

        Per producer: the highest durable sequence id, and where its last
        :data:`SNAPSHOT_RECENT` durable messages went, plus every remembered
        message of a transaction in ``keep`` (the caller's aborted and open
        ones: an aborted message may be sent again after a restart, and an
        open one may still abort) or marked aborted. A message whose append
        is in flight or failed is not in it: once durable, it is after the
        snapshot's position and comes back with the replayed tail.

        The work is bounded by the recent messages per producer and the
        kept transactions' messages, not by the window: a producer's window
        is read from its newest end while it is in sequence-id order (the
        rule; a re-sent id of an aborted message breaks it until a full
        scan finds it restored).
        """
        out.dedup_complete = True
        if durable_end is None:
            return
        kept: dict[str, dict[int, Sent]] = {}
        for t in itertools.chain(keep, list(self._forgotten)):
            for name, _p, seq, sent in self._messages_of(t):
                kept.setdefault(name, {})[seq] = sent
        txn_refs: dict[tuple[int, int, bool], int] = {}
        new_refs: list[TxnRef] = []
        for name, p in self._producers.items():
            found = self._durable(p, durable_end, kept.get(name, {}))
            if found is None:
                continue
            last, messages = found
            ps: ProducerSequence = out.producer_sequences.add()
            ps.producer_name = name
            ps.last_sequence_id = last
            # One extend per field (not one append per message per field).
            ps.sequence_ids.extend([m[0] for m in messages])
            ps.ledger_ids.extend([m[1].ledger_id for m in messages])
            ps.entry_ids.extend([m[1].entry_id for m in messages])
            ps.batch_indexes.extend([m[2].index for m in messages])
            ps.batch_sizes.extend([m[2].size for m in messages])
            refs = []
            for _seq, _entry, sent in messages:
                ref = 0
                if sent.txn is not None:
                    tk = (sent.txn[0], sent.txn[1], sent.aborted)
                    ref = txn_refs.get(tk, 0)
                    if not ref:
                        new_refs.append(
                            TxnRef(
                                txnid_most_bits=sent.txn[0],
                                txnid_least_bits=sent.txn[1],
                                aborted=sent.aborted,
                            )
                        )
                        ref = txn_refs[tk] = len(new_refs)
                refs.append(ref)
            ps.txn_refs.extend(refs)
        out.message_txns.extend(new_refs)

    def _durable(
        self, p: _Producer, end: Position, kept: dict[int, Sent]
    ) -> tuple[int, list[tuple[int, Position, Sent]]] | None:
        # The highest durable id of ``p`` and, in window order, its last
        # SNAPSHOT_RECENT durable messages plus the durable ones of ``kept``
        # (None: nothing durable).
        if not p.ordered:
            return self._durable_full_scan(p, end, kept)
        recent: list[tuple[int, Position, Sent]] = []
        for seq, sent in reversed(p.window.items()):
            self.snapshot_scanned += 1
            entry = sent.durable_entry()
            if entry is None or entry > end:
                continue
            recent.append((seq, entry, sent))
            if len(recent) >= SNAPSHOT_RECENT:
                break
        if not recent:
            return None
        recent.reverse()
        oldest = recent[0][0]
        older: list[tuple[int, Position, Sent]] = []
        for seq, sent in kept.items():
            if seq >= oldest:
                continue  # among the recent ones (or not durable)
            self.snapshot_scanned += 1
            entry = sent.durable_entry()
            if entry is not None and entry <= end:
                older.append((seq, entry, sent))
        older.sort(key=lambda m: m[0])
        return recent[-1][0], older + recent

    def _durable_full_scan(
        self, p: _Producer, end: Position, kept: dict[int, Sent]
    ) -> tuple[int, list[tuple[int, Position, Sent]]] | None:
        # :meth:`_durable` for a window out of sequence-id order: read it all.
        durable: list[tuple[int, Position, Sent]] = []
        ascending, prev = True, -1
        for seq, sent in p.window.items():
            self.snapshot_scanned += 1
            ascending = ascending and seq > prev
            prev = seq
            entry = sent.durable_entry()
            if entry is not None and entry <= end:
                durable.append((seq, entry, sent))
        p.ordered = ascending
        if not durable:
            return None
        recent = len(durable) - SNAPSHOT_RECENT
        messages = [d for i, d in enumerate(durable) if i >= recent or d[0] in kept]
        return max(seq for seq, _, _ in durable), messages

    def restore(self, snap: TransactionBufferSnapshot) -> None:
        """Load a snapshot's state (recovery, before the tail after it is replayed)."""
        txns = [(t.txnid_most_bits, t.txnid_least_bits) for t in snap.message_txns]
        aborted = [t.aborted for t in snap.message_txns]
        for ps in snap.producer_sequences:
            name = ps.producer_name
            p = self._get(name)
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
                    f"producer {name!r}: the snapshot's message arrays differ in length"
                )
            for i in range(n):
                ref = ps.txn_refs[i]
                if ref > len(txns):
                    raise ValueError(f"producer {name!r}: txn reference {ref} unknown")
                txn = txns[ref - 1] if ref else None
                sent = Sent(
                    Position(ps.ledger_ids[i], ps.entry_ids[i]),
                    ps.batch_indexes[i],
                    ps.batch_sizes[i],
                    txn,
                )
                sent.aborted = bool(ref) and aborted[ref - 1]
                self._put(name, p, ps.sequence_ids[i], sent)
                if sent.aborted and txn is not None:
                    self._forgotten.add(txn)

    def mark_aborted(self, txns: Collection[TxnKey]) -> None:
        """Remember messages of ``txns`` as aborted (the buffer forgot them: markers trimmed)."""
        for t in txns:
            messages = self._messages_of(t)
            for _name, _p, _seq, sent in messages:
                sent.aborted = True
            if messages:
                self._forgotten.add(t)

    def stats(self) -> dict[str, int]:
        """Return the producers tracked and the duplicates answered."""
        return {"producers": len(self._producers), "duplicates": self.duplicates}


__all__ = ["ABORTED", "ENDED", "OPEN", "SNAPSHOT_RECENT", "Deduplication", "Sent", "Where"]
