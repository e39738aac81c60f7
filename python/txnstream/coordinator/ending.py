"""How a transaction ends (SPEC §4.3, §4.4): decide, end the participants, complete.

Kafka spreads this over its coordinator and TransactionMarkerChannelManager;
here it is one file, in the order things happen:

1. **decide** -- the ending UPDATE (OPEN -> COMMITTING/ABORTING) is logged.
   The claim (under the table lock) only marks it *pending*; ADD records
   still in flight are waited for first, so every partition the client was
   told it added is ended. A definite write failure reverts the claim (the
   transaction is OPEN again, its timeout re-armed); an unknown outcome
   leaves the decision *in doubt*: it is treated as decided and logged
   again before anything builds on it.
2. **participants** -- every produced partition (its transaction buffer
   writes a marker) and acked subscription (its pending ack commits or
   releases) is told the outcome; failures are retried with backoff. A
   participant may answer at once or with a ``Future`` (its durable write),
   so the participants of one end are written concurrently and share group
   commits.
3. **complete** -- the outcome is recorded in the TerminatedTxnStore
   (PIP-255), COMMITTED/ABORTED is logged, the transaction leaves memory and
   its log records are deleted by position and batch index (one cursor
   operation). Once step 2 is done the outcome is visible, so the caller
   gets it even if step 3 fails (it is retried in the background) and
   cleanup is best effort (recovery purges leftovers).

Who runs it: a client's request claims the transaction and *drives* the
steps; others asking meanwhile wait for that driver. A client waits at most
``end_timeout_ms``; after that it gets ``TransactionEndPending`` (or
``ParticipantsFailed``) naming the decided outcome and the end goes on in
the background. The opposite request on a decided transaction is answered
at once (``TransactionAlreadyCommitted``/``Aborted``). Timeouts, ends found
by recovery and retries run as *background ends* (:class:`BackgroundEnds`):
one attempt per run on a small pool, the next run scheduled on the timer
with backoff, so a dead participant never holds a thread and every failure
is retried.

A crash anywhere is repaired by recovery: decision not durable -> still OPEN
(it times out); steps 2-3 -> recovered as COMMITTING/ABORTING and finished
(participants and the store are idempotent); after the final record -> its
leftover records are purged.

With ``config.complete_in_background`` (the broker turns it on) a client's
end returns once step 2 is done -- the outcome is durable and visible -- and
step 3 runs off its path on :class:`Completions`, which completes the
transactions queued meanwhile together (one store write, one log write).
An :class:`EndTrace` passed by the caller counts the sequential durable
waits its end made (the decision, participants still writing, records of
the transaction still in flight).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Final, Protocol, cast, runtime_checkable

from txnstream._native import TxnPosition, encode_txn_update
from txnstream.coordinator.config import CoordinatorConfig, RetryPolicy
from txnstream.coordinator.metadata import TxnAction, TxnID, TxnMeta, TxnStatus, bad_argument
from txnstream.coordinator.state import (
    CoordinatorCounters,
    DurableWriter,
    PositionColumns,
    TransactionTable,
    definite,
)
from txnstream.coordinator.terminated import TerminatedTxnStore
from txnstream.errors import (
    ParticipantsFailed,
    TransactionAlreadyAborted,
    TransactionAlreadyCommitted,
    TransactionEndPending,
    TransactionError,
    TransactionWriteFailed,
    TxnStreamError,
)
from txnstream.timer import Clock, TimerHandle, TimerScope

log = logging.getLogger(__name__)

#: Longest a background end waits for its participants in one run (ms).
BACKGROUND_WAIT_MS: Final = 1_000

#: Named steps of an end, reported to the step hook (crash tests stop there).
STEPS = ("ending_logged", "participants_done", "terminated_stored", "final_logged")

StepHook = Callable[[str, TxnID], None]

#: Shortest delay before a background end that failed runs again.
RETRY_MIN_MS = 20


class EndTrace:
    """Counts the sequential durable waits of one end (SPEC §4.5 commit path).

    A *wait* is a phase in which the caller blocked on a durable write that
    was not done yet: the ending UPDATE (always), records of the transaction
    still in flight, participants' markers and pending-ack records.
    """

    __slots__ = ("phases", "waits")

    def __init__(self) -> None:
        self.waits = 0
        self.phases: list[str] = []

    def waited(self, phase: str) -> None:
        """Count one sequential wait in ``phase``."""
        self.waits += 1
        self.phases.append(phase)


def trace_arg(trace: object, argument: str = "trace") -> EndTrace | None:
    """``trace`` if it is None or an :class:`EndTrace`, else :class:`InvalidArgumentError`.

    Checked before anything is claimed: a bad one used to fail after the
    end was claimed, leaving the transaction deciding for good.
    """
    if trace is None or isinstance(trace, EndTrace):
        return trace
    raise bad_argument(argument, trace, "an EndTrace or None")


def write_failed(txn_id: TxnID, cause: BaseException) -> TransactionWriteFailed:
    """Return the refusal for a transaction one of whose no-wait records failed."""
    return TransactionWriteFailed(
        f"transaction {txn_id} cannot commit: a write of it failed ({cause!r}); abort it",
        txn_id=txn_id,
        cause=cause,
    )


# ------------------------------------------------------------------ participants


@runtime_checkable
class Participant(Protocol):
    """One produced partition or acked subscription of a transaction."""

    def end(self, txn_id: TxnID, commit: bool) -> Future[None] | None:
        """Commit (``commit=True``) or abort the transaction here; idempotent.

        Return None when done, or a ``Future`` that completes once the end
        is durable here (e.g. a marker append). Raising, or a future that
        fails, means "not done yet": the coordinator retries with backoff,
        also after a restart, for the same transaction and outcome.
        """


@runtime_checkable
class ParticipantResolver(Protocol):
    """Finds the participant that serves a partition or subscription."""

    def partition(self, name: str) -> Participant:
        """Return the transaction buffer of topic partition ``name``."""

    def subscription(self, topic: str, subscription: str) -> Participant:
        """Return the pending ack of ``subscription`` on ``topic``."""


class _Nothing:
    def end(self, txn_id: TxnID, commit: bool) -> None:
        return None


class NullParticipants:
    """Resolver for a coordinator that runs without buffers (log-only use).

    Every end succeeds at once; the coordinator still logs the full
    COMMITTING -> COMMITTED sequence.
    """

    _nothing = _Nothing()

    def partition(self, name: str) -> Participant:
        """Return a participant that has nothing to end."""
        return self._nothing

    def subscription(self, topic: str, subscription: str) -> Participant:
        """Return a participant that has nothing to end."""
        return self._nothing


def end_participants(
    txn_id: TxnID,
    commit: bool,
    partitions: Sequence[str],
    subscriptions: Sequence[tuple[str, str]],
    resolver: ParticipantResolver,
    *,
    policy: RetryPolicy,
    clock: Clock,
    deadline_ms: int,
    stop: threading.Event,
    attempts: int | None = None,
    trace: EndTrace | None = None,
) -> int:
    """End ``txn_id`` on every participant, retrying failed ones with backoff.

    Each attempt starts every pending participant, then waits (up to the
    deadline) for the futures they returned. Returns the number of retries.
    Raises :class:`ParticipantsFailed` (``outcome`` = the decided final
    status) once ``attempts`` (default ``policy.max_attempts``, None: no
    limit) are used, the monotonic ``deadline_ms`` passed, or ``stop`` is set
    while some still fail.
    """
    pending: list[tuple[str, Callable[[], Participant]]] = [
        (f"partition {p}", functools.partial(resolver.partition, p)) for p in partitions
    ]
    pending += [
        (f"subscription {t}/{s}", functools.partial(resolver.subscription, t, s))
        for t, s in subscriptions
    ]
    limit = attempts if attempts is not None else policy.max_attempts
    attempt = 0
    retries = 0
    while pending:
        attempt += 1
        failed, errors = _attempt(txn_id, commit, pending, clock, deadline_ms, trace)
        if not failed:
            break
        retries += len(failed)
        remaining = deadline_ms - clock.monotonic_ms()
        if (limit is not None and attempt >= limit) or remaining <= 0 or stop.is_set():
            outcome = TxnStatus.COMMITTED if commit else TxnStatus.ABORTED
            raise ParticipantsFailed(
                f"ending transaction {txn_id} ({outcome.name}, decided) failed on "
                f"{len(failed)} participant(s) after {attempt} attempt(s): "
                f"{errors[0][0]}: {errors[0][1]}; it is completed in the background",
                txn_id=txn_id,
                outcome=outcome,
                failures=errors,
            )
        # Said once, then every 10th attempt: a participant that keeps failing
        # is visible in the log without flooding it.
        level = logging.WARNING if attempt == 1 or attempt % 10 == 0 else logging.DEBUG
        log.log(
            level,
            "ending %s: %d participant(s) failed (attempt %d), retrying: %s: %s",
            txn_id,
            len(failed),
            attempt,
            errors[0][0],
            errors[0][1],
        )
        clock.wait(stop, min(policy.backoff_ms(attempt), remaining))
        pending = failed
    return retries


def _all_done(futures: list[Future[Any]]) -> threading.Event:
    """Return an event set once all of ``futures`` are done (wait on it with a deadline)."""
    all_done = threading.Event()
    left = [len(futures)]
    lock = threading.Lock()

    def one_done(_: Future[Any]) -> None:
        with lock:
            left[0] -= 1
            if left[0] == 0:
                all_done.set()

    for fut in futures:
        fut.add_done_callback(one_done)
    return all_done


def _attempt(
    txn_id: TxnID,
    commit: bool,
    pending: list[tuple[str, Callable[[], Participant]]],
    clock: Clock,
    deadline_ms: int,
    trace: EndTrace | None = None,
) -> tuple[list[tuple[str, Callable[[], Participant]]], list[tuple[str, str]]]:
    # One attempt on every pending participant: the failed ones and why.
    failed: list[tuple[str, Callable[[], Participant]]] = []
    errors: list[tuple[str, str]] = []
    waiting: list[tuple[str, Callable[[], Participant], Future[None]]] = []
    for label, get in pending:
        try:
            fut = get().end(txn_id, commit)
        except Exception as exc:
            failed.append((label, get))
            errors.append((label, repr(exc)))
            continue
        if fut is not None:
            waiting.append((label, get, fut))
    if waiting:
        all_done = _all_done([fut for _, _, fut in waiting])
        if trace is not None and not all_done.is_set():
            trace.waited("participants")
        clock.wait(all_done, deadline_ms - clock.monotonic_ms())
        for label, get, fut in waiting:
            err = fut.exception(timeout=0) if fut.done() else TimeoutError("no answer in time")
            if err is not None:
                failed.append((label, get))
                errors.append((label, repr(err)))
    return failed, errors


# ---------------------------------------------------------------------- answers


def end_answer(txn_id: TxnID, act: TxnAction, final: TxnStatus, timed_out: bool) -> TxnStatus:
    """Answer ``act`` on a transaction whose outcome is ``final``: the status, or raise.

    The same end gets the outcome; the opposite one a definite
    :class:`TransactionAlreadyCommitted` / :class:`TransactionAlreadyAborted`
    (``timed_out=True`` when the timeout decided it).
    """
    if final is act.final_status:
        return final
    if final is TxnStatus.COMMITTED:
        raise TransactionAlreadyCommitted(
            f"cannot abort transaction {txn_id}: it already committed",
            txn_id=txn_id,
            status=final,
        )
    why = " (timed out)" if timed_out else ""
    raise TransactionAlreadyAborted(
        f"cannot commit transaction {txn_id}: it already aborted{why}",
        txn_id=txn_id,
        status=final,
        timed_out=timed_out,
    )


#: Why an end whose decision record was not durable by its deadline is pending.
_DECISION_SLOW = "its decision record was not durable in time (the log is slow or stalled)"
_DECISION_FAILED = "the write of its decision failed and may have reached the log"


def _pending_error(txn_id: TxnID, outcome: TxnStatus | None, why: str) -> TransactionEndPending:
    said = f"{outcome.name}, decided" if outcome is not None else "not decided yet"
    return TransactionEndPending(
        f"the end of transaction {txn_id} ({said}) did not finish in time: {why}; "
        "it is completed in the background, ask again for the outcome",
        txn_id=txn_id,
        outcome=outcome,
    )


# ----------------------------------------------------------------------- driver


class EndDriver:
    """Runs the steps of ends for clients and for the background.

    ``participants`` and ``step_hook`` may be replaced at any time; they are
    read when a transaction reaches the step that uses them.
    """

    def __init__(
        self,
        table: TransactionTable,
        writer: DurableWriter,
        store: TerminatedTxnStore,
        counters: CoordinatorCounters,
        *,
        config: CoordinatorConfig,
        stop: threading.Event,
        clock: Clock,
    ) -> None:
        self.participants: ParticipantResolver = NullParticipants()
        self.step_hook: StepHook | None = None
        self.background: BackgroundEnds | None = None
        #: Set when step 3 of a client's end runs off its path.
        self.completions: Completions | None = None
        self._table = table
        self._writer = writer
        self._store = store
        self._counters = counters
        self._config = config
        self._stop = stop
        self._clock = clock

    # -- client requests

    def end(
        self,
        seq: int,
        act: TxnAction,
        *,
        force: bool = False,
        trace: EndTrace | None = None,
    ) -> TxnStatus | None:
        """End ``seq`` for a client: the final status, or None if it is not in memory.

        ``force`` (admin ``force_abort``): a decided end is finished instead
        of refused. Raises the refusal (``TransactionAlreadyCommitted``...),
        ``TransactionEndPending`` after ``end_timeout_ms``, or the log's
        error when the decision could not be logged (nothing changed then).
        """
        clock, table = self._clock, self._table
        deadline = clock.monotonic_ms() + self._config.end_timeout_ms
        waited: TxnMeta | None = None  # the transaction another thread was ending
        while True:
            with table.lock:
                meta = table.txns.get(seq)
                if meta is None or not meta.visible:
                    if waited is not None and waited.status.is_final:
                        # It ended while we waited: answer from it (the store may be off).
                        if force:
                            return waited.status
                        return end_answer(table.tid(seq), act, waited.status, waited.timed_out)
                    return None
                decision = meta.decision
                wait: threading.Event | None = None
                refuse_after: TxnStatus | None = None
                if meta.deciding:
                    wait = table.changed(meta)  # a decision in flight may still fail
                elif decision is None:
                    self._claim(meta, act.ending_status, timed_out=False)
                elif meta.in_doubt and decision is not act.ending_status and not force:
                    # Its write may have failed: log it again before answering with it.
                    if meta.driver:
                        wait = table.changed(meta)  # another thread is logging it
                    else:
                        self._take_over(meta)
                        refuse_after = decision
                elif decision is not act.ending_status and not force:
                    if not meta.driver and self.background is not None:
                        self.background.retry_later(meta)  # nobody may be finishing it
                    timed_out = meta.timed_out or meta.pending_timed_out
                    outcome = decision.outcome
                    assert outcome is not None
                    end_answer(table.tid(seq), act, outcome, timed_out)  # raises the refusal
                elif meta.driver:
                    wait = table.changed(meta)  # another thread finishes it
                else:
                    self._take_over(meta)
            if wait is None:
                final = self._drive(meta, deadline, background=False, trace=trace)
                if refuse_after is not None:  # now durable: the refusal is definite
                    end_answer(table.tid(seq), act, final, meta.timed_out)
                return final
            if trace is not None:
                trace.waited("another end")
            waited = meta
            remaining = deadline - clock.monotonic_ms()
            if (remaining <= 0 or not clock.wait(wait, remaining)) and (
                clock.monotonic_ms() >= deadline
            ):
                outcome = decision.outcome if decision else None
                raise _pending_error(table.tid(seq), outcome, "busy")

    def end_many(
        self,
        reqs: list[tuple[TxnID, int, TxnAction]],
        traces: list[EndTrace | None] | None = None,
    ) -> list[TxnStatus | TxnStreamError | None]:
        """Many clients' ends: per item the final status, its error, or None (not in memory).

        Transactions that can be decided now are driven together (one
        batched write per step); a log write failure of that batch raises.
        The others (another thread drives them, or the opposite end was
        decided) are answered one by one afterwards, each with its own
        error if it fails. The same end named twice gets one answer.
        """
        table = self._table
        deadline = self._clock.monotonic_ms() + self._config.end_timeout_ms
        results: list[TxnStatus | TxnStreamError | None] = [None] * len(reqs)
        claimed: list[tuple[int, TxnMeta]] = []
        later: list[int] = []
        seen: set[int] = set()
        again: list[tuple[int, int]] = []  # (item, the earlier item of the same end)
        first_of: dict[tuple[int, TxnAction], int] = {}
        with table.lock:
            for i, (_, seq, act) in enumerate(reqs):
                earlier = first_of.setdefault((seq, act), i)
                if earlier != i:
                    again.append((i, earlier))  # the same end twice: one answer
                    continue
                meta = table.txns.get(seq)
                if meta is None or not meta.visible:
                    continue  # None: answered from the store by the caller
                fresh = (
                    meta.decision is None
                    and not meta.deciding
                    and not meta.adds
                    and not (meta.failed is not None and act is TxnAction.COMMIT)
                )
                if fresh and seq not in seen:
                    self._claim(meta, act.ending_status, timed_out=False)
                    claimed.append((i, meta))
                    seen.add(seq)
                else:
                    later.append(i)
        if claimed:
            claimed_traces = None if traces is None else [traces[i] for i, _ in claimed]
            driven = self._drive_many(claimed, deadline, claimed_traces)
            for (i, _), got in zip(claimed, driven, strict=True):
                results[i] = got
        for i in later:
            _, seq, act = reqs[i]
            try:
                results[i] = self.end(seq, act, trace=None if traces is None else traces[i])
            except TxnStreamError as exc:
                # This end's own failure (a refusal, or a log write of it) is
                # its answer: the others' answers, commits among them, stand.
                results[i] = exc
        for i, earlier in again:
            results[i] = results[earlier]
        return results

    # -- background

    def run_background(self, seq: int, *, timed_out: bool) -> None:
        """End ``seq`` in the background (timeout or retry); never raises, retries later.

        With ``timed_out`` only an OPEN transaction past its deadline is
        aborted (a timer that fired early, or after a client decided, does
        nothing); otherwise a decided end is finished. One attempt per run.
        """
        table, clock = self._table, self._clock
        bg = self.background
        assert bg is not None, "EndDriver.background is not wired"
        with table.lock:
            meta = table.txns.get(seq)
            if meta is None or table.closed or meta.driver or meta.deciding:
                return
            if timed_out:
                if meta.decision is not None or meta.pending is not None:
                    return
                now = clock.monotonic_ms()
                if now < meta.deadline or meta.adds:
                    bg.arm(meta, max(meta.deadline, now + RETRY_MIN_MS))
                    return
                self._claim(meta, TxnStatus.ABORTING, timed_out=True)
            elif meta.decision is None:
                return
            else:
                self._take_over(meta)
        deadline = clock.monotonic_ms() + self._config.end_timeout_ms
        try:
            self._drive(meta, deadline, background=True)
        except TransactionError:
            pass  # retried later (scheduled by _drive)
        except Exception:
            if not table.closed:
                log.exception("background end of %s failed", table.tid(seq))

    # -- the steps

    def _claim(self, meta: TxnMeta, target: TxnStatus, *, timed_out: bool) -> None:
        # Under the lock: decide ``target`` (pending until logged) and drive it.
        meta.pending = target
        meta.pending_timed_out = timed_out
        meta.driver = True
        if meta.timer is not None and self.background is not None:
            self.background.cancel(meta)

    def _take_over(self, meta: TxnMeta) -> None:
        # Under the lock: drive a decided end nobody drives (a pending retry is moot).
        meta.driver = True
        if meta.timer is not None and self.background is not None:
            self.background.cancel(meta)

    def _drive(
        self,
        meta: TxnMeta,
        deadline: int,
        *,
        background: bool,
        trace: EndTrace | None = None,
    ) -> TxnStatus:
        """Run the remaining steps for ``meta`` (claimed by this thread).

        Only the driver changes ``pending``, ``participants_done`` and (once
        decided) the names, so it reads them without the lock. A client's
        step 3 is handed to :attr:`completions` when set (the driver role
        goes with it).
        """
        tid = self._table.tid(meta.seq)
        handed_off = False
        try:
            if meta.pending is not None:
                self._decide(meta, tid, deadline, trace)
            if not meta.participants_done:
                self._end_participants(meta, tid, deadline, background, trace)
            if self.completions is not None and not background:
                outcome = meta.status.outcome
                assert outcome is not None
                self.completions.submit(meta)
                handed_off = True
                return outcome
            return self._complete(meta, tid)
        finally:
            if meta.driver and not handed_off:  # not released by a successful _finish
                self._release(meta)

    def _decide(
        self, meta: TxnMeta, tid: TxnID, deadline: int, trace: EndTrace | None = None
    ) -> None:
        """Step 1: log the pending ending UPDATE (after any NEW/ADD in flight).

        A commit of a transaction whose no-wait record failed is refused
        (:class:`TransactionWriteFailed`; it stays OPEN and may abort).
        """
        table, clock = self._table, self._clock
        attempted = False  # the write was started: from then on the record may be durable
        try:
            if meta.adds:  # no ADD can start once the decision is pending: only wait if needed
                if trace is not None:
                    trace.waited("records in flight")
                self._await_adds(meta, tid, deadline)
            target = meta.pending
            assert target is not None
            if meta.failed is not None and target is TxnStatus.COMMITTING and not meta.in_doubt:
                with table.lock:
                    self._revert(meta)
                raise write_failed(tid, meta.failed)
            if trace is not None:
                trace.waited("decision")
            now = clock.wall_ms()
            record = encode_txn_update(
                table.tc_id, meta.seq, now, 0, int(target), meta.pending_timed_out
            )
            attempted = True
            try:
                # Bounded by the end's deadline: a stalled disk must not hold the caller.
                pos = self._writer.write(record, max(1, deadline - clock.monotonic_ms()))
            except BaseException as exc:
                # An in-doubt decision logged again stays in doubt if this fails too.
                self._unclaim([meta], written=not definite(exc))
                if isinstance(exc, TimeoutError):
                    raise _pending_error(tid, None, _DECISION_SLOW) from exc
                raise
            with table.lock:
                meta.status = target
                meta.timed_out = meta.pending_timed_out
                meta.pending = None
                meta.in_doubt = False
                meta.positions.append(pos)
                meta.decided_at = clock.monotonic_ms()
                meta.last_modified = now
                if meta.done is not None:
                    table.notify(meta)
        except BaseException:
            # A bad trace, an interrupt while waiting for records (never written),
            # or one between the write and the lock (written, not applied).
            self._unclaim([meta], written=attempted)
            raise

    def _unclaim(self, metas: list[TxnMeta], *, written: bool) -> None:
        # After an error: no claim may stay "deciding" once its driver stops. One
        # whose write never started (or surely failed) is reverted: the transaction
        # is OPEN again. One that may have been written is in doubt, never
        # reverted: it is treated as made and logged again before use.
        with self._table.lock:
            for m in metas:
                if m.deciding:
                    if written:
                        m.in_doubt = True
                    else:
                        self._revert(m)

    def _await_adds(self, meta: TxnMeta, tid: TxnID, deadline: int) -> None:
        # ADD records still in flight finish (or fail) before the decision.
        table, clock = self._table, self._clock
        with table.lock:
            while meta.adds:
                event = table.changed(meta)
                table.lock.release()
                try:
                    clock.wait(event, deadline - clock.monotonic_ms())
                finally:
                    table.lock.acquire()
                if meta.adds and clock.monotonic_ms() >= deadline:
                    self._revert(meta)
                    raise _pending_error(tid, None, "partitions being added")

    def _revert(self, meta: TxnMeta) -> None:
        # Under the lock: the decision was not logged; the transaction is OPEN again.
        meta.pending = None
        meta.pending_timed_out = False
        if self.background is not None:
            self.background.rearm_after_failure(meta)
        self._table.notify(meta)

    def _end_participants(
        self,
        meta: TxnMeta,
        tid: TxnID,
        deadline: int,
        background: bool,
        trace: EndTrace | None = None,
        attempts: int | None = None,
    ) -> None:
        """Step 2: tell every participant the decided outcome.

        ``attempts`` overrides the policy's limit (a background run makes one).
        """
        commit = meta.status is TxnStatus.COMMITTING
        partitions = meta.partition_list()
        subscriptions = meta.subscription_list()
        self._hook("ending_logged", tid)
        if background:
            # One attempt holds one of the few end workers: a participant that
            # does not answer must not keep it for the whole end timeout (other
            # transactions' timeouts wait for a worker). Unanswered is failed
            # here and asked again at the next run (its end is idempotent).
            deadline = min(deadline, self._clock.monotonic_ms() + BACKGROUND_WAIT_MS)
        end_participants(
            tid,
            commit,
            partitions,
            subscriptions,
            self.participants,
            policy=self._config.retry,
            clock=self._clock,
            deadline_ms=deadline,
            stop=self._stop,
            attempts=1 if background else attempts,
            trace=trace,
        )
        meta.participants_done = True
        self._hook("participants_done", tid)

    def _complete(self, meta: TxnMeta, tid: TxnID) -> TxnStatus:
        """Step 3: store the outcome, log the final status, leave memory, clean up.

        The outcome is visible once step 2 is done, so a failure here is
        logged and retried in the background while the outcome is returned.
        """
        table = self._table
        decided = meta.status
        final = decided.outcome
        assert final is not None
        assert decided.is_ending
        try:
            # The decision's time orders the store, the same on every retry. Bounded
            # like the final record below: a stalled disk must not hold the caller.
            self._store.record(
                tid,
                meta.client_name,
                final,
                timed_out=meta.timed_out,
                end_time=meta.last_modified,
                timeout_ms=self._config.end_timeout_ms,
            )
            self._hook("terminated_stored", tid)
            now = self._clock.wall_ms()
            record = encode_txn_update(
                table.tc_id, meta.seq, now, int(decided), int(final), meta.timed_out
            )
            # Bounded: a stalled disk must not hold the caller past the outcome,
            # which is visible already (a slow write is retried in the background).
            last = self._writer.write(record, self._config.end_timeout_ms)
            self._hook("final_logged", tid)
        except Exception:
            if not table.closed:
                log.warning("completing %s failed; retried in the background", tid, exc_info=True)
            return final
        with table.lock:
            records = self._finish(meta, final, last, now)
        if records:
            self._writer.delete(records)
        return final

    def _finish(
        self, meta: TxnMeta, final: TxnStatus, last: TxnPosition, now: int
    ) -> list[TxnPosition] | PositionColumns | None:
        # Under the lock: the final record is durable; leave memory.
        table = self._table
        commit = final is TxnStatus.COMMITTED
        latency = max(0, self._clock.monotonic_ms() - meta.decided_at)
        self._counters.ended(commit, meta.timed_out, latency)
        meta.status = final
        meta.last_modified = now
        table.txns.pop(meta.seq, None)
        meta.positions.append(last)
        meta.partitions = meta.subscriptions = None
        if meta.timer is not None and self.background is not None:
            self.background.cancel(meta)
        meta.driver = False  # released here: it left memory, nothing to retry
        if meta.done is not None:
            table.notify(meta)
        return table.release(meta)

    def _drive_many(
        self,
        claimed: list[tuple[int, TxnMeta]],
        deadline: int,
        traces: list[EndTrace | None] | None = None,
    ) -> list[TxnStatus | TransactionError | None]:
        """Run steps 1-3 for many claimed (fresh) transactions, each step one batch.

        With :attr:`completions` step 3 is handed off (the outcome is
        returned once participants ended). ``traces`` (one per claimed
        transaction, or None) count their durable waits.
        """
        table, clock, writer = self._table, self._clock, self._writer
        metas = [m for _, m in claimed]
        results: list[TxnStatus | TransactionError | None] = [None] * len(metas)
        handed: set[int] = set()
        try:
            now = clock.wall_ms()
            try:
                with table.lock:
                    records = [
                        encode_txn_update(
                            table.tc_id, m.seq, now, int(TxnStatus.OPEN), int(m.pending or 0), False
                        )
                        for m in metas
                    ]
            except BaseException:  # before the write: nothing was logged
                self._unclaim(metas, written=False)
                raise
            try:
                positions = writer.write_many(records, max(1, deadline - clock.monotonic_ms()))
            except BaseException as exc:
                # One record: a storage error wrote nothing. Several span entries (and
                # journal groups): one entry failing says nothing of the others, some
                # of which may be durable. Those decisions are in doubt, logged again
                # before anything builds on them; reverting them let an abort follow a
                # durable commit (both outcomes in the log).
                sure = definite(exc) and len(records) == 1
                self._unclaim(metas, written=not sure)
                if sure:
                    raise
                why = _DECISION_SLOW if isinstance(exc, TimeoutError) else _DECISION_FAILED
                if not isinstance(exc, TimeoutError | TxnStreamError):
                    raise  # an interrupt: it goes on up (the decisions are in doubt)
                # Each is asked again, alone: its decision is logged again then.
                return [_pending_error(table.tid(m.seq), None, why) for m in metas]
            try:
                mono = clock.monotonic_ms()
                with table.lock:
                    for m, pos in zip(metas, positions, strict=True):
                        assert m.pending is not None
                        m.status, m.pending = m.pending, None
                        m.positions.append(pos)
                        m.decided_at = mono
                        m.last_modified = now
                        table.notify(m)
            except BaseException:  # an interrupt before the lock: durable, not applied
                self._unclaim(metas, written=True)
                raise
            if traces is not None:
                for t in traces:
                    if t is not None:
                        t.waited("decision")
            ready = self._end_participants_many(metas, deadline, results, traces)
            if self.completions is not None:
                for i in ready:
                    outcome = metas[i].status.outcome
                    assert outcome is not None
                    results[i] = outcome
                    self.completions.submit(metas[i])
                    handed.add(i)
                return results
            for i, final in zip(ready, self._complete_many([metas[i] for i in ready]), strict=True):
                results[i] = final
            return results
        finally:
            for i, m in enumerate(metas):
                if i not in handed:
                    self._release(m)

    def _end_participants_many(
        self,
        metas: list[TxnMeta],
        deadline: int,
        results: list[TxnStatus | TransactionError | None],
        traces: list[EndTrace | None] | None,
    ) -> list[int]:
        """Step 2 for many decided transactions at once; the indexes that finished.

        Every participant of every transaction is started first and their
        futures awaited together (their writes share syncs); a transaction
        with a failed participant falls back to :meth:`_end_participants`
        (retries with backoff until the deadline; a refusal goes to
        ``results``).
        """
        table, clock = self._table, self._clock
        resolver = self.participants
        failed: dict[int, tuple[str, str]] = {}  # index -> (participant, error) of a failure
        waiting: list[tuple[int, str, Future[None]]] = []
        for i, m in enumerate(metas):
            tid = table.tid(m.seq)
            self._hook("ending_logged", tid)
            commit = m.status is TxnStatus.COMMITTING
            label = ""
            try:
                for p in m.partition_list():
                    label = f"partition {p}"
                    fut = resolver.partition(p).end(tid, commit)
                    if fut is not None:
                        waiting.append((i, label, fut))
                for t, sub in m.subscription_list():
                    label = f"subscription {t}/{sub}"
                    fut = resolver.subscription(t, sub).end(tid, commit)
                    if fut is not None:
                        waiting.append((i, label, fut))
            except Exception as exc:
                failed[i] = (label, repr(exc))
        if waiting:
            all_done = _all_done([fut for _, _, fut in waiting])
            if traces is not None and not all_done.is_set():
                for i in {i for i, _, _ in waiting}:
                    trace = traces[i]
                    if trace is not None:
                        trace.waited("participants")
            clock.wait(all_done, deadline - clock.monotonic_ms())
            for i, label, fut in waiting:
                if not fut.done():
                    failed.setdefault(i, (label, repr(TimeoutError("no answer in time"))))
                elif fut.exception(timeout=0) is not None:
                    failed.setdefault(i, (label, repr(fut.exception(timeout=0))))
        limit = self._config.retry.max_attempts
        ready: list[int] = []
        for i, m in enumerate(metas):
            tid = table.tid(m.seq)
            if i in failed:
                # That was attempt 1; the retries follow the same policy.
                try:
                    if limit is not None and limit <= 1:
                        outcome = m.status.outcome
                        label, err = failed[i]
                        raise ParticipantsFailed(
                            f"ending transaction {tid} ({outcome.name if outcome else '?'}, "
                            f"decided) failed on a participant after 1 attempt(s): {label}: "
                            f"{err}; it is completed in the background",
                            txn_id=tid,
                            outcome=outcome,
                            failures=[failed[i]],
                        )
                    self._end_participants(
                        m,
                        tid,
                        deadline,
                        background=False,
                        attempts=None if limit is None else limit - 1,
                    )
                except TransactionError as exc:
                    results[i] = exc
                    continue
            else:
                m.participants_done = True
                self._hook("participants_done", tid)
            ready.append(i)
        return ready

    def _complete_many(self, metas: list[TxnMeta]) -> list[TxnStatus]:
        """Step 3 for many: store records one by one, the final records as one batch."""
        if not metas:
            return []
        table = self._table
        finals: list[TxnStatus] = []
        for m in metas:
            outcome = m.status.outcome
            assert outcome is not None
            finals.append(outcome)
        try:
            self._store.record_many(
                [
                    (table.tid(m.seq), m.client_name, final, m.timed_out)
                    for m, final in zip(metas, finals, strict=True)
                ],
                end_times=[m.last_modified for m in metas],
                timeout_ms=self._config.end_timeout_ms,  # a stalled disk: retried later
            )
            for m in metas:
                self._hook("terminated_stored", table.tid(m.seq))
            now = self._clock.wall_ms()
            finals_logged = [
                encode_txn_update(table.tc_id, m.seq, now, int(m.status), int(f), m.timed_out)
                for m, f in zip(metas, finals, strict=True)
            ]
            lasts = self._writer.write_many(finals_logged, self._config.end_timeout_ms)
            for m in metas:
                self._hook("final_logged", table.tid(m.seq))
        except Exception:
            if not table.closed:
                log.warning("completing %d ends failed; retried in the background", len(metas))
            return finals
        positions: list[TxnPosition] = []
        spans: list[PositionColumns] = []
        with table.lock:
            for m, final, last in zip(metas, finals, lasts, strict=True):
                done = self._finish(m, final, last, now)
                if isinstance(done, list):
                    positions.extend(done)
                elif done is not None:
                    spans.append(done)
        if spans:
            if positions:
                spans.append(PositionColumns.from_positions(positions))
            self._writer.delete(PositionColumns.concat(spans))
        elif positions:
            self._writer.delete(positions)
        return finals

    def _release(self, meta: TxnMeta) -> None:
        # The driver stops; a decided end still live is retried in the background.
        table = self._table
        with table.lock:
            meta.driver = False
            live = table.txns.get(meta.seq) is meta
            if live and meta.decision is not None and self.background is not None:
                self.background.retry_later(meta)
            table.notify(meta)

    def _hook(self, step: str, tid: TxnID) -> None:
        if self.step_hook is not None:
            self.step_hook(step, tid)


# ------------------------------------------------------------------- completions


class Completions:
    """Step 3 of clients' ends, off their path, many transactions per batch.

    :meth:`submit` queues a transaction whose participants all ended (its
    outcome is durable and visible; the caller already has it) and keeps it
    counted as a call in flight, so ``close()`` drains it. One run at a time
    on the coordinator's end pool takes everything queued and completes it
    together (:meth:`EndDriver._complete_many`: one store write, one log
    write); a failure there leaves the transactions decided and live, and
    they are retried in the background like any stalled end.
    """

    def __init__(
        self, table: TransactionTable, driver: EndDriver, executor: ThreadPoolExecutor
    ) -> None:
        self._table = table
        self._driver = driver
        self._executor = executor
        self._lock = threading.Lock()
        self._queue: list[TxnMeta] = []
        self._running = False

    def submit(self, meta: TxnMeta) -> None:
        """Queue ``meta`` (its driver role comes along) for completion."""
        with self._table.lock:
            self._table.hold()
        with self._lock:
            self._queue.append(meta)
            if self._running:
                return
            self._running = True
        try:
            self._executor.submit(self._drain)
        except RuntimeError:  # the pool is shut down: closing; recovery finishes them
            self._give_up()

    def _give_up(self) -> None:
        with self._lock:
            metas, self._queue = self._queue, []
            self._running = False
        for m in metas:
            self._driver._release(m)
            self._table.leave()

    def _drain(self) -> None:
        while True:
            with self._lock:
                metas, self._queue = self._queue, []
                if not metas:
                    self._running = False
                    return
            try:
                self._driver._complete_many(metas)
            except Exception:
                if not self._table.closed:
                    log.exception(
                        "completing %d ends failed; retried in the background", len(metas)
                    )
            finally:
                for m in metas:
                    if m.driver:
                        self._driver._release(m)
                    self._table.leave()


# ------------------------------------------------------------------- background


class BackgroundEnds:
    """Timeouts and retries: ends nobody waits for, one attempt per run.

    Runs go to ``executor``; the next run of a failed end is scheduled on
    the coordinator's timer scope after ``policy``'s backoff (at least
    :data:`RETRY_MIN_MS`). Timeouts are one shared callback per
    coordinator plus the sequence as argument (no closure per transaction).
    Arming and cancelling are called with the table lock held.
    """

    def __init__(
        self,
        table: TransactionTable,
        driver: EndDriver,
        timers: TimerScope,
        executor: ThreadPoolExecutor,
        policy: RetryPolicy,
    ) -> None:
        self._table = table
        self._driver = driver
        self._timers = timers
        self._clock = timers.clock
        self._executor = executor
        self._policy = policy
        self._running = 0
        self._idle = threading.Condition()
        # Bound once: every timer shares them (no closure per transaction).
        self._fire_timeout_cb = self._fire_timeout
        self._fire_retry_cb = self._fire_retry
        driver.background = self

    # -- timers (under the table lock)

    def arm(self, meta: TxnMeta, at: int | None = None) -> None:
        """Abort ``meta`` when its deadline (or ``at``, monotonic ms) passes while OPEN."""
        if meta.timer is not None:
            self.cancel(meta)
        with contextlib.suppress(RuntimeError):  # the scope is closed: closing
            meta.timer = self._timers.schedule(
                meta.deadline if at is None else at, self._fire_timeout_cb, meta.seq
            )

    def arm_all(self, metas: Sequence[TxnMeta], deadlines: Sequence[int] | None = None) -> None:
        """:meth:`arm` each (at ``deadlines`` if given) with one heap update."""
        if len(metas) == 1 and deadlines is None:
            self.arm(metas[0])
            return
        when = [m.deadline for m in metas] if deadlines is None else list(deadlines)
        handles = self._timers.schedule_many(when, self._fire_timeout_cb, [m.seq for m in metas])
        for meta, handle in zip(metas, handles, strict=True):
            meta.timer = handle

    def cancel(self, meta: TxnMeta) -> None:
        """Cancel ``meta``'s armed timeout or pending retry, if any."""
        if meta.timer is not None:
            self._timers.cancel(cast("TimerHandle", meta.timer))
            meta.timer = None

    def rearm_after_failure(self, meta: TxnMeta) -> None:
        """Re-arm the timeout of a decision that failed to log (after a backoff if due)."""
        if self._table.closed:
            return
        meta.retries += 1
        delay = max(RETRY_MIN_MS, self._policy.backoff_ms(meta.retries))
        self.arm(meta, max(meta.deadline, self._clock.monotonic_ms() + int(delay)))

    def retry_later(self, meta: TxnMeta) -> None:
        """Run ``meta``'s decided end again after a backoff (unless one is scheduled)."""
        if meta.timer is not None or self._table.closed:
            return
        meta.retries += 1
        delay = max(RETRY_MIN_MS, self._policy.backoff_ms(meta.retries))
        with contextlib.suppress(RuntimeError):
            meta.timer = self._timers.schedule(
                self._clock.monotonic_ms() + int(delay), self._fire_retry_cb, meta.seq
            )

    # -- runs (on the executor)

    def resume_all(self, seqs: Sequence[int]) -> None:
        """Finish the ends of ``seqs`` (decided earlier, found by recovery)."""
        for seq in seqs:
            self._submit(self._retry, seq)

    def _fire_timeout(self, seq: int) -> None:
        with self._table.lock:
            meta = self._table.txns.get(seq)
            if meta is not None:
                meta.timer = None  # this run is the timeout
        self._submit(self._timeout, seq)

    def _fire_retry(self, seq: int) -> None:
        with self._table.lock:
            meta = self._table.txns.get(seq)
            if meta is not None:
                meta.timer = None  # this run is the scheduled retry
        self._submit(self._retry, seq)

    def _timeout(self, seq: int) -> None:
        self._driver.run_background(seq, timed_out=True)

    def _retry(self, seq: int) -> None:
        self._driver.run_background(seq, timed_out=False)

    def _submit(self, fn: Callable[[int], None], seq: int) -> None:
        with self._idle:
            self._running += 1
        try:
            self._executor.submit(self._run, fn, seq)
        except RuntimeError:  # the executor is shut down: closing
            self._done()

    def _run(self, fn: Callable[[int], None], seq: int) -> None:
        try:
            fn(seq)
        finally:
            self._done()

    def _done(self) -> None:
        with self._idle:
            self._running -= 1
            if self._running == 0:
                self._idle.notify_all()

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no background run is queued or running; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._running == 0, timeout_s)


__all__ = [
    "RETRY_MIN_MS",
    "STEPS",
    "BackgroundEnds",
    "Completions",
    "EndDriver",
    "EndTrace",
    "NullParticipants",
    "Participant",
    "ParticipantResolver",
    "StepHook",
    "end_answer",
    "end_participants",
    "write_failed",
]
