"""Storage-free parts of the coordinator: ids, the transition table, participants."""

from __future__ import annotations

import itertools
import pickle
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from txnstream.coordinator.config import RetryPolicy
from txnstream.coordinator.ending import end_participants
from txnstream.coordinator.metadata import (
    TxnAction,
    TxnID,
    TxnStatus,
    can_transition,
    check_transition,
)
from txnstream.errors import InvalidArgumentError, InvalidTxnStatusError, ParticipantsFailed
from txnstream.proto import TxnStatus as ProtoStatus
from txnstream.testing import ManualClock, RecordingParticipants

S = TxnStatus


def test_txn_id_value_semantics() -> None:
    a, b, c = TxnID(0, 5), TxnID(0, 5), TxnID(1, 0)
    assert a == b
    assert hash(a) == hash(b)
    assert a is not b
    assert a < c
    assert c > a
    assert a <= b
    assert b >= a
    assert sorted([c, TxnID(0, 7), a]) == [a, TxnID(0, 7), c]
    assert str(a) == "(0,5)"
    assert TxnID.parse("(0,5)") == a
    assert pickle.loads(pickle.dumps(c)) == c
    with pytest.raises(AttributeError):
        a.least_bits = 3
    assert {a: 1}[b] == 1


@pytest.mark.parametrize("bad", [-1, 1 << 64, 1.5, "3", True])
def test_txn_id_rejects_bad_parts(bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match="least_bits"):
        TxnID(0, bad)  # type: ignore[arg-type]


def test_txn_id_parse_rejects_garbage() -> None:
    with pytest.raises(InvalidArgumentError, match="nope"):
        TxnID.parse("nope")


def test_status_values_match_proto() -> None:
    for s in TxnStatus:
        assert ProtoStatus.Value(s.name) == s.value


ALLOWED = {
    (S.OPEN, S.OPEN),
    (S.OPEN, S.COMMITTING),
    (S.OPEN, S.ABORTING),
    (S.COMMITTING, S.COMMITTING),
    (S.COMMITTING, S.COMMITTED),
    (S.COMMITTED, S.COMMITTED),
    (S.ABORTING, S.ABORTING),
    (S.ABORTING, S.ABORTED),
    (S.ABORTED, S.ABORTED),
}


@pytest.mark.parametrize(("cur", "new"), list(itertools.product(TxnStatus, TxnStatus)))
def test_full_transition_table(cur: TxnStatus, new: TxnStatus) -> None:
    allowed = (cur, new) in ALLOWED
    assert can_transition(cur, new) is allowed
    if allowed:
        assert check_transition(TxnID(0, 1), cur, new) is (cur != new)
    else:
        with pytest.raises(InvalidTxnStatusError) as err:
            check_transition(TxnID(0, 1), cur, new)
        assert cur.name in str(err.value)
        assert new.name in str(err.value)
        assert err.value.details["current"] is cur
        assert err.value.details["requested"] is new


def test_action_parse() -> None:
    assert TxnAction.parse("COMMIT") is TxnAction.COMMIT
    assert TxnAction.parse(TxnAction.ABORT) is TxnAction.ABORT
    assert TxnAction.COMMIT.ending_status is S.COMMITTING
    assert TxnAction.ABORT.final_status is S.ABORTED
    with pytest.raises(InvalidArgumentError, match="'rollback'"):
        TxnAction.parse("rollback")


def _end(res: object, clock: ManualClock, policy: RetryPolicy, **kw: Any) -> int:
    args: dict[str, Any] = {
        "policy": policy,
        "clock": clock,
        "deadline_ms": clock.monotonic_ms() + 60_000,
        "stop": threading.Event(),
    }
    args.update(kw)
    txn, commit, parts, subs = args.pop("call")
    return end_participants(txn, commit, parts, subs, res, **args)  # type: ignore[arg-type]


def test_end_participants_retries_only_failed_ones() -> None:
    res = RecordingParticipants()
    res.partition("p1").fail_next(3)
    clock = ManualClock(monotonic_ms=0)
    call = (TxnID(0, 1), True, ["p1", "p2"], [("t", "s")])
    retries = _end(res, clock, RetryPolicy(initial_backoff_ms=10, max_backoff_ms=25), call=call)
    assert retries == 3
    assert clock.monotonic_ms() == 10 + 20 + 25  # capped exponential backoff, waited on the clock
    assert len(res.partition("p1").calls) == 4
    assert len(res.partition("p2").calls) == 1
    assert res.subscription("t", "s").outcomes == {TxnID(0, 1): True}


