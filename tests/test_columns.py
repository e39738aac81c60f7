"""Columnar bulk decode of transaction-log and pending-ack records."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import txnstream as ts
from txnstream import frame, proto

u64 = st.integers(min_value=0, max_value=2**64 - 1)
status = st.sampled_from([proto.OPEN, proto.COMMITTING, proto.COMMITTED, proto.ABORTING])
name = st.text(max_size=12)


@st.composite
def txn_entries(draw: st.DrawFn) -> proto.TransactionMetadataEntry:
    m = proto.TransactionMetadataEntry(
        txnid_most_bits=draw(u64),
        txnid_least_bits=draw(u64),
        partitions=draw(st.lists(name, max_size=3)),
        subscriptions=[
            proto.Subscription(topic=t, subscription=s)
            for t, s in draw(st.lists(st.tuples(name, name), max_size=2))
        ],
    )
    if draw(st.booleans()):
        m.metadata_op = draw(st.integers(0, 3))  # type: ignore[assignment]
    if draw(st.booleans()):
        m.new_status = draw(status)
    if draw(st.booleans()):
        m.timeout_ms = draw(u64)
    if draw(st.booleans()):
        m.client_name = draw(name)
    return m


@given(st.lists(st.lists(txn_entries(), min_size=1, max_size=5), min_size=1, max_size=5))
def test_txn_log_columns_match_protobuf(groups: list[list[proto.TransactionMetadataEntry]]) -> None:
    entries = [
        frame.encode_batch([m.SerializeToString() for m in g])
        if len(g) > 1
        else g[0].SerializeToString()
        for g in groups
    ]
    flat = [m for g in groups for m in g]
    c = frame.decode_txn_log_columns(entries)
    assert isinstance(c["txnid_least_bits"], np.ndarray)
    assert c["txnid_least_bits"].tolist() == [m.txnid_least_bits for m in flat]
    assert c["txnid_most_bits"].tolist() == [m.txnid_most_bits for m in flat]
    assert c["metadata_op"].tolist() == [
        m.metadata_op if m.HasField("metadata_op") else -1 for m in flat
    ]
    assert c["new_status"].tolist() == [
        m.new_status if m.HasField("new_status") else -1 for m in flat
    ]
    assert c["timeout_ms"].tolist() == [m.timeout_ms for m in flat]
    assert frame.utf8_column(c, "client_name") == [m.client_name for m in flat]
    parts = frame.utf8_column(c, "partitions")
    off = c["partition_offsets"]
    for i, m in enumerate(flat):
        assert parts[off[i] : off[i + 1]] == list(m.partitions)
    subs = frame.utf8_column(c, "subscription_names")
    soff = c["subscription_offsets"]
    for i, m in enumerate(flat):
        assert subs[soff[i] : soff[i + 1]] == [s.subscription for s in m.subscriptions]
    sizes = [len(g) for g in groups]
    assert c["batch_size"].tolist() == [n for n in sizes for _ in range(n)]
    assert c["entry_index"].tolist() == [i for i, n in enumerate(sizes) for _ in range(n)]


def test_pending_ack_columns() -> None:
    recs = [
        proto.PendingAckMetadataEntry(
            pending_ack_op=proto.ACK,
            ack_type=proto.Cumulative,
            txnid_least_bits=i,
            pending_ack_metadata=[
                proto.PendingAckMetadata(ledgerId=1, entryId=j, ack_set=[j] * j, batch_size=j + 1)
                for j in range(i)
            ],
        )
        for i in range(4)
    ]
    recs.append(proto.PendingAckMetadataEntry(pending_ack_op=proto.COMMIT, txnid_least_bits=9))
    c = frame.decode_pending_ack_columns(
        [frame.encode_batch([r.SerializeToString() for r in recs])]
    )
    assert c["op"].tolist() == [1, 1, 1, 1, 2]
    assert c["ack_type"].tolist() == [1, 1, 1, 1, -1]
    assert c["position_offsets"].tolist() == [0, 0, 1, 3, 6, 6]
    assert c["entry_id"].tolist() == [0, 0, 1, 0, 1, 2]
    assert c["position_batch_size"].tolist() == [1, 1, 2, 1, 2, 3]
    assert c["ack_set_offsets"].tolist() == [0, 0, 0, 1, 1, 2, 4]
    assert c["ack_set_words"].tolist() == [1, 1, 2, 2]


def test_garbage_record_is_corrupt_entry() -> None:
    entry = frame.encode_batch([b"\x08\x01", b"\x12\xff"])
    with pytest.raises(ts.CorruptEntryError, match=r"entry #0: record 1"):
        frame.decode_txn_log_columns([entry])


def _varint(v: int) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


enum_value = st.one_of(
    st.integers(0, 8),  # valid or just outside
    st.integers(-3, -1).map(lambda v: v % 2**64),  # negative: ten bytes
    st.integers(0, 2**64 - 1),  # anything (its low 32 bits may be valid)
)


@given(
    st.lists(st.tuples(st.sampled_from([1, 4, 5]), enum_value), max_size=6),
    st.lists(st.tuples(st.sampled_from([1, 2]), enum_value), max_size=6),
)
def test_enum_values_outside_the_enum_read_as_protobuf_reads_them(
    txn_fields: list[tuple[int, int]], ack_fields: list[tuple[int, int]]
) -> None:
    # proto2 enums are closed: a value outside the enum is kept as an
    # unknown field and the field keeps its earlier value (absent if none).
    # The columns kept any value 0..127 (overwriting a valid one) and read
    # 128 and above as absent.
    def field(m: object, name: str) -> int:
        return int(getattr(m, name)) if m.HasField(name) else -1  # type: ignore[attr-defined]

    rec = b"".join(bytes([f << 3]) + _varint(v) for f, v in txn_fields)
    c = frame.decode_txn_log_columns([rec])
    m = proto.TransactionMetadataEntry.FromString(rec)
    for col in ("metadata_op", "expected_status", "new_status"):
        assert int(c[col][0]) == field(m, col), col
    rec = b"".join(bytes([f << 3]) + _varint(v) for f, v in ack_fields)
    a = frame.decode_pending_ack_columns([rec])
    p = proto.PendingAckMetadataEntry.FromString(rec)
    assert int(a["op"][0]) == field(p, "pending_ack_op")
    assert int(a["ack_type"][0]) == field(p, "ack_type")


def test_an_update_to_an_unknown_status_is_an_update_without_one() -> None:
    # The fold reads records as protobuf does: new_status=9 is not set.
    from txnstream import _native

    new = _native.encode_txn_new(0, 1, 10, 1000)
    upd = b"\x08\x03\x10\x01\x18\x00\x28\x09"  # UPDATE (0,1), new_status=9
    assert not proto.TransactionMetadataEntry.FromString(upd).HasField("new_status")
    f = _native.fold_txn_entries([new, upd], [1, 1], [0, 1], [[], []], 0)
    assert f["status"].tolist() == [proto.OPEN]
