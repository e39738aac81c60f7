"""One topic partition (or non-partitioned topic): ledger, transaction buffer, dedup, subscriptions.

Publishing (:meth:`Topic.publish`) happens under the partition's publish
lock (the transaction buffer's lock): deduplication claims the sequence
ids, the transaction buffer registers a transaction's first message, and
the entry is queued on the ledger -- so registration order is journal
order, and a claimed sequence id is placed before anyone else looks. The
lock is held only while queueing (no I/O wait): concurrent sends share
group commits.

- A send outside a transaction returns a future that completes once the
  entry is durable (the read limits move then).
- A transactional send returns two futures: ``assigned`` (the message id,
  as soon as the journal writer placed it; the entry is neither durable nor
  readable yet) and ``durable`` (which the transaction waits for before its
  commit decision).

Opening a partition recovers it: from its newest snapshot (transaction
buffer and deduplication state, one record of the namespace's snapshot
topic) and a replay of the ledger after it -- or the whole ledger when it
has no usable snapshot -- then transactions left by an earlier run are
reconciled with their coordinators. :meth:`Topic.take_snapshot` builds the
record; the broker decides when and writes it. The hold cursor
:data:`SNAPSHOT_HOLD` keeps every ledger that replay needs: what the newest
durable snapshot does not cover (its ``max_read_position`` onwards), so
trimming after the subscriptions ack can never take a transaction's first
message or a producer's sequence ids away from a restart (Pulsar's
deduplication cursor does this for sequence ids). A subscription is
opened on first use, with its pending-ack log recovered and reconciled the
same way.
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Final, Protocol, TypeVar

from txnstream._native import HOLD_CURSOR_PREFIX, BufferedWriter, ManagedLedger, Position
from txnstream.broker.dedup import ABORTED, ENDED, OPEN, Deduplication, Sent
from txnstream.broker.subscription import ISOLATIONS, READ_COMMITTED, Subscription
from txnstream.broker.topic_name import TopicName
from txnstream.buffer import TransactionBuffer, TxnOutcomes, snapshot_covers
from txnstream.buffer.transaction_buffer import EntryHook
from txnstream.config import BrokerConfig
from txnstream.coordinator import TxnID
from txnstream.errors import AlreadyClosedError, InvalidArgumentError, OperationTimeoutError
from txnstream.pendingack import CursorAcks, PendingAckStore
from txnstream.proto import TransactionBufferSnapshot

log = logging.getLogger(__name__)
_T = TypeVar("_T")

EARLIEST = "earliest"
LATEST = "latest"
#: The cursor holding back trimming at what the newest durable snapshot covers.
SNAPSHOT_HOLD: Final = HOLD_CURSOR_PREFIX + "snapshot"


class TopicContext(Protocol):
    """What a partition needs from its broker (the broker owns ledgers and writers)."""

    config: BrokerConfig

    @property
    def outcomes(self) -> TxnOutcomes:
        """Low water marks and outcomes of transactions (the coordinators)."""

    def wall_ms(self) -> int:
        """Wall-clock milliseconds (publish times, marker times)."""

    def open_ledger(self, name: str) -> ManagedLedger:
        """Open (creating) managed ledger ``name`` of the broker's data directory."""

    def claim_pending_ack_log(self, log_name: str, topic: str, subscription: str) -> None:
        """Refuse ``subscription`` if its pending-ack log belongs to another pair (same name)."""

    def pending_ack_writer(self, ml: ManagedLedger, name: str) -> BufferedWriter:
        """Return a BufferedWriter for a pending-ack log (exported under the pending-ack prefix)."""

    def release_writer(self, name: str, writer: BufferedWriter) -> None:
        """Stop exporting a pending-ack writer's metrics."""

    def record_abort(
        self,
        partition: str,
        txn: tuple[int, int],
        first: Position,
        last: Position,
        last_stable: Position,
    ) -> None:
        """Record an aborted transaction in the partition's aborted-txn index (tiered)."""


