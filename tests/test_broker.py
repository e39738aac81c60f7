"""The embedded broker end to end: topics, producers, consumers, transactions (SPEC §4.5, §4.9)."""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import txnstream as ts
from txnstream import Broker, BrokerConfig
from txnstream._native import decode_topic_entry
from txnstream.broker.subscription import READ_UNCOMMITTED
from txnstream.client import Consumer, Message, MessageId, java_string_hash
from txnstream.errors import (
    AlreadyClosedError,
    ConfigError,
    DuplicateSequenceError,
    InvalidArgumentError,
    TransactionAlreadyAborted,
    TransactionAlreadyCommitted,
    TxnStreamError,
)

DEADLINE_S = 10.0


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker.open(tmp_path / "data", registry=None)
    yield b
    b.close()


def drain(consumer: Consumer, idle_ms: int = 100) -> list[Message]:
    """Every message that arrives until ``idle_ms`` pass without one."""
    out = []
    while (m := consumer.receive(idle_ms)) is not None:
        out.append(m)
    return out


def values(msgs: list[Message]) -> list[bytes]:
    return [m.value for m in msgs]


def wait_for(pred: object, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not pred():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


# ------------------------------------------------------------------ basics


def test_send_receive_fields_and_order(broker: Broker) -> None:
    client = broker.client("c")
    p = client.producer("t", name="p1")
    ids = [p.send(b"v%d" % i, key=f"k{i}", properties={"i": str(i)}) for i in range(5)]
    assert ids == sorted(ids) and len(set(ids)) == 5
    c = client.subscribe("t", "s")
    got = drain(c)
    assert values(got) == [b"v%d" % i for i in range(5)]
    m = got[3]
    assert (m.key, m.properties, m.producer_name, m.redelivery_count) == ("k3", {"i": "3"}, "p1", 0)
    assert m.message_id == ids[3] and m.sequence_id == 3 and m.data() == b"v3"
    assert abs(m.publish_time - time.time() * 1000) < 60_000
    assert m.topic == "persistent://public/default/t"


def test_topic_name_forms_are_one_topic(broker: Broker) -> None:
    client = broker.client()
    client.producer("t").send(b"a")
    client.producer("default/t").send(b"b")
    client.producer("public/default/t").send(b"c")
    client.producer("persistent://public/default/t").send(b"d")
    assert values(drain(client.subscribe("t", "s"))) == [b"a", b"b", b"c", b"d"]
    assert broker.topic_names() == [("persistent://public/default/t", 0)]


def test_entries_use_pulsar_message_metadata(broker: Broker) -> None:
    client = broker.client()
    p = client.producer("t", name="prod")
    txn = client.transaction()
    mid = p.send(b"payload", key="k", properties={"a": "b"}, txn=txn)
    txn.commit()
    ml = broker.topic("t").ml
    entry = decode_topic_entry(ml.read(mid.position.position))
    assert entry["producer_name"] == "prod"
    assert entry["txn"] == (txn.txn_id.most_bits, txn.txn_id.least_bits)
    assert entry["messages"][0]["payload"] == b"payload"
    # The commit marker follows: marker type 21 (Pulsar TXN_COMMIT), empty payload.
    last = ml.last_position
    assert last is not None
    marker = decode_topic_entry(ml.read(last))
    assert marker["marker_type"] == 21
    assert marker["producer_name"] == "pulsar.txn.marker"


def test_send_many_is_one_batched_entry_with_batch_indexes(broker: Broker) -> None:
    client = broker.client()
    p = client.producer("t")
    ids = p.send_many([b"a", b"b", b"c"], keys=["x", None, "z"])
    assert {(i.ledger_id, i.entry_id) for i in ids} == {(ids[0].ledger_id, ids[0].entry_id)}
    assert [i.batch_index for i in ids] == [0, 1, 2] and ids[0].batch_size == 3
    c = client.subscribe("t", "s")
    got = drain(c)
    assert values(got) == [b"a", b"b", b"c"] and [m.key for m in got] == ["x", None, "z"]
    # Acking one batch index leaves the others deliverable after a redelivery.
    c.ack(got[1])
    c.redeliver_unacknowledged()
    assert values(drain(c)) == [b"a", b"c"]


def test_send_async_returns_future_of_message_id(broker: Broker) -> None:
    p = broker.client().producer("t")
    futs = [p.send_async(b"%d" % i) for i in range(20)]
    ids = [f.result(DEADLINE_S) for f in futs]
    assert ids == sorted(ids)


def test_partitioned_topic_routes_by_key_and_round_robin(broker: Broker) -> None:
    broker.admin.create_topic("pt", 3)
    client = broker.client()
    p = client.producer("pt")
    for i in range(6):
        mid = p.send(b"k", key=f"key{i}")
        assert mid.partition == java_string_hash(f"key{i}") % 3
    rr = [p.send(b"rr").partition for _ in range(6)]
    assert sorted(rr) == [0, 0, 1, 1, 2, 2]
    c = client.subscribe("pt", "s")
    assert len(drain(c)) == 12
    # One partition can be read alone.
    one = client.subscribe("pt-partition-1", "s1")
    assert all(m.message_id.partition == 1 for m in drain(one))


def test_java_string_hash_matches_java() -> None:
    # Values of Java's "...".hashCode() & Integer.MAX_VALUE.
    assert java_string_hash("") == 0
    assert java_string_hash("a") == 97
    assert java_string_hash("hello") == 99162322
    # "polygenelubricants".hashCode() is Integer.MIN_VALUE: masked, 0.
    assert java_string_hash("polygenelubricants") == 0
    # Non-BMP text hashes UTF-16 code units, as Java does.
    assert java_string_hash("\U0001f600") == (0xD83D * 31 + 0xDE00)


def test_lazy_topics_open_on_first_use(tmp_path: Path) -> None:
    with Broker.open(tmp_path, registry=None) as b:
        client = b.client()
        for i in range(20):
            client.producer(f"t{i}").send(b"x")
    with Broker.open(tmp_path, registry=None) as b:
        assert b.loaded_topics() == []
        assert len(b.topic_names()) == 20
        b.client().producer("t3")
        assert [t.full for t in b.loaded_topics()] == ["persistent://public/default/t3"]


def test_writer_lock_refuses_second_process(tmp_path: Path) -> None:
    with Broker.open(tmp_path, registry=None):
        code = (
            "import sys, txnstream as ts\n"
            "try:\n    ts.Broker.open(sys.argv[1], registry=None)\n"
            "except ts.StorageError as e:\n    print('refused', e); sys.exit(3)\n"
        )
        proc = subprocess.run(
            [sys.executable, "-c", code, str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 3, proc.stdout + proc.stderr


def test_closed_broker_refuses_calls(tmp_path: Path) -> None:
    b = Broker.open(tmp_path, registry=None)
    client = b.client()
    p = client.producer("t")
    c = client.subscribe("t", "s")
    b.close()
    b.close()  # idempotent
    for call in (lambda: p.send(b"x"), lambda: c.receive(0), b.client, client.transaction):
        with pytest.raises(ts.errors.AlreadyClosedError) as e:
            call()
        assert not e.value.retriable and not e.value.abortable
    Broker.open(tmp_path, registry=None).close()  # the lock was released


def test_receive_wakes_on_send_and_times_out_with_none(broker: Broker) -> None:
    client = broker.client()
    c = client.subscribe("t", "s")
    assert c.receive(50) is None
    p = client.producer("t")
    import threading

    t = threading.Timer(0.05, lambda: p.send(b"late"))
    t.start()
    m = c.receive(int(DEADLINE_S * 1000))
    t.join()
    assert m is not None and m.value == b"late"


def test_initial_position_latest(broker: Broker) -> None:
    client = broker.client()
    p = client.producer("t")
    p.send(b"old")
    c = client.subscribe("t", "s", initial_position="latest")
    p.send(b"new")
    assert values(drain(c)) == [b"new"]


def test_latest_read_committed_starts_at_the_last_stable_position(broker: Broker) -> None:
    # Kafka's read_committed consumer from the end: a transaction open when
    # the subscription is made is delivered once it commits (it started
    # after the last entry it could read). Found in review: it was skipped
    # for good. READ_UNCOMMITTED starts after every stored entry.
    client = broker.client()
    p = client.producer("t")
    p.send(b"old")
    t = client.transaction()
    p.send(b"in-txn", txn=t)
    p.send(b"plain-after")
    assert t.wait_durable(10_000)
    rc = client.subscribe("t", "rc", initial_position="latest")
    ru = client.subscribe("t", "ru", initial_position="latest", isolation=READ_UNCOMMITTED)
    t.commit()
    p.send(b"new")
    assert values(drain(rc)) == [b"in-txn", b"plain-after", b"new"]
    assert values(drain(ru)) == [b"new"]
    # The open transaction's message is the topic's first entry: nothing
    # is stable before it (found in review: it was still skipped).
    t2 = client.transaction()
    p2 = client.producer("t2")
    p2.send(b"in-txn", txn=t2)
    p2.send(b"plain-after")
    assert t2.wait_durable(10_000)
    rc2 = client.subscribe("t2", "rc", initial_position="latest")
    t2.commit()
    p2.send(b"new")
    assert values(drain(rc2)) == [b"in-txn", b"plain-after", b"new"]


# ------------------------------------------------------------------ visibility


def test_read_committed_vs_uncommitted_and_no_markers(broker: Broker) -> None:
    client = broker.client()
    p = client.producer("t")
    rc = client.subscribe("t", "rc")
    ru = client.subscribe("t", "ru", isolation=READ_UNCOMMITTED)
    p.send(b"before")
    t1 = client.transaction()
    p.send(b"t1-a", txn=t1)
    p.send(b"plain")  # after t1's first message: RC must wait for t1
    p.send(b"t1-b", txn=t1)
    t2 = client.transaction()
    p.send(b"t2", txn=t2)
    assert t2.wait_durable(int(DEADLINE_S * 1000))  # readers see durable entries only
    assert values(drain(rc)) == [b"before"]
    assert values(drain(ru)) == [b"before", b"t1-a", b"plain", b"t1-b", b"t2"]
    t2.abort()
    assert values(drain(rc)) == []  # t1 still pins max_read_position
    lag = broker.admin.read_committed_lag("t")["persistent://public/default/t"]
    assert lag >= 4
    t1.commit()
    # Committed in log order; t2's aborted message never; markers never.
    assert values(drain(rc)) == [b"t1-a", b"plain", b"t1-b"]
    assert values(drain(ru)) == []
    assert broker.admin.read_committed_lag("t")["persistent://public/default/t"] == 0
    stats = broker.admin.topic_stats("t")[0]
    tb = stats["transaction_buffer"]
    assert isinstance(tb, dict) and tb["ongoing"] == 0 and tb["aborted"] == 1


def test_commit_visible_when_commit_returns(broker: Broker) -> None:
    client = broker.client()
    p = client.producer("t")
    rc = client.subscribe("t", "rc")
    for i in range(20):
        with client.transaction() as txn:
            p.send(b"%d" % i, txn=txn)
        # No waiting: commit() returned, so a READ_COMMITTED reader sees it now.
        got = rc.receive_many(10, 0)
        assert values(got) == [b"%d" % i]
        rc.ack(got[0])


def test_context_manager_aborts_on_exception(broker: Broker) -> None:
    client = broker.client()
    p = client.producer("t")
    txn = client.transaction()

    def body() -> None:
        with txn:
            p.send(b"x", txn=txn)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        body()
    assert txn.state == "aborted"
    assert drain(client.subscribe("t", "s")) == []


def test_idempotent_end_and_opposite_end(broker: Broker) -> None:
    client = broker.client()
    txn = client.transaction()
    txn.commit()
    txn.commit()
    with pytest.raises(TransactionAlreadyCommitted):
        txn.abort()
    t2 = client.transaction()
    t2.abort()
    with pytest.raises(TransactionAlreadyAborted) as e:
        t2.commit()
    assert e.value.abortable


def test_timed_out_transaction_is_aborted_and_commit_says_so(broker: Broker) -> None:
    client = broker.client()
    p = client.producer("t")
    c = client.subscribe("t", "s")
    txn = client.transaction(timeout_ms=50)
    p.send(b"x", txn=txn)
    wait_for(lambda: not broker.admin.open_transactions(), "the timeout abort")
    with pytest.raises((TransactionAlreadyAborted, ts.errors.TransactionTimedOut)):
        txn.commit()
    assert drain(c) == []
    assert broker.admin.read_committed_lag("t")["persistent://public/default/t"] == 0


def test_commit_makes_at_most_three_durable_waits(broker: Broker) -> None:
    client = broker.client()
    p = client.producer("in")
    for i in range(10):
        p.send(b"%d" % i)
    out = client.producer("out")
    c = client.subscribe("in", "ctp")
    waits = []
    for _ in range(10):
        txn = client.transaction()
        msg = c.receive(1000)
        assert msg is not None
        out.send(msg.value, txn=txn)
        c.ack(msg, txn=txn)
        txn.commit()
        waits.append(txn.durable_waits)
        assert set(txn.wait_phases) <= {"written", "decision", "participants", "in_flight"}
    assert max(waits) <= 3 and min(waits) >= 1
    stats = client.commit_stats()
    assert stats["commits"] == 10 and sum(stats["waits"][:4]) == 10


# ------------------------------------------------------------------ dedup


def test_dedup_retry_returns_original_id(broker: Broker) -> None:
    client = broker.client()
    p = client.producer("t", name="p")
    first = p.send(b"a", sequence_id=10)
    again = p.send(b"a", sequence_id=10)
    assert again == first
    assert p.send(b"b") > first  # the producer continues after the highest id
    assert values(drain(client.subscribe("t", "s"))) == [b"a", b"b"]
    assert broker.topic("t").stats()["deduplication"] == {"producers": 1, "duplicates": 1}


def test_dedup_of_a_batch_that_partly_repeats_sent_ids_raises_and_writes_nothing(
    broker: Broker,
) -> None:
    # A send_many whose first id was sent before but whose later ids are new
    # is not "already sent": it raises (its new messages were silently
    # dropped and reported sent), and an exact retry of part of a batch gets
    # the original ids (indexes in the original batch).
    p = broker.client().producer("t", name="p")
    first = p.send_many([b"a3", b"a4", b"a5"], sequence_id=3)
    with pytest.raises(DuplicateSequenceError, match=r"6\.\. are new"):
        p.send_many([b"b5", b"b6", b"b7"], sequence_id=5)
    again = p.send_many([b"c4", b"c5"], sequence_id=4)
    assert again == first[1:]
    assert (again[0].batch_index, again[0].batch_size) == (1, 3)
    p.send_many([b"b6", b"b7"], sequence_id=6)
    assert broker.topic("t").ml.entry_count() == 2
    got = values(drain(broker.client().subscribe("t", "s")))
    assert got == [b"a3", b"a4", b"a5", b"b6", b"b7"]


def test_dedup_retry_of_a_batch_after_a_snapshot_that_cut_it_gets_its_ids(broker: Broker) -> None:
    # A snapshot reads the newest 128 messages: its cut fell inside the batch,
    # and the batch's messages learned their entry unevenly. The retry was
    # refused ("5 went elsewhere") instead of answered with the original ids.
    p = broker.client().producer("t", name="p")
    batch = p.send_many([b"x%d" % i for i in range(10)])  # sequence ids 0..9, one entry
    for _ in range(123):  # 10..132: the snapshot's newest 128 are 5..132
        p.send(b"y")
    broker.write_snapshots(due_only=False)  # as the broker's maintenance does on its own
    assert p.send_many([b"x%d" % i for i in range(10)], sequence_id=0) == batch


def test_dedup_an_aborted_id_stays_sendable_after_a_refused_resend(broker: Broker) -> None:
    # Re-sending an aborted message's id in a transaction that had ended was
    # refused, and the refusal forgot the id had aborted: every later re-send
    # raised DuplicateSequenceError, and the message could never be written.
    client = broker.client()
    p = client.producer("t", name="p")
    t1 = client.transaction()
    p.send(b"out-0", txn=t1, sequence_id=0)
    t1.abort()
    t2 = client.transaction()
    p.send(b"out-1", txn=t2, sequence_id=1)
    broker.admin.force_abort(t2.txn_id)
    with pytest.raises(TxnStreamError):
        p.send(b"out-0", txn=t2, sequence_id=0)  # refused: t2 ended
    assert p.last_sequence_id == 1
    t3 = client.transaction()
    p.send(b"out-0", txn=t3, sequence_id=0)
    t3.commit()
    assert values(drain(client.subscribe("t", "s", initial_position="earliest"))) == [b"out-0"]


def test_dedup_a_batch_whose_first_id_aborted_never_rewrites_persisted_ids(
    broker: Broker,
) -> None:
    # The batch's first id aborted, so the whole batch used to be written
    # again: ids 1 and 2, already persisted, were delivered twice. Now it is
    # written only if every id in it is gone or new; else nothing is.
    client = broker.client()
    p = client.producer("t", name="p")
    t1 = client.transaction()
    p.send(b"a", txn=t1, sequence_id=0)
    t1.abort()
    p.send(b"b", sequence_id=1)
    p.send(b"c", sequence_id=2)
    with pytest.raises(DuplicateSequenceError, match="1 was written; nothing is written"):
        p.send_many([b"a", b"b", b"c"], sequence_id=0)
    t2 = client.transaction()
    p.send(b"d", txn=t2, sequence_id=3)
    t2.abort()
    again = p.send_many([b"a", b"d", b"e"], sequence_id=3)  # 3 aborted; 4, 5 new
    assert len(again) == 3
    p.send(b"a", sequence_id=0)  # still sendable alone
    got = values(drain(client.subscribe("t", "s", initial_position="earliest")))
    assert got == [b"b", b"c", b"a", b"d", b"e", b"a"]


def test_dedup_across_restart(tmp_path: Path) -> None:
    with Broker.open(tmp_path, registry=None) as b:
        p = b.client().producer("t", name="p")
        ids = [p.send(b"%d" % i) for i in range(5)]
        batch = p.send_many([b"x", b"y"], sequence_id=100)
    with Broker.open(tmp_path, registry=None) as b:
        client = b.client()
        p = client.producer("t", name="p")
        assert p.last_sequence_id == 101
        assert p.send(b"2", sequence_id=2) == ids[2]
        assert p.send_many([b"x", b"y"], sequence_id=100) == batch
        fresh = p.send(b"new")
        assert fresh > batch[-1]
        assert values(drain(client.subscribe("t", "s"))) == [
            b"0",
            b"1",
            b"2",
            b"3",
            b"4",
            b"x",
            b"y",
            b"new",
        ]


def test_keyless_retries_on_a_partitioned_topic_reach_the_original_partition(
    tmp_path: Path,
) -> None:
    # A keyless message goes where its sequence id sends it, so a retry with
    # that id (after keyed sends took ids, after a restart, or as a batch)
    # reaches the partition that holds the original and writes nothing.
    # (Keyless sends may skip ids to take the next partition in turn.)
    with Broker.open(tmp_path, registry=None) as b:
        b.admin.create_topic("pt", 3)
        p = b.client().producer("pt", name="p")
        p.send(b"keyed", key="k")  # sequence id 0
        first = p.send(b"a")
        first_seq = p.last_sequence_id
        assert p.send(b"a", sequence_id=first_seq) == first
        batch = p.send_many([b"x", b"y"])
        assert p.send_many([b"x", b"y"], sequence_id=p.last_sequence_id - 1) == batch
    with Broker.open(tmp_path, registry=None) as b:
        client = b.client()
        p = client.producer("pt", name="p")
        after = p.send(b"b")  # the first send of this process
        assert p.send(b"b", sequence_id=p.last_sequence_id) == after
        assert p.send(b"a", sequence_id=first_seq) == first
        got = values(drain(client.subscribe("pt", "s", initial_position="earliest")))
        assert sorted(got) == [b"a", b"b", b"keyed", b"x", b"y"]
        assert sum(b.topic(f"pt-partition-{i}").ml.entry_count() for i in range(3)) == 4


def test_keyless_sends_take_the_partitions_in_turn_whatever_came_between(
    broker: Broker,
) -> None:
    # Pulsar's RoundRobinPartition without batching: each keyless send goes to
    # the next partition, whatever keyed sends or sends of other sizes took
    # (ids used to pick the partition, so with keyed sends in between, every
    # keyless one went to the same partition), and producers start at
    # different partitions (every new producer's first send went to 0).
    broker.admin.create_topic("pt", 2)
    broker.admin.create_topic("p3", 3)
    client = broker.client()
    p = client.producer("pt")
    keyless = []
    for i in range(20):
        p.send(b"k", key=f"user-{i}")
        keyless.append(p.send(b"x").partition)
    assert sorted(keyless) == [0] * 10 + [1] * 10
    assert all(a != b for a, b in itertools.pairwise(keyless))
    p3 = client.producer("p3")
    mixed = []
    for _ in range(6):
        mixed.append(p3.send_many([b"a", b"b"])[0].partition)
        mixed.append(p3.send(b"c").partition)
    assert sorted(mixed) == [0] * 4 + [1] * 4 + [2] * 4
    firsts = {client.producer("p3", name=f"job-{i}").send(b"x").partition for i in range(12)}
    assert firsts == {0, 1, 2}


def test_chosen_sequence_ids_stay_inside_the_id_space(tmp_path: Path) -> None:
    # Found in review: the skip to the next partition in turn took chosen ids
    # past MAX_SEQUENCE_ID (int64), and every dedup snapshot of the topic then
    # failed, at each close and after a reopen. Near the top the turn is lost
    # instead, and once no ids are left a send is refused, writing nothing.
    from txnstream.client.client import MAX_SEQUENCE_ID

    with Broker.open(tmp_path, registry=None) as b:
        b.admin.create_topic("pt", 3)
        p = b.client().producer("pt", name="p")
        p.send(b"explicit", sequence_id=MAX_SEQUENCE_ID - 1500)
        ids = p.send_many([b"x"] * 1000)
        assert len(ids) == 1000
        assert p.last_sequence_id <= MAX_SEQUENCE_ID - 1
        p.send(b"explicit", sequence_id=MAX_SEQUENCE_ID - 3)
        before = p.last_sequence_id
        with pytest.raises(InvalidArgumentError, match="no sequence ids left") as e:
            p.send_many([b"y"] * 5)
        assert e.value.argument == "sequence_id"  # type: ignore[attr-defined]
        assert p.last_sequence_id == before
        p.send(b"last")  # ids are left for one message
        assert p.last_sequence_id == MAX_SEQUENCE_ID - 1
    with Broker.open(tmp_path, registry=None) as b:  # its snapshots were written
        assert b.client().producer("pt", name="p").last_sequence_id == MAX_SEQUENCE_ID - 1


def test_keyless_batches_spread_over_the_partitions(broker: Broker) -> None:
    broker.admin.create_topic("pt", 4)
    p = broker.client().producer("pt")
    parts = [p.send_many([b"x", b"y"])[0].partition for _ in range(8)]
    assert sorted(parts) == [0, 0, 1, 1, 2, 2, 3, 3]


def test_dedup_outside_window_raises_and_writes_nothing(tmp_path: Path) -> None:
    cfg = BrokerConfig(deduplication_window=2)
    with Broker.open(tmp_path, cfg, registry=None) as b:
        p = b.client().producer("t", name="p")
        for i in range(5):
            p.send(b"%d" % i)
        with pytest.raises(DuplicateSequenceError) as e:
            p.send(b"0", sequence_id=0)
        assert "0" in str(e.value)
        assert b.topic("t").ml.entry_count() == 5


def test_dedup_of_aborted_transaction_sends_again(broker: Broker) -> None:
    client = broker.client()
    p = client.producer("t", name="p")
    txn = client.transaction()
    p.send(b"a", txn=txn, sequence_id=7)
    txn.abort()
    t2 = client.transaction()
    p.send(b"a", txn=t2, sequence_id=7)
    t2.commit()
    assert values(drain(client.subscribe("t", "s"))) == [b"a"]


# ------------------------------------------------------------------ redelivery


def test_redelivery_after_abort_and_commit_acks(broker: Broker) -> None:
    client = broker.client()
    p = client.producer("t")
    for i in range(3):
        p.send(b"%d" % i)
    c = client.subscribe("t", "s")
    msgs = drain(c)
    txn = client.transaction()
    for m in msgs:
        c.ack(m, txn=txn)
    txn.abort()
    again = drain(c)
    assert values(again) == [b"0", b"1", b"2"]
    assert [m.redelivery_count for m in again] == [1, 1, 1]
    with client.transaction() as t2:
        for m in again:
            c.ack(m, txn=t2)
    c.redeliver_unacknowledged()
    assert drain(c) == []


def test_an_abort_releasing_a_message_a_receiver_takes_meanwhile_delivers_it_once(
    broker: Broker,
) -> None:
    # The abort releases the messages it held, then tells the subscription. A
    # receive in between took a released message from the read-ahead buffer, and
    # the subscription, finding it delivered, delivered it a second time. The
    # release and the hook are now one step for receivers.
    client = broker.client()
    p = client.producer("t")
    ids = [p.send(b"m%d" % i) for i in range(3)]
    c = client.subscribe("t", "s")
    first = c.receive(1000)
    assert first is not None and first.value == b"m0"  # m1 and m2 wait in the read-ahead buffer
    sub = c._subs[-1]
    hook = sub.pending.on_end
    assert hook is not None
    in_hook = threading.Event()

    def slow_hook(txn: Any, committed: bool, messages: Any, cumulative: Any) -> None:
        if not committed:
            in_hook.set()
            time.sleep(0.3)  # a scheduling delay, widened
        hook(txn, committed, messages, cumulative)

    sub.pending.on_end = slow_hook
    txn = client.transaction()
    c.ack(ids[1], txn=txn)  # held by id before it was received
    ender = threading.Thread(target=txn.abort)
    ender.start()
    assert in_hook.wait(10)
    got = [(m.value, m.redelivery_count) for m in drain(c)]  # while the abort ends
    ender.join(10)
    got += [(m.value, m.redelivery_count) for m in drain(c)]
    assert sorted(got) == [(b"m1", 0), (b"m2", 0)]


def test_redelivery_after_consumer_closes_without_ack(broker: Broker) -> None:
    client = broker.client()
    p = client.producer("t")
    p.send(b"a")
    p.send(b"b")
    c1 = client.subscribe("t", "s")
    got = drain(c1)
    c1.ack(got[0])
    c2 = client.subscribe("t", "s")
    assert drain(c2) == []  # b is delivered to c1, not acked yet
    c1.close()
    again = drain(c2)
    assert values(again) == [b"b"] and again[0].redelivery_count == 1


def test_negative_ack_redelivers_after_delay(broker: Broker) -> None:
    client = broker.client()
    client.producer("t").send(b"a")
    c = client.subscribe("t", "s", negative_ack_redelivery_delay_ms=20)
    m = c.receive(1000)
    assert m is not None
    c.negative_ack(m)
    m2 = c.receive(int(DEADLINE_S * 1000))
    assert m2 is not None and m2.value == b"a" and m2.redelivery_count == 1


def test_acks_survive_restart(tmp_path: Path) -> None:
    with Broker.open(tmp_path, registry=None) as b:
        client = b.client()
        p = client.producer("t")
        for i in range(4):
            p.send(b"%d" % i)
        c = client.subscribe("t", "s")
        got = drain(c)
        c.ack(got[0])
        with client.transaction() as txn:
            c.ack(got[1], txn=txn)
        txn2 = client.transaction()
        c.ack(got[2], txn=txn2)  # left open: its ack is not applied
        assert txn2.wait_durable()
    with Broker.open(tmp_path, registry=None) as b:
        c = b.client().subscribe("t", "s")
        assert values(drain(c)) == [b"3"]  # got[2] is held by txn2 until it ends
        b.admin.force_abort(txn2.txn_id)
        assert values(drain(c)) == [b"2"]


def test_cumulative_ack(broker: Broker) -> None:
    client = broker.client()
    p = client.producer("t")
    for i in range(5):
        p.send(b"%d" % i)
    c = client.subscribe("t", "s")
    got = drain(c)
    c.ack_cumulative(got[2])
    c.redeliver_unacknowledged()
    assert values(drain(c)) == [b"3", b"4"]


def test_acks_by_id_of_read_ahead_messages_stop_their_delivery(broker: Broker) -> None:
    # The subscription reads ahead of what it delivered: an ack by id (individual
    # or cumulative) of a message waiting there means it is never delivered.
    client = broker.client()
    p = client.producer("t")
    ids = [p.send(b"%d" % i) for i in range(8)]
    c = client.subscribe("t", "s")
    first = c.receive(1_000)
    assert first is not None and first.value == b"0"  # 1..7 are read ahead now
    c.ack(ids[2])
    c.ack_cumulative(ids[4])
    c.ack(ids[6])
    assert values(drain(c)) == [b"5", b"7"]


def test_cumulative_ack_needs_the_subscription_to_itself(broker: Broker) -> None:
    """With two consumers on a subscription a cumulative ack would cover the other's messages.

    Before, an aborted cumulative ack then delivered again what the other
    consumer had received and was still processing. Pulsar refuses
    cumulative acks on Shared subscriptions; here a consumer that shares
    its subscription cannot ack cumulatively, with or without a transaction.
    """
    client = broker.client()
    p = client.producer("t")
    for i in range(4):
        p.send(b"%d" % i)
    a = client.subscribe("t", "s")
    b = client.subscribe("t", "s")
    m0 = a.receive(1000)
    m1 = b.receive(1000)
    m2 = a.receive(1000)
    assert m0 is not None and m1 is not None and m2 is not None
    txn = client.transaction()
    with pytest.raises(InvalidArgumentError, match="2 consumers share it") as err:
        a.ack_cumulative(m2, txn=txn)
    assert err.value.argument == "msg"  # type: ignore[attr-defined]
    # Refused before any side effect: the transaction did not register the subscription.
    assert broker.admin.get_transaction(txn.txn_id).subscriptions == ()
    with pytest.raises(InvalidArgumentError, match="2 consumers share it"):
        a.ack_cumulative(m2)
    txn.abort()
    b.ack(m1)
    b.close()  # alone again: cumulative acks are fine
    a.ack_cumulative(m2)
    a.redeliver_unacknowledged()
    assert values(drain(a)) == [b"3"]


# ------------------------------------------------------------------ recovery


def test_reopen_recovers_open_and_decided_transactions(tmp_path: Path) -> None:
    with Broker.open(tmp_path, registry=None) as b:
        client = b.client()
        p = client.producer("t")
        committed = client.transaction()
        p.send(b"c", txn=committed)
        committed.commit()
        still_open = client.transaction(timeout_ms=600_000)
        p.send(b"o", txn=still_open)
        p.send(b"plain")
    with Broker.open(tmp_path, registry=None) as b:
        client = b.client()
        rc = client.subscribe("t", "rc")
        assert values(drain(rc)) == [b"c"]  # the open one still pins the partition
        open_ids = [i.txn_id for i in b.admin.open_transactions()]
        assert open_ids == [still_open.txn_id]
        assert b.admin.transactions_older_than(0)[0].txn_id == still_open.txn_id
        assert b.admin.transactions_older_than(3600) == []
        b.admin.force_abort(still_open.txn_id)
        assert values(drain(rc)) == [b"plain"]


# ------------------------------------------------------------------ asyncio


def test_asyncio_consume_transform_produce(broker: Broker) -> None:
    client = broker.client("aio")
    p = client.producer("in")
    for i in range(20):
        p.send(b"%d" % i)

    async def main() -> list[int]:
        a = client.aio()
        out = a.producer("out")
        consumer = a.subscribe("in", "ctp")

        async def worker() -> int:
            n = 0
            while True:
                async with a.transaction() as txn:
                    msg = await consumer.receive(100)
                    if msg is None:
                        return n
                    await out.send(msg.value + b"!", txn=txn)
                    await consumer.ack(msg, txn=txn)
                n += 1

        return await asyncio.gather(*(worker() for _ in range(4)))

    counts = asyncio.run(main())
    assert sum(counts) == 20
    got = sorted(values(drain(client.subscribe("out", "check"))))
    assert got == sorted(b"%d!" % i for i in range(20))


# ------------------------------------------------------------------ metrics


def test_prometheus_metrics_of_broker(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    reg = CollectorRegistry()
    with Broker.open(tmp_path, registry=reg) as b:
        client = b.client()
        p = client.producer("t")
        c = client.subscribe("t", "s")
        open_txn = client.transaction(timeout_ms=600_000)
        p.send(b"x", txn=open_txn)
        p.send(b"y")
        with client.transaction() as txn:
            p.send(b"z", txn=txn)
        text = generate_latest(reg).decode()
        lag_line = next(
            line
            for line in text.splitlines()
            if line.startswith("txnstream_topic_read_committed_lag{")
        )
        assert float(lag_line.rsplit(" ", 1)[1]) >= 3
        assert "txnstream_client_commit_durable_waits_bucket" in text
        assert "txnstream_txn_tc_late_count" in text
        assert "txnstream_txn_pending_ack_store_bufferedwriter_batch_records" in text
        c.close()
    assert os.path.isdir(tmp_path)


def test_closed_clients_producers_and_consumers_are_forgotten_but_counted(tmp_path: Path) -> None:
    """An app that makes a client (or producer, consumer) per request holds nothing for closed ones.

    The broker used to keep every client ever made (memory and scrape time
    grew with each); the commit counters must still count their commits.
    """
    from prometheus_client import CollectorRegistry

    reg = CollectorRegistry()
    with Broker.open(tmp_path, registry=reg) as b:
        long_lived = b.client("long")
        for i in range(300):
            with b.client() as c, c.transaction() as txn:
                c.producer("t").send(b"%d" % i, txn=txn)
            long_lived.producer("t").close()
            long_lived.subscribe("t", "s").close()
        txn = long_lived.transaction()
        txn.abort()
        assert list(b.iter_clients()) == [long_lived]
        assert long_lived._producers == {} and long_lived._consumers == {}

        def counted(name: str) -> float:
            return sum(s.value for m in reg.collect() for s in m.samples if s.name == name)

        assert counted("txnstream_client_commits_total") == 300
        assert counted("txnstream_client_aborts_total") == 1
        long_lived.close()
        assert list(b.iter_clients()) == []
        assert counted("txnstream_client_aborts_total") == 1
        assert counted("txnstream_client_commit_durable_waits_count") == 300


def test_admin_api_on_a_live_broker(broker: Broker) -> None:
    admin = broker.admin
    assert admin is broker.admin
    assert admin.create_topic("pt", 2) == 2
    client = broker.client()
    c = client.subscribe("pt", "s")
    p = client.producer("pt")
    txn = client.transaction(timeout_ms=600_000)
    p.send(b"x", key="a", txn=txn)
    p.send(b"plain", key="a")  # durable once sent: so is the transaction's message before it
    c.receive_many(10, 0)
    assert ("persistent://public/default/pt", 2) in admin.topics()
    stats = admin.topic_stats("pt")
    assert [s["topic"] for s in stats] == [
        "persistent://public/default/pt-partition-0",
        "persistent://public/default/pt-partition-1",
    ]
    assert sum(admin.read_committed_lag("pt").values()) == 2
    assert admin.get_transaction(txn.txn_id).status == ts.TxnStatus.OPEN
    assert admin.get_transaction((txn.txn_id.most_bits, txn.txn_id.least_bits)).txn_id == txn.txn_id
    assert admin.get_transaction(str(txn.txn_id)).txn_id == txn.txn_id
    assert admin.coordinator_stats()[0]["open"] == 1
    assert admin.force_abort(txn.txn_id) == ts.TxnStatus.ABORTED
    assert sum(admin.read_committed_lag("pt").values()) == 0
    with pytest.raises(ts.TransactionAlreadyAborted):
        txn.commit()
    admin.set_pending_ack_batch_enabled(True)
    admin.set_transaction_log_batch_enabled(True)
    assert all(s["batch_enabled"] for s in admin.pending_ack_batch_stats().values())
    with client.transaction() as t2:
        p.send(b"y", txn=t2)
    # A committed transaction is never turned into an abort: the answer says so,
    # and its message stays visible.
    assert admin.force_abort(t2.txn_id) == ts.TxnStatus.COMMITTED
    assert b"y" in [bytes(m.value) for m in c.receive_many(10, 200)]
    admin.set_transaction_log_batch_enabled(False)


def test_reconciliation_aborts_a_transaction_its_coordinator_never_logged(tmp_path: Path) -> None:
    # A message whose transaction's NEW record never became durable (a crash
    # between the two): the coordinator does not know the id, so the
    # partition aborts it at open instead of staying pinned (pulsar#19200).
    from txnstream._native import encode_message
    from txnstream.coordinator import TxnID

    with Broker.open(tmp_path, registry=None) as b:
        client = b.client()
        client.producer("t").send(b"plain-before")
        ghost = TxnID(0, 3)
        topic = b.topic("t")
        entry = encode_message(b"ghost", "p", 0, 1, None, None, (0, 3))
        pub = topic.publish("p", [0], entry, ghost)
        assert pub.durable is not None
        pub.durable.result(DEADLINE_S)
        client.producer("t").send(b"plain-after")
        assert values(drain(client.subscribe("t", "rc"))) == [b"plain-before"]
    with Broker.open(tmp_path, registry=None) as b:
        topic = b.topic("t")
        assert topic.recovery["ongoing"] == 1 and topic.recovery["reconciled"] == 1
        client = b.client()
        rc = client.subscribe("t", "rc")
        assert values(drain(rc)) == [b"plain-before", b"plain-after"]  # before: never acked
        ru = client.subscribe("t", "ru", isolation=READ_UNCOMMITTED)
        assert values(drain(ru)) == [b"plain-before", b"ghost", b"plain-after"]
        assert topic.tb.is_aborted((0, 3))


@pytest.mark.parametrize("failure", ["read error", "no such coordinator"])
def test_reconciliation_aborts_only_when_the_coordinator_cannot_end_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    # Asking the coordinator fails at open. A coordinator not served here
    # will never end the transaction: the partition aborts it. Any other
    # failure leaves it as it is: aborting on a guess could tear a
    # transaction its coordinator committed.
    from txnstream._native import encode_message
    from txnstream.coordinator import TxnID
    from txnstream.errors import CoordinatorNotFound, StorageError

    with Broker.open(tmp_path, registry=None) as b:
        topic = b.topic("t")
        entry = encode_message(b"ghost", "p", 0, 1, None, None, (0, 3))
        pub = topic.publish("p", [0], entry, TxnID(0, 3))
        assert pub.durable is not None
        pub.durable.result(DEADLINE_S)
    with Broker.open(tmp_path, registry=None) as b:
        err = StorageError("read failed", errno=5) if failure == "read error" else None

        def ask(txn_id: TxnID) -> bool | None:
            raise err or CoordinatorNotFound(f"no coordinator {txn_id.most_bits} here")

        monkeypatch.setattr(b._coordinators(), "participant_outcome", ask)
        topic = b.topic("t")  # loads: recovery, then reconciliation
        assert topic.recovery["ongoing"] == 1
        if failure == "read error":
            assert topic.recovery["reconciled"] == 0
            assert not topic.tb.is_aborted((0, 3)) and len(topic.tb.ongoing) == 1
        else:
            assert topic.recovery["reconciled"] == 1
            deadline = time.monotonic() + DEADLINE_S
            while not topic.tb.is_aborted((0, 3)):  # once its ABORT marker is durable
                assert time.monotonic() < deadline, "the ghost transaction was not aborted"
                time.sleep(0.01)


def test_threads_and_descriptors_do_not_grow_with_topics(tmp_path: Path) -> None:
    def tasks() -> int:
        return len(os.listdir("/proc/self/task"))

    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    with Broker.open(tmp_path, registry=None) as b:
        client = b.client()
        client.producer("warm").send(b"x")
        client.subscribe("warm", "s").receive(1000)
        before_tasks, before_fds = tasks(), fds()
        counts = []
        for i in range(300):
            client.producer(f"t{i}").send(b"x")
            client.subscribe(f"t{i}", "s")
            if i in (149, 299):
                # Write behind now (the flusher would, on its own clock): every
                # loaded ledger's files are opened through the storage's cache.
                for t in b.loaded_topics():
                    t.ml.checkpoint()
                counts.append((tasks(), fds()))
        assert len(b.loaded_topics()) == 301
        # No thread per topic, subscription or pending-ack writer.
        assert counts[-1][0] - before_tasks <= 4
        # Descriptors: the storage's file cache (max_open_files, default 128)
        # fills up and then stays full; the second 150 topics add none.
        assert counts[-1][1] - before_fds <= 128 + 8
        assert counts[1][1] - counts[0][1] <= 8


def test_asyncio_send_retry_of_a_sequence_id_returns_the_original_id(broker: Broker) -> None:
    client = broker.client("aio-dedup")

    async def main() -> tuple[MessageId, MessageId, MessageId]:
        a = client.aio()
        p = a.producer("dedup-aio", name="p1")
        first = await p.send(b"a", sequence_id=7)
        again = await p.send(b"a", sequence_id=7)
        txn = a.transaction()
        in_txn = await p.send(b"b", txn=txn, sequence_id=8)
        await txn.commit()
        assert txn.durable_waits <= 3
        return first, again, in_txn

    first, again, in_txn = asyncio.run(main())
    assert again == first
    assert in_txn > first
    assert values(drain(client.subscribe("dedup-aio", "check"))) == [b"a", b"b"]


def test_idle_asyncio_receives_hold_no_thread(broker: Broker) -> None:
    """More idle receives than the client's pool has threads starve nothing.

    Each used to block a pool thread: the next receive and an abort then
    waited for traffic on the idle topics (a deadlock if that traffic waited
    for the transaction).
    """
    from txnstream.client.aio import AIO_THREADS

    broker.admin.create_topic("idle-pt", 2)

    async def main() -> None:
        a = broker.client("aio-idle").aio()
        idle = [a.subscribe(f"idle-{i}", "s") for i in range(AIO_THREADS)]
        idle.append(a.subscribe("idle-pt", "s"))  # several partitions: one waker each
        waiting = [asyncio.create_task(c.receive()) for c in idle]
        busy = a.subscribe("busy", "s")
        got = asyncio.create_task(busy.receive())
        await asyncio.sleep(0.05)
        await a.producer("busy").send(b"hello")
        msg = await asyncio.wait_for(got, DEADLINE_S)
        assert msg is not None and msg.value == b"hello"
        txn = a.transaction()
        await a.producer("out").send(b"x", txn=txn)
        await asyncio.wait_for(txn.abort(), DEADLINE_S)
        # A redelivery and a negative ack wake a waiting receive too.
        second = asyncio.create_task(busy.receive())
        await asyncio.sleep(0.05)
        busy.redeliver_unacknowledged()
        again = await asyncio.wait_for(second, DEADLINE_S)
        assert again is not None and again.redelivery_count == 1
        for i in range(AIO_THREADS):
            await a.producer(f"idle-{i}").send(b"wake")
        await a.producer("idle-pt").send(b"wake")
        woken = await asyncio.wait_for(asyncio.gather(*waiting), DEADLINE_S)
        assert [m.value for m in woken if m is not None] == [b"wake"] * (AIO_THREADS + 1)
        a.close()

    asyncio.run(main())


def test_an_asyncio_receive_cancelled_as_it_is_woken_is_cancelled(broker: Broker) -> None:
    """A cancel arriving with a wake-up is not swallowed (asyncio.wait_for did that)."""

    async def main() -> None:
        a = broker.client("aio-cancel").aio()
        c = a.subscribe("t", "s")
        for _ in range(20):
            task = asyncio.create_task(c.receive())
            await asyncio.sleep(0.01)  # waiting on its waker
            c.redeliver_unacknowledged()  # a wake-up (nothing to deliver) ...
            task.cancel()  # ... and a cancel in the same loop iteration
            done, _ = await asyncio.wait({task}, timeout=DEADLINE_S)
            assert done and task.cancelled()
        await a.producer("t").send(b"m")
        got = await asyncio.wait_for(c.receive(), DEADLINE_S)
        assert got is not None and got.redelivery_count == 0  # no cancelled receive took it

    asyncio.run(main())


def test_an_asyncio_receive_reads_a_long_undeliverable_run_without_pausing(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each look reads ~10 ms of entries; a cut-short look wakes the receive to go on.

    It used to sleep until its recheck (RECHECK_S) after every 10 ms of
    reading: with the recheck set to an hour, it would never finish.
    """
    from txnstream.client import aio

    monkeypatch.setattr(aio, "RECHECK_S", 3600.0)
    client = broker.client()
    p = client.producer("t")
    txn = client.transaction(timeout_ms=600_000)
    for f in [p.send_async(b"a", txn=txn) for _ in range(20_000)]:
        f.result(DEADLINE_S)
    txn.abort()
    p.send(b"good")

    async def main() -> Message | None:
        c = client.aio().subscribe("t", "s")
        return await asyncio.wait_for(c.receive(), 60)

    got = asyncio.run(main())
    assert got is not None and got.value == b"good"


def test_subscribe_racing_the_clients_close_never_deadlocks(broker: Broker) -> None:
    for _ in range(200):
        client = broker.client()
        errors: list[BaseException] = []

        def subscribe(c: ts.Client = client, errors: list[BaseException] = errors) -> None:
            try:
                c.subscribe("t", "s").close()
            except AlreadyClosedError:
                pass
            except BaseException as exc:
                errors.append(exc)

        t = threading.Thread(target=subscribe, daemon=True)
        t.start()
        client.close()
        t.join(DEADLINE_S)
        assert not t.is_alive(), "subscribe deadlocked with close"
        assert errors == []
    assert broker.metrics()["commits"] == 0  # and the broker's lock is free


def test_receive_stops_reading_undeliverable_entries_at_its_deadline(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 2,000 aborted entries before anything deliverable: a receive with a
    # deadline stops reading them once its deadline passed (the clock is
    # faked: 5 ms per look), instead of scanning the whole run first.
    client = broker.client()
    producer = client.producer("t")
    consumer = client.subscribe("t", "s")
    txn = client.transaction(timeout_ms=600_000)
    futures = [producer.send_async(b"x", txn=txn) for _ in range(2_000)]
    for f in futures:
        f.result(DEADLINE_S)
    txn.abort()
    import txnstream.broker.subscription as subscription_module

    fake = [time.monotonic()]

    class FakeTime:
        @staticmethod
        def monotonic() -> float:
            fake[0] += 0.005
            return fake[0]

    monkeypatch.setattr(subscription_module, "time", FakeTime)
    sub = broker.topic("t").subscription("s")
    assert sub.fetch(consumer.id, 1, fake[0] + 0.02) == []
    monkeypatch.undo()
    end = broker.topic("t").ml.last_position
    assert sub._read_after is not None and end is not None
    assert sub._read_after < end, "read the whole aborted run despite the deadline"
    assert consumer.receive(0) is None  # and a later receive goes on from there


def test_a_clean_close_makes_batched_records_durable(tmp_path: Path) -> None:
    # With batched log writes and a long delay, an open transaction's
    # ADD_SUBSCRIPTION record and its ACK record still sit in their batches
    # at close. A clean close writes them: after reopening, the coordinator
    # knows the subscription (its end reaches the pending ack) and the
    # pending-ack store holds the message. (Before, close failed them: the
    # coordinator forgot the subscription, so aborting left the ack held.)
    cfg = BrokerConfig.from_dict(
        {
            "transactionLogBatchedWriteEnabled": True,
            "transactionLogBatchedWriteMaxDelayInMillis": 1_500,
            "transactionPendingAckBatchedWriteEnabled": True,
            "transactionPendingAckBatchedWriteMaxDelayInMillis": 1_500,
        }
    )
    with Broker.open(tmp_path, cfg, registry=None) as b:
        client = b.client()
        client.producer("in").send(b"m")
        consumer = client.subscribe("in", "s")
        msg = consumer.receive(1_000)
        assert msg is not None
        txn = client.transaction(timeout_ms=600_000)
        consumer.ack(msg, txn=txn)
    with Broker.open(tmp_path, cfg, registry=None) as b:
        info = b.admin.get_transaction(txn.txn_id)
        assert list(info.subscriptions) == [("persistent://public/default/in", "s")]
        store = b.topic("in").pending_ack("s")
        assert store.transactions() == [txn.txn_id]
        b.admin.force_abort(txn.txn_id)
        assert store.transactions() == []
        again = b.client().subscribe("in", "s").receive(1_000)
        assert again is not None and again.value == b"m"  # released, redelivered


@pytest.mark.parametrize("neighbour_fails", [False, True])
def test_maintenance_unpins_a_partition_its_transactions_coordinator_forgot(
    broker: Broker, neighbour_fails: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A crash can lose the record naming a partition (an ADD still batched)
    # while the message there is durable: the coordinator then ends the
    # transaction without that partition, which stays pinned. Here the
    # message is put there directly, the coordinator never told. A
    # maintenance sweep asks about transactions ongoing across two sweeps
    # and ends this one as recovery would (aborted: it was aborted).
    # neighbour_fails: the sweep of the topic loaded before it raises every
    # time; that stopped every later topic's sweep, round after round.
    from txnstream._native import encode_message

    client = broker.client()
    txn = client.transaction(timeout_ms=600_000)
    client.producer("a").send(b"known", txn=txn)
    orphan = broker.topic("b")
    key = (txn.txn_id.most_bits, txn.txn_id.least_bits)
    pub = orphan.publish(
        "p", [0], encode_message(b"orphan", "p", 0, 1, None, None, key), txn.txn_id
    )
    assert pub.durable is not None
    pub.durable.result(DEADLINE_S)
    txn.abort()  # ends "a" only
    client.producer("b").send(b"after")
    reader = client.subscribe("b", "r")
    assert reader.receive(200) is None  # pinned behind the orphan
    if neighbour_fails:
        assert broker.loaded_topics()[0].full.endswith("/a")

        def broken() -> int:
            raise RuntimeError("this topic's sweep fails")

        monkeypatch.setattr(broker.topic("a"), "sweep_orphans", broken)
    for _ in range(2):  # seen at two sweeps in a row
        broker._next_orphan_sweep = 0.0
        broker.maintain_now()
    deadline = time.monotonic() + DEADLINE_S
    while not orphan.tb.is_aborted(key):
        assert time.monotonic() < deadline, "the orphaned transaction was not ended"
        time.sleep(0.01)
    got = reader.receive(2_000)
    assert got is not None and got.value == b"after"


def test_the_coordinator_count_cannot_be_lowered(tmp_path: Path) -> None:
    """A coordinator left out would strand its transactions (a torn commit): refused."""
    from txnstream.errors import ConfigError

    with Broker.open(tmp_path, BrokerConfig(coordinators=2), registry=None) as b:
        client = b.client()
        for _ in range(2):  # both coordinator logs exist from open; these write to them
            with client.transaction() as txn:
                client.producer("t").send(b"x", txn=txn)
    with pytest.raises(ConfigError, match="set it to at least 2") as err:
        Broker.open(tmp_path, BrokerConfig(coordinators=1), registry=None)
    assert err.value.key == "transactionCoordinatorCount"
    with Broker.open(tmp_path, BrokerConfig(coordinators=3), registry=None) as b:  # raising is fine
        assert len(b.admin.topics()) == 1


def test_admin_reads_of_an_unknown_topic_create_nothing(broker: Broker) -> None:
    from txnstream.errors import InvalidTopicNameError

    for read in (broker.admin.read_committed_lag, broker.admin.topic_stats):
        with pytest.raises(InvalidTopicNameError, match="does not exist"):
            read("nonexistent")
    assert broker.admin.topics() == []


def test_the_coordinator_batch_switch_is_checked_like_the_pending_ack_one(tmp_path: Path) -> None:
    from txnstream.errors import ConfigError

    cfg = BrokerConfig.from_dict(
        {
            "transactionLogBatchedWriteMaxRecords": 2,  # below PIP-160's minimum when enabled
            "transactionPendingAckBatchedWriteMaxRecords": 2,
        }
    )
    with Broker.open(tmp_path, cfg, registry=None) as b:
        for switch in (
            b.admin.set_pending_ack_batch_enabled,
            b.admin.set_transaction_log_batch_enabled,
        ):
            with pytest.raises(ConfigError, match="must be at least 10"):
                switch(True)
        assert not b.config.transaction_log_batched_write.enabled
        assert not any(
            w["batch_enabled"] for w in b.admin.batched_log_stats("coordinator")["writers"]
        )


def test_batch_switches_at_once_both_persist_and_a_closed_broker_writes_none(
    tmp_path: Path,
) -> None:
    """The file's read-merge-write is one switch at a time; a closed broker refuses first."""
    from txnstream.config import read_dynamic_config

    with Broker.open(tmp_path, registry=None) as b:
        for value in [False, True] * 10:  # unlocked, 2 of 3 rounds lost one (review)
            both = [
                threading.Thread(target=b.admin.set_transaction_log_batch_enabled, args=(value,)),
                threading.Thread(target=b.admin.set_pending_ack_batch_enabled, args=(value,)),
            ]
            for t in both:
                t.start()
            for t in both:
                t.join(DEADLINE_S)
            assert read_dynamic_config(tmp_path) == {
                "transactionLogBatchedWriteEnabled": value,
                "transactionPendingAckBatchedWriteEnabled": value,
            }
    for switch in (
        b.admin.set_transaction_log_batch_enabled,
        b.admin.set_pending_ack_batch_enabled,
    ):
        with pytest.raises(AlreadyClosedError):
            switch(False)
    assert all(read_dynamic_config(tmp_path).values())  # nothing written after close


def test_a_batch_switch_whose_apply_closes_the_broker_returns(tmp_path: Path) -> None:
    b = Broker.open(tmp_path, registry=None)
    b.set_dynamic("transactionPendingAckBatchedWriteEnabled", True, lambda _on: b.close())
    with pytest.raises(AlreadyClosedError):
        b.client()


def test_the_capitalised_pip_255_key_reaches_the_coordinators(tmp_path: Path) -> None:
    cfg = BrokerConfig.from_broker_conf_text("TransactionMetaPersistCount=0\n")
    with Broker.open(tmp_path, cfg, registry=None) as b:
        assert b.coordinators is not None
        tcs = b.coordinators.coordinators()
        assert [tc.config.transaction_meta_persist_count for tc in tcs] == [0] * len(tcs)
    bad = BrokerConfig.from_broker_conf_text("transactionMetaPersistCount=-1\n")
    with pytest.raises(ConfigError, match="transactionMetaPersistCount must") as e:
        Broker.open(tmp_path / "bad", bad, registry=None)
    assert e.value.key == "transactionMetaPersistCount"


def test_a_live_batch_switch_is_persisted_like_a_pulsar_dynamic_setting(tmp_path: Path) -> None:
    """It survives a restart, and the directory's file views show it while the broker runs."""
    from txnstream.config import read_dynamic_config

    with Broker.open(tmp_path, registry=None) as b:
        b.admin.set_transaction_log_batch_enabled(True)
        b.admin.set_pending_ack_batch_enabled(True)
        assert read_dynamic_config(tmp_path) == {
            "transactionLogBatchedWriteEnabled": True,
            "transactionPendingAckBatchedWriteEnabled": True,
        }
    with Broker.open(tmp_path, registry=None) as b:  # the default config says off
        assert b.config.transaction_log_batched_write.enabled
        assert b.config.pending_ack_batched_write.enabled
        b.admin.set_transaction_log_batch_enabled(False)
    assert read_dynamic_config(tmp_path)["transactionLogBatchedWriteEnabled"] is False


def test_open_creates_a_new_data_directory_durably(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Broker.open made the directory with os.makedirs before the storage ran,
    # and the storage syncs only the parents of directories it creates: the
    # new directories' entries stayed in the page cache, and a power cut could
    # take the data directory, with everything acknowledged in it, away.
    import txnstream.durable_file as durable_file

    synced: list[Path] = []
    real_fsync_dir = durable_file.fsync_dir

    def recording_fsync_dir(path: Path) -> None:
        synced.append(Path(path))
        real_fsync_dir(path)

    monkeypatch.setattr(durable_file, "fsync_dir", recording_fsync_dir)
    data = tmp_path / "a" / "b" / "data"
    Broker.open(data, registry=None).close()
    assert {tmp_path, tmp_path / "a", tmp_path / "a" / "b"} <= set(synced)


def test_a_subscription_opening_while_its_topic_closes_is_closed_and_frees_the_directory(
    tmp_path: Path,
) -> None:
    """Topic.close() closed the subscriptions registered when it began.

    One still opening registered afterwards: its pending-ack log stayed open
    after Broker.close(), and no other process could open the directory.
    """
    data = tmp_path / "data"
    b = Broker.open(data, registry=None)
    b.client("c").producer("t").send(b"x")
    topic = b.topic("t")
    opened: list[Any] = []
    real_open = topic._open_subscription

    def open_then_close_topic(*args: Any) -> Any:
        sub = real_open(*args)
        opened.append(sub)
        topic.close()  # the broker closes its topics meanwhile
        return sub

    topic._open_subscription = open_then_close_topic  # type: ignore[method-assign,assignment]
    with pytest.raises(ts.errors.AlreadyClosedError, match="closed while subscription"):
        topic.subscription("late")
    assert opened and opened[0].pending.log_ml.closed
    assert "late" not in topic.subscriptions()
    b.close()
    probe = "import sys, txnstream as ts; ts.Broker.open(sys.argv[1], registry=None).close()"
    done = subprocess.run([sys.executable, "-c", probe, str(data)], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()[-500:]


def test_a_partitioned_topic_whose_partitions_could_not_be_subscribed_is_refused(
    broker: Broker,
) -> None:
    """The length check covered the base name: with -partition-N no subscription could open."""
    name = "a" * 161
    with pytest.raises(ts.errors.InvalidTopicNameError, match="too long to store with 2"):
        broker.admin.create_topic(name, 2)
    assert broker.admin.create_topic(name, 0) == 0  # alone it fits
    broker.client("c").subscribe(name, "s").close()
    shorter = "b" * 140
    assert broker.admin.create_topic(shorter, 2) == 2
    broker.client("c").subscribe(shorter, "s").close()


def test_acking_a_batch_by_message_ids_decodes_its_entry_once(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each ack by MessageId checked the id's batch size by decoding the whole entry.

    Acking a batch of B messages by id cost O(B^2): 4,000 acks took 18.8 s.
    """
    import txnstream.broker.subscription as subscription

    decodes = [0]
    real = subscription.decode_topic_entry  # type: ignore[attr-defined]

    def counting(entry: Any) -> Any:
        decodes[0] += 1
        return real(entry)

    monkeypatch.setattr(subscription, "decode_topic_entry", counting)
    client = broker.client()
    client.producer("t").send_many([b"x"] * 200)
    c = client.subscribe("t", "s")
    msgs = c.receive_many(200, 2_000)
    assert len(msgs) == 200
    for m in msgs:
        c.ack(m.message_id)
    assert decodes[0] == 1
    c.redeliver_unacknowledged()
    assert drain(c) == []  # every ack applied


# ------------------------------------------------- topic-entry bindings (message.rs)


def test_read_messages_refuses_an_unknown_cursor_instead_of_creating_one(tmp_path: Path) -> None:
    # A cursor name the topic did not have (a typo) was opened, i.e. created:
    # a durable cursor before the first entry that pinned every ledger.
    from txnstream import _native as n

    ml = n.ManagedLedger.open(tmp_path, "topic", max_entries_per_ledger=2)
    sub = ml.open_cursor("sub")
    for i in range(5):
        last = ml.append(n.encode_message(b"m%d" % i, "p", i, 0))
    sub.mark_delete(last)
    with pytest.raises(InvalidArgumentError, match='has no cursor "sbu"'):
        n.read_messages(ml, "sbu")
    assert ml.cursor_names() == ["sub"]
    x = ml.append(n.encode_message(b"x", "p", 9, 0))
    sub.flush()
    assert [lid for lid, _, _ in ml.ledgers()] == [x.ledger_id]  # trimmed as before
    _, _, rows, _ = n.read_messages(ml, "sub")
    assert [r[4] for r in rows] == [b"x"]
    ml.close()


def _message_binding_calls(ml: Any) -> list[tuple[str, Any, str]]:
    from txnstream import _native

    n: Any = _native  # the calls are wrong on purpose

    return [
        ("sequence_id", lambda: n.encode_message(b"x", "p", -1, 0), "sequence_id must be >= 0"),
        ("publish_time", lambda: n.encode_message(b"x", "p", 1, 2**64), r"publish_time.*2\*\*64"),
        ("sequence_id", lambda: n.encode_message(b"x", "p", True, 0), "must be an int, not bool"),
        ("producer_name", lambda: n.encode_message(b"x", b"p", 1, 0), "must be a str, not bytes"),
        ("payload", lambda: n.encode_message("x", "p", 1, 0), "payload must be bytes"),
        ("key", lambda: n.encode_message(b"x", "p", 1, 0, key=5), "key must be a str"),
        ("properties", lambda: n.encode_message(b"x", "p", 1, 0, properties="ab"), "sequence"),
        ("properties", lambda: n.encode_message(b"x", "p", 1, 0, properties=[("a", 1)]), r"\[0\]"),
        ("txn", lambda: n.encode_message(b"x", "p", 1, 0, txn=(1, -2)), "txn least_bits"),
        ("most_bits", lambda: n.encode_marker(True, 2**64, 0, 0), r"most_bits.*2\*\*64"),
        ("commit", lambda: n.encode_marker(1, 0, 0, 0), "commit must be a bool, not int"),
        (
            "messages",
            lambda: n.encode_batch_message([(b"x", None, None)], "p", 0),
            r"messages\[0\]",
        ),
        ("sequence_id", lambda: n.encode_batch_message([(b"x", None, None, -1)], "p", 0), ">= 0"),
        ("entry", lambda: n.decode_topic_entry("x"), "entry must be bytes"),
        ("max_entries", lambda: n.read_messages(ml, None, None, None, 2**63), "max_entries"),
        ("max_entries", lambda: n.read_messages(ml, max_entries=True), "not bool"),
        ("cursor", lambda: n.read_messages(ml, 5), "cursor must be a str"),
        ("max_entries", lambda: n.scan_topic(ml, None, 0), "max_entries must be in 1"),
        ("max_entries", lambda: n.scan_topic(ml, max_entries="9"), "must be an int, not str"),
    ]


def test_message_bindings_refuse_bad_arguments_with_typed_errors(tmp_path: Path) -> None:
    # PyO3's own conversions raised bare OverflowError/TypeError without the
    # argument's name, and took True for 1 (SPEC §5).
    from txnstream import _native as n

    ml = n.ManagedLedger.open(tmp_path, "topic")
    ml.append(n.encode_message(b"x", "p", 1, 0))
    for name, call, match in _message_binding_calls(ml):
        with pytest.raises(InvalidArgumentError, match=match) as info:
            call()
        assert name in str(info.value)
    # Any buffer is a payload; the encodings are the same.
    assert n.encode_message(bytearray(b"x"), "p", 1, 0) == n.encode_message(b"x", "p", 1, 0)
    entry = n.encode_message(b"x", "p", 1, 7, "k", [("a", "b")], (1, 2))
    assert decode_topic_entry(memoryview(entry))["messages"][0]["properties"] == [("a", "b")]
    ml.close()
