"""The ``txnstream`` command line."""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
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
    help="Reference time (ms since the epoch). Default: now, or the latest time in the logs"
    " if later.",
)
@click.option(
    "--max-records",
    default=None,
    type=click.IntRange(min=1),
    help="The writers' max_records, to tell flush triggers apart (default: the broker's, 512).",
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
    o, d = out_dir.resolve(), data_dir.resolve()
    if o == d or d in o.parents or o in d.parents:  # it is replaced whole
        raise click.BadParameter("must not be inside DATA_DIR, nor hold it", param_hint="--out")
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


# ---------------------------------------------------------------------- admin

#: Exit status of a changing command refused on a live directory, and of bad input.
EXIT_USAGE = 2
#: Exit status when the query ran and did not find what it was asked about.
EXIT_NOT_FOUND = 1


class _AdminError(click.ClickException):
    """An admin command failed: not found, or the files could not be read (status 1)."""

    exit_code = EXIT_NOT_FOUND


class _AdminUsageError(_AdminError):
    """Bad input, or a change refused on a live directory (status 2)."""

    exit_code = EXIT_USAGE


@contextmanager
def _admin_errors() -> Iterator[None]:
    """Turn the API's typed errors into exit statuses (see ``txnstream admin --help``)."""
    from txnstream.errors import (
        ConfigError,
        InvalidArgumentError,
        TransactionNotFound,
        TxnStreamError,
    )

    try:
        yield
    except InvalidArgumentError as e:
        raise _AdminUsageError(e.message or str(e)) from e
    except ConfigError as e:  # a bad --config is bad input too
        raise _AdminUsageError(f"{type(e).__name__}: {e}") from e
    except TransactionNotFound as e:
        raise _AdminError(e.message or str(e)) from e
    except TxnStreamError as e:
        raise _AdminError(f"{type(e).__name__}: {e}") from e


@main.group()
@click.option(
    "--data",
    "data",
    type=click.Path(exists=True, file_okay=False, dir_okay=True, path_type=Path),
    default=None,
    help="The data directory (required).",
)
@click.pass_context
def admin(ctx: click.Context, data: Path | None) -> None:
    """Inspect a data directory; change a closed one.

    Every read command works on a live directory (a broker running in
    another process) from its files alone: it never takes the writer's lock
    and never writes. Changing commands (abort-transaction, batched-log
    enable/disable) need a closed directory; on a live one they exit with
    status 2 (in the broker's process use ``broker.admin``).

    Output is a table, or JSON with --json. Exit status: 0 on success; 1
    when the transaction asked for is not found, or the files cannot be
    read; 2 on bad input (a malformed transaction id, an unknown topic,
    subscription or log, a missing --data) and for a change refused on a
    live directory.
    """
    ctx.obj = data


def _data(ctx: click.Context) -> Path:
    data = ctx.obj  # set by the admin group, inherited by its subcommands
    if not isinstance(data, Path):
        raise click.UsageError("Missing option '--data' (txnstream admin --data DIR ...).")
    from txnstream.datadir import check_data_dir

    with _admin_errors():
        return check_data_dir(data)


def _closed(data: Path, what: str) -> None:
    from txnstream.datadir import is_live

    if is_live(data):
        raise _AdminUsageError(
            f"{data} is live (a broker holds {data / 'LOCK'}): {what} needs a closed data "
            "directory; changing a live broker from another process needs the server mode "
            "(in the broker's own process use broker.admin)"
        )


_json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON (for scripts).")


def _txn_id_options(f: Any) -> Any:
    f = click.option("-l", "--least-sig-bits", type=click.IntRange(min=0), default=None)(f)
    f = click.option("-m", "--most-sig-bits", type=click.IntRange(min=0), default=None)(f)
    return click.option(
        "--txn-id", default=None, help="The transaction id '(most,least)' (or -m and -l)."
    )(f)


def _txn_id(txn_id: str | None, most: int | None, least: int | None) -> Any:
    from txnstream.coordinator import TxnID
    from txnstream.errors import InvalidArgumentError

    if txn_id is not None and (most is not None or least is not None):
        raise click.UsageError("give either --txn-id or -m/-l, not both")
    try:
        if txn_id is not None:
            return TxnID.parse(txn_id)
        if most is None or least is None:
            raise click.UsageError("give --txn-id '(most,least)', or both -m and -l")
        return TxnID(most, least)
    except InvalidArgumentError as e:
        raise click.BadParameter(e.message, param_hint="--txn-id") from None


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(text: str) -> int:
    """Parse ``10s``, ``500ms``, ``5m``, ``2h``, ``1d`` or bare seconds into milliseconds."""
    m = _DURATION.match(text)
    if m is None:
        raise click.BadParameter(
            f"{text!r} is not a duration (e.g. 10s, 500ms, 5m, 2h, 1d, or seconds)",
            param_hint="--time",
        )
    from txnstream.timer import MAX_WAIT_MS

    ms = float(m.group(1)) * _UNIT_MS[m.group(2) or "s"]
    if not math.isfinite(ms) or ms > MAX_WAIT_MS:
        raise click.BadParameter(
            f"{text!r} is longer than the longest duration ({MAX_WAIT_MS} ms)", param_hint="--time"
        )
    return round(ms)


def _emit(as_json: bool, value: Any, table: Any) -> None:
    if as_json:
        click.echo(json.dumps(value, indent=2, sort_keys=True))
    else:
        from rich.console import Console

        Console().print(table(value))


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def _rows_table(title: str, rows: list[dict[str, Any]], columns: list[str]) -> Any:
    from rich.table import Table

    t = Table(title=title)
    for c in columns:
        t.add_column(c.replace("_", " "), overflow="fold")
    for r in rows:
        t.add_row(*(_cell(_dig(r, c)) for c in columns))
    return t


def _dig(row: dict[str, Any], key: str) -> Any:
    value: Any = row
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _kv_table(title: str, value: dict[str, Any]) -> Any:
    from rich.table import Table

    t = Table(title=title, show_header=False)
    t.add_column("key", no_wrap=True)
    t.add_column("value", overflow="fold")
    for k, v in value.items():
        t.add_row(k.replace("_", " "), _cell(v))
    return t


_TXN_COLUMNS = [
    "txn_id",
    "status",
    "client_name",
    "start_time",
    "timeout_at",
    "timed_out",
    "partitions",
    "subscriptions",
]


@admin.command("logs")
@_json_option
@click.pass_context
def admin_logs(ctx: click.Context, as_json: bool) -> None:
    """List the managed ledgers: kind, ledgers, entries, cursors (mark-delete)."""
    from txnstream.datadir import describe_logs

    data = _data(ctx)
    with _admin_errors():
        logs = describe_logs(data)
    columns = ["name", "kind", "ledgers", "entries", "first", "last", "cursors"]
    _emit(as_json, logs, lambda v: _rows_table(f"logs in {data}", v, columns))


_coordinator_option = click.option(
    "-c", "--coordinator-id", type=click.IntRange(min=0), default=None, help="Only this one."
)
_now_option = click.option(
    "--now-ms",
    type=click.IntRange(min=0),
    default=None,
    help="Reference time (ms since the epoch). Default: now.",
)


@admin.command("coordinator-stats")
@_coordinator_option
@_json_option
@click.pass_context
def admin_coordinator_stats(ctx: click.Context, coordinator_id: int | None, as_json: bool) -> None:
    """Coordinator stats: live/open/ending transactions, LWM, log (Pulsar: coordinator-stats)."""
    from txnstream.datadir import coordinator_stats

    data = _data(ctx)
    with _admin_errors():
        stats = coordinator_stats(data, coordinator_id)
    columns = [
        "tc_id",
        "live",
        "open",
        "ending",
        "low_water_mark",
        "terminated_remembered",
        "log.entries",
        "log.records",
        "log.mark_delete",
    ]
    _emit(as_json, stats, lambda v: _rows_table("coordinators", v, columns))


@admin.command("transaction-metadata")
@_txn_id_options
@_json_option
@click.pass_context
def admin_transaction_metadata(
    ctx: click.Context,
    txn_id: str | None,
    most_sig_bits: int | None,
    least_sig_bits: int | None,
    as_json: bool,
) -> None:
    """One transaction's metadata, live or remembered as ended (Pulsar: transaction-metadata)."""
    from txnstream.datadir import transaction_metadata

    tid = _txn_id(txn_id, most_sig_bits, least_sig_bits)
    data = _data(ctx)
    with _admin_errors():
        meta = transaction_metadata(data, tid)
    _emit(as_json, meta, lambda v: _kv_table(f"transaction {tid}", v))


@admin.command("open-transactions")
@_coordinator_option
@_json_option
@click.pass_context
def admin_open_transactions(ctx: click.Context, coordinator_id: int | None, as_json: bool) -> None:
    """Every live transaction (OPEN, COMMITTING, ABORTING), oldest first (Kafka: list)."""
    from txnstream.datadir import open_transactions

    data = _data(ctx)
    with _admin_errors():
        txns = open_transactions(data, coordinator_id)
    _emit(as_json, txns, lambda v: _rows_table("open transactions", v, _TXN_COLUMNS))


@admin.command("slow-transactions")
@click.option(
    "-t", "--time", "time_", required=True, help="Minimum age: 10s, 500ms, 5m, 2h, or seconds."
)
@_coordinator_option
@_now_option
@_json_option
@click.pass_context
def admin_slow_transactions(
    ctx: click.Context, time_: str, coordinator_id: int | None, now_ms: int | None, as_json: bool
) -> None:
    """Live transactions started at least --time ago (Pulsar: slow-transactions)."""
    from txnstream.datadir import slow_transactions

    min_age_ms = parse_duration_ms(time_)
    data = _data(ctx)
    with _admin_errors():
        txns = slow_transactions(data, min_age_ms, now_ms=now_ms, tc_id=coordinator_id)
    _emit(as_json, txns, lambda v: _rows_table(f"transactions older than {time_}", v, _TXN_COLUMNS))


@admin.command("late-transactions")
@_coordinator_option
@_now_option
@_json_option
@click.pass_context
def admin_late_transactions(
    ctx: click.Context, coordinator_id: int | None, now_ms: int | None, as_json: bool
) -> None:
    """Live transactions past their timeout (Kafka: find-hanging)."""
    from txnstream.datadir import late_transactions

    data = _data(ctx)
    with _admin_errors():
        txns = late_transactions(data, now_ms=now_ms, tc_id=coordinator_id)
    _emit(as_json, txns, lambda v: _rows_table("late transactions", v, _TXN_COLUMNS))


@admin.command("abort-transaction")
@_txn_id_options
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="The broker's configuration (broker.conf or TOML) to open the directory with.",
)
@_json_option
@click.pass_context
def admin_abort_transaction(
    ctx: click.Context,
    txn_id: str | None,
    most_sig_bits: int | None,
    least_sig_bits: int | None,
    config_path: Path | None,
    as_json: bool,
) -> None:
    """Force-abort a transaction in a CLOSED directory (Pulsar: abort-transaction, PIP-325).

    Opens the broker on the directory (recovery runs), aborts the
    transaction whatever its client does (one already decided is finished
    as decided), and closes it. Prints its final status.
    """
    import dataclasses

    from txnstream.broker import Broker
    from txnstream.config import BrokerConfig
    from txnstream.datadir import coordinator_ids, transaction_metadata

    tid = _txn_id(txn_id, most_sig_bits, least_sig_bits)
    data = _data(ctx)
    _closed(data, "abort-transaction")
    with _admin_errors():
        before = transaction_metadata(data, tid)  # unknown: exit 1 before anything is opened
        config = BrokerConfig.load(config_path) if config_path else BrokerConfig()
        ids = coordinator_ids(data)
        if ids and config.coordinators <= max(ids):
            config = dataclasses.replace(config, coordinators=max(ids) + 1)
        with Broker.open(data, config, registry=None) as broker:  # applies dynamic settings
            status = broker.admin.force_abort(tid)
    result = {"txn_id": str(tid), "status_before": before["status"], "status": status.name}
    _emit(as_json, result, lambda v: _kv_table(f"abort-transaction {tid}", v))


