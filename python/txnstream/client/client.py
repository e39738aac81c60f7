"""The client API (SPEC §4.9): ``Client``, ``Producer``, ``Consumer``; sync, thread-safe.

``broker.client(name)`` gives a :class:`Client`; from it:

- ``client.producer(topic, name=None)`` -> :class:`Producer` with ``send``,
  ``send_async`` and ``send_many``;
- ``client.subscribe(topic, subscription, isolation="read_committed")`` ->
  :class:`Consumer` with ``receive``, ``receive_many``, ``ack``,
  ``ack_cumulative``, ``negative_ack``, ``redeliver_unacknowledged``;
- ``client.transaction(timeout_ms)`` -> :class:`~.transaction.Transaction`
  (a context manager: commit on success, abort on exception).

**Producers.** Every message carries the producer's name and a sequence
id (ascending per producer; a new producer with the name of an earlier
one continues after the highest id persisted). A retry with an explicit
``sequence_id`` that is already persisted returns the ORIGINAL
:class:`MessageId` and writes nothing, also after a restart (dedup, per
partition). A partitioned topic routes by key hash (Java ``String.hashCode``
masked to 31 bits, modulo the partition count: Pulsar's default
``JavaStringHash``), and a keyless message by its sequence id (the
first id divided by the number of messages in the entry, modulo the
partition count). Keyless sends take the partitions in turn, starting at
the producer name's hash (Pulsar's round robin without batching; Pulsar
starts at a random partition): their ids, when the producer picks them,
skip ahead to the first ones leading to the next partition (ids only need
to ascend), whatever keyed sends or sends of other sizes took in between.
A retry with the same ids, explicit or not, lands on the partition of the
original, also after a restart. A non-transactional ``send`` returns once the message is durable;
a transactional one returns once its position is assigned (its durability
is awaited by ``commit()``).

**Consumers.** A consumer of a partitioned topic reads every partition.
``receive(timeout_ms)`` returns a :class:`Message` or ``None`` when
nothing arrives in time (confluent-kafka's ``poll``; pulsar-client raises
``Timeout`` instead). Acknowledgements outside a transaction are applied at
once and persisted with the subscription's cursor (at-least-once across a
crash); inside a transaction they are pending until it ends.

Every call checks its arguments first and raises a typed
:class:`~txnstream.errors.TxnStreamError` naming the bad value.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Final

from txnstream import future
from txnstream._native import (
    MAX_ENTRY_SIZE,
    Position,
    TxnPosition,
    encode_batch_message,
    encode_message,
)
from txnstream.broker.dedup import Where
from txnstream.broker.subscription import ISOLATIONS, READ_COMMITTED, Row, Subscription
from txnstream.broker.topic import EARLIEST, LATEST, Publish, Topic
from txnstream.broker.topic_name import TopicName, subscription_arg
from txnstream.client.message import Message, MessageId
from txnstream.client.transaction import Transaction
from txnstream.errors import (
    AlreadyClosedError,
    InvalidArgumentError,
    OperationTimeoutError,
    send_timed_out,
)
from txnstream.metrics import CommitTally
from txnstream.timer import timeout_ms_arg

if TYPE_CHECKING:
    from txnstream.broker.broker import Broker
    from txnstream.client.aio import AsyncClient

#: Highest sequence id a producer may use (Pulsar's is a signed 64-bit long).
MAX_SEQUENCE_ID: Final = (1 << 63) - 1
#: Pulsar's default negative-ack redelivery delay.
DEFAULT_NACK_DELAY_MS: Final = 60_000
#: Longest a consumer sleeps between looks at its partitions when reading several.
_MULTI_POLL_S: Final = 0.05
#: Where a message went: (partition index, -1 if unpartitioned; partition's full name).
Route = tuple[int, str]

_consumer_ids = itertools.count(1)


def java_string_hash(key: str) -> int:
    """Java's ``String.hashCode`` of ``key`` masked to 31 bits (Pulsar's ``JavaStringHash``)."""
    h = 0
    data = key.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h & 0x7FFFFFFF


def _bad(argument: str, value: object, expected: str) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"{argument} must be {expected}, got {value!r}", argument=argument, value=value
    )


def _payload(value: object, argument: str = "value") -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise _bad(argument, value, "bytes, bytearray or memoryview")


def _utf8(argument: str, text: str, whole: object) -> None:
    # A str that cannot be encoded (a lone surrogate) fails here, not half-way through a send.
    if text.isascii():
        return  # the usual case: no copy
    try:
        text.encode()
    except UnicodeEncodeError:
        raise _bad(argument, whole, "text that encodes as UTF-8 (no lone surrogates)") from None


def _key(key: object) -> str | None:
    if key is None:
        return None
    if isinstance(key, str):
        _utf8("key", key, key)
        return key
    raise _bad("key", key, "a str or None")


def _properties(props: object) -> list[tuple[str, str]] | None:
    if props is None:
        return None
    if not isinstance(props, Mapping):
        raise _bad("properties", props, "a mapping of str to str or None")
    out = []
    for k, v in props.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise _bad("properties", props, f"a mapping of str to str (bad item {k!r}: {v!r})")
        _utf8("properties", k, props)
        _utf8("properties", v, props)
        out.append((k, v))
    return out or None


def _timeout_ms(value: object, argument: str = "timeout_ms") -> int | None:
    return timeout_ms_arg(value, argument)


class Client:
    """A client of an embedded :class:`~txnstream.broker.Broker`; thread-safe.

    ``name`` identifies it to the coordinators: ends of its transactions
    are remembered under it (idempotent end, PIP-255).
    """

    def __init__(self, broker: Broker, name: str | None = None) -> None:
        if name is not None and (not isinstance(name, str) or not name or not name.isprintable()):
            raise _bad("name", name, "a non-empty printable str or None")
        self.broker = broker
        self.name = name if name is not None else f"client-{uuid.uuid4().hex[:12]}"
        self._lock = threading.Lock()
        self._closed = False
        # Open ones only (a closed one leaves), keyed by id(): a long-lived client
        # making and closing producers holds nothing for the closed ones.
        self._producers: dict[int, Producer] = {}
        self._consumers: dict[int, Consumer] = {}
        self._producer_ids = itertools.count()
        #: Commit stats; once closed, the broker's tally of closed clients.
        self._tally = CommitTally()
        self._aio: AsyncClient | None = None

    # ------------------------------------------------------------ factories

    @property
    def end_timeout_ms(self) -> int:
        """How long ``commit()``/``abort()`` wait before ``TransactionEndPending``."""
        return self.broker.config.end_timeout_ms

    def check_open(self) -> None:
        """Raise :class:`AlreadyClosedError` if the client (or its broker) is closed."""
        if self._closed:
            raise AlreadyClosedError(f"client {self.name!r} is closed", what="client")
        self.broker._check_open()

    def producer(self, topic: str, name: str | None = None) -> Producer:
        """Return a producer on ``topic`` (a partitioned topic: all its partitions)."""
        self.check_open()
        tn = TopicName.parse(topic)
        if name is not None and (not isinstance(name, str) or not name or not name.isprintable()):
            raise _bad("name", name, "a non-empty printable str or None")
        partitions = self.broker.partition_names(tn)
        if name is None:
            # The next free one: another client may have this client's name.
            while True:
                name = f"{self.name}-{next(self._producer_ids)}"
                if self.broker.claim_producer_name(partitions, name):
                    break
        elif not self.broker.claim_producer_name(partitions, name):
            # Two open producers of one name would share its sequence ids:
            # deduplication would drop the second one's messages as retries.
            raise InvalidArgumentError(
                f"producer name {name!r} is in use on {tn.full} by an open producer "
                "(Pulsar: ProducerBusy); close that one first, or use another name",
                argument="name",
                value=name,
            )
        try:
            p = Producer(self, tn, name, partitions)
            with self._lock:
                self.check_open()
                self._producers[id(p)] = p
        except BaseException:
            self.broker.release_producer_name(partitions, name)
            raise
        return p

    def subscribe(
        self,
        topic: str,
        subscription: str,
        isolation: str = READ_COMMITTED,
        *,
        initial_position: str = EARLIEST,
        negative_ack_redelivery_delay_ms: int = DEFAULT_NACK_DELAY_MS,
    ) -> Consumer:
        """Return a consumer of ``subscription`` on ``topic``.

        ``isolation`` is ``"read_committed"`` (default, as Kafka's
        ``isolation.level``) or ``"read_uncommitted"``; a new subscription
        starts at ``initial_position`` (``"earliest"`` or ``"latest"``).
        ``"latest"`` with read_committed is the last stable position, as in
        Kafka: messages of transactions open at that moment are delivered
        if they commit.
        """
        self.check_open()
        tn = TopicName.parse(topic)
        subscription_arg(subscription, tn)
        if isolation not in ISOLATIONS:
            raise _bad("isolation", isolation, f"one of {ISOLATIONS}")
        if initial_position not in (EARLIEST, LATEST):
            raise _bad("initial_position", initial_position, f"{EARLIEST!r} or {LATEST!r}")
        delay = _timeout_ms(negative_ack_redelivery_delay_ms, "negative_ack_redelivery_delay_ms")
        c = Consumer(self, tn, subscription, isolation, initial_position, delay or 0)
        with self._lock:
            closed = self._closed
            if not closed:
                self._consumers[id(c)] = c
        if closed:  # closed meanwhile: leave again (outside the lock: close forgets it)
            c.close()
            self.check_open()
        return c

    def transaction(self, timeout_ms: int | None = None) -> Transaction:
        """Begin a transaction (no wait); ``timeout_ms`` defaults to the broker's setting."""
        self.check_open()
        if timeout_ms is not None and (
            isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int)
        ):
            raise _bad("timeout_ms", timeout_ms, "a positive int (milliseconds) or None")
        tc = self.broker._coordinators().next_coordinator()
        txn_id, record = tc.begin(timeout_ms, client_name=self.name)
        timeout = self.broker.config.transaction_timeout_ms if timeout_ms is None else timeout_ms
        return Transaction(self, tc, txn_id, record, timeout)

    def aio(self) -> AsyncClient:
        """Return the asyncio face of this client (:class:`~txnstream.client.aio.AsyncClient`)."""
        from txnstream.client.aio import AsyncClient

        with self._lock:
            if self._aio is None:
                self._aio = AsyncClient(self)
            return self._aio

    # ------------------------------------------------------------ stats

    def _ended(self, committed: bool, waits: int, seconds: float) -> None:
        # A transaction of this client ended (commit stats for metrics).
        with self._lock:  # not into a tally already merged into the broker's
            self._tally.add(committed, waits, seconds)

    def commit_stats(self) -> dict[str, Any]:
        """Return commits, aborts, histograms of durable waits and latency (ms) per commit.

        While the client is open; once closed, its counts are its broker's
        (every closed client's together).
        """
        with self._lock:
            tally = self._tally
        return tally.snapshot()

    def _retire(self, into: CommitTally) -> None:
        # Closed: the counts move to ``into`` (the broker's), and so do later ones.
        with self._lock:
            mine, self._tally = self._tally, into
            into.merge(mine)

    def _forget(self, what: Producer | Consumer) -> None:
        # A producer or consumer closed: it is no longer the client's to close.
        with self._lock:
            self._producers.pop(id(what), None)
            self._consumers.pop(id(what), None)

    # ------------------------------------------------------------ close

    def close(self) -> None:
        """Close every producer and consumer (unacked messages go back for redelivery).

        In a child forked after the broker opened it only marks the client
        closed (see :meth:`Broker.close <txnstream.Broker.close>`).
        """
        if self.broker.forked():
            self._closed = True
            return
        with self._lock:
            if self._closed:
                return
            self._closed = True
            consumers, self._consumers = list(self._consumers.values()), {}
            producers, self._producers = list(self._producers.values()), {}
        for c in consumers:
            c.close()
        deadline = time.monotonic() + self.end_timeout_ms / 1000.0
        for p in producers:
            p._close(deadline)
        if self._aio is not None:
            self._aio.close()
        self.broker.forget_client(self)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.name!r}{', closed' if self._closed else ''})"


