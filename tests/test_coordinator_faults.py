"""Failures while a transaction changes state: memory changes only after the durable write.

Real managed ledgers with injected ENOSPC/EIO (``txnstream.testing`` fault hooks),
interrupts in flight, dead participants, ``close()`` racing ends, and a many-thread
run on the real ledger with faults injected.
"""

from __future__ import annotations

import errno
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from txnstream import testing
from txnstream.coordinator import (
    TransactionCoordinator,
    TxnID,
    TxnStatus,
)
from txnstream.coordinator.ending import EndTrace
from txnstream.coordinator.state import LedgerTransactionLog
from txnstream.errors import (
    CoordinatorNotFound,
    CorruptEntryError,
    InvalidArgumentError,
    OperationTimeoutError,
    ParticipantsFailed,
    StorageError,
    TransactionAlreadyAborted,
    TransactionAlreadyCommitted,
    TransactionEndPending,
    TransactionError,
    TransactionNotFound,
    TxnStreamError,
)
from txnstream.testing import (
    InMemorySequence,
    InMemoryTerminatedPersistence,
    InMemoryTransactionLog,
    ManualClock,
    RecordingParticipants,
)
from txnstream.timer import TimerService

HOUR = 3_600_000


@pytest.fixture
def tc(tmp_path: Path) -> Iterator[TransactionCoordinator]:
    coordinator = TransactionCoordinator.open(
        tmp_path, 0, registry=None, transaction_meta_persist_count=10
    )
    yield coordinator
    testing.clear_faults(testing.log_ledger(coordinator))
    coordinator.close()


def reopen(tmp_path: Path, **kw: Any) -> TransactionCoordinator:
    kw.setdefault("transaction_meta_persist_count", 10)
    return TransactionCoordinator.open(tmp_path, 0, registry=None, **kw)


# --------------------------------------------------------------- defect 0


@pytest.mark.parametrize("kind", ["sync", "write"])
def test_failed_add_changes_nothing_and_its_retry_writes(
    tc: TransactionCoordinator, tmp_path: Path, kind: str
) -> None:
    txn = tc.new_transaction(timeout_ms=HOUR)
    ml = testing.log_ledger(tc)
    testing.inject_fault(ml, kind, errno=errno.ENOSPC)
    with pytest.raises(StorageError):
        tc.add_produced_partitions(txn, ["out"])
    testing.inject_fault(ml, kind, errno=errno.ENOSPC)
    with pytest.raises(StorageError):
        tc.add_acked_subscriptions(txn, [("in", "sub")])
    info = tc.get_transaction(txn)
    assert (info.partitions, info.subscriptions, info.log_records) == ((), (), 1)
    # The client's retry writes the records (it is not answered from memory).
    tc.add_produced_partitions(txn, ["out"])
    tc.add_acked_subscriptions(txn, [("in", "sub")])
    assert tc.get_transaction(txn).log_records == 3
    tc.close()
    with reopen(tmp_path) as again:
        info = again.get_transaction(txn)
        assert (info.partitions, info.subscriptions) == (("out",), (("in", "sub"),))


def test_failed_bulk_add_changes_nothing(tc: TransactionCoordinator, tmp_path: Path) -> None:
    txns = tc.new_transactions(3, timeout_ms=HOUR)
    testing.inject_fault(testing.log_ledger(tc), "sync", errno=errno.ENOSPC)
    with pytest.raises(StorageError):
        tc.add_produced_partitions_many([(t, ["out"]) for t in txns])
    testing.inject_fault(testing.log_ledger(tc), "sync", errno=errno.ENOSPC)
    with pytest.raises(StorageError):
        tc.add_acked_subscriptions_many([(t, [("in", "s")]) for t in txns])
    assert [tc.get_transaction(t).partitions for t in txns] == [()] * 3
    assert [tc.get_transaction(t).subscriptions for t in txns] == [()] * 3
    assert tc.add_produced_partitions_many([(t, ["out"]) for t in txns]) == [None] * 3
    tc.close()
    with reopen(tmp_path) as again:
        assert [again.get_transaction(t).partitions for t in txns] == [("out",)] * 3


def test_failed_new_transaction_leaves_no_ghost(tc: TransactionCoordinator) -> None:
    with pytest.raises(InvalidArgumentError, match="client_name"):
        tc.new_transaction(client_name="\ud800")  # not encodable as UTF-8
    testing.inject_fault(testing.log_ledger(tc), "sync", errno=errno.ENOSPC)
    with pytest.raises(StorageError):
        tc.new_transaction()
    assert tc.list_transactions() == []
    txn = tc.new_transaction()
    assert tc.commit(txn) is TxnStatus.COMMITTED
    # Nothing pins the low-water mark: every id issued so far has ended.
    assert tc.low_water_mark() == txn.least_bits
    assert tc.stats()["live"] == 0


