"""ManagedLedger from Python: API, futures, cursors, trimming, bad arguments."""

from __future__ import annotations

import concurrent.futures as cf
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from txnstream import (
    AckSet,
    ConfigError,
    Cursor,
    InvalidArgumentError,
    LedgerClosedError,
    ManagedLedger,
    Position,
    PositionNotFoundError,
    ReadOnlyError,
    StorageError,
    TxnPosition,
)

END = (2**64 - 1, 2**64 - 1)


def payload(i: int) -> bytes:
    return bytes((i * 7 + k) % 256 for k in range(i % 97))


def test_append_read_reopen(tmp_path: Path) -> None:
    with ManagedLedger.open(tmp_path, "public/default/out") as ml:
        assert ml.name == "public/default/out"
        assert ml.first_position is None and ml.last_position is None
        p0 = ml.append(payload(0))
        rest = ml.append_many([payload(i) for i in range(1, 50)])
        positions = [p0, *rest]
        assert positions == sorted(positions)
        assert len(set(positions)) == 50
        assert ml.read(positions[7]) == payload(7)
        assert ml.read((positions[7].ledger_id, positions[7].entry_id)) == payload(7)
        assert ml.last_position == positions[-1]
        assert ml.entry_count() == 50
        assert ml.directory == tmp_path.resolve()
        assert ml.file_prefix == tmp_path.resolve() / "ledgers" / "public%2Fdefault%2Fout"
    assert ml.closed
    with ManagedLedger.open(tmp_path, "public/default/out") as ml:
        got = ml.read_range(positions[0], END)
        assert [p for p, _ in got] == positions
        assert [d for _, d in got] == [payload(i) for i in range(50)]
        assert ml.read_range(positions[3], positions[5]) == [
            (positions[i], payload(i)) for i in (3, 4, 5)
        ]


def test_rollover_and_ledger_list(tmp_path: Path) -> None:
    with ManagedLedger.open(tmp_path, "r", max_entries_per_ledger=4) as ml:
        ps = [ml.append(b"%d" % i) for i in range(10)]
        assert [n for _, n, _ in ml.ledgers()] == [4, 4, 2]
        assert ps[4] == Position(ml.ledgers()[1][0], 0)
        assert [d for _, d in ml.read_range(ps[2], ps[8])] == [b"%d" % i for i in range(2, 9)]


def test_futures_are_real_and_ordered(tmp_path: Path) -> None:
    with ManagedLedger.open(tmp_path, "f") as ml:
        futs = [ml.append_async(payload(i)) for i in range(300)]
        _, pending = cf.wait(futs, timeout=30)
        assert not pending
        assert all(isinstance(f, cf.Future) for f in futs)
        ps = [f.result() for f in futs]
        assert ps == sorted(ps) and len(set(ps)) == 300
        # Submitted appends cannot be cancelled.
        assert not ml.append_async(b"x").cancel()
        many = ml.append_many_async([b"a", b"b", b"c"]).result(timeout=10)
        assert [ml.read(p) for p in many] == [b"a", b"b", b"c"]
        for i, p in enumerate(ps):
            assert ml.read(p) == payload(i)


def test_many_threads_share_group_commits(tmp_path: Path) -> None:
    with ManagedLedger.open(tmp_path, "t") as ml:
        out: dict[int, Position] = {}
        lock = threading.Lock()

        def worker(t: int) -> None:
            for i in range(100):
                p = ml.append(payload(t * 1000 + i))
                with lock:
                    out[t * 1000 + i] = p

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert len(set(out.values())) == 800
        for k, p in out.items():
            assert ml.read(p) == payload(k)


