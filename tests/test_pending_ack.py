"""Pending ack (SPEC §4.7): the conflict table, commit/abort, the log and its trimming."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from txnstream import Broker, TxnPosition
from txnstream.client import Client, Consumer, Message
from txnstream.config import BrokerConfig
from txnstream.coordinator import TxnID
from txnstream.errors import (
    AlreadyClosedError,
    InvalidArgumentError,
    InvalidTxnStatusError,
    TransactionConflictError,
)
from txnstream.pendingack import PendingAckStore
from txnstream.proto import ABORT, ACK, COMMIT, Cumulative, PendingAckMetadataEntry
from txnstream.replay import replay
from txnstream.testing import wait_until


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker.open(tmp_path, registry=None)
    yield b
    b.close()


def setup(broker: Broker, n: int = 5, batch: int = 0) -> tuple[Client, Consumer, list[Message]]:
    client = broker.client()
    p = client.producer("t")
    for i in range(n):
        p.send(b"%d" % i)
    if batch:
        p.send_many([b"b%d" % i for i in range(batch)])
    c = client.subscribe("t", "s")
    msgs = []
    while (m := c.receive(100)) is not None:
        msgs.append(m)
    return client, c, msgs


def store(broker: Broker) -> PendingAckStore:
    return broker.topic("t").pending_ack("s")


def unchanged(st: PendingAckStore, before: dict[str, int]) -> None:
    after = st.stats()
    for k in ("transactions", "held_entries", "acks"):
        assert after[k] == before[k], k


# ------------------------------------------------------------------ individual


def test_individual_ack_of_message_already_acked_conflicts(broker: Broker) -> None:
    client, c, msgs = setup(broker)
    c.ack(msgs[0])
    txn = client.transaction()
    before = store(broker).stats()
    with pytest.raises(TransactionConflictError, match="already acknowledged") as e:
        c.ack(msgs[0], txn=txn)
    assert e.value.abortable
    unchanged(store(broker), before)


def test_individual_ack_held_by_another_or_same_txn_conflicts(broker: Broker) -> None:
    client, c, msgs = setup(broker)
    t1, t2 = client.transaction(), client.transaction()
    c.ack(msgs[1], txn=t1)
    before = store(broker).stats()
    with pytest.raises(TransactionConflictError, match="pending ack"):
        c.ack(msgs[1], txn=t2)
    with pytest.raises(TransactionConflictError, match="pending ack"):
        c.ack(msgs[1], txn=t1)
    unchanged(store(broker), before)
    # Outside any transaction too: the message is held.
    with pytest.raises(TransactionConflictError, match="held by transaction"):
        c.ack(msgs[1])
    t1.commit()
    t2.abort()


def test_failed_multi_position_ack_changes_nothing(broker: Broker) -> None:
    client, c, msgs = setup(broker)
    t1, t2 = client.transaction(), client.transaction()
    c.ack(msgs[2], txn=t1)
    st = store(broker)
    before = st.stats()
    with pytest.raises(TransactionConflictError):
        st.ack(t2.txn_id, [msgs[0].message_id.position, msgs[2].message_id.position])
    unchanged(st, before)
    assert st.holder(msgs[0].message_id.position) is None


def test_batch_indexes_overlap_conflicts_and_disjoint_ones_merge(broker: Broker) -> None:
    client, c, msgs = setup(broker, n=0, batch=4)
    assert [m.message_id.batch_index for m in msgs] == [0, 1, 2, 3]
    t1, t2 = client.transaction(), client.transaction()
    c.ack(msgs[0], txn=t1)
    c.ack(msgs[1], txn=t2)  # another index of the same entry: merges
    c.ack(msgs[2], txn=t1)
    with pytest.raises(TransactionConflictError, match="batch index is held"):
        c.ack(msgs[1], txn=t1)
    with pytest.raises(TransactionConflictError):
        c.ack(msgs[0], txn=t2)
    t1.commit()
    # Committed indexes are acked on the cursor: acking them again conflicts.
    t3 = client.transaction()
    with pytest.raises(TransactionConflictError, match="already acknowledged"):
        c.ack(msgs[2], txn=t3)
    t2.abort()
    c.redeliver_unacknowledged()
    left = []
    while (m := c.receive(100)) is not None:
        left.append(m.message_id.batch_index)
    assert left == [1, 3]


def test_batch_index_acked_outside_txn_conflicts(broker: Broker) -> None:
    client, c, msgs = setup(broker, n=0, batch=3)
    c.ack(msgs[1])
    txn = client.transaction()
    with pytest.raises(TransactionConflictError, match="already acknowledged"):
        c.ack(msgs[1], txn=txn)
    c.ack(msgs[0], txn=txn)  # a different index is fine
    txn.commit()


# ------------------------------------------------------------------ cumulative


def test_cumulative_one_holder_per_subscription(broker: Broker) -> None:
    client, c, msgs = setup(broker)
    t1, t2 = client.transaction(), client.transaction()
    c.ack_cumulative(msgs[1], txn=t1)
    with pytest.raises(TransactionConflictError, match="holds the cumulative ack"):
        c.ack_cumulative(msgs[3], txn=t2)
    # Below the holder's own position: conflict; above it: moves forward.
    with pytest.raises(TransactionConflictError, match="at or below"):
        c.ack_cumulative(msgs[0], txn=t1)
    c.ack_cumulative(msgs[2], txn=t1)
    # An individual ack of another transaction under the cumulative one: conflict.
    with pytest.raises(TransactionConflictError, match="cumulative ack"):
        c.ack(msgs[0], txn=t2)
    t1.commit()
    t2.abort()
    c.redeliver_unacknowledged()
    rest = []
    while (m := c.receive(100)) is not None:
        rest.append(m.value)
    assert rest == [b"3", b"4"]


def test_cumulative_at_or_below_mark_delete_conflicts(broker: Broker) -> None:
    client, c, msgs = setup(broker)
    c.ack_cumulative(msgs[2])
    txn = client.transaction()
    with pytest.raises(TransactionConflictError, match="mark-delete"):
        c.ack_cumulative(msgs[1], txn=txn)
    with pytest.raises(TransactionConflictError, match="mark-delete"):
        c.ack_cumulative(msgs[2], txn=txn)
    c.ack_cumulative(msgs[3], txn=txn)
    txn.commit()


def test_cumulative_above_another_txns_individual_ack_conflicts(broker: Broker) -> None:
    client, c, msgs = setup(broker)
    t1, t2 = client.transaction(), client.transaction()
    c.ack(msgs[1], txn=t1)
    with pytest.raises(TransactionConflictError, match="holds a message below"):
        c.ack_cumulative(msgs[3], txn=t2)
    # The same transaction may cover its own individual ack.
    c.ack_cumulative(msgs[3], txn=t1)
    t1.commit()
    t2.abort()


def test_cumulative_takes_exactly_one_message_id(broker: Broker) -> None:
    client, _c, msgs = setup(broker)
    txn = client.transaction()
    st = store(broker)
    with pytest.raises(TransactionConflictError, match="exactly one"):
        st.ack(txn.txn_id, [msgs[0].message_id.position, msgs[1].message_id.position], True)
    txn.abort()


def test_cumulative_inside_a_batch(broker: Broker) -> None:
    client, c, msgs = setup(broker, n=2, batch=3)
    with client.transaction() as txn:
        c.ack_cumulative(msgs[3], txn=txn)  # batch index 1 of the batch
    c.redeliver_unacknowledged()
    rest = []
    while (m := c.receive(100)) is not None:
        rest.append(m.value)
    assert rest == [b"b2"]


def test_non_txn_cumulative_over_held_message_conflicts(broker: Broker) -> None:
    client, c, msgs = setup(broker)
    txn = client.transaction()
    c.ack(msgs[1], txn=txn)
    with pytest.raises(TransactionConflictError):
        c.ack_cumulative(msgs[3])
    txn.abort()


# ------------------------------------------------------------------ ends


def test_ack_after_txn_ended_is_refused(broker: Broker) -> None:
    client, c, msgs = setup(broker)
    txn = client.transaction()
    c.ack(msgs[0], txn=txn)
    txn.commit()
    with pytest.raises(InvalidTxnStatusError) as e:
        c.ack(msgs[1], txn=txn)
    assert str(txn.txn_id) in str(e.value)
    # The store itself refuses a late ack of an ended transaction too.
    with pytest.raises(InvalidTxnStatusError):
        store(broker).ack(txn.txn_id, [msgs[1].message_id.position])


def test_log_records_use_pulsar_fields_and_are_trimmed(broker: Broker) -> None:
    client, c, msgs = setup(broker, n=2, batch=2)
    st = store(broker)
    t1, t2 = client.transaction(), client.transaction()
    c.ack_cumulative(msgs[0], txn=t2)
    c.ack(msgs[1], txn=t1)
    c.ack(msgs[2], txn=t1)  # batch index 0 of 2
    st.writer.flush()
    assert st.writer.wait_idle(10_000)
    live = replay(st.log_ml, st._log_cursor)
    entries = []
    for _, data in live:
        e = PendingAckMetadataEntry()
        e.ParseFromString(data)
        entries.append(e)
    assert [e.pending_ack_op for e in entries] == [ACK, ACK, ACK]
    assert entries[0].ack_type == Cumulative
    batched = entries[2].pending_ack_metadata[0]
    assert batched.batch_size == 2 and list(batched.ack_set) == [0b10]
    t1.commit()
    t2.abort()
    st.writer.flush()
    assert st.writer.wait_idle(10_000)
    ops = []
    for _, data in replay(st.log_ml, st._log_cursor):
        e = PendingAckMetadataEntry()
        e.ParseFromString(data)
        ops.append(e.pending_ack_op)
    assert sorted(ops) == sorted([ACK, ACK, ACK, COMMIT, ABORT])
    broker.maintain_now()
    assert list(replay(st.log_ml, st._log_cursor)) == []
    assert st.stats()["trimmed"] == 5


def test_pending_acks_recovered_and_reconciled(tmp_path: Path) -> None:
    with Broker.open(tmp_path, registry=None) as b:
        client, c, msgs = setup(b)
        open_txn = client.transaction(timeout_ms=600_000)
        c.ack(msgs[0], txn=open_txn)
        done = client.transaction()
        c.ack(msgs[1], txn=done)
        done.commit()
    with Broker.open(tmp_path, registry=None) as b:
        st = b.topic("t").pending_ack("s")
        assert st.transactions() == [open_txn.txn_id]
        assert st.holder(TxnPosition(msgs[0].message_id.ledger_id, msgs[0].message_id.entry_id))
        c = b.client().subscribe("t", "s")
        got = []
        while (m := c.receive(100)) is not None:
            got.append(m.value)
        assert got == [b"2", b"3", b"4"]


def test_messages_of_a_batch_ack_are_the_cleared_indexes() -> None:
    """A transaction's held batch indexes are exactly the cleared bits, for any batch size."""
    import random

    from txnstream._native import AckSet
    from txnstream.pendingack.store import absent_indexes

    rng = random.Random(7)
    for size in (1, 2, 63, 64, 65, 128, 129, 500, 1000):
        for _ in range(30):
            acked = AckSet(size)
            for i in rng.sample(range(size), rng.randint(0, size)):
                acked.clear(i)
            present = set(acked.present())
            assert list(absent_indexes(acked, size)) == [i for i in range(size) if i not in present]


