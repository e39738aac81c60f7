"""Codec benchmarks (SPEC §6): Rust vs upb protobuf vs pure Python, same run.

Run: ``.venv/bin/pytest benches/test_codec.py --benchmark-only``
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import txnstream as ts
from txnstream import ackset, frame, proto

RECORDS_PER_ENTRY = 512
ENTRIES = 16


def make_txn_entries() -> list[bytes]:
    out = []
    for e in range(ENTRIES):
        recs = []
        for i in range(RECORDS_PER_ENTRY):
            m = proto.TransactionMetadataEntry(
                metadata_op=proto.TransactionMetadataEntry.UPDATE,
                txnid_most_bits=1,
                txnid_least_bits=e * RECORDS_PER_ENTRY + i,
                expected_status=proto.OPEN,
                new_status=proto.COMMITTING,
                timeout_ms=30_000,
                last_modification_time=1_700_000_000_000 + i,
            )
            if i % 4 == 0:
                m.partitions.append(f"public/default/topic-{i % 7}")
            recs.append(m.SerializeToString())
        out.append(frame.encode_batch(recs))
    return out


TXN_ENTRIES = make_txn_entries()
N_RECORDS = ENTRIES * RECORDS_PER_ENTRY


def py_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def py_unframe(entry: bytes) -> list[bytes]:
    """Pure-Python reference unframer (what a user without the core would write)."""
    if entry[:2] != b"\x0e\x01":
        return [entry]
    if entry[2:4] != b"\x00\x01":
        raise ValueError("bad version")
    out, pos, end = [], 4, len(entry)
    while pos < end:
        key, pos = py_varint(entry, pos)
        if key & 7 != 2:
            raise ValueError("unexpected wire type")
        n, pos = py_varint(entry, pos)
        out.append(entry[pos : pos + n])
        pos += n
    return out


# -- unframing a batched entry into list[bytes] ------------------------------


@pytest.mark.benchmark(group="unframe-512")
def test_unframe_rust(benchmark: Any) -> None:
    benchmark.extra_info["items"] = N_RECORDS
    out = benchmark(lambda: [frame.decode_entry(e) for e in TXN_ENTRIES])
    assert sum(map(len, out)) == N_RECORDS


@pytest.mark.benchmark(group="unframe-512")
def test_unframe_rust_bulk_flat(benchmark: Any) -> None:
    benchmark.extra_info["items"] = N_RECORDS
    out = benchmark(frame.decode_entries, TXN_ENTRIES)
    assert len(out) == N_RECORDS


@pytest.mark.benchmark(group="unframe-512")
def test_unframe_pure_python(benchmark: Any) -> None:
    benchmark.extra_info.update(items=N_RECORDS, baseline=True)
    out = benchmark(lambda: [py_unframe(e) for e in TXN_ENTRIES])
    assert out == [frame.decode_entry(e) for e in TXN_ENTRIES]


# -- decoding transaction-log records into fields -----------------------------


@pytest.mark.benchmark(group="txn-log-decode-512")
def test_decode_columns_rust(benchmark: Any) -> None:
    benchmark.extra_info["items"] = N_RECORDS
    cols = benchmark(frame.decode_txn_log_columns, TXN_ENTRIES)
    assert len(cols["txnid_least_bits"]) == N_RECORDS


def upb_decode(entries: list[bytes]) -> dict[str, list[int]]:
    cols: dict[str, list[int]] = {"least": [], "most": [], "new": [], "timeout": [], "parts": []}
    for e in entries:
        batch = proto.BatchedTransactionMetadataEntry.FromString(e[4:])
        for m in batch.transaction_log:
            cols["least"].append(m.txnid_least_bits)
            cols["most"].append(m.txnid_most_bits)
            cols["new"].append(m.new_status if m.HasField("new_status") else -1)
            cols["timeout"].append(m.timeout_ms)
            cols["parts"].append(len(m.partitions))
    return cols


@pytest.mark.benchmark(group="txn-log-decode-512")
def test_decode_upb_python_loop(benchmark: Any) -> None:
    benchmark.extra_info.update(items=N_RECORDS, baseline=True)
    cols = benchmark(upb_decode, TXN_ENTRIES)
    rust = frame.decode_txn_log_columns(TXN_ENTRIES)
    assert cols["least"] == rust["txnid_least_bits"].tolist()


@pytest.mark.benchmark(group="txn-log-decode-512")
def test_decode_pure_python_unframe_plus_upb(benchmark: Any) -> None:
    benchmark.extra_info["items"] = N_RECORDS

    def run() -> int:
        n = 0
        for e in TXN_ENTRIES:
            for r in py_unframe(e):
                m = proto.TransactionMetadataEntry.FromString(r)
                n += m.txnid_least_bits >= 0
        return n

    assert benchmark(run) == N_RECORDS


# -- ack-set operations: Rust vs Python-int bitset ----------------------------

BATCH = 512
N_SETS = 2000
rng = np.random.default_rng(7)
DELETES = rng.integers(0, BATCH, size=(N_SETS, 8))


@pytest.mark.benchmark(group="ackset-ops")
def test_ackset_rust_objects(benchmark: Any) -> None:
    benchmark.extra_info["items"] = N_SETS

    def run() -> int:
        empty = 0
        for row in DELETES.tolist():
            s = ts.AckSet(BATCH)
            for i in row:
                s.and_(ts.AckSet.single_deleted(BATCH, i))
            empty += s.is_empty() + s.cardinality() + len(s.to_words())
        return empty

    benchmark(run)


@pytest.mark.benchmark(group="ackset-ops")
def test_ackset_python_int(benchmark: Any) -> None:
    benchmark.extra_info.update(items=N_SETS, baseline=True)
    full = (1 << BATCH) - 1
    mask = (1 << 64) - 1

    def run() -> int:
        empty = 0
        for row in DELETES.tolist():
            s = full
            for i in row:
                s &= full & ~(1 << i)
            words = []
            v = s
            while v:
                w = v & mask
                words.append(w - (1 << 64) if w >> 63 else w)
                v >>= 64
            empty += (s == 0) + s.bit_count() + len(words)
        return empty

    benchmark(run)


WORDS = BATCH // 64
ROWS_A = rng.integers(-(2**63), 2**63 - 1, size=(100_000, WORDS), dtype=np.int64)
ROWS_B = rng.integers(-(2**63), 2**63 - 1, size=(100_000, WORDS), dtype=np.int64)


@pytest.mark.benchmark(group="ackset-bulk-100k")
def test_ackset_bulk_rust(benchmark: Any) -> None:
    benchmark.extra_info["items"] = len(ROWS_A)

    def run() -> int:
        merged = ackset.and_many(ROWS_A, ROWS_B)
        return int(ackset.cardinality_many(merged).sum()) + int(ackset.is_empty_many(merged).sum())

    benchmark(run)


@pytest.mark.benchmark(group="ackset-bulk-100k")
def test_ackset_bulk_numpy(benchmark: Any) -> None:
    benchmark.extra_info.update(items=len(ROWS_A), baseline=True)

    def run() -> int:
        merged = ROWS_A & ROWS_B
        bits = np.unpackbits(merged.view(np.uint8), axis=1).sum(axis=1)
        return int(bits.sum()) + int((merged == 0).all(axis=1).sum())

    r = benchmark(run)
    merged = ackset.and_many(ROWS_A, ROWS_B)
    expect = int(ackset.cardinality_many(merged).sum()) + int(ackset.is_empty_many(merged).sum())
    assert r == expect
