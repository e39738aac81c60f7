"""A quick measurement of this machine (``txnstream bench``): transactions/s and log scan rate.

Not the benchmark suite (``benches/``, ``make bench``): a minute-or-less check
a user runs where txnstream is installed. In a fresh temporary directory, a
coordinator with a batched log (PIP-160) runs ``txns`` transactions
(NEW, ADD_PARTITION, commit: 4 durable records each) through the bulk API from
``threads`` threads, 64 per call; then the log is read back with the Rust
scanner that the Spark data source uses.
"""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from txnstream._native import ManagedLedger, scan_log
from txnstream.coordinator import TransactionCoordinator

__all__ = ["run"]

_PER_CALL = 64
_LOG = "__transaction_log_0"


def _worker(tc: TransactionCoordinator, txns: int, errors: list[BaseException]) -> None:
    try:
        for start in range(0, txns, _PER_CALL):
            ids = tc.new_transactions(min(_PER_CALL, txns - start), timeout_ms=60_000)
            tc.add_produced_partitions_many([(t, ["bench-out"]) for t in ids])
            tc.end_transactions([(t, "commit") for t in ids])
    except BaseException as e:  # reported by run(), not lost in the thread
        errors.append(e)


def _scan(directory: Path) -> tuple[int, int, float]:
    """Return (entries, records, seconds) of scanning the whole coordinator log."""
    ml = ManagedLedger.open(directory, _LOG, read_only=True)
    try:
        started = time.perf_counter()
        entries = records = 0
        for ledger_id, n, _sealed in ml.ledgers():
            first: int | None = 0 if n else None
            while first is not None:
                d = scan_log(ml, "txn", ledger_id, first, n - 1, None, 65_536)
                records += len(d["status"])
                first = d["next_entry"]
            entries += n
        return entries, records, time.perf_counter() - started
    finally:
        ml.close()


def run(txns: int = 20_000, threads: int = 4) -> dict[str, Any]:
    """Run the measurement in a temporary directory; return its figures (JSON-ready)."""
    if txns < 1 or threads < 1:
        raise ValueError(f"need txns >= 1 and threads >= 1, got txns={txns}, threads={threads}")
    with tempfile.TemporaryDirectory(prefix="txnstream-bench-") as tmp:
        d = Path(tmp)
        tc = TransactionCoordinator.open(
            d, 0, registry=None, batched_write_enabled=True, batched_write_max_records=512
        )
        errors: list[BaseException] = []
        share = [txns // threads + (1 if i < txns % threads else 0) for i in range(threads)]
        workers = [
            threading.Thread(target=_worker, args=(tc, n, errors), daemon=True) for n in share if n
        ]
        started = time.perf_counter()
        try:
            for w in workers:
                w.start()
            for w in workers:
                # Each call has the coordinator's own deadlines; this bounds the whole run.
                w.join(timeout=600)
            seconds = time.perf_counter() - started
        finally:
            tc.close()
        if errors:
            raise errors[0]
        if any(w.is_alive() for w in workers):
            raise TimeoutError("bench workers still running after 600 s")
        entries, records, scan_seconds = _scan(d)
    return {
        "transactions": txns,
        "threads": threads,
        "seconds": round(seconds, 3),
        "transactions_per_second": round(txns / seconds, 1),
        "log_entries": entries,
        "log_records": records,
        "records_per_entry": round(records / entries, 2) if entries else 0.0,
        "scan_seconds": round(scan_seconds, 4),
        "scan_records_per_second": round(records / scan_seconds, 1) if scan_seconds else None,
    }