def await_opening(opening: Future[_T], timeout_ms: int, what: str) -> _T:
    """Wait for another thread's open of ``what``; past ``timeout_ms`` a typed, retriable error."""
    try:
        return opening.result(timeout=timeout_ms / 1000.0)
    except TimeoutError as e:  # another thread's open outlasts the end timeout
        raise OperationTimeoutError(
            f"opening {what} in another thread took longer than transactionEndTimeoutMs",
            what=what,
        ) from e


@dataclass(frozen=True, slots=True)
class Publish:
    """What :meth:`Topic.publish` did: queued an entry, or found a duplicate."""

    assigned: Future[Position] | None
    durable: Future[Position] | None
    duplicate: Sent | None


class Topic:
    """One partition of the broker: thread-safe."""

    def __init__(self, name: TopicName, ml: ManagedLedger, ctx: TopicContext) -> None:
        self.name = name
        self.full = name.full
        self.ml = ml
        self._ctx = ctx
        cfg = ctx.config
        self.tb = TransactionBuffer(
            self.full,
            ml,
            ctx.outcomes,
            on_change=self._changed,
            wall_ms=ctx.wall_ms,
            on_abort=functools.partial(ctx.record_abort, self.full),
        )
        self.lock = self.tb.lock
        self.dedup = Deduplication(cfg.deduplication_window, cfg.deduplication_max_producers)
        self._dedup_on = cfg.deduplication_enabled
        # A new one starts before the first entry: nothing goes before a snapshot.
        self._hold = ml.open_cursor(SNAPSHOT_HOLD)
        self._subs: dict[str, Subscription] = {}
        # Transactions ongoing here (buffer, pending acks) at the last sweep.
        self._seen_ongoing: set[TxnID] = set()
        self._seen_held: dict[str, set[TxnID]] = {}
        self._sub_opening: dict[str, Future[Subscription]] = {}
        self._subs_lock = threading.Lock()
        self._closed = False
        self.recovery: dict[str, int] = {}
        #: Set by every :meth:`Broker.topic` lookup; the maintenance round
        #: clears it and counts the partition's idle time from then.
        self.used = True
        #: Broker-clock monotonic ms since which the maintenance round saw it idle.
        self.idle_since_ms = 0

    # ------------------------------------------------------------ recovery

    def recover(
        self,
        snapshot: TransactionBufferSnapshot | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> None:
        """Recover from ``snapshot`` (None: none) plus the ledger after it; reconcile.

        A snapshot that does not fit (another topic's, a position past the
        log, malformed deduplication state, or one without deduplication
        state while deduplication is on) is logged and the whole ledger is
        replayed instead.
        """
        if snapshot is not None:
            try:
                dedup = Deduplication(self.dedup.window, self.dedup.max_producers)
                if self._dedup_on:
                    if not snapshot.dedup_complete:
                        raise ValueError("it carries no deduplication state")
                    dedup.restore(snapshot)
                self.recovery = self.tb.recover(self._replayed(dedup), snapshot, cancelled)
                dedup.mark_aborted(self.tb.trimmed_aborts)
                self.dedup = dedup
                self.snapshot_durable(snapshot_covers(snapshot))
            except ValueError as e:
                log.warning("%s: snapshot not used (%s); replaying the whole ledger", self.full, e)
                snapshot = None
        if snapshot is None:
            dedup = Deduplication(self.dedup.window, self.dedup.max_producers)
            self.recovery = self.tb.recover(self._replayed(dedup), None, cancelled)
            self.dedup = dedup
        self.recovery["reconciled"] = len(self.tb.reconcile())

    def _replayed(self, dedup: Deduplication) -> EntryHook | None:
        if not self._dedup_on:
            return None

        def on_entry(
            pos: Position, producer: str, seqs: list[int], txn: tuple[int, int] | None
        ) -> None:
            dedup.replayed(producer, seqs, txn, pos)

        return on_entry

    def take_snapshot(self) -> tuple[bytes, int, Position | None]:
        """Return this partition's snapshot record, the change count and the position it covers.

        Built under the publish lock (a consistent cut: buffer state and
        deduplication as of the same durable end). Once the record is
        durable, pass the count to ``tb.snapshot_written`` and the position
        to :meth:`snapshot_durable`.
        """
        snap = TransactionBufferSnapshot()
        tb = self.tb
        with self.lock:
            end = tb.fill_snapshot(snap)
            if self._dedup_on:
                ongoing = ((t.most_bits, t.least_bits) for t in tb.ongoing)
                self.dedup.snapshot(end, snap, itertools.chain(tb.aborted, ongoing))
            changes = tb.changes
        return snap.SerializeToString(), changes, snapshot_covers(snap)

    def snapshot_durable(self, covered: Position | None) -> None:
        """Let trimming pass ``covered``: a durable snapshot covers the ledger up to it.

        Recovery from that snapshot replays only what follows ``covered``
        (None: the snapshot covers nothing yet).
        """
        if covered is None:
            return
        hold = self._hold
        current = hold.mark_delete_position
        if current is None or covered > current:
            hold.mark_delete(covered)

    def snapshot_due(self, now_ms: int, max_changes: int, min_time_ms: int) -> bool:
        """Return True when ``max_changes`` changes accrued, or any after ``min_time_ms``."""
        tb = self.tb
        if tb.changes >= max_changes:
            return True
        return tb.changes > 0 and now_ms - tb.snapshot_base_ms >= min_time_ms

    # ------------------------------------------------------------ publishing

    def _check_open(self) -> None:
        if self._closed:
            raise AlreadyClosedError(
                f"topic {self.full} is closed (broker closing, or unloaded while idle: "
                "broker.topic() loads it again)",
                what="topic",
            )

    def _txn_state(self, txn: tuple[int, int]) -> str:
        # Under the lock: what the transaction buffer knows of a transaction.
        if txn in self.tb.aborted:
            return ABORTED
        if TxnID(*txn) in self.tb.ongoing:
            return OPEN
        return ENDED

    def publish(
        self,
        producer: str,
        sequence_ids: list[int],
        entry: bytes,
        txn: TxnID | None,
        *,
        batched: bool = False,
    ) -> Publish:
        """Queue one entry (one message, or a batch) of ``producer``; see the module docs."""
        tb = self.tb
        key = None if txn is None else (txn.most_bits, txn.least_bits)
        first = False
        with tb.lock:
            self._check_open()
            if self._dedup_on:
                dup = self.dedup.claim(producer, sequence_ids, key, self._txn_state)
                if dup is not None:
                    return Publish(None, None, dup)
            try:
                if txn is not None:
                    tb.check_append(txn)
                    first = tb.register(txn)
                    assigned, durable = self.ml.append_positioned(entry)
                else:
                    assigned = None
                    durable = self.ml.append_async(entry)
            except BaseException:
                if self._dedup_on:
                    self.dedup.failed(producer, sequence_ids)
                if first and txn is not None:
                    tb.unregister(txn)  # nothing was queued
                raise
            if self._dedup_on:
                self.dedup.placed(
                    producer,
                    sequence_ids,
                    key,
                    assigned or durable,
                    batched=batched,
                    durable=durable if assigned is not None else None,
                )
        if first and assigned is not None and txn is not None:
            assigned.add_done_callback(functools.partial(tb.assigned, txn))
        durable.add_done_callback(tb.durable_cb)
        return Publish(assigned, durable, None)

    def last_sequence_id(self, producer: str) -> int:
        """Return the highest sequence id ``producer`` sent to this partition (-1: none)."""
        with self.lock:
            return self.dedup.last_sequence_id(producer)

    def _changed(self) -> None:
        # The read limits may have moved: wake waiting receivers.
        for sub in list(self._subs.values()):
            sub.wake()

    # ------------------------------------------------------------ subscriptions

    def subscription(
        self, name: str, isolation: str = READ_COMMITTED, initial_position: str = EARLIEST
    ) -> Subscription:
        """Return the subscription ``name`` (opened, recovered and reconciled on first use)."""
        if isolation not in ISOLATIONS:
            raise InvalidArgumentError(
                f"isolation must be one of {ISOLATIONS}, got {isolation!r}",
                argument="isolation",
                value=isolation,
            )
        with self._subs_lock:
            self._check_open()
            sub = self._subs.get(name)
            if sub is not None:
                return sub
            opening = self._sub_opening.get(name)
            owner = opening is None
            if opening is None:
                opening = self._sub_opening[name] = Future()
        if not owner:
            return await_opening(
                opening, self._ctx.config.end_timeout_ms, f"subscription {name} of {self.full}"
            )
        try:
            sub = self._open_subscription(name, isolation, initial_position)
        except BaseException as exc:
            with self._subs_lock:
                del self._sub_opening[name]
            opening.set_exception(exc)
            raise
        with self._subs_lock:
            del self._sub_opening[name]
            closed = self._closed
            if not closed:
                self._subs[name] = sub
        if closed:
            # The topic closed while this opened: close() did not see it, so it
            # is closed here (its pending-ack log would keep the directory busy).
            self._close_subscription(sub)
            err = AlreadyClosedError(
                f"topic {self.full} closed while subscription {name!r} opened", what="topic"
            )
            opening.set_exception(err)
            raise err
        opening.set_result(sub)
        return sub

    def _open_subscription(self, name: str, isolation: str, initial_position: str) -> Subscription:
        log_name = self.name.pending_ack_ledger(name)
        self._ctx.claim_pending_ack_log(log_name, self.full, name)
        new = name not in self.ml.cursor_names()
        cursor = self.ml.open_cursor(name)
        if new and initial_position == LATEST:
            # READ_COMMITTED starts at the last stable position, as Kafka's
            # read_committed consumer does: messages of transactions still
            # open are delivered once they commit (from the end, they were
            # skipped for good). No entry before it: from the first entry.
            # Unknown (a transaction with no position yet): the end, never
            # the whole history.
            last = self.ml.last_position
            if isolation == READ_COMMITTED and self.tb.read_limit is not None:
                last = self.tb.max_read_position
            if last is not None:
                cursor.mark_delete(last)
                cursor.flush()
        log_ml = self._ctx.open_ledger(log_name)
        try:
            writer = self._ctx.pending_ack_writer(log_ml, log_name)
            store = PendingAckStore(
                self.full,
                name,
                CursorAcks(self.ml, cursor),
                log_ml,
                writer,
                self._ctx.outcomes,
            )
            sub = Subscription(self.full, name, self.ml, cursor, self.tb, store, isolation)
            store.recover()
            # Serve nothing before what an ended transaction held is released:
            # otherwise later messages go out first and the held ones come back
            # after them (found by the Jepsen run). Bounded by the end timeout;
            # a release that fails or runs late is retried by the coordinator.
            deadline = time.monotonic() + self._ctx.config.end_timeout_ms / 1000.0
            for fut in store.reconcile():
                try:
                    fut.result(timeout=max(0.0, deadline - time.monotonic()))
                except Exception as exc:
                    log.warning(
                        "%s/%s: releasing acks of an ended transaction: %r", self.full, name, exc
                    )
        except BaseException:
            log_ml.close()
            raise
        return sub

    def subscriptions(self) -> dict[str, Subscription]:
        """Open subscriptions by name."""
        with self._subs_lock:
            return dict(self._subs)

    def pending_ack(self, name: str) -> PendingAckStore:
        """Return the pending-ack store of subscription ``name`` (the coordinator's participant)."""
        return self.subscription(name).pending

    # ------------------------------------------------------------ maintenance

    def sweep_orphans(self) -> int:
        """Ask the coordinators about transactions still ongoing here since the last sweep.

        A transaction its coordinator no longer has open (it ended, or is
        unknown) while this partition or one of its subscriptions still
        holds it -- a crash lost the record naming this participant, so the
        coordinator's end never came here -- is ended as recovery would end
        it, instead of pinning ``max_read_position`` (or the acks) until
        the next open. Open transactions are left alone. Only transactions
        seen at two sweeps in a row are asked, so the cost follows the
        long-lived ones. Returns how many ends were started.
        """
        with self.lock:
            ongoing = set(self.tb.ongoing)
        ask, self._seen_ongoing = ongoing & self._seen_ongoing, ongoing
        started = len(self.tb.reconcile(only=ask)) if ask else 0
        subs = list(self._subs.items())
        held_now = {name: set(sub.pending.transactions()) for name, sub in subs}
        for name, sub in subs:
            ask = held_now[name] & self._seen_held.get(name, set())
            if ask:
                started += len(sub.pending.reconcile(only=ask))
        self._seen_held = held_now  # subscriptions gone are forgotten
        return started

    def trim(self) -> int:
        """Delete ended transactions' pending-ack records; forget trimmed aborts."""
        n = 0
        for sub in list(self._subs.values()):
            if sub.pending.pending_trim():
                try:
                    n += sub.pending.trim()
                except Exception:
                    if not self._closed:
                        log.warning(
                            "%s/%s: trimming the pending-ack log",
                            self.full,
                            sub.name,
                            exc_info=True,
                        )
        with self.lock:
            gone = self.tb.forget_trimmed()
            if gone and self._dedup_on:
                self.dedup.mark_aborted(gone)
        return n

    def stats(self) -> dict[str, object]:
        """Return the transaction buffer, deduplication and subscriptions (admin)."""
        with self.lock:
            dedup = self.dedup.stats()
        return {
            "topic": self.full,
            "entries": self.ml.entry_count(),
            "last_position": self.ml.last_position,
            "transaction_buffer": self.tb.stats(),
            "deduplication": dedup,
            "subscriptions": {n: s.stats() for n, s in self.subscriptions().items()},
            "recovery": dict(self.recovery),
        }

    # ------------------------------------------------------------ unloading

    def begin_unload(self) -> str | None:
        """Refuse new work if nothing is attached or in flight here; else say what is.

        Idle: no subscription opening, no open transaction (nor a marker being
        written), every write durable and seen by the transaction buffer, no
        ended transaction it must still refuse late sends of (the snapshot
        does not keep them), no consumer attached, no acks pending in a
        transaction. When idle the partition refuses publishes and new
        subscriptions from here on (returns None): follow with :meth:`close`,
        or :meth:`cancel_unload`.
        """
        tb = self.tb
        with self._subs_lock:
            if self._closed:
                return "closed"
            if self._sub_opening:
                return "a subscription opening"
            with self.lock:  # publishes check _closed under it
                if tb.ongoing:
                    return "open transactions"
                if not tb.settled():
                    return "writes in flight"
                if tb.fences_ended():
                    return "ended transactions above the low-water mark"
                self._closed = True
            subs = list(self._subs.values())
        for sub in subs:  # none attaches or acks once closed: the checks hold
            if sub.consumers():
                why: str | None = f"consumers on subscription {sub.name!r}"
            elif sub.pending.transactions():
                why = f"pending acks on subscription {sub.name!r}"
            else:
                continue
            self.cancel_unload()
            return why
        return None

    def cancel_unload(self) -> None:
        """Serve again after :meth:`begin_unload` (the unload did not go ahead)."""
        with self._subs_lock, self.lock:
            self._closed = False

    def close(self) -> None:
        """Close subscriptions (waiting receivers wake), pending-ack logs, then the ledger."""
        with self._subs_lock:
            self._closed = True
            subs = list(self._subs.values())
        with self.lock:
            pass  # publishes queued before this point are on the ledger's queue
        for sub in subs:
            self._close_subscription(sub)
        self.ml.close()

    def _close_subscription(self, sub: Subscription) -> None:
        # Receivers wake; the pending-ack log is trimmed, flushed and closed.
        sub.close()
        try:
            sub.pending.trim()
        except Exception:
            log.debug("%s/%s: final trim failed", self.full, sub.name, exc_info=True)
        try:
            sub.pending.close()
            self._ctx.release_writer(sub.pending.log_ml.name, sub.pending.writer)
            sub.pending.log_ml.close()
        except Exception:
            log.exception("closing the pending-ack log of %s/%s", self.full, sub.name)


__all__ = ["EARLIEST", "LATEST", "Publish", "Topic", "TopicContext"]
