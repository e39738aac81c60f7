"""Child process for the many-ledger kill -9 test: appends to many managed
ledgers of one data directory at once until killed.

Usage: python storage_crash_child.py DATA_DIR LEDGERS ROUND

The main thread keeps a window of ``append_async`` futures in flight spread
over every ledger; a second thread appends in groups (``append_many``) to
random ledgers; a third moves a cursor on ledger 0 (so trims happen). Every
acknowledged append is reported on stdout as ``ROUND LEDGER SEQ LID EID``,
written only after its position came back, i.e. after it was durable.
"""

from __future__ import annotations

import collections
import os
import random
import sys
import threading
from concurrent.futures import Future

from txnstream import ManagedLedger, Position

WINDOW = 256


def payload(rnd: int, k: int, seq: int) -> bytes:
    """Deterministic bytes of one append; sizes 0..~2 KiB."""
    size = (seq * 2654435761 + rnd * 40503 + k * 97) % 2100
    seed = f"{rnd}:{k}:{seq}:".encode()
    return (seed * (size // len(seed) + 1))[:size]


def report(lines: list[str]) -> None:
    if lines:
        os.write(1, "".join(lines).encode())


def main() -> None:
    data, n, rnd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    mls = [ManagedLedger.open(data, f"crash/t{k}", max_entries_per_ledger=200) for k in range(n)]
    seqs = [10**9 * (1 + rnd % 3)] * n  # per-ledger sequence numbers, disjoint per thread
    lock = threading.Lock()

    def next_seq(k: int) -> int:
        with lock:
            seqs[k] += 1
            return seqs[k]

    def grouper() -> None:
        r = random.Random(rnd)
        while True:
            k = r.randrange(n)
            batch = [next_seq(k) for _ in range(r.randint(1, 6))]
            ps = mls[k].append_many([payload(rnd, k, s) for s in batch])
            report(
                [
                    f"{rnd} {k} {s} {p.ledger_id} {p.entry_id}\n"
                    for s, p in zip(batch, ps, strict=True)
                ]
            )

    def trimmer() -> None:
        cur = mls[0].open_cursor("c")
        while True:
            got = cur.read_next(50)
            if got:
                cur.mark_delete(got[-1][0])

    threading.Thread(target=grouper, daemon=True).start()
    threading.Thread(target=trimmer, daemon=True).start()
    inflight: collections.deque[tuple[int, int, Future[Position]]] = collections.deque()
    r = random.Random(rnd + 1000)
    while True:
        k = r.randrange(n)
        s = next_seq(k)
        inflight.append((k, s, mls[k].append_async(payload(rnd, k, s))))
        if len(inflight) >= WINDOW:
            lines = []
            while inflight and (len(inflight) >= WINDOW // 2 or inflight[0][2].done()):
                kk, ss, fut = inflight.popleft()
                p = fut.result()
                lines.append(f"{rnd} {kk} {ss} {p.ledger_id} {p.entry_id}\n")
            report(lines)


if __name__ == "__main__":
    main()
