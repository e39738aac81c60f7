"""A/B script: many ledgers in one process, rounds of one append per ledger, all in flight.

Runs against whichever build of txnstream the interpreter imports, so the same script
measures the build before and after the one-journal storage (issue 8):

    .venv/bin/python benches/ab_many_ledgers.py 1000 10        # this build
    SEP=1 /old/.venv/bin/python benches/ab_many_ledgers.py 1000 10

`SEP=1` opens each ledger in its own directory (the old build allowed one writer per
directory). Prints open time, OS threads, open descriptors and the best round's durable
appends per second.
"""

import os
import sys
import tempfile
import time
from concurrent.futures import wait

from txnstream import ManagedLedger


def main(count: int, rounds: int) -> None:
    """Open `count` ledgers and run `rounds` rounds of one append per ledger."""
    root = tempfile.mkdtemp()
    separate = bool(os.environ.get("SEP"))
    started = time.perf_counter()
    ledgers = [
        ManagedLedger.open(os.path.join(root, f"d{i}") if separate else root, f"l{i}")
        for i in range(count)
    ]
    open_s = time.perf_counter() - started
    threads = len(os.listdir("/proc/self/task"))
    descriptors = len(os.listdir("/proc/self/fd"))
    best = 0.0
    for _ in range(rounds):
        started = time.perf_counter()
        wait([ledger.append_async(b"x" * 100) for ledger in ledgers])
        best = max(best, count / (time.perf_counter() - started))
    print(
        f"ledgers={count} open={open_s * 1e3:.0f}ms os_threads={threads} "
        f"descriptors={descriptors} best_round={best:,.0f} appends/s"
    )
    for ledger in ledgers:
        ledger.close()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
