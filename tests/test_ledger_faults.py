"""Ledger faults: injected write/sync failures, a real file-size limit, torn
tails and flipped bits, and a read-only reader in another process."""

from __future__ import annotations

import concurrent.futures as cf
import errno
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from txnstream import (
    ConfigError,
    CorruptLedgerError,
    InvalidArgumentError,
    ManagedLedger,
    Position,
    StorageError,
    StorageStoppedError,
    TxnPosition,
    testing,
)

HEADER = 32
END = (2**64 - 1, 2**64 - 1)


def payload(i: int) -> bytes:
    return bytes((i * 13 + k) % 251 for k in range(20 + i % 50))


def data_end(entries: list[bytes]) -> int:
    return HEADER + sum(8 + len(e) for e in entries)


def crash_image(src: Path, dst: Path, name: str) -> Path:
    """Copy of a live data directory: what kill -9 would leave behind (the
    page cache survives a process). Returns the copy's ledger directory."""
    shutil.copytree(src, dst, ignore=lambda d, names: [n for n in names if n == "LOCK"])
    return dst / "ledgers" / name.replace("/", "%2F")


def journal_records(data: Path) -> list[tuple[Path, int, int, int, int, int]]:
    """(segment, file offset, kind, ledger_id, entry_id, body length) of every
    journal record, parsed with the documented layout (see journal.rs)."""
    out = []
    for seg in sorted((data / "journal").glob("*.wal")):
        raw = seg.read_bytes()
        off = 64
        while off + 48 <= len(raw) and raw[off : off + 48] != bytes(48):
            body_len, _crc, kind = struct.unpack_from("<IIB", raw, off)
            ledger, entry = struct.unpack_from("<QQ", raw, off + 32)
            out.append((seg, off, kind, ledger, entry, body_len))
            off += 48 + body_len
    return out


ENTRY = 1


def entry_record(data: Path, p: Position) -> tuple[Path, int, int]:
    """Segment, file offset and body length of the journal record of entry p."""
    for seg, off, kind, ledger, entry, n in journal_records(data):
        if kind == ENTRY and (ledger, entry) == (p.ledger_id, p.entry_id):
            return seg, off, n
    raise AssertionError(f"no journal record for {p}")


@pytest.mark.parametrize("kind", ["sync", "write"])
def test_injected_failure_fails_every_waiter(tmp_path: Path, kind: str) -> None:
    ml = ManagedLedger.open(tmp_path, "f")
    good = ml.append_many([payload(i) for i in range(10)])
    testing.inject_fault(ml, kind, errno=errno.ENOSPC, times=1)
    futs = [ml.append_async(payload(100 + i)) for i in range(200)]
    cf.wait(futs, timeout=30)
    failed = [f.exception() for f in futs if f.exception() is not None]
    assert failed, "the injected fault must fail the group it hit"
    for exc in failed:
        assert isinstance(exc, StorageError)
        assert exc.errno == errno.ENOSPC
    ok = [f.result() for f in futs if f.exception() is None]
    # Failed appends are never readable; good ones and later ones are.
    assert ml.entry_count() == len(good) + len(ok)
    for i, p in enumerate(good):
        assert ml.read(p) == payload(i)
    later = ml.append(b"after the fault")
    assert ml.read(later) == b"after the fault"
    crash_image(tmp_path, tmp_path / "img", "f")
    ml.close()
    for data in (tmp_path, tmp_path / "img"):
        with ManagedLedger.open(data, "f") as again:
            assert again.entry_count() == len(good) + len(ok) + 1
            assert again.read(later) == b"after the fault"
    assert (tmp_path / "img" / "CATALOG").is_file()


def test_sync_append_gets_the_error_and_bad_fault_kind(tmp_path: Path) -> None:
    with ManagedLedger.open(tmp_path, "s") as ml:
        testing.inject_fault(ml, "sync", errno=errno.EIO)
        with pytest.raises(StorageError) as ei:
            ml.append(b"x")
        assert ei.value.errno == errno.EIO
        assert ml.last_position is None
        assert ml.read(ml.append(b"y")) == b"y"
        with pytest.raises(InvalidArgumentError):
            testing.inject_fault(ml, "explode")


