"""The main job behind ``make demo`` / ``txnstream demo``.

On a fresh data directory, for the transaction log with batching off and then
on (PIP-160):

1. a child process runs a concurrent transaction workload through the
   coordinators (:mod:`txnstream.workload`), printing each acknowledged end;
2. the child is killed with SIGKILL part-way through;
3. the coordinators are recovered here, timed, and every acknowledged
   outcome is checked by retrying its end (idempotent end, PIP-255): the same
   end must answer the same outcome, the opposite end a definite error;
   transactions caught in flight are recovered and finished;
4. a second child finishes the workload.

It then prints a report (outcomes, log entries and bytes with and without
batching, recovery time, idempotent retries answered) and exits non-zero if
any acknowledged outcome was lost or changed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from txnstream.config import BatchedWriteConfig
from txnstream.coordinator import TransactionCoordinators, TxnID, TxnStatus
from txnstream.errors import TransactionAlreadyAborted, TransactionAlreadyCommitted

COORDINATORS = 2
#: Marks a directory the main job created, so it only ever deletes its own.
MARKER = ".txnstream-demo"


@dataclass
class ModeResult:
    """What one mode (batching off or on) did and measured."""

    mode: str
    outcomes: dict[tuple[int, int], str] = field(default_factory=dict)
    acked_before_crash: int = 0
    recovered_open: int = 0
    recovered_ending: int = 0
    recovery_seconds: float = 0.0
    retries_answered: int = 0
    retry_failures: list[str] = field(default_factory=list)
    log: Counter[str] = field(default_factory=Counter)
    finish_seconds: float = 0.0
    finish_txns: int = 0


def _worker(data: Path, mode: str, txns: int, threads: int, seed: int) -> subprocess.Popen[str]:
    cmd = [
        sys.executable,
        "-m",
        "txnstream.workload",
        "--data",
        str(data),
        "--txns",
        str(txns),
        "--threads",
        str(threads),
        "--coordinators",
        str(COORDINATORS),
        "--batch",
        mode,
        "--seed",
        str(seed),
    ]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, bufsize=1)


def _drain(
    proc: subprocess.Popen[str],
    res: ModeResult,
    progress: Progress,
    task: Any,
    kill_after: int | None,
) -> dict[str, Any]:
    """Read the child's lines; SIGKILL it once ``kill_after`` outcomes were acked."""
    assert proc.stdout is not None
    last: dict[str, Any] = {}
    for line in proc.stdout:
        msg = json.loads(line)
        if "o" in msg:
            res.outcomes[(msg["id"][0], msg["id"][1])] = msg["o"]
            progress.advance(task)
            if kill_after is not None and len(res.outcomes) >= kill_after:
                os.kill(proc.pid, signal.SIGKILL)
                break
        elif "stats" in msg:
            last = msg
    proc.wait()
    return last


def _verify(tcs: TransactionCoordinators, res: ModeResult) -> None:
    """Retry every acknowledged end: same end -> same answer, opposite -> definite error."""
    for (most, least), outcome in res.outcomes.items():
        txn = TxnID(most, least)
        committed = outcome == "committed"
        same, opposite = ("commit", "abort") if committed else ("abort", "commit")
        want_status = TxnStatus.COMMITTED if committed else TxnStatus.ABORTED
        want_error = TransactionAlreadyCommitted if committed else TransactionAlreadyAborted
        try:
            got = tcs.end_transaction(txn, same)
            if got != want_status:
                res.retry_failures.append(f"{txn}: {same} answered {got!r}, acked {outcome}")
                continue
            tcs.end_transaction(txn, opposite)
            res.retry_failures.append(f"{txn}: {opposite} succeeded, acked {outcome}")
        except want_error:
            res.retries_answered += 2
        except Exception as e:  # any other answer is a lost or changed outcome
            res.retry_failures.append(f"{txn}: {type(e).__name__}: {e}")


