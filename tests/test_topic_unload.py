"""Idle partitions unload and reload as after a restart (memory follows the topics in use)."""

from __future__ import annotations

import gc
import random
import threading
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from txnstream import Broker, BrokerConfig
from txnstream.broker.topic import Topic
from txnstream.client import Client, Consumer, Message
from txnstream.errors import InvalidTxnStatusError
from txnstream.testing import ManualClock

#: Longer than the default ``topic_idle_unload_ms`` (ten minutes).
PAST_IDLE_MS = 3_600_000


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def broker(tmp_path: Path, clock: ManualClock) -> Iterator[Broker]:
    b = Broker.open(
        tmp_path / "data",
        BrokerConfig(pending_ack_trim_interval_ms=1 << 31),
        clock=clock,
        registry=None,
    )
    yield b
    b.close()


def idle_rounds(broker: Broker, clock: ManualClock) -> None:
    """A maintenance round, the idle time passing, another round."""
    broker.maintain_now()
    clock.advance(PAST_IDLE_MS)
    broker.maintain_now()


def loaded(broker: Broker) -> list[str]:
    return [t.full.rsplit("/", 1)[1] for t in broker.loaded_topics()]


def drain(consumer: Consumer, idle_ms: int = 200) -> list[Message]:
    out = []
    while (m := consumer.receive(idle_ms)) is not None:
        out.append(m)
    return out


def live_topics() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, Topic))


# ------------------------------------------------------------------ memory


def use_once(client: Client, topic: str) -> None:
    """Send one message, receive and ack it, close both (nothing is kept)."""
    p = client.producer(topic)
    p.send(b"x")
    p.close()
    c = client.subscribe(topic, "s")
    m = c.receive(10_000)
    assert m is not None
    c.ack(m)
    c.close()


def test_idle_topics_unload_and_their_memory_is_returned(
    broker: Broker, clock: ManualClock
) -> None:
    n = 1_000
    client = broker.client("c")
    warm = client.producer("warm-up")  # per-process caches and first-use allocations
    warm.send(b"x")
    warm.close()
    idle_rounds(broker, clock)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i in range(n):
            use_once(client, f"t{i}")
        assert len(broker.loaded_topics()) == n
        gc.collect()
        in_use = tracemalloc.get_traced_memory()[0] - base
        idle_rounds(broker, clock)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert broker.loaded_topics() == []
    assert broker.topics_unloaded >= n
    assert live_topics() == 0
    # Loaded, a topic with a subscription holds several KB (about 10 here);
    # what stays is bounded caches (parsed names) and the snapshot writer's key.
    assert in_use > 4_000 * n
    assert after < 1_500 * n, f"{after / n:.0f} bytes per unloaded topic"
    assert broker.metrics()["loaded_topics"] == 0
    assert broker.admin.loaded_topics()["loaded"] == 0


def test_idle_unload_can_be_switched_off(tmp_path: Path, clock: ManualClock) -> None:
    cfg = BrokerConfig.from_dict(
        {"topicIdleUnloadMs": 0, "transactionPendingAckTrimIntervalMs": 1 << 31}
    )
    assert cfg.topic_idle_unload_ms == 0
    with Broker.open(tmp_path / "d", cfg, clock=clock, registry=None) as b:
        p = b.client().producer("t")
        p.send(b"x")
        p.close()
        idle_rounds(b, clock)
        assert loaded(b) == ["t"]
        assert not b.tiered.metadata.offloaded_ledgers("persistent://public/default/t")


# ------------------------------------------------------------------ what keeps a topic loaded


def test_attached_clients_open_transactions_and_pending_acks_keep_a_topic_loaded(
    broker: Broker, clock: ManualClock
) -> None:
    client = broker.client("c")
    for t in ("prod", "cons", "txn", "acks", "idle"):
        p = client.producer(t)
        p.send(b"m")
        if t != "prod":
            p.close()
    consumer = client.subscribe("cons", "s")
    txn = client.transaction(timeout_ms=3 * PAST_IDLE_MS)
    writer = client.producer("txn")
    writer.send(b"open", txn=txn)
    writer.close()
    acker = client.subscribe("acks", "s")
    held = acker.receive(10_000)
    assert held is not None
    ack_txn = client.transaction(timeout_ms=3 * PAST_IDLE_MS)
    acker.ack(held, txn=ack_txn)
    acker.close()
    idle_rounds(broker, clock)
    assert sorted(loaded(broker)) == ["acks", "cons", "prod", "txn"]
    consumer.close()
    txn.commit()
    ack_txn.commit()
    idle_rounds(broker, clock)
    assert loaded(broker) == ["prod"]


