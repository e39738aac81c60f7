"""Coordinator state machine over an in-memory log (same records and codec)."""

from __future__ import annotations

import threading
import tracemalloc
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import pytest

from tests.reference_fold import fold
from txnstream import TxnPosition, frame, testing
from txnstream.coordinator import (
    CoordinatorConfig,
    RetryPolicy,
    TransactionCoordinator,
    TransactionCoordinators,
    TxnID,
    TxnStatus,
)
from txnstream.coordinator.state import PositionColumns
from txnstream.errors import (
    CoordinatorNotFound,
    InvalidArgumentError,
    InvalidTxnStatusError,
    ParticipantsFailed,
    TransactionAlreadyAborted,
    TransactionAlreadyCommitted,
    TransactionNotFound,
)
from txnstream.proto import Subscription, TransactionMetadataEntry
from txnstream.testing import (
    InMemorySequence,
    InMemoryTerminatedPersistence,
    InMemoryTransactionLog,
    ManualClock,
    RecordingParticipants,
)
from txnstream.timer import TimerService


def wait_for(cond: Callable[[], bool], timeout_ms: int = 30_000) -> None:
    testing.wait_until(cond, timeout_ms)


class Env:
    """A coordinator over in-memory doubles, with manual time (timers run on :meth:`settle`)."""

    def __init__(self, persist_count: int = 0, **cfg: object) -> None:
        self.log = InMemoryTransactionLog()
        self.topic = InMemoryTerminatedPersistence()
        self.clock = ManualClock()
        self.timers = TimerService(self.clock, start=False)
        self.parts = RecordingParticipants()
        self.seq = InMemorySequence()
        self.cfg = CoordinatorConfig(
            transaction_meta_persist_count=persist_count,
            retry=RetryPolicy(initial_backoff_ms=0.1, max_backoff_ms=1),
        ).replace(**cfg)
        self.tc = self.open(self.log)

    def open(self, log: InMemoryTransactionLog) -> TransactionCoordinator:
        return TransactionCoordinator(
            0,
            log,
            config=self.cfg,
            participants=self.parts,
            terminated=self.topic,
            sequence=self.seq,
            clock=self.clock,
            timers=self.timers,
        )

    def restart(self) -> TransactionCoordinator:
        self.tc.close()
        self.log = self.log.reopen()
        self.tc = self.open(self.log)
        return self.tc

    def advance(self, ms: int) -> None:
        """Let ``ms`` pass and run whatever became due, until quiet."""
        self.clock.advance(ms)
        testing.settle(self.tc, self.timers)


@pytest.fixture
def env() -> Iterator[Env]:
    e = Env(persist_count=10)
    yield e
    e.tc.close()


def full_txn(tc: TransactionCoordinator, client: str | None = "c1") -> TxnID:
    txn = tc.new_transaction(timeout_ms=10_000, client_name=client)
    tc.add_produced_partitions(txn, ["out-0", "out-1"])
    tc.add_acked_subscriptions(txn, [("in", "sub")])
    return txn


def test_commit_flow_ends_participants_and_frees_log(env: Env) -> None:
    tc = env.tc
    txn = full_txn(tc)
    assert txn == TxnID(0, 0)
    info = tc.get_transaction(txn)
    assert info.status is TxnStatus.OPEN
    assert info.partitions == ("out-0", "out-1")
    assert info.subscriptions == (("in", "sub"),)
    assert info.log_records == 3
    assert tc.end_transaction(txn, "commit") is TxnStatus.COMMITTED
    for p in env.parts.all():
        assert p.outcomes == {txn: True}
    assert env.log.live_entries() == 0
    assert tc.get_transaction(txn).status is TxnStatus.COMMITTED  # from the store
    assert tc.stats()["committed"] == 1


def test_abort_flow(env: Env) -> None:
    txn = full_txn(env.tc)
    assert env.tc.end_transaction(txn, "ABORT") is TxnStatus.ABORTED
    assert env.parts.partition("out-0").outcomes == {txn: False}
    assert env.log.live_entries() == 0


def test_ids_grow_and_belong_to_coordinator(env: Env) -> None:
    ids = [env.tc.new_transaction() for _ in range(5)]
    assert [i.least_bits for i in ids] == [0, 1, 2, 3, 4]
    with pytest.raises(CoordinatorNotFound, match="coordinator 7"):
        env.tc.get_transaction(TxnID(7, 1))