def test_direct_calls_on_a_stalled_log_time_out_typed_and_leave_no_doubt_behind(
    tmp_path: Path,
) -> None:
    """new_transaction and add_* wait at most end_timeout_ms for the disk (they had no bound).

    The NEW record that timed out may still land: that transaction (nobody
    has its id) is aborted; the ADD's names are kept, and its retry works.
    """
    tc = TransactionCoordinator.open(tmp_path, 0, registry=None, end_timeout_ms=300)
    try:
        txn = tc.new_transaction()
        ml = testing.log_ledger(tc)
        testing.hold_fault(ml, "sync")
        try:
            for call in (
                tc.new_transaction,
                lambda: tc.add_produced_partitions(txn, ["p"]),
                lambda: tc.add_acked_subscriptions(txn, [("t", "s")]),
                lambda: tc.new_transactions(2),
                lambda: tc.add_produced_partitions_many([(txn, ["q"])]),
            ):
                started = time.monotonic()
                with pytest.raises(OperationTimeoutError, match="end_timeout_ms") as e:
                    call()
                assert e.value.retriable
                assert time.monotonic() - started < 5  # bounded (a hang guard, not a timing)
        finally:
            testing.release_fault(ml, "sync")
        tc.add_produced_partitions(txn, ["p"])
        # In doubt, the names were kept (ending one that holds nothing is a no-op).
        assert set(tc.get_transaction(txn).partitions) == {"p", "q"}
        assert tc.commit(txn) is TxnStatus.COMMITTED

        def only_txn_left() -> bool:
            return [t.txn_id for t in tc.list_transactions()] == []

        testing.wait_until(only_txn_left)  # the in-doubt NEW ones were aborted
    finally:
        tc.close()


# --------------------------------------------------------------- defect 1


def manual(tmp_path: Path, **kw: Any) -> tuple[TransactionCoordinator, ManualClock, TimerService]:
    clock = ManualClock()
    timers = TimerService(clock, start=False)
    tc = TransactionCoordinator.open(
        tmp_path,
        0,
        registry=None,
        clock=clock,
        timers=timers,
        transaction_meta_persist_count=10,
        **kw,
    )
    return tc, clock, timers


def test_background_end_retries_a_failed_final_record(tmp_path: Path) -> None:
    tc, clock, timers = manual(tmp_path)
    try:
        txn = tc.new_transaction(timeout_ms=1_000, client_name="c")
        tc.add_produced_partitions(txn, ["out"])
        ml = testing.log_ledger(tc)
        armed = [True]

        def hook(step: str, t: TxnID) -> None:
            if step == "terminated_stored" and armed[0]:
                armed[0] = False
                testing.inject_fault(ml, "sync", errno=errno.EIO)

        testing.set_step_hook(tc, hook)
        clock.advance(1_000)
        testing.settle(tc, timers)
        assert not armed[0], "the timeout ran the end"
        assert tc.get_transaction(txn).status is TxnStatus.ABORTING  # final record failed
        assert tc.low_water_mark() == txn.least_bits - 1
        clock.advance(60_000)  # past any backoff
        testing.settle(tc, timers)
        info = tc.get_transaction(txn)
        assert (info.status, info.timed_out) == (TxnStatus.ABORTED, True)
        assert tc.low_water_mark() == txn.least_bits
    finally:
        tc.close()


def in_memory(**kw: Any) -> tuple[TransactionCoordinator, ManualClock, TimerService]:
    """A coordinator over in-memory doubles on manual time (timers run on settle)."""
    clock = ManualClock()
    timers = TimerService(clock, start=False)
    kw.setdefault("transaction_meta_persist_count", 10)
    tc = TransactionCoordinator(0, InMemoryTransactionLog(), clock=clock, timers=timers, **kw)
    return tc, clock, timers


def test_background_end_retries_a_failed_store_write() -> None:
    topic = InMemoryTerminatedPersistence()
    tc, clock, timers = in_memory(terminated=topic)
    try:
        txn = tc.new_transaction(timeout_ms=1_000, client_name="c")
        topic.fail_next(1)
        clock.advance(1_000)
        testing.settle(tc, timers)
        assert tc.get_transaction(txn).status is TxnStatus.ABORTING
        clock.advance(60_000)
        testing.settle(tc, timers)
        assert tc.get_transaction(txn).status is TxnStatus.ABORTED
        assert tc.stats()["live"] == 0
    finally:
        tc.close()