# ------------------------------------------------------------------ correctness after a reload


def test_dedup_survives_an_unload_through_the_snapshot_written_at_unload(
    tmp_path: Path, clock: ManualClock
) -> None:
    # Small ledgers, acked and trimmed: a full replay would not see the early
    # sequence ids; the reload must recover from the snapshot the unload wrote.
    cfg = BrokerConfig(max_entries_per_ledger=2, pending_ack_trim_interval_ms=1 << 31)
    with Broker.open(tmp_path / "d", cfg, clock=clock, registry=None) as b:
        client = b.client("c")
        p = client.producer("t", name="p")
        ids = [p.send(b"v%d" % i) for i in range(6)]
        p.close()
        c = client.subscribe("t", "s")
        got = drain(c)
        assert [m.value for m in got] == [b"v%d" % i for i in range(6)]
        c.ack_cumulative(got[-1])
        c.close()
        idle_rounds(b, clock)
        assert loaded(b) == []
        p = client.producer("t", name="p")
        assert p.last_sequence_id == 5
        topic = b.topic("t")
        assert topic.recovery.get("from_snapshot") == 1
        first_ledger = topic.ml.first_position
        assert first_ledger is not None and first_ledger.ledger_id > ids[0].ledger_id  # trimmed
        entries = topic.ml.entry_count()
        assert p.send(b"retry", sequence_id=1) == ids[1]
        assert topic.ml.entry_count() == entries  # nothing written
        p.close()
        idle_rounds(b, clock)  # a second unload and reload of the same topic
        assert loaded(b) == []
        p = client.producer("t", name="p")
        assert p.send(b"retry", sequence_id=4) == ids[4]
        assert b.topic("t").recovery.get("from_snapshot") == 1
        p.close()


def test_read_committed_and_subscription_positions_after_a_reload(
    broker: Broker, clock: ManualClock
) -> None:
    client = broker.client("c")
    p = client.producer("t")
    aborted = client.transaction()
    p.send(b"aborted", txn=aborted)
    p.send(b"plain-1")
    aborted.abort()
    committed = client.transaction()
    p.send(b"committed", txn=committed)
    committed.commit()
    p.send(b"plain-2")
    p.send(b"plain-3")
    p.close()
    c = client.subscribe("t", "s")
    first = drain(c)
    assert [m.value for m in first] == [b"plain-1", b"committed", b"plain-2", b"plain-3"]
    c.ack(first[0])
    c.ack(first[2])
    acking = client.transaction()
    c.ack(first[1], txn=acking)
    acking.commit()
    c.close()
    idle_rounds(broker, clock)
    assert loaded(broker) == []

    c = client.subscribe("t", "s")  # reloads: positions and acks kept
    assert [m.value for m in drain(c)] == [b"plain-3"]
    c.close()
    fresh = client.subscribe("t", "fresh")  # a new READ_COMMITTED reader: the abort is known
    assert [m.value for m in drain(fresh)] == [b"plain-1", b"committed", b"plain-2", b"plain-3"]
    fresh.close()
    tb = broker.topic("t").tb
    assert len(tb.aborted) == 1 and not tb.ongoing


# ------------------------------------------------------------------ races


