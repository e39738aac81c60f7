"""The timer service: deadlines on a monotonic clock, cancellation, scopes, threads."""

from __future__ import annotations

import functools
import threading
import time

import pytest

from txnstream.testing import ManualClock
from txnstream.timer import SYSTEM_CLOCK, TimerService


def test_run_due_in_deadline_order_with_manual_clock() -> None:
    clock = ManualClock(monotonic_ms=1_000)
    timers = TimerService(clock, start=False)
    fired: list[str] = []
    timers.schedule(1_300, lambda: fired.append("c"))
    timers.schedule(1_100, lambda: fired.append("a"))
    timers.schedule(1_200, lambda: fired.append("b"))
    assert timers.run_due() == 0
    clock.advance(200)
    assert timers.run_due() == 2
    assert fired == ["a", "b"]
    clock.advance(5_000)
    timers.run_due()
    assert fired == ["a", "b", "c"]
    assert len(timers) == 0


def test_deadlines_follow_the_monotonic_clock_not_the_wall_clock() -> None:
    clock = ManualClock(monotonic_ms=0)
    timers = TimerService(clock, start=False)
    fired: list[int] = []
    timers.schedule(1_000, fired.append, 1)
    clock.step_wall(86_400_000)  # the wall clock jumps a day ahead
    assert timers.run_due() == 0
    clock.advance(1_000)
    assert timers.run_due() == 1
    assert fired == [1]


def test_cancel_prevents_callback_and_purges_heap() -> None:
    clock = ManualClock(monotonic_ms=1_000)
    timers = TimerService(clock, start=False)
    fired: list[int] = []
    handles = [timers.schedule(2_000 + i, functools.partial(fired.append, i)) for i in range(1_000)]
    for h in handles[:900]:
        assert timers.cancel(h)
    assert not timers.cancel(handles[0])
    assert len(timers) == 100
    # Dead entries do not accumulate: the heap was rebuilt.
    assert timers.heap_size() < 300
    clock.advance(10_000)
    assert timers.run_due() == 100
    assert fired == list(range(900, 1_000))
    assert not timers.cancel(handles[950])


def test_a_closed_scope_drops_only_its_own_timers() -> None:
    clock = ManualClock(monotonic_ms=0)
    timers = TimerService(clock, start=False)
    a, b = timers.scope(), timers.scope()
    fired: list[str] = []
    for i in range(50):
        a.schedule(100 + i, fired.append, "a")
        b.schedule(100 + i, fired.append, "b")
    a.close()
    assert a.live_count() == 0 and b.live_count() == 50
    assert timers.heap_size() == 50  # a's entries are gone, not just dead
    with pytest.raises(RuntimeError):
        a.schedule(1, fired.append, "late")
    clock.advance(1_000)
    assert timers.run_due() == 50
    assert set(fired) == {"b"}


def test_thread_fires_on_its_own() -> None:
    timers = TimerService()
    done = threading.Event()
    timers.schedule(SYSTEM_CLOCK.monotonic_ms() + 30, done.set)
    assert done.wait(30)
    timers.close()


def test_thread_notices_manual_clock_jump_after_poke() -> None:
    clock = ManualClock(monotonic_ms=0)
    timers = TimerService(clock, max_wait_ms=10_000)
    done = threading.Event()
    timers.schedule(1_000_000, done.set)
    clock.advance(999_999)
    timers.poke()
    assert not done.is_set()
    clock.advance(1)
    timers.poke()
    assert done.wait(30)
    timers.close()


def test_failing_callback_does_not_stop_timer() -> None:
    clock = ManualClock(monotonic_ms=0)
    timers = TimerService(clock, start=False)
    fired: list[int] = []

    def boom() -> None:
        raise RuntimeError("boom")

    timers.schedule(1, boom)
    timers.schedule(2, lambda: fired.append(1))
    clock.advance(5)
    assert timers.run_due() == 2
    assert fired == [1]


def test_close_drops_pending_and_rejects_new() -> None:
    timers = TimerService()
    timers.schedule(SYSTEM_CLOCK.monotonic_ms() + 60_000, lambda: None)
    timers.close()
    assert len(timers) == 0
    with pytest.raises(RuntimeError):
        timers.schedule(0, lambda: None)


def test_manual_clock_waits_advance_its_time() -> None:
    clock = ManualClock(monotonic_ms=0)
    ev = threading.Event()
    assert not clock.wait(ev, 25)
    assert clock.monotonic_ms() == 25
    ev.set()
    assert clock.wait(ev, 1_000)
    assert clock.monotonic_ms() == 25


def test_cancelling_a_timer_of_a_closed_scope_or_service_keeps_the_count() -> None:
    timers = TimerService(ManualClock(monotonic_ms=0), start=False)
    scope = timers.scope()
    mine = scope.schedule(60_000, lambda: None)
    other = timers.schedule(60_000, lambda: None)
    scope.close()
    assert scope.cancel(mine)  # it will never run
    assert len(timers) == 1
    timers.close()
    assert timers.cancel(other)
    assert len(timers) == 0


def test_a_due_timer_cancelled_or_scope_closed_before_it_runs_never_runs() -> None:
    # Timers due together are taken out of the heap together; one waiting
    # behind a slow callback was already marked as run: cancel() said
    # "already ran", its scope's close() returned, and it ran anyway.
    svc = TimerService()
    try:
        slow, s2, s3 = svc.scope(), svc.scope(), svc.scope()
        started, gate = threading.Event(), threading.Event()
        ran: list[str] = []
        due = svc.clock.monotonic_ms() + 100

        def slow_callback() -> None:
            started.set()
            gate.wait(5)

        slow.schedule(due, slow_callback)
        cancelled = s2.schedule(due, lambda: ran.append("cancelled"))
        s3.schedule(due, lambda: ran.append("closed scope"))
        assert started.wait(5)
        assert s2.cancel(cancelled)  # it has not run: the cancel takes
        s3.close()
        gate.set()
        time.sleep(0.2)
        assert ran == []
        assert len(svc) == 0
    finally:
        svc.close()


def test_close_does_not_wait_forever_for_a_stuck_callback(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import txnstream.timer

    monkeypatch.setattr(txnstream.timer, "CLOSE_JOIN_S", 0.2)
    service = TimerService(SYSTEM_CLOCK, name="stuck-timer")
    running, release = threading.Event(), threading.Event()

    def stuck() -> None:
        running.set()
        release.wait(60)

    service.schedule(SYSTEM_CLOCK.monotonic_ms(), stuck)
    assert running.wait(10)
    done = threading.Event()

    def close() -> None:
        service.close()
        done.set()

    closer = threading.Thread(target=close)
    closer.start()
    try:
        assert done.wait(10), "close() waited for the stuck callback"
        assert "still runs a callback" in caplog.text
    finally:
        release.set()
        closer.join(10)
