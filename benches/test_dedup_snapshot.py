"""The deduplication part of a transaction-buffer snapshot (group ``dedup-snapshot``).

A snapshot is taken under the partition's publish lock, so its cost is a
stall of every send to that partition. 64 producers with full windows
(1024 remembered messages each, every one sent in a transaction, two
transactions still open): the snapshot reads each window from its newest
end (the rule while a window is in sequence-id order) against the baseline,
the same code forced to read every window whole (what it did before, and
still does for a window out of order). Both write the same snapshot.

Recorded: ``entries_read`` per snapshot (a count, stable on a noisy
machine) and ``messages`` written. Run:
``.venv/bin/pytest benches/test_dedup_snapshot.py --benchmark-only``.
"""

from __future__ import annotations

from typing import Any

import pytest

from txnstream._native import Position
from txnstream.broker.dedup import Deduplication
from txnstream.proto import TransactionBufferSnapshot

GROUP = "dedup-snapshot"
PRODUCERS = 64
WINDOW = 1024
OPEN = [(0, 5), (0, 6)]


def _full_windows() -> tuple[Deduplication, Position]:
    d = Deduplication(window=WINDOW)
    entry = 0
    for seq in range(WINDOW):
        for p in range(PRODUCERS):
            entry += 1
            d.placed(f"p{p}", [seq], (0, entry), None, Position(1, entry))
    return d, Position(1, entry)


def _run(d: Deduplication, end: Position, whole: bool) -> tuple[int, int]:
    before = d.snapshot_scanned
    if whole:
        for p in d._producers.values():
            p.ordered = False  # the full scan finds them in order and sets it back
    snap = TransactionBufferSnapshot()
    d.snapshot(end, snap, OPEN)
    return d.snapshot_scanned - before, sum(len(ps.sequence_ids) for ps in snap.producer_sequences)


@pytest.mark.parametrize("whole", [False, True], ids=["newest-end", "whole-window"])
def test_dedup_snapshot(benchmark: Any, whole: bool) -> None:
    benchmark.group = GROUP
    d, end = _full_windows()
    read, messages = benchmark(_run, d, end, whole)
    assert messages == PRODUCERS * 128 + len(OPEN)
    benchmark.extra_info.update(items=1, entries_read=read, messages=messages, baseline=whole)
