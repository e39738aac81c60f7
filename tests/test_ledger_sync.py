"""Ledger durability ordering seen from Python: no append resolves before its
sync, read-only readers never see unsynced entries, waits on locks held
across an fsync release the GIL, and position arguments are validated."""

from __future__ import annotations

import concurrent.futures as cf
import errno
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from txnstream import (
    BufferedWriter,
    InvalidArgumentError,
    ManagedLedger,
    Position,
    StorageError,
    TxnPosition,
    testing,
)


@pytest.fixture
def ml(gated_ledger: ManagedLedger) -> ManagedLedger:
    return gated_ledger


def test_no_append_resolves_before_its_sync(ml: ManagedLedger) -> None:
    ml.append(b"warm")
    writer = BufferedWriter(ml, max_records=4, max_delay_ms=1)
    testing.hold_fault(ml, "sync")
    futs: list[cf.Future[Any]] = []
    futs += [ml.append_async(b"one %d" % i) for i in range(10)]
    futs.append(ml.append_many_async([b"a", b"b", b"c"]))
    futs += [writer.write(b"rec %d" % i) for i in range(8)]
    assert testing.wait_fault_held(ml, "sync", timeout_ms=20000)
    # Written, not durable: give a broken ordering every chance to show.
    done, _ = cf.wait(futs, timeout=0.3)
    assert not done
    assert ml.entry_count() == 1
    testing.release_fault(ml, "sync")
    done, pending = cf.wait(futs, timeout=30)
    assert not pending
    assert all(f.exception() is None for f in futs)
    writer.close()


def test_read_only_reader_never_sees_a_failed_group(tmp_path: Path, ml: ManagedLedger) -> None:
    good = ml.append_many([b"good %d" % i for i in range(3)])
    ro = ManagedLedger.open(tmp_path, ml.name, read_only=True)
    testing.hold_fault(ml, "sync")
    futs = [ml.append_async(b"doomed %d" % i) for i in range(5)]
    assert testing.wait_fault_held(ml, "sync", timeout_ms=20000)
    ro.refresh()
    assert ro.last_position == good[-1]
    testing.inject_fault(ml, "sync", errno=errno.EIO, times=1)
    testing.release_fault(ml, "sync")
    for f in futs:
        with pytest.raises(StorageError):
            f.result(timeout=30)
    p = ml.append(b"durable")
    assert p == Position(good[-1].ledger_id + 1, 0)  # a new ledger after the failure
    ro.refresh()
    assert ro.read(p) == b"durable"
    ro.close()


def test_lock_waits_release_the_gil(tmp_path: Path) -> None:
    # A checkpoint's CATALOG write (with its fsyncs) is held at a gate;
    # another thread asks for ledgers() and cursor_names(). If they waited
    # for the checkpoint holding the GIL, the main thread could never release
    # the gate: run in a child so a regression is a timeout, not a hang.
    script = textwrap.dedent(
        f"""
        import threading, time
        from txnstream import ManagedLedger, testing
        ml = ManagedLedger.open({str(tmp_path)!r}, "g")
        ml.append(b"x")
        testing.hold_fault(ml, "meta")
        flusher = threading.Thread(target=ml.checkpoint)
        flusher.start()
        assert testing.wait_fault_held(ml, "meta", timeout_ms=20000)
        out = []
        reader = threading.Thread(
            target=lambda: out.append((ml.ledgers(), ml.cursor_names()))
        )
        reader.start()
        time.sleep(0.2)
        testing.release_fault(ml, "meta")
        reader.join()
        flusher.join()
        assert out and out[0][0][0][1] == 1, out
        ml.close()
        print("ok")
        """
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


@pytest.mark.parametrize(
    ("args", "name", "value"),
    [
        ((-1, 0), "ledger_id", "-1"),
        ((0, -5), "entry_id", "-5"),
        ((2**64, 0), "ledger_id", str(2**64)),
    ],
)
def test_position_ids_out_of_range(args: tuple[int, int], name: str, value: str) -> None:
    for cls in (Position, TxnPosition):
        with pytest.raises(InvalidArgumentError, match=rf"{name}.*{value}"):
            cls(*args)


def test_position_argument_types_and_batch_fields() -> None:
    assert Position(2**64 - 1, 0).ledger_id == 2**64 - 1
    assert TxnPosition(1, 2, 3, 2).key() == (1, 2, 2)
    with pytest.raises(InvalidArgumentError, match=r"batch_size.*-1"):
        TxnPosition(1, 2, batch_size=-1)
    with pytest.raises(InvalidArgumentError, match=rf"batch_index.*{2**32}"):
        TxnPosition(1, 2, batch_size=3, batch_index=2**32)
    with pytest.raises(InvalidArgumentError, match="batch_index 3 must be < batch_size 3"):
        TxnPosition(1, 2, 3, 3)
    with pytest.raises(TypeError, match="ledger_id must be an int, not str"):
        Position("1", 0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="entry_id must be an int, not float"):
        TxnPosition(1, 0.5)  # type: ignore[arg-type]


def test_positions_take_numpy_integers_but_not_bools() -> None:
    # Decoded columns hold numpy integers; Position/TxnPosition refused them.
    import numpy as np

    assert Position(np.uint64(2**64 - 1), np.int32(0)) == Position(2**64 - 1, 0)
    t = TxnPosition(np.int64(1), np.uint64(2), np.uint32(3), np.int8(2))
    assert t.key() == (1, 2, 2) and t.batch_size == 3
    with pytest.raises(InvalidArgumentError, match="ledger_id must be an int, not bool"):
        Position(np.True_, 0)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="entry_id must be an int, not bool"):
        Position(0, True)
    with pytest.raises(InvalidArgumentError, match="entry_id must be >= 0, got -1"):
        Position(0, np.int64(-1))
