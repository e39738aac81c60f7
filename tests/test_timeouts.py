from __future__ import annotations

import functools
import threading
import time

from txnstream.coordinator.timeouts import TimerService


class FakeClock:
    def __init__(self, now: int = 1_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def test_run_due_in_deadline_order_with_fake_clock() -> None:
    clock = FakeClock()
    timers = TimerService(clock, start=False)
    fired: list[str] = []
    timers.schedule(1_300, lambda: fired.append("c"))
    timers.schedule(1_100, lambda: fired.append("a"))
    timers.schedule(1_200, lambda: fired.append("b"))
    assert timers.run_due() == 0
    clock.now = 1_200
    assert timers.run_due() == 2
    assert fired == ["a", "b"]
    clock.now = 5_000
    timers.run_due()
    assert fired == ["a", "b", "c"]
    assert len(timers) == 0


def test_cancel_prevents_callback_and_purges_heap() -> None:
    clock = FakeClock()
    timers = TimerService(clock, start=False)
    fired: list[int] = []
    handles = [timers.schedule(2_000 + i, functools.partial(fired.append, i)) for i in range(1_000)]
    for h in handles[:900]:
        assert timers.cancel(h)
    assert not timers.cancel(handles[0])
    assert len(timers) == 100
    # Dead entries do not accumulate: the heap was rebuilt.
    assert timers.heap_size() < 300
    clock.now = 10_000
    assert timers.run_due() == 100
    assert fired == list(range(900, 1_000))
    assert not timers.cancel(handles[950])


def test_thread_fires_real_time() -> None:
    timers = TimerService()
    done = threading.Event()
    start = time.monotonic()
    timers.schedule(int(time.time() * 1000) + 30, done.set)
    assert done.wait(5)
    assert time.monotonic() - start >= 0.02
    timers.close()


def test_thread_notices_fake_clock_jump_after_poke() -> None:
    clock = FakeClock()
    timers = TimerService(clock, max_wait_ms=10_000)
    done = threading.Event()
    timers.schedule(1_000_000, done.set)
    assert not done.wait(0.05)
    clock.now = 1_000_000
    timers.poke()
    assert done.wait(5)
    timers.close()


def test_failing_callback_does_not_stop_timer() -> None:
    clock = FakeClock()
    timers = TimerService(clock, start=False)
    fired: list[int] = []

    def boom() -> None:
        raise RuntimeError("boom")

    timers.schedule(1, boom)
    timers.schedule(2, lambda: fired.append(1))
    assert timers.run_due() == 2
    assert fired == [1]


def test_close_drops_pending_and_rejects_new() -> None:
    timers = TimerService()
    timers.schedule(int(time.time() * 1000) + 60_000, lambda: None)
    timers.close()
    assert len(timers) == 0
    try:
        timers.schedule(0, lambda: None)
    except RuntimeError:
        pass
    else:
        raise AssertionError("schedule after close must fail")
