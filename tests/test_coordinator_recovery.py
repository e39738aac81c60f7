"""Rust recovery fold and record encoders vs the Python references."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.reference_fold import fold
from txnstream import ManagedLedger, _native, proto
from txnstream._native import (
    BufferedWriter,
    encode_txn_add_partitions,
    encode_txn_add_subscriptions,
    encode_txn_new,
    encode_txn_update,
    fold_txn_entries,
)
from txnstream.coordinator import TransactionCoordinator, TxnID, TxnStatus, log_name
from txnstream.coordinator.state import CURSOR, FoldResult, PositionColumns
from txnstream.errors import CorruptEntryError, InvalidArgumentError
from txnstream.proto import Subscription, TransactionMetadataEntry
from txnstream.testing import InMemoryTransactionLog

E = TransactionMetadataEntry


def test_encoders_match_protobuf() -> None:
    new = E(
        metadata_op=E.NEW,
        txnid_least_bits=7,
        txnid_most_bits=3,
        last_modification_time=99,
        new_status=proto.OPEN,
        timeout_ms=1000,
        start_time=99,
        max_local_txn_id=7,
        client_name="cli",
    )
    assert encode_txn_new(3, 7, 99, 1000, "cli") == new.SerializeToString()
    new.ClearField("client_name")
    assert encode_txn_new(3, 7, 99, 1000) == new.SerializeToString()
    parts = E(
        metadata_op=E.ADD_PARTITION,
        txnid_least_bits=2**64 - 1,
        txnid_most_bits=0,
        last_modification_time=0,
        partitions=["a", "b/c"],
    )
    assert encode_txn_add_partitions(0, 2**64 - 1, 0, ["a", "b/c"]) == parts.SerializeToString()
    subs = E(
        metadata_op=E.ADD_SUBSCRIPTION,
        txnid_least_bits=1,
        txnid_most_bits=0,
        last_modification_time=5,
        subscriptions=[Subscription(topic="t", subscription="s" * 200)],
    )
    got = encode_txn_add_subscriptions(0, 1, 5, [("t", "s" * 200)])
    assert got == subs.SerializeToString()
    upd = E(
        metadata_op=E.UPDATE,
        txnid_least_bits=1,
        txnid_most_bits=0,
        last_modification_time=5,
        expected_status=proto.OPEN,
        new_status=proto.OPEN,
    )
    assert encode_txn_update(0, 1, 5, 0, 0) == upd.SerializeToString()
    # The timed-out flag is the txnstream field 1000, only written when set.
    upd.expected_status, upd.new_status, upd.timed_out = proto.OPEN, proto.ABORTING, True
    assert encode_txn_update(0, 1, 5, 0, 3, True) == upd.SerializeToString()
    assert encode_txn_update(0, 1, 5, 0, 3).endswith(b"\x50\x05")  # ends at field 10
    with pytest.raises(InvalidArgumentError, match="new_status"):
        encode_txn_update(0, 1, 5, 0, 7)


def _same(log: InMemoryTransactionLog, tc_id: int) -> None:
    # Both folds accept the log and agree, or both refuse it as corrupt.
    try:
        rust: FoldResult | None = log.fold(tc_id)
    except CorruptEntryError:
        rust = None
    try:
        ref = fold(log, tc_id)
    except CorruptEntryError:
        assert rust is None, "the Rust fold accepted a log the reference refuses"
        return
    assert rust is not None, "the Rust fold refused a log the reference accepts"
    assert rust.seq == [t.seq for t in ref.txns]
    assert rust.status == [int(t.status) for t in ref.txns]
    assert rust.timeout_ms == [t.timeout_ms for t in ref.txns]
    assert rust.start_time == [t.start_time for t in ref.txns]
    assert rust.last_modified == [t.last_modified for t in ref.txns]
    assert rust.client_name == [t.client_name for t in ref.txns]
    assert [p or [] for p in rust.partitions] == [t.partitions for t in ref.txns]
    assert [s or [] for s in rust.subscriptions] == [t.subscriptions for t in ref.txns]
    for i, t in enumerate(ref.txns):
        got = rust.positions.span(i).to_positions()
        assert [p.key() for p in got] == [p.key() for p in t.positions]
    assert sorted(p.key() for p in rust.purge.to_positions()) == sorted(p.key() for p in ref.purge)
    assert (rust.max_seq, rust.live_records) == (ref.max_seq, ref.live_records)
    assert rust.foreign_records == ref.foreign_records


ops = st.lists(
    st.tuples(
        st.integers(0, 3),  # op
        st.integers(0, 9),  # seq
        st.integers(0, 4),  # status / name variant
        st.booleans(),  # other coordinator
        st.integers(1, 4),  # records in this entry (1 = unbatched)
    ),
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(ops, st.sets(st.integers(0, 80), max_size=20))
def test_rust_fold_matches_python_reference(
    script: list[tuple[int, int, int, bool, int]], dels: set[int]
) -> None:
    log = InMemoryTransactionLog()
    futures = []
    pending: list[bytes] = []
    for op, seq, v, foreign, size in script:
        most = 1 if foreign else 0
        if op == 0:
            rec = encode_txn_new(most, seq, 10 + seq, 100 + v, f"c{v}" if v else None)
        elif op == 1:
            rec = encode_txn_add_partitions(most, seq, 20 + v, [f"p{v}", f"p{v % 2}"])
        elif op == 2:
            rec = encode_txn_add_subscriptions(most, seq, 30 + v, [("t", f"s{v}")])
        else:
            # Mostly one branch per transaction (commit for even sequences),
            # now and then any status: valid logs and corrupt ones both come up.
            status = (0, 1, 2, 1, 2)[v] + (2 if seq % 2 and v else 0)
            if (seq + v) % 7 == 0:
                status = v
            rec = encode_txn_update(most, seq, 40 + v, 0, status)
        pending.append(rec)
        if len(pending) >= size:
            futures.extend(log.write_many(pending) if len(pending) > 1 else [log.write(rec)])
            pending = []
    if pending:
        futures.extend(log.write_many(pending))
    gone = [f.result() for i, f in enumerate(futures) if i in dels]
    if gone:
        log.delete(PositionColumns.from_positions(gone))
    _same(log, 0)


def test_fold_rejects_corrupt_entries_with_position() -> None:
    with pytest.raises(CorruptEntryError) as exc:
        fold_txn_entries([b"\x08\x00", b"\x0e\x01\x00\x01\x0a\x09ab"], [0, 0], [0, 1], [[], []], 0)
    assert "1" in str(exc.value)
    with pytest.raises(InvalidArgumentError, match="same length"):
        fold_txn_entries([b""], [0, 0], [0], [[]], 0)


def _full(tc: TransactionCoordinator, k: int) -> TxnID:
    txn = tc.new_transaction(timeout_ms=3_600_000, client_name=f"c{k % 3}")
    tc.add_produced_partitions(txn, [f"out-{k % 2}"])
    tc.add_acked_subscriptions(txn, [("in", "sub")])
    return txn


def test_recovered_transactions_end_and_free_their_records(tmp_path: Path) -> None:
    with TransactionCoordinator.open(tmp_path, 0, registry=None) as tc:
        txns = [_full(tc, k) for k in range(40)]
        tc.commit(txns[0])
    with TransactionCoordinator.open(tmp_path, 0, registry=None) as tc:
        assert tc.recovery["open"] == 39
        info = tc.get_transaction(txns[5])
        assert info.log_records == 3
        assert info.partitions == ("out-1",)
        assert info.client_name == "c2"
        for k, txn in enumerate(txns[1:], start=1):
            want = TxnStatus.COMMITTED if k % 2 else TxnStatus.ABORTED
            assert tc.end_transaction(txn, "commit" if k % 2 else "abort") is want
        assert tc.stats()["live"] == 0 and tc.recovery["open"] == 39
        tc.new_transaction()  # one live record remains
    with TransactionCoordinator.open(tmp_path, 0, registry=None) as tc:
        assert tc.recovery["live_records"] == 1
        assert tc.recovery["purged_records"] == 0
        assert tc.recovery["open"] == 1


def test_a_lost_sequence_mark_is_refused_once_the_log_has_history(tmp_path: Path) -> None:
    # Every transaction ended, so the log holds no live record: without the
    # mark, ids restarted at 0 and a new transaction took the id of an old
    # aborted one, whose partitions then hid the new one's committed
    # messages (found in review). First opens need no mark.
    mark = tmp_path / "coordinators" / "0" / "max_local_txn_id"
    with TransactionCoordinator.open(tmp_path, 0, registry=None) as tc:
        old = tc.new_transaction()
        tc.end_transaction(old, "abort")
    mark.unlink()
    with pytest.raises(CorruptEntryError, match="max_local_txn_id is missing"):
        TransactionCoordinator.open(tmp_path, 0, registry=None)
    mark.write_text("100\n")  # the operator's repair
    with TransactionCoordinator.open(tmp_path, 0, registry=None) as tc:
        assert tc.new_transaction().least_bits >= 100
    # A coordinator opened for the first time, or opened before and never
    # written, starts at 0.
    for _ in range(2):
        with TransactionCoordinator.open(tmp_path, 1, registry=None):
            pass
        (tmp_path / "coordinators" / "1" / "max_local_txn_id").unlink(missing_ok=True)


def test_cursor_delete_records_bulk(tmp_path: Path) -> None:
    ml = ManagedLedger.open(str(tmp_path), log_name(0))
    cur = ml.open_cursor(CURSOR)
    w = BufferedWriter(ml, max_records=3, max_delay_ms=50)
    pos = w.write_many_blocking([b"\x08\x00"] * 6)
    cols = PositionColumns.from_positions(pos)
    with pytest.raises(InvalidArgumentError, match="same length"):
        cur.delete_records(cols.ledger_id, cols.entry_id[:2], cols.batch_size, cols.batch_index)
    bad = cols.batch_index.copy()
    bad[0] = 9
    with pytest.raises(InvalidArgumentError):
        cur.delete_records(cols.ledger_id, cols.entry_id, cols.batch_size, bad)
    assert cur.mark_delete_position is None  # all or nothing
    first = cols.slice(0, 4)  # entry 0 whole, index 0 of entry 1
    cur.delete_records(first.ledger_id, first.entry_id, first.batch_size, first.batch_index)
    assert cur.mark_delete_position == pos[0]
    ack = cur.batch_ack_set(pos[3])
    assert ack is not None and not ack.get(0) and ack.get(1)
    rest = cols.slice(4, 6)
    cur.delete_records(rest.ledger_id, rest.entry_id, rest.batch_size, rest.batch_index)
    assert cur.mark_delete_position == pos[5]
    w.close()
    ml.close()


# The calls below are wrong on purpose.
_n: Any = _native


@pytest.mark.parametrize(
    ("call", "name", "match"),
    [
        (lambda: _n.encode_txn_new(-1, 0, 0, 0), "most_bits", "must be >= 0, got -1"),
        (lambda: _n.encode_txn_new(True, 0, 0, 0), "most_bits", "must be an int, not bool"),
        (lambda: _n.encode_txn_new(0, 2**64, 0, 0), "least_bits", r"0\.\.2\*\*64"),
        (lambda: _n.encode_txn_new(0, 0, 0, 1.5), "timeout_ms", "not float"),
        (lambda: _n.encode_txn_new(0, 0, 0, 0, b"c"), "client_name", "must be a str"),
        (lambda: _n.encode_txn_add_partitions(0, 0, 0, "t"), "partitions", "sequence of str"),
        (lambda: _n.encode_txn_add_partitions(0, 0, 0, ["t", 1]), r"partitions\[1\]", "str"),
        (
            lambda: _n.encode_txn_add_subscriptions(0, 0, 0, [("t",)]),
            r"subscriptions\[0\]",
            "tuple",
        ),
        (lambda: _n.encode_txn_update(0, 0, 0, 2**63, 1), "expected_status", r"-2\*\*63"),
        (lambda: _n.encode_txn_update(0, 0, 0, 0, 9), "new_status", "0..4, got 9"),
        (lambda: _n.encode_txn_update(0, 0, -1, 0, 1), "now", ">= 0"),
        (lambda: _n.encode_txn_update(0, 0, 0, 0, 1, 1), "timed_out", "must be a bool, not int"),
        (lambda: _n.fold_txn_entries([b"\x08"], [1], [0], [[-1]], 0), r"deleted\[0\]\[0\]", ">= 0"),
        (lambda: _n.fold_txn_entries([b"\x08"], [1], [0], [[]], -1), "tc_id", ">= 0"),
        (lambda: _n.fold_txn_entries([b"\x08"], [1], [True], [[]], 0), r"entry_id\[0\]", "bool"),
        (lambda: _n.fold_txn_entries(["x"], [1], [0], [[]], 0), r"entries\[0\]", "bytes"),
    ],
)
def test_encoders_and_fold_name_a_bad_argument(call: Any, name: str, match: str) -> None:
    # PyO3 conversions raised bare OverflowError/TypeError (no argument
    # name) and took True for 1.
    with pytest.raises(InvalidArgumentError, match=name) as info:
        call()
    assert info.match(match)


def test_cursor_delete_records_names_a_column_of_the_wrong_dtype(tmp_path: Path) -> None:
    import numpy as np

    ml = ManagedLedger.open(str(tmp_path), log_name(0))
    cur = ml.open_cursor(CURSOR)
    u64, u32 = np.array([1], np.uint64), np.array([1], np.uint32)
    with pytest.raises(
        InvalidArgumentError, match="ledger_id must be a numpy 1-D uint64 array, not a 1-D int64"
    ):
        cur.delete_records(np.array([1]), u64, u32, u32 - 1)
    with pytest.raises(
        InvalidArgumentError, match="batch_index must be a numpy 1-D uint32 array, not list"
    ):
        cur.delete_records(u64, u64, u32, [0])  # type: ignore[arg-type]
    ml.close()
