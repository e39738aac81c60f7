"""Background ends: timeouts, resumes after recovery, retries of stalled ends.

Nobody waits for these ends, so they run on a small thread pool and must
never occupy it: each run makes a bounded number of attempts on failing
participants (``CoordinatorConfig.background_end_attempts``) and then
reschedules itself through the timer with backoff. Timeouts are one shared
callback per coordinator plus the sequence as argument (no closure per
transaction, SPEC §4.3 "when it passes while OPEN the TC aborts it").

A timeout starts an end and a failed end re-arms the timeout, so this and
the :class:`~.ending.EndDriver` know each other; the driver is attached once
with :meth:`BackgroundEnds.bind` when the coordinator is wired.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, cast

from txnstream.coordinator.metadata import TxnMeta
from txnstream.coordinator.participants import ParticipantsFailed, RetryPolicy
from txnstream.coordinator.status import TxnAction, TxnStatus
from txnstream.coordinator.table import TransactionTable
from txnstream.coordinator.timeouts import Clock, TimerHandle, TimerService

if TYPE_CHECKING:
    from txnstream.coordinator.ending import EndDriver

log = logging.getLogger(__name__)

#: Shortest delay before a background end whose participants failed runs again.
BACKGROUND_RETRY_MIN_MS = 20


class BackgroundEnds:
    """Arms timeouts and runs ends nobody waits for, with bounded attempts per run.

    ``policy`` is the retry policy of one background run (its
    ``max_attempts`` is the per-run bound). Arming and cancelling are called
    with the table lock held.
    """

    def __init__(
        self,
        table: TransactionTable,
        timers: TimerService,
        executor: ThreadPoolExecutor,
        clock: Clock,
        policy: RetryPolicy,
    ) -> None:
        self.policy = policy
        self._table = table
        self._timers = timers
        self._executor = executor
        self._clock = clock
        self._driver: EndDriver | None = None
        # Bound once: every timer shares them (no closure per transaction).
        self._fire_timeout_cb = self._fire_timeout
        self._fire_resume_cb = self._fire_resume

    def bind(self, driver: EndDriver) -> None:
        """Attach the driver that runs the ends (once, while wiring)."""
        self._driver = driver

    # ----------------------------------------------------------- timeouts

    def arm(self, meta: TxnMeta) -> None:
        """Under the lock: abort ``meta`` when its deadline passes while OPEN."""
        meta.timer = self._timers.schedule(meta.deadline, self._fire_timeout_cb, meta.seq)

    def arm_all(self, metas: Sequence[TxnMeta], deadlines: Sequence[int] | None = None) -> None:
        """Under the lock: :meth:`arm` each (at ``deadlines`` if given), one heap update."""
        if len(metas) == 1 and deadlines is None:
            self.arm(metas[0])
            return
        when = [m.deadline for m in metas] if deadlines is None else list(deadlines)
        handles = self._timers.schedule_many(when, self._fire_timeout_cb, [m.seq for m in metas])
        for meta, handle in zip(metas, handles, strict=True):
            meta.timer = handle

    def cancel(self, meta: TxnMeta) -> None:
        """Under the lock: cancel ``meta``'s armed timeout or pending retry, if any."""
        if meta.timer is not None:
            self._timers.cancel(cast("TimerHandle", meta.timer))
            meta.timer = None

    def _fire_timeout(self, seq: int) -> None:
        # RuntimeError: executor shut down, the coordinator is closing.
        with contextlib.suppress(RuntimeError):
            self._executor.submit(self.on_timeout, seq)

    def on_timeout(self, seq: int) -> None:
        """Abort ``seq`` if it is still OPEN past its deadline (a pool thread)."""
        meta = self._end(seq, TxnAction.ABORT, timed_out=True)
        if meta is not None:
            with self._table.lock:
                if meta.status is TxnStatus.OPEN and not self._table.closed:
                    self.arm(meta)

    # ------------------------------------------------------------ resumes

    def resume_all(self, seqs: Sequence[int]) -> None:
        """Finish the ends of ``seqs`` (decided earlier, e.g. found by recovery)."""
        for seq in seqs:
            self._executor.submit(self._resume, seq)

    def _ending_meta(self, seq: int) -> TxnMeta | None:
        # Under the lock: ``seq`` if its end is decided and still to finish here.
        meta = self._table.txns.get(seq)
        if meta is None or self._table.closed or not meta.status.is_ending:
            return None
        return meta

    def _resume(self, seq: int) -> None:
        with self._table.lock:
            meta = self._ending_meta(seq)
            if meta is None:
                return
            meta.timer = None  # this run is the scheduled retry
            act = TxnAction.COMMIT if meta.status is TxnStatus.COMMITTING else TxnAction.ABORT
        self._end(seq, act, timed_out=False)

    def _end(self, seq: int, act: TxnAction, *, timed_out: bool) -> TxnMeta | None:
        driver = self._driver
        assert driver is not None, "BackgroundEnds.bind was not called"
        try:
            return driver.end(seq, act, timed_out=timed_out, background=True)
        except ParticipantsFailed:
            self._retry_later(seq)
        except Exception:
            if not self._table.closed:
                log.exception(
                    "ending transaction %s in the background failed", self._table.tid(seq)
                )
        return None

    def _retry_later(self, seq: int) -> None:
        """Reschedule a background end whose participants kept failing (backoff)."""
        with self._table.lock:
            meta = self._ending_meta(seq)
            if meta is None:
                return
            if meta.timer is not None:
                return  # a retry is already scheduled
            meta.retries += 1
            policy = self.policy
            attempt = meta.retries * (policy.max_attempts or 1)
            delay = max(BACKGROUND_RETRY_MIN_MS, policy.backoff_ms(attempt))
            meta.timer = self._timers.schedule(
                self._clock() + int(delay), self._fire_resume_cb, seq
            )

    def _fire_resume(self, seq: int) -> None:
        with contextlib.suppress(RuntimeError):
            self._executor.submit(self._resume, seq)


__all__ = ["BACKGROUND_RETRY_MIN_MS", "BackgroundEnds"]
