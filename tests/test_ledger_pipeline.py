"""The pipelined group commit seen from Python: group N+1 is written while
group N's sync is in progress, yet callers complete in append order and only
once durable, a failed sync takes every group written after it down with it
(and none of their bytes survive), and large payloads written from the
callers' buffers read back intact across rollover and reopen."""

from __future__ import annotations

import concurrent.futures as cf
import errno
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from txnstream import ManagedLedger, Position, StorageError, testing

PAD = b"p" * (64 << 10)


@pytest.fixture
def ml(gated_ledger: ManagedLedger) -> ManagedLedger:
    return gated_ledger


def ledger_bytes(tmp_path: Path) -> bytes:
    """Every storage file's raw bytes (journal and ledger files, written,
    synced or not)."""
    files = sorted((tmp_path / "journal").glob("*.wal")) + sorted(
        (tmp_path / "ledgers").rglob("*.log")
    )
    return b"".join(f.read_bytes() for f in files)


def journal_bytes(tmp_path: Path) -> bytes:
    """The journal's raw bytes. (Large entries are written straight into
    their ledger file; a failed one may leave bytes past the end of the
    file's data, which nothing refers to and later writes overwrite: the
    reads in these tests show they never come back.)"""
    return b"".join(f.read_bytes() for f in sorted((tmp_path / "journal").glob("*.wal")))


def wait_on_disk(tmp_path: Path, payload: bytes, timeout: float = 20.0) -> None:
    """Waits until the writer has written `payload` to a storage file."""
    deadline = time.monotonic() + timeout
    while payload not in ledger_bytes(tmp_path):
        assert time.monotonic() < deadline, f"{payload!r} never written"
        time.sleep(0.005)


def test_group_written_during_a_failing_sync_fails_and_never_reappears(
    tmp_path: Path, ml: ManagedLedger
) -> None:
    good = ml.append(b"good")
    testing.hold_fault(ml, "sync")
    # Large groups go through the sync thread, so the writer is free.
    first = ml.append_async(b"group-n" + PAD)
    assert testing.wait_fault_held(ml, "sync", timeout_ms=20000)
    # The next group (large enough to be pipelined) is written while group
    # N's sync is still held.
    later = [ml.append_async(b"group-n+1 %d" % i + PAD) for i in range(20)]
    wait_on_disk(tmp_path, b"group-n+1 19")
    done, _ = cf.wait([first, *later], timeout=0.2)
    assert not done
    testing.inject_fault(ml, "sync", errno=errno.EIO, times=1)
    testing.release_fault(ml, "sync")
    for f in [first, *later]:
        with pytest.raises(StorageError):
            f.result(timeout=30)
    # Cut back to the synced end before anyone was told.
    assert b"group-n" not in journal_bytes(tmp_path)
    after = ml.append(b"after")
    # The failed group's positions are never reused: the next append opens a new ledger.
    assert after == Position(good.ledger_id + 1, 0)
    ml.close()
    again = ManagedLedger.open(tmp_path, ml.name)
    try:
        assert again.entry_count() == 2
        assert [d for _, d in again.read_range(good, after)] == [b"good", b"after"]
        assert b"group-n" not in journal_bytes(tmp_path)
    finally:
        again.close()


def test_write_failure_behind_a_held_sync_keeps_the_durable_group(
    tmp_path: Path, ml: ManagedLedger
) -> None:
    testing.hold_fault(ml, "sync")
    first = ml.append_async(b"synced-first" + PAD)
    assert testing.wait_fault_held(ml, "sync", timeout_ms=20000)
    testing.inject_fault(ml, "write", errno=errno.ENOSPC, times=1)
    doomed = ml.append_async(b"never-written" + PAD)
    time.sleep(0.1)
    assert not first.done()
    testing.release_fault(ml, "sync")
    # Group N's sync succeeded: it is durable and acknowledged.
    p = first.result(timeout=30)
    with pytest.raises(StorageError) as ei:
        doomed.result(timeout=30)
    assert ei.value.errno == errno.ENOSPC
    nxt = ml.append(b"next")
    assert nxt == Position(p.ledger_id + 1, 0)  # a new ledger after the failure
    ml.close()
    assert b"never-written" not in journal_bytes(tmp_path)
    again = ManagedLedger.open(tmp_path, ml.name)
    try:
        assert [d for _, d in again.read_range(p, nxt)] == [b"synced-first" + PAD, b"next"]
    finally:
        again.close()


