"""The consume-transform-produce workload of the main job, run as a child process.

``python -m txnstream.workload --data DIR`` opens the broker on ``DIR`` and
runs one thread per partition of the input topic :data:`INPUT`. Each thread
repeatedly, in one transaction through the client API:

1. receives 1-3 input messages from its partition (subscription :data:`SUBSCRIPTION`,
   READ_COMMITTED);
2. sends one output per input to each of :data:`OUTPUTS`, keyed by the input
   and carrying its id in the ``source`` property;
3. acknowledges the inputs in the transaction;
4. commits; or, at random, aborts (an exception inside the ``with`` block) or
   abandons the transaction, which then times out (``--timeout-ms``) and is
   aborted by its coordinator: its acks are released and the inputs delivered again.

After each end it prints one JSON line: ``{"c": n}`` (n inputs committed),
``{"a": n}`` (aborted) or ``{"s": n}`` (abandoned), and ``{"w": k}`` with the
durable waits of each commit. A parent that kills this process with SIGKILL
knows which outcomes were acknowledged. The process exits on its own once
no input has arrived for ``--idle-ms`` and no transaction of its own is open.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time

from txnstream.broker import Broker
from txnstream.client import Client, Transaction
from txnstream.config import BatchedWriteConfig, BrokerConfig

#: Input topic (partitioned) and output topics of the workload.
INPUT = "public/default/demo-in"
OUTPUTS = ("public/default/demo-out-a", "public/default/demo-out-b")
SUBSCRIPTION = "etl"


class _PlannedAbortError(Exception):
    """Raised inside a transaction to abort it (the context manager aborts)."""


def broker_config(timeout_ms: int = 1_500) -> BrokerConfig:
    """Return the main job's broker settings.

    Short timeouts, batched logs (PIP-160), and transaction-buffer snapshots
    every second (Pulsar's default is 5 s) so the run killed part-way has
    snapshots to recover from.
    """
    return BrokerConfig(
        coordinators=2,
        transaction_timeout_ms=timeout_ms,
        transaction_log_batched_write=BatchedWriteConfig(enabled=True),
        pending_ack_batched_write=BatchedWriteConfig(enabled=True),
        tb_snapshot_min_time_ms=1_000,
    )


def _emit(lock: threading.Lock, msg: dict[str, int]) -> None:
    with lock:
        sys.stdout.write(json.dumps(msg) + "\n")
        sys.stdout.flush()


def run_partition(
    client: Client,
    partition: int,
    rng: random.Random,
    *,
    abort_rate: float,
    abandon_rate: float,
    timeout_ms: int,
    idle_ms: int,
    out_lock: threading.Lock,
) -> None:
    """Consume-transform-produce on one input partition until idle."""
    consumer = client.subscribe(f"{INPUT}-partition-{partition}", SUBSCRIPTION)
    producers = [client.producer(t) for t in OUTPUTS]
    abandoned: list[tuple[Transaction, float]] = []
    idle_since = time.monotonic()
    while True:
        msgs = consumer.receive_many(rng.randint(1, 3), timeout_ms=100)
        now = time.monotonic()
        abandoned = [(t, at) for t, at in abandoned if now - at < 3 * timeout_ms / 1000]
        if not msgs:
            if (now - idle_since) * 1000 >= idle_ms and not abandoned:
                return
            continue
        idle_since = now
        r = rng.random()
        if r < abandon_rate:
            txn = client.transaction(timeout_ms=timeout_ms)
            for m in msgs:
                for p in producers:
                    p.send(m.value.upper(), key=m.key, properties={"source": m.key or ""}, txn=txn)
                consumer.ack(m, txn=txn)
            abandoned.append((txn, now))  # never ended: its coordinator times it out
            _emit(out_lock, {"s": len(msgs)})
            continue
        try:
            with client.transaction(timeout_ms=timeout_ms) as txn:
                for m in msgs:
                    for p in producers:
                        p.send(
                            m.value.upper(), key=m.key, properties={"source": m.key or ""}, txn=txn
                        )
                    consumer.ack(m, txn=txn)
                if r < abandon_rate + abort_rate:
                    raise _PlannedAbortError
        except _PlannedAbortError:
            _emit(out_lock, {"a": len(msgs)})
            continue
        _emit(out_lock, {"c": len(msgs), "w": txn.durable_waits})


def main(argv: list[str] | None = None) -> int:
    """Run the workload on every input partition; return 0 when all went idle."""
    ap = argparse.ArgumentParser(prog="python -m txnstream.workload")
    ap.add_argument("--data", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--abort-rate", type=float, default=0.08)
    ap.add_argument("--abandon-rate", type=float, default=0.02)
    ap.add_argument("--timeout-ms", type=int, default=1_500)
    ap.add_argument("--idle-ms", type=int, default=2_000)
    args = ap.parse_args(argv)
    out_lock = threading.Lock()
    errors: list[BaseException] = []
    with Broker.open(args.data, broker_config(args.timeout_ms)) as broker:
        client = broker.client("demo-workload")
        partitions = broker.partitions(INPUT)

        def work(i: int) -> None:
            try:
                run_partition(
                    client,
                    i,
                    random.Random(args.seed * 1000 + i),
                    abort_rate=args.abort_rate,
                    abandon_rate=args.abandon_rate,
                    timeout_ms=args.timeout_ms,
                    idle_ms=args.idle_ms,
                    out_lock=out_lock,
                )
            except BaseException as e:  # reported below; the parent sees the exit status
                errors.append(e)

        threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(partitions)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for e in errors:
        print(f"workload error: {type(e).__name__}: {e}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