def run_mode(
    data: Path, mode: str, txns: int, threads: int, kill_fraction: float, console: Console
) -> ModeResult:
    """Run, crash, recover, verify and finish one mode."""
    res = ModeResult(mode)
    kill_after = max(1, int(txns * kill_fraction))
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(f"batching {mode}: run until kill -9", total=kill_after)
        last = _drain(_worker(data, mode, txns, threads, seed=1), res, progress, task, kill_after)
    res.acked_before_crash = len(res.outcomes)
    res.log.update(last.get("stats", {}))

    t0 = time.perf_counter()
    tcs = TransactionCoordinators.open(
        data,
        COORDINATORS,
        transaction_meta_persist_count=100_000,
        batched_write=BatchedWriteConfig(enabled=mode == "on"),  # as the crashed run
    )
    res.recovery_seconds = time.perf_counter() - t0
    try:
        for tc_id in range(COORDINATORS):
            rec = tcs.get(tc_id).recovery
            res.recovered_open += int(rec["open"])
            res.recovered_ending += int(rec["ending"])
        _verify(tcs, res)
        for tc_id in range(COORDINATORS):
            for info in tcs.get(tc_id).list_transactions():
                tcs.get(tc_id).force_abort(info.txn_id)
    finally:
        tcs.close()

    remaining = txns - res.acked_before_crash
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(f"batching {mode}: finish after recovery", total=remaining)
        before = len(res.outcomes)
        last = _drain(_worker(data, mode, remaining, threads, seed=2), res, progress, task, None)
    res.finish_txns = len(res.outcomes) - before
    res.finish_seconds = float(last.get("seconds", 0.0))
    res.log.update(last.get("stats", {}))
    return res


def report(results: list[ModeResult], console: Console) -> bool:
    """Print the report; return True when every check passed."""
    t = Table(title="txnstream main job: coordinators, kill -9, recovery, idempotent end")
    t.add_column("")
    for r in results:
        t.add_column(f"batching {r.mode}", justify="right")

    def row(name: str, values: list[str]) -> None:
        t.add_row(name, *values)

    counts = [Counter(r.outcomes.values()) for r in results]
    row("committed", [f"{c['committed']:,}" for c in counts])
    row("aborted", [f"{c['aborted']:,}" for c in counts])
    row("timed out (aborted by timer)", [f"{c['timed_out']:,}" for c in counts])
    row("acknowledged before kill -9", [f"{r.acked_before_crash:,}" for r in results])
    row("in flight, recovered OPEN (admin-aborted)", [f"{r.recovered_open:,}" for r in results])
    row("in flight, recovered ending", [f"{r.recovered_ending:,}" for r in results])
    row("recovery time", [f"{r.recovery_seconds * 1000:,.0f} ms" for r in results])
    row("idempotent retries answered", [f"{r.retries_answered:,}" for r in results])
    row("lost or changed outcomes", [f"{len(r.retry_failures):,}" for r in results])
    row("log records", [f"{r.log['records']:,}" for r in results])
    row("log entries written", [f"{r.log['entries']:,}" for r in results])
    row("log payload bytes", [f"{r.log['bytes']:,}" for r in results])
    # Each ledger entry also carries an 8-byte [len][crc32c] header on disk.
    row(
        "log bytes on disk (+ entry headers)",
        [f"{r.log['bytes'] + 8 * r.log['entries']:,}" for r in results],
    )
    row(
        "records per entry",
        [f"{r.log['records'] / max(1, r.log['entries']):.1f}" for r in results],
    )
    row(
        "txn/s after recovery (incl. timeout waits)",
        [f"{r.finish_txns / max(r.finish_seconds, 1e-9):,.0f}" for r in results],
    )
    console.print(t)
    ok = all(not r.retry_failures for r in results)
    for r in results:
        for f in r.retry_failures[:10]:
            console.print(f"[red]batching {r.mode}: {f}")
    if len(results) == 2 and results[1].log["entries"]:
        ratio = results[0].log["entries"] / results[1].log["entries"]
        console.print(f"batching wrote {ratio:.1f}x fewer log entries for the same records")
    verdict = "[green]PASS" if ok else "[red]FAIL"
    console.print(f"verdict: {verdict}[/] — every acknowledged end survived kill -9 unchanged")
    return ok


def main(
    data: str = "demo-data", txns: int = 3000, threads: int = 16, kill_fraction: float = 0.5
) -> int:
    """Run the main job on a fresh ``data`` directory; return the exit code."""
    console = Console()
    root = Path(data)
    if root.exists() and any(root.iterdir()):
        if not (root / MARKER).exists():
            console.print(
                f"[red]{root} is not empty and was not made by the main job; "
                "refusing to delete it. Pass a fresh directory."
            )
            return 2
        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)
    (root / MARKER).touch()
    results = [
        run_mode(root / f"batching-{mode}", mode, txns, threads, kill_fraction, console)
        for mode in ("off", "on")
    ]
    return 0 if report(results, console) else 1


if __name__ == "__main__":
    sys.exit(main())
