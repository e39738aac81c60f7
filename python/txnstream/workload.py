"""A concurrent transaction workload, run as a child process by the main job.

``python -m txnstream.workload --data DIR --txns N ...`` drives ``N``
transactions through the coordinators of ``DIR`` from ``--threads`` client
threads (each a named client, so ends are idempotent, PIP-255): most commit,
some abort, some are left to time out. After each end is durable it prints
one JSON line ``{"id": [most, least], "o": outcome}`` on stdout, so a parent
that kills this process knows exactly which outcomes were acknowledged.
Every ``--stats-every-ms`` milliseconds it prints the coordinators' log statistics.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from txnstream.config import BatchedWriteConfig
from txnstream.coordinator import TransactionCoordinators, TxnID
from txnstream.errors import TransactionAlreadyAborted, TransactionTimedOut

#: Share of transactions that commit / abort; the rest time out.
COMMIT_SHARE = 0.80
ABORT_SHARE = 0.12
SHORT_TIMEOUT_MS = 30


def log_stats(tcs: TransactionCoordinators) -> dict[str, int]:
    """Sum the writer statistics (entries written, records, bytes) of every transaction log."""
    keys = ("entries", "records", "bytes", "batched_entries")
    out = dict.fromkeys(keys, 0)
    for s in tcs.stats():
        for key in keys:
            out[key] += int(s["log"][key])
    return out


def run_one(tcs: TransactionCoordinators, client: str, kind: str, topic: int) -> str:
    """Run one transaction of ``kind`` (commit/abort/timeout); return its outcome."""
    timeout = SHORT_TIMEOUT_MS if kind == "timeout" else 30_000
    txn = tcs.new_transaction(timeout_ms=timeout, client_name=client)
    tcs.add_produced_partitions(txn, [f"public/default/out-{topic}"])
    tcs.add_acked_subscriptions(txn, [("public/default/in", "etl")])
    if kind == "commit":
        tcs.end_transaction(txn, "commit")
        return _emit(txn, "committed")
    if kind == "abort":
        tcs.end_transaction(txn, "abort")
        return _emit(txn, "aborted")
    time.sleep(SHORT_TIMEOUT_MS * 3 / 1000)
    try:
        tcs.end_transaction(txn, "commit")
    except (TransactionAlreadyAborted, TransactionTimedOut):
        return _emit(txn, "timed_out")
    return _emit(txn, "committed")  # the timer lost the race: still a valid outcome


_out_lock = threading.Lock()


def _print(obj: dict[str, Any]) -> None:
    line = json.dumps(obj, separators=(",", ":"))
    with _out_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def _emit(txn: TxnID, outcome: str) -> str:
    _print({"id": [txn.most_bits, txn.least_bits], "o": outcome})
    return outcome


def plan(n: int, seed: int) -> list[str]:
    """Deterministic mix of transaction kinds."""
    rng = random.Random(seed)
    kinds = []
    for _ in range(n):
        r = rng.random()
        kinds.append(
            "commit"
            if r < COMMIT_SHARE
            else "abort"
            if r < COMMIT_SHARE + ABORT_SHARE
            else "timeout"
        )
    return kinds


def run(args: argparse.Namespace) -> None:
    """Open the coordinators, run the workload, print outcomes and stats."""
    tcs = TransactionCoordinators.open(
        args.data,
        args.coordinators,
        batched_write=BatchedWriteConfig(enabled=args.batch == "on"),
        transaction_meta_persist_count=args.persist_count,
    )
    kinds = plan(args.txns, args.seed)
    next_index = iter(range(len(kinds)))
    take = threading.Lock()
    stop = threading.Event()

    def client(i: int) -> None:
        name = f"demo-client-{i}"
        while True:
            with take:
                k = next(next_index, None)
            if k is None:
                return
            run_one(tcs, name, kinds[k], k % 4)

    def reporter(emit: Callable[[dict[str, Any]], None]) -> None:
        while not stop.wait(args.stats_every_ms / 1000):
            emit({"stats": log_stats(tcs)})

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(args.threads)]
    rep = threading.Thread(target=reporter, args=(_print,), daemon=True)
    rep.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    stop.set()
    _print({"stats": log_stats(tcs), "done": True, "seconds": elapsed})
    tcs.close()


def main(argv: list[str] | None = None) -> None:
    """Parse arguments and run the workload."""
    p = argparse.ArgumentParser(prog="python -m txnstream.workload")
    p.add_argument("--data", required=True)
    p.add_argument("--txns", type=int, default=2000)
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--coordinators", type=int, default=2)
    p.add_argument("--batch", choices=("on", "off"), default="on")
    p.add_argument("--persist-count", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--stats-every-ms", type=int, default=100)
    run(p.parse_args(argv))


if __name__ == "__main__":
    main()