def test_callers_complete_in_append_order_across_pipelined_groups(
    ml: ManagedLedger,
) -> None:
    order: list[int] = []
    lock = threading.Lock()

    def record(i: int) -> Any:
        def cb(_: cf.Future[Any]) -> None:
            with lock:
                order.append(i)

        return cb

    testing.hold_fault(ml, "sync")
    futs: list[cf.Future[Any]] = []
    for i in range(300):
        # Small appends (synced by whichever thread is free) mixed with
        # large ones (pipelined through the sync thread).
        if i % 20 == 0:
            f: cf.Future[Any] = ml.append_async(b"e%d" % i + PAD)
        elif i % 7 == 0:
            f = ml.append_many_async([b"m%d" % i, b"n%d" % i])
        else:
            f = ml.append_async(b"e%d" % i)
        f.add_done_callback(record(i))
        futs.append(f)
        if i == 0:
            assert testing.wait_fault_held(ml, "sync", timeout_ms=20000)
    time.sleep(0.05)
    assert not order
    testing.release_fault(ml, "sync")
    cf.wait(futs, timeout=30)
    assert order == list(range(300))
    flat: list[Position] = []
    for f in futs:
        r = f.result()
        flat += r if isinstance(r, list) else [r]
    assert [p.entry_id for p in flat] == list(range(len(flat)))


def test_close_waits_for_a_held_sync(ml: ManagedLedger) -> None:
    testing.hold_fault(ml, "sync")
    futs = [ml.append_async(b"x%d" % i) for i in range(50)]
    assert testing.wait_fault_held(ml, "sync", timeout_ms=20000)
    closer = threading.Thread(target=ml.close)
    closer.start()
    closer.join(0.2)
    assert closer.is_alive()
    testing.release_fault(ml, "sync")
    closer.join(30)
    assert not closer.is_alive()
    assert [f.result(timeout=0).entry_id for f in futs] == list(range(50))


def test_large_payloads_round_trip_across_rollover_and_reopen(tmp_path: Path) -> None:
    sizes = [100, 64 << 10, 16 << 10, 5, (16 << 10) - 1, 300 << 10, 0, 2 << 20, 7]
    data = [os.urandom(n) for n in sizes] * 3
    ml = ManagedLedger.open(tmp_path, "big", max_bytes_per_ledger=3 << 20, max_batch_bytes=1 << 20)
    try:
        futs = [ml.append_async(d) for d in data[:9]]
        ps = [f.result(timeout=30) for f in futs]
        ps += ml.append_many(data[9:])
        assert len(ml.ledgers()) > 1
        assert [ml.read(p) for p in ps] == data
    finally:
        ml.close()
    again = ManagedLedger.open(tmp_path, "big")
    try:
        assert [again.read(p) for p in ps] == data
    finally:
        again.close()


def test_append_futures_are_real_running_futures(ml: ManagedLedger) -> None:
    futs: list[cf.Future[Any]] = [ml.append_async(b"f%d" % i) for i in range(64)]
    futs.append(ml.append_many_async([b"g", b"h"]))
    for f in futs:
        assert isinstance(f, cf.Future)
        # Submitted: RUNNING (not cancellable) until resolved.
        assert not f.cancel()
        assert f.running() or f.done()
    seen: list[cf.Future[Any]] = []
    futs[0].add_done_callback(seen.append)
    assert set(cf.as_completed(futs, timeout=30)) == set(futs)
    assert seen == [futs[0]]
    assert not any(f.cancelled() for f in futs)
    testing.inject_fault(ml, "sync", errno=errno.EIO, times=1)
    bad = ml.append_async(b"bad")
    done, _ = cf.wait([bad], timeout=30, return_when=cf.FIRST_EXCEPTION)
    assert done == {bad}
    assert isinstance(bad.exception(), StorageError)
