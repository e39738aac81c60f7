"""Upkeep of the PIP-255 terminated-transaction store (SPEC §4.4).

The expiry sweep runs every ``transaction_meta_expire_check_interval`` and
compactions of the store's topic run when writes have left enough garbage.
Both run on one maintenance thread of their own, so they never queue behind
transaction ends (and ends never wait for them).
"""

from __future__ import annotations

import contextlib
import logging
from concurrent.futures import ThreadPoolExecutor

from txnstream.coordinator.table import TransactionTable
from txnstream.coordinator.terminated import TerminatedTxnStore
from txnstream.coordinator.timeouts import Clock, TimerService

log = logging.getLogger(__name__)


class StoreMaintenance:
    """Schedules the store's sweep (by timer) and compactions (on demand)."""

    def __init__(
        self,
        store: TerminatedTxnStore,
        table: TransactionTable,
        timers: TimerService,
        clock: Clock,
        interval_ms: int,
        *,
        name: str,
    ) -> None:
        self._store = store
        self._table = table
        self._timers = timers
        self._clock = clock
        self._interval_ms = interval_ms
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=name)
        store.schedule_compaction = self._schedule_compaction

    def _schedule_compaction(self) -> None:
        # RuntimeError: the pool is shut down, the coordinator is closing.
        with contextlib.suppress(RuntimeError):
            self._pool.submit(self._compact)

    def _compact(self) -> None:
        try:
            self._store.compact()
        except Exception:
            if not self._table.closed:
                log.exception("compacting the terminated-transaction topic failed")

    def start_sweeps(self) -> None:
        """Sweep expired entries every interval until close (nothing if the store is off)."""
        if self._store.enabled:
            self._timers.schedule(self._clock() + self._interval_ms, self._fire_sweep)

    def _fire_sweep(self) -> None:
        with contextlib.suppress(RuntimeError):
            self._pool.submit(self._sweep)

    def _sweep(self) -> None:
        try:
            self._store.sweep()
        except Exception:
            log.exception("terminated-transaction sweep failed")
        with self._table.lock:
            if not self._table.closed:
                self._timers.schedule(self._clock() + self._interval_ms, self._fire_sweep)

    def shutdown(self) -> None:
        """Stop the maintenance thread (queued work is dropped)."""
        self._pool.shutdown(wait=True, cancel_futures=True)


__all__ = ["StoreMaintenance"]
