"""The pending-ack store of one subscription (SPEC §4.7; Pulsar's PendingAckHandleImpl).

A transactional ack does not touch the subscription's cursor: it puts the
message in PENDING_ACK, held by that transaction, and logs an ACK record
(``PendingAckMetadataEntry``, Pulsar's field numbers) through the store's
own PIP-160 BufferedWriter. When the transaction ends, a COMMIT or ABORT
record is logged; once it is durable a commit applies the acks to the
cursor (:class:`~.cursor_acks.CursorAcks`) and an abort releases the
messages, which the subscription redelivers.

**Conflicts** (:class:`~txnstream.errors.TransactionConflictError`; the
state is unchanged when one is raised):

- an individual ack of a message the cursor already acknowledged, or one
  held by a transaction -- for a batched message: its index already acked
  or held (overlapping ack sets); indexes that do not overlap merge;
- an individual ack of a message at or below another transaction's
  cumulative ack (it holds it), and a cumulative ack while another
  transaction holds a message at or below it individually;
- a cumulative ack while another transaction holds one (one holder per
  subscription), at or below the cursor's mark-delete, or at or below the
  position this transaction already holds cumulatively (moving it forward,
  also within one batched entry, is allowed).

Acks outside any transaction are refused (the same error) when they would
take a message a transaction holds: an individual ack of a held message (an
unbatched id of a batched entry stands for all of it), and a cumulative ack
while a transaction holds a cumulative ack or any message it covers. Pulsar
does not check these; accepting them would lose the message if the
transaction aborts.

A cumulative ack takes exactly one message id (the API has no other shape).
Late acks of a transaction that ended here, or at or below its
coordinator's low water mark, are refused
(:class:`~txnstream.errors.InvalidTxnStatusError`).

**The log.** Records of a transaction are deleted from the log (by position
and batch index, so whole entries free up) once it ended: an abort's at
once; a commit's once the cursor state holding its acks is durable
(:meth:`trim` flushes the cursor first), so a crash never loses a committed
ack. Recovery replays the live records: COMMIT applies the acks again
(idempotent), ABORT drops them, and a transaction with only ACK records is
reconciled with its coordinator like the transaction buffer does. A commit
whose acks the cursor refused (a closed ledger) keeps its messages held and
its records, COMMIT included, until the next end or orphan sweep applies
them; it is never reconciled with its coordinator, which may have forgotten
it and would call it aborted (Pulsar keeps the pending-ack log entry until
the mark-delete passes it).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager
from typing import Any, Final

from txnstream._native import AckSet, BufferedWriter, Cursor, ManagedLedger, Position, TxnPosition
from txnstream.buffer import TxnOutcomes, resolve_outcome
from txnstream.coordinator import TxnID
from txnstream.errors import CorruptEntryError, InvalidTxnStatusError, TransactionConflictError
from txnstream.pendingack.cursor_acks import CursorAcks
from txnstream.proto import (
    ABORT,
    ACK,
    COMMIT,
    Cumulative,
    Individual,
    PendingAckMetadataEntry,
)
from txnstream.replay import replay

log = logging.getLogger(__name__)

#: Longest a clean close waits for batched records to become durable.
CLOSE_FLUSH_MS: Final = 10_000

#: Name of the store's cursor on its own log.
LOG_CURSOR = "__pending_ack_store"

#: ``on_end(txn, committed, messages, cumulative)``: the subscription's hook,
#: called once an end is applied: a commit's once its acks are on the cursor,
#: before the messages are released; an abort's after. ``messages`` are the
#: individually held messages (as TxnPositions), ``cumulative`` the
#: cumulative position or None.
EndHook = Callable[[TxnID, bool, list[TxnPosition], TxnPosition | None], None]


class TxnAcks:
    """What one transaction holds on a subscription (its acks and their log records)."""

    __slots__ = ("cumulative", "individual", "records")

    def __init__(self) -> None:
        # entry -> (batch_size, ack set of the indexes this txn acked | None)
        self.individual: dict[Position, tuple[int, AckSet | None]] = {}
        self.cumulative: TxnPosition | None = None
        self.records: list[TxnPosition] = []

    def messages(self) -> list[TxnPosition]:
        out: list[TxnPosition] = []
        for pos, (size, acked) in self.individual.items():
            if acked is None:
                out.append(TxnPosition(pos.ledger_id, pos.entry_id))
            else:
                out.extend(
                    TxnPosition(pos.ledger_id, pos.entry_id, size, i)
                    for i in absent_indexes(acked, size)
                )
        return out


_WORD: Final = (1 << 64) - 1


def absent_indexes(acked: AckSet, size: int) -> Iterator[int]:
    """Yield the indexes below ``size`` whose bit is clear (acked), in order.

    Walks the clear bits of the ack set's words, so a transaction that
    acked one message of a large batch costs what it acked, not the batch.
    """
    words = acked.to_words()
    for w, word in enumerate(words):
        missing = ~word & _WORD
        base = w * 64
        while missing:
            low = missing & -missing
            i = base + low.bit_length() - 1
            if i >= size:
                return
            yield i
            missing ^= low
    yield from range(len(words) * 64, size)  # trailing all-clear words are not stored


def covers(cumulative: TxnPosition, entry: Position, batch_index: int) -> bool:
    """Return True if a cumulative ack at ``cumulative`` covers message (entry, batch_index).

    Every earlier entry, and in its own entry: all of it, or for a message
    in a batch the indexes up to its own (the rest of the batch is not acked).
    """
    at = cumulative.position
    if entry != at:
        return entry < at
    return cumulative.batch_size <= 1 or batch_index <= cumulative.batch_index


#: A batch index above any batch's: "the whole entry" in :func:`covers`.
_WHOLE_ENTRY = 1 << 62


def _conflict(txn: TxnID, pos: TxnPosition, why: str) -> TransactionConflictError:
    where = f"({pos.ledger_id}:{pos.entry_id}"
    where += f", batch index {pos.batch_index} of {pos.batch_size})" if pos.batch_size > 1 else ")"
    return TransactionConflictError(
        f"transaction {txn} cannot acknowledge message {where}: {why}",
        txn_id=txn,
        position=(pos.ledger_id, pos.entry_id, pos.batch_index),
    )


def encode_ack(txn: TxnID, cumulative: bool, positions: Sequence[TxnPosition]) -> bytes:
    """Return an ACK ``PendingAckMetadataEntry`` (ack sets: bit 1 = still present)."""
    e = PendingAckMetadataEntry(
        pending_ack_op=ACK,
        ack_type=Cumulative if cumulative else Individual,
        txnid_least_bits=txn.least_bits,
        txnid_most_bits=txn.most_bits,
    )
    for p in positions:
        md = e.pending_ack_metadata.add(ledgerId=p.ledger_id, entryId=p.entry_id)
        if p.batch_size > 1:
            acked = AckSet(p.batch_size)
            for i in range(p.batch_index + 1) if cumulative else (p.batch_index,):
                acked.clear(i)
            md.batch_size = p.batch_size
            md.ack_set.extend(acked.to_words())
    return e.SerializeToString()


def encode_end(txn: TxnID, commit: bool) -> bytes:
    """Return a COMMIT or ABORT ``PendingAckMetadataEntry``."""
    return PendingAckMetadataEntry(
        pending_ack_op=COMMIT if commit else ABORT,
        txnid_least_bits=txn.least_bits,
        txnid_most_bits=txn.most_bits,
    ).SerializeToString()


def parse_record(data: bytes, pos: TxnPosition, log: str) -> PendingAckMetadataEntry:
    """Decode the pending-ack log record at ``pos`` (``log`` names the log in errors)."""
    e = PendingAckMetadataEntry()
    try:
        e.ParseFromString(data)
    except Exception as exc:
        raise CorruptEntryError(
            f"pending-ack log {log}: record at {pos!r} is not a PendingAckMetadataEntry ({exc})",
            position=(pos.ledger_id, pos.entry_id),
        ) from None
    return e


class LogFold:
    """What a pending-ack log's live records say (:func:`fold_log`)."""

    __slots__ = ("aborted", "committed", "pending", "records")

    def __init__(self) -> None:
        #: Transactions with ACK records and no end: what each holds.
        self.pending: dict[TxnID, TxnAcks] = {}
        #: Live COMMIT records, in log order: the transaction and the acks it
        #: held then (to apply again). A transaction may have more than one
        #: (a retried end whose first write reported failure yet reached the disk).
        self.committed: list[tuple[TxnID, TxnAcks]] = []
        #: Live ABORT records, in log order: the transaction and its dropped acks.
        self.aborted: list[tuple[TxnID, TxnAcks]] = []
        #: Live records read.
        self.records = 0


