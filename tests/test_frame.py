"""Frame codec (SPEC §3.1): round trips, Pulsar byte compatibility, bad input."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import txnstream as ts
from txnstream import frame, proto

PREFIX = b"\x0e\x01\x00\x01"


def txn_record(i: int) -> proto.TransactionMetadataEntry:
    return proto.TransactionMetadataEntry(
        metadata_op=proto.TransactionMetadataEntry.ADD_PARTITION,
        txnid_most_bits=2,
        txnid_least_bits=i,
        expected_status=proto.OPEN,
        new_status=proto.OPEN,
        partitions=[f"public/default/t{i}", "public/default/x"],
        subscriptions=[proto.Subscription(topic="in", subscription=f"s{i}")],
        timeout_ms=30_000,
        last_modification_time=1_700_000_000_000 + i,
        client_name="etl-1",
    )


def ack_record(i: int) -> proto.PendingAckMetadataEntry:
    return proto.PendingAckMetadataEntry(
        pending_ack_op=proto.ACK,
        ack_type=proto.Individual,
        txnid_most_bits=0,
        txnid_least_bits=i,
        pending_ack_metadata=[
            proto.PendingAckMetadata(ledgerId=7, entryId=i, ack_set=[-2, 5], batch_size=70)
        ],
    )


def test_constants() -> None:
    assert frame.MAGIC == 0x0E01
    assert frame.VERSION == 0x0001


@given(st.lists(st.binary(max_size=200), min_size=1, max_size=50))
def test_round_trip(records: list[bytes]) -> None:
    entry = frame.encode_batch(records)
    assert entry[:4] == PREFIX
    assert frame.is_batched(entry)
    assert frame.decode_entry(entry) == records
    decoded = frame.decode_entries([entry, entry])
    assert decoded.to_list() == records + records
    assert list(decoded.batch_index) == list(range(len(records))) * 2


@pytest.mark.parametrize("n", [1, 2, 512])
def test_pulsar_txn_log_entry_byte_compatible(n: int) -> None:
    records = [txn_record(i) for i in range(n)]
    batched = proto.BatchedTransactionMetadataEntry(transaction_log=records)
    entry = PREFIX + batched.SerializeToString()
    raw = frame.decode_entry(entry)
    assert raw == [r.SerializeToString() for r in records]
    assert [proto.TransactionMetadataEntry.FromString(r) for r in raw] == records
    assert frame.encode_batch(raw) == entry


@pytest.mark.parametrize("n", [1, 3, 100])
def test_pulsar_pending_ack_entry_byte_compatible(n: int) -> None:
    records = [ack_record(i) for i in range(n)]
    batched = proto.BatchedPendingAckMetadataEntry(pending_ack_log=records)
    entry = PREFIX + batched.SerializeToString()
    raw = frame.decode_entry(entry)
    assert raw == [r.SerializeToString() for r in records]
    assert frame.encode_batch(raw) == entry


def test_single_record_is_not_batched() -> None:
    rec = txn_record(1).SerializeToString()
    assert rec[0] == 0x08
    assert not frame.is_batched(rec)
    assert frame.decode_entry(rec) == [rec]


@pytest.mark.parametrize(
    ("entry", "offset", "reason"),
    [
        (b"\x0e\x01", 2, "truncated batch header"),
        (b"\x0e\x01\x00", 3, "truncated batch header"),
        (b"\x0e\x01\x00\x02", 2, "unknown batch version 0x0002"),
        (b"\x0e\x01\xff\xff\x0a\x00", 2, "unknown batch version 0xffff"),
        (PREFIX + b"\x0a\x05ab", 4, "runs past the end"),
        (PREFIX + b"\x0a", 5, "truncated varint"),
        (PREFIX + b"\x0a\x80", 5, "truncated varint"),
        (PREFIX + b"\x0a" + b"\xff" * 9 + b"\x7f", 5, "overflows 64 bits"),
        (PREFIX + b"\x0a" + b"\xff" * 11, 5, "overflows"),
        (PREFIX + b"\x0b", 4, "wire type 3"),
        (PREFIX + b"\x00", 4, "field number 0"),
        (PREFIX + b"\x0a\x01x" + b"\x0a\x7f", 7, "runs past the end"),
        (PREFIX + b"\x08\x01", 4, "not length-delimited"),
        (PREFIX, 4, "holds no records"),
        (PREFIX + b"\x12\x01x", 7, "holds no records"),
    ],
)
def test_malformed_entries(entry: bytes, offset: int, reason: str) -> None:
    with pytest.raises(ts.CorruptEntryError) as info:
        frame.decode_entry(entry)
    assert info.value.offset == offset
    assert reason in str(info.value)
    assert f"offset {offset}" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_empty_batch_is_rejected() -> None:
    with pytest.raises(ts.InvalidArgumentError, match="at least one record"):
        frame.encode_batch([])


def test_wrong_magic_is_a_single_record() -> None:
    assert frame.decode_entry(b"\x0e\x02\x00\x01") == [b"\x0e\x02\x00\x01"]
    assert frame.decode_entry(b"") == [b""]


def test_bulk_error_names_entry_index() -> None:
    good = frame.encode_batch([b"a"])
    with pytest.raises(ts.CorruptEntryError, match="entry #2"):
        frame.decode_entries([good, good, b"\x0e\x01\x00\x09"])


@given(st.binary(max_size=300))
def test_fuzz_never_crashes(data: bytes) -> None:
    try:
        records = frame.decode_entry(data)
    except ts.CorruptEntryError as e:
        assert 0 <= e.offset <= len(data)
        assert frame.is_batched(data)
    else:
        if not frame.is_batched(data):
            assert records == [data]
    for decoder in (frame.decode_txn_log_columns, frame.decode_pending_ack_columns):
        with contextlib.suppress(ts.CorruptEntryError):
            decoder([data])


@given(st.binary(max_size=300))
def test_fuzz_after_valid_header(body: bytes) -> None:
    try:
        frame.decode_entry(PREFIX + body)
    except ts.CorruptEntryError as e:
        assert 4 <= e.offset <= len(body) + 4


def test_type_errors_name_the_argument() -> None:
    with pytest.raises(TypeError, match=r"records\[1\] must be bytes or another buffer.*not str"):
        frame.encode_batch([b"a", "b"])  # type: ignore[list-item]
    with pytest.raises(ts.InvalidArgumentError, match=r"records\[0\]"):
        frame.encode_batch([1])  # type: ignore[list-item]
    # Any buffer is a record.
    assert frame.decode_entry(frame.encode_batch([bytearray(b"a"), memoryview(b"bc")])) == [
        b"a",
        b"bc",
    ]
    with pytest.raises(TypeError, match="not a single bytes object"):
        frame.encode_batch(b"abc")  # type: ignore[arg-type]


def test_arrow_calls_copy_a_read_only_view_that_can_still_change() -> None:
    # A read-only memoryview of a bytearray is "read-only" yet changes with
    # the bytearray: it was read in place with the GIL released while another
    # thread rewrote it, and calls saw half old, half new bytes. Each call
    # must see one whole state: all values batched, or none.
    import threading

    import numpy as np

    n = 2_000_000
    batched, plain = b"\x0e\x01" * n, b"\x08\x01" * n
    buf = bytearray(batched)
    view = memoryview(buf).toreadonly()
    offsets = np.arange(0, 2 * n + 1, 2, dtype=np.int32).tobytes()
    stop = threading.Event()

    def flip() -> None:
        while not stop.is_set():
            buf[:] = plain  # each assignment is whole under the GIL
            buf[:] = batched

    t = threading.Thread(target=flip)
    t.start()
    try:
        seen = [int(ts._native.arrow_is_batched(offsets, view, 4, 0, n).sum()) for _ in range(20)]
    finally:
        stop.set()
        t.join()
    assert all(s in (0, n) for s in seen), seen


def test_decode_entries_of_an_impossible_total_size_raises_instead_of_aborting() -> None:
    # decode_entries reserved the sum of the entries' sizes up front: one big
    # bytes object repeated in a list (cheap) asked for 256 TiB, and the
    # failed allocation aborted the interpreter. Run in a child process so
    # that an abort fails this test instead of killing the test run.
    import subprocess
    import sys

    child = (
        "import txnstream as ts\n"
        "from txnstream import frame\n"
        "try:\n"
        "    frame.decode_entries([bytes(1 << 26)] * (1 << 22))\n"
        "except ts.InvalidArgumentError as e:\n"
        "    print(e)\n"
    )
    r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"hold {1 << 48} bytes in all" in r.stdout, r.stdout


def test_arrow_buffers_of_any_item_type_are_raw_bytes() -> None:
    # The stubs say ``offsets: Buffer``: an int32 offsets array (what Arrow's
    # offsets are) was refused with "must be a C-contiguous buffer of bytes",
    # though decode_entry takes any buffer as raw bytes.
    import numpy as np
    import pyarrow as pa

    arr = pa.array([b"\x0e\x01\x00\x01\x0a\x01x", b"\x08\x01"], pa.binary())
    _, offsets, data = arr.buffers()
    assert offsets is not None and data is not None
    want = [True, False]
    assert ts._native.arrow_is_batched(offsets, data, 4, 0, 2).tolist() == want
    offs32 = np.frombuffer(offsets, dtype=np.int32)
    cases: list[tuple[Any, Any]] = [
        (offs32, data),
        (offs32, np.frombuffer(data, np.uint8)),
        (memoryview(offs32.tobytes()).cast("i"), memoryview(bytes(data))),
        (offs32.astype(np.int64), memoryview(bytes(data) + b"\0").cast("H")),
    ]
    for o, d in cases:
        width = o.itemsize if isinstance(o, np.ndarray) else 4
        assert ts._native.arrow_is_batched(o, d, width, 0, 2).tolist() == want
        assert ts._native.arrow_decode_entries(o, d, width, 0, 2)["entry_offsets"].tolist() == [
            0,
            1,
            2,
        ]
    with pytest.raises(ts.InvalidArgumentError, match="offsets must be a C-contiguous buffer"):
        ts._native.arrow_is_batched(offs32[::-1], data, 4, 0, 2)  # type: ignore[arg-type]
    with pytest.raises(ts.InvalidArgumentError, match="data must be bytes or another buffer"):
        ts._native.arrow_is_batched(offs32, "text", 4, 0, 2)  # type: ignore[arg-type]


def test_decoded_record_takes_a_negative_index_from_the_end() -> None:
    # record(i) sliced data[offsets[i]:offsets[i + 1]]: record(-1) was b"",
    # record(-2) the last record, and an index past the end an IndexError
    # only by luck.
    import numpy as np

    d = frame.decode_entries([frame.encode_batch([b"aa", b"bbb"]), b"\x08\x01"])
    records = d.to_list()
    for i in range(-len(d), len(d)):
        assert d.record(i) == records[i]
    assert d.record(np.int64(-1)) == b"\x08\x01"
    for i in (len(d), -len(d) - 1, 10):
        with pytest.raises(IndexError, match=f"record index {i} out of range for 3 records"):
            d.record(i)
    empty = frame.decode_entries([])
    with pytest.raises(IndexError):
        empty.record(0)
