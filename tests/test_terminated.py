from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pytest

from txnstream.coordinator.metadata import TxnID, TxnStatus
from txnstream.coordinator.terminated import COMPACT_SLACK, TerminatedTxnStore, txn_key
from txnstream.errors import CorruptEntryError, InvalidArgumentError
from txnstream.proto import TerminatedTxnState
from txnstream.testing import ManualClock

HOUR = 3_600_000


def FakeClock() -> ManualClock:  # noqa: N802 - reads as the class it stands for
    return ManualClock(wall_ms=10 * HOUR)


class MemoryTopic:
    """Compacted-topic semantics in memory: newest value per key, None deletes.

    ``entries`` counts records as a log holds them until ``compact``;
    ``before_put`` (if set) runs before each ``put_many`` is applied.
    """

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.puts: list[tuple[str, bytes | None]] = []
        self.entries = 0
        self.max_entries = 0
        self.compactions = 0
        self.before_put: Callable[[Sequence[tuple[str, bytes | None]]], None] | None = None
        self.lock = threading.Lock()

    def put_many(
        self, records: Sequence[tuple[str, bytes | None]], timeout_ms: float | None = None
    ) -> None:
        if self.before_put is not None:
            self.before_put(records)
        with self.lock:
            for key, value in records:
                self.puts.append((key, value))
                self.entries += 1
                if value is None:
                    self.data.pop(key, None)
                else:
                    self.data[key] = value
            self.max_entries = max(self.max_entries, self.entries)

    def items(self) -> Iterable[tuple[str, bytes]]:
        return list(self.data.items())

    def compact(self) -> None:
        with self.lock:
            self.entries = len(self.data)
            self.compactions += 1


def state_of(topic: MemoryTopic, txn: TxnID) -> TerminatedTxnState:
    state = TerminatedTxnState()
    state.ParseFromString(topic.data[txn_key(txn)])
    return state


def t(i: int) -> TxnID:
    return TxnID(0, i)


def test_disabled_by_default() -> None:
    store = TerminatedTxnStore()
    assert not store.enabled
    assert not store.record(t(1), "c", TxnStatus.COMMITTED)
    assert store.lookup(t(1)) is None


def test_no_client_name_not_recorded() -> None:
    store = TerminatedTxnStore(5)
    assert not store.record(t(1), None, TxnStatus.COMMITTED)
    assert not store.record(t(1), "", TxnStatus.COMMITTED)
    assert len(store) == 0


def test_count_expiry_keeps_newest_per_client() -> None:
    topic = MemoryTopic()
    store = TerminatedTxnStore(3, persistence=topic, clock=FakeClock())
    for i in range(10):
        store.record(t(i), "a", TxnStatus.COMMITTED)
        store.record(t(100 + i), "b", TxnStatus.ABORTING, timed_out=i % 2 == 0)
    assert [store.lookup(t(i)) is not None for i in range(10)] == [False] * 7 + [True] * 3
    rec = store.lookup(t(108))
    assert rec is not None
    assert rec.status is TxnStatus.ABORTED  # ABORTING counts as ABORTED
    assert rec.timed_out
    assert rec.client_name == "b"
    assert len(store) == 6
    # One key per transaction; pushed-out transactions are deleted.
    assert sorted(topic.data) == sorted(txn_key(t(i)) for i in (7, 8, 9, 107, 108, 109))
    state = state_of(topic, t(108))
    assert state.client_name == "b"
    assert [(x.txnid_least_bits, x.status, x.timed_out) for x in state.txns] == [
        (108, TxnStatus.ABORTED, True)
    ]


def test_record_is_idempotent_and_rejects_open() -> None:
    topic = MemoryTopic()
    store = TerminatedTxnStore(3, persistence=topic)
    store.record(t(1), "a", TxnStatus.COMMITTED)
    first = topic.data[txn_key(t(1))]
    store.record(t(1), "a", TxnStatus.ABORTED)  # the first outcome stays
    assert topic.data == {txn_key(t(1)): first}
    assert len(store) == 1
    with pytest.raises(InvalidArgumentError, match="OPEN"):
        store.record(t(2), "a", TxnStatus.OPEN)