@pytest.mark.parametrize("kind", ["sync", "write"])
def test_a_panicking_storage_thread_answers_every_future_and_close_returns(
    tmp_path: Path, kind: str
) -> None:
    # A bug that panics on a storage thread: every pending future (ledger
    # appends and BufferedWriter records) gets a StorageError instead of
    # waiting forever, later writes fail at once, close returns, and the
    # next open has everything acknowledged before.
    from txnstream._native import BufferedWriter

    ml = ManagedLedger.open(tmp_path, "p")
    good = [ml.append(payload(i)) for i in range(3)]
    writer = BufferedWriter(ml, max_delay_ms=1.0)
    testing.inject_panic(ml, kind)
    futures: list[cf.Future[Any]] = [ml.append_async(payload(i)) for i in range(10)]
    futures += [writer.write(b"r%d" % i) for i in range(10)]
    outcomes: list[object] = []
    for f in futures:
        try:
            outcomes.append(f.result(timeout=20))  # a hang fails here, not forever
        except StorageError as e:
            outcomes.append(e)
    first = outcomes[0]
    assert isinstance(first, StorageStoppedError)
    assert not first.retriable and first.errno is None
    assert all(isinstance(o, Position | StorageStoppedError) for o in outcomes[:10])
    assert all(isinstance(o, TxnPosition | StorageStoppedError) for o in outcomes[10:])
    with pytest.raises(StorageStoppedError, match="panicked"):
        ml.append(b"later")
    with pytest.raises(StorageStoppedError):
        ml.close()
    with ManagedLedger.open(tmp_path, "p") as again:
        assert [again.read(p) for p in good] == [payload(i) for i in range(3)]
        for i, got in enumerate(outcomes[:10]):
            if isinstance(got, Position):
                assert again.read(got) == payload(i)
        assert again.read(again.append(b"after")) == b"after"


REAL_LIMIT = textwrap.dedent(
    """
    import resource, signal, sys
    from txnstream import ManagedLedger, StorageError
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    ml = ManagedLedger.open(sys.argv[1], "full", preallocate_bytes=0)
    ok = [ml.append(b"k" * 1000) for _ in range(5)]
    resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))
    try:
        for _ in range(100):
            ok.append(ml.append(b"k" * 1000))
        print("NO ERROR")
    except StorageError as e:
        print("ERRNO", e.errno, len(ok))
    ml.close()
    """
)


