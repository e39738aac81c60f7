"""Coordinator on real files: managed-ledger log, BufferedWriter, compacted store."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from txnstream import ManagedLedger
from txnstream.coordinator import TransactionCoordinator, TxnID, TxnStatus, log_name
from txnstream.coordinator.state import CURSOR
from txnstream.errors import TransactionAlreadyAborted, TransactionNotFound
from txnstream.testing import ManualClock, RecordingParticipants

HOUR = 3_600_000


def full(tc: TransactionCoordinator, client: str | None = "c") -> TxnID:
    txn = tc.new_transaction(timeout_ms=60_000, client_name=client)
    tc.add_produced_partitions(txn, ["out"])
    tc.add_acked_subscriptions(txn, [("in", "sub")])
    return txn


def test_commit_restart_and_idempotent(tmp_path: Path) -> None:
    parts = RecordingParticipants()
    with TransactionCoordinator.open(
        tmp_path, 0, participants=parts, transaction_meta_persist_count=5
    ) as tc:
        a = full(tc)
        b = full(tc)
        open_txn = full(tc)
        assert tc.commit(a) is TxnStatus.COMMITTED
        assert tc.abort(b) is TxnStatus.ABORTED
        assert parts.partition("out").outcomes == {a: True, b: False}
    with TransactionCoordinator.open(
        tmp_path, 0, participants=parts, transaction_meta_persist_count=5
    ) as tc:
        assert tc.commit(a) is TxnStatus.COMMITTED
        with pytest.raises(TransactionAlreadyAborted):
            tc.commit(b)
        info = tc.get_transaction(open_txn)
        assert info.status is TxnStatus.OPEN
        assert info.subscriptions == (("in", "sub"),)
        assert tc.new_transaction().least_bits > open_txn.least_bits
        assert tc.recovery["open"] == 1


def test_sequence_never_goes_back_when_log_is_empty(tmp_path: Path) -> None:
    with TransactionCoordinator.open(tmp_path, 0) as tc:
        last = [tc.commit(t) and t for t in [full(tc, None) for _ in range(5)]][-1]
        assert isinstance(last, TxnID)
    for _ in range(2):
        with TransactionCoordinator.open(tmp_path, 0) as tc:
            nxt = tc.new_transaction()
            assert nxt.least_bits > last.least_bits
            assert tc.low_water_mark() == nxt.least_bits - 1
            tc.abort(nxt)
            last = nxt


def test_mixed_batched_unbatched_log_replays(tmp_path: Path) -> None:
    with TransactionCoordinator.open(tmp_path, 0, batched_write_max_delay_ms=2) as tc:
        keep: list[TxnID] = []
        for i in range(40):
            tc.set_batch_enabled(i % 2 == 0)
            txn = full(tc, None)
            if i % 3:
                tc.end_transaction(txn, "commit" if i % 2 else "abort")
            else:
                keep.append(txn)
        stats = tc.stats()["log"]
    with TransactionCoordinator.open(tmp_path, 0) as tc:
        assert sorted(i.txn_id for i in tc.list_transactions()) == keep
        for txn in keep:
            assert tc.get_transaction(txn).partitions == ("out",)
    assert stats


def test_log_stays_bounded_over_long_run(tmp_path: Path) -> None:
    opts = {"max_entries_per_ledger": 50}
    tc = TransactionCoordinator.open(tmp_path, 0, log_options=opts)
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(250):
                tc.commit(full(tc, None))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert tc.stats()["committed"] == 2_000
    tc.close()
    ml = ManagedLedger.open(str(tmp_path), log_name(0), max_entries_per_ledger=50)
    try:
        # 2000 transactions x 5 records went through; every record was deleted.
        cur = ml.open_cursor(CURSOR)
        cur.rewind()
        assert cur.read_next(10_000) == []
        assert len(ml.ledgers()) <= 3
    finally:
        ml.close()


def test_terminated_store_expires_by_age_across_restart(tmp_path: Path) -> None:
    clock = ManualClock()
    kw = {
        "clock": clock,
        "transaction_meta_persist_count": 3,
        "transaction_meta_persist_time_in_hour": 1,
    }
    with TransactionCoordinator.open(tmp_path, 0, **kw) as tc:  # type: ignore[arg-type]
        old = full(tc)
        tc.commit(old)
        clock.advance(HOUR // 2)
        young = full(tc)
        tc.abort(young)
        by_count = [full(tc, "other") for _ in range(5)]
        for t in by_count:
            tc.commit(t)
        assert tc.get_transaction(by_count[-1]).status is TxnStatus.COMMITTED
        with pytest.raises(TransactionNotFound):
            tc.commit(by_count[0])  # pushed out by count (3 per client)
    clock.advance(HOUR // 2 + 1)
    with TransactionCoordinator.open(tmp_path, 0, **kw) as tc:  # type: ignore[arg-type]
        with pytest.raises(TransactionNotFound):
            tc.commit(old)  # older than 1 h: dropped on restore
        assert tc.abort(young) is TxnStatus.ABORTED
        clock.advance(HOUR)
        assert tc.sweep_terminated() == 4
        with pytest.raises(TransactionNotFound):
            tc.abort(young)
        assert tc.store.clients() == []


def test_log_stats_keep_writer_entries_and_ledger_entries_apart(tmp_path: Path) -> None:
    """``entries`` is the writer's counter; what the ledger holds is ``ledger_entries``."""
    with TransactionCoordinator.open(tmp_path, 0, batched_write_enabled=True) as tc:
        txns = tc.new_transactions(20)  # one batched entry
        for txn in txns[:5]:
            tc.commit(txn)  # 2 unbatched-or-batched entries each
        log = tc.stats()["log"]
        assert log["entries"] >= 1 + 5
        assert log["records"] == 20 + 5 * 2
        assert "ledger_entries" in log
        # Mark-delete cannot pass the open transactions' entry: nothing trimmed yet.
        assert log["ledger_entries"] == log["entries"]
