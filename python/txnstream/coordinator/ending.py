"""Driving the end of transactions (SPEC §4.3, §4.4), one or many at a time.

One *driver* thread per transaction runs the steps; other callers wait for
it and get the same answer:

1. OPEN -> COMMITTING/ABORTING, logged (:meth:`EndDriver.claim` decides it
   under the table lock, the driver logs it);
2. every produced partition and acked subscription is ended, transient
   failures retried with backoff;
3. the outcome is recorded in the TerminatedTxnStore (PIP-255), durably;
4. COMMITTED/ABORTED is logged;
5. the transaction leaves memory and all its log records are deleted by
   position and batch index.

A client's single end runs the steps for its transaction, written through
the writer's normal batching (shared entries across threads); a bulk end
(:meth:`EndDriver.drive_many`) writes each step's records as one batch. The
participants are read from memory only after the ending UPDATE is durable,
so an ADD racing the end is either seen here or deleted when it lands.

A crash anywhere is repaired by recovery: step 1 not durable -> still OPEN
(it times out); steps 2-4 -> recovered as COMMITTING/ABORTING and finished
(participants and the store are idempotent); after 4 -> its leftover records
are purged.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from txnstream._native import TxnPosition, encode_txn_update
from txnstream.coordinator.background import BackgroundEnds
from txnstream.coordinator.counters import CoordinatorCounters
from txnstream.coordinator.durable import DurableWriter
from txnstream.coordinator.metadata import TxnMeta
from txnstream.coordinator.participants import (
    NullParticipants,
    ParticipantResolver,
    RetryPolicy,
    end_participants,
)
from txnstream.coordinator.recovery import PositionColumns
from txnstream.coordinator.status import TxnAction, TxnStatus, check_transition
from txnstream.coordinator.table import TransactionTable
from txnstream.coordinator.terminated import TerminatedTxnStore
from txnstream.coordinator.timeouts import Clock
from txnstream.coordinator.txn_id import TxnID
from txnstream.errors import TransactionError

#: Named steps of ending, reported to ``step_hook`` (crash tests stop there).
STEPS = ("ending_logged", "participants_done", "terminated_stored", "final_logged")

StepHook = Callable[[str, TxnID], None]

#: What :meth:`EndDriver.claim` decides: ``(meta, record, drive, done)``.
Claim = tuple[TxnMeta | None, bytes | None, bool, threading.Event | None]


class EndDriver:
    """Runs steps 1-5 for the transactions it claims; waits for other drivers.

    ``participants`` and ``step_hook`` may be replaced at any time; they are
    read when a transaction reaches the step that uses them. ``retry`` is
    the policy of a client's end (it may retry until close); background
    ends use ``background.policy`` (bounded per run).
    """

    def __init__(
        self,
        table: TransactionTable,
        writer: DurableWriter,
        store: TerminatedTxnStore,
        counters: CoordinatorCounters,
        background: BackgroundEnds,
        *,
        retry: RetryPolicy,
        stop: threading.Event,
        clock: Clock,
    ) -> None:
        self.participants: ParticipantResolver = NullParticipants()
        self.step_hook: StepHook | None = None
        self._table = table
        self._writer = writer
        self._store = store
        self._counters = counters
        self._background = background
        self._retry = retry
        self._stop = stop
        self._clock = clock

    def claim(self, seq: int, act: TxnAction, timed_out: bool) -> Claim:
        """Under the lock: decide what the caller does about ending ``seq``.

        Returns ``(meta, record, drive, done)``: ``meta`` None -> not in
        memory; ``drive`` -> the caller drives the end (``record``: the
        ending UPDATE to log first, None when resuming); ``done`` -> another
        thread drives, wait for it; neither -> ``meta`` is the answer.
        """
        meta = self._table.txns.get(seq)
        if meta is None or meta.status.is_final:
            return meta, None, False, None
        if meta.status is TxnStatus.OPEN:
            if timed_out and self._clock() < meta.deadline:
                return meta, None, False, None  # fired early (clock moved back)
            target = act.ending_status
            check_transition(self._table.tid(seq), meta.status, target)
            now = self._clock()
            record = encode_txn_update(
                self._table.tc_id, seq, now, TxnStatus.OPEN, target, timed_out
            )
            meta.status = target
            meta.timed_out = timed_out
            meta.last_modified = now
            if meta.timer is not None:
                self._background.cancel(meta)
            meta.driver = True
            return meta, record, True, None
        if timed_out:
            return meta, None, False, None
        if not meta.driver:
            meta.driver = True  # resume an end stalled by failures
            return meta, None, True, None
        if meta.done is None:
            meta.done = threading.Event()
        return meta, None, False, meta.done

    def end(
        self, seq: int, act: TxnAction, *, timed_out: bool, background: bool = False
    ) -> TxnMeta | None:
        """Drive or wait for the end of ``seq``; None if it is not in memory.

        With ``timed_out`` (the timer) nothing happens unless the transaction
        is still OPEN past its deadline. ``background`` (a pool thread):
        participants get a bounded number of attempts (``ParticipantsFailed``
        then), and an end another thread drives is not waited for.
        """
        table = self._table
        while True:
            with table.lock:
                table.check_open()
                meta, record, drive, done = self.claim(seq, act, timed_out)
            if meta is None:
                return None
            if drive:
                self._drive_one(meta, record, background)
                return meta
            if done is None or background:
                return meta
            done.wait()
            if meta.status.is_final:
                return meta
            # The driver gave up (failure); loop to take over or report.

    def _drive_one(self, meta: TxnMeta, record: bytes | None, background: bool) -> None:
        """Run steps 1-5 for one claimed transaction; refusals raise.

        A client's own end: the writer's batching shares entries across threads.
        """
        writer = self._writer
        try:
            if record is not None:
                try:
                    pos = writer.write(record)
                except BaseException:
                    self._ending_not_logged(meta)
                    raise
                writer.attach_one(meta, pos)
            final_record, now = self._end_participants(meta, background)
            with self._table.lock:
                self._table.check_open()
            last = writer.write(final_record)
            self._hook("final_logged", meta.seq)
            with self._table.lock:
                positions = self._finish_locked(meta, last, now)
                span = self._table.release_span(meta)
            writer.log.delete(positions)
            if span is not None:
                writer.log.delete_columns(span)
        finally:
            self._release(meta)

    def drive_many(
        self, claimed: list[tuple[TxnMeta, bytes | None]]
    ) -> list[TransactionError | None]:
        """Run steps 1-5 for many claimed transactions, each step's records as one batch.

        Returns, per transaction, None when it ended or the refusal that
        stopped it in steps 2-3 (e.g. ``ParticipantsFailed``; it stays
        COMMITTING/ABORTING): one refused does not stop the others. A log
        write failure raises. Every claimed transaction is released in the end.
        """
        writer = self._writer
        refusals: list[TransactionError | None] = [None] * len(claimed)
        try:
            # Step 1: the OPEN ones log their ending UPDATE (resumed ones did).
            fresh = [(m, r) for m, r in claimed if r is not None]
            if fresh:
                try:
                    positions = writer.write_many([r for _, r in fresh])
                except BaseException:
                    for m, _ in fresh:
                        self._ending_not_logged(m)
                    raise
                writer.attach(zip([m for m, _ in fresh], positions, strict=True))
            # Steps 2-3 per transaction.
            finals: list[tuple[TxnMeta, bytes, int]] = []
            for i, (meta, _) in enumerate(claimed):
                try:
                    record, now = self._end_participants(meta, False)
                except TransactionError as exc:
                    refusals[i] = exc
                    continue
                finals.append((meta, record, now))
            if not finals:
                return refusals
            with self._table.lock:
                self._table.check_open()
            lasts = writer.write_many([r for _, r, _ in finals])
            for meta, _, _ in finals:
                self._hook("final_logged", meta.seq)
            deletes: list[TxnPosition] = []
            spans: list[PositionColumns] = []
            with self._table.lock:
                for (meta, _, now), last in zip(finals, lasts, strict=True):
                    deletes.extend(self._finish_locked(meta, last, now))
                    span = self._table.release_span(meta)
                    if span is not None:
                        spans.append(span)
            writer.log.delete(deletes)
            for cols in spans:
                writer.log.delete_columns(cols)
            return refusals
        finally:
            for meta, _ in claimed:
                self._release(meta)

    def _end_participants(self, meta: TxnMeta, background: bool) -> tuple[bytes, int]:
        """Run steps 2-3 once the ending UPDATE is durable; return the final record."""
        seq = meta.seq
        tid = self._table.tid(seq)
        commit = meta.status is TxnStatus.COMMITTING
        self._hook("ending_logged", seq)
        end_participants(
            tid,
            commit,
            list(meta.partitions or ()),
            list(meta.subscriptions or ()),
            self.participants,
            self._background.policy if background else self._retry,
            self._stop,
        )
        self._hook("participants_done", seq)
        final = TxnStatus.COMMITTED if commit else TxnStatus.ABORTED
        self._store.record(tid, meta.client_name, final, timed_out=meta.timed_out)
        self._hook("terminated_stored", seq)
        now = self._clock()
        record = encode_txn_update(self._table.tc_id, seq, now, meta.status, final, meta.timed_out)
        return record, now

    def _finish_locked(self, meta: TxnMeta, last: TxnPosition, now: int) -> list[TxnPosition]:
        # Step 5 under the lock: leave memory; return the records to delete.
        commit = meta.status is TxnStatus.COMMITTING
        meta.status = TxnStatus.COMMITTED if commit else TxnStatus.ABORTED
        # last_modified is still the time of the ending UPDATE.
        self._counters.ended(commit, meta.timed_out, max(0, now - meta.last_modified))
        meta.last_modified = now
        self._table.txns.pop(meta.seq, None)
        positions = meta.positions
        positions.append(last)
        meta.positions = []
        meta.partitions = meta.subscriptions = None
        if meta.timer is not None:  # a pending background retry
            self._background.cancel(meta)
        return positions

    def _ending_not_logged(self, meta: TxnMeta) -> None:
        # The ending UPDATE failed: as far as the log knows it is still OPEN.
        with self._table.lock:
            meta.status = TxnStatus.OPEN
            meta.timed_out = False
            if not self._table.closed:
                self._background.arm(meta)

    def _release(self, meta: TxnMeta) -> None:
        with self._table.lock:
            meta.driver = False
            done, meta.done = meta.done, None
        if done is not None:
            done.set()

    def _hook(self, step: str, seq: int) -> None:
        if self.step_hook is not None:
            self.step_hook(step, self._table.tid(seq))


__all__ = ["STEPS", "Claim", "EndDriver", "StepHook"]
