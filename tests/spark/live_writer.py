"""Child process for the live-directory tests: a coordinator that keeps committing.

Usage: ``python -m tests.spark.live_writer DATA_DIR STOP_FILE [acks]``. Prints
the number of transactions ended so far after every round, and closes cleanly
once ``STOP_FILE`` exists (or after 300 s, so it can never outlive a test).
With ``acks``, the transactions also ack messages in a pending-ack log whose
COMMIT/ABORT records the coordinator has written before it logs the end
(:func:`tests.spark.engine.workload`); otherwise they only produce.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from txnstream import TransactionCoordinator


def main(directory: str, stop_file: str, acks: bool) -> None:
    stop = Path(stop_file)
    deadline = time.monotonic() + 300
    settings: dict[str, Any] = {"batched_write_enabled": True, "batched_write_max_records": 64}
    if acks:
        from tests.spark.engine import Participants, open_coordinator, workload

        parts = Participants(Path(directory))
        tc = open_coordinator(Path(directory), parts, **settings)
    else:
        tc = TransactionCoordinator.open(directory, 0, registry=None, **settings)
    done = 0
    try:
        while not stop.exists() and time.monotonic() < deadline:
            if acks:
                workload(tc, parts, 16, first_msg=done)
            else:
                ids = tc.new_transactions(16, timeout_ms=600_000, client_name="live")
                tc.add_produced_partitions_many([(t, ["out"]) for t in ids])
                tc.end_transactions(
                    [(t, "abort" if i % 4 == 0 else "commit") for i, t in enumerate(ids)]
                )
            done += 16
            print(done, flush=True)
            # A steady writer, not a flood: the tests read the whole log.
            time.sleep(0.05 if acks else 0.01)
    finally:
        tc.close()
        if acks:
            parts.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:] == ["acks"])