def test_bad_arguments_give_typed_errors(tmp_path: Path) -> None:
    ml = ManagedLedger.open(tmp_path, "bad")
    with pytest.raises(PositionNotFoundError) as ei:
        ml.read(Position(1, 0))
    assert ei.value.position == (1, 0)
    p = ml.append(b"x")
    with pytest.raises(PositionNotFoundError):
        ml.read(Position(p.ledger_id, 1))
    with pytest.raises(PositionNotFoundError):
        ml.read_range(Position(p.ledger_id, 1), END)
    with pytest.raises(InvalidArgumentError, match="ledger_id must be >= 0, got -1"):
        ml.read((-1, 0))
    with pytest.raises(InvalidArgumentError, match="entry_id must be >= 0, got -5"):
        ml.read((1, -5))
    with pytest.raises(InvalidArgumentError, match="after end"):
        ml.read_range(Position(2, 0), Position(1, 0))
    with pytest.raises(TypeError):
        ml.read("1:0")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ml.append("text")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ml.append_many(b"not a list")  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as ce:
        ManagedLedger.open(tmp_path, "o", max_entries_per_ledger=-1)
    assert ce.value.key == "max_entries_per_ledger"
    with pytest.raises(ConfigError):
        ManagedLedger.open(tmp_path, "o", max_entries_per_ledger=0)
    with pytest.raises(InvalidArgumentError):
        ManagedLedger.open(tmp_path, "")
    # One writer per ledger.
    with pytest.raises(StorageError):
        ManagedLedger.open(tmp_path, "bad")
    cur = ml.open_cursor("c")
    with pytest.raises(InvalidArgumentError):
        cur.read_next(-1)
    with pytest.raises(PositionNotFoundError):
        cur.mark_delete(Position(p.ledger_id, 9))
    with pytest.raises(InvalidArgumentError):
        cur.delete([TxnPosition(p.ledger_id, 0, 4, 1), TxnPosition(p.ledger_id, 0, 5, 1)])
    assert cur.batch_ack_set(p) is None  # all-or-nothing
    ml.close()
    ml.close()  # idempotent
    for call in (
        lambda: ml.append(b"x"),
        lambda: ml.append_many([b"x"]),
        lambda: ml.read(p),
        lambda: ml.read_range(p, p),
        lambda: cur.read_next(1),
        lambda: cur.mark_delete(p),
        lambda: ml.open_cursor("d"),
    ):
        with pytest.raises(LedgerClosedError):
            call()
    with pytest.raises(LedgerClosedError):
        ml.append_async(b"x").result(timeout=5)
    # The lock is released by close: a new writer may open it.
    ManagedLedger.open(tmp_path, "bad").close()


def test_cursor_deletes_and_persistence(tmp_path: Path) -> None:
    with ManagedLedger.open(tmp_path, "c", max_entries_per_ledger=5) as ml:
        ps = ml.append_many([payload(i) for i in range(12)])
        cur = ml.open_cursor("sub")
        assert isinstance(cur, Cursor)
        assert cur.mark_delete_position is None
        assert [p for p, _ in cur.read_next(3)] == ps[:3]
        cur.mark_delete(ps[1])
        cur.delete([ps[3], ps[4], TxnPosition(ps[6].ledger_id, ps[6].entry_id, 3, 1)])
        cur.delete([TxnPosition(ps[6].ledger_id, ps[6].entry_id, 3, 2)])
        acks = cur.batch_ack_set(ps[6])
        assert isinstance(acks, AckSet)
        assert acks.to_words() == [0b001]
        assert cur.deleted_ranges() == [(ps[3], ps[4])]
        # Deleting 2 lets the mark-delete run over 3 and 4.
        cur.delete([ps[2]])
        assert cur.mark_delete_position == ps[4]
        cur.rewind()
        assert [p for p, _ in cur.read_next(100)] == ps[5:]
        assert cur.read_next(10) == []
    with ManagedLedger.open(tmp_path, "c", max_entries_per_ledger=5) as ml:
        assert ml.cursor_names() == ["sub"]
        cur = ml.open_cursor("sub")
        assert cur.mark_delete_position == ps[4]
        assert cur.batch_ack_set(ps[6]) == AckSet.from_words([0b001], 3)
        assert not cur.is_deleted(ps[6])
        cur.delete([TxnPosition(ps[6].ledger_id, ps[6].entry_id, 3, 0)])
        assert cur.is_deleted(ps[6]) and cur.batch_ack_set(ps[6]) is None
        cur.delete([ps[5]])
        assert cur.mark_delete_position == ps[6]
        # Going backwards is a no-op (a replay may acknowledge again).
        cur.mark_delete(ps[0])
        assert cur.mark_delete_position == ps[6]


