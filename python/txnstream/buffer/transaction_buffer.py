"""The transaction buffer of one topic partition (SPEC §1, §4.5; Pulsar's TopicTransactionBuffer).

Transactional messages go into the partition's own managed ledger, tagged
with their TxnID (the *marker approach*); ending a transaction appends a
COMMIT or ABORT marker (Pulsar ``MarkerType`` 21/22). The buffer keeps, in
memory:

- ``ongoing``: TxnID -> position of its FIRST message here, in the order
  their first messages were appended (so the first one is the oldest);
  ``None`` while that message's position is not assigned yet;
- ``aborted``: ``(most, least)`` -> position of its ABORT marker;
- ``max_read_position``: READ_COMMITTED readers read only entries before
  the first message of the oldest ongoing transaction, or everything
  durable when none is ongoing. Internally this is :attr:`read_limit`, an
  *exclusive* bound (``Position``), which needs no "position just before"
  arithmetic across ledgers.

**Ordering.** A transaction's first message is registered and submitted to
the ledger under :attr:`lock`, so registration order is journal order. Until
its position is assigned, the read limit stays at the end of what was
durable when it was registered (a safe lower bound: its position is after
every entry durable then). Non-transactional entries raise the limit only
when no transaction is ongoing before them (:meth:`durable`).

**Late work.** An append of a transaction with ``least_bits <= LWM`` of its
coordinator, or of one already ended here, is refused
(:class:`~txnstream.errors.InvalidTxnStatusError`): it could only become a
leftover that pins the partition. Ended transactions above the LWM are
remembered until the LWM passes them.

**Snapshots.** :meth:`fill_snapshot` writes Pulsar's
``TransactionBufferSnapshot`` fields: ``max_read_position`` and the aborted
transactions with their marker positions. Every transaction with a message
before ``max_read_position`` has ended (that is what the position means),
and its end, if an abort, is in the aborted list or after the position. So
**recovery** (:meth:`recover`) starts from the newest snapshot and replays
the ledger only after ``max_read_position``, rebuilding ``ongoing`` and the
rest of ``aborted``; aborted transactions whose ABORT marker was trimmed
away leave the set. A snapshot that does not fit the ledger (another
topic's, or a position past the log's end) is not used: the whole ledger is
replayed. The broker decides when snapshots are written (every
``transactionBufferSnapshotMaxTransactionCount`` :attr:`changes`, every
``transactionBufferSnapshotMinTimeInMillis``, on close) and where (the
namespace's snapshot topic). :meth:`reconcile` then
asks the coordinator about every ongoing transaction: decided or remembered
commit -> COMMIT marker; abort, or unknown (an id nobody will end) -> ABORT
marker; still open -> it stays ongoing until its own end. So no partition
stays pinned by a transaction nobody will end (apache/pulsar#19200).

:meth:`end` is the coordinator's :class:`~txnstream.coordinator.Participant`
call: idempotent; a transaction with nothing here ends at once.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Collection
from concurrent.futures import Future
from typing import Protocol

from txnstream._native import ManagedLedger, Position, encode_marker, scan_topic
from txnstream.coordinator import TxnID
from txnstream.errors import AlreadyClosedError, CoordinatorNotFound, InvalidTxnStatusError
from txnstream.proto import AbortTxnMetadata, TransactionBufferSnapshot

log = logging.getLogger(__name__)

#: Entries read per call while replaying a partition.
REPLAY_CHUNK = 4096
#: Marker types (Pulsar ``PulsarMarkers.proto``).
TXN_COMMIT = 21
TXN_ABORT = 22

TxnKey = tuple[int, int]
#: Called after an ABORT marker is durable (the tiered aborted-txn index):
#: ``(txn, first position here, marker position, read limit before the abort)``.
AbortHook = Callable[[TxnKey, Position, Position, Position], None]
#: Called for every non-marker entry during replay (deduplication state):
#: ``(position, producer_name, sequence_ids, txn or None)``.
EntryHook = Callable[[Position, str, list[int], TxnKey | None], None]


class TxnOutcomes(Protocol):
    """What a participant asks the coordinators (the broker provides it)."""

    def low_water_mark(self, tc_id: int) -> int:
        """Every transaction of coordinator ``tc_id`` with ``least_bits <=`` it has ended."""

    def participant_outcome(self, txn_id: TxnID) -> bool | None:
        """Return True to commit it, False to abort it, None while it is open."""


def resolve_outcome(outcomes: TxnOutcomes, txn: TxnID, where: str) -> bool | None:
    """Ask how a participant must end ``txn`` at recovery; None when it cannot be told.

    A coordinator not served here (:class:`CoordinatorNotFound`) will never
    end it: abort (False), as for an id its coordinator does not know. Any
    other failure to ask (a read error, a closing broker) leaves the
    transaction as it is (None): aborting on a guess could tear a
    transaction its coordinator committed; its coordinator's own end, or
    the next open, resolves it.
    """
    try:
        return outcomes.participant_outcome(txn)
    except CoordinatorNotFound as exc:
        log.warning("%s: transaction %s has no coordinator here, aborting it: %s", where, txn, exc)
        return False
    except Exception as exc:
        log.warning("%s: cannot resolve transaction %s now, left as it is: %r", where, txn, exc)
        return None


def after(pos: Position) -> Position:
    """Return the exclusive bound that admits ``pos`` and everything before it."""
    return Position(pos.ledger_id, pos.entry_id + 1)


def snapshot_covers(snap: TransactionBufferSnapshot) -> Position | None:
    """Return the position ``snap`` covers the ledger up to (recovery replays what follows).

    That is its ``max_read_position``; None when it has none (it covers
    nothing: replay starts at the beginning). Raises :class:`ValueError`
    for half a position.
    """
    has_l = snap.HasField("max_read_position_ledgerId")
    if has_l != snap.HasField("max_read_position_entryId"):
        raise ValueError("it has half a max_read_position")
    if not has_l:
        return None
    return Position(snap.max_read_position_ledgerId, snap.max_read_position_entryId)


class TransactionBuffer:
    """Per-partition transaction state: ongoing and aborted transactions, read limits.

    Thread-safe. ``on_change`` is called (without the lock held) whenever
    the read limits may have moved, so readers waiting for data wake up.
    """

    def __init__(
        self,
        partition: str,
        ml: ManagedLedger,
        outcomes: TxnOutcomes,
        *,
        on_change: Callable[[], None] = lambda: None,
        wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
        on_abort: AbortHook | None = None,
    ) -> None:
        self.partition = partition
        self._on_abort = on_abort
        self.lock = threading.Lock()
        self._ml = ml
        self._outcomes = outcomes
        self._on_change = on_change
        self._wall_ms = wall_ms
        self.ongoing: dict[TxnID, Position | None] = {}
        # Exclusive read limit of a transaction whose first position is pending.
        self._fences: dict[TxnID, Position | None] = {}
        self.aborted: dict[TxnKey, Position] = {}
        self._ended: set[TxnID] = set()
        self._ended_mark = 64
        self._ending: dict[TxnID, tuple[bool, Future[Position]]] = {}
        self._last_durable: Position | None = ml.last_position
        self._limit: Position | None = None
        self.markers_written = 0
        self.rejected_appends = 0
        #: Entries and markers made durable since the last snapshot (under :attr:`lock`).
        self.changes = 0
        #: Wall-clock ms of the last snapshot written (or recovered from); 0: none.
        self.snapshot_time_ms = 0
        #: Wall-clock ms the time trigger counts from: the last snapshot, or the load.
        self.snapshot_base_ms = wall_ms()
        self.snapshots_written = 0
        #: Aborted transactions of the snapshot recovered from whose marker was trimmed.
        self.trimmed_aborts: list[TxnKey] = []
        self._recompute()

    # ------------------------------------------------------------ limits

    def _recompute(self) -> None:
        # Under the lock (or before sharing): the READ_COMMITTED limit.
        end = None if self._last_durable is None else after(self._last_durable)
        limit = end
        for txn, first in self.ongoing.items():
            bound = first if first is not None else self._fences.get(txn)
            if bound is None or limit is None:
                limit = None
            elif bound < limit:
                limit = bound
            break  # the oldest ongoing transaction bounds everything after it
        self._limit = limit

    @property
    def read_limit(self) -> Position | None:
        """READ_COMMITTED: entries at positions below it may be read (None: nothing)."""
        return self._limit

    @property
    def uncommitted_limit(self) -> Position | None:
        """READ_UNCOMMITTED: every durable entry (exclusive bound; None: nothing)."""
        last = self._last_durable
        return None if last is None else after(last)

    @property
    def max_read_position(self) -> Position | None:
        """Pulsar's ``maxReadPosition``: the last entry READ_COMMITTED readers may read.

        None when nothing is readable. (A read limit at entry 0 of a ledger
        means "everything before this ledger"; it is reported as that
        ledger's position ``(ledger, -1)`` would be, i.e. the previous entry
        is found through the ledger's listing.)
        """
        limit = self._limit
        if limit is None:
            return None
        if limit.entry_id > 0:
            return Position(limit.ledger_id, limit.entry_id - 1)
        before = [(lid, n) for lid, n, _ in self._ml.ledgers() if lid < limit.ledger_id and n > 0]
        return Position(before[-1][0], before[-1][1] - 1) if before else None

    def lag(self) -> int:
        """Entries at or after the READ_COMMITTED limit up to the durable end (SPEC §4.10)."""
        with self.lock:
            limit, last = self._limit, self._last_durable
        if last is None:
            return 0
        total = 0
        for lid, n, _ in self._ml.ledgers():
            if limit is None or lid > limit.ledger_id:
                total += n
            elif lid == limit.ledger_id:
                total += max(0, n - limit.entry_id)
        return total

    def settled(self) -> bool:
        """Under :attr:`lock`: True when no marker is being written and every write is seen.

        The ledger's last entry is the last one this buffer saw become
        durable: no append of the partition is waiting for its callback.
        """
        return not self._ending and self._ml.last_position == self._last_durable

    def fences_ended(self) -> bool:
        """Under :attr:`lock`: True while an ended transaction's late sends are refused here only.

        Those above their coordinator's low-water mark are refused by
        :meth:`check_append`'s memory of them, which no snapshot keeps: a
        reload would let a late send of one in (open again here, holding
        READ_COMMITTED readers until the orphan sweep).
        """
        return bool(self._above_lwm(self._ended))

    def _above_lwm(self, txns: set[TxnID]) -> list[TxnID]:
        # Under the lock: those of ``txns`` above their coordinator's
        # low-water mark (one lookup per coordinator).
        lwm: dict[int, int] = {}
        out = []
        for t in txns:
            mark = lwm.get(t.most_bits)
            if mark is None:
                mark = lwm[t.most_bits] = self._outcomes.low_water_mark(t.most_bits)
            if t.least_bits > mark:
                out.append(t)
        return out

    def is_aborted(self, txn: TxnKey) -> bool:
        """Return True if transaction ``(most, least)`` aborted here."""
        return txn in self.aborted

    # ------------------------------------------------------------ appends

    def check_append(self, txn: TxnID) -> None:
        """Under :attr:`lock`: refuse an append of an ended transaction."""
        if txn in self._ended or txn in self._ending:
            self.rejected_appends += 1
            raise InvalidTxnStatusError(
                f"transaction {txn} has ended on {self.partition}; it cannot send here",
                txn_id=txn,
            )
        if txn not in self.ongoing and txn.least_bits <= self._outcomes.low_water_mark(
            txn.most_bits
        ):
            self.rejected_appends += 1
            raise InvalidTxnStatusError(
                f"transaction {txn} has ended (at or below its coordinator's low water mark)",
                txn_id=txn,
            )

    def register(self, txn: TxnID) -> bool:
        """Under :attr:`lock`, before submitting its append: True for its first here."""
        if txn in self.ongoing:
            return False
        self.ongoing[txn] = None
        self._fences[txn] = self.uncommitted_limit
        self._recompute()
        return True

    def unregister(self, txn: TxnID) -> None:
        """Under :attr:`lock`: undo :meth:`register` (its first append was not queued)."""
        self.ongoing.pop(txn, None)
        self._fences.pop(txn, None)
        self._recompute()

    def assigned(self, txn: TxnID, fut: Future[Position]) -> None:
        """Done-callback of a first message's position: the limit can move up to it."""
        if fut.exception() is not None:
            return  # the append failed; the transaction can only abort
        pos = fut.result()
        with self.lock:
            if txn in self.ongoing and self.ongoing[txn] is None:
                self.ongoing[txn] = pos
                self._fences.pop(txn, None)
                self._recompute()
        self._on_change()

    def durable(self, pos: Position) -> None:
        """Record that the entry at ``pos`` is durable (everything before it is too)."""
        with self.lock:
            last = self._last_durable
            if last is not None and pos <= last:
                return
            self._last_durable = pos
            self.changes += 1
            self._recompute()
        self._on_change()

    def durable_cb(self, fut: Future[Position]) -> None:
        """:meth:`durable` as a done-callback of an append future."""
        if fut.exception() is None:
            self.durable(fut.result())

    # ------------------------------------------------------------ ends

    def end(self, txn_id: TxnID, commit: bool) -> Future[Position] | None:
        """Commit or abort ``txn_id`` here: write its marker (the coordinator's Participant call).

        Returns None if the transaction has nothing here (or already ended
        here), else the marker's durability future; the buffer's state
        (ongoing, aborted, read limit) is updated before that future's
        later callbacks run. Idempotent; a call while the same marker is in
        flight returns its future.
        """
        with self.lock:
            busy = self._ending.get(txn_id)
            if busy is not None:
                if busy[0] != commit:
                    raise InvalidTxnStatusError(
                        f"transaction {txn_id} is being {'committed' if busy[0] else 'aborted'} "
                        f"on {self.partition}; it cannot be {'committed' if commit else 'aborted'}",
                        txn_id=txn_id,
                    )
                return busy[1]
            if txn_id not in self.ongoing:
                self._remember_ended(txn_id)
                return None
            marker = encode_marker(commit, txn_id.most_bits, txn_id.least_bits, self._wall_ms())
            fut = self._ml.append_async(marker)
            self._ending[txn_id] = (commit, fut)
        fut.add_done_callback(functools.partial(self._marker_done, txn_id, commit))
        return fut

    def _marker_done(self, txn_id: TxnID, commit: bool, fut: Future[Position]) -> None:
        exc = fut.exception()
        with self.lock:
            self._ending.pop(txn_id, None)
            if exc is not None:
                return  # the coordinator retries; the transaction stays ongoing
            pos = fut.result()
            first = self.ongoing.pop(txn_id, None) or self._fences.get(txn_id)
            stable = self._limit
            self._fences.pop(txn_id, None)
            if not commit:
                self.aborted[(txn_id.most_bits, txn_id.least_bits)] = pos
            self._remember_ended(txn_id)
            self.markers_written += 1
            self.changes += 1
            if self._last_durable is None or pos > self._last_durable:
                self._last_durable = pos
            self._recompute()
        self._on_change()
        if not commit and self._on_abort is not None:
            # Unknown bounds are the lowest position: the index stays conservative.
            zero = Position(0, 0)
            key = (txn_id.most_bits, txn_id.least_bits)
            try:
                self._on_abort(key, first or zero, pos, min(stable or zero, pos))
            except Exception:  # derived data: checked against the markers before use
                log.exception("%s: recording aborted transaction %s", self.partition, txn_id)

    def _remember_ended(self, txn_id: TxnID) -> None:
        # Under the lock: refuse its late appends; forget what the LWM covers.
        self._ended.add(txn_id)
        if len(self._ended) > self._ended_mark:
            self._ended = set(self._above_lwm(self._ended))
            self._ended_mark = max(64, 2 * len(self._ended))

    # ------------------------------------------------------------ recovery

    def fill_snapshot(self, out: TransactionBufferSnapshot) -> Position | None:
        """Under :attr:`lock`: write this buffer's snapshot fields; return the durable end.

        Everything the snapshot says holds up to that end (the caller adds
        state of its own, e.g. deduplication, as of the same end).
        """
        out.topic_name = self.partition
        mrp = self.max_read_position
        if mrp is not None:
            out.max_read_position_ledgerId = mrp.ledger_id
            out.max_read_position_entryId = mrp.entry_id
        for (most, least), pos in self.aborted.items():
            out.abort_txn_metadata.append(
                AbortTxnMetadata(
                    txnid_most_bits=most,
                    txnid_least_bits=least,
                    ledgerId=pos.ledger_id,
                    entryId=pos.entry_id,
                )
            )
        out.snapshot_time_ms = self._wall_ms()
        return self._last_durable

    def snapshot_written(self, changes: int, time_ms: int) -> None:
        """Record that a snapshot taken when :attr:`changes` was ``changes`` is durable."""
        with self.lock:
            self.changes = max(0, self.changes - changes)
            self.snapshot_time_ms = self.snapshot_base_ms = time_ms
            self.snapshots_written += 1

    def _start_of(
        self, snap: TransactionBufferSnapshot
    ) -> tuple[Position | None, dict[TxnKey, Position], list[TxnKey]]:
        # Where replay starts after ``snap``, its aborted set, and aborts trimmed away.
        if snap.topic_name != self.partition:
            raise ValueError(f"it is the snapshot of {snap.topic_name!r}")
        start = snapshot_covers(snap)
        if start is not None:
            end = self._ml.last_position
            if end is None or start > end:
                raise ValueError(f"its max_read_position {start} is past the log's end {end}")
        first = self._ml.first_position
        aborted: dict[TxnKey, Position] = {}
        trimmed: list[TxnKey] = []
        for a in snap.abort_txn_metadata:
            pos = Position(a.ledgerId, a.entryId)
            key = (a.txnid_most_bits, a.txnid_least_bits)
            if first is None or pos < first:
                trimmed.append(key)  # its ABORT marker was trimmed away: it leaves the set
                continue
            aborted[key] = pos
        return start, aborted, trimmed

    def recover(
        self,
        on_entry: EntryHook | None = None,
        snapshot: TransactionBufferSnapshot | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> dict[str, int]:
        """Rebuild ``ongoing`` / ``aborted`` from ``snapshot`` and the ledger after it.

        Without a snapshot (or with one that does not fit: see the module
        docs) the whole ledger is replayed. ``on_entry`` sees every
        non-marker entry replayed (deduplication state). ``cancelled`` is
        asked between chunks; once true, :class:`AlreadyClosedError` stops
        the replay (a broker closing). Returns counts: entries (replayed),
        markers, committed (COMMIT markers replayed), ongoing, aborted,
        from_snapshot (0/1), aborted_trimmed.
        """
        ongoing: dict[TxnID, Position | None] = {}
        ended: set[TxnKey] = set()
        aborted: dict[TxnKey, Position] = {}
        start: Position | None = None
        from_snapshot = 0
        trimmed: list[TxnKey] = []
        if snapshot is not None:
            start, aborted, trimmed = self._start_of(snapshot)
            from_snapshot = 1
        entries = markers = committed = 0
        last = start
        last_row: Position | None = None
        while True:
            if cancelled is not None and cancelled():
                raise AlreadyClosedError(
                    f"recovery of {self.partition} cancelled (closing)", what="topic"
                )
            rows = scan_topic(self._ml, last, REPLAY_CHUNK)
            if not rows:
                break
            for lid, eid, marker, txn, producer, seqs in rows:
                pos = Position(lid, eid)
                entries += 1
                if marker is not None:
                    markers += 1
                    if txn is not None and marker in (TXN_COMMIT, TXN_ABORT):
                        ongoing.pop(TxnID(*txn), None)
                        ended.add(txn)
                        if marker == TXN_ABORT:
                            aborted[txn] = pos
                        else:
                            committed += 1
                    continue
                if txn is not None and txn not in ended:
                    key = TxnID(*txn)
                    if key not in ongoing:
                        ongoing[key] = pos
                if on_entry is not None:
                    on_entry(pos, producer, seqs, txn)
            last = last_row = Position(rows[-1][0], rows[-1][1])
        with self.lock:
            self.ongoing = ongoing
            self._fences = {}
            self.aborted = aborted
            if last_row is not None:
                self._last_durable = last_row
            self.changes = entries
            if snapshot is not None:
                self.snapshot_time_ms = snapshot.snapshot_time_ms
            self.trimmed_aborts = trimmed
            self._recompute()
        return {
            "entries": entries,
            "markers": markers,
            "committed": committed,
            "ongoing": len(ongoing),
            "aborted": len(aborted),
            "from_snapshot": from_snapshot,
            "aborted_trimmed": len(trimmed),
        }

    def reconcile(self, only: Collection[TxnID] | None = None) -> list[Future[Position]]:
        """End every ongoing transaction its coordinator has decided or forgotten.

        Returns the futures of the markers written; transactions still open
        stay ongoing (their coordinator ends them). ``only``: ask about these
        (those still ongoing) instead of all.
        """
        with self.lock:
            txns = [t for t in self.ongoing if only is None or t in only]
        futures: list[Future[Position]] = []
        for txn in txns:
            outcome = resolve_outcome(self._outcomes, txn, self.partition)
            if outcome is None:
                continue
            fut = self.end(txn, outcome)
            if fut is not None:
                futures.append(fut)
        return futures

    def forget_trimmed(self) -> list[TxnKey]:
        """Drop aborted transactions whose ABORT marker was trimmed away; return them.

        Call it holding :attr:`lock` (the partition's publish lock), and tell
        deduplication in the same hold that they aborted: a retry of one of
        their messages in between would otherwise find it neither aborted
        here nor remembered as aborted there, and get the old id back.
        """
        first = self._ml.first_position
        gone = [t for t, p in self.aborted.items() if first is None or p < first]
        for t in gone:
            del self.aborted[t]
        return gone

    def stats(self) -> dict[str, object]:
        """Ongoing/aborted counts, limits and lag (admin and metrics)."""
        with self.lock:
            out: dict[str, object] = {
                "ongoing": len(self.ongoing),
                "aborted": len(self.aborted),
                "ending": len(self._ending),
                "markers_written": self.markers_written,
                "rejected_appends": self.rejected_appends,
                "changes_since_snapshot": self.changes,
                "snapshots_written": self.snapshots_written,
                "snapshot_time_ms": self.snapshot_time_ms,
                "snapshot_age_ms": (
                    self._wall_ms() - self.snapshot_time_ms if self.snapshot_time_ms else None
                ),
                "last_durable": self._last_durable,
                "read_limit": self._limit,
            }
        out["max_read_position"] = self.max_read_position
        out["lag"] = self.lag()
        return out


__all__ = [
    "TXN_ABORT",
    "TXN_COMMIT",
    "AbortHook",
    "TransactionBuffer",
    "TxnOutcomes",
    "after",
    "resolve_outcome",
    "snapshot_covers",
]
