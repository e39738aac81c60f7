"""Tiered storage: aborted-txn indexes, offload, remote READ_COMMITTED (SPEC §3.4, §4.8)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from txnstream import CorruptIndexError, InvalidArgumentError, ManagedLedger, Position, StorageError
from txnstream._native import (
    AbortedTxnIndex,
    SegmentIndex,
    crc32c,
    encode_marker,
    encode_message,
    export_segment,
)
from txnstream.testing import set_remote_call_hook
from txnstream.tiered import (
    METADATA_LEDGER,
    Offloader,
    RemoteLogMetadataManager,
    RemoteStorage,
    TieredReader,
    TopicTxnIndexes,
    object_name,
)

TOPIC = "persistent://public/default/orders"
#: Read bound past every entry: in these tests every transaction has ended.
ALL = Position(1 << 62, 0)


# ------------------------------------------------------------------ a topic writer


@dataclass
class TopicWriter:
    """Writes a topic's entries as the broker does: messages (some in
    transactions), COMMIT/ABORT markers, and the local aborted-txn index
    records with exact first and last-stable positions."""

    ml: ManagedLedger
    indexes: TopicTxnIndexes
    seq: int = 0
    first: dict[tuple[int, int], Position] = field(default_factory=dict)
    aborted: set[tuple[int, int]] = field(default_factory=set)

    def send(self, value: bytes, txn: tuple[int, int] | None = None) -> Position:
        self.seq += 1
        pos = self.ml.append(encode_message(value, "p1", self.seq, 1_000, txn=txn))
        if txn is not None:
            self.first.setdefault(txn, pos)
        return pos

    def end(self, txn: tuple[int, int], commit: bool) -> Position:
        pos = self.ml.append(encode_marker(commit, txn[0], txn[1], 1_000))
        first = self.first.pop(txn, pos)
        if not commit:
            lso = min([first, *self.first.values()])
            self.indexes.append(self.ml.name, txn, first, pos, lso)
            self.aborted.add(txn)
        return pos


def open_topic(tmp: Path, per_ledger: int = 8) -> ManagedLedger:
    return ManagedLedger.open(tmp / "data", TOPIC, max_entries_per_ledger=per_ledger)


@pytest.fixture
def stack(
    tmp_path: Path,
) -> Iterator[tuple[ManagedLedger, RemoteStorage, RemoteLogMetadataManager]]:
    ml = open_topic(tmp_path)
    meta_log = ManagedLedger.open(tmp_path / "data", METADATA_LEDGER)
    remote = RemoteStorage(tmp_path / "remote")
    rlmm = RemoteLogMetadataManager(meta_log, remote)
    yield ml, remote, rlmm
    ml.close()
    meta_log.close()


def write_segments(w: TopicWriter, segments: int, abort_in: set[int], per_ledger: int = 8) -> None:
    """Fill `segments` ledgers of `per_ledger` entries; ledger k (1-based
    order) holds an aborted transaction when k is in `abort_in`."""
    for k in range(1, segments + 1):
        t = (7, k)
        w.send(f"k{k}-a".encode(), t)
        w.send(f"k{k}-plain".encode())
        w.send(f"k{k}-b".encode(), t)
        w.end(t, commit=k not in abort_in)
        while (w.ml.last_position or Position(0, 0)).entry_id < per_ledger - 1:
            w.send(f"k{k}-fill".encode())
    w.send(b"tail")  # rolls to a new ledger: every written ledger is now closed


def offload_all(ml: ManagedLedger, off: Offloader) -> None:
    for lid, n, sealed in ml.ledgers():
        if sealed and n:
            off.offload(ml, lid)


def local_read_committed(ml: ManagedLedger) -> list[tuple[Position, bytes]]:
    reader = TieredReader(RemoteStorage(Path(ml.directory) / "no-remote"), _null_rlmm(ml))
    return [
        (m.position, m.payload) for m in reader.read_committed(TOPIC, ml, max_read_position=ALL)
    ]


def _null_rlmm(ml: ManagedLedger) -> RemoteLogMetadataManager:
    log = ManagedLedger.open(ml.directory, "__null_metadata")
    return RemoteLogMetadataManager(log, RemoteStorage(Path(ml.directory) / "no-remote"))


# ------------------------------------------------------------------ the index (binding)


def test_collect_aborted_four_overlapping_narrow_complete_wide_not() -> None:
    i = AbortedTxnIndex(5)
    p = Position
    i.append((0, 1), p(5, 0), p(5, 10), p(5, 0))
    i.append((0, 2), p(5, 2), p(5, 12), p(5, 2))
    i.append((0, 3), p(5, 4), p(5, 14), p(5, 4))
    i.append((0, 4), p(5, 15), p(5, 20), p(5, 15))
    recs, complete = i.collect(p(5, 3), p(5, 12))
    assert [r[0] for r in recs] == [(0, 1), (0, 2), (0, 3)] and complete
    recs, complete = i.collect(p(5, 11), p(5, 30))
    assert [r[0] for r in recs] == [(0, 2), (0, 3), (0, 4)] and not complete
    assert AbortedTxnIndex(9).collect(p(9, 0), p(9, 5)) == ([], False)  # empty: never complete


def test_index_bad_input_is_typed_and_names_the_value() -> None:
    i = AbortedTxnIndex(3)
    i.append((0, 1), (3, 0), (3, 4), (3, 0))
    with pytest.raises(InvalidArgumentError, match="3:4"):
        i.append((0, 2), (3, 0), (3, 4), (3, 0))  # last not increasing
    with pytest.raises(InvalidArgumentError, match="txn"):
        i.append("x", (3, 0), (3, 5), (3, 0))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="ledger_id"):
        AbortedTxnIndex(-1)
    with pytest.raises(CorruptIndexError, match="bad magic") as e:
        AbortedTxnIndex.decode(b"x" * 64)
    assert e.value.offset == 0
    with pytest.raises(CorruptIndexError):
        SegmentIndex.decode(b"TSSEGIX1" + b"\0" * 60)
    assert len(i) == 1


def test_tiered_apis_refuse_bad_arguments_with_typed_errors(tmp_path: Path) -> None:
    # Found in review: each raised AttributeError or TypeError (or, for the
    # last, silently returned nothing).
    ml = ManagedLedger.open(tmp_path / "data", "t")
    ml.append(b"x")
    remote = RemoteStorage(tmp_path / "remote")
    rlmm = RemoteLogMetadataManager(ManagedLedger.open(tmp_path / "data", METADATA_LEDGER), remote)
    # Typed as Any: the calls below are wrong on purpose.
    off: Any = Offloader(remote, rlmm)
    reader: Any = TieredReader(remote, rlmm)
    idx: Any = TopicTxnIndexes(tmp_path / "data")
    meta: Any = rlmm
    new_rlmm: Any = RemoteLogMetadataManager
    new_idx: Any = TopicTxnIndexes
    name: Any = object_name
    export: Any = export_segment
    checksum: Any = crc32c
    rebuild: Any = AbortedTxnIndex.rebuild
    p = Position(1, 0)
    calls: dict[str, Any] = {
        "ml": lambda: off.offload_by_policy("ml", threshold_bytes=0),
        "ml ": lambda: off.hold_trimming("ml"),
        "ml  ": lambda: list(reader.read_committed("t", "x", max_read_position=p)),
        "aborted": lambda: list(reader.read_committed("t", ml, max_read_position=p, aborted=5)),
        "aborted ": lambda: list(
            reader.read_committed("t", ml, max_read_position=p, aborted=[[1, 2]])
        ),
        "seg": lambda: reader.segment_entries("x"),
        "seg ": lambda: reader.txn_index("not-a-segment"),
        "seg  ": lambda: meta.deleted(None),
        "log": lambda: new_rlmm("log", remote),
        "started": lambda: meta.copy_finished("x", True),
        "topic": lambda: meta.segments(None),
        "topic ": lambda: meta.next_segment_with_txn_index(["l"], (0, 0)),
        "topic  ": lambda: reader.collect_aborted(1, p, p),
        "topic   ": lambda: idx.load(None, 1),
        "topic    ": lambda: name(123, 1, "s", "segment"),
        "below_ledger": lambda: idx.prune_many({"t": "x"}),
        "data_dir": lambda: new_idx(None),
        "aborts": lambda: rebuild(1, 5),
        "ManagedLedger": lambda: export("x", 1),
        "data must be bytes": lambda: checksum("x"),
        "data_crc32c": lambda: meta.copy_started("t", 1, 0, 0, 1, 8, data_crc32c=1 << 32),
    }
    for word, call in calls.items():
        with pytest.raises(InvalidArgumentError, match=word.strip()):
            call()
    # A READ_COMMITTED read refuses bad arguments at the call, not at its
    # first next() (found in review: a bad read, never iterated, said nothing).
    lazy = {
        "ml": lambda: reader.read_committed("t", "x", max_read_position=p),
        "aborted": lambda: reader.read_committed("t", ml, max_read_position=p, aborted=5),
        "start": lambda: reader.read_committed("t", ml, max_read_position=None, start="x"),
        "max_read_position": lambda: reader.read_committed("t", ml, max_read_position="x"),
    }
    for word, call in lazy.items():
        with pytest.raises(InvalidArgumentError, match=word):
            call()
    # Positions as (ledger, entry) pairs are accepted, as everywhere else.
    idx.append("t", (1, 2), (1, 0), (1, 1), (1, 0))
    index = idx.load("t", 1)
    assert index is not None and len(index) == 1


def test_names_that_fit_keep_their_quoted_form(tmp_path: Path) -> None:
    # Existing files and objects must keep being found: only names that
    # could never be written (too long once quoted) take the hashed form.
    # Found in review: a first version hashed from 180 bytes, renaming
    # files of names that fit.
    topic = "persistent://public/default/" + "a" * 155
    quoted = urllib.parse.quote(topic, safe="")
    assert len(quoted) == 193
    assert object_name(topic, 7, "s", "segment") == f"{quoted}/7-s.data"
    idx = TopicTxnIndexes(tmp_path)
    assert idx.path(topic, 7).name == f"{quoted}@7.txnidx"
    # 238 bytes quoted: its index file name fits with ledger 7, not with a
    # 19-digit ledger id; prune finds both forms.
    long = "persistent://public/default/" + "b" * 200
    short_id, long_id = idx.path(long, 7), idx.path(long, 10**18)
    assert short_id.name.startswith(urllib.parse.quote(long, safe=""))
    assert len(long_id.name) <= 255 and ".." in long_id.name
    for p in (short_id, long_id):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(AbortedTxnIndex.encode_header(7))
    assert idx.prune(long, 10**18 + 1) == 2


def test_index_decode_fuzz_never_panics() -> None:
    rng = random.Random(7)
    i = AbortedTxnIndex(4)
    for k in range(5):
        i.append((1, k), (4, k), (4, 10 + k), (4, k))
    good = i.encode()
    for _ in range(2000):
        b = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            op = rng.random()
            if op < 0.5 and b:
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
            elif op < 0.8:
                del b[rng.randrange(len(b) + 1) :]
            else:
                b += bytes(rng.randrange(256) for _ in range(rng.randint(1, 80)))
        try:
            d = AbortedTxnIndex.decode(bytes(b))
        except CorruptIndexError:
            continue
        d.sanity_check()  # whatever decodes keeps every rule
        assert d.encode() == bytes(b)  # a strict decoder: only exact bytes decode


# ------------------------------------------------------------------ KIP-1058 fetch counts


def test_six_segments_no_aborts_fetch_zero_indexes_old_metadata_fetches_all(
    tmp_path: Path,
) -> None:
    ml = open_topic(tmp_path)
    idx = TopicTxnIndexes(tmp_path / "data")
    w = TopicWriter(ml, idx)
    write_segments(w, 6, abort_in=set())
    expected = local_read_committed(ml)
    counts = {}
    for flag in (True, False):
        meta_log = ManagedLedger.open(tmp_path / "data", f"{METADATA_LEDGER}-{flag}")
        remote = RemoteStorage(tmp_path / f"remote-{flag}")
        rlmm = RemoteLogMetadataManager(meta_log, remote)
        off = Offloader(remote, rlmm, idx, write_txn_idx_flag=flag)
        offload_all(ml, off)
        assert len(rlmm.segments(TOPIC)) == 6
        assert all(s.has_txn_idx_flag == flag for s in rlmm.segments(TOPIC))
        before = remote.calls()
        got = [
            (m.position, m.payload)
            for m in TieredReader(remote, rlmm).read_committed(
                TOPIC, max_read_position=ALL, aborted=w.aborted
            )
        ]
        after = remote.calls()
        counts[flag] = {k: after[k] - before[k] for k in after}
        # Remote only (no local ledger given): the same messages as all-local.
        assert got == [e for e in expected if e[1] != b"tail"]
        meta_log.close()
    assert counts[True]["txn_index"] == 0
    assert counts[True]["segment"] == 6
    assert counts[False]["txn_index"] == 6  # old-format metadata: every index fetched
    assert counts[False]["segment"] == 6
    ml.close()


def test_aborts_only_in_segment_4_fetch_only_that_index(tmp_path: Path) -> None:
    ml = open_topic(tmp_path)
    idx = TopicTxnIndexes(tmp_path / "data")
    w = TopicWriter(ml, idx)
    write_segments(w, 6, abort_in={4})
    meta_log = ManagedLedger.open(tmp_path / "data", METADATA_LEDGER)
    remote = RemoteStorage(tmp_path / "remote")
    rlmm = RemoteLogMetadataManager(meta_log, remote)
    off = Offloader(remote, rlmm, idx)
    offload_all(ml, off)
    assert off.stats["txn_index_rebuilt"] == 0  # the local index matched the markers
    segs = rlmm.segments(TOPIC)
    assert [s.txn_idx_empty for s in segs] == [True, True, True, False, True, True]
    fetched: list[str] = []
    set_remote_call_hook(remote, lambda kind, op: fetched.append(kind))
    got = [
        m.payload
        for m in TieredReader(remote, rlmm).read_committed(
            TOPIC, max_read_position=ALL, aborted=w.aborted
        )
    ]
    assert fetched.count("txn_index") == 1
    assert fetched.count("segment") == 6
    assert b"k4-a" not in got and b"k4-b" not in got and b"k4-plain" in got
    assert b"k3-a" in got and b"k5-b" in got
    assert got == [p for _, p in local_read_committed(ml) if p != b"tail"]
    meta_log.close()
    ml.close()


def test_remote_plus_local_equals_all_local_with_trimmed_ledgers(tmp_path: Path) -> None:
    rng = random.Random(3)
    ml = open_topic(tmp_path, per_ledger=6)
    idx = TopicTxnIndexes(tmp_path / "data")
    w = TopicWriter(ml, idx)
    open_txns: list[tuple[int, int]] = []
    for n in range(400):  # interleaved transactions, random outcomes
        r = rng.random()
        if r < 0.3 or not open_txns:
            t = (1, n)
            open_txns.append(t)
            w.send(f"m{n}".encode(), t)
        elif r < 0.6:
            w.send(f"m{n}".encode(), rng.choice(open_txns))
        elif r < 0.75:
            w.send(f"plain{n}".encode())
        else:
            t = open_txns.pop(rng.randrange(len(open_txns)))
            w.end(t, commit=rng.random() < 0.5)
    for t in open_txns:
        w.end(t, commit=False)
    w.send(b"last")
    expected = local_read_committed(ml)
    assert w.aborted
    meta_log = ManagedLedger.open(tmp_path / "data", METADATA_LEDGER)
    remote = RemoteStorage(tmp_path / "remote")
    rlmm = RemoteLogMetadataManager(meta_log, remote)
    offload_all(ml, Offloader(remote, rlmm, idx))
    # The local copy of the older half goes (trimmed once a cursor passed it).
    ledgers = [lid for lid, n, sealed in ml.ledgers() if sealed and n]
    half = ledgers[len(ledgers) // 2]
    c = ml.open_cursor("retention")
    c.mark_delete(Position(half, 5))
    deadline = time.monotonic() + 10
    while ml.first_position is not None and ml.first_position.ledger_id <= half:
        assert time.monotonic() < deadline, "ledgers were not trimmed"
        ml.checkpoint()
        time.sleep(0.01)
    reader = TieredReader(remote, rlmm)
    got = [(m.position, m.payload) for m in reader.read_committed(TOPIC, ml, max_read_position=ALL)]
    assert got == expected
    assert remote.calls()["segment"] >= 1  # the trimmed part came from remote
    # A READ_COMMITTED read starting inside the remote part, too.
    start = Position(ledgers[1], 2)
    part = [
        (m.position, m.payload)
        for m in TieredReader(remote, rlmm).read_committed(
            TOPIC, ml, max_read_position=ALL, start=start
        )
    ]
    assert part == [e for e in expected if e[0] >= start]
    meta_log.close()
    ml.close()


# ------------------------------------------------------------------ damage and crashes


def test_corrupt_remote_index_is_detected_and_rebuilt(tmp_path: Path) -> None:
    ml = open_topic(tmp_path)
    idx = TopicTxnIndexes(tmp_path / "data")
    w = TopicWriter(ml, idx)
    write_segments(w, 3, abort_in={2})
    meta_log = ManagedLedger.open(tmp_path / "data", METADATA_LEDGER)
    remote = RemoteStorage(tmp_path / "remote")
    rlmm = RemoteLogMetadataManager(meta_log, remote)
    offload_all(ml, Offloader(remote, rlmm, idx))
    seg = rlmm.segments(TOPIC)[1]
    path = tmp_path / "remote" / object_name(TOPIC, seg.ledger_id, seg.segment_id, "txn_index")
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 0xFF
    path.write_bytes(bytes(raw))
    reader = TieredReader(remote, rlmm)
    got = [
        m.payload for m in reader.read_committed(TOPIC, max_read_position=ALL, aborted=w.aborted)
    ]
    assert reader.txn_indexes_rebuilt == 1
    assert b"k2-a" not in got and b"k1-a" in got and b"k3-b" in got
    rebuilt = AbortedTxnIndex.decode(path.read_bytes())  # uploaded again, valid
    assert [r[0] for r in rebuilt.records()] == [(7, 2)]
    meta_log.close()
    ml.close()


def test_stale_or_damaged_local_index_is_rebuilt_at_offload(tmp_path: Path) -> None:
    ml = open_topic(tmp_path)
    idx = TopicTxnIndexes(tmp_path / "data")
    w = TopicWriter(ml, idx)
    write_segments(w, 3, abort_in={1, 3})
    lids = [lid for lid, n, sealed in ml.ledgers() if sealed and n]
    idx.path(TOPIC, lids[0]).unlink()  # a crash lost the file
    p = idx.path(TOPIC, lids[2])
    p.write_bytes(p.read_bytes()[:-5])  # torn record
    meta_log = ManagedLedger.open(tmp_path / "data", METADATA_LEDGER)
    remote = RemoteStorage(tmp_path / "remote")
    rlmm = RemoteLogMetadataManager(meta_log, remote)
    off = Offloader(remote, rlmm, idx)
    offload_all(ml, off)
    assert off.stats["txn_index_rebuilt"] == 2
    got = [
        m.payload
        for m in TieredReader(remote, rlmm).read_committed(
            TOPIC, max_read_position=ALL, aborted=w.aborted
        )
    ]
    assert got == [q for _, q in local_read_committed(ml) if q != b"tail"]
    meta_log.close()
    ml.close()


def test_a_finished_record_that_raised_but_stuck_keeps_its_objects(tmp_path: Path) -> None:
    # The FINISHED record's write raised, yet the record is durable (a sync
    # that failed after the data reached the disk), and recording the
    # abandon fails too: after a restart the metadata says FINISHED. The
    # objects must still be there (they were deleted first: once the local
    # ledger was trimmed, its data was gone).
    ml = open_topic(tmp_path)
    idx = TopicTxnIndexes(tmp_path / "data")
    write_segments(TopicWriter(ml, idx), 2, abort_in={1})
    meta_log = ManagedLedger.open(tmp_path / "data", METADATA_LEDGER)
    remote = RemoteStorage(tmp_path / "remote")
    rlmm = RemoteLogMetadataManager(meta_log, remote)
    off = Offloader(remote, rlmm, idx)
    real_finished = rlmm.copy_finished

    def finished_then_raise(*args: Any) -> None:
        real_finished(*args)
        raise StorageError("injected: the sync of the FINISHED record failed")

    def deleted_fails(seg: Any) -> None:
        raise StorageError("injected: the DELETE record failed")

    rlmm_any: Any = rlmm
    rlmm_any.copy_finished = finished_then_raise
    rlmm_any.delete_started = deleted_fails
    rlmm_any.deleted = deleted_fails
    lid = ml.ledgers()[0][0]
    with pytest.raises(StorageError, match="FINISHED"):
        off.offload(ml, lid)
    meta_log.close()
    meta_log = ManagedLedger.open(tmp_path / "data", METADATA_LEDGER)
    rlmm = RemoteLogMetadataManager(meta_log, remote)
    (seg,) = rlmm.segments(TOPIC)
    assert seg.ledger_id == lid
    reader = TieredReader(remote, rlmm)
    assert len(reader.segment_entries(seg)) == 8  # readable, not deleted
    meta_log.close()
    ml.close()


def test_objects_of_a_failed_upload_whose_deletes_failed_are_deleted_later(
    tmp_path: Path,
) -> None:
    """The abandon records DELETE_STARTED, deletes, then DELETE_FINISHED.

    Found in review: it recorded DELETE_SEGMENT_FINISHED before deleting, so
    when the deletes failed no clean-up ever looked at the upload again and
    its objects stayed in remote storage forever.
    """
    ml = open_topic(tmp_path)
    idx = TopicTxnIndexes(tmp_path / "data")
    write_segments(TopicWriter(ml, idx), 2, abort_in=set())
    meta_log = ManagedLedger.open(tmp_path / "data", METADATA_LEDGER)
    remote = RemoteStorage(tmp_path / "remote")
    rlmm = RemoteLogMetadataManager(meta_log, remote)
    off = Offloader(remote, rlmm, idx)

    def flaky(kind: str, op: str) -> None:  # the index upload fails, then every delete
        if op == "delete" or (kind, op) == ("txn_index", "put"):
            raise OSError(5, f"injected EIO ({kind} {op})")

    def objects() -> list[str]:
        return sorted(p.name for p in (tmp_path / "remote").rglob("*") if p.is_file())

    set_remote_call_hook(remote, flaky)
    with pytest.raises(StorageError, match="txnidx"):
        off.offload(ml, ml.ledgers()[0][0])
    set_remote_call_hook(remote, None)
    assert len(objects()) == 2  # the data and the offsets: their deletes failed
    assert rlmm.segments(TOPIC) == []  # never read
    (left,) = rlmm.unfinished()  # but not forgotten
    meta_log.close()
    meta_log = ManagedLedger.open(tmp_path / "data", METADATA_LEDGER)  # a restart
    rlmm = RemoteLogMetadataManager(meta_log, remote)
    assert [s.segment_id for s in rlmm.unfinished()] == [left.segment_id]
    assert Offloader(remote, rlmm, idx).clean_up() == 1
    assert objects() == [] and rlmm.unfinished() == []
    meta_log.close()
    ml.close()


def test_interrupted_offload_leaves_no_metadata_and_is_cleaned(tmp_path: Path) -> None:
    ml = open_topic(tmp_path)
    idx = TopicTxnIndexes(tmp_path / "data")
    write_segments(TopicWriter(ml, idx), 2, abort_in=set())
    meta_log = ManagedLedger.open(tmp_path / "data", METADATA_LEDGER)
    remote = RemoteStorage(tmp_path / "remote")
    rlmm = RemoteLogMetadataManager(meta_log, remote)
    off = Offloader(remote, rlmm, idx)

    def fail_index_upload(kind: str, op: str) -> None:
        if kind == "txn_index" and op == "put":
            raise OSError(5, "injected EIO")

    set_remote_call_hook(remote, fail_index_upload)
    lid = ml.ledgers()[0][0]
    with pytest.raises(StorageError, match="injected EIO"):
        off.offload(ml, lid)
    set_remote_call_hook(remote, None)
    # A failed upload is undone at once: no readable segment, nothing left over.
    assert rlmm.segments(TOPIC) == [] and rlmm.unfinished() == []
    assert off.stats["offload_failed_cleaned"] == 1
    assert not [p for p in (tmp_path / "remote").rglob("*") if p.is_file()]
    # A crash in the middle of an upload leaves a STARTED record, a partial
    # upload and a temporary: after a restart nothing readable points at
    # them, and clean-up deletes them.
    started = rlmm.copy_started(TOPIC, lid, 0, 7, 8, 100)
    remote.put(object_name(TOPIC, lid, started.segment_id, "segment"), b"partial", "segment")
    tmp = tmp_path / "remote" / "x" / ".1-y.data.123.456.tmp"
    tmp.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_bytes(b"half")
    meta_log.close()
    meta_log = ManagedLedger.open(tmp_path / "data", METADATA_LEDGER)
    rlmm = RemoteLogMetadataManager(meta_log, remote)
    assert rlmm.segments(TOPIC) == [] and len(rlmm.unfinished()) == 1
    off = Offloader(remote, rlmm, idx)
    assert off.clean_up() == 1
    assert off.stats["temporaries_removed"] == 1
    assert not [p for p in (tmp_path / "remote").rglob("*") if p.is_file()]
    off.offload(ml, lid)
    assert len(rlmm.segments(TOPIC)) == 1 and rlmm.unfinished() == []
    meta_log.close()
    ml.close()


CHILD = r"""
import sys, time
from pathlib import Path
from txnstream import ManagedLedger
from txnstream.tiered import METADATA_LEDGER, Offloader, RemoteLogMetadataManager, RemoteStorage
data, remote_dir, topic = sys.argv[1:4]
ml = ManagedLedger.open(data, topic, max_entries_per_ledger=8)
log = ManagedLedger.open(data, METADATA_LEDGER)
remote = RemoteStorage(remote_dir)
off = Offloader(remote, RemoteLogMetadataManager(log, remote))
off.clean_up()
print("ready", flush=True)
for lid, n, sealed in ml.ledgers():
    if sealed and n:
        off.offload(ml, lid)
        print("offloaded", lid, flush=True)