def test_reopened_subscription_serves_released_acks_first(tmp_path: Path) -> None:
    """Acks an ended transaction held are released before the subscription serves.

    Otherwise a later message goes out first and the held one comes back
    after it (the Jepsen run's non-monotonic poll after a restart). The
    transaction is aborted after the restart, before anyone opened the
    subscription; syncs are held from the moment its abort decision is
    durable (a step hook), so its release cannot be durable yet when the
    subscription is asked for.
    """
    import threading
    import time

    from txnstream import ManagedLedger, testing
    from txnstream.config import BrokerConfig

    cfg = BrokerConfig(transaction_timeout_ms=600_000)
    with Broker.open(tmp_path, cfg, registry=None) as b:
        client = b.client("first")
        p = client.producer("t")
        p.send(b"m0")
        p.send(b"m1")
        c = client.subscribe("t", "s")
        m0 = c.receive(5_000)
        assert m0 is not None and m0.value == b"m0"
        txn = client.transaction(timeout_ms=600_000)
        c.ack(m0, txn=txn)
        txn.wait_durable(5_000)  # the ACK record is durable; the transaction is left open
        txn_id = txn.txn_id
    with Broker.open(tmp_path, cfg, registry=None) as b:
        assert not b.loaded_topics()  # nobody opened the subscription yet
        # Faults act on the whole data directory: hold its syncs through any ledger.
        pending_log = ManagedLedger.open(tmp_path, "fault-handle")
        tc = b._coordinators().get(txn_id.most_bits)

        def hold_after_decision(step: str, t: object) -> None:
            if step == "ending_logged" and t == txn_id:
                testing.hold_fault(pending_log, "sync")  # the release cannot be durable yet

        testing.set_step_hook(tc, hold_after_decision)
        aborting = threading.Thread(target=lambda: b.admin.force_abort(txn_id))
        aborting.start()
        opened: list[Consumer] = []
        t = threading.Thread(target=lambda: opened.append(b.client("second").subscribe("t", "s")))
        try:
            assert testing.wait_fault_held(pending_log, "sync", timeout_ms=10_000)
            t.start()
            time.sleep(0.2)
            assert not opened, "the subscription served before the held acks were released"
        finally:
            testing.set_step_hook(tc, None)
            testing.release_fault(pending_log, "sync")
        t.join(30)
        aborting.join(30)
        assert not t.is_alive() and opened
        first = opened[0].receive(5_000)
        assert first is not None and first.value == b"m0"
        pending_log.close()


