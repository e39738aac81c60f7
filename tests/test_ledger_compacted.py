"""CompactedTopic: newest value per key, tombstones, atomic compaction."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from txnstream import CompactedTopic, CorruptEntryError, LedgerClosedError, ManagedLedger


def test_newest_value_per_key_and_tombstones(tmp_path: Path) -> None:
    with CompactedTopic.open(tmp_path, "public/default/__transaction_buffer_snapshot") as t:
        for rnd in range(3):
            for k in range(10):
                t.put(f"topic-{k}", b"v%d-%d" % (rnd, k))
        t.put("topic-3", None)
        t.put_many([("topic-4", None), ("topic-5", b"five"), ("new", b"n")])
        assert t.get("topic-3") is None and "topic-3" not in t
        assert t.get("topic-5") == b"five"
        assert t.get("topic-6") == b"v2-6"
        assert t.get("never") is None
        assert len(t) == 9
        assert t.keys() == sorted(t.keys())
        items = t.items()
        assert dict(items)["new"] == b"n"
    with CompactedTopic.open(tmp_path, "public/default/__transaction_buffer_snapshot") as t:
        assert t.items() == items


def test_compaction_rewrites_into_one_ledger(tmp_path: Path) -> None:
    name = "__terminated_txn_state_0"
    with CompactedTopic.open(tmp_path, name, max_entries_per_ledger=16) as t:
        for i in range(100):
            t.put(f"client-{i % 12}", b"%d" % i)
        t.put("client-0", None)
        before = t.items()
        stats = t.compact()
        assert stats == {"entries_before": 101, "entries_after": 11}
        assert t.items() == before
        t.put("client-0", b"back")
    ml = ManagedLedger.open(tmp_path, name, read_only=True)
    # The compacted ledger plus the one written after it.
    assert [n for _, n, _ in ml.ledgers()] == [11, 1]
    ml.close()
    with CompactedTopic.open(tmp_path, name) as t:
        assert t.get("client-0") == b"back"
        assert len(t) == 12
        t.compact()
        assert len(t) == 12


def test_compaction_with_concurrent_puts(tmp_path: Path) -> None:
    with CompactedTopic.open(tmp_path, "c") as t:
        stop = threading.Event()
        last: dict[str, bytes] = {}

        def writer(w: int) -> None:
            i = 0
            while not stop.is_set():
                key, val = f"k{w}-{i % 5}", b"%d" % i
                t.put(key, val)
                last[key] = val
                i += 1

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
        for th in threads:
            th.start()
        for _ in range(5):
            t.compact()
        stop.set()
        for th in threads:
            th.join()
        assert dict(t.items()) == last
    with CompactedTopic.open(tmp_path, "c") as t:
        assert dict(t.items()) == last


def test_reader_in_read_only_mode_and_errors(tmp_path: Path) -> None:
    w = CompactedTopic.open(tmp_path, "ro")
    w.put("a", b"1")
    r = CompactedTopic.open(tmp_path, "ro", read_only=True)
    assert r.get("a") == b"1"
    w.put("a", b"2")
    r.refresh()
    assert r.get("a") == b"2"
    w.close()
    with pytest.raises(LedgerClosedError):
        w.put("a", b"3")
    r.close()
    # A non-CompactedRecord entry is reported with its position.
    with ManagedLedger.open(tmp_path, "junk") as ml:
        p = ml.append(b"\xff\xff\xff")
    with pytest.raises(CorruptEntryError) as ei:
        CompactedTopic.open(tmp_path, "junk")
    assert ei.value.position == (p.ledger_id, p.entry_id)


def test_a_put_with_a_deadline_times_out_and_compaction_waits_for_it(tmp_path: Path) -> None:
    """``put_many(..., timeout_ms)`` stops waiting on a stalled disk; the put goes on.

    It used to wait for the disk without a limit (a coordinator's end, whose
    outcome was already visible, hung in its terminated-store write). The
    abandoned put still lands and is read back, and a compaction started
    meanwhile waits for it instead of swapping its record away.
    """
    from txnstream import testing

    topic = CompactedTopic.open(str(tmp_path), "kv")
    topic.put_many([("a", b"1")])
    disk = ManagedLedger.open(str(tmp_path), "other")  # one journal per directory
    testing.hold_fault(disk, "sync")
    try:
        with pytest.raises(TimeoutError):
            topic.put_many([("b", b"2")], timeout_ms=100)
        compacted = threading.Event()

        def compact() -> None:
            topic.compact()
            compacted.set()

        t = threading.Thread(target=compact)
        t.start()
        assert not compacted.wait(0.3)  # waits for the put in flight
        # ... holding the topic meanwhile: a put with a deadline still keeps it
        # (it waited at the compaction's gate without one).
        late: list[BaseException] = []

        def put_late() -> None:
            try:
                topic.put_many([("c", b"3")], timeout_ms=100)
            except BaseException as e:  # reported below
                late.append(e)

        p = threading.Thread(target=put_late, daemon=True)
        p.start()
        p.join(5)
        assert not p.is_alive(), "a put with a deadline waited at the compaction's gate"
        assert isinstance(late[0], TimeoutError) and "nothing was written" in str(late[0])
    finally:
        testing.release_fault(disk, "sync")
    t.join(10)
    assert compacted.is_set()
    assert topic.get("b") == b"2" and topic.get("a") == b"1"
    topic.close()
    disk.close()
    again = CompactedTopic.open(str(tmp_path), "kv")
    assert dict(again.items()) == {"a": b"1", "b": b"2"}
    again.close()