time.sleep(60)
"""


def test_kill_9_during_offload_then_every_finished_segment_is_whole(tmp_path: Path) -> None:
    ml = open_topic(tmp_path)
    idx = TopicTxnIndexes(tmp_path / "data")
    w = TopicWriter(ml, idx)
    write_segments(w, 40, abort_in={3, 17, 30})
    expected = [q for _, q in local_read_committed(ml) if q != b"tail"]
    ml.close()
    rng = random.Random(11)
    for _ in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(tmp_path / "data"), str(tmp_path / "remote"), TOPIC],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        # Kill it after a few more offloads: in the middle of the job.
        for _ in range(rng.randint(1, 4)):
            assert proc.stdout.readline().startswith("offloaded")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        meta_log = ManagedLedger.open(tmp_path / "data", METADATA_LEDGER)
        remote = RemoteStorage(tmp_path / "remote")
        rlmm = RemoteLogMetadataManager(meta_log, remote)
        reader = TieredReader(remote, rlmm)
        finished = rlmm.segments(TOPIC)
        assert len(finished) < 40  # the job was interrupted
        for seg in finished:  # every finished segment reads whole
            assert len(reader.segment_entries(seg)) == seg.entry_count
            reader.txn_index(seg)
        assert reader.txn_indexes_rebuilt == 0
        # After clean-up, every object on the remote belongs to a finished upload.
        Offloader(remote, rlmm, idx).clean_up()
        live = {s.segment_id for s in rlmm.segments(TOPIC)}
        for f in (tmp_path / "remote").rglob("*"):
            if f.is_file():
                assert f.name.split("-", 1)[1].split(".")[0] in live, f"orphan {f}"
        meta_log.close()
    # Finish the job and compare with the all-local read.
    ml = open_topic(tmp_path)
    meta_log = ManagedLedger.open(tmp_path / "data", METADATA_LEDGER)
    remote = RemoteStorage(tmp_path / "remote")
    rlmm = RemoteLogMetadataManager(meta_log, remote)
    off = Offloader(remote, rlmm, idx)
    off.clean_up()
    offload_all(ml, off)
    got = [
        m.payload
        for m in TieredReader(remote, rlmm).read_committed(
            TOPIC, max_read_position=ALL, aborted=w.aborted
        )
    ]
    assert got[: len(expected)] == expected
    meta_log.close()
    ml.close()


# ------------------------------------------------------------------ policy, fsspec, bad input


def test_offload_by_policy_size_and_age(
    stack: tuple[ManagedLedger, RemoteStorage, RemoteLogMetadataManager], tmp_path: Path
) -> None:
    ml, remote, rlmm = stack
    write_segments(TopicWriter(ml, TopicTxnIndexes(tmp_path / "data")), 5, abort_in=set())
    off = Offloader(remote, rlmm)
    sizes = [
        sum(len(d) for _, d in ml.read_range((lid, 0), (lid, n - 1)))
        for lid, n, sealed in ml.ledgers()
        if sealed and n
    ]
    done = off.offload_by_policy(ml, threshold_bytes=sum(sizes[-2:]))
    assert len(done) == 3  # the three oldest go, two stay under the threshold
    assert off.offload_by_policy(ml, threshold_bytes=sum(sizes[-2:])) == []
    assert off.offload_by_policy(ml, min_age_ms=10**15) == []  # publish_time 1 s after epoch
    assert len(off.offload_by_policy(ml, min_age_ms=0)) == 2
    with pytest.raises(InvalidArgumentError, match="threshold_bytes"):
        off.offload_by_policy(ml, threshold_bytes=-1)
    with pytest.raises(InvalidArgumentError):
        off.offload_by_policy(ml)


def test_fsspec_memory_remote_and_metadata_survive_restart(tmp_path: Path) -> None:
    ml = open_topic(tmp_path)
    idx = TopicTxnIndexes(tmp_path / "data")
    w = TopicWriter(ml, idx)
    write_segments(w, 3, abort_in={2})
    meta_log = ManagedLedger.open(tmp_path / "data", METADATA_LEDGER)
    remote = RemoteStorage("memory://txnstream-test-bucket")
    rlmm = RemoteLogMetadataManager(meta_log, remote)
    offload_all(ml, Offloader(remote, rlmm, idx))
    first = [
        m.payload
        for m in TieredReader(remote, rlmm).read_committed(
            TOPIC, max_read_position=ALL, aborted=w.aborted
        )
    ]
    meta_log.close()
    meta_log = ManagedLedger.open(tmp_path / "data", METADATA_LEDGER)
    rlmm = RemoteLogMetadataManager(meta_log, remote)
    assert [s.txn_idx_empty for s in rlmm.segments(TOPIC)] == [True, False, True]
    assert [
        m.payload
        for m in TieredReader(remote, rlmm).read_committed(
            TOPIC, max_read_position=ALL, aborted=w.aborted
        )
    ] == first
    assert b"k2-a" not in first
    meta_log.close()
    ml.close()


def test_bad_input_and_missing_objects(
    stack: tuple[ManagedLedger, RemoteStorage, RemoteLogMetadataManager], tmp_path: Path
) -> None:
    ml, remote, rlmm = stack
    with pytest.raises(InvalidArgumentError, match="remote location"):
        RemoteStorage("")
    with pytest.raises(InvalidArgumentError, match="kind"):
        object_name(TOPIC, 1, "x", "bogus")
    write_segments(TopicWriter(ml, TopicTxnIndexes(tmp_path / "data")), 2, abort_in=set())
    off = Offloader(remote, rlmm)
    active = next(lid for lid, _, sealed in ml.ledgers() if not sealed)
    with pytest.raises(InvalidArgumentError, match="not closed"):
        off.offload(ml, active)
    with pytest.raises(InvalidArgumentError, match="ledger 999999"):
        off.offload(ml, 999_999)
    seg = off.offload(ml, ml.ledgers()[0][0])
    (tmp_path / "remote" / object_name(TOPIC, seg.ledger_id, seg.segment_id, "segment")).unlink()
    with pytest.raises(StorageError, match="missing"):
        TieredReader(remote, rlmm).segment_entries(seg)


def test_bad_arguments_are_typed_errors_naming_the_value(
    stack: tuple[ManagedLedger, RemoteStorage, RemoteLogMetadataManager], tmp_path: Path
) -> None:
    ml, remote, rlmm = stack
    for location in (None, 123):
        with pytest.raises(InvalidArgumentError, match="remote location"):
            RemoteStorage(location)  # type: ignore[arg-type]
    # Object names stay under the root: nothing is written outside it.
    for name in ("../../escape", "/abs", "t/../../x", "", "t//x"):
        with pytest.raises(InvalidArgumentError, match="relative name under the root"):
            remote.put(name, b"", "segment")
    assert not (tmp_path / "escape").exists()
    with pytest.raises(InvalidArgumentError, match="bytes-like, not str"):
        remote.put("t/1-a.data", "text", "segment")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=r"lock_timeout_ms .* got -5"):
        Offloader(remote, rlmm, lock_timeout_ms=-5)
    off = Offloader(remote, rlmm)
    with pytest.raises(InvalidArgumentError, match="ml must be a ManagedLedger"):
        off.offload(None, 1)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=r"ledger_id .* got 'x'"):
        off.offload(ml, "x")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=r"cache_bytes .* got -1"):
        TieredReader(remote, rlmm, cache_bytes=-1)
    reader = TieredReader(remote, rlmm)
    with pytest.raises(InvalidArgumentError, match="start must be a Position"):
        list(reader.read_committed(TOPIC, ml, max_read_position=Position(9, 9), start="x"))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="topic must be a non-empty str, got 5"):
        list(reader.read_committed(5, None, max_read_position=Position(9, 9)))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="position must be a Position"):
        rlmm.next_segment_with_txn_index(TOPIC, None)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=r"ledger_id .* got -1"):
        rlmm.copy_started(TOPIC, -1, 0, 0, 0, 0)
    with pytest.raises(InvalidArgumentError, match=r"below_ledger .* got 'x'"):
        TopicTxnIndexes(tmp_path / "data").prune(TOPIC, "x")  # type: ignore[arg-type]
    # A (ledger_id, entry_id) pair is a position, as elsewhere in the API.
    assert list(reader.read_committed(TOPIC, ml, max_read_position=(9, 9), start=(0, 0))) == []  # type: ignore[arg-type]


def test_sweeping_temporaries_leaves_this_process_own(tmp_path: Path) -> None:
    """The clean-up may run while this process uploads (the broker retries it in maintenance).

    A temporary named with this process's id may be a put in progress; one
    of another process is a crash's leftover.
    """
    remote = RemoteStorage(tmp_path / "r")
    (tmp_path / "r" / "t").mkdir(parents=True)
    mine = tmp_path / "r" / "t" / f".1-a.data.{os.getpid()}.123.tmp"
    crashed = tmp_path / "r" / "t" / f".1-a.data.{os.getpid() + 1}.123.tmp"
    mine.write_bytes(b"being written")
    crashed.write_bytes(b"left by a crash")
    assert remote.sweep_temporaries() == 1
    assert mine.exists() and not crashed.exists()


def test_remote_directory_writes_are_atomic_and_counted(tmp_path: Path) -> None:
    remote = RemoteStorage(tmp_path / "r")
    remote.put("t/1-a.data", b"x" * 100, "segment")
    assert remote.get("t/1-a.data", "segment", 10, 20) == b"x" * 10
    assert [p.name for p in (tmp_path / "r" / "t").iterdir()] == ["1-a.data"]  # no temp left
    assert remote.calls()["segment"] == 2
    os.chmod(tmp_path / "r" / "t", 0o500)
    try:
        if os.geteuid() != 0:
            with pytest.raises(StorageError):
                remote.put("t/2-b.data", b"y", "segment")
    finally:
        os.chmod(tmp_path / "r" / "t", 0o700)


def test_remote_calls_are_exported_to_prometheus(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    remote = RemoteStorage(tmp_path / "r")
    remote.put("t/1-a.txnidx", b"abc", "txn_index")
    remote.get("t/1-a.txnidx", "txn_index")
    reg = CollectorRegistry()
    reg.register(remote.collector())
    text = generate_latest(reg).decode()
    where = f'remote="{tmp_path / "r"}"'
    assert f'txnstream_tiered_remote_calls_total{{kind="txn_index",{where}}} 2.0' in text
    assert f'txnstream_tiered_remote_read_bytes_total{{kind="txn_index",{where}}} 3.0' in text
    assert f'txnstream_tiered_remote_calls_total{{kind="segment",{where}}} 0.0' in text


def test_prune_deletes_trimmed_indexes_with_one_listing_per_round(tmp_path: Path) -> None:
    """Pruning removes only the trimmed ledgers' files, of the named topics only.

    A maintenance round over many topics lists the directory once, and a
    round in which no topic's first ledger moved lists it not at all.
    """
    idx = TopicTxnIndexes(tmp_path / "data")
    topics = [f"persistent://public/default/t{i}" for i in range(3)] + [
        "persistent://public/default/t1@2"  # looks like t1's ledger 2 unless names are quoted
    ]
    for topic in topics:
        for lid in (1, 2, 3):
            idx.append(topic, (0, lid), Position(lid, 0), Position(lid, 1), Position(lid, 0))

    def files() -> set[tuple[str, int]]:
        return {(t, lid) for t in topics for lid in (1, 2, 3) if idx.path(t, lid).exists()}

    assert len(files()) == 12
    bounds = {topics[0]: 3, topics[1]: 2, topics[3]: 2}
    assert idx.prune_many(bounds) == 4
    assert idx.listings == 1
    gone = {(topics[0], 1), (topics[0], 2), (topics[1], 1), (topics[3], 1)}
    assert files() == {(t, lid) for t in topics for lid in (1, 2, 3)} - gone
    # Nothing moved: no listing at all.
    assert idx.prune_many(bounds) == 0 and idx.listings == 1
    # One topic moved: one listing, only its files go.
    assert idx.prune_many({**bounds, topics[2]: 3}) == 2 and idx.listings == 2
    assert (topics[2], 3) in files() and (topics[2], 2) not in files()
    # A pruned index is loaded from its file again (not from the closed-ledger cache).
    assert idx.load(topics[0], 1) is None
    assert idx.load(topics[0], 3) is not None


def test_export_segment_scan_markers_is_a_bool(tmp_path: Path) -> None:
    # PyO3's bool conversion raised a bare TypeError for an int.
    ml = ManagedLedger.open(tmp_path / "data", "t", max_entries_per_ledger=1)
    first = ml.append(b"x")
    ml.append(b"y")  # ledger 1 is closed
    with pytest.raises(InvalidArgumentError, match="scan_markers must be a bool, not int"):
        export_segment(ml, first.ledger_id, 1)  # type: ignore[arg-type]
    assert export_segment(ml, first.ledger_id, scan_markers=False)[2] == []
    ml.close()
