"""Shared benchmark reporting: side-by-side ratios within each group.

A benchmark marks its reference with ``benchmark.extra_info["baseline"] = True``
and the number of items one round handles with ``extra_info["items"] = n``; a
group may also mark an upper bound with ``extra_info["ceiling"] = True`` (each
row then shows its share of the ceiling's speed).
After the run, every group gets a table of median time, items/s and speed
relative to its baseline (``x faster`` > 1 means faster than the baseline).
"""

from __future__ import annotations

from typing import Any

import pytest


def _rows(config: pytest.Config) -> dict[str, list[tuple[str, float, dict[str, Any]]]]:
    session = getattr(config, "_benchmarksession", None)
    groups: dict[str, list[tuple[str, float, dict[str, Any]]]] = {}
    if session is None:
        return groups
    for bench in session.benchmarks:
        stats = getattr(bench, "stats", None)
        if stats is None or not getattr(stats, "rounds", 0):
            continue
        groups.setdefault(bench.group or "(none)", []).append(
            (bench.name, float(stats.median), dict(bench.extra_info))
        )
    return groups


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Print per-group ratios against each group's baseline."""
    groups = _rows(config)
    if not groups:
        return
    tr = terminalreporter
    tr.section("txnstream side-by-side ratios (median)")
    for group, rows in sorted(groups.items()):
        base = next((m for _, m, info in rows if info.get("baseline")), None)
        ceiling = next((m for _, m, info in rows if info.get("ceiling")), None)
        tr.write_line(f"[{group}]")
        for name, median, info in sorted(rows, key=lambda r: r[1]):
            items = info.get("items")
            rate = f"{items / median:>14,.0f} items/s" if items else " " * 23
            ratio = f"{base / median:8.2f}x vs baseline" if base else ""
            tag = "  (baseline)" if info.get("baseline") else ""
            tag += "  (ceiling)" if info.get("ceiling") else ""
            of = f"  {ceiling / median:6.0%} of ceiling" if ceiling else ""
            tr.write_line(f"  {name:<58} {median * 1e6:>12.1f} us {rate} {ratio}{of}{tag}")