def test_duplicate_adds_write_nothing(env: Env) -> None:
    txn = env.tc.new_transaction()
    env.tc.add_produced_partitions(txn, ["a", "a", "b"])
    env.tc.add_produced_partitions(txn, ["b", "a"])
    env.tc.add_acked_subscriptions(txn, [Subscription(topic="t", subscription="s")])
    env.tc.add_acked_subscriptions(txn, [("t", "s")])
    info = env.tc.get_transaction(txn)
    assert info.partitions == ("a", "b")
    assert info.log_records == 3


@pytest.mark.parametrize(
    ("call", "arg"),
    [
        ("add_produced_partitions", [""]),
        ("add_produced_partitions", [3]),
        ("add_acked_subscriptions", [("t",)]),
        ("add_acked_subscriptions", [("t", "")]),
        ("end_transaction", "rollback"),
    ],
)
def test_bad_input_is_typed(env: Env, call: str, arg: object) -> None:
    txn = env.tc.new_transaction()
    with pytest.raises(InvalidArgumentError):
        getattr(env.tc, call)(txn, arg)
    assert env.tc.get_transaction(txn).log_records == 1


@pytest.mark.parametrize("timeout", [0, -5, 1.5, True, 10**15])
def test_bad_timeout(env: Env, timeout: object) -> None:
    with pytest.raises(InvalidArgumentError, match="timeout_ms"):
        env.tc.new_transaction(timeout_ms=timeout)  # type: ignore[arg-type]


def test_not_found_and_bad_id(env: Env) -> None:
    with pytest.raises(TransactionNotFound, match=r"\(0,42\)"):
        env.tc.end_transaction(TxnID(0, 42), "commit")
    with pytest.raises(TransactionNotFound):
        env.tc.add_produced_partitions(TxnID(0, 42), ["p"])
    with pytest.raises(InvalidArgumentError):
        env.tc.get_transaction((0, 1))  # type: ignore[arg-type]


def test_adds_require_open(env: Env) -> None:
    txn = full_txn(env.tc)
    env.tc.end_transaction(txn, "commit")
    with pytest.raises(InvalidTxnStatusError, match="COMMITTED"):
        env.tc.add_produced_partitions(txn, ["x"])


def test_idempotent_end_and_opposite_errors() -> None:
    e = Env(persist_count=10)
    txn = full_txn(e.tc)
    assert e.tc.commit(txn) is TxnStatus.COMMITTED
    assert e.tc.commit(txn) is TxnStatus.COMMITTED
    with pytest.raises(TransactionAlreadyCommitted):
        e.tc.abort(txn)
    other = full_txn(e.tc)
    e.tc.abort(other)
    assert e.tc.abort(other) is TxnStatus.ABORTED
    with pytest.raises(TransactionAlreadyAborted) as err:
        e.tc.commit(other)
    assert err.value.details["timed_out"] is False
    # Survives a restart.
    tc = e.restart()
    assert tc.commit(txn) is TxnStatus.COMMITTED
    with pytest.raises(TransactionAlreadyAborted):
        tc.commit(other)
    # Participants are not called again for a remembered end.
    assert len(e.parts.partition("out-0").calls) == 2
    tc.close()


def test_store_off_second_end_is_not_found() -> None:
    e = Env(persist_count=0)
    txn = full_txn(e.tc)
    e.tc.commit(txn)
    with pytest.raises(TransactionNotFound):
        e.tc.commit(txn)
    e.tc.close()


def test_no_client_name_not_remembered(env: Env) -> None:
    txn = full_txn(env.tc, client=None)
    env.tc.commit(txn)
    with pytest.raises(TransactionNotFound):
        env.tc.commit(txn)


def test_timeout_aborts_and_commit_learns_it(env: Env) -> None:
    txn = full_txn(env.tc)
    env.advance(9_999)
    assert env.tc.get_transaction(txn).status is TxnStatus.OPEN
    env.advance(1)
    info = env.tc.get_transaction(txn)
    assert info.status is TxnStatus.ABORTED
    assert info.timed_out
    with pytest.raises(TransactionAlreadyAborted) as err:
        env.tc.commit(txn)
    assert err.value.details["timed_out"] is True
    assert env.tc.abort(txn) is TxnStatus.ABORTED
    assert env.tc.stats()["timed_out"] == 1
    assert env.parts.partition("out-0").outcomes == {txn: False}