def test_real_file_size_limit_is_a_storage_error(tmp_path: Path) -> None:
    # RLIMIT_FSIZE makes the kernel fail the write (EFBIG), like a full disk.
    out = subprocess.run(
        [sys.executable, "-c", REAL_LIMIT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    assert out[0] == "ERRNO", out
    assert int(out[1]) == errno.EFBIG
    acked = int(out[2])
    with ManagedLedger.open(tmp_path, "full") as ml:
        assert ml.entry_count() == acked
        assert all(d == b"k" * 1000 for _, d in ml.read_range((0, 0), END))


def test_torn_tail_is_cut_and_reopens_clean(tmp_path: Path) -> None:
    live = tmp_path / "live"
    ml = ManagedLedger.open(live, "t", preallocate_bytes=65536)
    entries = [payload(i) for i in range(30)]
    ps = ml.append_many(entries)
    for n, torn in enumerate([b"\x05", struct.pack("<I", 500) + b"\x01\x02", b"\xff" * 40]):
        img = tmp_path / f"img{n}"
        crash_image(live, img, "t")
        seg, off, body = entry_record(img, ps[-1])
        end = off + 48 + body
        with open(seg, "r+b") as f:
            f.seek(end)
            f.write(torn)
        with ManagedLedger.open(img, "t") as rec:
            assert rec.last_position == ps[-1]
            assert [d for _, d in rec.read_range(ps[0], END)] == entries
            # The torn bytes were cut, durably, before anything new.
            assert seg.read_bytes()[end : end + len(torn)] != torn
        with ManagedLedger.open(img, "t") as rec:
            assert rec.entry_count() == 30
    ml.close()


def test_flipped_bits(tmp_path: Path) -> None:
    live = tmp_path / "live"
    ml = ManagedLedger.open(live, "b", checkpoint_interval_ms=3_600_000)
    entries = [payload(i) for i in range(20)]
    ps = [ml.append(e) for e in entries]

    def flip(path: Path, offset: int) -> None:
        with open(path, "r+b") as f:
            f.seek(offset)
            b = f.read(1)
            f.seek(offset)
            f.write(bytes([b[0] ^ 0x01]))

    # In the last acknowledged record: the synced hint proves it was
    # acknowledged, so read-write and read-only opens both report it.
    img = tmp_path / "last"
    crash_image(live, img, "b")
    seg, off, body = entry_record(img, ps[-1])
    flip(seg, off + 48 + body - 3)
    for read_only in (False, True):
        with pytest.raises(CorruptLedgerError) as ei:
            ManagedLedger.open(img, "b", read_only=read_only)
        assert ei.value.position == (ps[-1].ledger_id, ps[-1].entry_id)
        assert ei.value.offset == off
    # With the hint lost as well (a power cut), nothing proves it was
    # acknowledged: a torn tail, cut off.
    (img / "journal" / "SYNCED").unlink()
    with ManagedLedger.open(img, "b") as rec:
        assert rec.last_position == ps[-2]
    # In the middle, payload or header: later records carry an acknowledged
    # point past it, so it is corruption, reported where it is, nothing cut.
    for n, (k, delta) in enumerate([(6, None), (7, 2)]):
        img = tmp_path / f"mid{n}"
        crash_image(live, img, "b")
        (img / "journal" / "SYNCED").unlink()
        seg, off, body = entry_record(img, ps[k])
        flip(seg, off + (48 + body - 1 if delta is None else delta))
        size = seg.stat().st_size
        with pytest.raises(CorruptLedgerError) as ei:
            ManagedLedger.open(img, "b")
        assert ei.value.offset == off
        if delta is None:
            assert ei.value.position == (ps[k].ledger_id, ps[k].entry_id)
        assert seg.stat().st_size == size
    # A sealed ledger's header: trusted at open, caught on read.
    ml.close()
    flip(live / "ledgers" / f"b@{ps[0].ledger_id}.log", 3)
    again = ManagedLedger.open(live, "b")
    with pytest.raises(CorruptLedgerError, match="bad magic"):
        again.read(ps[0])
    again.close()


WRITER = textwrap.dedent(
    """
    import sys, time
    from txnstream import ManagedLedger
    ml = ManagedLedger.open(sys.argv[1], "shared/log", max_entries_per_ledger=150)
    print("ready", flush=True)
    i = 0
    deadline = time.monotonic() + float(sys.argv[2])
    while time.monotonic() < deadline:
        n = 1 + i % 7
        ml.append_many([bytes([j % 256]) * (j % 3000) for j in range(i, i + n)])
        i += n
    ml.close()
    print("wrote", i, flush=True)
    """
)


def test_read_only_reader_follows_writer_in_another_process(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path), "2.0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    ro = ManagedLedger.open(tmp_path, "shared/log", read_only=True)
    seen = 0
    last: Position | None = None
    sizes: set[int] = set()
    while proc.poll() is None or not sizes:
        ro.refresh()
        if ro.last_position is None or ro.last_position == last:
            continue
        # Only the new entries: everything after the last one seen.
        got = ro.read_range(last, END)[1:] if last else ro.read_range((0, 0), END)
        # Entries in log order are j = 0, 1, 2, ...; never a partial one.
        for k, (_, d) in enumerate(got):
            j = seen + k
            assert d == bytes([j % 256]) * (j % 3000), j
        seen += len(got)
        last = got[-1][0]
        sizes.add(seen)
    total = int(proc.stdout.read().split()[-1])
    ro.refresh()
    assert ro.entry_count() == total
    assert len(ro.ledgers()) > 2
    # The reader saw the log grow while the writer ran.
    assert len(sizes) >= 2
    ro.close()
    # The reader wrote nothing: the writer can reopen, nothing to recover.
    with ManagedLedger.open(tmp_path, "shared/log") as ml:
        assert ml.entry_count() == total


def test_read_only_open_of_a_crashed_directory_with_a_damaged_hint(tmp_path: Path) -> None:
    live = tmp_path / "live"
    ml = ManagedLedger.open(live, "h", checkpoint_interval_ms=3_600_000)
    ps = ml.append_many([payload(i) for i in range(12)])
    img = tmp_path / "img"
    crash_image(live, img, "h")
    ml.close()
    (img / "journal" / "SYNCED").write_bytes(b"\xde\xad" * 8)
    # No writer runs on the image: a reader sees every valid entry, as
    # recovery would keep them (not none of them, silently).
    with ManagedLedger.open(img, "h", read_only=True) as ro:
        assert ro.last_position == ps[-1]
        assert [d for _, d in ro.read_range(ps[0], END)] == [payload(i) for i in range(12)]


def test_close_on_a_stalled_sync_returns_a_timeout_error(tmp_path: Path) -> None:
    # Before: close() waited for the cursor states' sync with no deadline,
    # and a sync that never returns hung the caller for good.
    ml = ManagedLedger.open(tmp_path, "t", close_timeout_ms=500, preallocate_bytes=0)
    ps = ml.append_many([payload(i) for i in range(4)])
    cur = ml.open_cursor("sub")
    cur.mark_delete(ps[1])
    ml.flush()
    cur.mark_delete(ps[2])
    testing.hold_fault(ml, "sync")
    try:
        with cf.ThreadPoolExecutor(1) as pool:
            closing = pool.submit(ml.close)
            # Only a hang takes 60 s (the close timeout is 0.5 s).
            err = closing.exception(timeout=60)
        assert isinstance(err, StorageError), repr(err)
        assert err.errno == errno.ETIMEDOUT
        assert "close_timeout" in str(err)
        assert ml.closed
    finally:
        testing.clear_faults(ml)
    # The background shutdown finishes once syncs pass; the open waits for it.
    with ManagedLedger.open(tmp_path, "t") as again:
        assert [again.read(p) for p in ps] == [payload(i) for i in range(4)]
        md = again.open_cursor("sub").mark_delete_position
        assert md is not None and md >= ps[1]


def test_close_timeout_is_validated_by_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="close_timeout_ms=-1"):
        ManagedLedger.open(tmp_path, "t", close_timeout_ms=-1)
    with pytest.raises(ConfigError, match="close_timeout=0ns"):
        ManagedLedger.open(tmp_path, "t", close_timeout_ms=0)
