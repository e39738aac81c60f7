"""Child process for the live-directory test: a coordinator that keeps committing.

Usage: ``python -m tests.spark.live_writer DATA_DIR STOP_FILE``. Prints the
number of transactions ended so far after every round, and closes cleanly
once ``STOP_FILE`` exists (or after 120 s, so it can never outlive a test).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from txnstream import TransactionCoordinator


def main(directory: str, stop_file: str) -> None:
    stop = Path(stop_file)
    deadline = time.monotonic() + 120
    tc = TransactionCoordinator.open(
        directory, 0, registry=None, batched_write_enabled=True, batched_write_max_records=64
    )
    done = 0
    try:
        while not stop.exists() and time.monotonic() < deadline:
            ids = tc.new_transactions(16, timeout_ms=600_000, client_name="live")
            tc.add_produced_partitions_many([(t, ["out"]) for t in ids])
            tc.end_transactions(
                [(t, "abort" if i % 4 == 0 else "commit") for i, t in enumerate(ids)]
            )
            done += len(ids)
            print(done, flush=True)
            time.sleep(0.01)  # a steady writer, not a flood: the test reads the whole log
    finally:
        tc.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