def _recorded_position(ledger: int, entry: int, size: int, words: list[int]) -> TxnPosition:
    # A logged cumulative position: for a batch, its highest acked index.
    if size <= 1 or not words:
        return TxnPosition(ledger, entry)
    highest = max(absent_indexes(AckSet.from_words(words, size), size), default=0)
    return TxnPosition(ledger, entry, size, highest)


def _hold_recorded(acks: TxnAcks, ledger: int, entry_id: int, size: int, words: list[int]) -> None:
    # A logged individual ack: the whole entry, or the indexes its ack set clears
    # (merged with what the transaction's earlier records acked of the batch).
    entry = Position(ledger, entry_id)
    if size <= 1:
        acks.individual[entry] = (1, None)
        return
    logged = AckSet.from_words(words, size) if words else AckSet(size)
    mine = acks.individual.get(entry)
    if mine is not None and mine[1] is not None:
        logged.and_(mine[1])
    acks.individual[entry] = (size, logged)


def fold_log(live: Iterable[tuple[TxnPosition, bytes]], log: str) -> LogFold:
    """Fold a pending-ack log's live records into what each transaction holds.

    The one reading of the log, for recovery and for the admin's views of a
    directory: an ACK record adds to its transaction's acks (a later
    cumulative ack replaces the earlier one; individual acks of one batch
    merge), COMMIT or ABORT ends the transaction with what it held.
    ``log`` names the log in errors (a record that does not parse raises
    :class:`~txnstream.errors.CorruptEntryError`).
    """
    fold = LogFold()
    found = fold.pending
    for pos, data in live:
        fold.records += 1
        e = parse_record(data, pos, log)
        txn = TxnID(e.txnid_most_bits, e.txnid_least_bits)
        if e.pending_ack_op == ACK:
            acks = found.setdefault(txn, TxnAcks())
            acks.records.append(pos)
            cumulative = e.ack_type == Cumulative
            for md in e.pending_ack_metadata:
                size = md.batch_size if md.HasField("batch_size") else 1
                words = list(md.ack_set)
                if cumulative:
                    acks.cumulative = _recorded_position(md.ledgerId, md.entryId, size, words)
                else:
                    _hold_recorded(acks, md.ledgerId, md.entryId, size, words)
        elif e.pending_ack_op in (COMMIT, ABORT):
            ended = found.pop(txn, None) or TxnAcks()
            ended.records.append(pos)
            (fold.committed if e.pending_ack_op == COMMIT else fold.aborted).append((txn, ended))
    return fold


