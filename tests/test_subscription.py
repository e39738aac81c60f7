"""Dispatch state of a subscription: what its acks cost, redelivery counts (SPEC §4.5, §4.7)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from txnstream import Broker
from txnstream.broker.subscription import Subscription
from txnstream.client import Client, Consumer, Message

#: Generous: a receive that should find messages at once.
RECEIVE_MS = 10_000


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker.open(tmp_path, registry=None)
    yield b
    b.close()


def backlog(broker: Broker, n: int) -> tuple[Client, Consumer, list[Message]]:
    """Send ``n`` messages to "t" and receive them all (none acknowledged)."""
    client = broker.client()
    p = client.producer("t")
    for _ in range(n):
        p.send_async(b"x")
    p.flush()
    c = client.subscribe("t", "s")
    got: list[Message] = []
    while len(got) < n:
        more = c.receive_many(n, RECEIVE_MS)
        assert more, f"only {len(got)} of {n} messages arrived"
        got += more
    return client, c, got


class Visits(dict[Any, Any]):
    """A dict that counts the keys its iteration visits (every way of iterating it)."""

    def __init__(self, src: dict[Any, Any], count: list[int]) -> None:
        super().__init__(src)
        self.count = count

    def __iter__(self) -> Iterator[Any]:
        for k in list(super().__iter__()):
            self.count[0] += 1
            yield k

    def keys(self) -> Any:
        return list(iter(self))

    def items(self) -> Any:
        return [(k, self[k]) for k in self]

    def values(self) -> Any:
        return [self[k] for k in self]


def count_visits(sub: Subscription) -> list[int]:
    """Make ``sub`` count the delivered-message entries its operations walk."""
    count = [0]
    with sub.cond:
        sub._unacked = Visits(sub._unacked, count)
        sub._redeliveries = Visits(sub._redeliveries, count)
    return count


def test_cumulative_acks_over_a_backlog_visit_what_they_acknowledge_not_the_backlog(
    broker: Broker,
) -> None:
    # A consumer holding n delivered messages acks them cumulatively one by
    # one: each ack used to walk every delivered, unacknowledged message
    # (n^2 / 2 visits in all); it may only cost what it acknowledges.
    n = 1000
    client, c, msgs = backlog(broker, n)
    sub = broker.topic("t").subscriptions()["s"]
    visits = count_visits(sub)

    # An aborted transaction's cumulative ack delivers again what it covered.
    txn = client.transaction()
    c.ack_cumulative(msgs[9], txn=txn)
    txn.abort()
    again = c.receive_many(10, RECEIVE_MS)
    assert visits[0] <= 100, visits  # old code: every delivered message (n = 1000)
    assert [(m.message_id, m.redelivery_count) for m in again] == [
        (m.message_id, 1) for m in msgs[:10]
    ]
    msgs[:10] = again

    visits[0] = 0
    for m in msgs[: n // 2]:
        c.ack_cumulative(m)
    assert visits[0] <= 10 * n, visits  # old code: 375,305 (~3 n^2 / 8)

    visits[0] = 0
    for m in msgs[n // 2 :]:
        with client.transaction() as txn:
            c.ack_cumulative(m, txn=txn)
    assert visits[0] <= 10 * n, visits  # old code: 125,250 (~n^2 / 8)

    assert sub.stats()["unacked"] == 0
    assert c.receive(100) is None
    assert sub.cursor.mark_delete_position == msgs[-1].message_id.position.position


def test_a_negative_ack_then_an_aborted_transactional_ack_count_one_redelivery(
    broker: Broker,
) -> None:
    # The negative ack counted the redelivery it scheduled; the abort that
    # delivers the message (before the nack's delay) is that same redelivery.
    client, c, msgs = backlog(broker, 1)
    c.negative_ack(msgs[0])  # due in 60 s: still waiting at the abort
    txn = client.transaction()
    c.ack(msgs[0], txn=txn)
    txn.abort()
    again = c.receive(RECEIVE_MS)
    assert again is not None
    assert (again.message_id, again.redelivery_count) == (msgs[0].message_id, 1)


def test_a_negative_ack_falling_due_while_held_then_an_abort_count_one_redelivery(
    broker: Broker,
) -> None:
    # The negative ack falls due while a transaction holds the message (it is
    # not delivered then); the abort delivers it: once, counted once.
    client = broker.client()
    client.producer("t").send(b"x")
    c = client.subscribe("t", "s", negative_ack_redelivery_delay_ms=0)
    first = c.receive(RECEIVE_MS)
    assert first is not None
    c.negative_ack(first)
    txn = client.transaction()
    c.ack(first, txn=txn)
    assert c.receive(100) is None  # the nack is due, the transaction holds it
    txn.abort()
    got = c.receive_many(10, RECEIVE_MS)
    assert [(m.message_id, m.redelivery_count) for m in got] == [(first.message_id, 1)]
    c.ack(got[0])
    assert c.receive(100) is None
