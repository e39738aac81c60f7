"""Many threads, random commits, aborts and timeouts; invariants checked at the end."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections import Counter
from pathlib import Path

from txnstream import Broker
from txnstream.client import Client, Message
from txnstream.errors import TransactionAlreadyAborted, TransactionTimedOut, TxnStreamError

INPUTS = 300
THREADS = 8
DEADLINE_S = 120.0


def drain(client: Client, topic: str, sub: str, isolation: str = "read_committed") -> list[Message]:
    c = client.subscribe(topic, sub, isolation)
    out = []
    while (m := c.receive(200)) is not None:
        out.append(m)
        c.ack(m)
    c.close()
    return out


def test_threads_random_commit_abort_timeout_invariants(tmp_path: Path) -> None:
    with Broker.open(tmp_path, registry=None) as broker:
        broker.admin.create_topic("out", 2)
        client = broker.client("workers")
        seed = client.producer("in")
        seed.send_many([b"%d" % i for i in range(0, 100)])
        for i in range(100, INPUTS):
            seed.send(b"%d" % i)
        committed: Counter[bytes] = Counter()
        aborted_outputs: list[bytes] = []
        errors: list[BaseException] = []
        lock = threading.Lock()
        deadline = time.monotonic() + DEADLINE_S

        def worker(n: int) -> None:
            rng = random.Random(n)
            consumer = client.subscribe("in", "ctp")
            out = client.producer("out")
            idle = 0
            while idle < 3 and time.monotonic() < deadline:
                short = rng.random() < 0.1
                txn = client.transaction(timeout_ms=40 if short else 30_000)
                tag = b"%d-%d" % (n, txn.txn_id.least_bits)
                sent: list[bytes] = []
                try:
                    for _ in range(rng.randint(1, 3)):
                        msg = consumer.receive(50)
                        if msg is None:
                            break
                        v = msg.value + b"|" + tag
                        out.send(v, key=msg.value.decode(), txn=txn)
                        sent.append(v)
                        consumer.ack(msg, txn=txn)
                    if not sent:
                        idle += 1
                        txn.abort()
                        consumer.redeliver_unacknowledged()
                        continue
                    idle = 0
                    if short:
                        time.sleep(0.08)  # past its timeout: the coordinator aborts it
                    if rng.random() < 0.2:
                        txn.abort()
                        with lock:
                            aborted_outputs.extend(sent)
                    else:
                        txn.commit()
                        with lock:
                            committed.update(v.split(b"|")[0] for v in sent)
                except (TransactionAlreadyAborted, TransactionTimedOut):
                    with lock:
                        aborted_outputs.extend(sent)
                except TxnStreamError as exc:
                    if not exc.abortable:
                        with lock:
                            errors.append(exc)
                        return
                    with contextlib.suppress(TxnStreamError):
                        txn.abort()
                    with lock:
                        aborted_outputs.extend(sent)
                consumer.redeliver_unacknowledged()
            consumer.close()

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(DEADLINE_S + 30)
            assert not t.is_alive(), "a worker hung"
        assert errors == []

        # Every transaction ended (timeouts included); no partition is pinned.
        end = time.monotonic() + 30
        while broker.admin.open_transactions():
            assert time.monotonic() < end, broker.admin.open_transactions()
            time.sleep(0.02)
        assert set(broker.admin.read_committed_lag("out").values()) == {0}

        outputs = drain(client, "out", "check")
        values = [m.value for m in outputs]
        inputs_seen = Counter(v.split(b"|")[0] for v in values)
        # Exactly once: every input reflected once in the committed output.
        assert inputs_seen == Counter({b"%d" % i: 1 for i in range(INPUTS)})
        # What commit() confirmed is there; nothing of an aborted transaction is.
        assert committed == inputs_seen
        assert not set(aborted_outputs) & set(values)
        # Per partition, committed messages come in log order (ids ascending).
        for part in (0, 1):
            ids = [m.message_id for m in outputs if m.message_id.partition == part]
            assert ids == sorted(ids)
        # Read-uncommitted readers also saw the aborted ones (never markers).
        ru = [m.value for m in drain(client, "out", "ru", "read_uncommitted")]
        assert set(values) <= set(ru)
        assert all(b"|" in v for v in ru)
        # The input subscription is fully acknowledged.
        assert drain(client, "in", "ctp") == []
