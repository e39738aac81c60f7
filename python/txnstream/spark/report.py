"""The audit's ``report.html``: one self-contained page (charts are embedded PNGs).

Everything comes from the audit's summary (small aggregates computed on
Spark) plus the first violations and stuck transactions; the page needs no
network, no script and no file beside it.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

__all__ = ["charts", "render", "write_report"]

_STATUS_COLORS = {
    "COMMITTED": "#2e7d32",
    "ABORTED": "#c62828",
    "OPEN": "#1565c0",
    "COMMITTING": "#66bb6a",
    "ABORTING": "#ef5350",
    "None": "#9e9e9e",
}


def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#666")
    ax.set_xticks([])
    ax.set_yticks([])


def _status_chart(summary: Mapping[str, Any]) -> str:
    counts: dict[str, int] = summary["transactions"]["by_status"]
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    if counts:
        names = sorted(counts, key=lambda s: -counts[s])
        ax.bar(
            names, [counts[n] for n in names], color=[_STATUS_COLORS.get(n, "#777") for n in names]
        )
        for i, n in enumerate(names):
            ax.annotate(str(counts[n]), (i, counts[n]), ha="center", va="bottom", fontsize=8)
        ax.set_ylabel("transactions")
    else:
        _empty(ax, "no transaction in the coordinator logs")
    ax.set_title("Final state of every transaction")
    return _png(fig)


def _latency_chart(summary: Mapping[str, Any]) -> str:
    hist: dict[str, dict[str, int]] = summary["latency_ms"]["log10_fifth_histogram"]
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    if hist:
        for status, buckets in sorted(hist.items()):
            bs = sorted(int(b) for b in buckets)
            xs = [10 ** (b / 5) for b in bs]
            widths = [10 ** ((b + 1) / 5) - 10 ** (b / 5) for b in bs]
            ax.bar(
                xs,
                [buckets[str(b)] for b in bs],
                width=widths,
                align="edge",
                alpha=0.6,
                label=status,
                color=_STATUS_COLORS.get(status, "#777"),
            )
        ax.set_xscale("log")
        ax.set_xlabel("start to final record (ms)")
        ax.set_ylabel("transactions")
        ax.legend(fontsize=8)
    else:
        _empty(ax, "no ended transaction with a start time")
    ax.set_title("Transaction latency")
    return _png(fig)


def _batch_chart(summary: Mapping[str, Any]) -> str:
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    totals: dict[str, dict[str, int]] = {}
    for b in summary["batching"]:
        t = totals.setdefault(b["kind"], {})
        for label, n in b["batch_size_histogram"].items():
            t[label] = t.get(label, 0) + n
    if totals:
        labels = sorted(
            {label for t in totals.values() for label in t},
            key=lambda s: int(s.split("-")[0].rstrip("+")),
        )
        width = 0.8 / len(totals)
        for k, (kind, t) in enumerate(sorted(totals.items())):
            ax.bar(
                [i + k * width for i in range(len(labels))],
                [t.get(label, 0) for label in labels],
                width=width,
                label={"txn": "coordinator logs", "pending_ack": "pending-ack logs"}.get(
                    kind, kind
                ),
            )
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(labels))], labels)
        ax.set_xlabel("records in the entry")
        ax.set_ylabel("entries")
        ax.legend(fontsize=8)
    else:
        _empty(ax, "no log entry")
    ax.set_title("Records per entry (PIP-160 batching)")
    return _png(fig)


def _entries_chart(summary: Mapping[str, Any]) -> str:
    logs = sorted(summary["batching"], key=lambda b: -b["entries"])[:15]
    fig, ax = plt.subplots(figsize=(6.5, 0.6 + 0.35 * max(len(logs), 2)))
    if logs:
        names = [b["log"] if len(b["log"]) <= 40 else "…" + b["log"][-39:] for b in logs]
        freed = [b["entries_freed"] for b in logs]
        part = [b["entries_partially_deleted"] for b in logs]
        live = [b["entries"] - f - p for b, f, p in zip(logs, freed, part, strict=True)]
        ax.barh(names, freed, color="#9e9e9e", label="freed (every record deleted)")
        ax.barh(names, part, left=freed, color="#ffb74d", label="partially deleted")
        ax.barh(
            names,
            live,
            left=[f + p for f, p in zip(freed, part, strict=True)],
            color="#42a5f5",
            label="live",
        )
        ax.invert_yaxis()
        ax.set_xlabel("entries")
        ax.legend(fontsize=8, loc="lower right")
    else:
        _empty(ax, "no log entry")
    ax.set_title("Entries freed per log")
    return _png(fig)


def _trigger_chart(summary: Mapping[str, Any]) -> str:
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    totals: dict[str, int] = {}
    for b in summary["batching"]:
        for k, n in b["flush_triggers_inferred"].items():
            totals[k] = totals.get(k, 0) + n
    if any(totals.values()):
        names = list(totals)
        ax.bar(names, [totals[n] for n in names], color=["#5c6bc0", "#26a69a", "#bdbdbd"])
        ax.set_ylabel("entries")
    else:
        _empty(ax, "no log entry")
    ax.set_title("Flush triggers (inferred from entry sizes)")
    return _png(fig)


def _violation_chart(summary: Mapping[str, Any]) -> str:
    by_kind: dict[str, int] = summary["violations"]["by_kind"]
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    if by_kind:
        names = sorted(by_kind)
        ax.barh(names, [by_kind[n] for n in names], color="#c62828")
        ax.invert_yaxis()
        ax.set_xlabel("violations")
    else:
        _empty(ax, "no violation found")
    ax.set_title("Violations by kind")
    return _png(fig)


def charts(summary: Mapping[str, Any]) -> dict[str, str]:
    """Return every chart of the report as a PNG data URI, by id."""
    return {
        "chart-status": _status_chart(summary),
        "chart-latency": _latency_chart(summary),
        "chart-batching": _batch_chart(summary),
        "chart-triggers": _trigger_chart(summary),
        "chart-entries": _entries_chart(summary),
        "chart-violations": _violation_chart(summary),
    }


def _e(v: object) -> str:
    return html.escape("" if v is None else str(v))


def _positions(ps: Sequence[Mapping[str, Any] | None] | None) -> str:
    """Positions as HTML lines; missing ones (an OPEN transaction has no final record) skipped."""
    return "<br>".join(
        f"{_e(p.get('role'))}: <code>{_e(p.get('log'))} @ {_e(p.get('ledger_id'))}:"
        f"{_e(p.get('entry_id'))}#{_e(p.get('batch_index'))}</code>"
        for p in ps or ()
        if p
    )


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], empty: str) -> str:
    if not rows:
        return f"<p class='muted'>{_e(empty)}</p>"
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render(
    summary: Mapping[str, Any],
    violations: Sequence[Mapping[str, Any]],
    stuck: Sequence[Mapping[str, Any]],
) -> str:
    """Return the report page for ``summary`` with the listed violations and stuck transactions."""
    ok = summary["verdict"] == "PASS"
    imgs = charts(summary)
    txns = summary["transactions"]
    lat = summary["latency_ms"]["by_status"]
    ent = summary["entries"]
    headline = [
        ("verdict", summary["verdict"]),
        ("violations", summary["violations"]["total"]),
        ("exactly-once", summary["exactly_once"]["verdict"]),
        ("transactions", txns["total"]),
        ("committed", txns["by_status"].get("COMMITTED", 0)),
        ("aborted", txns["by_status"].get("ABORTED", 0)),
        ("timed out", txns["timed_out"]),
        ("stuck", summary["stuck"]["count"]),
        ("log entries", ent["total"]),
        ("records", ent["records"]),
        ("entries saved by batching", ent["saved_by_batching"]),
        ("entries freed", ent["freed"]),
        ("p50 / p99 commit latency (ms)", _p(lat.get("COMMITTED"))),
    ]
    cards = "".join(
        f"<div class='card'><div class='k'>{_e(k)}</div><div class='v'>{_e(v)}</div></div>"
        for k, v in headline
    )
    checks = _table(
        ["check", "status", "what it verifies / why skipped"],
        [
            [_e(c["name"]), _e(c["status"]), _e(c.get("description") or c.get("reason"))]
            for c in summary["checks"]
        ],
        "no check",
    )
    vrows = [
        [
            _e(v["kind"]),
            _e(v["severity"]),
            f"<code>({_e(v['txnid_most_bits'])},{_e(v['txnid_least_bits'])})</code>",
            _positions(v.get("positions")),
            _e(v["detail"]),
        ]
        for v in violations
    ]
    vtable = _table(
        ["kind", "severity", "transaction", "positions", "detail"], vrows, "No violation found."
    )
    more = summary["violations"]["total"] - len(violations)
    if more > 0:
        vtable += f"<p class='muted'>… and {more} more in the <code>violations</code> table.</p>"
    stable = _table(
        ["transaction", "status", "age (ms)", "timeout (ms)", "why", "client", "positions"],
        [
            [
                f"<code>({_e(s['txnid_most_bits'])},{_e(s['txnid_least_bits'])})</code>",
                _e(s["status"]),
                _e(s["age_ms"]),
                _e(s["timeout_ms"]),
                _e(s["reason"]),
                _e(s["client_name"]),
                _positions([s["first_position"], s["final_position"]]),
            ]
            for s in stuck
        ],
        "No stuck transaction.",
    )
    btable = _table(
        [
            "log",
            "kind",
            "entries",
            "records",
            "records/entry",
            "max batch",
            "saved",
            "freed",
            "bytes",
            "flush triggers (inferred)",
        ],
        [
            [
                f"<code>{_e(b['log'])}</code>",
                _e(b["kind"]),
                _e(b["entries"]),
                _e(b["records"]),
                _e(b["records_per_entry"]),
                _e(b["max_batch"]),
                _e(b["entries_saved_by_batching"]),
                _e(b["entries_freed"]),
                _e(b["bytes"]),
                _e(", ".join(f"{k}: {n}" for k, n in b["flush_triggers_inferred"].items())),
            ]
            for b in summary["batching"]
        ],
        "No log.",
    )
    topics = _topics_section(summary)
    figures = "".join(
        f"<figure><img id='{_e(i)}' alt='{_e(i)}' src='{uri}'></figure>" for i, uri in imgs.items()
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>txnstream audit: {_e(summary["verdict"])}</title>
<style>
body {{ font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; }}
.banner {{ padding: 12px 16px; border-radius: 6px; color: #fff; font-size: 20px;
          background: {"#2e7d32" if ok else "#c62828"}; }}
.cards {{ display: flex; flex-wrap: wrap; gap: 8px; margin: 16px 0; }}
.card {{ border: 1px solid #ddd; border-radius: 6px; padding: 8px 12px; min-width: 110px; }}
.card .k {{ color: #666; font-size: 12px; }} .card .v {{ font-size: 18px; font-weight: 600; }}
.charts {{ display: flex; flex-wrap: wrap; gap: 12px; }}
figure {{ margin: 0; border: 1px solid #eee; padding: 4px; }}
table {{ border-collapse: collapse; margin: 8px 0 16px; }}
th, td {{ border: 1px solid #ddd; padding: 4px 8px; vertical-align: top; text-align: left; }}
th {{ background: #f5f5f5; }} .muted {{ color: #777; }} code {{ font-size: 12px; }}
</style></head><body>
<div class="banner" id="verdict">Audit {_e(summary["verdict"])}:
{_e(summary["violations"]["total"])} violation(s) in <code>{_e(summary["data_dir"])}</code></div>
<div class="cards">{cards}</div>
<p class="muted">Exactly-once: {_e(summary["exactly_once"]["verdict"])}
({_e(summary["exactly_once"].get("reason", ""))}). Reference time for stuck transactions:
{_e(summary["reference_time_ms"])} ms since the epoch. Spark master
<code>{_e(summary["spark_master"])}</code>, {_e(summary.get("seconds"))} s.</p>
<h2>Charts</h2><div class="charts">{figures}</div>
<h2>Checks</h2>{checks}
<h2>Violations</h2>{vtable}
<h2>Topics and exactly-once</h2>{topics}
<h2>Stuck transactions</h2>{stable}
<h2>Batching and entries freed per log</h2>{btable}
<p class="muted">Tables (Parquet) beside this page:
{_e(", ".join(sorted(summary["tables"])))}; figures in <code>summary.json</code>.</p>
</body></html>
"""


