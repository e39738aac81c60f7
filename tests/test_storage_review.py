"""Storage defects an independent review reproduced; each test fails on the code before its fix.

- a mark-delete position no record can store (ledger 0, an entry id past
  int64) bricked the data directory;
- an index slot past the last record panicked on read (data from disk);
- a ``__len__`` of 2**36 aborted the process (preallocation before checking);
- ``BufferedWriter.close()`` in a future's done-callback deadlocked the
  process-wide completion thread;
- a ``BufferedWriter`` made before ``fork()`` hung in the child;
- a forked child kept the parent's writer lock on the directory;
- a cursor deleted while another thread flushed cursor states came back.
"""

from __future__ import annotations

import glob
import os
import struct
import threading
from pathlib import Path

import pytest

from txnstream import CorruptLedgerError, TxnStreamError
from txnstream._native import AckSet, BufferedWriter, ManagedLedger, Position

DEADLINE_S = 10.0


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), bit by bit: the index slots' check is its low 16 bits."""
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def test_a_mark_delete_no_record_can_store_is_refused_and_the_directory_stays_usable(
    tmp_path: Path,
) -> None:
    ml = ManagedLedger.open(tmp_path, "t")
    ml.append(b"a")
    other = ManagedLedger.open(tmp_path, "other")
    cursor = ml.open_cursor("c")
    for bad in (Position(0, 2**63), Position(0, 2), Position(1, 2**63)):
        with pytest.raises(TxnStreamError):
            cursor.mark_delete(bad)
    assert other.append(b"b") is not None  # an unrelated ledger's append is fine
    ml.flush()
    ml.close()
    other.close()
    ml = ManagedLedger.open(tmp_path, "t")  # still opens
    assert ml.open_cursor("c").mark_delete_position is None
    ml.close()


def test_an_index_slot_past_the_last_record_is_a_corrupt_ledger_not_a_panic(
    tmp_path: Path,
) -> None:
    ml = ManagedLedger.open(tmp_path, "t")
    for i in range(3):
        ml.append(b"x%d" % i)
    ml.checkpoint()
    ml.close()
    [idx] = glob.glob(os.path.join(tmp_path, "ledgers", "*.idx"))
    ledger_id = int(idx.rsplit("@", 1)[1].split(".")[0])
    end = 10_000  # entry 0's slot ends past the last slot's end, with a valid check
    check = crc32c(struct.pack("<QQQ", ledger_id, 0, end)) & 0xFFFF
    with open(idx, "r+b") as f:
        f.seek(32)
        f.write(struct.pack("<Q", end | (check << 48)))
    ml = ManagedLedger.open(tmp_path, "t")
    with pytest.raises(CorruptLedgerError, match="past the last record"):
        ml.read_range(Position(ledger_id, 0), Position(ledger_id, 2))
    ml.close()


class _Claims:
    """A sequence that claims a huge length and yields nothing valid."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> object:
        return iter(["not a valid item"])


@pytest.mark.parametrize("n", [2**36, 2**62])
def test_a_huge_claimed_length_is_a_typed_error_not_an_abort(tmp_path: Path, n: int) -> None:
    ml = ManagedLedger.open(tmp_path, "t")
    ml.append(b"a")
    # The process survives; the first (bad) item is what is reported.
    with pytest.raises(TxnStreamError, match=r"data\[0\]"):
        ml.append_many(_Claims(n))  # type: ignore[arg-type]
    with pytest.raises(TxnStreamError, match=r"positions\[0\]"):
        ml.open_cursor("c").delete(_Claims(n))  # type: ignore[arg-type]
    with pytest.raises(TxnStreamError):
        AckSet.from_words(_Claims(n), 8)  # type: ignore[arg-type]
    ml.close()


def test_closing_a_writer_in_a_futures_callback_does_not_deadlock(tmp_path: Path) -> None:
    ml = ManagedLedger.open(tmp_path, "t")
    writer = BufferedWriter(ml, max_delay_ms=1)
    closed = threading.Event()
    fut = writer.write(b"x")

    def close_now(_f: object) -> None:
        writer.close()
        closed.set()

    fut.add_done_callback(close_now)
    assert closed.wait(DEADLINE_S), "close() in a done-callback never returned"
    # The process-wide completion thread still resolves other futures.
    assert ml.append_async(b"y").result(timeout=DEADLINE_S) is not None
    ml.close()


def test_a_writer_made_before_fork_fails_fast_in_the_child(tmp_path: Path) -> None:
    ml = ManagedLedger.open(tmp_path, "t")
    writer = BufferedWriter(ml, max_delay_ms=50)
    writer.write(b"a").result(timeout=DEADLINE_S)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 3
        try:
            writer.write(b"b")
        except TxnStreamError as exc:
            code = 0 if "fork" in str(exc) else 2
        except BaseException:
            code = 4
        if code == 0:
            code = 0 if writer.wait_idle(1000) else 5  # and nothing waits forever
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    writer.close()
    ml.close()


def test_a_forked_child_does_not_keep_the_directory_locked(tmp_path: Path) -> None:
    ml = ManagedLedger.open(tmp_path, "t")
    ml.append(b"a")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child: lives on until told
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    os.close(r)
    try:
        ml.close()
        again = ManagedLedger.open(tmp_path, "t")  # while the child lives
        assert again.read(Position(1, 0)) == b"a"
        again.close()
    finally:
        os.write(w, b"x")
        os.close(w)
        os.waitpid(pid, 0)


def test_a_cursor_deleted_during_concurrent_flushes_stays_deleted(tmp_path: Path) -> None:
    ml = ManagedLedger.open(tmp_path, "t", cursor_flush_interval_ms=1)
    for _ in range(10):
        ml.append(b"x")
    ml.open_cursor("keep")
    back = 0
    for i in range(100):
        name = f"c{i}"
        ml.open_cursor(name)
        stop = threading.Event()

        def flush(stop: threading.Event = stop) -> None:
            while not stop.is_set():
                ml.flush()

        flushers = [threading.Thread(target=flush) for _ in range(2)]
        for t in flushers:
            t.start()
        ml.delete_cursor(name)
        stop.set()
        for t in flushers:
            t.join(DEADLINE_S)
        back += name in ml.cursor_names()
    assert back == 0
    ml.close()
    ml = ManagedLedger.open(tmp_path, "t")
    assert ml.cursor_names() == ["keep"]
    ml.close()