class PendingAckStore:
    """Pending transactional acks of one subscription, their log and their conflicts.

    ``writer`` writes to the log ``log_ml`` (whose cursor
    :data:`LOG_CURSOR` deletes ended transactions' records); ``acks`` is the
    subscription's cursor. Thread-safe.
    """

    def __init__(
        self,
        partition: str,
        subscription: str,
        acks: CursorAcks,
        log_ml: ManagedLedger,
        writer: BufferedWriter,
        outcomes: TxnOutcomes,
        *,
        on_end: EndHook | None = None,
    ) -> None:
        self.partition = partition
        self.subscription = subscription
        self.acks = acks
        self.log_ml = log_ml
        self.writer = writer
        self._log_cursor: Cursor = log_ml.open_cursor(LOG_CURSOR)
        self._outcomes = outcomes
        self.on_end = on_end
        #: Held around an abort's release and its ``on_end`` call: the lock the
        #: subscription dispatches under (taken before this store's own lock).
        self.end_guard: AbstractContextManager[Any] = contextlib.nullcontext()
        self._lock = threading.Lock()
        self._txns: dict[TxnID, TxnAcks] = {}
        # entry -> holder: a TxnID (whole entry) or {txn: acked ack set} (batch indexes)
        self._held: dict[Position, TxnID | dict[TxnID, AckSet]] = {}
        self._cumulative: tuple[TxnID, TxnPosition] | None = None
        self._ending: dict[TxnID, tuple[bool, Future[TxnPosition]]] = {}
        # Committed here (its COMMIT record, the last of its records, is
        # durable) but the acks are not on the cursor yet (applying them
        # failed): the messages stay held and the records stay, and every
        # later end or sweep applies them again -- never asking the
        # coordinator, which may have forgotten the transaction (and would
        # then call it aborted).
        self._unapplied: set[TxnID] = set()
        self._ended: set[TxnID] = set()
        self._ended_mark = 64
        # Log records to delete: after the next cursor flush / at once.
        self._trim_after_flush: list[TxnPosition] = []
        self._trim_now: list[TxnPosition] = []
        self.counts = {"acks": 0, "commits": 0, "aborts": 0, "conflicts": 0, "trimmed": 0}

    # ------------------------------------------------------------ queries

    def is_held(self, pos: Position, batch_index: int = 0) -> bool:
        """Return True if the message is held by a transaction (not to be dispatched)."""
        with self._lock:
            return self._holder_locked(pos, batch_index) is not None

    def holder(self, pos: TxnPosition) -> TxnID | None:
        """Return the transaction holding the message at ``pos``, if any."""
        with self._lock:
            return self._holder_locked(pos.position, pos.batch_index)

    def _holder_locked(self, entry: Position, batch_index: int) -> TxnID | None:
        h = self._held.get(entry)
        if isinstance(h, TxnID):
            return h
        if h is not None:
            for t, s in h.items():
                if not s.get(batch_index):
                    return t
        cum = self._cumulative
        if cum is not None and covers(cum[1], entry, batch_index):
            return cum[0]
        return None

    def ack_outside(self, positions: Sequence[TxnPosition]) -> None:
        """Acknowledge messages outside any transaction, unless a transaction holds one.

        An unbatched id of a batched entry acknowledges the whole entry, so
        it conflicts with a transaction holding any message of it. The check
        and the cursor update happen under the store's lock, so a
        transaction cannot take one of them in between.
        """
        with self._lock:
            for p in positions:
                if p.batch_size <= 1:
                    holder = self._entry_holder_locked(p.position)
                else:
                    holder = self._holder_locked(p.position, p.batch_index)
                if holder is not None:
                    raise TransactionConflictError(
                        f"message ({p.ledger_id}:{p.entry_id}:{p.batch_index}) of "
                        f"{self.partition} is held by transaction {holder}; it cannot be "
                        "acknowledged outside it",
                        txn_id=holder,
                    )
            self.acks.individual(positions)

    def _entry_holder_locked(self, entry: Position) -> TxnID | None:
        # A transaction holding any message of the entry (any batch index).
        h = self._held.get(entry)
        if isinstance(h, TxnID):
            return h
        if h:
            return next(iter(h))
        cum = self._cumulative
        if cum is not None and covers(cum[1], entry, 0):
            return cum[0]
        return None

    def ack_cumulative_outside(self, position: TxnPosition) -> None:
        """Acknowledge up to ``position`` outside any transaction, unless one holds any of it."""
        entry = position.position
        with self._lock:
            cum = self._cumulative
            # A transaction's cumulative ack holds every message from the
            # mark-delete position to its own: any effective cumulative ack
            # takes some of them.
            if cum is not None and not self.acks.at_or_below_mark_delete(entry):
                raise TransactionConflictError(
                    f"transaction {cum[0]} holds a cumulative ack up to {cum[1]!r} on "
                    f"{self.partition}; a cumulative ack up to {position!r} outside it "
                    "would take messages it holds",
                    txn_id=cum[0],
                )
            holder = self._held_through_locked(position, None)
            if holder is not None:
                raise TransactionConflictError(
                    f"transaction {holder} holds a message at or below {position!r} on "
                    f"{self.partition}",
                    txn_id=holder,
                )
            self.acks.cumulative(position)

    def _held_through_locked(self, p: TxnPosition, txn: TxnID | None) -> TxnID | None:
        # A transaction other than ``txn`` individually holding a message that a
        # cumulative ack up to ``p`` covers: every earlier entry and, in ``p``'s
        # own entry, the whole entry or (for a batch) the indexes up to its own.
        for pos, h in self._held.items():
            if pos > p.position:
                continue
            if isinstance(h, TxnID):
                if h != txn:
                    return h
                continue
            for t, acked in h.items():
                if t != txn and (
                    pos < p.position
                    or p.batch_size <= 1
                    or any(i <= p.batch_index for i in absent_indexes(acked, p.batch_size))
                ):
                    return t
        return None

    def holds_any(self) -> bool:
        """Return True if any transaction holds a message here (a cheap check before dispatch)."""
        return bool(self._held) or self._cumulative is not None

    def transactions(self) -> list[TxnID]:
        """Transactions holding acks here."""
        with self._lock:
            return list(self._txns)

    # ------------------------------------------------------------ acks

    def _check_live(self, txn: TxnID) -> None:
        # Under the lock: refuse work of a transaction that ended.
        if txn in self._ended or txn in self._ending or txn in self._unapplied:
            raise InvalidTxnStatusError(
                f"transaction {txn} has ended on subscription {self.subscription}",
                txn_id=txn,
            )
        if txn not in self._txns and txn.least_bits <= self._outcomes.low_water_mark(txn.most_bits):
            raise InvalidTxnStatusError(
                f"transaction {txn} has ended (at or below its coordinator's low water mark)",
                txn_id=txn,
            )

    def ack(
        self, txn: TxnID, positions: Sequence[TxnPosition], cumulative: bool = False
    ) -> Future[TxnPosition]:
        """Hold ``positions`` for ``txn`` and log the ACK record (its durability future).

        Conflicts raise before anything changes. ``cumulative`` takes
        exactly one position.
        """
        with self._lock:
            self._check_locked(txn, positions, cumulative)
            record = encode_ack(txn, cumulative, positions)
            fut = self.writer.write(record)
            acks = self._txns.get(txn)
            if acks is None:
                acks = self._txns[txn] = TxnAcks()
            if cumulative:
                acks.cumulative = positions[0]
                self._cumulative = (txn, positions[0])
            else:
                self._hold(txn, acks, positions)
            self.counts["acks"] += len(positions)
        fut.add_done_callback(functools.partial(self._ack_logged, txn))
        return fut

    def check(self, txn: TxnID, positions: Sequence[TxnPosition], cumulative: bool = False) -> None:
        """Raise what :meth:`ack` would raise for these acks, changing nothing."""
        with self._lock:
            self._check_locked(txn, positions, cumulative)

    def _check_locked(self, txn: TxnID, positions: Sequence[TxnPosition], cumulative: bool) -> None:
        if cumulative and len(positions) != 1:
            raise _conflict(txn, positions[0], "a cumulative ack takes exactly one message id")
        self._check_live(txn)
        try:
            if cumulative:
                self._check_cumulative(txn, positions[0])
            else:
                self._check_individual(txn, positions)
        except TransactionConflictError:
            self.counts["conflicts"] += 1
            raise

    def _check_individual(self, txn: TxnID, positions: Sequence[TxnPosition]) -> None:
        seen: set[tuple[int, int, int]] = set()
        cum = self._cumulative
        for p in positions:
            key = (p.ledger_id, p.entry_id, p.batch_index)
            if key in seen:
                raise _conflict(txn, p, "it is given twice in one ack")
            seen.add(key)
            if self.acks.is_acked(p):
                raise _conflict(txn, p, "it was already acknowledged")
            if cum is not None and cum[0] != txn and covers(cum[1], p.position, p.batch_index):
                raise _conflict(txn, p, f"transaction {cum[0]} holds it by a cumulative ack")
            h = self._held.get(p.position)
            if h is None:
                continue
            if isinstance(h, TxnID) or p.batch_size <= 1:
                holder = h if isinstance(h, TxnID) else next(iter(h))
                raise _conflict(txn, p, f"it is in pending ack status (transaction {holder})")
            for t, acked in h.items():
                if acked.batch_size != p.batch_size:
                    raise _conflict(txn, p, f"batch size differs from {acked.batch_size}")
                if not acked.get(p.batch_index):
                    raise _conflict(txn, p, f"its batch index is held by transaction {t}")

    def _check_cumulative(self, txn: TxnID, p: TxnPosition) -> None:
        if self.acks.at_or_below_mark_delete(p.position):
            raise _conflict(txn, p, "it is at or below the subscription's mark-delete position")
        cum = self._cumulative
        if cum is not None and cum[0] != txn:
            raise _conflict(txn, p, f"transaction {cum[0]} holds the cumulative ack")
        # Moving its own cumulative ack forward is allowed, also within one
        # batched entry (an unbatched id stands for the whole entry).
        whole = p.batch_index if p.batch_size > 1 else _WHOLE_ENTRY
        if cum is not None and covers(cum[1], p.position, whole):
            raise _conflict(txn, p, f"it is at or below this transaction's {cum[1]!r}")
        other = self._held_through_locked(p, txn)
        if other is not None:
            raise _conflict(txn, p, f"transaction {other} holds a message below it")

    def _hold(self, txn: TxnID, acks: TxnAcks, positions: Sequence[TxnPosition]) -> None:
        # Under the lock, after the checks.
        for p in positions:
            entry = p.position
            if p.batch_size <= 1:
                self._held[entry] = txn
                acks.individual[entry] = (1, None)
                continue
            mine = acks.individual.get(entry)
            acked = mine[1] if mine is not None and mine[1] is not None else AckSet(p.batch_size)
            acked.clear(p.batch_index)
            acks.individual[entry] = (p.batch_size, acked)
            h = self._held.get(entry)
            if not isinstance(h, dict):
                h = self._held[entry] = {}
            h[txn] = acked

    def _ack_logged(self, txn: TxnID, fut: Future[TxnPosition]) -> None:
        if fut.exception() is not None:
            return  # the client's commit sees the failure and aborts
        pos = fut.result()
        with self._lock:
            acks = self._txns.get(txn)
            if acks is not None and txn not in self._ended:
                acks.records.append(pos)
            else:
                self._trim_after_flush.append(pos)  # the end came first: drop it later

    # ------------------------------------------------------------ ends

    def end(self, txn_id: TxnID, commit: bool) -> Future[TxnPosition] | None:
        """Commit or abort ``txn_id`` here (the coordinator's Participant call).

        None if it holds nothing here, else the COMMIT/ABORT record's
        future; the acks are applied (or released) before that future's
        later callbacks run. Idempotent. A commit whose acks could not be
        applied yet is applied again (no new record); aborting it raises
        :class:`~txnstream.errors.InvalidTxnStatusError`.
        """
        with self._lock:
            busy = self._ending.get(txn_id)
            if busy is not None:
                if busy[0] != commit:
                    raise InvalidTxnStatusError(
                        f"transaction {txn_id} is already ending the other way on "
                        f"subscription {self.subscription}",
                        txn_id=txn_id,
                    )
                return busy[1]
            if txn_id not in self._txns:
                self._remember_ended(txn_id)
                return None
            unapplied = txn_id in self._unapplied
            if unapplied:
                if not commit:
                    raise InvalidTxnStatusError(
                        f"transaction {txn_id} committed on subscription {self.subscription} "
                        "(its acks are still being applied); it cannot abort",
                        txn_id=txn_id,
                    )
                fut: Future[TxnPosition] = Future()
                fut.set_result(self._txns[txn_id].records[-1])  # its COMMIT record
            else:
                fut = self.writer.write(encode_end(txn_id, commit))
            self._ending[txn_id] = (commit, fut)
        if unapplied:
            self._end_logged(txn_id, True, fut)  # applied before anyone sees the future
        else:
            fut.add_done_callback(functools.partial(self._end_logged, txn_id, commit))
        return fut

    def _end_logged(self, txn: TxnID, commit: bool, fut: Future[TxnPosition]) -> None:
        if fut.exception() is not None:
            with self._lock:
                self._ending.pop(txn, None)
            return  # the coordinator retries
        with self._lock:
            # Ending: no ack of this transaction is taken any more, so what it
            # holds does not change; only its ACK records' positions may arrive.
            acks = self._txns.get(txn) or TxnAcks()
        messages = acks.messages()
        # A commit's acks reach the cursor BEFORE the messages are released (so
        # no other transaction can take one in between) and before its records
        # may be trimmed (a trim flushes the cursor first: it must hold them).
        if commit and not self._apply(acks, messages):
            # The cursor does not hold them: the messages stay held (nobody
            # takes or is sent them) and the records stay, the COMMIT one too;
            # the next end of it (the orphan sweep, or recovery at the next
            # open) applies them.
            with self._lock:
                self._ending.pop(txn, None)
                if txn not in self._unapplied:
                    acks.records.append(fut.result())  # last: see _unapplied
                    self._unapplied.add(txn)
            return
        if commit and self.on_end is not None:
            # Still held: the subscription forgets them (its read-ahead buffer
            # too) before a release could let them be dispatched again.
            self.on_end(txn, commit, messages, acks.cumulative)
        # An abort's release and the hook are one step for the subscription
        # (``end_guard``): between them a receiver could take a released message
        # from the read-ahead buffer, and the hook, finding it delivered, would
        # deliver it again.
        with self.end_guard if not commit else contextlib.nullcontext():
            with self._lock:
                self._ending.pop(txn, None)
                self._release(txn)
                self._remember_ended(txn)
                if txn in self._unapplied:  # its COMMIT record is among them already
                    self._unapplied.discard(txn)
                    records = list(acks.records)
                else:
                    records = [*acks.records, fut.result()]
                if commit:
                    self._trim_after_flush.extend(records)
                    self.counts["commits"] += 1
                else:
                    self._trim_now.extend(records)
                    self.counts["aborts"] += 1
            if not commit and self.on_end is not None:
                # Released first: the subscription delivers them again.
                self.on_end(txn, commit, messages, acks.cumulative)

    def _release(self, txn: TxnID) -> TxnAcks:
        # Under the lock: forget what ``txn`` holds.
        acks = self._txns.pop(txn, None) or TxnAcks()
        for entry in acks.individual:
            h = self._held.get(entry)
            if isinstance(h, dict):
                h.pop(txn, None)
                if not h:
                    del self._held[entry]
            elif h == txn:
                del self._held[entry]
        if self._cumulative is not None and self._cumulative[0] == txn:
            self._cumulative = None
        return acks

    def _apply(self, acks: TxnAcks, messages: list[TxnPosition]) -> bool:
        # A commit's acks to the cursor; False if that failed: then its log
        # records are kept (not trimmed), and recovery applies them again.
        try:
            self.acks.individual(messages)
            if acks.cumulative is not None:
                self.acks.cumulative(acks.cumulative)
        except Exception:
            log.exception(
                "%s/%s: applying committed acks failed; their records stay in the log",
                self.partition,
                self.subscription,
            )
            return False
        return True

    def _remember_ended(self, txn: TxnID) -> None:
        self._ended.add(txn)
        if len(self._ended) > self._ended_mark:
            for t in list(self._ended):
                if t.least_bits <= self._outcomes.low_water_mark(t.most_bits):
                    self._ended.discard(t)
            self._ended_mark = max(64, 2 * len(self._ended))

    # ------------------------------------------------------------ the log

    def trim(self) -> int:
        """Delete the log records of ended transactions; return how many.

        Records of commits go only after the cursor (holding their acks) is
        flushed durably, so a crash in between replays and re-applies them.
        """
        with self._lock:
            after_flush, self._trim_after_flush = self._trim_after_flush, []
            now, self._trim_now = self._trim_now, []
        try:
            if after_flush:
                self.acks.flush()
            todo = now + after_flush
            if todo:
                self._log_cursor.delete(todo)
        except Exception:
            with self._lock:  # try again next time
                self._trim_after_flush.extend(after_flush)
                self._trim_now.extend(now)
            raise
        self.counts["trimmed"] += len(todo)
        return len(todo)

    def pending_trim(self) -> int:
        """Return how many records wait for :meth:`trim`."""
        with self._lock:
            return len(self._trim_after_flush) + len(self._trim_now)

    def recover(self) -> dict[str, int]:
        """Replay the live log records (before any use): rebuild what is held.

        COMMIT applies a transaction's acks again, ABORT drops them (both
        are trimmed); transactions with only ACK records hold their
        messages again (:func:`fold_log`). Returns counts.
        """
        fold = fold_log(
            replay(self.log_ml, self._log_cursor), f"of {self.partition}/{self.subscription}"
        )
        unapplied: dict[TxnID, TxnAcks] = {}
        for txn, ended in fold.committed:
            if self._apply(ended, ended.messages()):
                self._ended.add(txn)
                self._trim_after_flush.extend(ended.records)
            else:
                # Committed, and the cursor refused its acks again: held as
                # at run time (its records stay, the COMMIT one last), and
                # the next end or sweep applies it (see _unapplied).
                unapplied[txn] = ended
        for txn, ended in fold.aborted:
            self._trim_now.extend(ended.records)
            self._ended.add(txn)
        with self._lock:
            for txn, acks in [*fold.pending.items(), *unapplied.items()]:
                self._txns[txn] = acks
                for entry, (_size, acked) in acks.individual.items():
                    if acked is None:
                        self._held[entry] = txn
                    else:
                        h = self._held.get(entry)
                        if not isinstance(h, dict):
                            h = self._held[entry] = {}
                        h[txn] = acked
                if acks.cumulative is not None:
                    self._cumulative = (txn, acks.cumulative)
            self._unapplied.update(unapplied)
        return {
            "records": fold.records,
            "pending": len(fold.pending),
            "committed": len(fold.committed),
        }

    def reconcile(self, only: Collection[TxnID] | None = None) -> list[Future[TxnPosition]]:
        """End every held transaction its coordinator decided or forgot (after :meth:`recover`).

        ``only``: ask about these (those still held) instead of all.
        """
        futures: list[Future[TxnPosition]] = []
        for txn in self.transactions():
            if only is not None and txn not in only:
                continue
            with self._lock:
                committed = txn in self._unapplied
            outcome = committed or resolve_outcome(
                self._outcomes, txn, f"{self.partition}/{self.subscription}"
            )
            if outcome is None:
                continue
            fut = self.end(txn, outcome)
            if fut is not None:
                futures.append(fut)
        return futures

    def stats(self) -> dict[str, int]:
        """Counters plus held messages and transactions."""
        with self._lock:
            out = dict(self.counts)
            out["transactions"] = len(self._txns)
            out["held_entries"] = len(self._held)
            out["pending_trim"] = len(self._trim_after_flush) + len(self._trim_now)
        return out

    def close(self) -> None:
        """Write what is batched, then close the writer; the broker closes the log.

        A clean close makes the ACK and end records written before it
        durable (up to :data:`CLOSE_FLUSH_MS`); later ones fail.
        """
        self.writer.flush()
        if not self.writer.wait_idle(CLOSE_FLUSH_MS):
            log.warning(
                "%s/%s: pending-ack records still in flight at close fail",
                self.partition,
                self.subscription,
            )
        self.writer.close()


__all__ = [
    "LOG_CURSOR",
    "EndHook",
    "PendingAckStore",
    "absent_indexes",
    "encode_ack",
    "encode_end",
    "parse_record",
]