def _topics_section(summary: Mapping[str, Any]) -> str:
    """Return the exactly-once verdict with its counts, and one row per topic."""
    eo = summary["exactly_once"]
    topics = summary.get("topics", {}).get("by_topic", {})
    role = {t: "input" for t in eo.get("input_topics", [])}
    role.update({t: "output" for t in eo.get("output_topics", [])})
    if eo["verdict"] == "not_checked":
        head = f"<p>Exactly-once: <b>not checked</b>: {_e(eo.get('reason'))}</p>"
    else:
        head = (
            f"<p>Exactly-once: <b>{_e(eo['verdict'])}</b>. "
            f"{_e(eo['inputs_consumed_committed'])} input(s) consumed and committed"
            f" (evidence: {_e(', '.join(f'{k} {n}' for k, n in eo['inputs_by_evidence'].items()))}"
            f"), {_e(eo['outputs'])} committed output(s) traced through property"
            f" <code>{_e(eo['source_property'])}</code>: {_e(eo['duplicates'])} duplicated,"
            f" {_e(eo['missing'])} missing, {_e(eo['untraceable'])} untraceable."
            f" Topics {_e(eo['topics_chosen'])}.</p>"
        )
    per = eo.get("by_output_topic", {})
    rows = [
        [
            f"<code>{_e(name)}</code>",
            _e(role.get(name, "")),
            _e(t["partitions"]),
            _e(t["messages"]),
            _e(t["visible"]),
            _e(t["transactional"]),
            _e(t["commit_markers"]),
            _e(t["abort_markers"]),
            _e(
                ", ".join(f"{k} {n}" for k, n in per[name].items() if k != "outputs")
                if name in per
                else ""
            ),
        ]
        for name, t in sorted(topics.items())
    ]
    table = _table(
        [
            "topic",
            "role",
            "partitions",
            "messages",
            "READ_COMMITTED visible",
            "in transactions",
            "COMMIT markers",
            "ABORT markers",
            "exactly-once",
        ],
        rows,
        "No topic in the directory.",
    )
    return head + table


def _p(stats: Mapping[str, Any] | None) -> str:
    return "n/a" if not stats else f"{stats['p50']} / {stats['p99']}"


def write_report(
    path: Path,
    summary: Mapping[str, Any],
    violations: Sequence[Mapping[str, Any]],
    stuck: Sequence[Mapping[str, Any]],
) -> Path:
    """Write the report page to ``path`` and return it."""
    path.write_text(render(summary, violations, stuck), encoding="utf-8")
    return path
