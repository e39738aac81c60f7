"""One timer thread over a priority queue (heapq) for all transaction timeouts.

A coordinator may hold hundreds of thousands of open transactions; a thread
or ``threading.Timer`` each would not scale. Here every timeout is one small
heap entry; cancelling marks it dead (lazy deletion) and the heap is rebuilt
when dead entries outnumber live ones, so committed transactions do not keep
memory until their deadline.

The clock is injectable (milliseconds); with a fake clock, tests call
:meth:`TimerService.run_due` or :meth:`poke` after advancing it.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

Clock = Callable[[], int]
_NO_ARG = object()


def wall_clock_ms() -> int:
    """Milliseconds since the epoch (what the transaction log records)."""
    return time.time_ns() // 1_000_000


class TimerHandle:
    """A scheduled callback; :meth:`cancel` prevents it from running."""

    __slots__ = ("arg", "callback", "cancelled", "deadline")

    def __init__(self, deadline: int, callback: Callable[..., None], arg: object = _NO_ARG) -> None:
        self.deadline = deadline
        self.callback: Callable[..., None] | None = callback
        # One shared callback + a per-timer argument costs less than a closure each.
        self.arg = arg
        self.cancelled = False

    def run(self, callback: Callable[..., None]) -> None:
        """Invoke ``callback`` (with ``arg`` when one was given)."""
        if self.arg is _NO_ARG:
            callback()
        else:
            callback(self.arg)


class TimerService:
    """Runs callbacks at deadlines (clock ms) on a single daemon thread.

    Callbacks must be quick (hand real work to an executor); an exception in
    one is logged and does not stop the timer.
    """

    def __init__(
        self,
        clock: Clock = wall_clock_ms,
        *,
        name: str = "txnstream-timer",
        max_wait_ms: int = 1000,
        start: bool = True,
    ) -> None:
        self._clock = clock
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

    def schedule(
        self, deadline_ms: int, callback: Callable[..., None], arg: object = _NO_ARG
    ) -> TimerHandle:
        """Run ``callback()`` (or ``callback(arg)``) once the clock reaches ``deadline_ms``."""
        handle = TimerHandle(deadline_ms, callback, arg)
        with self._cond:
            if self._closed:
                raise RuntimeError("timer service is closed")
            first = not self._heap or deadline_ms < self._heap[0][0]
            heapq.heappush(self._heap, (deadline_ms, next(self._seq), handle))
            if first:
                self._cond.notify()
        return handle

    def schedule_many(
        self, deadlines: list[int], callback: Callable[..., None], args: list[object]
    ) -> list[TimerHandle]:
        """Schedule ``callback(args[i])`` at ``deadlines[i]`` for every ``i``.

        One lock and one heapify for all (recovery re-arms every open
        transaction at once); returns the handles in input order.
        """
        if len(deadlines) != len(args):
            raise ValueError("deadlines and args must have the same length")
        handles = [TimerHandle(d, callback, a) for d, a in zip(deadlines, args, strict=True)]
        with self._cond:
            if self._closed:
                raise RuntimeError("timer service is closed")
            seq = self._seq
            self._heap.extend((d, next(seq), h) for d, h in zip(deadlines, handles, strict=True))
            heapq.heapify(self._heap)
            self._cond.notify()
        return handles

    def cancel(self, handle: TimerHandle) -> bool:
        """Cancel ``handle``; return False if it already ran or was cancelled."""
        with self._cond:
            if handle.cancelled or handle.callback is None:
                return False
            handle.cancelled = True
            handle.callback = None
            self._dead += 1
            if self._dead > 64 and self._dead * 2 > len(self._heap):
                self._heap = [e for e in self._heap if not e[2].cancelled]
                heapq.heapify(self._heap)
                self._dead = 0
            return True

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

    def _pop_due(self, now: int) -> list[tuple[TimerHandle, Callable[..., None]]]:
        due: list[tuple[TimerHandle, Callable[..., None]]] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, _, handle = heapq.heappop(heap)
            if handle.cancelled:
                self._dead -= 1
                continue
            if handle.callback is not None:
                due.append((handle, handle.callback))
                handle.callback = None
        return due

    def run_due(self) -> int:
        """Run every callback whose deadline has passed, in this thread."""
        with self._cond:
            due = self._pop_due(self._clock())
        self._run(due)
        return len(due)

    @staticmethod
    def _run(due: list[tuple[TimerHandle, Callable[..., None]]]) -> None:
        for handle, cb in due:
            try:
                handle.run(cb)
            except Exception:
                log.exception("timer callback failed")

    def _loop(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                due = self._pop_due(self._clock())
                if not due:
                    wait = self._max_wait
                    if self._heap:
                        wait = min(wait, max(0.0, (self._heap[0][0] - self._clock()) / 1000.0))
                    self._cond.wait(wait)
                    continue
            self._run(due)

    def close(self) -> None:
        """Stop the thread; pending callbacks never run."""
        with self._cond:
            self._closed = True
            self._heap.clear()
            self._dead = 0
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()


__all__ = ["Clock", "TimerHandle", "TimerService", "wall_clock_ms"]
