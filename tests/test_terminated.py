from __future__ import annotations

import threading
from collections.abc import Iterable

import pytest
from txnstream.coordinator.status import TxnStatus
from txnstream.coordinator.terminated import TerminatedTxnStore
from txnstream.coordinator.txn_id import TxnID
from txnstream.errors import CorruptEntryError, InvalidArgumentError
from txnstream.proto import TerminatedTxnState

HOUR = 3_600_000


class FakeClock:
    def __init__(self, now: int = 10 * HOUR) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


class MemoryTopic:
    """Compacted-topic semantics in memory: newest value per key, None deletes."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.puts: list[tuple[str, bytes | None]] = []
        self.lock = threading.Lock()

    def put(self, key: str, value: bytes | None) -> None:
        with self.lock:
            self.puts.append((key, value))
            if value is None:
                self.data.pop(key, None)
            else:
                self.data[key] = value

    def items(self) -> Iterable[tuple[str, bytes]]:
        return list(self.data.items())


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
    state = TerminatedTxnState()
    state.ParseFromString(topic.data["a"])
    assert [x.txnid_least_bits for x in state.txns] == [7, 8, 9]


def test_record_is_idempotent_and_rejects_open() -> None:
    topic = MemoryTopic()
    store = TerminatedTxnStore(3, persistence=topic)
    store.record(t(1), "a", TxnStatus.COMMITTED)
    store.record(t(1), "a", TxnStatus.COMMITTED)
    assert topic.puts.count(("a", topic.data["a"])) == 1
    with pytest.raises(InvalidArgumentError, match="OPEN"):
        store.record(t(2), "a", TxnStatus.OPEN)


def test_age_expiry_by_sweep_deletes_forgotten_client() -> None:
    clock = FakeClock()
    topic = MemoryTopic()
    store = TerminatedTxnStore(10, persist_time_ms=2 * HOUR, persistence=topic, clock=clock)
    store.record(t(1), "old", TxnStatus.COMMITTED)
    clock.now += HOUR
    store.record(t(2), "old", TxnStatus.ABORTED)
    store.record(t(3), "new", TxnStatus.COMMITTED)
    clock.now += HOUR  # t(1) is exactly 2 h old
    assert store.sweep() == 1
    assert store.lookup(t(1)) is None
    assert store.lookup(t(2)) is not None
    clock.now += HOUR
    assert store.sweep() == 2
    assert store.clients() == []
    assert topic.data == {}
    assert ("old", None) in topic.puts
    assert ("new", None) in topic.puts
    # Bookkeeping for deleted clients is gone too (memory stays bounded).
    assert store._version == {}
    assert store._persisted == {}


def test_restore_after_restart_drops_expired() -> None:
    clock = FakeClock()
    topic = MemoryTopic()
    store = TerminatedTxnStore(10, persist_time_ms=2 * HOUR, persistence=topic, clock=clock)
    store.record(t(1), "a", TxnStatus.COMMITTED)
    clock.now += HOUR
    store.record(t(2), "a", TxnStatus.ABORTED, timed_out=True)
    store.record(t(3), "b", TxnStatus.COMMITTED)
    clock.now += HOUR + 1
    again = TerminatedTxnStore(10, persist_time_ms=2 * HOUR, persistence=topic, clock=clock)
    assert again.restore() == 2
    assert again.lookup(t(1)) is None
    rec = again.lookup(t(2))
    assert rec is not None
    assert rec.status is TxnStatus.ABORTED
    assert rec.timed_out
    clock.now += 5 * HOUR
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


def test_concurrent_ends_of_one_client_coalesce_puts() -> None:
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
    state = TerminatedTxnState()
    state.ParseFromString(topic.data["shared"])
    # The last persisted value covers the final in-memory state.
    assert len(state.txns) == 1_000