def test_commit_racing_the_timeout_abort_is_answered_at_once_store_off() -> None:
    """A commit arriving while the timeout's abort runs learns at once it was aborted."""
    e = Env(persist_count=0)
    txn = full_txn(e.tc)
    gate = threading.Event()
    entered = threading.Event()

    def block(t: TxnID, commit: bool) -> None:
        entered.set()
        gate.wait(30)

    e.parts.partition("out-0").hook = block
    e.clock.advance(10_000)
    assert e.timers.run_due() == 1  # the timeout's abort starts on a pool thread
    assert entered.wait(30)
    assert e.tc.get_transaction(txn).status is TxnStatus.ABORTING
    # The abort is still running (held in a participant), yet the commit is
    # answered now, without waiting for it.
    with pytest.raises(TransactionAlreadyAborted) as err:
        e.tc.commit(txn)
    assert err.value.details["timed_out"] is True
    assert not gate.is_set()
    gate.set()
    testing.settle(e.tc, e.timers)
    assert e.tc.stats()["live"] == 0
    e.tc.close()


def test_timeout_after_commit_started_does_nothing(env: Env) -> None:
    txn = full_txn(env.tc)
    gate = threading.Event()
    entered = threading.Event()

    def block(t: TxnID, commit: bool) -> None:
        entered.set()
        gate.wait(10)

    env.parts.partition("out-0").hook = block
    th = threading.Thread(target=env.tc.commit, args=(txn,))
    th.start()
    assert entered.wait(10)
    env.clock.advance(20_000)
    assert env.timers.run_due() == 0  # claiming the commit cancelled the timer
    # A timer that fired just before the claim still runs its handler: it
    # returns (without waiting for the commit) and changes nothing.
    testing.fire_timeout(env.tc, txn)
    info = env.tc.get_transaction(txn)
    assert (info.status, info.timed_out) == (TxnStatus.COMMITTING, False)
    gate.set()
    th.join(10)
    assert env.tc.get_transaction(txn).status is TxnStatus.COMMITTED
    assert not env.tc.get_transaction(txn).timed_out
    assert env.parts.subscription("in", "sub").outcomes == {txn: True}


def test_transient_failures_are_retried(env: Env) -> None:
    txn = full_txn(env.tc)
    env.parts.partition("out-1").fail_next(5)
    env.parts.subscription("in", "sub").fail_next(2)
    assert env.tc.commit(txn) is TxnStatus.COMMITTED
    assert env.parts.partition("out-1").failures == 5
    assert len(env.parts.partition("out-0").calls) == 1  # only failed ones retried


def test_exhausted_retries_leave_txn_ending_and_retry_finishes() -> None:
    e = Env(persist_count=5, retry=RetryPolicy(initial_backoff_ms=0, max_attempts=2))
    txn = full_txn(e.tc)
    e.parts.partition("out-0").fail_next(3)
    with pytest.raises(ParticipantsFailed) as err:
        e.tc.commit(txn)
    assert err.value.outcome is TxnStatus.COMMITTED
    assert e.tc.get_transaction(txn).status is TxnStatus.COMMITTING
    with pytest.raises(TransactionAlreadyCommitted):
        e.tc.abort(txn)  # the outcome is decided: answered at once
    # The background finishes the commit (one attempt per run, with backoff).
    for _ in range(5):
        e.advance(60_000)
    assert e.tc.get_transaction(txn).status is TxnStatus.COMMITTED
    assert e.parts.partition("out-0").outcomes == {txn: True}
    e.tc.close()


def test_admin_abort_and_listing(env: Env) -> None:
    a = full_txn(env.tc)
    env.clock.advance(5_000)
    b = env.tc.new_transaction(timeout_ms=60_000)
    assert [i.txn_id for i in env.tc.list_transactions()] == [a, b]
    assert [i.txn_id for i in env.tc.slow_transactions(4_000)] == [a]
    assert env.tc.force_abort(a) is TxnStatus.ABORTED
    assert [i.txn_id for i in env.tc.list_transactions(TxnStatus.OPEN)] == [b]
    stats = env.tc.stats()
    assert stats["open"] == 1
    assert stats["aborted"] == 1


