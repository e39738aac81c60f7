"""The main job behind ``make demo`` / ``txnstream demo``: the whole system at work.

On a fresh data directory:

1. **seed**: the input topic :data:`~txnstream.workload.INPUT` (partitioned)
   gets ``--inputs`` messages;
2. **run**: a child process runs the consume-transform-produce workload
   (:mod:`txnstream.workload`) through the client API: transactions that
   receive 1-3 inputs, send one output per input to two topics and ack the
   inputs, with random aborts and abandoned transactions that time out;
3. **kill -9** of the child part-way through, then **recovery**: the broker
   is reopened here with ``topicRecoveryMode=eager``: every partition (20 in
   one namespace) recovers from its transaction-buffer snapshot, read
   through the namespace's one shared snapshot reader, plus its ledger tail,
   and recovery reconciliation resolves what the dead process left; timed;
4. **finish**: a second child drains the rest;
5. **verify** through the client: every input appears exactly once in the
   READ_COMMITTED output of each output topic, nothing aborted is visible
   there, the input subscription has nothing left;
6. **audit** on local Spark (when the Spark extra is installed): the
   coordinator and pending-ack logs, topic markers and the exactly-once of
   the outputs (traced to inputs through ``source``) are audited from the
   files and a report written.

It prints a report and exits non-zero when any check fails.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from txnstream.broker import Broker
from txnstream.errors import TxnStreamError
from txnstream.workload import INPUT, OUTPUTS, SUBSCRIPTION, broker_config

__all__ = ["INPUT", "OUTPUTS", "SUBSCRIPTION", "Run", "main", "recover", "seed", "verify"]

#: Marks a directory the main job created, so it only ever deletes its own.
MARKER = ".txnstream-demo"
#: Partitions of the input topic (one workload thread each) and of each output.
INPUT_PARTITIONS = 4
OUTPUT_PARTITIONS = 8
#: Longest a workload child may run before the job kills it and fails.
CHILD_DEADLINE_S = 300.0


@dataclass
class Run:
    """What the job did and measured."""

    inputs: int
    committed: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    waits: Counter[int] = field(default_factory=Counter)
    committed_at_kill: int = 0
    recovery_seconds: float = 0.0
    recovered: dict[str, int] = field(default_factory=dict)
    recovery_wave: dict[str, Any] = field(default_factory=dict)
    visible: dict[str, Counter[str]] = field(default_factory=dict)
    uncommitted_outputs: dict[str, int] = field(default_factory=dict)
    backlog: int = 0
    failures: list[str] = field(default_factory=list)
    audit: dict[str, Any] | None = None


def _audit_module() -> Any:
    """Return :mod:`txnstream.spark.audit`, or None without the Spark extra."""
    try:
        # Imported by name: the Spark extra is optional.
        return importlib.import_module("txnstream.spark.audit")
    except ImportError:
        return None


def _audit_dir(data: Path) -> Path:
    """Where the audit of ``data`` goes: ``<data>-audit`` next to it, as ``txnstream audit``."""
    return data.resolve().with_name(data.name + "-audit")


def _refusal(data: Path) -> str | None:
    """Why the job cannot use ``data`` (and its audit output), before any work; None: it can."""
    if data.exists() or data.is_symlink():
        if not data.is_dir():
            return f"{data} exists and is not a directory"
        if not (data / MARKER).exists() and any(data.iterdir()):
            return f"{data} exists and was not created by txnstream demo: not touching it"
    spark_audit = _audit_module()
    if spark_audit is not None:
        try:
            spark_audit.check_output_dir(_audit_dir(data), data)
        except TxnStreamError as e:
            return f"cannot audit {data}: {e}"
    return None


def _prepare(data: Path) -> None:
    """Replace ``data`` (checked by :func:`_refusal`) by a fresh directory the job owns."""
    if data.exists():
        shutil.rmtree(data)
    data.mkdir(parents=True)
    (data / MARKER).write_text("created by txnstream demo; deleted by the next run\n")


def seed(data: Path, inputs: int) -> None:
    """Create the topics and send the inputs (non-transactional, durable)."""
    with Broker.open(data, broker_config()) as broker:
        broker.admin.create_topic(INPUT, INPUT_PARTITIONS)
        for t in OUTPUTS:
            broker.admin.create_topic(t, OUTPUT_PARTITIONS)
        producer = broker.client("demo-seed").producer(INPUT)
        for start in range(0, inputs, 500):
            for i in range(start, min(inputs, start + 500)):
                producer.send_async(f"input {i}".encode(), key=f"in-{i}")
            producer.flush()


def _child(data: Path, seed_: int) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "txnstream.workload", "--data", str(data), "--seed", str(seed_)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, bufsize=1)


def _follow(
    proc: subprocess.Popen[str], run: Run, progress: Progress, task: Any, kill_at: int | None
) -> None:
    """Read the child's outcome lines; SIGKILL it once ``kill_at`` inputs committed.

    A child that runs past :data:`CHILD_DEADLINE_S` is killed too (a hung
    workload fails the job instead of hanging it).
    """
    assert proc.stdout is not None
    timed_out = threading.Event()

    def overdue() -> None:
        timed_out.set()
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)

    watchdog = threading.Timer(CHILD_DEADLINE_S, overdue)
    watchdog.daemon = True
    watchdog.start()
    try:
        _read_outcomes(proc, run, progress, task, kill_at)
        proc.wait(timeout=60)
    finally:
        watchdog.cancel()
    if timed_out.is_set():
        run.failures.append(f"workload child ran past {CHILD_DEADLINE_S:.0f} s and was killed")
    elif kill_at is None and proc.returncode != 0:
        run.failures.append(f"workload child exited with status {proc.returncode}")


def _read_outcomes(
    proc: subprocess.Popen[str], run: Run, progress: Progress, task: Any, kill_at: int | None
) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        msg = json.loads(line)
        if "c" in msg:
            run.committed += msg["c"]
            run.outcomes["committed"] += 1
            run.waits[msg["w"]] += 1
            progress.update(task, completed=min(run.committed, run.inputs))
            if kill_at is not None and run.committed >= kill_at:
                os.kill(proc.pid, signal.SIGKILL)
                run.committed_at_kill = run.committed
                break
        elif "a" in msg:
            run.outcomes["aborted"] += 1
        elif "s" in msg:
            run.outcomes["abandoned (timed out)"] += 1


def recover(data: Path, run: Run) -> None:
    """Reopen the broker after the crash and load every topic, timed."""
    started = time.perf_counter()
    cfg = dataclasses.replace(broker_config(), topic_recovery="eager")
    with Broker.open(data, cfg) as broker:
        if not broker.wait_recovered(int(CHILD_DEADLINE_S * 1000)):
            run.failures.append("the recovery wave did not finish in time")
        run.recovery_wave = broker.recovery_status()
        if run.recovery_wave.get("failed"):
            run.failures.append(f"recovery failed: {run.recovery_wave['errors']}")
        client = broker.client("demo-recovery")
        for t in (INPUT, *OUTPUTS):
            for tn in broker.partition_names(t):
                topic = broker.topic(tn)
                for k, v in topic.recovery.items():
                    run.recovered[k] = run.recovered.get(k, 0) + v
        consumers = [
            client.subscribe(f"{INPUT}-partition-{i}", SUBSCRIPTION)
            for i in range(INPUT_PARTITIONS)
        ]
        run.recovery_seconds = time.perf_counter() - started
        for c in consumers:
            c.close()


def _read_all(client: Any, topic: str, sub: str, isolation: str) -> list[Any]:
    consumer = client.subscribe(topic, sub, isolation)
    out: list[Any] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        got = consumer.receive_many(500, timeout_ms=500)
        if not got:
            break
        out.extend(got)
    consumer.close()
    return out


def verify(data: Path, run: Run) -> None:
    """Exactly once, through the client: each input once in each output topic."""
    want = {f"in-{i}" for i in range(run.inputs)}
    with Broker.open(data, broker_config()) as broker:
        client = broker.client("demo-verify")
        for topic in OUTPUTS:
            committed = _read_all(client, topic, "verify-committed", "read_committed")
            seen = Counter(m.properties.get("source", "") for m in committed)
            run.visible[topic] = seen
            dups = sorted(k for k, n in seen.items() if n > 1)
            missing = sorted(want - set(seen))
            extra = sorted(set(seen) - want)
            for what, keys in (("duplicated", dups), ("missing", missing), ("unknown", extra)):
                if keys:
                    run.failures.append(f"{topic}: {len(keys)} inputs {what}, e.g. {keys[:3]}")
            everything = _read_all(client, topic, "verify-uncommitted", "read_uncommitted")
            run.uncommitted_outputs[topic] = len(everything) - len(committed)
        backlog = _read_all(client, INPUT, SUBSCRIPTION, "read_committed")
        run.backlog = len(backlog)
        if backlog:
            run.failures.append(f"{len(backlog)} inputs left unconsumed in {SUBSCRIPTION}")


def audit(data: Path, run: Run, console: Console) -> None:
    """Audit the logs on local Spark, when the Spark extra is installed.

    The report goes next to the data directory (``<data>-audit``), as
    ``txnstream audit`` puts it.
    """
    spark_audit = _audit_module()
    if spark_audit is None:
        console.print("[yellow]Spark extra not installed: audit skipped[/]")
        return
    out = _audit_dir(data)
    with console.status("audit on Spark: starting") as status:
        result = spark_audit.run_audit(
            data, out, progress=lambda step: status.update(f"audit on Spark: {step}")
        )
    summary = result.summary
    run.audit = {
        "verdict": result.verdict,
        "violations": summary["violations"]["total"],
        "transactions": summary["transactions"]["total"],
        "exactly-once (topics traced on Spark)": summary["exactly_once"]["verdict"],
        "entries saved by batching": summary["entries"]["saved_by_batching"],
        "report": str(out / "report.html"),
    }
    if result.verdict != "PASS":
        run.failures.append(f"the audit found {summary['violations']['total']} violations")


def report(run: Run, console: Console, seconds: float) -> None:
    """Print the headline figures and the verdict."""
    t = Table(title="txnstream main job", show_header=False)
    t.add_row("inputs", f"{run.inputs:,}")
    t.add_row("transactions", ", ".join(f"{n:,} {k}" for k, n in sorted(run.outcomes.items())))
    t.add_row("inputs committed when killed (kill -9)", f"{run.committed_at_kill:,}")
    t.add_row("recovery (reopen + load every topic)", f"{run.recovery_seconds * 1000:.0f} ms")
    wave = run.recovery_wave
    if wave:
        t.add_row(
            "recovery through the shared snapshot reader",
            f"{wave.get('recovered', 0)} partitions, {wave['from_snapshot']} from snapshots, "
            f"{wave['snapshot_entries_read']} snapshot entries read once for all, "
            f"{wave['entries_replayed']} ledger entries replayed",
        )
    t.add_row("recovered", ", ".join(f"{k}={v}" for k, v in sorted(run.recovered.items())))
    waits = sum(k * n for k, n in run.waits.items()) / max(1, sum(run.waits.values()))
    t.add_row(
        "durable waits per commit",
        f"mean {waits:.2f}, max {max(run.waits, default=0)} (bound: 3)",
    )
    for topic in OUTPUTS:
        t.add_row(
            f"{topic}",
            f"{sum(run.visible.get(topic, Counter()).values()):,} committed outputs, "
            f"{run.uncommitted_outputs.get(topic, 0):,} aborted ones invisible to READ_COMMITTED",
        )
    t.add_row("input backlog", f"{run.backlog}")
    if run.audit is not None:
        for k, v in run.audit.items():
            t.add_row(f"audit: {k}", str(v))
    t.add_row("wall time", f"{seconds:.1f} s")
    console.print(t)
    if max(run.waits, default=0) > 3:
        run.failures.append(f"a commit made {max(run.waits)} durable waits (bound 3)")
    for f in run.failures:
        console.print(f"[red]FAIL[/] {escape(f)}")
    verdict = "PASS" if not run.failures else "FAIL"
    console.print(f"exactly-once verdict: {verdict}")


def main(data: str, inputs: int = 2_000, kill_fraction: float = 0.4) -> int:
    """Run the main job; return 0 when every check passed, 1 when one failed, 2 on bad use."""
    console = Console()
    path = Path(data)
    refused = _refusal(path)
    if refused is not None:
        console.print(f"[red]{escape(refused)}[/]")
        return 2
    _prepare(path)
    started = time.perf_counter()
    run = Run(inputs)
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        t_seed = progress.add_task("seed inputs", total=1)
        seed(path, inputs)
        progress.update(t_seed, completed=1)
        task = progress.add_task("inputs committed", total=inputs)
        _follow(_child(path, 1), run, progress, task, max(1, int(inputs * kill_fraction)))
        t_rec = progress.add_task("recover after kill -9", total=1)
        recover(path, run)
        progress.update(t_rec, completed=1)
        _follow(_child(path, 2), run, progress, task, None)
        t_ver = progress.add_task("verify exactly-once", total=1)
        verify(path, run)
        progress.update(t_ver, completed=1)
    try:
        audit(path, run, console)
    except Exception as e:  # the run failed; its report and verdict still print
        run.failures.append(f"the audit failed: {type(e).__name__}: {e}")
    report(run, console, time.perf_counter() - started)
    return 0 if not run.failures else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1] if len(sys.argv) > 1 else "demo-data"))