def test_recovery_applies_and_trims_every_end_record_of_a_transaction(tmp_path: Path) -> None:
    """Two end records of one transaction in the log: both are applied and trimmed.

    A commit whose COMMIT write reported a failure may still have reached
    the disk; the coordinator's retry then logs a second COMMIT (and an ack
    may sit between them). Recovery must apply every committed ack, in log
    order, and trim every record -- not only the last end's.
    """
    from txnstream.coordinator import TxnID
    from txnstream.pendingack.store import encode_ack, encode_end

    with Broker.open(tmp_path, registry=None) as b:
        _client, _c, msgs = setup(b)
        st = store(b)
        tx, ty = TxnID(0, 1_000_001), TxnID(0, 1_000_002)
        records = [
            encode_ack(tx, False, [msgs[0].message_id.position]),
            encode_end(tx, True),
            encode_ack(tx, False, [msgs[1].message_id.position]),
            encode_end(tx, True),
            encode_ack(ty, False, [msgs[2].message_id.position]),
            encode_end(ty, True),
            encode_end(ty, True),
        ]
        for f in [st.writer.write(r) for r in records]:
            f.result(timeout=10)
    with Broker.open(tmp_path, registry=None) as b:
        st = store(b)
        assert st.transactions() == []
        c = b.client().subscribe("t", "s")
        got = []
        while (m := c.receive(100)) is not None:
            got.append(m.value)
        assert got == [b"3", b"4"]  # 0, 1 and 2 were committed acks
        b.maintain_now()
        assert list(replay(st.log_ml, st._log_cursor)) == []


