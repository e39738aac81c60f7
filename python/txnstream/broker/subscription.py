"""A subscription of one topic partition: its cursor, pending acks and dispatch.

One durable cursor per subscription (SPEC §4.5); every consumer of the
subscription takes messages from it (shared: whoever asks first gets the
next ones). The subscription reads entries in bulk (``read_messages``:
Rust, GIL released) up to the partition's read limit -- for READ_COMMITTED
the transaction buffer's ``max_read_position``, for READ_UNCOMMITTED every
durable entry -- and dispatches them in log order. It never dispatches:

- markers (they are acknowledged on the cursor at once, so the mark-delete
  position can pass them);
- under READ_COMMITTED, messages of aborted transactions (acknowledged the
  same way);
- messages a transaction holds (pending ack), or delivered and not yet
  acknowledged (they come again only through redelivery).

Delivered, unacknowledged messages are tracked per consumer. They are
delivered again (``redelivery_count`` + 1) after ``redeliver_unacknowledged``,
when their consumer closes, after a negative ack's delay, and when a
transaction that acknowledged them aborts. Waiting receivers sleep on
:attr:`cond`; the partition wakes them when its read limits move.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Final, Protocol

from txnstream._native import (
    Cursor,
    ManagedLedger,
    Position,
    TxnPosition,
    decode_topic_entry,
    is_batched,
    read_messages,
)
from txnstream.coordinator import TxnID
from txnstream.errors import (
    AlreadyClosedError,
    InvalidArgumentError,
    PositionNotFoundError,
)
from txnstream.pendingack import PendingAckStore

if TYPE_CHECKING:
    from txnstream.buffer import TransactionBuffer

READ_COMMITTED: Final = "read_committed"
READ_UNCOMMITTED: Final = "read_uncommitted"
ISOLATIONS: Final = (READ_COMMITTED, READ_UNCOMMITTED)

#: A message as read: ``(ledger_id, entry_id, batch_index, batch_size,
#: payload, key, properties, publish_time, producer_name, sequence_id, txn)``.
Row = tuple[
    int,
    int,
    int,
    int,
    bytes,
    "str | None",
    "dict[str, str] | None",
    int,
    str,
    int,
    "tuple[int, int] | None",
]
Key = tuple[int, int, int]

#: Entries read per bulk read.
READ_BATCH = 64
#: Closed ledgers whose entry counts a subscription remembers (``check_exists``).
MAX_CACHED_LEDGERS = 4096
#: Entries whose batch size a subscription remembers (acks by MessageId check it).
MAX_CACHED_BATCH_SIZES = 1024
#: A receive reads at least this long (s) past entries it cannot deliver (aborted,
#: acked) before its deadline stops it, so ``receive(0)`` still finds a message
#: behind a short run of them; a long run ends at the deadline.
MIN_SCAN_S = 0.01


class Waker(Protocol):
    """What :meth:`Subscription.add_waker` calls: ``set()`` from any thread, quick.

    A ``threading.Event`` (a consumer of several partitions), or the asyncio
    client's waker that resolves a future on its event loop.
    """

    def set(self) -> None:
        """Note that receivers should look again."""


def key_of(p: TxnPosition) -> Key:
    """Return the dispatch key of a message: ``(ledger_id, entry_id, batch_index)``."""
    return (p.ledger_id, p.entry_id, p.batch_index)


class Subscription:
    """Dispatch state of one subscription on one partition; thread-safe (:attr:`cond`)."""

    def __init__(
        self,
        partition: str,
        name: str,
        ml: ManagedLedger,
        cursor: Cursor,
        buffer: TransactionBuffer,
        pending: PendingAckStore,
        isolation: str,
    ) -> None:
        self.partition = partition
        self.name = name
        self.isolation = isolation
        self.ml = ml
        self.cursor = cursor
        self.acks = pending.acks
        self.pending = pending
        self.tb = buffer
        self.cond = threading.Condition()
        self._read_after: Position | None = cursor.mark_delete_position
        self._buffer: deque[Row] = deque()
        self._redeliver: list[Key] = []  # heap
        self._nacked: list[tuple[float, Key]] = []  # heap of (due monotonic s, key)
        self._nacked_keys: set[Key] = set()  # the keys in _nacked
        # After an aborted cumulative ack the buffer is read again from the
        # mark-delete position: rows up to this key were read before, so they may
        # have been acked or negatively acked since (checked at dispatch).
        self._reread_through: Key | None = None
        self._unacked: dict[Key, int] = {}  # delivered, not acked -> consumer id
        self._redeliveries: dict[Key, int] = {}
        # Keys whose count in _redeliveries already includes a redelivery not
        # made yet (queued, waiting out a nack, or dropped while a transaction
        # held them): scheduling them again must not count it twice.
        self._owed: set[Key] = set()
        # A heap holding every key of _unacked and _redeliveries (and keys acked
        # since, until popped or compacted): a cumulative ack pops what it covers
        # instead of walking every delivered message (_track, _pop_through).
        self._order: list[Key] = []
        self._consumers: set[int] = set()
        self._wakers: set[Waker] = set()
        self._closed_ledgers: dict[int, int] = {}  # ledger id -> entries (check_exists)
        self._batch_sizes: dict[Position, int] = {}  # entry -> its batch size (check_batch_size)
        self._closed = False
        self.delivered = 0
        self.auto_acked = 0
        pending.on_end = self._txn_ended
        pending.end_guard = self.cond

    # ------------------------------------------------------------ consumers

    def attach(self, consumer: int, isolation: str) -> None:
        """Attach a consumer; with others attached, its isolation must be theirs."""
        with self.cond:
            self._check_open()
            if isolation != self.isolation and not self._consumers:
                # Nobody reads yet: take the new isolation, and read again from
                # the mark-delete position what was buffered, or queued for
                # redelivery, under the old one (READ_UNCOMMITTED delivered
                # messages READ_COMMITTED must not see: open or aborted).
                self.isolation = isolation
                self._buffer.clear()
                self._redeliver.clear()
                self._nacked.clear()
                self._nacked_keys.clear()
                # Only detached consumers' messages held by transactions are
                # left here: ended, they come back through the re-read.
                self._unacked.clear()
                self._reread_through = None
                self._read_after = self.cursor.mark_delete_position
            if isolation != self.isolation:
                raise InvalidArgumentError(
                    f"subscription {self.name!r} on {self.partition} reads {self.isolation}; "
                    f"a consumer cannot join it with isolation={isolation!r}",
                    argument="isolation",
                    value=isolation,
                )
            self._consumers.add(consumer)

    def detach(self, consumer: int) -> None:
        """Detach a consumer: its unacknowledged messages are delivered again.

        Messages it acknowledged in a transaction stay with that transaction:
        its abort delivers them again (once), its commit acknowledges them.
        """
        with self.cond:
            self._consumers.discard(consumer)
            self._redeliver_locked(
                k for k, c in self._unacked.items() if c == consumer and not self._held(k)
            )
            self._notify_locked()

    def _held(self, key: Key) -> bool:
        return self.pending.is_held(Position(key[0], key[1]), key[2])

    def consumers(self) -> int:
        """Return how many consumers are connected."""
        with self.cond:
            return len(self._consumers)

    def close(self) -> None:
        """Refuse further calls and wake every waiting receiver."""
        with self.cond:
            self._closed = True
            self._notify_locked()

    def _check_open(self) -> None:
        if self._closed:
            raise AlreadyClosedError(
                f"subscription {self.name!r} on {self.partition} is closed (broker closing)",
                what="subscription",
            )

    # ------------------------------------------------------------ dispatch

    def fetch(
        self,
        consumer: int,
        max_messages: int,
        deadline: float | None,
    ) -> list[tuple[Row, int]]:
        """Up to ``max_messages`` messages with their redelivery counts.

        Waits until at least one is available or the monotonic ``deadline``
        (seconds; None: no limit) passes; then returns what there is (possibly
        nothing). Raises :class:`AlreadyClosedError` once closed.
        """
        started = time.monotonic()
        with self.cond:
            while True:
                self._check_open()
                if consumer not in self._consumers:
                    raise AlreadyClosedError("the consumer is closed", what="consumer")
                out = self._take(consumer, max_messages)
                if out:
                    return out
                if self._fill():
                    now = time.monotonic()
                    if deadline is not None and now >= max(deadline, started + MIN_SCAN_S):
                        # A long run of entries with nothing to deliver (aborted,
                        # acked): stop reading at the deadline, with what there is.
                        out = self._take(consumer, max_messages)
                        if not out:  # more to read: a waiting receive looks again at once
                            self._notify_locked()
                        return out
                    continue
                now = time.monotonic()
                wait = None if deadline is None else deadline - now
                if self._nacked:
                    due = self._nacked[0][0] - now
                    wait = due if wait is None else min(wait, due)
                if wait is not None and wait <= 0:
                    if deadline is not None and now >= deadline:
                        return []
                    continue
                self.cond.wait(wait)

    def wake(self) -> None:
        """Wake waiting receivers: new data may be readable."""
        with self.cond:
            self._notify_locked()

    def _notify_locked(self) -> None:
        # Under the lock: something a receiver waits for changed (data, a
        # redelivery, a release, a close). Wakes blocked fetches and every waker
        # (a consumer of several partitions, an asyncio receive).
        self.cond.notify_all()
        for w in self._wakers:
            w.set()

    def next_due(self, now: float) -> float:
        """Seconds from monotonic ``now`` until a negative ack falls due (inf: none waits)."""
        with self.cond:
            return self._nacked[0][0] - now if self._nacked else float("inf")

    def add_waker(self, waker: Waker) -> None:
        """Also call ``waker.set()`` whenever receivers are woken (see :class:`Waker`)."""
        with self.cond:
            self._wakers.add(waker)

    def remove_waker(self, waker: Waker) -> None:
        """Stop calling ``waker``."""
        with self.cond:
            self._wakers.discard(waker)

    def _take(self, consumer: int, limit: int) -> list[tuple[Row, int]]:
        # Under the lock: redeliveries first, then new messages in log order.
        out: list[tuple[Row, int]] = []
        unacked = self._unacked
        now = time.monotonic()
        while self._nacked and self._nacked[0][0] <= now:
            key = heapq.heappop(self._nacked)[1]
            self._nacked_keys.discard(key)
            heapq.heappush(self._redeliver, key)
        pending = self.pending
        holds = pending.holds_any()
        while self._redeliver and len(out) < limit:
            key = heapq.heappop(self._redeliver)
            if key in unacked:
                continue
            row = self._load(key)
            if row is None or (holds and pending.is_held(Position(key[0], key[1]), key[2])):
                continue
            self._track(key)
            unacked[key] = consumer
            self._owed.discard(key)
            out.append((row, self._redeliveries.get(key, 0)))
        buf = self._buffer
        while buf and len(out) < limit:
            row = buf.popleft()
            key = (row[0], row[1], row[2])
            if key in unacked or (holds and pending.is_held(Position(row[0], row[1]), row[2])):
                continue
            reread = self._reread_through
            if reread is not None:
                if key > reread:
                    self._reread_through = None  # past what was read before
                elif key in self._nacked_keys or self.acks.is_acked(
                    TxnPosition(key[0], key[1], row[3], key[2])
                ):
                    continue
            self._track(key)
            unacked[key] = consumer
            self._owed.discard(key)
            out.append((row, self._redeliveries.get(key, 0)))
        self.delivered += len(out)
        return out

    def _fill(self) -> bool:
        # Under the lock: read the next entries up to the read limit; True if any.
        tb = self.tb
        limit = tb.read_limit if self.isolation == READ_COMMITTED else tb.uncommitted_limit
        after = self._read_after
        if limit is None or (
            after is not None and limit <= Position(after.ledger_id, after.entry_id + 1)
        ):
            return False
        last, scanned, rows, markers = read_messages(
            self.ml, self.cursor.name, self._read_after, limit, READ_BATCH
        )
        if not scanned:
            return False
        self._read_after = last
        done: list[Position] = list(markers)
        if self.isolation == READ_COMMITTED and tb.aborted:
            aborted = tb.aborted
            kept = []
            gone: dict[tuple[int, int], None] = {}
            for row in rows:
                txn = row[10]
                if txn is not None and txn in aborted:
                    gone[(row[0], row[1])] = None
                else:
                    kept.append(row)
            rows = kept
            done.extend(Position(lid, eid) for lid, eid in gone)
        if done:
            self.auto_acked += len(done)
            self.cursor.delete(done)
        self._buffer.extend(rows)
        return True

    def _load(self, key: Key) -> Row | None:
        # A message to deliver again: read its entry (None if it is gone or acked).
        pos = TxnPosition(key[0], key[1])
        try:
            if self.cursor.is_deleted(pos.position):
                return None
            d: dict[str, Any] = decode_topic_entry(self.ml.read(pos.position))
        except PositionNotFoundError:
            return None
        msgs = d["messages"]
        if key[2] >= len(msgs):
            return None
        size = d["batch_size"]
        if size > 1:
            present = self.cursor.batch_ack_set(pos.position)
            if present is not None and not present.get(key[2]):
                return None
        m = msgs[key[2]]
        props = dict(m["properties"]) or None
        return (
            key[0],
            key[1],
            key[2],
            size,
            m["payload"],
            m["key"],
            props,
            d["publish_time"],
            d["producer_name"],
            m["sequence_id"],
            d["txn"],
        )

    def _redeliver_locked(self, keys: Iterable[Key]) -> None:
        # Under the lock: deliver these again (counting a redelivery each).
        for key in list(keys):
            self._track(key)
            self._unacked.pop(key, None)
            self._count_redelivery(key)
            heapq.heappush(self._redeliver, key)

    def _count_redelivery(self, key: Key) -> None:
        # Under the lock: ``key`` will be delivered again. One more redelivery,
        # unless one is counted and not made yet (a negative ack waiting, then
        # its message's transaction aborts: one redelivery, not two).
        if key not in self._owed:
            self._owed.add(key)
            self._redeliveries[key] = self._redeliveries.get(key, 0) + 1

    def redeliver_unacknowledged(self, consumer: int) -> int:
        """Deliver ``consumer``'s unacknowledged messages again; return how many."""
        with self.cond:
            keys = [k for k, c in self._unacked.items() if c == consumer and not self._held(k)]
            self._redeliver_locked(keys)
            self._notify_locked()
            return len(keys)

    def negative_ack(self, consumer: int, positions: list[TxnPosition], delay_ms: int) -> None:
        """Deliver these again after ``delay_ms``."""
        due = time.monotonic() + delay_ms / 1000.0
        with self.cond:
            for p in positions:
                key = key_of(p)
                if self._unacked.get(key) != consumer or self._held(key):
                    continue  # not delivered to it (or acked), or its transaction decides
                del self._unacked[key]
                self._count_redelivery(key)
                heapq.heappush(self._nacked, (due, key))
                self._nacked_keys.add(key)
            self._notify_locked()

    # ------------------------------------------------------------ acks

    def ack(self, positions: list[TxnPosition]) -> None:
        """Acknowledge messages outside any transaction (individually)."""
        with self.cond:
            self.pending.ack_outside(positions)
            undelivered = []
            for p in positions:
                key = key_of(p)
                if self._unacked.pop(key, None) is None:
                    undelivered.append(key)
                self._redeliveries.pop(key, None)
                self._owed.discard(key)
            self._unbuffer(undelivered)  # acked by id while read ahead: never delivered now

    def ack_cumulative(self, position: TxnPosition) -> None:
        """Acknowledge every message up to ``position`` outside any transaction."""
        with self.cond:
            self._check_alone_locked(position)
            self.pending.ack_cumulative_outside(position)
            self._forget_through(position)
            self._unbuffer_through(key_of(position))

    def check_alone(self, position: TxnPosition) -> None:
        """Raise if a cumulative ack up to ``position`` is refused (before any side effect).

        The ack itself checks again under the lock, so a consumer attaching
        in between is caught too.
        """
        with self.cond:
            self._check_alone_locked(position)

    def _check_alone_locked(self, position: TxnPosition) -> None:
        # Under the lock, with the ack that follows: a cumulative ack needs the
        # subscription to one consumer (Pulsar: Exclusive or Failover), or it
        # would cover -- and on abort deliver again -- what the others received.
        n = len(self._consumers)
        if n > 1:
            raise InvalidArgumentError(
                f"ack_cumulative on subscription {self.name!r} of {self.partition}: {n} "
                "consumers share it, and a cumulative ack would cover what the others "
                "received; acknowledge each message instead (ack)",
                argument="msg",
                value=str(position),
            )

    def _forget_through(self, position: TxnPosition) -> None:
        # Under the lock: acknowledged up to ``position``. Also keys not
        # delivered now (negatively acked, waiting): their counts go.
        for key in self._pop_through(key_of(position)):
            self._unacked.pop(key, None)
            self._redeliveries.pop(key, None)
            self._owed.discard(key)

    def _track(self, key: Key) -> None:
        # Under the lock, before ``key`` goes into _unacked or _redeliveries.
        if key in self._unacked or key in self._redeliveries:
            return  # in the heap already
        order = self._order
        live = len(self._unacked) + len(self._redeliveries)
        if len(order) > 2 * live + 64:
            # Mostly keys acked since they were pushed: rebuild from the live
            # ones (amortized O(1) per push; the heap stays within 2x the live keys).
            order[:] = {*self._unacked, *self._redeliveries}
            heapq.heapify(order)
        heapq.heappush(order, key)

    def _pop_through(self, bound: Key) -> list[Key]:
        # Under the lock: take the keys up to ``bound`` out of the heap and
        # return those still in _unacked or _redeliveries (once each), in
        # order. O(log n) per key taken: a cumulative ack costs what it covers.
        order = self._order
        out: list[Key] = []
        while order and order[0] <= bound:
            key = heapq.heappop(order)
            if (key in self._unacked or key in self._redeliveries) and (not out or out[-1] != key):
                out.append(key)
        return out

    def check_batch_size(self, position: TxnPosition) -> None:
        """Raise unless ``position``'s batch size is its entry's (ids built by callers).

        An unbatched id of a batched entry would acknowledge the whole batch.
        A position with no entry passes (the ack itself reports it).
        """
        where = position.position
        size = self._batch_sizes.get(where)
        if size is None:
            try:
                entry = self.ml.read(where)
            except PositionNotFoundError:
                return
            if position.batch_size <= 1 and not is_batched(entry):
                return  # the usual case: no decoding
            size = decode_topic_entry(entry)["batch_size"]
            # Acking a batch by ids checks each id: decode its entry once, not
            # once per message (4,000 acks of one batch took 18.8 s).
            with self.cond:
                if len(self._batch_sizes) >= MAX_CACHED_BATCH_SIZES:
                    self._batch_sizes.pop(next(iter(self._batch_sizes)))
                self._batch_sizes[where] = size
        if size != position.batch_size and not (size <= 1 and position.batch_size <= 1):
            raise InvalidArgumentError(
                f"message id {position.ledger_id}:{position.entry_id} (batch index "
                f"{position.batch_index}) says batch_size={position.batch_size}, but that entry "
                f"of {self.partition} holds {size} message(s); use the MessageId received",
                argument="msg",
                value=str(position),
            )

    def check_ack(self, txn: TxnID, position: TxnPosition, cumulative: bool) -> None:
        """Raise what :meth:`ack_in_transaction` would (conflicts), changing nothing."""
        with self.cond:
            self._check_open()
            if cumulative:
                self._check_alone_locked(position)
            self.pending.check(txn, [position], cumulative)

    def check_exists(self, position: TxnPosition) -> None:
        """Raise :class:`PositionNotFoundError` unless ``position``'s entry was written.

        A transactional ack is only checked against the cursor when its
        transaction commits: an id naming no entry must be refused before.
        """
        entry = position.position
        last = self.ml.last_position
        if last is not None and entry <= last:
            if entry.ledger_id == last.ledger_id:
                return
            count = self._closed_ledgers.get(entry.ledger_id)
            if count is None:  # not seen closed yet: look once (closed ledgers never grow)
                for lid, n, closed in self.ml.ledgers():
                    if closed and len(self._closed_ledgers) < MAX_CACHED_LEDGERS:
                        self._closed_ledgers[lid] = n
                    if lid == entry.ledger_id:
                        count = n
            if count is not None and entry.entry_id < count:
                return
            if self.cursor.is_deleted(entry):  # trimmed: acknowledged already
                return
        where = (
            "it is empty"
            if last is None
            else f"its last durable entry is {last.ledger_id}:{last.entry_id}"
        )
        message = f"no message at {entry.ledger_id}:{entry.entry_id} on {self.partition} ({where})"
        # Past the durable end it may be a message still being written (a send in a
        # transaction returns its id before the entry is durable): retriable.
        ahead = last is None or entry > last
        if ahead:
            message += ": if it was just sent, it is not durable yet (retry, or flush the producer)"
        err = PositionNotFoundError(message, position=(entry.ledger_id, entry.entry_id))
        err.retriable = ahead
        raise err

    def ack_in_transaction(
        self, txn: TxnID, positions: list[TxnPosition], cumulative: bool
    ) -> Future[TxnPosition]:
        """Acknowledge in ``txn`` (pending until it ends); the ACK record's future."""
        with self.cond:
            self._check_open()
            if cumulative:
                self._check_alone_locked(positions[0])
                return self.pending.ack(txn, positions, cumulative)
        return self.pending.ack(txn, positions, cumulative)

    def _txn_ended(
        self,
        txn: TxnID,
        committed: bool,
        messages: list[TxnPosition],
        cumulative: TxnPosition | None,
    ) -> None:
        # The pending-ack store applied (commit) or released (abort) txn's acks.
        with self.cond:
            # Messages it held that this subscription never delivered (holds
            # restored at open, ids acked without a receive) may sit in the
            # read-ahead buffer: there, the buffer delivers them once (abort)
            # or must not (commit). Not yet read: the read does it.
            undelivered = [key_of(p) for p in messages if key_of(p) not in self._unacked]
            if committed:
                for p in messages:
                    key = key_of(p)
                    self._unacked.pop(key, None)
                    self._redeliveries.pop(key, None)
                    self._owed.discard(key)
                if cumulative is not None:
                    self._forget_through(cumulative)
                    self._unbuffer_through(key_of(cumulative))
                self._unbuffer(undelivered)
            else:
                again = [key_of(p) for p in messages if key_of(p) in self._unacked]
                passed = [k for k in undelivered if self._was_read(k) and not self._buffered(k)]
                self._redeliver_locked(again + passed)
                if cumulative is not None:
                    covered = self._pop_through(key_of(cumulative))
                    for key in covered:  # back in the heap: they stay tracked
                        heapq.heappush(self._order, key)
                    self._redeliver_locked([k for k in covered if k in self._unacked])
                    # Messages it held without them being delivered: read again.
                    # What was read before may have been acked or nacked since.
                    if self._read_after is not None:
                        before = (self._read_after.ledger_id, self._read_after.entry_id, 1 << 62)
                        if self._reread_through is None or before > self._reread_through:
                            self._reread_through = before
                    self._read_after = self.cursor.mark_delete_position
                    self._buffer.clear()
                # Only an abort gives messages back; a commit makes none deliverable
                # (waking every waiting receive per commit only makes them look again).
                self._notify_locked()

    def _was_read(self, key: Key) -> bool:
        # Under the lock: the reader has passed the message's entry.
        after = self._read_after
        return after is not None and (key[0], key[1]) <= (after.ledger_id, after.entry_id)

    def _buffered(self, key: Key) -> bool:
        # Under the lock: the message waits in the read-ahead buffer.
        buf = self._buffer
        if not buf or key < buf[0][:3] or key > buf[-1][:3]:
            return False
        return any(row[:3] == key for row in buf)

    def _unbuffer(self, keys: list[Key]) -> None:
        # Under the lock: drop these messages from the read-ahead buffer.
        gone = {k for k in keys if self._buffered(k)}
        if gone:
            self._buffer = deque(row for row in self._buffer if row[:3] not in gone)

    def _unbuffer_through(self, bound: Key) -> None:
        # Under the lock: drop buffered messages up to ``bound`` (acknowledged).
        buf = self._buffer
        while buf and buf[0][:3] <= bound:
            buf.popleft()

    # ------------------------------------------------------------ stats

    def backlog(self) -> int:
        """Entries after the mark-delete position (acknowledged ones beyond it included)."""
        md = self.cursor.mark_delete_position
        total = 0
        for lid, n, _ in self.ml.ledgers():
            if md is None or lid > md.ledger_id:
                total += n
            elif lid == md.ledger_id:
                total += max(0, n - md.entry_id - 1)
        return total

    def stats(self) -> dict[str, object]:
        """Dispatch counters (admin)."""
        with self.cond:
            return {
                "isolation": self.isolation,
                "consumers": len(self._consumers),
                "unacked": len(self._unacked),
                "redeliver_queued": len(self._redeliver) + len(self._nacked),
                "buffered": len(self._buffer),
                "delivered": self.delivered,
                "auto_acked": self.auto_acked,
                "mark_delete_position": self.cursor.mark_delete_position,
                "backlog": self.backlog(),
                "pending_ack": self.pending.stats(),
            }


__all__ = [
    "ISOLATIONS",
    "READ_COMMITTED",
    "READ_UNCOMMITTED",
    "Key",
    "Row",
    "Subscription",
    "key_of",
]