def test_low_water_mark(env: Env) -> None:
    tc = env.tc
    assert tc.low_water_mark() == -1
    ids = [tc.new_transaction() for _ in range(4)]
    assert tc.low_water_mark() == -1
    tc.commit(ids[1])
    assert tc.low_water_mark() == -1
    tc.abort(ids[0])
    assert tc.low_water_mark() == 1
    tc.commit(ids[3])
    assert tc.low_water_mark() == 1
    tc.commit(ids[2])
    assert tc.low_water_mark() == 3
    tc2 = env.restart()
    # The sequence never goes back (reserved mark), so nothing at or below the LWM reappears.
    lwm = tc2.low_water_mark()
    assert lwm >= 3
    assert tc2.new_transaction().least_bits == lwm + 1


def test_recovery_rebuilds_open_and_finishes_ending() -> None:
    e = Env(persist_count=10)
    open_txn = full_txn(e.tc)
    committing = full_txn(e.tc, client="c2")
    hold = threading.Event()
    entered = threading.Event()

    def stop(t: TxnID, commit: bool) -> None:
        if t == committing:
            entered.set()
            hold.wait(10)
            raise RuntimeError("crash")

    e.parts.partition("out-0").hook = stop
    outcome: list[BaseException] = []

    def commit() -> None:
        try:
            e.tc.commit(committing)
        except BaseException as exc:
            outcome.append(exc)

    th = threading.Thread(target=commit)
    th.start()
    assert entered.wait(10)
    # "Crash" while the commit is stuck after COMMITTING was logged: close()
    # stops the participant retries and waits for the end in flight.
    closer = threading.Thread(target=e.tc.close)
    closer.start()
    testing.wait_closed(e.tc)
    hold.set()
    th.join(30)
    closer.join(30)
    assert len(outcome) == 1
    assert isinstance(outcome[0], ParticipantsFailed)
    e.parts = RecordingParticipants()
    log2 = e.log.reopen()
    tc2 = e.open(log2)
    info = tc2.get_transaction(open_txn)
    assert info.status is TxnStatus.OPEN
    assert info.partitions == ("out-0", "out-1")
    assert info.subscriptions == (
        (
            "in",
            "sub",
        ),
    )
    assert tc2.commit(committing) is TxnStatus.COMMITTED
    assert tc2.recovery["ending"] == 1
    assert tc2.commit(open_txn) is TxnStatus.COMMITTED
    assert tc2.new_transaction().least_bits > committing.least_bits
    assert log2.live_entries() == 1
    assert e.parts.partition("out-0").outcomes == {committing: True, open_txn: True}
    tc2.close()


def test_recovery_rearms_timeouts() -> None:
    e = Env()
    txn = e.tc.new_transaction(timeout_ms=1_000)
    e.clock.advance(5_000)
    tc = e.restart()
    e.advance(0)  # its deadline passed while it was down: it fires at once
    assert txn not in [i.txn_id for i in tc.list_transactions()]
    assert tc.stats()["timed_out"] == 1
    tc.close()


def rec(op: Any, seq: int, **kw: Any) -> bytes:
    return TransactionMetadataEntry(
        metadata_op=op,
        txnid_least_bits=seq,
        txnid_most_bits=0,
        **kw,
    ).SerializeToString()


def test_replay_mixed_batched_and_unbatched() -> None:
    log = InMemoryTransactionLog()
    n, ap, asub, up = 0, 1, 2, 3
    log.write(rec(n, 0, timeout_ms=100, start_time=5, max_local_txn_id=0, client_name="x"))
    f = log.write_many(
        [
            rec(n, 1, timeout_ms=200, start_time=6, max_local_txn_id=1),
            rec(ap, 0, partitions=["p0", "p1"]),
            rec(n, 2, timeout_ms=300, start_time=7, max_local_txn_id=2),
        ]
    )
    log.write(rec(asub, 1, subscriptions=[Subscription(topic="t", subscription="s")]))
    log.write_many([rec(up, 1, new_status=1), rec(up, 2, new_status=3), rec(up, 2, new_status=4)])
    assert frame.is_batched(log.entries()[1] or b"")
    assert not frame.is_batched(log.entries()[0] or b"")
    # Delete one batch index of the batched entry (txn 2's NEW is gone: txn 2 ended).
    log.delete(PositionColumns.from_positions([f[2].result()]))
    r = fold(log, 0)
    assert [t.seq for t in r.txns] == [0, 1]
    t0, t1 = r.txns
    assert t0.status is TxnStatus.OPEN
    assert t0.client_name == "x"
    assert t0.partitions == ["p0", "p1"]
    assert t0.timeout_ms == 100
    assert t1.status is TxnStatus.COMMITTING
    assert t1.subscriptions == [("t", "s")]
    assert t1.client_name is None
    assert r.max_seq == 2
    assert len(r.purge) == 2  # txn 2's two UPDATE records
    assert {(p.entry_id, p.batch_index) for p in t1.positions} == {(1, 0), (2, 0), (3, 0)}


