"""Child process for the ledger kill -9 test: appends under load until killed.

Usage: python ledger_crash_child.py DATA_DIR NAME ROUND

Three appenders share one managed ledger: the main thread keeps a window of
``append_async`` futures in flight (with an occasional ``append_many``), two
threads call ``append`` in a loop. Every acknowledged append is reported on
stdout as ``ROUND SEQ LEDGER ENTRY``, written only after its position came
back, i.e. after the entry was durable. The parent kills this process with
SIGKILL at a random moment and checks every reported position.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
from concurrent.futures import Future

from txnstream import ManagedLedger, Position

MAX_ENTRIES = 300
WINDOW = 64


def payload(rnd: int, seq: int) -> bytes:
    """Deterministic bytes of one append; sizes 0..~4 KiB."""
    size = (seq * 2654435761 + rnd * 40503) % 4100
    if seq % 11 == 0:
        size = 0
    seed = f"{rnd}:{seq}:".encode()
    return (seed * (size // len(seed) + 1))[:size]


def report(lines: list[str]) -> None:
    if lines:
        os.write(1, "".join(lines).encode())


def sync_appender(ml: ManagedLedger, rnd: int, base: int) -> None:
    seq = base
    while True:
        p = ml.append(payload(rnd, seq))
        report([f"{rnd} {seq} {p.ledger_id} {p.entry_id}\n"])
        seq += 1


def main() -> None:
    data, name, rnd = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ml = ManagedLedger.open(
        data, name, max_entries_per_ledger=MAX_ENTRIES, preallocate_bytes=1 << 20
    )
    for t in (1, 2):
        threading.Thread(target=sync_appender, args=(ml, rnd, t * 10**9), daemon=True).start()
    inflight: collections.deque[tuple[int, Future[Position]]] = collections.deque()
    seq = 0
    while True:
        if seq % 97 == 0:
            seqs = list(range(seq, seq + 5))
            ps = ml.append_many([payload(rnd, s) for s in seqs])
            pairs = zip(seqs, ps, strict=True)
            report([f"{rnd} {s} {p.ledger_id} {p.entry_id}\n" for s, p in pairs])
            seq += 5
        inflight.append((seq, ml.append_async(payload(rnd, seq))))
        seq += 1
        if len(inflight) >= WINDOW:
            lines = []
            while inflight and (len(inflight) >= WINDOW // 2 or inflight[0][1].done()):
                s, fut = inflight.popleft()
                p = fut.result()
                lines.append(f"{rnd} {s} {p.ledger_id} {p.entry_id}\n")
            report(lines)


if __name__ == "__main__":
    main()