# ---------------------------------------------------------------- producer


class Producer:
    """Sends messages to one topic; thread-safe."""

    def __init__(
        self, client: Client, topic: TopicName, name: str, partitions: list[TopicName]
    ) -> None:
        self.client = client
        self.topic = topic.full
        self.name = name
        self._broker = client.broker
        self._partitions = partitions
        self._lock = threading.Lock()
        self._closed = False
        # Per partition index, the durability of the last entry queued there
        # (entries of one partition become durable in order): what flush() waits for.
        self._last_written: dict[int, Future[Position]] = {}
        last = -1
        for tn in self._partitions:
            last = max(last, client.broker.topic(tn).last_sequence_id(name))
        self._next_seq = last + 1
        # Partition index the next keyless send with ids of our choosing goes to
        # (None: start at the name's hash, as Pulsar starts at a random one).
        self._next_keyless: int | None = None

    @property
    def last_sequence_id(self) -> int:
        """The highest sequence id this producer (its name) has used (-1: none)."""
        with self._lock:
            return self._next_seq - 1

    def _check(self) -> None:
        if self._closed:
            raise AlreadyClosedError(
                f"producer {self.name!r} on {self.topic} is closed", what="producer"
            )
        self.client.check_open()

    def _route(self, key: str | None, seq: int, count: int) -> int:
        # The partition index of ``count`` messages from sequence id ``seq``:
        # by the key's hash, else by the sequence id. Round robin for a run of
        # keyless sends of one size (ids advance by ``count``), and a retry with
        # the same ids reaches the partition that holds the original, in this
        # process or after a restart (a counter would not: keyed sends and
        # restarts move the ids, not the counter).
        n = len(self._partitions)
        if n == 1:
            return 0
        if key is not None:
            return java_string_hash(key) % n
        return (seq // count) % n

    def _sequence(self, sequence_id: object, count: int, keyless: bool) -> int:
        # Under self._lock: the first sequence id of ``count`` messages.
        if sequence_id is None:
            seq = self._next_seq
            n = len(self._partitions)
            if keyless and n > 1:
                # Round robin over keyless sends, whatever keyed sends or other
                # sizes took in between: skip to the first ids that _route sends
                # to the next partition in turn (ids only need to ascend).
                target = self._next_keyless
                if target is None:
                    target = java_string_hash(self.name) % n
                q = seq // count
                q += (target - q) % n
                if q * count <= MAX_SEQUENCE_ID - count:  # else: no skip, the turn is lost
                    seq = max(seq, q * count)
                self._next_keyless = (target + 1) % n
            if seq > MAX_SEQUENCE_ID - count:
                # The ids an explicit sequence_id may take are used up: chosen
                # ids obey the same bound (a larger one breaks dedup snapshots).
                raise InvalidArgumentError(
                    f"producer {self.name!r} has no sequence ids left for {count} "
                    f"message(s) from {seq} (ids end at {MAX_SEQUENCE_ID - 1}); "
                    "use a new producer name",
                    argument="sequence_id",
                    value=seq,
                )
            self._next_seq = seq + count
            return seq
        if isinstance(sequence_id, bool) or not isinstance(sequence_id, int):
            raise _bad("sequence_id", sequence_id, "a non-negative int or None")
        if not 0 <= sequence_id <= MAX_SEQUENCE_ID - count:
            raise _bad("sequence_id", sequence_id, f"in 0..{MAX_SEQUENCE_ID - count}")
        self._next_seq = max(self._next_seq, sequence_id + count)
        return sequence_id

    def _txn(self, txn: object) -> Transaction | None:
        if txn is None:
            return None
        if not isinstance(txn, Transaction):
            raise _bad("txn", txn, "a Transaction from client.transaction() or None")
        if txn.client.broker is not self._broker:
            raise _bad("txn", txn, "a transaction of the same broker")
        txn.check_usable()
        return txn

    def _publish(
        self,
        entry_of: Callable[[int], bytes],
        count: int,
        key: str | None,
        sequence_id: object,
        txn: Transaction | None,
    ) -> tuple[Route, Publish]:
        # The sequence id is taken and the entry queued under the producer's
        # lock (queueing does not wait for I/O), so each partition sees this
        # producer's ids in ascending order.
        if txn is not None:
            txn._join()  # from here, a commit waits for this send
        written: Future[Position] | None = None
        try:
            with self._lock:
                before = (self._next_seq, self._next_keyless)
                seq = self._sequence(sequence_id, count, key is None)
                try:
                    entry = entry_of(seq)
                    if len(entry) > MAX_ENTRY_SIZE:
                        raise InvalidArgumentError(
                            f"the message(s) make an entry of {len(entry)} bytes, more than "
                            f"MAX_ENTRY_SIZE ({MAX_ENTRY_SIZE})",
                            argument="value",
                            value=len(entry),
                        )
                except BaseException:
                    # Nothing was sent: the ids (and the partition's turn) are free again.
                    self._next_seq, self._next_keyless = before
                    raise
                index = self._route(key, seq, count)
                tn = self._partitions[index]
                topic = self._broker.topic(tn)
                if txn is not None:
                    txn.add_partition(topic.full)
                seqs = list(range(seq, seq + count))
                txn_id = None if txn is None else txn.txn_id
                published = topic.publish(self.name, seqs, entry, txn_id, batched=count > 1)
                written = published.durable
                if written is not None:
                    self._last_written[index] = written
        finally:
            if txn is not None:
                txn._joined(written)
        return ((tn.partition if tn.is_partition else -1), tn.full), published

    def _message_ids(self, where: Route, published: Publish, count: int) -> Future[list[MessageId]]:
        # The ids of what _publish queued (or of the duplicate found), as a future.
        out: Future[list[MessageId]] = future.Future()
        out.set_running_or_notify_cancel()  # the write happens whatever the caller does
        dup = published.duplicate
        if dup is not None:

            def found(at: Where | BaseException) -> None:
                if isinstance(at, BaseException):
                    out.set_exception(at)
                    return
                # Where the original messages went: their indexes in their batch.
                ledger, entry, index, size = at
                ids = [MessageId(ledger, entry, index + i, size, *where) for i in range(count)]
                out.set_result(ids)

            dup.when_placed(found)  # the caller's wait is bounded, not this
            return out
        src = published.assigned if published.assigned is not None else published.durable
        assert src is not None

        def done(f: Future[Position]) -> None:
            exc = f.exception()
            if exc is not None:
                out.set_exception(exc)
                return
            pos = f.result()
            out.set_result(
                [MessageId(pos.ledger_id, pos.entry_id, i, count, *where) for i in range(count)]
            )

        src.add_done_callback(done)
        return out

    def _queue_one(
        self,
        value: bytes,
        key: str | None,
        properties: Mapping[str, str] | None,
        txn: Transaction | None,
        sequence_id: int | None,
    ) -> tuple[Route, Publish]:
        # Validate and queue one message: (where it went, what the topic did).
        self._check()
        payload = _payload(value)
        k = _key(key)
        props = _properties(properties)
        t = self._txn(txn)
        txn_key = None if t is None else (t.txn_id.most_bits, t.txn_id.least_bits)
        now = self._broker.wall_ms()

        def entry(seq: int) -> bytes:
            return encode_message(payload, self.name, seq, now, k, props, txn_key)

        return self._publish(entry, 1, k, sequence_id, t)

    def send_async(
        self,
        value: bytes,
        key: str | None = None,
        properties: Mapping[str, str] | None = None,
        txn: Transaction | None = None,
        *,
        sequence_id: int | None = None,
    ) -> Future[MessageId]:
        """Queue one message; the future gives its :class:`MessageId` (see :meth:`send`)."""
        where, published = self._queue_one(value, key, properties, txn, sequence_id)
        ids = self._message_ids(where, published, 1)
        out: Future[MessageId] = future.Future()
        out.set_running_or_notify_cancel()  # cancel() says False: the send goes ahead

        def one(f: Future[list[MessageId]]) -> None:
            exc = f.exception()
            if exc is not None:
                out.set_exception(exc)
            else:
                out.set_result(f.result()[0])

        ids.add_done_callback(one)
        return out

    def send(
        self,
        value: bytes,
        key: str | None = None,
        properties: Mapping[str, str] | None = None,
        txn: Transaction | None = None,
        *,
        sequence_id: int | None = None,
    ) -> MessageId:
        """Send one message; return its :class:`MessageId`.

        Outside a transaction: once the message is durable. In ``txn``: once
        its position is assigned (``commit()`` waits for its durability).
        ``sequence_id`` (default: the producer's next) makes a retry
        idempotent: an id already persisted returns the original message's
        id and writes nothing.
        """
        where, published = self._queue_one(value, key, properties, txn, sequence_id)
        timeout_ms, what = self.client.end_timeout_ms, f"send to {self.topic}"
        src = published.assigned if published.assigned is not None else published.durable
        if src is None:  # a duplicate: its original id
            ids: list[MessageId] = _result(self._message_ids(where, published, 1), timeout_ms, what)
            return ids[0]
        # Straight from the storage future, as the asyncio face: no futures chained per send.
        pos: Position = _result(src, timeout_ms, what)
        return MessageId(pos.ledger_id, pos.entry_id, 0, 1, *where)

    def send_many(
        self,
        values: Iterable[bytes],
        key: str | None = None,
        properties: Mapping[str, str] | None = None,
        txn: Transaction | None = None,
        *,
        keys: Sequence[str | None] | None = None,
        sequence_id: int | None = None,
    ) -> list[MessageId]:
        """Send many messages as ONE batched entry (Pulsar's batch format) to one partition.

        Their sequence ids are consecutive from ``sequence_id`` (default:
        the producer's next); ``keys`` gives each message its own key
        (routing uses ``key``, or the first of ``keys``). Returns their ids
        (same entry, batch indexes 0..n-1), when durable (outside a
        transaction) or placed (in one).
        """
        self._check()
        if isinstance(values, bytes | bytearray | memoryview | str) or not isinstance(
            values, Iterable
        ):
            raise _bad("values", values, "an iterable of bytes values")
        payloads = [_payload(v, "values") for v in values]
        if not payloads:
            return []
        if keys is not None:
            if (
                isinstance(keys, str)
                or not isinstance(keys, Sequence)
                or len(keys) != len(payloads)
            ):
                raise _bad("keys", keys, f"a sequence of {len(payloads)} keys (str or None)")
            ks = [_key(x) for x in keys]
        else:
            ks = [_key(key)] * len(payloads)
        props = _properties(properties)
        t = self._txn(txn)
        txn_key = None if t is None else (t.txn_id.most_bits, t.txn_id.least_bits)
        now = self._broker.wall_ms()

        def entry(seq: int) -> bytes:
            if len(payloads) == 1:
                return encode_message(payloads[0], self.name, seq, now, ks[0], props, txn_key)
            msgs = [(p, ks[i], props, seq + i) for i, p in enumerate(payloads)]
            return encode_batch_message(msgs, self.name, now, txn_key)

        route_key = key if key is not None else ks[0]
        where, published = self._publish(entry, len(payloads), route_key, sequence_id, t)
        fut = self._message_ids(where, published, len(payloads))
        ids: list[MessageId] = _result(
            fut, self.client.end_timeout_ms, f"send_many to {self.topic}"
        )
        return ids

    def flush(self) -> None:
        """Wait until every message sent so far through this producer is durable.

        As pulsar-client's ``flush``. It matters for ``send_async`` and for
        sends in a transaction, which return their ``MessageId`` before the
        message is durable (the commit waits for it): after ``flush()`` such
        an id can be acked in another transaction. A send that failed
        reports its failure to its own caller; ``flush`` only waits. Raises
        :class:`~txnstream.errors.OperationTimeoutError` if the disk does not
        answer within the client's ``end_timeout_ms``.
        """
        self._check()
        with self._lock:
            waiting = list(self._last_written.items())
        timeout_ms = self.client.end_timeout_ms
        deadline = time.monotonic() + timeout_ms / 1000.0
        for _, fut in waiting:
            try:
                fut.exception(max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                # Not send_timed_out: its advice (retry the send) is not this caller's.
                raise OperationTimeoutError(
                    f"flush of producer {self.name!r} on {self.topic}: its sends were not "
                    f"durable within {timeout_ms} ms (end_timeout_ms); they may still be; "
                    "flush again to wait more",
                    what="flush",
                ) from None
        with self._lock:
            for index, fut in waiting:
                if self._last_written.get(index) is fut:
                    del self._last_written[index]

    def close(self) -> None:
        """Refuse further sends, wait for queued ones to be durable; the name is free again.

        The wait is bounded by the client's ``end_timeout_ms`` (a stalled
        disk: the sends complete later, or fail, on their own).
        """
        self._close(time.monotonic() + self.client.end_timeout_ms / 1000.0)

    def _close(self, deadline: float) -> None:
        # close(), waiting for queued sends until the monotonic ``deadline`` (a
        # client closing its producers gives them one deadline together).
        waiting = self._begin_close()
        if waiting is None:
            return
        try:
            for fut in waiting:
                fut.exception(max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            pass
        finally:
            self._end_close()

    def _begin_close(self) -> list[Future[Position]] | None:
        """Refuse further sends; the queued sends to wait for (None: closed already).

        Pair with :meth:`_end_close` once they are durable (or the wait ran
        out); the asyncio producer awaits them on its loop in between.
        """
        with self._lock:
            if self._closed:
                return None
            self._closed = True
            waiting = list(self._last_written.values())
            self._last_written.clear()
        return waiting

    def _end_close(self) -> None:
        # The name is free again; the client no longer closes this producer.
        self._broker.release_producer_name(self._partitions, self.name)
        self.client._forget(self)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Producer({self.name!r} on {self.topic})"


def _result(fut: Future[Any], timeout_ms: int, what: str) -> Any:
    try:
        return fut.result(timeout_ms / 1000.0)
    except TimeoutError:
        raise send_timed_out(what, timeout_ms) from None


# ---------------------------------------------------------------- consumer


MessageLike = Message | MessageId


class Consumer:
    """Receives messages of one subscription on a topic (every partition of it); thread-safe."""

    def __init__(
        self,
        client: Client,
        topic: TopicName,
        subscription: str,
        isolation: str,
        initial_position: str,
        nack_delay_ms: int,
    ) -> None:
        self.client = client
        self.topic = topic.full
        self.subscription = subscription
        self.isolation = isolation
        self.id = next(_consumer_ids)
        self._nack_delay_ms = nack_delay_ms
        self._closed = False
        self._lock = threading.Lock()
        self._next = 0
        self._wake = threading.Event()
        broker = client.broker
        self._subs: dict[int, Subscription] = {}
        attached: list[Subscription] = []
        names = broker.partition_names(topic)
        # Attached before the lookups: the partitions stay loaded while it lives.
        broker.attach(names)
        self._partitions = names
        try:
            for tn in names:
                t: Topic = broker.topic(tn)
                sub = t.subscription(subscription, isolation, initial_position)
                sub.attach(self.id, isolation)
                attached.append(sub)
                if len(names) > 1:  # one partition waits on its subscription's condition
                    sub.add_waker(self._wake)
                self._subs[tn.partition if tn.is_partition else -1] = sub
        except BaseException:
            for sub in attached:
                sub.remove_waker(self._wake)
                sub.detach(self.id)
            broker.detach(names)
            raise
        self._order = list(self._subs.items())

    def _check(self) -> None:
        if self._closed:
            raise AlreadyClosedError(
                f"consumer of {self.subscription!r} on {self.topic} is closed", what="consumer"
            )
        self.client.check_open()

    # ------------------------------------------------------------ receiving

    def _message(self, partition: int, sub: Subscription, row: Row, redeliveries: int) -> Message:
        lid, eid, index, size, payload, key, props, publish_time, producer, seq, _txn = row
        return Message(
            payload,
            key,
            dict(props) if props else {},
            MessageId(lid, eid, index, size, partition, sub.partition),
            publish_time,
            producer,
            redeliveries,
            seq,
            sub.partition,
        )

    def _poll(self, max_messages: int, deadline: float | None) -> list[Message]:
        if len(self._order) == 1:
            partition, sub = self._order[0]
            got = sub.fetch(self.id, max_messages, deadline)
            return [self._message(partition, sub, r, n) for r, n in got]
        while True:
            self._check()
            self._wake.clear()
            out: list[Message] = []
            with self._lock:
                start = self._next
                self._next = (start + 1) % len(self._order)
            now = time.monotonic()
            for i in range(len(self._order)):
                partition, sub = self._order[(start + i) % len(self._order)]
                got = sub.fetch(self.id, max_messages - len(out), now)
                out.extend(self._message(partition, sub, r, n) for r, n in got)
                if len(out) >= max_messages:
                    break
            if out:
                return out
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return []
            wait = _MULTI_POLL_S if deadline is None else min(_MULTI_POLL_S, deadline - now)
            self._wake.wait(wait)

    def _subscriptions(self) -> list[Subscription]:
        # The subscriptions of every partition this consumer reads.
        return list(self._subs.values())

    @staticmethod
    def _deadline(timeout_ms: object) -> float | None:
        # The monotonic deadline of a receive (None: no limit); checks the argument.
        t = _timeout_ms(timeout_ms)
        return None if t is None else time.monotonic() + t / 1000.0

    def receive(self, timeout_ms: int | None = None) -> Message | None:
        """Return the next message, or None if none arrives in ``timeout_ms`` (None: no limit)."""
        self._check()
        got = self._poll(1, self._deadline(timeout_ms))
        return got[0] if got else None

    def receive_many(self, max_messages: int = 100, timeout_ms: int | None = 0) -> list[Message]:
        """Return up to ``max_messages`` messages once one arrived, or [] at the timeout."""
        self._check()
        if isinstance(max_messages, bool) or not isinstance(max_messages, int) or max_messages < 1:
            raise _bad("max_messages", max_messages, "a positive int")
        return self._poll(max_messages, self._deadline(timeout_ms))

    # ------------------------------------------------------------ acks

    def _where(self, msg: object) -> tuple[Subscription, TxnPosition]:
        if isinstance(msg, Message):
            mid = msg.message_id
        elif isinstance(msg, MessageId):
            mid = msg
        else:
            raise _bad("msg", msg, "a Message or MessageId")
        fields = (mid.ledger_id, mid.entry_id, mid.batch_index, mid.batch_size, mid.partition)
        if any(isinstance(f, bool) or not isinstance(f, int) for f in fields) or not (
            mid.topic is None or isinstance(mid.topic, str)
        ):
            raise _bad("msg", msg, "a MessageId of ints (and a str or None topic)")
        sub = self._subs.get(mid.partition)
        if sub is None:
            raise _bad("msg", msg, f"a message of {self.topic} (no partition {mid.partition} here)")
        if mid.batch_size < 1 or not 0 <= mid.batch_index < mid.batch_size:
            raise _bad("msg", msg, "a MessageId with 0 <= batch_index < batch_size")
        came_from = msg.topic if isinstance(msg, Message) else mid.topic
        if came_from is not None and came_from != sub.partition:
            raise _bad("msg", msg, f"a message of {sub.partition} (it came from {came_from})")
        if not isinstance(msg, Message):
            # A MessageId (anyone can build one, topic included): its batch size must
            # be its entry's, or an unbatched id of a batch would acknowledge the
            # whole batch, and a larger one would leave an ack set no ack can match.
            sub.check_batch_size(mid.position)
        return sub, mid.position

    def _txn(self, txn: object) -> Transaction | None:
        if txn is None:
            return None
        if not isinstance(txn, Transaction):
            raise _bad("txn", txn, "a Transaction from client.transaction() or None")
        if txn.client.broker is not self.client.broker:
            raise _bad("txn", txn, "a transaction of the same broker")
        txn.check_usable()
        return txn

    def ack(self, msg: MessageLike, txn: Transaction | None = None) -> None:
        """Acknowledge one message (in ``txn``: pending until it commits; abort redelivers it).

        In a transaction, conflicts (already acked, held by another
        transaction) raise :class:`~txnstream.errors.TransactionConflictError`
        at once and change nothing.
        """
        self._check()
        sub, pos = self._where(msg)
        t = self._txn(txn)
        if t is None:
            sub.ack([pos])
            return
        self._ack_in(t, sub, pos, cumulative=False)

    def _ack_in(
        self, t: Transaction, sub: Subscription, pos: TxnPosition, cumulative: bool
    ) -> None:
        # Before the transaction registers the subscription: a message that
        # does not exist, or an ack that conflicts (checked again with the ack).
        sub.check_exists(pos)
        sub.check_ack(t.txn_id, pos, cumulative)
        t._join()  # from here, a commit waits for this ack
        written: Future[TxnPosition] | None = None
        try:
            t.add_subscription(sub.partition, sub.name)
            written = sub.ack_in_transaction(t.txn_id, [pos], cumulative)
        finally:
            t._joined(written)

    def ack_cumulative(self, msg: MessageLike, txn: Transaction | None = None) -> None:
        """Acknowledge every message of the message's partition up to and including it.

        Only for a consumer that has the subscription to itself (Pulsar
        allows cumulative acks on Exclusive and Failover subscriptions only):
        with other consumers attached it raises
        :class:`~txnstream.errors.InvalidArgumentError`, since it would
        acknowledge (and, when its transaction aborts, deliver again) what
        they received.
        """
        self._check()
        sub, pos = self._where(msg)
        t = self._txn(txn)
        if t is None:
            sub.ack_cumulative(pos)
            return
        self._ack_in(t, sub, pos, cumulative=True)

    def negative_ack(self, msg: MessageLike) -> None:
        """Deliver this message again after the consumer's negative-ack delay."""
        self._check()
        sub, pos = self._where(msg)
        sub.negative_ack(self.id, [pos], self._nack_delay_ms)

    def redeliver_unacknowledged(self) -> int:
        """Deliver again every message received and not acknowledged (nor held by a transaction)."""
        self._check()
        return sum(sub.redeliver_unacknowledged(self.id) for sub in self._subs.values())

    # ------------------------------------------------------------ close

    def close(self) -> None:
        """Leave the subscription: its unacknowledged messages are redelivered to others."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for sub in self._subs.values():
            sub.remove_waker(self._wake)
            sub.detach(self.id)
        self.client.broker.detach(self._partitions)
        self._wake.set()
        self.client._forget(self)

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Consumer({self.subscription!r} on {self.topic}, {self.isolation})"


__all__ = [
    "DEFAULT_NACK_DELAY_MS",
    "MAX_SEQUENCE_ID",
    "Client",
    "Consumer",
    "Producer",
    "java_string_hash",
]
