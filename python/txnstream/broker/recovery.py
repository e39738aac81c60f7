"""Recovering many topic partitions at once: bounded, observable, cancellable (issue 11).

With ``topicRecoveryMode=eager`` the broker recovers every partition of its
data directory in the background from the moment it opens, instead of on
first use. :class:`TopicRecovery` runs those recoveries on a pool of
``topicRecoveryThreads`` threads (not one per topic), so threads and
descriptors stay bounded with 10,000 topics; partitions of one namespace
share its snapshot reader, so the snapshot topic is read once per wave.

- **Progress**: :meth:`TopicRecovery.status` -- total, recovered, failed
  (with each failure's error), skipped, pending, seconds;
  :meth:`TopicRecovery.wait`.
- **Failures** are recorded per partition and do not stop the others; the
  partition is retried on its first use (the broker's lazy path).
- **Cancel**: :meth:`TopicRecovery.cancel` (the broker's close) drops the
  partitions not started; running ones stop at their next chunk (their
  replay asks the broker whether it is closing). Users of Pulsar asked
  for exactly that (apache/pulsar#26335).
- A partition a client asks for before its turn is opened by the client's
  thread; the wave then finds it open.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

log = logging.getLogger(__name__)


class TopicRecovery:
    """One wave of partition recoveries on a bounded pool."""

    def __init__(
        self,
        names: Sequence[str],
        open_partition: Callable[[str], object],
        threads: int,
    ) -> None:
        self._names = list(names)
        self._open = open_partition
        self._threads = max(1, min(threads, len(self._names) or 1))
        self._lock = threading.Lock()
        self._done = 0  # finished, whatever the outcome
        self._skipped = 0
        self._errors: dict[str, str] = {}
        self._cancelled = False
        self._shut = False  # cancel() ran
        self._started = time.monotonic()
        self._finished_at: float | None = None
        self._all_done = threading.Event()
        self._pool: ThreadPoolExecutor | None = None
        self._futures: list[Future[None]] = []

    def start(self) -> None:
        """Submit every partition to the pool (returns at once)."""
        if not self._names:
            self._finish()
            return
        self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="txnstream-recovery")
        self._futures = [self._pool.submit(self._recover, n) for n in self._names]

    def _recover(self, name: str) -> None:
        if self._cancelled:
            self._count(name, None, cancelled=True)
            return
        try:
            self._open(name)
        except Exception as exc:
            if not self._cancelled:
                log.warning("recovery of %s failed: %r", name, exc)
            self._count(name, exc, cancelled=self._cancelled)
        else:
            self._count(name, None)

    def _count(self, name: str, exc: BaseException | None, *, cancelled: bool = False) -> None:
        with self._lock:
            self._done += 1
            if cancelled:
                self._skipped += 1
            elif exc is not None:
                self._errors[name] = f"{type(exc).__name__}: {exc}"
            last = self._done == len(self._names)
        if last:
            self._finish()

    def _finish(self) -> None:
        with self._lock:
            self._finished_at = time.monotonic()
        st = self.status()
        log.info(
            "topic recovery: %d of %d partitions recovered in %.2f s (%d failed, %d skipped)",
            st["recovered"],
            st["total"],
            st["seconds"],
            st["failed"],
            st["skipped"],
        )
        self._all_done.set()
        pool = self._pool
        if pool is not None:
            pool.shutdown(wait=False)  # its threads exit once idle

    def status(self) -> dict[str, Any]:
        """Return total, recovered, failed, skipped (cancelled), pending, errors, seconds.

        ``errors`` maps each failed partition to its error.
        """
        with self._lock:
            end = self._finished_at if self._finished_at is not None else time.monotonic()
            return {
                "total": len(self._names),
                "recovered": self._done - len(self._errors) - self._skipped,
                "failed": len(self._errors),
                "skipped": self._skipped,
                "pending": len(self._names) - self._done,
                "errors": dict(self._errors),
                "seconds": end - self._started,
                "cancelled": self._cancelled,
                "threads": self._threads,
            }

    def wait(self, timeout_ms: int) -> bool:
        """Wait up to ``timeout_ms`` for the wave to finish; True if it has."""
        return self._all_done.wait(timeout_ms / 1000.0)

    def stopping(self) -> None:
        """Mark the wave cancelled, without waiting (:meth:`cancel` finishes the stop).

        A partition failing from here on (the broker closes under it) counts
        as skipped, not failed.
        """
        with self._lock:
            self._cancelled = True

    def cancel(self, timeout_ms: int) -> None:
        """Stop: partitions not started are skipped; waits up to ``timeout_ms`` for running ones."""
        with self._lock:
            again, self._shut = self._shut, True
            self._cancelled = True
        pool = None if again else self._pool
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
            with self._lock:
                skipped = sum(1 for f in self._futures if f.cancelled())
                self._done += skipped
                self._skipped += skipped
                last = self._done == len(self._names)
            if last:
                self._finish()
        self._all_done.wait(timeout_ms / 1000.0)


__all__ = ["TopicRecovery"]