def test_trimming_follows_the_slowest_cursor(tmp_path: Path) -> None:
    with ManagedLedger.open(tmp_path, "trim", max_entries_per_ledger=4) as ml:
        ps = ml.append_many([b"a"] * 4) + ml.append_many([b"b"] * 4) + ml.append_many([b"c"] * 4)
        ml.flush()
        assert len(ml.ledgers()) == 3  # no cursors: nothing trimmed
        fast, slow = ml.open_cursor("fast"), ml.open_cursor("slow")
        fast.mark_delete(ps[11])
        slow.mark_delete(ps[5])
        ml.flush()
        assert ml.first_position == ps[4]
        with pytest.raises(PositionNotFoundError, match="trimmed"):
            ml.read(ps[0])
        slow.mark_delete(ps[11])
        ml.flush()
        # The newest ledger always stays.
        assert ml.first_position == ps[8]
        assert not Path(f"{ml.file_prefix}@{ps[0].ledger_id}.log").exists()
    with ManagedLedger.open(tmp_path, "trim") as ml:
        assert ml.first_position == ps[8]
        assert ml.open_cursor("slow").read_next(10) == []


def test_read_only_open_sees_cursor_state(tmp_path: Path) -> None:
    with ManagedLedger.open(tmp_path, "ro") as ml:
        ps = ml.append_many([b"x", b"y", b"z"])
        cur = ml.open_cursor("s")
        cur.delete([TxnPosition(ps[1].ledger_id, ps[1].entry_id, 2, 0)])
        cur.mark_delete(ps[0])
        cur.flush()
        ro = ManagedLedger.open(tmp_path, "ro", read_only=True)
        assert ro.read_only
        rc = ro.open_cursor("s")
        assert rc.mark_delete_position == ps[0]
        assert rc.batch_ack_set(ps[1]) == AckSet.single_deleted(2, 0)
        with pytest.raises(ReadOnlyError):
            ro.append(b"no")
        with pytest.raises(ReadOnlyError):
            rc.mark_delete(ps[1])
        ml.append(b"w")
        assert ro.last_position == ps[2]
        ro.refresh()
        assert ro.last_position is not None and ro.read(ro.last_position) == b"w"
        ro.close()


def test_append_positioned_reports_the_position_before_durability(tmp_path: Path) -> None:
    from txnstream import testing

    with ManagedLedger.open(tmp_path, "pos") as ml:
        first = ml.append(b"first")
        testing.hold_fault(ml, "sync")
        assigned, durable = ml.append_positioned(bytearray(b"second"))
        # The position comes while the sync is still held...
        p = assigned.result(timeout=30)
        assert p == Position(first.ledger_id, first.entry_id + 1)
        assert testing.wait_fault_held(ml, "sync", timeout_ms=30_000)
        assert not durable.done()
        # ...and the entry is readable only once durable.
        with pytest.raises(PositionNotFoundError):
            ml.read(p)
        testing.release_fault(ml, "sync")
        assert durable.result(timeout=30) == p
        assert ml.read(p) == b"second"
        # A failure reaches both futures (the position never came).
        testing.inject_fault(ml, "sync", errno=5)
        assigned, durable = ml.append_positioned(b"lost")
        with pytest.raises(StorageError):
            durable.result(timeout=30)
        assert assigned.done()


def test_appends_take_any_buffer(tmp_path: Path) -> None:
    import numpy as np

    with ManagedLedger.open(tmp_path, "buf") as ml:
        ps = [
            ml.append(bytearray(b"ba")),
            ml.append(memoryview(b"mv")),
            # numpy arrays export the buffer protocol (typing on 3.11 cannot say so).
            ml.append_async(np.frombuffer(b"np", dtype=np.uint8)).result(timeout=30),  # type: ignore[arg-type]
        ]
        assert [ml.read(p) for p in ps] == [b"ba", b"mv", b"np"]
        with pytest.raises(InvalidArgumentError, match="data must be bytes"):
            ml.append("text")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="max_entries_per_ledger"):
            ManagedLedger.open(tmp_path, "big", max_entries_per_ledger=2**70)


def test_names_of_the_managed_ledgers_of_a_directory(tmp_path: Path) -> None:
    with ManagedLedger.open(tmp_path, "b/x") as a, ManagedLedger.open(tmp_path, "a"):
        a.append(b"1")
        # Read-only, while the writer has it open.
        assert ManagedLedger.names(tmp_path) == ["a", "b/x"]
    assert ManagedLedger.names(tmp_path) == ["a", "b/x"]
    with pytest.raises(StorageError):
        ManagedLedger.names(tmp_path / "missing")