def test_age_expiry_by_sweep_deletes_forgotten_client() -> None:
    clock = FakeClock()
    topic = MemoryTopic()
    store = TerminatedTxnStore(10, persist_time_ms=2 * HOUR, persistence=topic, clock=clock)
    store.record(t(1), "old", TxnStatus.COMMITTED)
    clock.advance(HOUR)
    store.record(t(2), "old", TxnStatus.ABORTED)
    store.record(t(3), "new", TxnStatus.COMMITTED)
    clock.advance(HOUR)  # t(1) is exactly 2 h old
    assert store.sweep() == 1
    assert store.lookup(t(1)) is None
    assert store.lookup(t(2)) is not None
    clock.advance(HOUR)
    assert store.sweep() == 2
    assert store.clients() == []
    assert topic.data == {}
    assert (txn_key(t(2)), None) in topic.puts
    assert (txn_key(t(3)), None) in topic.puts
    # The sweep compacted the topic: nothing but live keys remain.
    assert topic.entries == 0
    assert store.topic_entries() == 0


def test_restore_after_restart_drops_expired() -> None:
    clock = FakeClock()
    topic = MemoryTopic()
    store = TerminatedTxnStore(10, persist_time_ms=2 * HOUR, persistence=topic, clock=clock)
    store.record(t(1), "a", TxnStatus.COMMITTED)
    clock.advance(HOUR)
    store.record(t(2), "a", TxnStatus.ABORTED, timed_out=True)
    store.record(t(3), "b", TxnStatus.COMMITTED)
    clock.advance(HOUR + 1)
    again = TerminatedTxnStore(10, persist_time_ms=2 * HOUR, persistence=topic, clock=clock)
    assert again.restore() == 2
    assert again.lookup(t(1)) is None
    rec = again.lookup(t(2))
    assert rec is not None
    assert rec.status is TxnStatus.ABORTED
    assert rec.timed_out
    clock.advance(5 * HOUR)
    third = TerminatedTxnStore(10, persist_time_ms=2 * HOUR, persistence=topic, clock=clock)
    assert third.restore() == 0
    assert topic.data == {}


def test_restore_corrupt_value_names_key() -> None:
    topic = MemoryTopic()
    topic.data["bad"] = b"\xff\xff\xff"
    store = TerminatedTxnStore(3, persistence=topic)
    with pytest.raises(CorruptEntryError) as err:
        store.restore()
    assert err.value.details["key"] == "bad"


def test_bad_settings_rejected() -> None:
    with pytest.raises(InvalidArgumentError, match="-1"):
        TerminatedTxnStore(-1)
    with pytest.raises(InvalidArgumentError, match="persist_time"):
        TerminatedTxnStore(1, persist_time_ms=0)


def test_memory_bounded_by_count_times_clients() -> None:
    store = TerminatedTxnStore(4, persistence=MemoryTopic())
    for i in range(5_000):
        store.record(t(i), f"client-{i % 50}", TxnStatus.COMMITTED)
    assert len(store) == 4 * 50
    assert len(store._index) == 200


