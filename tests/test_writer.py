"""BufferedWriter over a real managed ledger (SPEC §4.2, PIP-160 test plan)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

from txnstream import BufferedWriter, ManagedLedger, TxnPosition, frame, testing
from txnstream import errors as ts_errors
from txnstream.errors import (
    ConfigError,
    InvalidArgumentError,
    StorageError,
    WriterClosedError,
)

HOUR_MS = 3_600_000.0


@pytest.fixture
def ml(tmp_path: Path) -> Iterator[ManagedLedger]:
    ledger = ManagedLedger.open(tmp_path, "__transaction_log_0")
    yield ledger
    ledger.close()


def rec(i: int, size: int = 16) -> bytes:
    # Starts with 0x08 like a serialized TransactionMetadataEntry.
    return (b"\x08" + str(i).encode()).ljust(size, b".")


def results(futs: list[Future[TxnPosition]]) -> list[TxnPosition]:
    return [f.result(timeout=10) for f in futs]


def read_back(ml: ManagedLedger, p: TxnPosition) -> bytes:
    records = frame.decode_entry(ml.read(p.position))
    assert len(records) == p.batch_size
    return records[p.batch_index]


def layout(ps: list[TxnPosition]) -> list[tuple[int, int, int]]:
    return [(p.entry_id, p.batch_size, p.batch_index) for p in ps]


def triggers(w: BufferedWriter) -> tuple[int, int, int, int, int]:
    s = w.stats()
    keys = ("max_records", "max_size", "max_delay", "large_data", "forced")
    a, b, c, d, e = (int(s["flush_" + k]) for k in keys)
    return a, b, c, d, e


def test_write_returns_real_uncancellable_future(ml: ManagedLedger) -> None:
    w = BufferedWriter(ml, max_records=512, max_delay_ms=1)
    fut = w.write(rec(0))
    assert isinstance(fut, Future)
    assert not fut.cancel()  # already running: a submitted record is written
    p = fut.result(timeout=10)
    assert isinstance(p, TxnPosition)
    assert (p.batch_size, p.batch_index) == (1, 0)
    assert read_back(ml, p) == rec(0)
    w.close()


def test_max_records_trigger_order_and_read_back(ml: ManagedLedger) -> None:
    w = BufferedWriter(ml, max_records=4, max_delay_ms=HOUR_MS)
    data = [rec(i) for i in range(12)]
    ps = results([w.write(d) for d in data])
    first = ps[0].entry_id
    assert layout(ps) == [(first + i // 4, 4, i % 4) for i in range(12)]
    assert [read_back(ml, p) for p in ps] == data
    assert triggers(w) == (3, 0, 0, 0, 0)
    s = w.stats()
    assert (s["entries"], s["batched_entries"], s["records"]) == (3, 3, 12)
    assert s["bytes"] == sum(len(ml.read(ps[i].position)) for i in (0, 4, 8))


def test_max_size_trigger(ml: ManagedLedger) -> None:
    w = BufferedWriter(ml, max_records=1000, max_size=100, max_delay_ms=HOUR_MS)
    ps = results([w.write(rec(i, 30)) for i in range(8)])  # 4 x 30 bytes >= 100
    assert [p.batch_size for p in ps] == [4] * 8
    assert triggers(w) == (0, 2, 0, 0, 0)


def test_max_delay_trigger(ml: ManagedLedger) -> None:
    w = BufferedWriter(ml, max_records=1000, max_size=1 << 20, max_delay_ms=5)
    ps = results([w.write(rec(i)) for i in range(3)])
    assert layout(ps) == [(ps[0].entry_id, 3, i) for i in range(3)]
    assert triggers(w) == (0, 0, 1, 0, 0)
    delay = w.stats()["oldest_record_delay_seconds"]
    assert delay["count"] == 1
    assert delay["sum"] >= 0.005


def test_large_record_goes_alone_unbatched(ml: ManagedLedger) -> None:
    w = BufferedWriter(ml, max_records=1000, max_size=100, max_delay_ms=HOUR_MS)
    data = [rec(0), rec(1), rec(2, 100), rec(3, 5000), rec(4)]
    futs = [w.write(d) for d in data]
    w.flush()
    ps = results(futs)
    e = ps[0].entry_id
    assert layout(ps) == [(e, 2, 0), (e, 2, 1), (e + 1, 1, 0), (e + 2, 1, 0), (e + 3, 1, 0)]
    # Stored bare: the entry IS the record.
    assert ml.read(ps[2].position) == data[2]
    assert ml.read(ps[3].position) == data[3]
    assert frame.is_batched(ml.read(ps[4].position))
    assert [read_back(ml, p) for p in ps] == data
    assert triggers(w) == (0, 0, 0, 2, 1)


def test_batches_of_one_and_two(tmp_path: Path) -> None:
    with ManagedLedger.open(tmp_path, "one") as ml:
        w = BufferedWriter(ml, max_records=1, max_delay_ms=HOUR_MS)
        data = [rec(i) for i in range(3)]
        ps = results([w.write(d) for d in data])
        assert [(p.batch_size, p.batch_index) for p in ps] == [(1, 0)] * 3
        assert [ml.read(p.position) for p in ps] == data  # bare entries
        assert triggers(w) == (0, 0, 0, 0, 0)
        w.close()
    with ManagedLedger.open(tmp_path, "two") as ml:
        w = BufferedWriter(ml, max_records=2, max_delay_ms=HOUR_MS)
        data = [rec(i) for i in range(5)]
        futs = [w.write(d) for d in data]
        w.flush()
        ps = results(futs)
        e = ps[0].entry_id
        assert layout(ps) == [(e, 2, 0), (e, 2, 1), (e + 1, 2, 0), (e + 1, 2, 1), (e + 2, 1, 0)]
        assert [read_back(ml, p) for p in ps] == data
        assert triggers(w) == (2, 0, 0, 0, 1)
        w.close()


def test_batching_off(ml: ManagedLedger) -> None:
    w = BufferedWriter(ml, batch_enabled=False)
    assert not w.batch_enabled
    data = [rec(i) for i in range(4)]
    ps = results([w.write(d) for d in data])
    assert [(p.batch_size, p.batch_index) for p in ps] == [(1, 0)] * 4
    assert [ml.read(p.position) for p in ps] == data
    s = w.stats()
    assert (s["entries"], s["batched_entries"], s["batch_records"]["count"]) == (4, 0, 0)


def test_write_many_one_future_in_order(ml: ManagedLedger) -> None:
    w = BufferedWriter(ml, max_records=64, max_size=4096, max_delay_ms=1)
    data = [rec(i, 5000 if i % 250 == 7 else 20) for i in range(1000)]
    fut = w.write_many(data)
    assert isinstance(fut, Future)
    ps = fut.result(timeout=10)
    assert len(ps) == 1000
    assert [read_back(ml, p) for p in ps] == data
    keys = [p.key() for p in ps]
    assert keys == sorted(keys)
    assert w.stats()["flush_large_data"] == 4
    assert w.write_many([]).result(timeout=10) == []
    assert w.write_many_blocking([]) == []
    more = w.write_many_blocking(data[:3])
    assert [read_back(ml, p) for p in more] == data[:3]


@contextlib.contextmanager
def ticker() -> Iterator[list[int]]:
    """Another Python thread counting its turns (1 ms sleeps) while the body runs."""
    ticks = [0]
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    t = threading.Thread(target=spin)
    t.start()
    try:
        yield ticks
    finally:
        stop.set()
        t.join()


def test_blocking_write_releases_the_gil(ml: ManagedLedger) -> None:
    w = BufferedWriter(ml, max_records=1000, max_delay_ms=300)
    with ticker() as ticks:
        before = ticks[0]
        p = w.write_blocking(rec(1))  # waits ~300 ms for the delay timer
        progressed = ticks[0] - before
    assert read_back(ml, p) == rec(1)
    assert progressed > 20, "another Python thread must run while we wait"


def test_a_write_that_flushes_a_batch_into_a_full_queue_releases_the_gil(
    tmp_path: Path,
) -> None:
    # The record alone fits the journal's queue, but the write submits the
    # 600 kB batch being filled with it, which waits for room (the disk is
    # stalled) until the append timeout: it used to wait holding the GIL,
    # and every other Python thread stopped for those 2 seconds.
    ml = ManagedLedger.open(str(tmp_path), "t", max_pending_bytes=1 << 20, append_timeout_ms=2_000)
    w = BufferedWriter(ml, max_records=1000, max_size=600_000, max_delay_ms=HOUR_MS)
    testing.hold_fault(ml, "sync")
    try:
        ml.append_async(b"a" * 600_000)  # 600 kB of the 1 MiB queue, held by the stall
        w.write(b"b" * 300_000)  # joins the batch
        with ticker() as ticks:
            time.sleep(0.05)
            before = ticks[0]
            with contextlib.suppress(ts_errors.TxnStreamError):
                w.write(b"c" * 300_000)  # a full batch: submitted, and it waits for room
            progressed = ticks[0] - before
    finally:
        testing.release_fault(ml, "sync")
    assert progressed > 20, "another Python thread must run while the write waits"
    ml.close()


def test_blocking_timeout(ml: ManagedLedger) -> None:
    w = BufferedWriter(ml, max_records=1000, max_delay_ms=HOUR_MS)
    with pytest.raises(TimeoutError):
        w.write_blocking(rec(1), timeout_ms=50)
    w.flush()
    assert w.wait_idle(timeout_ms=10_000)


@pytest.mark.parametrize("batching", [True, False])
def test_always_failing_storage(ml: ManagedLedger, batching: bool) -> None:
    w = BufferedWriter(ml, max_records=3, max_delay_ms=HOUR_MS, batch_enabled=batching)
    testing.inject_fault(ml, "write", errno=28, times=1000)
    futs = [w.write(rec(i)) for i in range(6)]
    many = w.write_many([rec(i) for i in range(6, 9)])
    errors = []
    for f in futs:
        with pytest.raises(StorageError) as info:
            f.result(timeout=10)
        errors.append(info.value)
    with pytest.raises(StorageError):
        many.result(timeout=10)
    assert all(e.errno == 28 for e in errors)
    if batching:  # same error object for every record of one batch
        assert str(errors[0]) == str(errors[1]) == str(errors[2])
    s = w.stats()
    assert (s["records"], s["failed_records"]) == (0, 9)
    assert s["failed_entries"] == (3 if batching else 9)
    testing.clear_faults(ml)


@pytest.mark.parametrize("batching", [True, False])
def test_sometimes_failing_storage(ml: ManagedLedger, batching: bool) -> None:
    w = BufferedWriter(ml, max_records=3, max_delay_ms=HOUR_MS, batch_enabled=batching)
    ok1 = results([w.write(rec(i)) for i in range(3)])
    testing.inject_fault(ml, "sync", errno=5, times=1)
    bad = [w.write(rec(i)) for i in range(3, 6)]
    with pytest.raises(StorageError) as first:
        bad[0].result(timeout=10)
    written = dict(zip(range(3), ok1, strict=True))
    for i, f in enumerate(bad[1:], 4):
        exc = f.exception(timeout=10)
        if batching:
            # One batch, one error for all of its records.
            assert exc is not None and str(exc) == str(first.value)
        elif exc is None:
            # Unbatched: a record behind the failed entry fails with it only
            # if the ledger had it queued; otherwise it is durable.
            written[i] = f.result()
    # Writes made after the failure was reported succeed again.
    ok2 = results([w.write(rec(i)) for i in range(6, 9)])
    written.update(zip(range(6, 9), ok2, strict=True))
    for i, p in written.items():
        assert read_back(ml, p) == rec(i)
    s = w.stats()
    assert s["failed_records"] == 9 - len(written)
    assert s["failed_entries"] == (1 if batching else 9 - len(written))


def test_close_mid_stream(ml: ManagedLedger) -> None:
    w = BufferedWriter(ml, max_records=3, max_delay_ms=HOUR_MS)
    flushed = [w.write(rec(i)) for i in range(6)]  # two full batches
    pending = w.write(rec(6))
    pending_many = w.write_many([rec(7)])  # same batch, still 2 < 3 records
    assert w.close(timeout_ms=10_000)
    assert w.closed
    assert [read_back(ml, p) for p in results(flushed)] == [rec(i) for i in range(6)]
    for f in (pending, pending_many):
        assert f.done()
        with pytest.raises(WriterClosedError):
            f.result()
    with pytest.raises(WriterClosedError):
        w.write(rec(6))
    with pytest.raises(WriterClosedError):
        w.write_blocking(rec(6))
    with pytest.raises(WriterClosedError):
        w.write_many([rec(6)])
    s = w.stats()
    assert (s["records"], s["closed_records"], s["in_flight_entries"]) == (6, 2, 0)
    assert w.close()  # idempotent


def test_switching_mid_stream(ml: ManagedLedger) -> None:
    w = BufferedWriter(ml, max_records=100, max_delay_ms=HOUR_MS)
    futs = [w.write(rec(0)), w.write(rec(1))]
    w.set_batch_enabled(False)
    futs += [w.write(rec(2)), w.write(rec(3))]
    w.set_batch_enabled(True)
    futs += [w.write(rec(4)), w.write(rec(5))]
    w.reconfigure(batch_enabled=False)
    futs += [w.write(rec(6))]
    w.set_batch_enabled(True)
    futs += [w.write(rec(7))]
    w.flush()
    ps = results(futs)
    e = ps[0].entry_id
    assert layout(ps) == [
        (e, 2, 0),
        (e, 2, 1),
        (e + 1, 1, 0),
        (e + 2, 1, 0),
        (e + 3, 2, 0),
        (e + 3, 2, 1),
        (e + 4, 1, 0),
        (e + 5, 1, 0),
    ]
    assert [read_back(ml, p) for p in ps] == [rec(i) for i in range(8)]
    assert not frame.is_batched(ml.read(ps[2].position))


def test_concurrent_threads(ml: ManagedLedger) -> None:
    w = BufferedWriter(ml, max_records=32, max_delay_ms=1)
    out: dict[int, list[TxnPosition]] = {}

    def worker(t: int) -> None:
        out[t] = results([w.write(rec(t * 1000 + i)) for i in range(200)])

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for t, ps in out.items():
        keys = [p.key() for p in ps]
        assert keys == sorted(keys), "a thread's records keep its order"
        assert [read_back(ml, p) for p in ps] == [rec(t * 1000 + i) for i in range(200)]
    assert w.stats()["records"] == 1600


@pytest.mark.parametrize(
    ("kwargs", "key", "value"),
    [
        ({"max_records": 0}, "max_records", "0"),
        ({"max_records": -5}, "max_records", "-5"),
        ({"max_size": 0}, "max_size", "0"),
        ({"max_delay_ms": -1.0}, "max_delay_ms", "-1"),
        ({"max_delay_ms": float("nan")}, "max_delay_ms", "NaN"),
    ],
)
def test_bad_config(ml: ManagedLedger, kwargs: dict[str, float], key: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        BufferedWriter(ml, **kwargs)  # type: ignore[arg-type]
    assert info.value.key == key
    assert info.value.value == value
    w = BufferedWriter(ml)
    with pytest.raises(ConfigError):
        w.reconfigure(**kwargs)  # type: ignore[arg-type]
    assert w.config == {
        "max_records": 512,
        "max_size": 4 << 20,
        "max_delay_ms": 1.0,
        "batch_enabled": True,
    }


def test_bad_records(ml: ManagedLedger) -> None:
    w = BufferedWriter(ml)
    with pytest.raises(TypeError):
        w.write("text")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"records\[1\]"):
        w.write_many([b"a", 2])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        w.write_many(b"abc")  # type: ignore[arg-type]


def test_context_manager_and_name(ml: ManagedLedger) -> None:
    with BufferedWriter(ml, name="tc-7", max_delay_ms=HOUR_MS) as w:
        fut = w.write(rec(1))
        assert w.name == "tc-7"
        assert "tc-7" in repr(w)
    assert w.closed
    with pytest.raises(WriterClosedError):
        fut.result(timeout=10)
    assert BufferedWriter(ml).name == "__transaction_log_0"


def test_survives_reopen(tmp_path: Path) -> None:
    with ManagedLedger.open(tmp_path, "log") as ml:
        w = BufferedWriter(ml, max_records=5)
        ps = w.write_many_blocking([rec(i) for i in range(12)])
        w.close()
    with ManagedLedger.open(tmp_path, "log") as ml:
        assert [read_back(ml, p) for p in ps] == [rec(i) for i in range(12)]


@pytest.mark.parametrize("timeout_ms", [float("inf"), 10**30, 2**64, None])
def test_unbounded_timeouts_mean_no_limit(ml: ManagedLedger, timeout_ms: float | None) -> None:
    w = BufferedWriter(ml, max_records=2, max_delay_ms=1)
    assert read_back(ml, w.write_blocking(rec(1), timeout_ms=timeout_ms)) == rec(1)
    assert len(w.write_many_blocking([rec(2), rec(3)], timeout_ms=timeout_ms)) == 2
    assert w.wait_idle(timeout_ms=timeout_ms)
    assert w.close(timeout_ms=timeout_ms)


@pytest.mark.parametrize("bad", [float("nan"), -1, -0.5, "1", True])
def test_bad_timeouts_are_typed_errors_naming_timeout_ms(ml: ManagedLedger, bad: object) -> None:
    w = BufferedWriter(ml, max_delay_ms=HOUR_MS)
    for call in (
        lambda: w.write_blocking(rec(1), timeout_ms=bad),  # type: ignore[arg-type]
        lambda: w.write_many_blocking([rec(1)], timeout_ms=bad),  # type: ignore[arg-type]
        lambda: w.wait_idle(timeout_ms=bad),  # type: ignore[arg-type]
        lambda: w.close(timeout_ms=bad),  # type: ignore[arg-type]
    ):
        with pytest.raises(InvalidArgumentError, match="timeout_ms"):
            call()
    assert w.stats()["records"] == 0 and not w.closed


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"max_records": 2**70}, "max_records"),
        ({"max_size": 2**64}, "max_size"),
        ({"max_delay_ms": 10**300}, "max_delay_ms"),
        ({"max_records": "3"}, "max_records"),
    ],
)
def test_out_of_range_settings_name_the_key(
    ml: ManagedLedger, kwargs: dict[str, object], key: str
) -> None:
    with pytest.raises(ConfigError) as info:
        BufferedWriter(ml, **kwargs)  # type: ignore[arg-type]
    assert info.value.key == key
    w = BufferedWriter(ml)
    with pytest.raises(ConfigError, match=key):
        w.reconfigure(**kwargs)  # type: ignore[arg-type]


def test_records_may_be_any_buffer(ml: ManagedLedger) -> None:
    import numpy as np

    w = BufferedWriter(ml, max_records=4, max_delay_ms=1)
    arr = np.frombuffer(rec(4), dtype=np.uint8).copy()
    words = np.frombuffer(rec(5, 16), dtype=np.int64).copy()
    buffers: list[object] = [rec(1), bytearray(rec(2)), memoryview(rec(3)), arr, words]
    ps = [w.write(b).result(timeout=10) for b in buffers]  # type: ignore[arg-type]
    assert [read_back(ml, p) for p in ps] == [rec(i) for i in (1, 2, 3, 4)] + [rec(5, 16)]
    many = w.write_many_blocking(buffers)  # type: ignore[arg-type]
    assert [read_back(ml, p) for p in many] == [rec(i) for i in (1, 2, 3, 4)] + [rec(5, 16)]
    one = w.write_blocking(bytearray(rec(9)))
    assert read_back(ml, one) == rec(9)
    strided = np.arange(8, dtype=np.uint8)[::2]
    with pytest.raises(InvalidArgumentError, match="record"):
        w.write(strided)  # type: ignore[arg-type]


def test_reconfigure_batch_enabled_is_a_bool(ml: ManagedLedger) -> None:
    # PyO3's bool conversion raised a bare TypeError for an int.
    w = BufferedWriter(ml)
    with pytest.raises(InvalidArgumentError, match="batch_enabled must be a bool, not int"):
        w.reconfigure(batch_enabled=1)  # type: ignore[arg-type]
    assert w.config["batch_enabled"] is True
    w.close()


def test_numpy_integers_are_ints_for_settings_and_timeouts(ml: ManagedLedger) -> None:
    # i64_arg and the millisecond arguments took Python ints only.
    import numpy as np

    w = BufferedWriter(ml, max_records=np.int32(7), max_delay_ms=np.int64(2))
    w.reconfigure(max_size=np.uint16(4096))
    assert w.config == {
        "max_records": 7,
        "max_size": 4096,
        "max_delay_ms": 2.0,
        "batch_enabled": True,
    }
    assert w.write_blocking(b"\x08\x01", timeout_ms=np.int64(60_000)).batch_size >= 1
    with pytest.raises(ConfigError, match="max_records"):
        w.reconfigure(max_records=np.True_)  # type: ignore[arg-type]
    w.close()