# ---------------------------------------------------------- review regressions


def test_cumulative_ack_inside_a_batch_leaves_the_rest_of_the_batch_deliverable(
    tmp_path: Path,
) -> None:
    """A transaction acking b2 of b0..b5 cumulatively holds b0..b2 only.

    The consume-transform-produce loop goes on receiving b3.. in the same
    transaction, another transaction or a plain ack may take b4, and after the
    commit nothing is left behind (nor comes back after a restart).
    """
    with Broker.open(tmp_path, registry=None) as b:
        client = b.client()
        p = client.producer("t")
        p.send_many([b"b%d" % i for i in range(6)])  # one entry, indexes 0..5
        p.send(b"after")
        c = client.subscribe("t", "s")
        first = [c.receive(500) for _ in range(3)]
        assert [m.value for m in first if m is not None] == [b"b0", b"b1", b"b2"]
        txn = client.transaction()
        c.ack_cumulative(first[2], txn=txn)  # type: ignore[arg-type]
        nxt = c.receive(500)
        assert nxt is not None and nxt.value == b"b3"
        c.ack(nxt, txn=txn)
        b4 = c.receive(500)
        assert b4 is not None and b4.value == b"b4"
        c.ack(b4)  # not covered by the cumulative ack: no conflict
        txn.commit()
        rest = []
        while (m := c.receive(200)) is not None:
            rest.append(m.value)
            c.ack(m)
        assert rest == [b"b5", b"after"]
    with Broker.open(tmp_path, registry=None) as b:
        assert b.client().subscribe("t", "s").receive(200) is None


def test_reread_after_a_cumulative_abort_skips_acked_and_waiting_nacked_messages(
    tmp_path: Path,
) -> None:
    """After an aborted cumulative ack the subscription reads again from mark-delete.

    A message acknowledged since is not delivered again, and a negatively
    acknowledged one waits for its delay.
    """
    with Broker.open(tmp_path, registry=None) as b:
        client = b.client()
        p = client.producer("t")
        for i in range(5):
            p.send(b"m%d" % i)
        c = client.subscribe("t", "s", negative_ack_redelivery_delay_ms=60_000)
        ms = [c.receive(300) for _ in range(5)]
        assert all(m is not None for m in ms)
        c.negative_ack(ms[1])  # type: ignore[arg-type]
        txn = client.transaction()
        c.ack_cumulative(ms[0], txn=txn)  # type: ignore[arg-type]
        txn.abort()
        again = c.receive(300)
        assert again is not None and again.value == b"m0" and again.redelivery_count == 1
        c.ack(ms[2])  # type: ignore[arg-type]
        got = []
        while (m := c.receive(200)) is not None:
            got.append(m.value)
        # m1 waits out its 60 s delay; m2 is acked; m3 and m4 are still
        # delivered to this consumer (unacked), so nothing is due now.
        assert got == []