def test_clients_racing_the_unload_never_see_a_closed_topic(tmp_path: Path) -> None:
    clock = ManualClock()
    cfg = BrokerConfig(topic_idle_unload_ms=1, pending_ack_trim_interval_ms=1 << 31)
    topics = [f"t{i}" for i in range(8)]
    workers, rounds = 4, 150
    errors: list[BaseException] = []
    sent: dict[str, list[bytes]] = {t: [] for t in topics}
    sent_lock = threading.Lock()
    stop = threading.Event()
    with Broker.open(tmp_path / "d", cfg, clock=clock, registry=None) as b:
        for topic in topics:
            b.create_topic(topic)

        def unloader() -> None:
            try:
                while not stop.is_set():
                    clock.advance(10)
                    b.maintain_now()
            except BaseException as e:
                errors.append(e)

        def worker(w: int) -> None:
            rnd = random.Random(w)
            client = b.client(f"w{w}")
            try:
                for i in range(rounds):
                    topic = rnd.choice(topics)
                    kind = rnd.randrange(4)
                    if kind == 0:  # subscribe, read a little, leave
                        c = client.subscribe(topic, f"sub{w}")
                        c.receive(1)
                        c.close()
                    elif kind == 1:  # a transaction
                        p = client.producer(topic)
                        txn = client.transaction()
                        value = b"w%d-%d-txn" % (w, i)
                        p.send(value, txn=txn)
                        txn.commit()
                        p.close()
                        with sent_lock:
                            sent[topic].append(value)
                    elif kind == 2:  # admin looks at it
                        b.admin.topic_stats(topic)
                    else:
                        p = client.producer(topic)
                        value = b"w%d-%d" % (w, i)
                        p.send(value)
                        p.close()
                        with sent_lock:
                            sent[topic].append(value)
            except BaseException as e:
                errors.append(e)
            finally:
                client.close()

        u = threading.Thread(target=unloader)
        ws = [threading.Thread(target=worker, args=(w,)) for w in range(workers)]
        u.start()
        for t in ws:
            t.start()
        for t in ws:
            t.join(120)
        stop.set()
        u.join(60)
        assert not u.is_alive() and not any(t.is_alive() for t in ws)
        assert errors == []
        assert b.topics_unloaded > 0  # the race did happen
        client = b.client("check")
        for topic in topics:
            c = client.subscribe(topic, "check")
            got = [m.value for m in drain(c)]
            c.close()
            assert sorted(got) == sorted(sent[topic]), topic


def test_a_partition_refusing_an_ended_transactions_sends_stays_loaded(
    tmp_path: Path, clock: ManualClock
) -> None:
    """Found in review: the buffer refuses a late send of a transaction that
    ended here (above its coordinator's low-water mark) from memory no
    snapshot keeps. Unloaded and reloaded, the partition took the send of a
    timed-out transaction as a new open one, and READ_COMMITTED readers
    stalled behind it until the orphan sweep. It stays loaded until the
    low-water mark passes the transaction."""
    from txnstream import testing

    cfg = BrokerConfig(pending_ack_trim_interval_ms=1 << 31)
    with Broker.open(tmp_path / "d", cfg, clock=clock, registry=None) as b:
        c = b.client("c")
        older = [c.transaction(timeout_ms=10_800_000) for _ in range(8)]
        late = c.transaction(timeout_ms=1_000)
        keep = [t for t in older if t.txn_id.most_bits == late.txn_id.most_bits]
        assert keep  # an older open transaction of its coordinator holds the low-water mark
        p = c.producer("b")
        p.send(b"in-txn", txn=late)
        p.close()
        clock.advance(5_000)  # it times out: its coordinator aborts it (the client is not told)
        testing.fire_timeout(b._coordinators().get(late.txn_id.most_bits), late.txn_id)
        testing.wait_until(lambda: not b.topic("b").tb.ongoing, 10_000)
        idle_rounds(b, clock)
        assert "b" in loaded(b)
        p2 = c.producer("b")
        with pytest.raises(InvalidTxnStatusError):
            p2.send(b"late", txn=late)
        p2.send(b"plain-after")
        s = c.subscribe("b", "s")
        assert [bytes(m.value) for m in drain(s)] == [b"plain-after"]
        s.close()
        p2.close()
        for t in older:
            t.abort()
        tc = b._coordinators().get(late.txn_id.most_bits)
        clock.advance(5_000)  # their completions (after the decision) may wait for a timer
        testing.wait_until(lambda: tc._table.low_water_mark() >= late.txn_id.least_bits, 10_000)
        idle_rounds(b, clock)
        assert "b" not in loaded(b)  # the low-water mark passed it: the rule refuses it now


def test_under_an_offload_policy_closed_ledgers_not_uploaded_keep_a_topic_loaded(
    tmp_path: Path, clock: ManualClock
) -> None:
    """Found in review: the policy offloads loaded partitions only (the
    maintenance round), so an idle one unloaded before its ledgers were old
    enough was never offloaded, and its ledgers stayed local for good."""
    cfg = BrokerConfig(
        offload_threshold_bytes=1 << 40,  # a policy that selects nothing yet
        max_entries_per_ledger=2,
        pending_ack_trim_interval_ms=1 << 31,
    )
    with Broker.open(tmp_path / "d", cfg, clock=clock, registry=None) as b:
        p = b.client("c").producer("t")
        for i in range(6):
            p.send(b"m%d" % i)
        p.close()
        p2 = b.client("c").producer("single")
        p2.send(b"x")  # one ledger, still open: nothing waits for the policy
        p2.close()
        idle_rounds(b, clock)
        assert loaded(b) == ["t"]
        assert not b.tiered.metadata.offloaded_ledgers("persistent://public/default/t")
