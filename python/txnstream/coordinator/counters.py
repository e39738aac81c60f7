"""Counters of one coordinator and its end-latency histogram (SPEC §4.10).

They change on the hot paths, so they are plain ints guarded by the
transaction table's lock (every change already happens under it) instead
of a lock of their own; ``stats``/``metrics`` copy them under that lock.
"""

from __future__ import annotations

import bisect
from typing import Any

from txnstream.metrics import END_LATENCY_BOUNDS_MS

#: Names of the event counters, as reported by ``stats`` and ``metrics``.
COUNTER_NAMES = ("created", "committed", "aborted", "timed_out", "recovered", "append_errors")


class CoordinatorCounters:
    """Event counts plus an end-latency histogram; callers hold the table lock."""

    __slots__ = ("counts", "latency", "latency_sum")

    def __init__(self) -> None:
        self.counts = dict.fromkeys(COUNTER_NAMES, 0)
        # End latency (ms): one bucket count per bound, last = +Inf.
        self.latency = [0] * (len(END_LATENCY_BOUNDS_MS) + 1)
        self.latency_sum = 0

    def ended(self, commit: bool, timed_out: bool, latency_ms: int) -> None:
        """Count one finished end that took ``latency_ms`` after its ending UPDATE."""
        self.latency[bisect.bisect_left(END_LATENCY_BOUNDS_MS, latency_ms)] += 1
        self.latency_sum += latency_ms
        self.counts["committed" if commit else "aborted"] += 1
        if timed_out:
            self.counts["timed_out"] += 1

    def histogram(self) -> dict[str, Any]:
        """Return a copy of the end-latency histogram (bounds, counts, sum)."""
        return {
            "bounds": END_LATENCY_BOUNDS_MS,
            "counts": list(self.latency),
            "sum": self.latency_sum,
        }


__all__ = ["COUNTER_NAMES", "CoordinatorCounters"]