def test_a_committing_transactions_acks_reach_the_cursor_before_release_and_trim(
    broker: Broker,
) -> None:
    """While a commit applies its acks, no other transaction can take the message,
    and a trim (which flushes the cursor, then deletes records) cannot drop the
    records of acks the cursor does not hold yet."""
    client, c, msgs = setup(broker, n=1)
    st = store(broker)
    orig = st.acks.individual
    seen: dict[str, object] = {}

    def applying(positions: Iterable[TxnPosition]) -> None:
        # Inside the commit's apply window (the completion thread).
        t2 = client.transaction()
        try:
            c.ack(msgs[0], txn=t2)
            seen["second"] = "acked"
        except TransactionConflictError:
            seen["second"] = "conflict"
        seen["trimmed"] = st.trim()
        orig(positions)

    st.acks.individual = applying  # type: ignore[method-assign]
    t1 = client.transaction()
    c.ack(msgs[0], txn=t1)
    t1.commit()
    st.acks.individual = orig  # type: ignore[method-assign]
    assert seen == {"second": "conflict", "trimmed": 0}
    assert st.acks.is_acked(msgs[0].message_id.position)
    broker.maintain_now()
    assert list(replay(st.log_ml, st._log_cursor)) == []  # trimmed once applied


def test_negative_ack_then_cumulative_ack_forgets_redelivery_counts(broker: Broker) -> None:
    _client, c, msgs = setup(broker, n=50)
    for m in msgs:
        c.negative_ack(m)
    c.ack_cumulative(msgs[-1])
    sub = broker.topic("t").subscription("s")
    assert len(sub._redeliveries) == 0
    assert c.receive(100) is None


def test_negative_ack_of_another_consumers_message_is_ignored(broker: Broker) -> None:
    client = broker.client()
    client.producer("t").send(b"x")
    a = client.subscribe("t", "s")
    other = client.subscribe("t", "s")
    m = a.receive(500)
    assert m is not None
    other.negative_ack(m)  # not delivered to `other`: nothing happens
    sub = broker.topic("t").subscription("s")
    assert sub.stats()["unacked"] == 1
    a.ack(m)
    assert other.receive(100) is None and a.receive(100) is None


# ------------------------------------------------------------------ review fixes (stop 20)


def drain(c: Consumer, timeout_ms: int = 100) -> list[Message]:
    out = []
    while (m := c.receive(timeout_ms)) is not None:
        out.append(m)
    return out


def test_a_transactions_cumulative_ack_moves_forward_within_a_batch(broker: Broker) -> None:
    client, c, msgs = setup(broker, n=0, batch=4)
    with client.transaction() as txn:
        c.ack_cumulative(msgs[1], txn=txn)
        c.ack_cumulative(msgs[3], txn=txn)  # further in the same entry: not a conflict
        with pytest.raises(TransactionConflictError, match="at or below this transaction"):
            c.ack_cumulative(msgs[2], txn=txn)
    c.redeliver_unacknowledged()
    assert drain(c) == []  # the commit applied the furthest one: the whole batch


def test_a_cumulative_ack_outside_conflicts_with_a_transactions_cumulative_hold(
    broker: Broker,
) -> None:
    client, c, msgs = setup(broker)
    txn = client.transaction()
    c.ack_cumulative(msgs[3], txn=txn)
    with pytest.raises(TransactionConflictError, match="holds a cumulative ack"):
        c.ack_cumulative(msgs[1])  # below it: it would take messages the txn holds
    txn.abort()
    c.redeliver_unacknowledged()
    assert [m.value for m in drain(c)] == [b"0", b"1", b"2", b"3", b"4"]


def test_a_cumulative_ack_outside_below_a_held_batch_index_is_accepted(broker: Broker) -> None:
    client, c, msgs = setup(broker, n=0, batch=4)
    txn = client.transaction()
    c.ack(msgs[3], txn=txn)  # holds index 3 only
    c.ack_cumulative(msgs[1])  # indexes 0..1: none held
    with pytest.raises(TransactionConflictError, match="holds a message at or below"):
        c.ack_cumulative(msgs[3])
    txn.abort()
    c.redeliver_unacknowledged()
    assert sorted(m.value for m in drain(c)) == [b"b2", b"b3"]


