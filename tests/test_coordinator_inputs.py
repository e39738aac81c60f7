"""Bad input to the coordinator: typed errors naming the value, before any side effect."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from txnstream import testing
from txnstream.coordinator import (
    TransactionCoordinator,
    TransactionCoordinators,
    TxnAction,
    TxnID,
    TxnStatus,
)
from txnstream.errors import ConfigError, InvalidArgumentError, TxnStreamError
from txnstream.testing import InMemoryTransactionLog, ManualClock
from txnstream.timer import TimerService


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("tc_id", ["../../x", "0", -1, 1.5, True, None, 2**64])
def test_open_validates_tc_id_before_touching_the_disk(tmp_path: Path, tc_id: object) -> None:
    data = tmp_path / "a" / "b" / "data"
    data.mkdir(parents=True)
    before = tree(tmp_path)
    with pytest.raises(InvalidArgumentError, match="tc_id"):
        TransactionCoordinator.open(data, tc_id, registry=None)  # type: ignore[arg-type]
    assert tree(tmp_path) == before


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sequence_reserve_block": 2**64}, "sequence_reserve_block"),
        ({"end_workers": 0}, "end_workers"),
        ({"no_such_setting": 1}, "no_such_setting"),
        ({"log_options": {"max_entries_per_ledger": -1}}, "max_entries_per_ledger"),
        ({"log_options": "x"}, "log_options"),
        ({"participants": object()}, "participants"),
        ({"clock": 5}, "clock"),
    ],
)
def test_open_validates_every_argument_first(
    tmp_path: Path, kwargs: dict[str, Any], match: str
) -> None:
    before = tree(tmp_path)
    with pytest.raises((InvalidArgumentError, ConfigError), match=match):
        TransactionCoordinator.open(tmp_path, 0, registry=None, **kwargs)
    assert tree(tmp_path) == before


def test_open_rejects_a_directory_that_is_a_file(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(InvalidArgumentError, match="directory"):
        TransactionCoordinator.open(f, 0, registry=None)
    with pytest.raises(InvalidArgumentError, match="directory"):
        TransactionCoordinator.open(42, 0, registry=None)  # type: ignore[arg-type]


@pytest.mark.parametrize("count", [0, -1, True, 2.0, 2**70])
def test_several_coordinators_validate_count(tmp_path: Path, count: object) -> None:
    with pytest.raises(InvalidArgumentError, match="count"):
        TransactionCoordinators.open(tmp_path, count)  # type: ignore[arg-type]
    assert tree(tmp_path) == []


@pytest.mark.parametrize("tc_id", [[1], "0", 1.0, None])
def test_coordinators_get_refuses_a_non_int_id_typed(tmp_path: Path, tc_id: object) -> None:
    tcs = TransactionCoordinators.open(tmp_path, 1, registry=None)
    try:
        with pytest.raises(InvalidArgumentError, match="tc_id"):  # [1] raised TypeError
            tcs.get(tc_id)  # type: ignore[arg-type]
        assert tcs.get(0).tc_id == 0
    finally:
        tcs.close()


@pytest.fixture
def tc() -> Iterator[TransactionCoordinator]:
    coordinator = TransactionCoordinator(0, InMemoryTransactionLog())
    yield coordinator
    coordinator.close()


BAD_CALLS: list[tuple[str, Callable[[TransactionCoordinator, TxnID], Any]]] = [
    ("partitions", lambda tc, t: tc.add_produced_partitions(t, None)),  # type: ignore[arg-type]
    ("partitions", lambda tc, t: tc.add_produced_partitions(t, [None])),  # type: ignore[list-item]
    ("partitions", lambda tc, t: tc.add_produced_partitions(t, ["\udcff"])),
    ("partitions", lambda tc, t: tc.add_produced_partitions_many([(t, 5)])),  # type: ignore[list-item]
    ("subscriptions", lambda tc, t: tc.add_acked_subscriptions(t, None)),  # type: ignore[arg-type]
    ("subscriptions", lambda tc, t: tc.add_acked_subscriptions(t, [("t", "\ud800")])),
    ("items", lambda tc, t: tc.add_acked_subscriptions_many(None)),  # type: ignore[arg-type]
    ("items", lambda tc, t: tc.end_transactions([t])),  # type: ignore[list-item]
    ("action", lambda tc, t: tc.end_transaction(t, None)),  # type: ignore[arg-type]
    ("action", lambda tc, t: tc.end_transaction(t, "rollback")),
    ("txn_id", lambda tc, t: tc.end_transaction((0, 1), "commit")),  # type: ignore[arg-type]
    ("txn_id", lambda tc, t: tc.get_transaction(None)),  # type: ignore[arg-type]
    ("txn_id", lambda tc, t: tc.force_abort("(0,1)")),  # type: ignore[arg-type]
    ("count", lambda tc, t: tc.new_transactions(2**64)),
    ("count", lambda tc, t: tc.new_transactions(-1)),
    ("count", lambda tc, t: tc.new_transactions("3")),  # type: ignore[arg-type]
    ("timeout_ms", lambda tc, t: tc.new_transaction(timeout_ms=2**70)),
    ("timeout_ms", lambda tc, t: tc.new_transaction(timeout_ms=float("nan"))),  # type: ignore[arg-type]
    ("client_name", lambda tc, t: tc.new_transaction(client_name=b"x")),  # type: ignore[arg-type]
    ("client_name", lambda tc, t: tc.new_transaction(client_name="\ud800")),
    ("status", lambda tc, t: tc.list_transactions("OPEN")),  # type: ignore[arg-type]
    ("status", lambda tc, t: tc.list_transactions(9)),
    ("min_age_ms", lambda tc, t: tc.slow_transactions(-1)),
    ("min_age_ms", lambda tc, t: tc.slow_transactions(2**70)),
    ("min_age_ms", lambda tc, t: tc.slow_transactions(None)),  # type: ignore[arg-type]
    ("enabled", lambda tc, t: tc.set_batch_enabled("yes")),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(
    ("name", "call"), BAD_CALLS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(BAD_CALLS)]
)
def test_bad_arguments_raise_typed_errors_naming_them(
    tc: TransactionCoordinator, name: str, call: Callable[[TransactionCoordinator, TxnID], Any]
) -> None:
    txn = tc.new_transaction()
    with pytest.raises(InvalidArgumentError, match=name) as err:
        call(tc, txn)
    assert isinstance(err.value, TxnStreamError)
    info = tc.get_transaction(txn)
    assert (info.status, info.log_records, info.partitions) == (TxnStatus.OPEN, 1, ())
    assert tc.stats()["live"] == 1


def test_list_transactions_accepts_status_values(tc: TransactionCoordinator) -> None:
    a, b = tc.new_transaction(), tc.new_transaction()
    assert [i.txn_id for i in tc.list_transactions(0)] == [a, b]
    assert [i.txn_id for i in tc.list_transactions(TxnStatus.OPEN)] == [a, b]
    assert tc.list_transactions(TxnStatus.COMMITTING) == []


def test_end_transaction_takes_a_txn_action(tc: TransactionCoordinator) -> None:
    a, b = tc.new_transaction(), tc.new_transaction()
    assert tc.end_transaction(a, TxnAction.COMMIT) is TxnStatus.COMMITTED
    assert tc.end_transaction(b, "Abort") is TxnStatus.ABORTED


def test_wall_clock_step_does_not_time_transactions_out() -> None:
    clock = ManualClock()
    timers = TimerService(clock, start=False)
    tc = TransactionCoordinator(0, InMemoryTransactionLog(), clock=clock, timers=timers)
    try:
        txn = tc.new_transaction(timeout_ms=60_000)
        clock.step_wall(24 * 3_600_000)  # NTP steps the wall clock a day ahead
        testing.settle(tc, timers)
        assert tc.get_transaction(txn).status is TxnStatus.OPEN
        clock.step_wall(-48 * 3_600_000)  # ...and two days back
        clock.advance(60_000)  # a minute really passes
        testing.settle(tc, timers)
        assert tc.stats()["timed_out"] == 1
        assert tc.list_transactions() == []
    finally:
        tc.close()


def test_two_coordinators_with_one_id_do_not_replace_each_others_metrics(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    first = TransactionCoordinator.open(tmp_path / "a", 0, registry=registry)
    try:
        before = tree(tmp_path)
        with pytest.raises(InvalidArgumentError, match="coordinator='0'"):
            TransactionCoordinator.open(tmp_path / "b", 0, registry=registry)
        assert tree(tmp_path) == before
        first.new_transaction()
        value = registry.get_sample_value("txnstream_txn_tc_created_total", {"coordinator": "0"})
        assert value == 1
        # A distinct label is accepted.
        with TransactionCoordinator.open(
            tmp_path / "b", 0, registry=registry, metrics_label="b-0"
        ) as second:
            second.new_transactions(2)
            got = registry.get_sample_value(
                "txnstream_txn_tc_created_total", {"coordinator": "b-0"}
            )
            assert got == 2
    finally:
        first.close()
    # Closed: the label is free again.
    TransactionCoordinator.open(tmp_path / "b", 0, registry=registry).close()


def test_sequence_temp_file_does_not_follow_a_planted_symlink(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("precious")
    data = tmp_path / "data"
    mark_dir = data / "coordinators" / "0"
    mark_dir.mkdir(parents=True)
    (mark_dir / "max_local_txn_id.tmp").symlink_to(outside)
    with TransactionCoordinator.open(data, 0, registry=None, sequence_reserve_block=2) as tc:
        for _ in range(5):
            tc.new_transaction()
    assert outside.read_text() == "precious"
    assert not os.path.islink(mark_dir / "max_local_txn_id")
    with TransactionCoordinator.open(data, 0, registry=None) as tc:
        assert tc.new_transaction().least_bits >= 5


def test_terminated_store_off_at_restart_keeps_the_stored_outcomes(tmp_path: Path) -> None:
    with TransactionCoordinator.open(
        tmp_path, 0, registry=None, transaction_meta_persist_count=5
    ) as tc:
        txn = tc.new_transaction(client_name="c")
        tc.commit(txn)
    with TransactionCoordinator.open(tmp_path, 0, registry=None) as tc:  # feature off
        tc.new_transaction()
    with TransactionCoordinator.open(
        tmp_path, 0, registry=None, transaction_meta_persist_count=5
    ) as tc:
        assert tc.commit(txn) is TxnStatus.COMMITTED
