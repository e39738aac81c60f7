"""Time for the whole engine: an injectable clock and one timer service per broker.

**Clocks.** In-process deadlines (transaction timeouts, retry backoff, how
long a client waits) use *monotonic* milliseconds, so a wall-clock step
(NTP) never fires or delays them; *wall* milliseconds are only what gets
logged (start and modification times, when a terminated transaction ended)
and compared across restarts. A :class:`Clock` gives both, and also owns
waiting, so a test clock (``txnstream.testing.ManualClock``) makes timing
deterministic without real sleeps.

**Timers.** :class:`TimerService` runs callbacks at monotonic deadlines on
one daemon thread over a heap. A broker makes one and its components share
it (coordinator timeouts and retries, terminated-store sweeps, later the
transaction buffer's snapshots and pending-ack work): each takes a
:class:`TimerScope`, whose ``close()`` drops that component's pending
timers without touching the others'. A coordinator may hold hundreds of
thousands of timeouts, so each is one small heap entry; cancelling marks it
dead (lazy deletion) and the heap is rebuilt when dead entries outnumber
live ones. Callbacks must be quick (hand real work to an executor).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

log = logging.getLogger(__name__)

#: Longest :meth:`TimerService.close` waits for a callback still running (s);
#: past it, close returns and the callback finishes (or fails) on its own.
CLOSE_JOIN_S = 30.0

_NO_ARG = object()


@runtime_checkable
class Clock(Protocol):
    """Monotonic and wall-clock milliseconds, and waiting on the same time."""

    def monotonic_ms(self) -> int:
        """Milliseconds of a clock that never goes back (deadlines, durations)."""

    def wall_ms(self) -> int:
        """Milliseconds since the epoch (what logs record)."""

    def wait(self, event: threading.Event, timeout_ms: float) -> bool:
        """Wait until ``event`` is set or ``timeout_ms`` passed; return ``event.is_set()``."""


class SystemClock:
    """The operating system's clocks (``time.monotonic_ns``, ``time.time_ns``)."""

    def monotonic_ms(self) -> int:
        """Milliseconds of ``time.monotonic``."""
        return time.monotonic_ns() // 1_000_000

    def wall_ms(self) -> int:
        """Milliseconds since the epoch."""
        return time.time_ns() // 1_000_000

    def wait(self, event: threading.Event, timeout_ms: float) -> bool:
        """``event.wait`` for ``timeout_ms`` (at least 0)."""
        return event.wait(max(0.0, timeout_ms) / 1000.0)


#: The clock used when none is given.
SYSTEM_CLOCK = SystemClock()


def clock_arg(clock: object) -> Clock:
    """Return ``clock`` (None: the system clock) if it is a :class:`Clock`."""
    if clock is None:
        return SYSTEM_CLOCK
    if not isinstance(clock, Clock):
        from txnstream.errors import InvalidArgumentError

        raise InvalidArgumentError(
            f"clock must have monotonic_ms(), wall_ms() and wait(), got {clock!r}",
            argument="clock",
            value=clock,
        )
    return clock


#: Longest wait our API takes, in ms (about 35 years; None waits without a limit).
MAX_WAIT_MS = 1 << 40