def test_an_unbatched_id_of_a_batched_entry_conflicts_with_a_held_index(broker: Broker) -> None:
    from txnstream.client import MessageId

    client, c, msgs = setup(broker, n=0, batch=3)
    txn = client.transaction()
    c.ack(msgs[2], txn=txn)
    mid = msgs[0].message_id
    whole = MessageId(mid.ledger_id, mid.entry_id, 0, 1, mid.partition)  # the whole entry
    with pytest.raises(InvalidArgumentError, match="holds 3 message"):
        c.ack(whole)  # the client refuses an id whose batch size is not its entry's
    with pytest.raises(TransactionConflictError, match="held by transaction"):
        store(broker).ack_outside([TxnPosition(mid.ledger_id, mid.entry_id)])  # the store too
    txn.abort()
    c.redeliver_unacknowledged()
    assert sorted(m.value for m in drain(c)) == [b"b0", b"b1", b"b2"]


@pytest.mark.parametrize("isolation", ["read_committed", "read_uncommitted"])
def test_read_committed_never_gets_what_read_uncommitted_left_for_redelivery(
    broker: Broker, isolation: str
) -> None:
    """A subscription switching isolation drops what it queued under the old one."""
    client = broker.client()
    p = client.producer("t")
    client.subscribe("t", "s").close()
    open_txn, aborted = client.transaction(), client.transaction()
    p.send(b"open", txn=open_txn)
    p.send(b"aborted", txn=aborted)
    p.send(b"held", txn=aborted)
    open_txn.wait_durable(5_000)
    aborted.wait_durable(5_000)
    ru = client.subscribe("t", "s", isolation="read_uncommitted")
    got = drain(ru)
    assert [m.value for m in got] == [b"open", b"aborted", b"held"]
    holder = client.transaction()
    ru.ack(got[2], txn=holder)  # stays with its transaction when the consumer closes
    ru.close()  # the others, unacknowledged: queued for redelivery
    aborted.abort()
    if isolation == "read_uncommitted":  # the same isolation keeps its redeliveries
        again = client.subscribe("t", "s", isolation="read_uncommitted")
        assert [m.value for m in drain(again)] == [b"open", b"aborted"]
        again.close()
    rc = client.subscribe("t", "s", isolation="read_committed")
    assert drain(rc) == []
    holder.abort()  # releases "held", of an aborted transaction
    assert drain(rc) == []
    open_txn.commit()
    assert [m.value for m in drain(rc, 1_000)] == [b"open"]


def hold_across_restart(
    path: Path, messages: int, held: int
) -> tuple[BrokerConfig, list[Message], TxnID]:
    """Send ``messages``, ack number ``held`` in a transaction left open, close the broker."""
    cfg = BrokerConfig(transaction_timeout_ms=600_000)
    with Broker.open(path, cfg, registry=None) as b:
        client = b.client("first")
        p = client.producer("t")
        for i in range(messages):
            p.send(b"m%d" % i)
        c = client.subscribe("t", "s")
        msgs = drain(c)
        txn = client.transaction(timeout_ms=600_000)
        c.ack(msgs[held], txn=txn)
        txn.wait_durable(5_000)  # left open across the restart
    return cfg, msgs, txn.txn_id


def first_after_restart(b: Broker) -> tuple[Consumer, Message]:
    """Subscribe again after the restart and receive m0: the rest are read ahead."""
    c = b.client("second").subscribe("t", "s")
    first = c.receive(1_000)
    assert first is not None and first.value == b"m0"
    return c, first


@pytest.mark.parametrize("commit", [True, False])
def test_a_restored_hold_ending_while_its_message_is_read_ahead_is_delivered_once_or_never(
    tmp_path: Path, commit: bool
) -> None:
    """A hold restored at open, ended while the message waits in the read-ahead buffer."""
    cfg, _, txn_id = hold_across_restart(tmp_path, 6, 3)
    with Broker.open(tmp_path, cfg, registry=None) as b:
        c, first = first_after_restart(b)
        c.ack(first)
        tc = b._coordinators().get(txn_id.most_bits)
        tc.end_transaction(txn_id, "commit" if commit else "abort")
        got = []
        while (m := c.receive(300)) is not None:
            got.append(m.value)
            c.ack(m)
    want = [b"m1", b"m2", b"m4", b"m5"] if commit else [b"m1", b"m2", b"m3", b"m4", b"m5"]
    assert sorted(got) == want


@pytest.mark.parametrize("commit", [True, False])
def test_a_consumer_closing_leaves_its_transactional_acks_to_the_transaction(
    broker: Broker, commit: bool
) -> None:
    client, c, msgs = setup(broker, n=2)
    txn = client.transaction()
    c.ack(msgs[0], txn=txn)
    c.close()  # msgs[1] is delivered again; msgs[0] stays with the transaction
    again = client.subscribe("t", "s")
    got = drain(again)
    assert [(m.value, m.redelivery_count) for m in got] == [(b"1", 1)]
    txn.commit() if commit else txn.abort()
    got = drain(again)
    assert [(m.value, m.redelivery_count) for m in got] == ([] if commit else [(b"0", 1)])


