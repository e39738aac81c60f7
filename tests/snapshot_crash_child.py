"""Child process: a broker writing transaction-buffer snapshots continuously, until killed.

Usage: python snapshot_crash_child.py DATA_DIR SEED

Sends, in and out of transactions, to 6 topics of 2 namespaces, committing,
aborting and leaving some transactions open, with snapshots due after every
3 changes and maintenance every 2 ms -- so the parent's SIGKILL lands during
snapshot writes. Prints "ready" once the first snapshots are durable.
"""

from __future__ import annotations

import random
import sys

from txnstream import Broker, BrokerConfig


def main() -> None:
    data_dir, seed = sys.argv[1], int(sys.argv[2])
    rng = random.Random(seed)
    cfg = BrokerConfig(
        tb_snapshot_max_changes=3,
        tb_snapshot_min_time_ms=1,
        pending_ack_trim_interval_ms=2,
        transaction_timeout_ms=600_000,
    )
    b = Broker.open(data_dir, cfg, registry=None)
    client = b.client(f"child-{seed}")
    topics = [f"public/ns{i % 2}/t{i}" for i in range(6)]
    producers = [client.producer(t, name=f"p{seed}-{i}") for i, t in enumerate(topics)]
    announced = False
    r = 0
    while True:
        r += 1
        if rng.random() < 0.3:
            rng.choice(producers).send(b"plain-%d" % r)
        else:
            txn = client.transaction(timeout_ms=600_000)
            for _ in range(rng.randrange(1, 3)):
                rng.choice(producers).send(b"t-%d" % r, txn=txn)
            roll = rng.random()
            if roll < 0.6:
                txn.commit()
            elif roll < 0.95:
                txn.abort()
        if not announced and b.snapshot_writer.stats()["records_written"] >= 6:
            print("ready", flush=True)
            announced = True


if __name__ == "__main__":
    main()