def timeout_ms_arg(value: object, argument: str = "timeout_ms") -> int | None:
    """Return ``value`` if it is None or an int in ``0..MAX_WAIT_MS`` (a wait in ms)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_WAIT_MS:
        from txnstream.errors import InvalidArgumentError

        raise InvalidArgumentError(
            f"{argument} must be an int from 0 to {MAX_WAIT_MS} (milliseconds), or None for "
            f"no limit; got {value!r}",
            argument=argument,
            value=value,
        )
    return value


class TimerHandle:
    """A scheduled callback; cancel it through its service or scope."""

    __slots__ = ("arg", "callback", "cancelled", "deadline", "queued", "scope")

    def __init__(
        self,
        deadline: int,
        callback: Callable[..., None],
        arg: object,
        scope: TimerScope | None,
    ) -> None:
        self.deadline = deadline
        self.callback: Callable[..., None] | None = callback
        # One shared callback + a per-timer argument costs less than a closure each.
        self.arg = arg
        self.cancelled = False
        self.scope = scope
        #: In the service's heap (False once taken out to run, or dropped).
        self.queued = True

    def run(self, callback: Callable[..., None]) -> None:
        """Invoke ``callback`` (with ``arg`` when one was given)."""
        if self.arg is _NO_ARG:
            callback()
        else:
            callback(self.arg)


class TimerService:
    """Runs callbacks at monotonic deadlines (clock ms) on a single daemon thread.

    ``start=False`` runs no thread: callbacks run only in :meth:`run_due`
    (tests with a manual clock). An exception in a callback is logged and
    does not stop the timer.
    """

    def __init__(
        self,
        clock: Clock | None = None,
        *,
        name: str = "txnstream-timer",
        max_wait_ms: int = 1000,
        start: bool = True,
    ) -> None:
        self.clock = clock_arg(clock)
        if isinstance(max_wait_ms, bool) or not isinstance(max_wait_ms, int) or max_wait_ms < 1:
            # 0 or less would make the timer thread spin.
            from txnstream.errors import InvalidArgumentError

            raise InvalidArgumentError(
                f"max_wait_ms must be a positive int (milliseconds), got {max_wait_ms!r}",
                argument="max_wait_ms",
                value=max_wait_ms,
            )
        self._heap: list[tuple[int, int, TimerHandle]] = []
        self._seq = itertools.count()
        self._dead = 0
        self._cond = threading.Condition(threading.Lock())
        self._closed = False
        # Bounds each sleep so an injected clock that jumps is noticed.
        self._max_wait = max_wait_ms / 1000.0
        self._thread: threading.Thread | None = None
        if start:
            self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
            self._thread.start()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def scope(self) -> TimerScope:
        """Return a new scope of this service for one component (see :class:`TimerScope`)."""
        return TimerScope(self)

    def schedule(
        self,
        deadline_ms: int,
        callback: Callable[..., None],
        arg: object = _NO_ARG,
        *,
        scope: TimerScope | None = None,
    ) -> TimerHandle:
        """Run ``callback()`` (or ``callback(arg)``) once the clock reaches ``deadline_ms``."""
        handle = TimerHandle(deadline_ms, callback, arg, scope)
        with self._cond:
            self._check(scope)
            first = not self._heap or deadline_ms < self._heap[0][0]
            heapq.heappush(self._heap, (deadline_ms, next(self._seq), handle))
            if first:
                self._cond.notify()
        return handle

    def schedule_many(
        self,
        deadlines: list[int],
        callback: Callable[..., None],
        args: list[object],
        *,
        scope: TimerScope | None = None,
    ) -> list[TimerHandle]:
        """Schedule ``callback(args[i])`` at ``deadlines[i]`` for every ``i``.

        One lock and one heapify for all (recovery re-arms every open
        transaction at once); returns the handles in input order.
        """
        if len(deadlines) != len(args):
            raise ValueError("deadlines and args must have the same length")
        handles = [TimerHandle(d, callback, a, scope) for d, a in zip(deadlines, args, strict=True)]
        with self._cond:
            self._check(scope)
            seq = self._seq
            self._heap.extend((d, next(seq), h) for d, h in zip(deadlines, handles, strict=True))
            heapq.heapify(self._heap)
            self._cond.notify()
        return handles

    def _check(self, scope: TimerScope | None) -> None:
        if self._closed or (scope is not None and scope.closed):
            raise RuntimeError("timer service is closed")

    def cancel(self, handle: TimerHandle) -> bool:
        """Cancel ``handle``; return False if it already ran or was cancelled."""
        with self._cond:
            if handle.cancelled or handle.callback is None:
                return False
            handle.cancelled = True
            handle.callback = None
            scope = handle.scope
            if not handle.queued or self._closed or (scope is not None and scope.closed):
                return True  # not in the heap (taken out to run, or dropped at a close)
            self._dead += 1
            if self._dead > 64 and self._dead * 2 > len(self._heap):
                self._purge(lambda h: h.cancelled)
            return True

    def _purge(self, drop: Callable[[TimerHandle], bool]) -> None:
        # Under the lock: rebuild the heap without the entries ``drop`` picks.
        self._heap = [e for e in self._heap if not drop(e[2])]
        heapq.heapify(self._heap)
        self._dead = sum(1 for e in self._heap if e[2].cancelled)

    def _close_scope(self, scope: TimerScope) -> None:
        with self._cond:
            scope.closed = True
            self._purge(lambda h: h.scope is scope or h.cancelled)

    def __len__(self) -> int:
        """Return the number of live (not cancelled, not yet run) timers."""
        with self._cond:
            return len(self._heap) - self._dead

    def heap_size(self) -> int:
        """Entries in the heap including cancelled ones not yet purged."""
        with self._cond:
            return len(self._heap)

    def poke(self) -> None:
        """Wake the timer thread (after advancing an injected clock)."""
        with self._cond:
            self._cond.notify()

    def _pop_due(self, now: int) -> list[TimerHandle]:
        # Under the lock: take the due timers out of the heap. Each one is
        # claimed only just before it runs (_run): until then a cancel or a
        # scope's close still stops it.
        due: list[TimerHandle] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, _, handle = heapq.heappop(heap)
            handle.queued = False
            if handle.cancelled:
                self._dead -= 1
                continue
            due.append(handle)
        return due

    def run_due(self) -> int:
        """Run every callback whose deadline has passed, in this thread; return how many."""
        with self._cond:
            due = self._pop_due(self.clock.monotonic_ms())
        return self._run(due)

    def _run(self, due: list[TimerHandle]) -> int:
        # One by one: a timer cancelled (or its scope or the service closed)
        # while an earlier one ran does not run.
        ran = 0
        for handle in due:
            with self._cond:
                cb = handle.callback
                scope = handle.scope
                if cb is None or self._closed or (scope is not None and scope.closed):
                    continue
                handle.callback = None  # claimed: a cancel from now on says "ran"
            ran += 1
            try:
                handle.run(cb)
            except Exception:
                log.exception("timer callback failed")
        return ran

    def _loop(self) -> None:
        clock = self.clock
        while True:
            with self._cond:
                if self._closed:
                    return
                due = self._pop_due(clock.monotonic_ms())
                if not due:
                    wait = self._max_wait
                    if self._heap:
                        ahead = (self._heap[0][0] - clock.monotonic_ms()) / 1000.0
                        wait = min(wait, max(0.0, ahead))
                    self._cond.wait(wait)
                    continue
            self._run(due)

    def close(self) -> None:
        """Stop the thread; pending callbacks never run.

        Waits for a callback already running, for at most :data:`CLOSE_JOIN_S`
        (a callback stuck in a call without a deadline must not hang close).
        """
        with self._cond:
            self._closed = True
            self._heap.clear()
            self._dead = 0
            self._cond.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(CLOSE_JOIN_S)
            if thread.is_alive():
                log.warning(
                    "timer thread %s still runs a callback after %.0f s; closing without it",
                    thread.name,
                    CLOSE_JOIN_S,
                )


class TimerScope:
    """One component's timers on a shared :class:`TimerService`.

    Same calls as the service; :meth:`close` drops every pending timer of
    this scope (they never run) and refuses new ones with ``RuntimeError``.
    """

    def __init__(self, service: TimerService) -> None:
        self.service = service
        self.clock = service.clock
        self.closed = False

    def schedule(
        self, deadline_ms: int, callback: Callable[..., None], arg: object = _NO_ARG
    ) -> TimerHandle:
        """:meth:`TimerService.schedule` in this scope."""
        return self.service.schedule(deadline_ms, callback, arg, scope=self)

    def schedule_many(
        self, deadlines: list[int], callback: Callable[..., None], args: list[object]
    ) -> list[TimerHandle]:
        """:meth:`TimerService.schedule_many` in this scope."""
        return self.service.schedule_many(deadlines, callback, args, scope=self)

    def cancel(self, handle: TimerHandle) -> bool:
        """Cancel ``handle``; False if it already ran or was cancelled."""
        return self.service.cancel(handle)

    def live_count(self) -> int:
        """Live timers of this scope (a scan of the heap; for stats and tests)."""
        with self.service._cond:
            return sum(
                1
                for _, _, h in self.service._heap
                if h.scope is self and not h.cancelled and h.callback is not None
            )

    def close(self) -> None:
        """Drop this scope's pending timers; later ``schedule`` calls fail."""
        self.service._close_scope(self)


__all__ = [
    "SYSTEM_CLOCK",
    "Clock",
    "SystemClock",
    "TimerHandle",
    "TimerScope",
    "TimerService",
    "clock_arg",
]