@admin.command("transaction-buffer-stats")
@click.option(
    "-t", "--topic", required=True, help="The topic (a partitioned one: every partition)."
)
@_json_option
@click.pass_context
def admin_transaction_buffer_stats(ctx: click.Context, topic: str, as_json: bool) -> None:
    """Transaction buffer per partition: max_read_position, ongoing, aborted, LWM, snapshot age.

    Pulsar: transaction-buffer-stats.
    """
    from txnstream.datadir import transaction_buffer_stats

    data = _data(ctx)
    with _admin_errors():
        stats = transaction_buffer_stats(data, topic)
    columns = [
        "topic",
        "max_read_position",
        "last_position",
        "lag",
        "ongoing",
        "aborted",
        "committed",
        "low_water_marks",
        "snapshot.age_ms",
    ]
    _emit(as_json, stats, lambda v: _rows_table("transaction buffer", v, columns))


@admin.command("pending-ack-stats")
@click.option(
    "-t", "--topic", required=True, help="The topic (a partitioned one: every partition)."
)
@click.option("-s", "--sub-name", "--sub", "sub", required=True, help="The subscription.")
@_json_option
@click.pass_context
def admin_pending_ack_stats(ctx: click.Context, topic: str, sub: str, as_json: bool) -> None:
    """Pending acks of a subscription per partition (Pulsar: pending-ack-stats)."""
    from txnstream.datadir import pending_ack_stats

    data = _data(ctx)
    with _admin_errors():
        stats = pending_ack_stats(data, topic, sub)
    columns = [
        "topic",
        "subscription",
        "mark_delete_position",
        "ongoing",
        "committed_in_log",
        "aborted_in_log",
        "log.records",
        "ongoing_transactions",
    ]
    _emit(as_json, stats, lambda v: _rows_table("pending acks", v, columns))


