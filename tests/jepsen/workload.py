"""The consume-transform-produce workload of issue 10 §10, recording a Jepsen history.

Written against the client API shapes of SPEC §4.9 as structural protocols, so it
runs on anything shaped like the client: the in-memory simulated log of
``tests/test_jepsen_checker.py`` and the real client
(``txnstream.Broker.open(path).client(name=...)``, ``tests/test_jepsen_real.py``).

Shape:

- :func:`seed_inputs`: non-transactional sends of unique input values (phase ``setup``).
- :class:`CtpWorker`: one logical process. Each transaction receives 1-3 inputs
  from its consumer, sends one output per input to each output topic (value
  ``"<input>><topic>@<op id>"``, key = the input, property ``source`` = the input),
  acks the inputs in the transaction and commits (or, at random, aborts).
  :meth:`CtpWorker.transaction` is a generator that yields after every client call,
  so a driver can interleave workers step by step, or stop one dead (a crash);
  :meth:`CtpWorker.step` runs one transaction to its end.
- :func:`drain`: a worker commits until its input is empty (every input processed).
- :func:`final_read`: a new read_committed subscription reads a topic from the
  beginning until nothing more arrives (phase ``final``).

Outcomes: a transaction whose ``commit()`` was never called can never commit, so every
path that ends without it is ``fail``; ``commit()`` and ``abort()`` are called again
while they fail retriably (up to ``end_retry_ms``); a ``commit()`` that still raised is
``fail`` only when the error says the transaction aborted (:func:`definitely_aborted`),
else ``info``; a
process killed mid-transaction leaves its operation without ``complete`` (``info``).

The real run (``tests/test_jepsen_real.py``, worker ``tests/jepsen/real_worker.py``):
a parent seeds the inputs, starts a worker process (a broker holds its directory's
writer lock, so one process runs one worker thread per input partition, each
subscribing to its partition's topic so its reads are contiguous), kills it with
``kill -9`` at random moments and restarts it — a restarted worker must wait until
its predecessor's open transactions have timed out before it consumes, or the
pending acks they hold make its reads skip and later rewind — injects write
failures, then drains, runs :func:`final_read` on every topic, and checks
``load_history(*files)`` with :func:`tests.jepsen.checker.check`.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tests.jepsen.history import Ack, HistoryWriter, Operation, OpType, Poll, Position
from txnstream.errors import (
    TransactionAlreadyAborted,
    TransactionTimedOut,
    TransactionWriteFailed,
)


class Transaction(Protocol):
    """``client.transaction(timeout_ms)``."""

    def commit(self) -> None:
        """Commit; returns once the outcome is durable and visible."""

    def abort(self) -> None:
        """Abort."""


class Message(Protocol):
    """A received message (``value`` and ``message_id`` are all the workload needs)."""

    @property
    def value(self) -> bytes:
        """The payload."""

    @property
    def message_id(self) -> Any:
        """Has ``partition``, ``ledger_id``, ``entry_id``, ``batch_index``."""


class Producer(Protocol):
    """``client.producer(topic)``."""

    def send(
        self,
        value: bytes,
        key: str | None = None,
        properties: Mapping[str, str] | None = None,
        txn: Any = None,
    ) -> Any:
        """Send; returns the ``MessageId``."""


class Consumer(Protocol):
    """``client.subscribe(topic, subscription, isolation=...)``."""

    def receive(self, timeout_ms: int) -> Message | None:
        """The next message, or None when nothing arrives in time."""

    def ack(self, msg: Any, txn: Any = None) -> None:
        """Ack ``msg`` (in ``txn`` when given)."""

    def redeliver_unacknowledged(self) -> object:
        """Deliver again every received message not acked yet (what it returns is unused)."""


class Client(Protocol):
    """``broker.client(name=...)``."""

    def producer(self, topic: str) -> Producer:
        """A producer on ``topic``."""

    def subscribe(self, topic: str, subscription: str, isolation: str = ...) -> Consumer:
        """A consumer of ``subscription`` on ``topic``; a new one starts at the beginning."""

    def transaction(self, timeout_ms: int) -> Transaction:
        """Begin a transaction."""


def message_position(message_id: Any) -> tuple[int, Position]:
    """``(partition, (ledger_id, entry_id, batch_index))`` of a ``MessageId``."""
    return int(message_id.partition), (
        int(message_id.ledger_id),
        int(message_id.entry_id),
        int(message_id.batch_index),
    )


def definitely_aborted(error: BaseException) -> bool:
    """Whether a failed ``commit()`` says the transaction is aborted for sure.

    ``TransactionWriteFailed`` counts: the client documents that a transaction whose
    write failed "was aborted" (its decision is logged only after every write is
    durable). The checker then holds the engine to that word.
    """
    return isinstance(
        error, TransactionAlreadyAborted | TransactionTimedOut | TransactionWriteFailed
    )


@dataclass(frozen=True)
class CtpConfig:
    """One worker's topics and knobs.

    ``input_topic`` is the base topic recorded in the history; ``subscribe_topic`` the
    name subscribed to (e.g. one partition of it, ``"<input>-partition-<n>"``).
    """

    input_topic: str
    subscribe_topic: str
    output_topics: tuple[str, ...]
    subscription: str = "ctp"
    max_inputs: int = 3
    abort_share: float = 0.1
    receive_timeout_ms: int = 100
    txn_timeout_ms: int = 5_000
    end_retry_ms: int = 10_000


class CtpWorker:
    """One logical process of the consume-transform-produce workload."""

    def __init__(
        self,
        client: Client,
        history: HistoryWriter,
        process: str,
        config: CtpConfig,
        rng: random.Random,
    ) -> None:
        self.client = client
        self.history = history
        self.process = process
        self.config = config
        self.rng = rng
        self.consumer_name = f"{process}/{config.subscription}"
        self.consumer = client.subscribe(
            config.subscribe_topic, config.subscription, isolation="read_committed"
        )
        self.producers = [(t, client.producer(t)) for t in config.output_topics]
        self.count = 0
        self.last: OpType | None = None

    def step(self) -> OpType | None:
        """Run one transaction to its end: its outcome, or None if no input arrived."""
        for _ in self.transaction():
            pass
        return self.last

    def transaction(self) -> Iterator[None]:
        """One transaction, yielding after every client call (see the module docstring)."""
        self.last = None
        cfg, h = self.config, self.history
        first = self.consumer.receive(cfg.receive_timeout_ms)
        yield
        if first is None:
            return
        op = f"{self.process}.{self.count}"
        self.count += 1
        h.invoke(op, self.process, consumer=self.consumer_name)
        received = [self._record_poll(op, first)]
        txn: Transaction | None = None
        try:
            txn = self.client.transaction(timeout_ms=cfg.txn_timeout_ms)
            yield
            for _ in range(self.rng.randint(1, cfg.max_inputs) - 1):
                msg = self.consumer.receive(cfg.receive_timeout_ms)
                yield
                if msg is None:
                    break
                received.append(self._record_poll(op, msg))
            for msg, poll in received:
                for topic, producer in self.producers:
                    out = f"{poll.value}>{topic}@{op}"
                    h.send(op, topic, out, key=poll.value, source=poll.value)
                    mid = producer.send(
                        out.encode(), key=poll.value, properties={"source": poll.value}, txn=txn
                    )
                    h.sent(op, out, *message_position(mid))
                    yield
                self.consumer.ack(msg, txn=txn)
                h.ack(op, Ack(poll.topic, poll.partition, poll.position, poll.value))
                yield
        except Exception as e:
            self._abort(op, txn, f"{type(e).__name__}: {e}")
            return
        if self.rng.random() < cfg.abort_share:
            self._abort(op, txn, "chosen abort")
            return
        assert txn is not None
        try:
            self._retrying(txn.commit)
        except Exception as e:
            self.last = "fail" if definitely_aborted(e) else "info"
            h.complete(op, self.last, f"commit: {type(e).__name__}: {e}")
            return
        self.last = "ok"
        h.complete(op, "ok")

    def _retrying(self, end: Callable[[], None]) -> None:
        """``end()`` (commit or abort), again while it fails retriably, up to ``end_retry_ms``.

        What a careful user does: a retriable error (a storage error, an end still
        pending) leaves the transaction undecided or its end unfinished, and the same
        end again gets the definite answer (idempotent end, PIP-255). Moving on
        instead would leave its pending acks held until its timeout, and the inputs
        they hold would come back out of order.
        """
        deadline = time.monotonic() + self.config.end_retry_ms / 1000.0
        while True:
            try:
                end()
                return
            except Exception as e:
                if not getattr(e, "retriable", False) or time.monotonic() > deadline:
                    raise
            time.sleep(0.005)

    def _record_poll(self, op: str, msg: Message) -> tuple[Message, Poll]:
        partition, position = message_position(msg.message_id)
        poll = Poll(self.config.input_topic, partition, position, bytes(msg.value).decode())
        self.history.poll(op, poll)
        return msg, poll

    def _abort(self, op: str, txn: Transaction | None, why: str) -> None:
        """End without commit: ``fail`` whether or not the abort call itself succeeds.

        The inputs received but not acked come back: the next transaction starts over
        from them (the ones acked in the aborted transaction are released by the abort).
        """
        error = why
        if txn is not None:
            try:
                self._retrying(txn.abort)
            except Exception as e:
                error = f"{why}; abort: {type(e).__name__}: {e}"
        self.last = "fail"
        self.history.complete(op, "fail", error)
        self.consumer.redeliver_unacknowledged()


def seed_inputs(
    client: Client, history: HistoryWriter, topic: str, values: Sequence[str], process: str = "seed"
) -> None:
    """Send ``values`` to ``topic`` without a transaction (each durable on return)."""
    producer = client.producer(topic)
    op = f"{process}.0"
    history.invoke(op, process, phase="setup", transactional=False)
    for v in values:
        history.send(op, topic, v, key=v)
        history.sent(op, v, *message_position(producer.send(v.encode(), key=v)))
    history.complete(op, "ok")


def drain(worker: CtpWorker, empty_rounds: int = 2) -> None:
    """Commit transactions until ``empty_rounds`` receives in a row get nothing."""
    empty = 0
    while empty < empty_rounds:
        outcome = worker.step()
        empty = empty + 1 if outcome is None else 0


def final_read(
    client: Client,
    history: HistoryWriter,
    topic: str,
    process: str = "final",
    idle_ms: int = 200,
) -> Operation:
    """Read ``topic`` from the beginning, read_committed, until ``idle_ms`` bring nothing."""
    subscription = f"jepsen-final-{uuid.uuid4().hex[:8]}"
    consumer = client.subscribe(topic, subscription, isolation="read_committed")
    polls: list[Poll] = []
    while (msg := consumer.receive(idle_ms)) is not None:
        partition, position = message_position(msg.message_id)
        polls.append(Poll(topic, partition, position, bytes(msg.value).decode()))
    op = Operation(
        id=f"{process}.{topic}",
        process=process,
        type="ok",
        ops=tuple(polls),
        consumer=f"{process}/{subscription}",
        phase="final",
    )
    history.operation(op)
    return op
