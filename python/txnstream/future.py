"""``Future``: a ``concurrent.futures.Future`` that costs less per write.

Every storage write resolves a future (``ledger.append_async``, a
BufferedWriter record, ``producer.send_async``), about a dozen per
consume-transform-produce transaction. The standard class builds a
``threading.Condition`` (a Python object over an ``RLock``) for each one and
enters it through two Python-level calls on every state check. This
subclass keeps the same states, methods and semantics, with a plain C lock:

- ``result(timeout)`` / ``exception(timeout)`` block on a lock of their own,
  made only when the future is not done yet, released when it resolves;
- ``concurrent.futures.wait`` and ``as_completed`` work on it (they take
  ``_condition`` and register in ``_waiters``, which this class honours);
- ``asyncio.wrap_future`` accepts it (it is a ``concurrent.futures.Future``).

The native completion thread creates and resolves these (``_native``
looks the class up here once).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable
from concurrent.futures import CancelledError, InvalidStateError
from typing import Any, TypeVar

__all__ = ["Future"]

_T = TypeVar("_T")

# The state names of the standard class (its private module constants).
PENDING = "PENDING"
RUNNING = "RUNNING"
CANCELLED = "CANCELLED"
CANCELLED_AND_NOTIFIED = "CANCELLED_AND_NOTIFIED"
FINISHED = "FINISHED"
_DONE = (CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED)
_CANCELLED = (CANCELLED, CANCELLED_AND_NOTIFIED)

_new_lock = threading.Lock
_LOGGER = logging.getLogger("concurrent.futures")  # the standard class's logger


class Future(concurrent.futures.Future[_T]):
    """A ``concurrent.futures.Future`` guarded by one C lock (see the module docs)."""

    def __init__(self) -> None:  # no super().__init__(): it would build a Condition
        self._condition: Any = _new_lock()
        self._state = PENDING
        self._result: Any = None
        self._exception: BaseException | None = None
        self._waiters: list[Any] = []
        self._done_callbacks: list[Callable[[Future[_T]], object]] = []
        # Locks of threads blocked in result()/exception(), released on resolution.
        self._blocked: list[Any] | None = None

    # ------------------------------------------------------------ resolution

    def __repr__(self) -> str:
        # Without the lock (the standard one takes it): an error raised under it names us.
        return f"<{type(self).__name__} at {id(self):#x} state={self._state.lower()}>"

    def _finish_locked(self) -> list[Any]:
        # Under _condition: the blocked threads to wake (the caller releases them).
        blocked, self._blocked = self._blocked, None
        return blocked if blocked is not None else []

    def _wake_and_call(self, blocked: list[Any]) -> None:
        for lock in blocked:
            lock.release()
        for callback in self._done_callbacks:
            try:
                callback(self)
            except Exception:
                _LOGGER.exception("exception calling callback for %r", self)

    def _resolve(self, result: Any, exception: BaseException | None, tell: str) -> None:
        # FINISHED with a result or an exception; ``tell`` is the waiters' method.
        with self._condition:
            if self._state in _DONE:
                raise InvalidStateError(f"{self._state}: {self!r}")
            self._result = result
            self._exception = exception
            self._state = FINISHED
            for waiter in self._waiters:
                getattr(waiter, tell)(self)
            blocked = self._finish_locked()
        self._wake_and_call(blocked)

    def set_result(self, result: _T) -> None:
        """Resolve with ``result``; wakes waiters and runs the callbacks."""
        self._resolve(result, None, "add_result")

    def set_exception(self, exception: BaseException | None) -> None:
        """Resolve with ``exception``; wakes waiters and runs the callbacks."""
        self._resolve(None, exception, "add_exception")

    def cancel(self) -> bool:
        """Cancel unless running or done (True if cancelled)."""
        with self._condition:
            if self._state in (RUNNING, FINISHED):
                return False
            if self._state in _CANCELLED:
                return True
            self._state = CANCELLED
            blocked = self._finish_locked()
        self._wake_and_call(blocked)
        return True

    def set_running_or_notify_cancel(self) -> bool:
        """Mark running (True), or tell waiters a cancellation happened (False)."""
        with self._condition:
            if self._state == CANCELLED:
                self._state = CANCELLED_AND_NOTIFIED
                for waiter in self._waiters:
                    waiter.add_cancelled(self)
                return False
            if self._state == PENDING:
                self._state = RUNNING
                return True
            _LOGGER.critical("Future %s in unexpected state: %s", id(self), self._state)
            raise RuntimeError("Future in unexpected state")

    # ------------------------------------------------------------ queries

    def cancelled(self) -> bool:
        """Tell whether the future was cancelled."""
        return self._state in _CANCELLED

    def running(self) -> bool:
        """Tell whether the future is running."""
        return self._state == RUNNING

    def done(self) -> bool:
        """Tell whether the future was cancelled or finished."""
        return self._state in _DONE

    def add_done_callback(self, fn: Callable[[Future[_T]], object]) -> None:
        """Call ``fn(self)`` when done (at once, in this thread, if already done)."""
        with self._condition:
            if self._state not in _DONE:
                self._done_callbacks.append(fn)
                return
        try:
            fn(self)
        except Exception:
            _LOGGER.exception("exception calling callback for %r", self)

    def _wait_done(self, timeout: float | None) -> None:
        # Return once done, or raise TimeoutError after ``timeout`` seconds.
        with self._condition:
            if self._state in _DONE:
                return
            lock = _new_lock()
            lock.acquire()
            if self._blocked is None:
                self._blocked = []
            self._blocked.append(lock)
        if lock.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
            return
        with self._condition:
            if self._state in _DONE:
                return
            if self._blocked is not None:
                self._blocked.remove(lock)
        raise TimeoutError()

    def result(self, timeout: float | None = None) -> _T:
        """Return the result, waiting up to ``timeout`` seconds (None: no limit).

        Raises ``CancelledError``, ``TimeoutError``, or the future's exception.
        """
        if self._state not in _DONE:
            self._wait_done(timeout)
        if self._state in _CANCELLED:
            raise CancelledError()
        exc = self._exception
        if exc is not None:
            try:
                raise exc
            finally:
                # The traceback holds this frame: drop its references to the
                # future and the exception, or they form a cycle (as the
                # standard class does).
                del exc
                del self
        return self._result  # type: ignore[no-any-return]

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Return the exception (None if it succeeded), waiting as :meth:`result` does."""
        if self._state not in _DONE:
            self._wait_done(timeout)
        if self._state in _CANCELLED:
            raise CancelledError()
        return self._exception