@pytest.mark.parametrize("cumulative", [False, True])
def test_a_transactional_ack_of_an_id_naming_no_message_is_refused_before_anything(
    broker: Broker, cumulative: bool
) -> None:
    from txnstream.client import MessageId
    from txnstream.errors import PositionNotFoundError

    client, c, msgs = setup(broker, n=1)
    mid = msgs[0].message_id
    txn = client.transaction()
    for bogus in (
        MessageId(mid.ledger_id, mid.entry_id + 5, 0, 1, mid.partition),  # not written yet
        MessageId(mid.ledger_id + 7, 0, 0, 1, mid.partition),  # no such ledger
    ):
        with pytest.raises(PositionNotFoundError, match="no message at"):
            (c.ack_cumulative if cumulative else c.ack)(bogus, txn=txn)
    assert client.broker._coordinators().get_transaction(txn.txn_id).subscriptions == ()
    assert store(broker).stats()["transactions"] == 0
    txn.commit()
    # Messages written later at those positions are delivered.
    p = client.producer("t")
    for i in range(6):
        p.send(b"late%d" % i)
    assert [m.value for m in drain(c)] == [b"late%d" % i for i in range(6)]


def test_a_negative_ack_of_a_held_message_leaves_it_to_its_transaction(broker: Broker) -> None:
    client, c, msgs = setup(broker, n=1)
    txn = client.transaction()
    c.ack(msgs[0], txn=txn)
    c.negative_ack(msgs[0])  # held: its transaction decides
    txn.abort()
    got = drain(c)
    assert [(m.value, m.redelivery_count) for m in got] == [(b"0", 1)]


def test_a_conflicting_ack_is_refused_before_the_transaction_registers_anything(
    broker: Broker,
) -> None:
    client, c, msgs = setup(broker, n=2)
    c.ack(msgs[0])
    txn = client.transaction()
    with pytest.raises(TransactionConflictError, match="already acknowledged"):
        c.ack(msgs[0], txn=txn)
    assert broker._coordinators().get_transaction(txn.txn_id).subscriptions == ()
    txn.abort()


def test_a_commit_clears_the_read_ahead_buffer_before_it_releases_the_messages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No moment where a committed ack's message is released yet still buffered for dispatch."""
    cfg, msgs, txn_id = hold_across_restart(tmp_path, 4, 2)
    with Broker.open(tmp_path, cfg, registry=None) as b:
        c, first = first_after_restart(b)
        sub = b.topic("t").subscription("s")
        st = store(b)
        key = (msgs[2].message_id.ledger_id, msgs[2].message_id.entry_id, 0)
        seen: list[bool] = []
        real = PendingAckStore._release

        def release(self: PendingAckStore, txn: object) -> object:
            if self is st:
                seen.append(sub._buffered(key))  # what a receive could take right now
            return real(self, txn)  # type: ignore[arg-type]

        monkeypatch.setattr(PendingAckStore, "_release", release)
        b._coordinators().get(txn_id.most_bits).end_transaction(txn_id, "commit")
        assert seen == [False]
        got = [first.value, *(m.value for m in drain(c))]
    assert got == [b"m0", b"m1", b"m3"]


# ------------------------------------------------------------------ log names


def test_subscriptions_whose_pending_ack_logs_share_a_name_never_share_acks(
    tmp_path: Path,
) -> None:
    # Pulsar's log name <topic>-<subscription>__transaction_pending_ack is the
    # same for topic a-b + subscription c and topic a + subscription b-c.
    # Found in review: after a restart, a-b/c's committed acks were applied
    # to a/b-c's cursor (it never got a:m0..m2), then trimmed away from a-b/c
    # (which got them again). The second pair is refused, naming both.
    with Broker.open(tmp_path, registry=None) as b:
        c = b.client("c")
        for t in ("a", "a-b"):
            p = c.producer(t)
            for i in range(5):
                p.send(f"{t}:m{i}".encode())
        owner = c.subscribe("a-b", "c")
        got = [owner.receive(2000) for _ in range(3)]
        txn = c.transaction()
        for m in got:
            assert m is not None
            owner.ack(m, txn=txn)
        txn.commit()
        with pytest.raises(InvalidArgumentError) as ei:
            c.subscribe("a", "b-c")
        text = str(ei.value)
        assert "'b-c'" in text and "'c'" in text and "persistent://public/default/a-b" in text
        assert "a-b-c__transaction_pending_ack" in text
        c.subscribe("a", "other").close()  # other names are fine
    with Broker.open(tmp_path, registry=None) as b:
        c = b.client("c")
        with pytest.raises(InvalidArgumentError):
            c.subscribe("a", "b-c")
        assert "b-c" not in b.topic("a").ml.cursor_names()  # refused before any cursor
        owner = c.subscribe("a-b", "c")
        rest = []
        while (m := owner.receive(300)) is not None:
            rest.append(m.value)
            owner.ack(m)
        assert rest == [b"a-b:m3", b"a-b:m4"]  # its committed acks are still its own


