"""The ``txnstream`` command line."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click


@click.group()
@click.version_option(package_name="txnstream")
def main() -> None:
    """Txnstream: a durable, embeddable, transactional message log."""


@main.command()
@click.option("--data", default="demo-data", show_default=True, help="Fresh data directory.")
@click.option("--inputs", default=2000, show_default=True, help="Input messages to process.")
@click.option(
    "--kill-at",
    default=0.4,
    show_default=True,
    help="Fraction of inputs committed before the workload is killed with kill -9.",
)
def demo(data: str, inputs: int, kill_at: float) -> None:
    """Run the main job: CTP workload, kill -9, recovery, exactly-once check, audit, report."""
    from txnstream import demo as job

    if inputs < 1 or not 0 < kill_at < 1:
        raise click.BadParameter("need --inputs >= 1 and 0 < --kill-at < 1")
    raise SystemExit(job.main(data, inputs, kill_at))


class _AuditError(click.ClickException):
    """The audit could not run (status 2; 1 means it ran and found violations)."""

    exit_code = 2


@main.command()
@click.argument(
    "data_dir", type=click.Path(exists=True, file_okay=False, dir_okay=True, path_type=Path)
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Output directory (replaced). Default: DATA_DIR-audit beside it.",
)
@click.option("--master", default="local[2]", show_default=True, help="Spark master URL.")
@click.option(
    "--stuck-after-ms",
    default=60_000,
    show_default=True,
    type=click.IntRange(min=0),
    help="A decided transaction not finished after this long is stuck.",
)
@click.option(
    "--now-ms",
    default=None,
    type=click.IntRange(min=0),
    help="Reference time (ms since the epoch). Default: the latest time in the logs.",
)
@click.option(
    "--max-records",
    default=None,
    type=click.IntRange(min=1),
    help="The writers' max_records, to tell flush triggers apart (default: largest batch seen).",
)
@click.option(
    "--input-topic",
    "input_topics",
    multiple=True,
    help="Input topic of the exactly-once check (repeatable). Default: the topics holding"
    " a message keyed by a value the outputs' source property names.",
)
@click.option(
    "--output-topic",
    "output_topics",
    multiple=True,
    help="Output topic of the exactly-once check (repeatable). Default: the topics whose"
    " committed messages carry the source property.",
)
@click.option(
    "--source-property",
    default="source",
    show_default=True,
    help="Message property through which an output names its input (by the input's key).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def audit(
    data_dir: Path,
    out: Path | None,
    master: str,
    stuck_after_ms: int,
    now_ms: int | None,
    max_records: int | None,
    input_topics: tuple[str, ...],
    output_topics: tuple[str, ...],
    source_property: str,
    as_json: bool,
) -> None:
    """Audit DATA_DIR on Spark: transactions, pending acks, topics, exactly-once; writes a report.

    Reads the directory read-only (it may be live). Exit status: 0 when no
    violation is found, 1 when some are (listed in the report), 2 on errors.
    """
    from rich.console import Console

    try:
        from txnstream.spark.audit import AuditOptions, run_audit
    except ImportError as e:  # pragma: no cover - depends on the install
        raise _AuditError(
            f"the audit needs the Spark extra (pip install 'txnstream[spark]'): {e}"
        ) from e
    out_dir = out or data_dir.resolve().with_name(data_dir.resolve().name + "-audit")
    if out_dir.resolve() == data_dir.resolve() or data_dir.resolve() in out_dir.resolve().parents:
        raise click.BadParameter("must not be inside DATA_DIR", param_hint="--out")
    console = Console(stderr=True)
    options = AuditOptions(
        stuck_after_ms=stuck_after_ms,
        now_ms=now_ms,
        max_records=max_records,
        input_topics=input_topics,
        output_topics=output_topics,
        source_property=source_property,
    )
    with console.status("starting Spark") as status:
        try:
            result = run_audit(
                data_dir,
                out_dir,
                master=master,
                options=options,
                progress=lambda step: status.update(step),
            )
        except Exception as e:  # the CLI boundary: any failure is exit status 2, not 1
            raise _AuditError(f"{type(e).__name__}: {e}") from e
    if as_json:
        click.echo(json.dumps(result.summary, indent=2, sort_keys=True))
    else:
        _print_audit(result.summary, Console())
    sys.exit(0 if result.verdict == "PASS" else 1)


def _print_audit(summary: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    t = Table(title=f"txnstream audit: {summary['verdict']}", show_header=False)
    txns = summary["transactions"]
    lat = summary["latency_ms"]["by_status"].get("COMMITTED")
    ent = summary["entries"]
    rows = [
        ("violations", summary["violations"]["total"]),
        ("exactly-once", _exactly_once_line(summary["exactly_once"])),
        ("transactions", txns["total"]),
        ("by status", ", ".join(f"{k} {v}" for k, v in sorted(txns["by_status"].items()))),
        ("timed out", txns["timed_out"]),
        ("stuck", summary["stuck"]["count"]),
        ("log entries / records", f"{ent['total']} / {ent['records']}"),
        ("entries saved by batching", ent["saved_by_batching"]),
        ("entries freed", ent["freed"]),
        ("commit latency p50 / p99 (ms)", f"{lat['p50']} / {lat['p99']}" if lat else "n/a"),
    ]
    for kind, n in sorted(summary["violations"]["by_kind"].items()):
        rows.append((f"  {kind}", n))
    for k, v in rows:
        t.add_row(str(k), str(v))
    console.print(t)
    console.print(f"report: {Path(summary['out_dir']) / 'report.html'}")


def _exactly_once_line(eo: dict[str, Any]) -> str:
    if eo["verdict"] == "not_checked":
        return f"not_checked ({eo.get('reason', '')})"
    return (
        f"{eo['verdict']} ({eo['inputs_consumed_committed']} inputs, {eo['outputs']} outputs,"
        f" {eo['duplicates']} duplicated, {eo['missing']} missing,"
        f" {eo['untraceable']} untraceable)"
    )


@main.group()
def admin() -> None:
    """Inspect a data directory (read-only: it may be live)."""


@admin.command("logs")
@click.argument(
    "data_dir", type=click.Path(exists=True, file_okay=False, dir_okay=True, path_type=Path)
)
@click.option("--json", "as_json", is_flag=True, help="Print the logs as JSON.")
def admin_logs(data_dir: Path, as_json: bool) -> None:
    """List the managed ledgers of DATA_DIR: kind, ledgers, entries, cursors."""
    from rich.console import Console
    from rich.table import Table

    from txnstream.datadir import describe_logs

    logs = describe_logs(data_dir)
    if as_json:
        click.echo(json.dumps(logs, indent=2))
        return
    t = Table(title=f"logs in {data_dir}")
    t.add_column("name", no_wrap=True)
    for h in ("kind", "ledgers", "entries", "first", "last", "cursors (mark-delete)"):
        t.add_column(h)
    for log in logs:
        t.add_row(
            log["name"],
            log["kind"],
            str(log["ledgers"]),
            str(log["entries"]),
            str(log["first"]),
            str(log["last"]),
            ", ".join(f"{c} @ {p}" for c, p in log["cursors"].items()),
        )
    Console().print(t)


@main.command()
@click.option("--txns", default=20_000, show_default=True, type=click.IntRange(min=1))
@click.option("--threads", default=4, show_default=True, type=click.IntRange(min=1, max=256))
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def bench(txns: int, threads: int, as_json: bool) -> None:
    """Measure this machine: transactions/s and log scan rate (temporary directory).

    The benchmark suite with baselines side by side is `make bench` (benches/).
    """
    from rich.console import Console
    from rich.table import Table

    from txnstream.bench import run

    console = Console(stderr=True)
    with console.status(f"{txns} transactions on {threads} thread(s)"):
        figures = run(txns, threads)
    if as_json:
        click.echo(json.dumps(figures, indent=2))
        return
    t = Table(title="txnstream bench", show_header=False)
    for k, v in figures.items():
        t.add_row(k.replace("_", " "), f"{v:,}" if isinstance(v, int | float) else str(v))
    Console().print(t)


if __name__ == "__main__":
    main()