def test_bad_arguments_to_the_storage_classes_are_typed_errors(tmp_path: Path) -> None:
    """Names, flags, paths, keys, values: InvalidArgumentError naming them (not TypeError)."""
    from txnstream import AckSet, BufferedWriter, CompactedTopic, frame
    from txnstream.errors import InvalidArgumentError

    ml = ManagedLedger.open(tmp_path, "t")
    ml.append(b"x")
    cur = ml.open_cursor("c")
    ct = CompactedTopic.open(tmp_path, "ct")
    w = BufferedWriter(ml)
    calls: list[tuple[Callable[[], object], str]] = [
        (lambda: ManagedLedger.open(tmp_path, None), "name"),  # type: ignore[arg-type]
        (lambda: ManagedLedger.open(tmp_path, "t2", read_only="yes"), "read_only"),  # type: ignore[arg-type]
        (lambda: ManagedLedger.open(str(tmp_path / "a\0b"), "t"), "directory"),
        (lambda: ManagedLedger.names(None), "directory"),  # type: ignore[arg-type]
        (lambda: ManagedLedger.names(bytes(tmp_path)), "directory"),  # type: ignore[arg-type]
        (lambda: ml.open_cursor(None), "name"),  # type: ignore[arg-type]
        (lambda: ml.delete_cursor(5), "name"),  # type: ignore[arg-type]
        (lambda: cur.read_next(1.5), "max_entries"),  # type: ignore[arg-type]
        (lambda: cur.read_next(2**63), "max_entries"),
        (lambda: cur.delete(None), "positions"),  # type: ignore[arg-type]
        (lambda: ct.put(None, b"v"), "key"),  # type: ignore[arg-type]
        (lambda: ct.put("k", "text"), "value"),  # type: ignore[arg-type]
        (lambda: ct.get(b"k"), "key"),  # type: ignore[arg-type]
        (lambda: ct.put_many([("k", "v")]), "records value"),  # type: ignore[list-item]
        (lambda: ct.put_many([("k",)]), "records"),  # type: ignore[list-item]
        (lambda: CompactedTopic.open(tmp_path, "c2", write_only=1), "write_only"),  # type: ignore[arg-type]
        (lambda: BufferedWriter(None), "ml"),  # type: ignore[arg-type]
        (lambda: BufferedWriter(ml, batch_enabled=1), "batch_enabled"),  # type: ignore[arg-type]
        (lambda: BufferedWriter(ml, name=5), "name"),  # type: ignore[arg-type]
        (lambda: w.set_batch_enabled(None), "enabled"),  # type: ignore[arg-type]
        (lambda: AckSet(8).overlaps(None), "other"),  # type: ignore[arg-type]
        (lambda: frame.decode_entry(None), "entry"),  # type: ignore[arg-type]
    ]
    for call, name in calls:
        with pytest.raises(InvalidArgumentError, match=name):
            call()
    # Any buffer is an entry or a value, as for appends.
    assert frame.decode_entry(bytearray(b"ab")) == [b"ab"]
    assert not frame.is_batched(memoryview(b"ab"))
    ct.put("k", bytearray(b"v"))
    assert ct.get("k") == b"v"
    assert ml.cursor_names() == ["c"]
    w.close()
    ct.close()
    ml.close()


def test_a_deleted_ledger_name_is_created_again_fresh(tmp_path: Path) -> None:
    # The old ledger's files were removed by the first checkpoint after its
    # deletion, and before the fix that was the re-created ledger's file too:
    # its acknowledged entries were gone after the checkpoint.
    with ManagedLedger.open(tmp_path, "keep") as keep:
        old = ManagedLedger.open(tmp_path, "topic", max_entries_per_ledger=2)
        old_ps = old.append_many([b"old-%d" % i for i in range(5)])
        old.open_cursor("sub")
        old.delete()
        assert old.closed
        ml = ManagedLedger.open(tmp_path, "topic")
        assert ml.first_position is None and ml.cursor_names() == []
        new_ps = [ml.append(b"new-%d" % i) for i in range(3)]
        ml.checkpoint()
        assert [d for _, d in ml.read_range(new_ps[0], new_ps[-1])] == [
            b"new-0",
            b"new-1",
            b"new-2",
        ]
        for p in old_ps:
            if p not in new_ps:
                with pytest.raises(PositionNotFoundError):
                    ml.read(p)
        ml.close()
        assert not keep.closed
    with ManagedLedger.open(tmp_path, "topic") as ml:
        assert ml.entry_count() == 3
        assert [ml.read(p) for p in new_ps] == [b"new-0", b"new-1", b"new-2"]