def test_a_commit_whose_acks_failed_to_apply_stays_committed_after_its_coordinator_forgot_it(
    tmp_path: Path,
) -> None:
    """Applying a committed ack to the cursor fails (what a closed ledger raises);
    the coordinator, done with the transaction, forgets it (no terminated store).
    The orphan sweep must apply the commit again, not ask the coordinator (which
    now calls it aborted): the sweep used to abort it, and the message was
    delivered again, in this process and after a restart."""
    cfg = BrokerConfig.from_broker_conf_text("transactionMetaPersistCount=0\n")
    with Broker.open(tmp_path, cfg, registry=None) as b:
        client, c, msgs = setup(b, n=1)
        st = store(b)
        orig = st.acks.individual

        def failing(positions: Iterable[TxnPosition]) -> None:
            st.acks.individual = orig  # type: ignore[method-assign]
            raise AlreadyClosedError("injected: the cursor's ledger is closed", what="ledger")

        st.acks.individual = failing  # type: ignore[method-assign]
        txn = client.transaction()
        c.ack(msgs[0], txn=txn)
        txn.commit()
        assert st.transactions() == [txn.txn_id]  # held: not applied yet
        wait_until(lambda: b.participant_outcome(txn.txn_id) is False)  # forgotten
        with pytest.raises(InvalidTxnStatusError):
            st.end(txn.txn_id, commit=False)
        topic = b.topic("t")
        topic.sweep_orphans()
        topic.sweep_orphans()  # seen at two sweeps: ended
        wait_until(lambda: st.transactions() == [])
        assert st.acks.is_acked(msgs[0].message_id.position)
        assert c.receive(200) is None
        b.maintain_now()
        assert list(replay(st.log_ml, st._log_cursor)) == []  # trimmed once applied
    with Broker.open(tmp_path, cfg, registry=None) as b:
        c = b.client().subscribe("t", "s")
        assert c.receive(200) is None


def test_a_commit_whose_acks_fail_to_apply_again_at_recovery_stays_held_and_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, and applying it fails once more when the next open replays the
    COMMIT record. Found in review: recovery then only marked it ended, so the
    committed-acked message was delivered again and its records never trimmed."""
    from txnstream.pendingack import cursor_acks

    cfg = BrokerConfig.from_broker_conf_text("transactionMetaPersistCount=0\n")
    orig = cursor_acks.CursorAcks.individual
    fails = [0]

    def failing(self: cursor_acks.CursorAcks, positions: Iterable[TxnPosition]) -> None:
        if fails[0] > 0:
            fails[0] -= 1
            raise AlreadyClosedError("injected: the cursor's ledger is closed", what="ledger")
        orig(self, positions)

    monkeypatch.setattr(cursor_acks.CursorAcks, "individual", failing)
    with Broker.open(tmp_path, cfg, registry=None) as b:
        client, c, msgs = setup(b, n=1)
        txn = client.transaction()
        c.ack(msgs[0], txn=txn)
        fails[0] = 1
        txn.commit()
        assert store(b).transactions() == [txn.txn_id]  # held: not applied
    fails[0] = 2  # the replay's apply fails too, and so does the open's reconcile of it
    with Broker.open(tmp_path, cfg, registry=None) as b:
        st = store(b)
        assert fails[0] == 0 and st.transactions() == [txn.txn_id]  # held, not ended
        c = b.client().subscribe("t", "s")
        assert c.receive(200) is None  # never delivered again
        with pytest.raises(InvalidTxnStatusError):
            st.end(txn.txn_id, commit=False)
        b.topic("t").sweep_orphans()
        b.topic("t").sweep_orphans()  # seen at two sweeps: applied, no coordinator asked
        wait_until(lambda: st.transactions() == [])
        assert st.acks.is_acked(msgs[0].message_id.position)
        b.maintain_now()
        assert list(replay(st.log_ml, st._log_cursor)) == []  # trimmed once applied
    with Broker.open(tmp_path, cfg, registry=None) as b:
        assert b.client().subscribe("t", "s").receive(200) is None