def test_end_participants_gives_up_after_max_attempts_or_the_deadline() -> None:
    res = RecordingParticipants()
    res.subscription("t", "s").fail_next(10)
    clock = ManualClock(monotonic_ms=0)
    call: tuple[Any, ...] = (TxnID(0, 2), False, [], [("t", "s")])
    with pytest.raises(ParticipantsFailed, match="t/s") as err:
        _end(res, clock, RetryPolicy(initial_backoff_ms=0, max_attempts=3), call=call)
    assert len(err.value.details["failures"]) == 1
    assert err.value.outcome is S.ABORTED and err.value.retriable
    assert len(res.subscription("t", "s").calls) == 3
    res.subscription("t", "s").fail_next(10**6)
    with pytest.raises(ParticipantsFailed):
        _end(res, clock, RetryPolicy(initial_backoff_ms=20), call=call, deadline_ms=300)
    assert clock.monotonic_ms() >= 300  # it retried until the deadline, not forever


class FutureParticipant:
    """Answers with a future, completed (or failed) by the test: a durable marker write."""

    def __init__(self, fail: int = 0, answer: bool = True) -> None:
        self.fail = fail
        self.answer = answer
        self.calls = 0

    def end(self, txn_id: TxnID, commit: bool) -> Future[None]:
        self.calls += 1
        fut: Future[None] = Future()
        if not self.answer:
            return fut  # never completes
        if self.fail:
            self.fail -= 1
            fut.set_exception(OSError("marker write failed"))
        else:
            fut.set_result(None)
        return fut


class FutureResolver:
    def __init__(self, parts: dict[str, FutureParticipant]) -> None:
        self.parts = parts

    def partition(self, name: str) -> FutureParticipant:
        return self.parts[name]

    def subscription(self, topic: str, subscription: str) -> FutureParticipant:
        return self.parts[f"{topic}/{subscription}"]


def test_participants_may_answer_with_futures() -> None:
    parts = {"a": FutureParticipant(), "b": FutureParticipant(fail=2), "t/s": FutureParticipant()}
    clock = ManualClock(monotonic_ms=0)
    call = (TxnID(0, 3), True, ["a", "b"], [("t", "s")])
    assert _end(FutureResolver(parts), clock, RetryPolicy(initial_backoff_ms=1), call=call) == 2
    assert [p.calls for p in parts.values()] == [1, 3, 1]
    # A participant whose future never completes fails the end at the deadline.
    parts["a"] = FutureParticipant(answer=False)
    with pytest.raises(ParticipantsFailed, match="partition a"):
        _end(FutureResolver(parts), clock, RetryPolicy(), call=call, deadline_ms=100)


def test_recording_participant_detects_conflicting_outcome() -> None:
    res = RecordingParticipants()
    p = res.partition("x")
    p.end(TxnID(0, 1), True)
    p.end(TxnID(0, 1), True)
    assert p.conflicts == []
    p.end(TxnID(0, 1), False)
    assert p.conflicts == [(TxnID(0, 1), False)]


def test_retry_policy_validation() -> None:
    with pytest.raises(InvalidArgumentError):
        RetryPolicy(initial_backoff_ms=10, max_backoff_ms=1)
    with pytest.raises(InvalidArgumentError):
        RetryPolicy(multiplier=0.5)
    with pytest.raises(InvalidArgumentError):
        RetryPolicy(max_attempts=0)