@admin.command("topic-internal-stats")
@click.option(
    "-t", "--topic", required=True, help="A topic, or any managed ledger's name (see logs)."
)
@_json_option
@click.pass_context
def admin_topic_internal_stats(ctx: click.Context, topic: str, as_json: bool) -> None:
    """Managed-ledger internal stats: ledgers, entries, cursors, mark-delete.

    Pulsar: topics stats-internal. Also any managed ledger by name, e.g. a
    coordinator log (__transaction_log_0) or a pending-ack log.
    """
    from txnstream.datadir import internal_stats

    data = _data(ctx)
    with _admin_errors():
        stats = internal_stats(data, topic)

    def tables(value: dict[str, dict[str, Any]]) -> Any:
        from rich.console import Group

        parts: list[Any] = []
        for name, s in value.items():
            head = {k: v for k, v in s.items() if k not in ("ledgers", "cursors")}
            parts.append(_kv_table(name, head))
            parts.append(_rows_table("ledgers", s["ledgers"], ["ledger_id", "entries", "sealed"]))
            cursors = [{"cursor": c, **v} for c, v in s["cursors"].items()]
            parts.append(
                _rows_table(
                    "cursors", cursors, ["cursor", "mark_delete_position", "individually_deleted"]
                )
            )
        return Group(*parts)

    _emit(as_json, stats, tables)


