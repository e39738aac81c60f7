"""Replay of mixed batched/unbatched logs with batch-index deletion (SPEC §3.3, §4.2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from txnstream import BufferedWriter, ManagedLedger, Position, TxnPosition
from txnstream.errors import CorruptEntryError, InvalidArgumentError
from txnstream.replay import replay, replay_chunks

HOUR_MS = 3_600_000.0


def rec(i: int) -> bytes:
    return b"\x08" + f"record-{i}".encode()


def write_mixed(ml: ManagedLedger) -> list[TxnPosition]:
    """8 batched (2 entries of 4), 3 unbatched, then 5 batched (4 + 1)."""
    w = BufferedWriter(ml, max_records=4, max_delay_ms=HOUR_MS)
    futs = [w.write(rec(i)) for i in range(8)]
    w.set_batch_enabled(False)
    futs += [w.write(rec(i)) for i in range(8, 11)]
    w.set_batch_enabled(True)
    futs += [w.write(rec(i)) for i in range(11, 16)]
    w.flush()
    ps = [f.result(timeout=10) for f in futs]
    w.close()
    assert [p.batch_size for p in ps] == [4] * 8 + [1] * 3 + [4] * 4 + [1]
    return ps


def live(ps: list[TxnPosition], deleted: set[int]) -> list[tuple[tuple[int, int, int], bytes]]:
    return [(p.key(), rec(i)) for i, p in enumerate(ps) if i not in deleted]


def as_pairs(ml: ManagedLedger, cursor: str) -> list[tuple[tuple[int, int, int], bytes]]:
    return [(p.key(), r) for p, r in replay(ml, cursor)]


def test_replay_mixed_log_with_deletions(tmp_path: Path) -> None:
    with ManagedLedger.open(tmp_path, "__transaction_log_0") as ml:
        ps = write_mixed(ml)
        cur = ml.open_cursor("tc")
        everything = replay(ml, "tc")
        assert as_pairs(ml, "tc") == live(ps, set())
        assert (everything.entries, everything.skipped) == (7, 0)
        # Batch sizes and indexes come back exactly as the writer reported them.
        assert everything.positions() == ps
        assert [(p.batch_size, p.batch_index) for p in everything.positions()] == [
            (p.batch_size, p.batch_index) for p in ps
        ]

        # Partial deletion of the first batch, all of the second, one unbatched
        # record, and the lone record of the last (batched) entry.
        deleted = {0, 2, 4, 5, 6, 7, 9, 15}
        cur.delete([ps[i] for i in sorted(deleted)])
        assert not cur.is_deleted(ps[0].position)
        acks = cur.batch_ack_set(ps[0].position)
        assert acks is not None and acks.present() == [1, 3]
        assert cur.is_deleted(ps[4].position), "an entry is freed once all its records are"
        assert cur.is_deleted(ps[9].position)
        assert cur.is_deleted(ps[15].position)

        got = replay(ml, "tc")
        assert [(p.key(), r) for p, r in got] == live(ps, deleted)
        assert got.skipped == 2  # records 0 and 2 inside the partially deleted entry
        assert got.entries == 4

        # Deleting the rest of the first entry frees it and moves the mark-delete.
        cur.delete([ps[1], ps[3]])
        deleted |= {1, 3}
        assert cur.mark_delete_position == ps[7].position
        assert as_pairs(ml, "tc") == live(ps, deleted)
        cur.flush()

    # The cursor's deletions survive a restart; replay reads the same.
    with ManagedLedger.open(tmp_path, "__transaction_log_0") as ml:
        assert as_pairs(ml, "tc") == live(ps, deleted)
        # Without a cursor every record of the range is returned.
        whole = replay(ml)
        assert [(p.key(), r) for p, r in whole] == live(ps, set())
        part = replay(ml, start=ps[8], end=ps[10])
        assert part.records() == [rec(8), rec(9), rec(10)]
        part = replay(ml, "tc", start=ps[8], end=ps[10])
        assert part.records() == [rec(8), rec(10)]


def test_chunks_equal_single_call(tmp_path: Path) -> None:
    with ManagedLedger.open(tmp_path, "log") as ml:
        ps = write_mixed(ml)
        cur = ml.open_cursor("tc")
        cur.delete([ps[1], ps[9], ps[12]])
        whole = replay(ml, cur)
        chunks = list(replay_chunks(ml, cur, chunk_entries=2))
        assert [c.entries for c in chunks] == [2, 2, 2]  # the deleted entry is skipped
        assert [pr for c in chunks for pr in c] == list(whole)
        assert sum(len(c) for c in chunks) == len(whole) == 13


def test_columns_are_numpy(tmp_path: Path) -> None:
    with ManagedLedger.open(tmp_path, "log") as ml:
        ps = write_mixed(ml)
        got = replay(ml, "c")
        assert got.ledger_id.dtype == np.uint64
        assert got.entry_id.dtype == np.uint64
        assert got.batch_size.dtype == np.uint32
        assert got.batch_index.dtype == np.uint32
        assert got.offsets.dtype == np.int64
        assert len(got.offsets) == len(got) + 1
        assert got.record(3) == rec(3)
        assert got.position(10) == ps[10]
        assert got.position(10).key() == ps[10].key()


def test_empty_and_bad_arguments(tmp_path: Path) -> None:
    with ManagedLedger.open(tmp_path, "log") as ml:
        assert len(replay(ml)) == 0
        assert len(replay(ml, "c")) == 0
        ml.append(b"\x08\x01")
        assert replay(ml, start=Position(99, 0)).entries == 0
        with pytest.raises(TypeError):
            replay(ml, 5)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            replay(ml, start=(1, 0))  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError):
            list(replay_chunks(ml, "c", chunk_entries=0))


def test_corrupt_entry_names_position(tmp_path: Path) -> None:
    with ManagedLedger.open(tmp_path, "log") as ml:
        good = ml.append(b"\x08\x01")
        bad = ml.append(b"\x0e\x01\x00\x01\x0a\x05ab")  # record runs past the end
        with pytest.raises(CorruptEntryError) as info:
            replay(ml, "c")
        assert info.value.position == (bad.ledger_id, bad.entry_id)
        # Ranges before the damage still read.
        assert replay(ml, end=good).records() == [b"\x08\x01"]


def test_bad_arguments_create_no_cursor(tmp_path: Path) -> None:
    """Every argument is checked before the named cursor is opened (which creates it)."""
    from txnstream._native import replay_log

    with ManagedLedger.open(tmp_path, "log") as ml:
        ml.append(b"\x08\x01")
        for name, kwargs in (
            ("typo1", {"start": "bad"}),
            ("typo2", {"max_entries": 0}),
            ("typo3", {"start": Position(1, 0), "max_entries": 5}),
        ):
            with pytest.raises((InvalidArgumentError, TypeError)):
                replay_log(ml, name, **kwargs)
        assert ml.cursor_names() == []


def test_replay_takes_a_cursor_of_this_ledger_or_a_name_only(tmp_path: Path) -> None:
    # Any object with a ``.name`` was taken for a cursor name: another
    # ledger's Cursor (whose deletions are not this ledger's) or a Path; the
    # name was then opened, i.e. created, on this ledger.
    import pathlib

    from txnstream._native import replay_log

    with ManagedLedger.open(tmp_path, "a") as a, ManagedLedger.open(tmp_path, "b") as b:
        for ml in (a, b):
            written = [ml.append(rec(i)) for i in range(3)]
        cb = b.open_cursor("reader")
        cb.mark_delete(written[1])
        assert replay(b, cb).records() == [rec(2)]
        with pytest.raises(
            InvalidArgumentError, match='"reader" is a Cursor of "b", not of managed ledger "a"'
        ):
            replay_log(a, cb)
        with pytest.raises(InvalidArgumentError, match="not PosixPath"):
            replay_log(a, pathlib.Path("/etc/passwd"))  # type: ignore[arg-type]
        assert a.cursor_names() == []
        ca = a.open_cursor("reader")
        assert replay(a, ca).records() == [rec(i) for i in range(3)]
        assert replay(a, "reader").records() == [rec(i) for i in range(3)]


def test_log_reader_arguments_are_checked_by_name(tmp_path: Path) -> None:
    # replay_log/fold_txn_log/scan_log arguments converted by PyO3 raised
    # bare OverflowError/TypeError, and True was taken for 1.
    from txnstream import _native

    n: Any = _native  # the calls are wrong on purpose
    replay_log, fold_txn_log, scan_log = n.replay_log, n.fold_txn_log, n.scan_log
    with ManagedLedger.open(tmp_path, "log") as ml:
        ml.append(b"\x08\x00")
        ml.open_cursor("c")
        calls: list[tuple[str, Any, str]] = [
            ("max_entries", lambda: replay_log(ml, "c", max_entries=2**63), "2\\*\\*63"),
            ("max_entries", lambda: replay_log(ml, "c", max_entries=True), "not bool"),
            ("tc_id", lambda: fold_txn_log(ml, "c", -1), ">= 0, got -1"),
            ("cursor", lambda: fold_txn_log(ml, b"c", 0), "must be a str, not bytes"),
            ("kind", lambda: scan_log(ml, 1, 1, 0, 0), "must be a str, not int"),
            ("cursors", lambda: scan_log(ml, "txn", 1, 0, 0, "c"), "sequence of str, not str"),
            ("cursors[0]", lambda: scan_log(ml, "txn", 1, 0, 0, [b"c"]), "must be a str"),
        ]
        for name, call, match in calls:
            with pytest.raises(InvalidArgumentError, match=match) as info:
                call()
            assert name in str(info.value)
        assert ml.cursor_names() == ["c"]
        assert replay_log(ml, "c", max_entries=1)["entries"] == 1


def test_live_record_takes_a_negative_index_like_position(tmp_path: Path) -> None:
    # record(-1) returned b"" while position(-1) gave the last record's position.
    with ManagedLedger.open(tmp_path, "log") as ml:
        ps = write_mixed(ml)
        got = replay(ml, "c")
        records = got.records()
        for i in (-1, -2, -len(got), 0, len(got) - 1):
            assert got.record(i) == records[i]
            assert got.position(i).key() == ps[i].key()
        with pytest.raises(IndexError, match="out of range for 16 records"):
            got.record(len(got))
        with pytest.raises(IndexError):
            got.record(-len(got) - 1)