# --------------------------------------------------------------- defect 2


def test_cleanup_failure_after_the_final_record_still_answers_the_outcome(
    tc: TransactionCoordinator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    txn = tc.new_transaction(client_name="c")
    tc.add_produced_partitions(txn, ["out"])

    def broken(self: object, *args: object) -> None:
        raise StorageError("cursor deletes failed", errno=errno.EIO)

    monkeypatch.setattr(LedgerTransactionLog, "delete", broken)
    assert tc.commit(txn) is TxnStatus.COMMITTED
    assert tc.commit(txn) is TxnStatus.COMMITTED
    monkeypatch.undo()
    tc.close()
    with reopen(tmp_path) as again:
        # Recovery purged the records the failed cleanup left behind
        # (NEW, ADD, COMMITTING, COMMITTED).
        assert again.recovery["purged_records"] == 4
        assert again.commit(txn) is TxnStatus.COMMITTED


def test_close_drains_an_end_in_flight_before_closing_the_log(tmp_path: Path) -> None:
    parts = RecordingParticipants()
    tc = reopen(tmp_path, participants=parts)
    txn = tc.new_transaction(client_name="c")
    tc.add_produced_partitions(txn, ["out"])
    gate, entered = threading.Event(), threading.Event()

    def slow(t: TxnID, commit: bool) -> None:
        entered.set()
        assert gate.wait(30)

    parts.partition("out").hook = slow
    got: list[object] = []
    ender = threading.Thread(target=lambda: got.append(_call(tc.commit, txn)))
    ender.start()
    assert entered.wait(30)
    closer = threading.Thread(target=tc.close)
    closer.start()
    # close() stops intake at once...
    testing.wait_closed(tc)
    with pytest.raises(CoordinatorNotFound):
        tc.new_transaction()
    # ...and closes the log only after the end in flight finished.
    gate.set()
    ender.join(30)
    closer.join(30)
    assert not ender.is_alive() and not closer.is_alive()
    assert got == [TxnStatus.COMMITTED]
    with reopen(tmp_path) as again:
        assert again.commit(txn) is TxnStatus.COMMITTED
        assert again.stats()["live"] == 0


def _call(fn: Any, *args: Any) -> object:
    try:
        return fn(*args)
    except BaseException as exc:
        return exc


def test_close_racing_many_ends(tmp_path: Path) -> None:
    """Every end racing close() gets an outcome or a definite refusal; outcomes survive."""
    tc = reopen(tmp_path, participants=RecordingParticipants())
    txns = tc.new_transactions(400, client_name="c")
    answers: dict[TxnID, object] = {}
    lock = threading.Lock()
    start = threading.Barrier(5)

    def worker(k: int) -> None:
        start.wait()
        for txn in txns[k::4]:
            got = _call(tc.end_transaction, txn, "commit" if txn.least_bits % 2 else "abort")
            with lock:
                answers[txn] = got

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    start.wait()
    tc.close()
    for th in threads:
        th.join(60)
        assert not th.is_alive()
    assert len(answers) == len(txns)
    ended = {t: a for t, a in answers.items() if isinstance(a, TxnStatus)}
    for a in answers.values():
        if not isinstance(a, TxnStatus):
            assert isinstance(a, CoordinatorNotFound | TransactionEndPending), repr(a)
    with reopen(tmp_path) as again:
        for txn, status in ended.items():
            assert again.end_transaction(txn, "commit" if txn.least_bits % 2 else "abort") is status


# --------------------------------------------------------------- defect 3


def test_interrupt_after_a_durable_commit_decision_keeps_the_commit(
    tc: TransactionCoordinator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    txn = tc.new_transaction(client_name="c")
    tc.add_produced_partitions(txn, ["out"])
    real = LedgerTransactionLog.write_sync
    calls = [0]

    def interrupted(
        self: LedgerTransactionLog, record: bytes, timeout_ms: int | None = None
    ) -> Any:
        pos = real(self, record, timeout_ms)  # the COMMITTING record is durable...
        calls[0] += 1
        if calls[0] == 1:
            raise KeyboardInterrupt  # ...and then the caller is interrupted
        return pos

    monkeypatch.setattr(LedgerTransactionLog, "write_sync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        tc.commit(txn)
    # The decision may be durable: nothing may revert it to OPEN or abort it.
    with pytest.raises(TransactionAlreadyCommitted):
        tc.abort(txn)
    assert tc.commit(txn) is TxnStatus.COMMITTED
    monkeypatch.undo()
    tc.close()
    with reopen(tmp_path) as again:
        assert again.commit(txn) is TxnStatus.COMMITTED
        with pytest.raises(TransactionAlreadyCommitted):
            again.abort(txn)


def test_a_log_with_both_outcomes_for_one_transaction_is_corrupt() -> None:
    from txnstream._native import encode_txn_new, encode_txn_update

    log = InMemoryTransactionLog()
    log.write_sync(encode_txn_new(0, 7, 1, 1000))
    log.write_sync(encode_txn_update(0, 7, 2, 0, int(TxnStatus.COMMITTING)))
    log.write_sync(encode_txn_update(0, 7, 3, 0, int(TxnStatus.ABORTING)))
    with pytest.raises(CorruptEntryError, match=r"\(0,7\)"):
        TransactionCoordinator(0, log)


def test_updates_fold_in_log_order() -> None:
    from txnstream._native import encode_txn_new, encode_txn_update

    log = InMemoryTransactionLog()
    log.write_sync(encode_txn_new(0, 1, 1, 1000, "c"))
    log.write_sync(encode_txn_update(0, 1, 2, 0, int(TxnStatus.ABORTING), True))
    log.write_sync(encode_txn_update(0, 1, 3, 0, int(TxnStatus.ABORTING)))  # a re-written decision
    with TransactionCoordinator(0, log, transaction_meta_persist_count=10) as tc:
        assert tc.recovery["ending"] == 1
        assert tc.abort(TxnID(0, 1)) is TxnStatus.ABORTED
        with pytest.raises(TransactionAlreadyAborted) as err:
            tc.commit(TxnID(0, 1))
        assert err.value.details["timed_out"]
    bad = InMemoryTransactionLog()
    bad.write_sync(encode_txn_new(0, 2, 1, 1000))
    bad.write_sync(encode_txn_update(0, 2, 2, 1, int(TxnStatus.COMMITTED)))
    bad.write_sync(encode_txn_update(0, 2, 3, 2, int(TxnStatus.COMMITTING)))  # goes back
    with pytest.raises(CorruptEntryError, match="COMMITTED"):
        TransactionCoordinator(0, bad)


# --------------------------------------------------------------- defect 4


def test_sequence_mark_is_raised_only_after_it_is_durable() -> None:
    seq = InMemorySequence()
    log = InMemoryTransactionLog()
    tc = TransactionCoordinator(0, log, sequence=seq, sequence_reserve_block=4)
    issued: list[int] = []
    try:
        for i in range(30):
            if i % 7 == 3:
                seq.fail_next(1)
            try:
                txn = tc.new_transaction()
            except StorageError:
                continue
            # Every id handed out is below the mark that is durable right now.
            assert txn.least_bits < seq.mark
            issued.append(txn.least_bits)
    finally:
        tc.close()
    assert issued == sorted(set(issued))
    # A restart resumes at the durable mark: no id repeats even with an empty log.
    tc = TransactionCoordinator(0, InMemoryTransactionLog(), sequence=seq)
    try:
        assert tc.new_transaction().least_bits > max(issued)
    finally:
        tc.close()


# --------------------------------------------------------------- defect 6


def test_client_end_with_a_dead_participant_has_a_deadline() -> None:
    parts = RecordingParticipants()
    parts.partition("dead").fail_next(10**9)
    tc = TransactionCoordinator(0, InMemoryTransactionLog(), participants=parts, end_timeout_ms=200)
    try:
        txn = tc.new_transaction(client_name="c")
        tc.add_produced_partitions(txn, ["dead"])
        got: list[object] = []
        th = threading.Thread(target=lambda: got.append(_call(tc.commit, txn)))
        th.start()
        th.join(30)
        assert not th.is_alive(), "the client's end must not block forever"
        err = got[0]
        assert isinstance(err, ParticipantsFailed)
        assert err.retriable and err.outcome is TxnStatus.COMMITTED
        assert tc.get_transaction(txn).status is TxnStatus.COMMITTING
        # The decided outcome is answered at once; completion goes on in the background.
        with pytest.raises(TransactionAlreadyCommitted):
            tc.abort(txn)
        parts.partition("dead").fail_next(0)
        testing.wait_until(lambda: tc.stats()["live"] == 0)
        assert parts.partition("dead").outcomes == {txn: True}
    finally:
        tc.close()


def test_opposite_request_on_an_ending_transaction_is_answered_at_once() -> None:
    parts = RecordingParticipants()
    tc = TransactionCoordinator(0, InMemoryTransactionLog(), participants=parts)
    gate, entered = threading.Event(), threading.Event()

    def hold(t: TxnID, commit: bool) -> None:
        entered.set()
        gate.wait(30)

    parts.partition("out").hook = hold
    try:
        txn = tc.new_transaction(client_name="c")
        tc.add_produced_partitions(txn, ["out"])
        committer = threading.Thread(target=tc.commit, args=(txn,))
        committer.start()
        assert entered.wait(30)
        got: list[object] = []
        aborter = threading.Thread(target=lambda: got.append(_call(tc.abort, txn)))
        aborter.start()
        aborter.join(10)
        alive = aborter.is_alive()
        gate.set()
        committer.join(30)
        aborter.join(30)
        assert not alive, "the abort waited for the commit instead of answering"
        assert isinstance(got[0], TransactionAlreadyCommitted)
    finally:
        gate.set()
        tc.close()


# -------------------------------------------------------------- force abort


def test_force_abort_of_a_transaction_stuck_in_committing() -> None:
    parts = RecordingParticipants()
    dead = parts.partition("dead")
    dead.fail_next(10**9)
    tc, _, _ = in_memory(participants=parts, end_timeout_ms=1)
    try:
        stuck = tc.new_transaction(client_name="c")
        tc.add_produced_partitions(stuck, ["dead", "ok"])
        with pytest.raises(ParticipantsFailed):
            tc.commit(stuck)
        assert tc.get_transaction(stuck).status is TxnStatus.COMMITTING
        # Still unreachable: force_abort cannot flip a decided commit and says so.
        with pytest.raises(ParticipantsFailed) as err:
            tc.force_abort(stuck)
        assert err.value.outcome is TxnStatus.COMMITTED
        # Reachable again: force_abort finishes it now, without waiting for the
        # background retry's backoff, as the commit it is.
        dead.fail_next(0)
        assert tc.force_abort(stuck) is TxnStatus.COMMITTED
        assert tc.get_transaction(stuck).status is TxnStatus.COMMITTED
        assert tc.low_water_mark() == stuck.least_bits
        assert all(p.outcomes == {stuck: True} for p in parts.all())
        # An OPEN transaction is aborted; a remembered one reports its outcome.
        other = tc.new_transaction(client_name="c")
        assert tc.force_abort(other) is TxnStatus.ABORTED
        assert tc.force_abort(other) is TxnStatus.ABORTED
        assert tc.force_abort(stuck) is TxnStatus.COMMITTED
        with pytest.raises(TransactionNotFound):
            tc.force_abort(TxnID(0, 999))
    finally:
        tc.close()


# ------------------------------------------------ many threads, real ledger


@pytest.mark.parametrize("batched", [False, True])
def test_many_threads_on_the_real_ledger_with_faults(tmp_path: Path, batched: bool) -> None:
    """Random commits, aborts and timeouts from 12 threads while syncs fail now and then."""
    parts = RecordingParticipants()
    tc = reopen(
        tmp_path,
        participants=parts,
        batched_write_enabled=batched,
        transaction_meta_persist_count=10_000,
    )
    ml = testing.log_ledger(tc)
    acked: dict[TxnID, TxnStatus] = {}
    added: dict[TxnID, set[str]] = {}
    failures: list[BaseException] = []
    lock = threading.Lock()
    stop = threading.Event()

    failed_writes = [0]

    def retry(fn: Any, *args: Any) -> Any:
        for _ in range(1_000):
            try:
                return fn(*args)
            except StorageError:
                with lock:
                    failed_writes[0] += 1
                stop.wait(0.001)
        raise AssertionError("a write kept failing")

    def worker(k: int) -> None:
        rng = random.Random(k)
        try:
            for _ in range(60):
                timeout = 20 if rng.random() < 0.15 else HOUR
                txn = retry(tc.new_transaction, timeout, f"w{k}")
                names = [f"p{rng.randrange(4)}", f"p{rng.randrange(4)}"]
                try:
                    retry(tc.add_produced_partitions, txn, names)
                except TransactionError:
                    continue  # timed out already (short timeouts)
                with lock:
                    added[txn] = set(names)
                action = "commit" if rng.random() < 0.7 else "abort"
                try:
                    status = retry(tc.end_transaction, txn, action)
                except (TransactionAlreadyAborted, TransactionEndPending):
                    continue
                with lock:
                    acked[txn] = status
        except BaseException as exc:
            failures.append(exc)

    def injector() -> None:
        rng = random.Random(99)
        while not stop.wait(0.02):
            testing.inject_fault(ml, rng.choice(["sync", "write"]), errno=errno.ENOSPC)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(12)]
    inj = threading.Thread(target=injector)
    inj.start()
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
        assert not th.is_alive()
    stop.set()
    inj.join()
    testing.clear_faults(ml)
    assert failures == []
    assert acked, "some transactions must have ended"
    assert failed_writes[0] > 0, "the injected faults must have failed some calls"
    testing.wait_until(lambda: tc.stats()["ending"] == 0)
    tc.close()

    for p in parts.all():
        assert p.conflicts == []
    for txn, status in acked.items():
        for name in added[txn]:
            assert parts.partition(name).outcomes[txn] is (status is TxnStatus.COMMITTED)
    parts2 = RecordingParticipants()
    with reopen(tmp_path, participants=parts2, transaction_meta_persist_count=10_000) as again:
        for txn, status in acked.items():
            action = "commit" if status is TxnStatus.COMMITTED else "abort"
            assert again.end_transaction(txn, action) is status
        for txn in added:
            try:
                again.force_abort(txn)
            except TxnStreamError as exc:
                raise AssertionError(f"{txn}: {exc!r}") from exc
        testing.wait_until(lambda: again.stats()["live"] == 0)
        assert again.low_water_mark() == again.stats()["next_seq"] - 1
    for p in parts2.all():
        for txn, commit in p.outcomes.items():
            if txn in acked:
                assert commit is (acked[txn] is TxnStatus.COMMITTED)


def test_a_dead_participant_does_not_hold_the_end_workers(tmp_path: Path) -> None:
    """Background ends stuck on a participant that never answers give their worker back.

    8 transactions time out on a partition that never answers; a healthy
    transaction's timeout must still be aborted promptly. With a 10-minute
    end timeout, each stuck attempt used to hold one of the 4 end workers
    for the whole timeout.
    """
    from concurrent.futures import Future

    from txnstream.coordinator import TransactionCoordinator
    from txnstream.coordinator.ending import Participant
    from txnstream.errors import TxnStreamError

    class Dead:
        def end(self, txn_id: TxnID, commit: bool) -> Future[None] | None:
            return Future()  # never answers

    class Ok:
        def end(self, txn_id: TxnID, commit: bool) -> Future[None] | None:
            return None

    class Resolver:
        def partition(self, name: str) -> Participant:
            return Dead() if name.startswith("dead") else Ok()

        def subscription(self, topic: str, subscription: str) -> Participant:
            return Ok()

    tc = TransactionCoordinator.open(
        tmp_path, 0, registry=None, participants=Resolver(), end_timeout_ms=600_000
    )
    try:
        stuck = [tc.new_transaction(timeout_ms=100) for _ in range(8)]
        for t in stuck:
            tc.add_produced_partitions(t, ["dead-0"])
        time.sleep(0.5)  # their timeout aborts occupy the end workers now
        healthy = tc.new_transaction(timeout_ms=200)
        tc.add_produced_partitions(healthy, ["ok-0"])
        deadline = time.monotonic() + 20.0
        while True:
            try:
                if tc.get_transaction(healthy).status.name != "OPEN":
                    break
            except TxnStreamError:
                break  # ended and gone
            assert time.monotonic() < deadline, "the healthy transaction never timed out"
            time.sleep(0.05)
    finally:
        tc.close()


def test_a_retried_end_does_not_push_a_newer_end_out_of_the_store() -> None:
    """Step 3 of an end that failed, retried after newer ends of its client."""
    topic = InMemoryTerminatedPersistence()
    tc, clock, timers = in_memory(terminated=topic, transaction_meta_persist_count=2)
    try:
        first = tc.new_transaction(timeout_ms=60_000, client_name="c")
        topic.fail_next(1)  # its store write fails: completed in the background
        assert tc.commit(first) is TxnStatus.COMMITTED
        assert tc.get_transaction(first).status is TxnStatus.COMMITTING
        newer = []
        for _ in range(2):
            clock.advance(10)
            txn = tc.new_transaction(timeout_ms=60_000, client_name="c")
            assert tc.abort(txn) is TxnStatus.ABORTED
            newer.append(txn)
        clock.advance(60_000)  # past any backoff: the retry runs
        testing.settle(tc, timers)
        assert tc.stats()["live"] == 0
        # The client's two newest ends are remembered; the retried older one
        # stays out rather than pushing one of them out.
        assert [tc.get_transaction(t).status for t in newer] == [TxnStatus.ABORTED] * 2
        with pytest.raises(TransactionNotFound):
            tc.get_transaction(first)
    finally:
        tc.close()


def test_a_bulk_decision_write_failing_part_way_is_in_doubt_not_reverted(tmp_path: Path) -> None:
    """Records of one bulk write span entries: one failing says nothing of the others.

    t1's COMMITTING became durable, t2's failed, and the bulk call reverted
    both to OPEN: an abort of t1 was then accepted and logged ABORTING after
    its durable COMMITTING, and the log no longer opened (both outcomes).
    Now both are in doubt: a later abort logs t1's decision again and is
    refused, and the log reopens with t1 committed.
    """
    tc = TransactionCoordinator.open(
        tmp_path, 0, registry=None, end_timeout_ms=20_000, log_options={"max_batch_bytes": 1}
    )  # one journal group per record (transaction-log batching is off by default)
    ml = testing.log_ledger(tc)
    t1 = tc.new_transaction(timeout_ms=HOUR)
    t2 = tc.new_transaction(timeout_ms=HOUR)
    testing.hold_fault(ml, "write")
    got: list[Any] = []
    bulk = threading.Thread(
        target=lambda: got.append(tc.end_transactions([(t1, "commit"), (t2, "commit")]))
    )
    bulk.start()
    try:
        assert testing.wait_fault_held(ml, "write")  # t1's COMMITTING is being written
        testing.hold_fault(ml, "sync")
        testing.release_fault(ml, "write")
        assert testing.wait_fault_held(ml, "sync")  # t1's COMMITTING written; its sync waits
        testing.inject_fault(ml, "write", errno=errno.EIO, times=1)  # t2's will fail
    finally:
        testing.release_fault(ml, "write")
        testing.release_fault(ml, "sync")  # t1's COMMITTING becomes durable
    bulk.join(30)
    assert [type(r) for r in got[0]] == [TransactionEndPending, TransactionEndPending]
    with pytest.raises(TransactionAlreadyCommitted):
        tc.abort(t1)  # its decision is logged again first: then the refusal is definite
    assert tc.commit(t2) is TxnStatus.COMMITTED  # in doubt too: the retry logs it again
    tc.close()
    again = TransactionCoordinator.open(tmp_path, 0, registry=None)  # one outcome each
    try:
        assert again.list_transactions() == []
    finally:
        again.close()


def test_an_in_doubt_decision_is_never_answered_as_definite(tmp_path: Path) -> None:
    """A decision whose write timed out and then failed may never have reached the log.

    The opposite end was refused at once (``TransactionAlreadyCommitted``) and
    ``participant_outcome`` said commit; after a restart the log showed the
    transaction OPEN and it aborted. Now the decision is logged again before
    either answer, and while that fails the answers are not definite.
    """
    tc = TransactionCoordinator.open(
        tmp_path, 0, registry=None, end_timeout_ms=300, transaction_meta_persist_count=10
    )
    ml = testing.log_ledger(tc)
    txn = tc.new_transaction(timeout_ms=HOUR, client_name="c")
    testing.hold_fault(ml, "sync")  # the disk stalls while COMMITTING is written
    with pytest.raises(TransactionEndPending):
        tc.commit(txn)  # in doubt
    testing.inject_fault(ml, "sync", errno=errno.EIO, times=1_000_000)
    testing.release_fault(ml, "sync")  # ... and then fails: COMMITTING never became durable
    assert tc.participant_outcome(txn) is None  # not "commit": it may be lost
    with pytest.raises(TxnStreamError) as e:
        tc.abort(txn)
    assert not isinstance(e.value, TransactionAlreadyCommitted | TransactionAlreadyAborted)
    assert e.value.retriable  # not definite: ask again
    testing.clear_faults(ml)
    with pytest.raises(TransactionAlreadyCommitted):
        tc.abort(txn)  # the disk is back: logged again, and now the refusal holds
    assert tc.participant_outcome(txn) is True
    tc.close()
    again = TransactionCoordinator.open(
        tmp_path, 0, registry=None, transaction_meta_persist_count=10
    )
    try:
        assert again.commit(txn) is TxnStatus.COMMITTED
    finally:
        again.close()


def test_a_bad_trace_is_refused_before_the_end_is_claimed(tmp_path: Path) -> None:
    """A bad ``trace`` raised AttributeError after the claim and left the end deciding for good.

    Every later end then waited and answered "busy", the timeout never
    aborted it, and it held the low-water mark back.
    """
    tc = TransactionCoordinator.open(tmp_path, 0, registry=None, end_timeout_ms=500)
    try:
        txn = tc.new_transaction(timeout_ms=HOUR)
        bad: Any = "not a trace"
        with pytest.raises(InvalidArgumentError, match="trace"):
            tc.end_transaction(txn, "commit", trace=bad)
        with pytest.raises(InvalidArgumentError, match=r"traces\[0\]"):
            tc.end_transactions([(txn, "commit")], traces=[bad])

        # An error after the claim and before the write (here from a trace that
        # breaks) reverts the claim: the transaction can still end.
        class Broken(EndTrace):
            def waited(self, phase: str) -> None:
                raise RuntimeError("broken trace")

        with pytest.raises(RuntimeError, match="broken trace"):
            tc.end_transaction(txn, "commit", trace=Broken())
        assert tc.abort(txn) is TxnStatus.ABORTED
    finally:
        tc.close()


def test_an_interrupt_between_the_decision_write_and_its_apply_leaves_it_in_doubt(
    tmp_path: Path,
) -> None:
    """Written but not applied (an interrupt while waiting for the table lock): never reverted.

    A first version of the "revert a claim never written" rule reverted it,
    and an abort then followed a durable COMMITTING (both outcomes in the log).
    """
    import signal

    tc = TransactionCoordinator.open(tmp_path, 0, registry=None, end_timeout_ms=5_000)
    txn = tc.new_transaction(timeout_ms=HOUR)
    table, driver = tc._table, tc._driver
    real = driver._writer
    holding = threading.Event()

    def hold_the_lock_and_interrupt() -> None:
        with table.lock:
            holding.set()
            time.sleep(0.2)  # the committing thread now waits for the lock
            main = threading.main_thread().ident
            assert main is not None
            signal.pthread_kill(main, signal.SIGINT)
            time.sleep(0.2)

    class WriteThenStall:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def write(self, record: bytes, timeout_ms: int | None = None) -> Any:
            pos = real.write(record, timeout_ms)  # the COMMITTING record is durable
            driver._writer = real  # once
            threading.Thread(target=hold_the_lock_and_interrupt).start()
            holding.wait()
            return pos

    driver._writer = WriteThenStall()  # type: ignore[assignment]
    with pytest.raises(KeyboardInterrupt):
        tc.commit(txn)
    with pytest.raises(TransactionAlreadyCommitted):
        tc.abort(txn)  # in doubt: logged again, then refused
    tc.close()
    again = TransactionCoordinator.open(tmp_path, 0, registry=None)  # one outcome
    try:
        assert again.list_transactions() == []
    finally:
        again.close()


def test_a_commit_is_bounded_when_the_disk_stalls_after_its_participants(tmp_path: Path) -> None:
    """The outcome is visible once participants ended: the store write must not hold the caller.

    With the terminated store on, the end's store write waited for a stalled
    disk without a limit (the final record right after it was bounded).
    """
    tc = TransactionCoordinator.open(
        tmp_path, 0, registry=None, end_timeout_ms=300, transaction_meta_persist_count=10
    )
    ml = testing.log_ledger(tc)
    txn = tc.new_transaction(client_name="c")

    def stall(step: str, _tid: TxnID) -> None:
        if step == "participants_done":
            testing.hold_fault(ml, "sync")  # the disk stalls now

    testing.set_step_hook(tc, stall)
    got: list[object] = []
    t = threading.Thread(target=lambda: got.append(tc.commit(txn)), daemon=True)
    t.start()
    try:
        t.join(10)
        assert not t.is_alive(), "commit() waited for the stalled disk"
        assert got == [TxnStatus.COMMITTED]
    finally:
        testing.set_step_hook(tc, None)
        testing.release_fault(ml, "sync")
    tc.close()
    again = TransactionCoordinator.open(
        tmp_path, 0, registry=None, transaction_meta_persist_count=10
    )
    try:
        assert again.commit(txn) is TxnStatus.COMMITTED  # completed or finished at recovery
    finally:
        again.close()


def test_a_bulk_end_failing_before_its_write_leaves_nothing_claimed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error while the bulk decisions are encoded left them claimed: "busy" for good."""
    import txnstream.coordinator.ending as ending

    tc = TransactionCoordinator.open(tmp_path, 0, registry=None, end_timeout_ms=500)
    try:
        txn = tc.new_transaction(timeout_ms=HOUR)

        def broken(*_args: object) -> bytes:
            raise RuntimeError("encoding failed")

        monkeypatch.setattr(ending, "encode_txn_update", broken)
        with pytest.raises(RuntimeError, match="encoding failed"):
            tc.end_transactions([(txn, "commit")])
        monkeypatch.undo()
        assert tc.abort(txn) is TxnStatus.ABORTED
    finally:
        tc.close()