def test_concurrent_ends_of_one_client_all_persisted() -> None:
    topic = MemoryTopic()
    store = TerminatedTxnStore(1_000, persistence=topic)
    threads = [
        threading.Thread(
            target=lambda k=k: [
                store.record(t(k * 1000 + i), "shared", TxnStatus.COMMITTED) for i in range(200)
            ]
        )
        for k in range(8)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(store) == 1_000
    # The topic holds exactly the remembered transactions.
    ended = [t(k * 1000 + i) for k in range(8) for i in range(200)]
    assert {txn_key(x) for x in ended if store.lookup(x) is not None} == set(topic.data)


def test_each_end_writes_constant_bytes() -> None:
    """An end costs O(1) bytes, not a rewrite of the client's whole list."""
    topic = MemoryTopic()
    store = TerminatedTxnStore(500, persistence=topic)
    sizes: list[int] = []
    for i in range(2_000):
        n = len(topic.puts)
        store.record(t(i), "client", TxnStatus.COMMITTED)
        new = topic.puts[n:]
        assert len(new) == (1 if i < 500 else 2)  # the record (+ a tombstone once full)
        sizes.append(sum(len(v or b"") for _, v in new))
    assert max(sizes) < 64
    assert len(store) == 500


def test_topic_is_compacted_and_stays_bounded() -> None:
    topic = MemoryTopic()
    store = TerminatedTxnStore(10, persistence=topic)
    for i in range(20_000):
        store.record(t(i), f"c{i % 7}", TxnStatus.COMMITTED)
    assert topic.compactions >= 1
    assert topic.max_entries <= 2 * 70 + COMPACT_SLACK + 2
    assert store.sweep() == 0  # nothing expired, but the garbage is compacted away
    assert topic.entries == len(topic.data) == 70


def test_late_record_after_eviction_is_deleted() -> None:
    """A record that lands after its transaction was pushed out is deleted again."""
    topic = MemoryTopic()
    store = TerminatedTxnStore(1, persistence=topic)

    def race(records: Sequence[tuple[str, bytes | None]]) -> None:
        if records[0][0] == txn_key(t(1)):
            topic.before_put = None
            store.record(t(2), "a", TxnStatus.COMMITTED)  # pushes t(1) out first

    topic.before_put = race
    store.record(t(1), "a", TxnStatus.COMMITTED)
    assert store.lookup(t(1)) is None
    assert set(topic.data) == {txn_key(t(2))}


def test_restore_with_the_store_off_keeps_every_stored_outcome() -> None:
    topic = MemoryTopic()
    store = TerminatedTxnStore(5, persistence=topic)
    store.record(t(1), "a", TxnStatus.COMMITTED)
    before = dict(topic.data)
    off = TerminatedTxnStore(0, persistence=topic)
    assert off.restore() == 0
    assert topic.data == before and topic.puts[-1][0] == txn_key(t(1))  # nothing deleted
    again = TerminatedTxnStore(5, persistence=topic)
    assert again.restore() == 1
    rec = again.lookup(t(1))
    assert rec is not None and rec.status is TxnStatus.COMMITTED


def test_restore_refuses_a_value_that_is_not_its_keys_transaction() -> None:
    clock = FakeClock()
    topic = MemoryTopic()
    several = TerminatedTxnState(client_name="a")
    for i in (1, 2):
        several.txns.add(txnid_least_bits=i, txnid_most_bits=0, status=4, end_time=clock.wall)
    topic.data["a"] = several.SerializeToString()
    with pytest.raises(CorruptEntryError) as err:
        TerminatedTxnStore(2, persistence=topic, clock=clock).restore()
    assert err.value.details["key"] == "a"
    one = TerminatedTxnState(client_name="a")
    one.txns.add(txnid_least_bits=1, txnid_most_bits=0, status=4, end_time=clock.wall)
    topic.data = {txn_key(t(2)): one.SerializeToString()}
    with pytest.raises(CorruptEntryError, match=r"\(0,1\)"):
        TerminatedTxnStore(2, persistence=topic, clock=clock).restore()


def test_a_retried_record_of_a_pushed_out_transaction_pushes_out_nothing() -> None:
    """PIP-255 retry: step 3 repeated after newer ends pushed the transaction out."""
    clock = FakeClock()
    topic = MemoryTopic()
    store = TerminatedTxnStore(2, persistence=topic, clock=clock)
    for i in (1, 2, 3):
        assert store.record(t(i), "a", TxnStatus.COMMITTED, end_time=clock.wall - 100 + i)
    assert store.lookup(t(1)) is None  # pushed out by t(3)
    # The retry carries t(1)'s decision time: older than all the client keeps.
    assert not store.record(t(1), "a", TxnStatus.COMMITTED, end_time=clock.wall - 99)
    assert store.lookup(t(1)) is None
    assert [store.lookup(t(i)) is not None for i in (2, 3)] == [True, True]
    assert set(topic.data) == {txn_key(t(2)), txn_key(t(3))}
    again = TerminatedTxnStore(2, persistence=topic, clock=clock)
    assert again.restore() == 2 and again.lookup(t(1)) is None


def test_ends_recorded_out_of_order_are_kept_in_end_time_order() -> None:
    clock = FakeClock()
    topic = MemoryTopic()
    store = TerminatedTxnStore(3, persistence=topic, clock=clock)
    now = clock.wall
    assert (
        store.record_many(
            [(t(1), "a", TxnStatus.COMMITTED, False), (t(3), "a", TxnStatus.ABORTED, False)],
            end_times=[now + 1, now + 3],
        )
        == 2
    )
    assert store.record(t(2), "a", TxnStatus.COMMITTED, end_time=now + 2)  # a late retry
    assert store.record(t(4), "a", TxnStatus.COMMITTED, end_time=now + 4)
    # The oldest by end time goes, not the one recorded first... nor the late one.
    assert [store.lookup(t(i)) is not None for i in (1, 2, 3, 4)] == [False, True, True, True]
    # The sweep relies on the order too: it stops at the first young entry.
    clock.advance(store.persist_time_ms + 2)  # t(2) is exactly persist_time old
    assert store.sweep() == 1
    assert [store.lookup(t(i)) is not None for i in (2, 3, 4)] == [False, True, True]
    with pytest.raises(InvalidArgumentError, match="2 end times for 1"):
        store.record_many([(t(5), "a", TxnStatus.COMMITTED, False)], end_times=[1, 2])
    assert store.lookup(t(5)) is None


@pytest.mark.parametrize("seed", range(20))
def test_out_of_order_ends_keep_exactly_the_newest_by_end_time(seed: int) -> None:
    # A model: the newest persist_count by (end time, then call order) stay;
    # a late end older than all of a full client's is not recorded. Ends
    # arrive shuffled a little, as concurrent commits' decisions do.
    import random

    rng = random.Random(seed)
    clock = FakeClock()
    store = TerminatedTxnStore(rng.choice([1, 3, 8, 50]), persistence=MemoryTopic(), clock=clock)
    model: list[tuple[int, int, int]] = []  # (end time, call order, txn)
    for i in range(300):
        end = clock.wall + i // 3 - rng.randrange(0, 12)  # ties and lateness
        full = len(model) >= store.persist_count
        if full and end < min(model)[0]:
            assert not store.record(t(i), "c", TxnStatus.COMMITTED, end_time=end)
            continue
        assert store.record(t(i), "c", TxnStatus.COMMITTED, end_time=end)
        model.append((end, i, i))
        model.sort()
        del model[: max(0, len(model) - store.persist_count)]
        kept = {m[2] for m in model}
        assert {i for i in range(i + 1) if store.lookup(t(i)) is not None} == kept
    # The sweep stops at the first young entry: the order held throughout.
    clock.advance(store.persist_time_ms + 1_000)
    assert store.sweep() == len(model)


def test_a_persistence_without_timeout_ms_still_works() -> None:
    # Written to the protocol before put_many took timeout_ms: every write
    # failed with TypeError once the store passed it (memory and disk apart).
    class OldStyle(MemoryTopic):
        def put_many(self, records: Sequence[tuple[str, bytes | None]]) -> None:  # type: ignore[override]
            super().put_many(records)

    topic: Any = OldStyle()  # not the protocol's type any more: that is the point
    store = TerminatedTxnStore(3, persistence=topic, clock=FakeClock())
    assert store.record(t(1), "c", TxnStatus.COMMITTED, timeout_ms=100)
    assert store.record_many([(t(2), "c", TxnStatus.ABORTED, False)]) == 1
    again = TerminatedTxnStore(3, persistence=topic, clock=FakeClock())
    assert again.restore() == 2