def test_many_threads_invariants(env: Env) -> None:
    errors: list[BaseException] = []
    results: dict[TxnID, TxnStatus] = {}
    lock = threading.Lock()

    def worker(k: int) -> None:
        try:
            for i in range(50):
                txn = env.tc.new_transaction(client_name=f"w{k}")
                env.tc.add_produced_partitions(txn, [f"p{i % 3}"])
                env.tc.add_acked_subscriptions(txn, [("in", f"s{k % 2}")])
                action = "commit" if (i + k) % 3 else "abort"
                st = env.tc.end_transaction(txn, action)
                with lock:
                    results[txn] = st
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(16)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert len(results) == 800
    assert len({t.least_bits for t in results}) == 800
    for p in env.parts.all():
        assert p.conflicts == []
        for txn, commit in p.outcomes.items():
            assert (results[txn] is TxnStatus.COMMITTED) == commit
    assert env.log.live_entries() == 0
    assert env.tc.low_water_mark() == 799
    assert len(env.tc.store) == 16 * 10


class DiscardingLog(InMemoryTransactionLog):
    """Acknowledges writes without keeping them: measures coordinator state alone."""

    def write(self, record: bytes) -> Future[TxnPosition]:
        self._n = getattr(self, "_n", 0) + 1
        return self._done(TxnPosition(0, self._n, 1, 0))

    def write_sync(self, record: bytes, timeout_ms: int | None = None) -> TxnPosition:
        return self.write(record).result()


def test_memory_per_open_transaction_is_small() -> None:
    e = Env()
    e.tc.close()
    tc = e.open(DiscardingLog())
    for _ in range(200):
        full_txn(tc)  # warm up allocator and caches
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    n = 2_000
    for _ in range(n):
        txn = tc.new_transaction(timeout_ms=10_000, client_name="client-1")
        tc.add_produced_partitions(txn, ["out-0"])
        tc.add_acked_subscriptions(txn, [("in", "sub")])
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    per_txn = sum(s.size_diff for s in after.compare_to(before, "filename")) / n
    assert tc.stats()["open"] == n + 200
    assert per_txn <= 1024, per_txn
    tc.close()


def test_several_coordinators_route_by_most_bits() -> None:
    envs = [Env(persist_count=5) for _ in range(3)]
    for e in envs:
        e.tc.close()
    tcs = [
        TransactionCoordinator(i, e.log.reopen(), config=e.cfg, participants=e.parts, clock=e.clock)
        for i, e in enumerate(envs)
    ]
    group = TransactionCoordinators(tcs)
    ids = [group.new_transaction(client_name="c") for _ in range(6)]
    assert [i.most_bits for i in ids] == [0, 1, 2, 0, 1, 2]
    assert [i.least_bits for i in ids] == [0, 0, 0, 1, 1, 1]
    for i in ids:
        group.add_produced_partitions(i, ["p"])
    assert group.end_transaction(ids[1], "commit") is TxnStatus.COMMITTED
    assert envs[1].parts.partition("p").outcomes == {ids[1]: True}
    assert envs[0].parts.all() == []
    assert group.low_water_marks() == {0: -1, 1: 0, 2: -1}
    with pytest.raises(CoordinatorNotFound):
        group.get_transaction(TxnID(9, 0))
    group.close()


def test_concurrent_same_ends_all_get_the_outcome_store_off() -> None:
    """Ends waiting for another thread's end of the same transaction get its outcome."""
    e = Env(persist_count=0)
    txn = full_txn(e.tc)
    gate, entered = threading.Event(), threading.Event()

    def hold(t: TxnID, commit: bool) -> None:
        entered.set()
        gate.wait(30)

    e.parts.partition("out-0").hook = hold
    got: list[object] = []
    lock = threading.Lock()

    def commit() -> None:
        try:
            status: object = e.tc.commit(txn)
        except BaseException as exc:
            status = exc
        with lock:
            got.append(status)

    threads = [threading.Thread(target=commit) for _ in range(3)]
    for th in threads:
        th.start()
    assert entered.wait(30)
    gate.set()
    for th in threads:
        th.join(30)
    assert got == [TxnStatus.COMMITTED] * 3
    e.tc.close()
