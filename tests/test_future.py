"""``txnstream.future.Future``: the standard ``concurrent.futures.Future``'s behaviour, cheaper.

Every storage write and ``send_async`` resolves one, so a user's
``concurrent.futures.wait``, ``as_completed`` and ``asyncio.wrap_future``
must work on it exactly as on the standard class.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import random
import threading
from typing import Any

import pytest

from txnstream import Broker
from txnstream.future import Future
from txnstream.testing import wait_until

DEADLINE_S = 10.0


def _ops(f: concurrent.futures.Future[Any], op: str, log: list[object]) -> None:
    # One operation on a future, its outcome (or exception type) logged.
    try:
        if op == "result":
            log.append(("result", f.result(timeout=0)))
        elif op == "exception":
            log.append(("exception", repr(f.exception(timeout=0))))
        elif op == "set_result":
            f.set_result(7)
            log.append("set")
        elif op == "set_exception":
            f.set_exception(ValueError("boom"))
            log.append("set")
        elif op == "cancel":
            log.append(("cancel", f.cancel()))
        elif op == "running":
            log.append(("running", f.set_running_or_notify_cancel()))
        elif op == "callback":
            f.add_done_callback(lambda g: log.append(("called", g.done(), g.cancelled())))
        else:
            log.append((op, f.done(), f.cancelled(), f.running()))
    except BaseException as exc:
        log.append(("raised", type(exc).__name__))


def test_random_operations_behave_as_the_standard_future() -> None:
    ops = ["result", "exception", "set_result", "set_exception", "cancel", "running"]
    ops += ["callback", "state"]
    rng = random.Random(22)
    for _ in range(3000):
        seq = [rng.choice(ops) for _ in range(rng.randint(1, 7))]
        got: list[object] = []
        want: list[object] = []
        ours: Future[Any] = Future()
        theirs: concurrent.futures.Future[Any] = concurrent.futures.Future()
        for op in seq:
            _ops(ours, op, got)
            _ops(theirs, op, want)
        assert got == want, seq


def test_a_blocked_result_wakes_on_resolution_and_a_timeout_leaves_nothing_behind() -> None:
    f: Future[int] = Future()
    with pytest.raises(TimeoutError):
        f.result(timeout=0.01)
    assert f._blocked == []  # the timed-out waiter removed its lock
    got: list[int] = []
    threads = [threading.Thread(target=lambda: got.append(f.result(DEADLINE_S))) for _ in range(8)]
    for t in threads:
        t.start()
    wait_until(lambda: f._blocked is not None and len(f._blocked) == 8)
    f.set_result(5)
    for t in threads:
        t.join(DEADLINE_S)
    assert got == [5] * 8
    e: Future[int] = Future()
    threading.Timer(0.05, lambda: e.set_exception(KeyError("k"))).start()
    assert isinstance(e.exception(DEADLINE_S), KeyError)
    c: Future[int] = Future()
    threading.Timer(0.05, c.cancel).start()
    with pytest.raises(concurrent.futures.CancelledError):
        c.result(DEADLINE_S)


def test_callbacks_run_in_order_and_one_that_raises_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    f: Future[int] = Future()
    calls: list[str] = []

    def bad(_: object) -> None:
        raise RuntimeError("callback failed")

    f.add_done_callback(lambda _: calls.append("a"))
    f.add_done_callback(bad)
    f.add_done_callback(lambda _: calls.append("b"))
    with caplog.at_level(logging.ERROR, logger="concurrent.futures"):
        f.set_result(1)
    assert calls == ["a", "b"]
    assert "exception calling callback" in caplog.text
    f.add_done_callback(lambda _: calls.append("late"))  # done: runs at once
    assert calls == ["a", "b", "late"]
    with pytest.raises(concurrent.futures.InvalidStateError):
        f.set_result(2)
    assert "state=finished" in repr(f)


def test_wait_and_as_completed_and_wrap_future_work_on_it() -> None:
    fs: list[Future[int]] = [Future() for _ in range(4)]
    fs[0].set_result(0)
    threading.Timer(0.05, lambda: fs[1].set_result(1)).start()
    done, _ = concurrent.futures.wait(
        fs, timeout=DEADLINE_S, return_when=concurrent.futures.FIRST_COMPLETED
    )
    assert fs[0] in done
    threading.Timer(0.05, lambda: fs[2].set_exception(ValueError("x"))).start()
    done, _ = concurrent.futures.wait(
        fs[:3], timeout=DEADLINE_S, return_when=concurrent.futures.FIRST_EXCEPTION
    )
    assert fs[2] in done
    threading.Timer(0.05, lambda: fs[3].set_result(3)).start()
    completed = concurrent.futures.as_completed(fs, DEADLINE_S)
    seen = {f.result() if f.exception() is None else -1 for f in completed}
    assert seen == {0, 1, -1, 3}
    assert all(not f._waiters for f in fs)  # wait() unregistered itself

    async def main() -> int:
        g: Future[int] = Future()
        threading.Timer(0.05, lambda: g.set_result(9)).start()
        return await asyncio.wait_for(asyncio.wrap_future(g), DEADLINE_S)

    assert asyncio.run(main()) == 9


def test_storage_and_send_async_futures_are_ours_and_resolve(tmp_path: Any) -> None:
    with Broker.open(tmp_path, registry=None) as b:
        p = b.client().producer("t")
        futs = [p.send_async(b"%d" % i) for i in range(50)]
        assert all(isinstance(f, Future) for f in futs)
        done, _ = concurrent.futures.wait(futs, timeout=DEADLINE_S)
        assert len(done) == 50
        ml = b.topic("t").ml
        written = ml.append_async(b"raw")
        assert isinstance(written, Future)
        assert written.result(DEADLINE_S).entry_id == 50


def test_a_raised_result_leaves_no_reference_cycle() -> None:
    """Dropped after result() raised, the future is freed at once, without the collector."""
    import gc
    import weakref

    gc.disable()
    try:
        f: Future[int] = Future()
        f.set_exception(ValueError("boom"))
        with pytest.raises(ValueError, match="boom"):
            f.result()
        ref = weakref.ref(f)
        del f
        assert ref() is None
    finally:
        gc.enable()