@admin.group("batched-log")
def admin_batched_log() -> None:
    """Batched writes (PIP-160) of the coordinator and pending-ack logs: stats and switch."""


_log_option = click.option(
    "--log",
    "log",
    type=click.Choice(["coordinator", "pending-ack"]),
    required=True,
    help="Which logs: the coordinators' or the pending-ack stores'.",
)


@admin_batched_log.command("stats")
@_log_option
@click.option(
    "--max-records",
    type=click.IntRange(min=1),
    default=512,
    show_default=True,
    help="The writers' max records, to tell flush triggers apart.",
)
@click.option(
    "--max-size",
    type=click.IntRange(min=1),
    default=4 << 20,
    show_default=True,
    help="The writers' max bytes, to tell flush triggers apart.",
)
@_json_option
@click.pass_context
def admin_batched_log_stats(
    ctx: click.Context, log: str, max_records: int, max_size: int, as_json: bool
) -> None:
    """Batch stats from the stored entries: records and bytes per entry, flush triggers, delay."""
    from txnstream.datadir import batch_stats

    data = _data(ctx)
    with _admin_errors():
        stats = batch_stats(data, log, max_records=max_records, max_size=max_size)
    columns = [
        "name",
        "entries",
        "batched_entries",
        "records",
        "records_per_entry.mean",
        "records_per_entry.max",
        "bytes_per_entry.mean",
        "bytes_per_entry.max",
        "flush_triggers",
        "oldest_record_delay_seconds.max",
    ]
    enabled = {True: "on", False: "off", None: "as configured"}[stats["enabled"]]
    title = f"{log} batched log (switch: {enabled})"
    _emit(as_json, stats, lambda v: _rows_table(title, [*v["logs"], v["total"]], columns))


def _switch(ctx: click.Context, log: str, enabled: bool, as_json: bool) -> None:
    from txnstream.config import DYNAMIC_CONFIG_FILE, write_dynamic_config

    data = _data(ctx)
    verb = "enable" if enabled else "disable"
    _closed(data, f"batched-log {verb}")
    from txnstream.datadir import BATCH_SWITCH_KEY

    key = BATCH_SWITCH_KEY[log]
    with _admin_errors():
        settings = write_dynamic_config(data, {key: enabled})
    result = {"log": log, "enabled": enabled, "file": str(data / DYNAMIC_CONFIG_FILE), **settings}
    _emit(as_json, result, lambda v: _kv_table(f"{log} batched log {verb}d (next open)", v))


@admin_batched_log.command("enable")
@_log_option
@_json_option
@click.pass_context
def admin_batched_log_enable(ctx: click.Context, log: str, as_json: bool) -> None:
    """Turn batching on in a CLOSED directory (persisted; applied at the next open)."""
    _switch(ctx, log, True, as_json)


@admin_batched_log.command("disable")
@_log_option
@_json_option
@click.pass_context
def admin_batched_log_disable(ctx: click.Context, log: str, as_json: bool) -> None:
    """Turn batching off in a CLOSED directory (persisted; applied at the next open)."""
    _switch(ctx, log, False, as_json)


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