def test_config_from_broker_config_and_validation() -> None:
    from txnstream.config import BrokerConfig
    from txnstream.coordinator import CoordinatorConfig
    from txnstream.errors import ConfigError

    broker = BrokerConfig.from_dict(
        {
            "transactionLogBatchedWriteEnabled": True,
            "transactionLogBatchedWriteMaxRecords": 100,
            "transactionMetaPersistCount": 7,
            "TransactionMetaPersistTimeInHour": 2,
        }
    )
    cfg = CoordinatorConfig.from_broker_config(broker)
    assert cfg.batched_write_enabled
    assert cfg.batched_write_max_records == 100
    assert cfg.transaction_meta_persist_count == 7
    assert cfg.persist_time_ms == 2 * 3_600_000
    with pytest.raises(ConfigError, match="-3"):
        CoordinatorConfig(transaction_meta_persist_count=-3)
    with pytest.raises(ConfigError, match="nope"):
        CoordinatorConfig().replace(nope=1)
    bad = BrokerConfig.from_dict({"transactionMetaPersistCount": "many"})
    with pytest.raises(ConfigError, match="many"):
        CoordinatorConfig.from_broker_config(bad)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), 1e-12, 0, -1])
@pytest.mark.parametrize(
    "key",
    ["transaction_meta_persist_time_in_hour", "transaction_meta_expire_check_interval_in_second"],
)
def test_config_rejects_non_finite_durations(key: str, bad: float) -> None:
    from txnstream.coordinator import CoordinatorConfig
    from txnstream.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        CoordinatorConfig().replace(**{key: bad})
    assert err.value.details["key"] == key
    assert err.value.details["value"] == str(bad)


def test_batched_write_has_one_definition() -> None:
    from txnstream.config import BatchedWriteConfig, BrokerConfig
    from txnstream.coordinator import CoordinatorConfig
    from txnstream.errors import ConfigError

    cfg = CoordinatorConfig()
    # Pulsar's default: transactionLogBatchedWriteEnabled=false, same object type as the broker's.
    assert cfg.batched_write == BatchedWriteConfig() == BrokerConfig().transaction_log_batched_write
    assert not cfg.batched_write_enabled
    on = cfg.replace(batched_write_enabled=True, batched_write_max_records=64)
    assert on.batched_write == BatchedWriteConfig(enabled=True, max_records=64)
    with pytest.raises(ConfigError) as err:
        cfg.replace(batched_write_max_records=0)
    assert err.value.details["key"] == "batched_write_max_records"
    with pytest.raises(ConfigError, match="nan"):
        cfg.replace(batched_write_max_delay_ms=float("nan"))
    with pytest.raises(ConfigError, match="batched_write"):
        CoordinatorConfig(batched_write={"enabled": True})  # type: ignore[arg-type]


def test_sequence_file_fsyncs_every_directory_it_creates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mark must survive power loss: each created directory's parent is fsynced."""
    import os

    from txnstream.coordinator.state import SequenceFile

    opened: dict[int, str] = {}
    synced: list[str] = []
    real_open, real_fsync = os.open, os.fsync

    def spy_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        fd = real_open(path, flags, *args, **kwargs)
        opened[fd] = os.fspath(path)
        return fd

    def spy_fsync(fd: int) -> None:
        synced.append(opened.get(fd, "?"))
        real_fsync(fd)

    monkeypatch.setattr(os, "open", spy_open)
    monkeypatch.setattr(os, "fsync", spy_fsync)
    data = tmp_path / "fresh" / "data"
    seq = SequenceFile(data, 3)
    created = [data.parent, data, data / "coordinators", data / "coordinators" / "3"]
    assert [str(d.parent) for d in created] == synced  # parents, outermost first
    synced.clear()
    seq.store(42)
    assert synced == [str(data / "coordinators" / "3" / "max_local_txn_id.tmp"), str(seq.dir)]
    synced.clear()
    SequenceFile(data, 3)  # nothing new to create, nothing to sync
    assert synced == []
    assert SequenceFile(data, 3).load() == 42


def test_public_api_is_exported_with_docstrings() -> None:
    import inspect

    import txnstream as root
    import txnstream.coordinator as pkg
    from txnstream import testing

    for name in ("AsyncCoordinator", "LedgerTransactionLog", "TxnAction", "RetryPolicy"):
        assert name in pkg.__all__
    # Test doubles and hooks are not part of the public API.
    for module in (root, pkg):
        for name in module.__all__:
            assert not name.startswith(("InMemory", "Recording", "_")), name
            assert name != "STEPS"
    for module in (pkg, testing):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                assert (obj.__doc__ or "").strip(), name
    assert pkg.AsyncCoordinator.end_transaction.__doc__
    assert pkg.TransactionCoordinator.force_abort.__doc__
