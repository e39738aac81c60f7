"""Worker process of the Jepsen run on the real client (``tests/test_jepsen_real.py``).

Usage::

    python -m tests.jepsen.real_worker CONFIG_JSON

``CONFIG_JSON`` is a JSON object (see :class:`WorkerArgs`): the data directory, the
history directory, this process's generation, the input partitions, the knobs.

One broker holds a data directory's writer lock, so one process runs the whole
workload: it opens ``Broker.open(data)`` and runs one :class:`CtpWorker` thread per
input partition (its own client, consumer and history file ``p<N>-g<gen>.jsonl``;
the logical process ``p<N>g<gen>``, so a restarted generation is a new process and
a new consumer in the history). A ``kill -9`` of this process therefore crashes the
clients *and* the log together, which is the crash an embedded log must survive.

Before consuming, a generation waits (with a deadline) until the broker lists no
open transaction: its predecessor's transactions that were open at the kill time out
and abort (recovery finishes decided ones), which releases the pending acks they
held. Consuming earlier would skip those inputs and see them again later (the
``workload`` module's docstring). Then it writes ``ready-g<gen>`` into the history
directory.

Faults, besides the parent's ``kill -9``:

- ``fault_every_ms``: a thread arms an injected ``EIO``/``ENOSPC`` on a journal
  write or ``fsync`` (``txnstream.testing.inject_fault``; the hooks act on the whole
  data directory) at random intervals;
- ``stall_share``: a share of transactional sends first sleep past the transaction's
  timeout (a slow client), so the coordinator aborts it under the worker;
- the workload's own random aborts (``abort_share``).

``mode`` ``"run"`` loops until killed (or until ``run_deadline_ms``, a guard so a
process the parent lost never outlives the test); ``"drain"`` commits until every
partition's input is empty, closes the broker and exits 0. A worker thread that dies
of an unexpected error makes the process exit 3 with the traceback on stderr.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.jepsen.history import HistoryWriter
from tests.jepsen.workload import Client, CtpConfig, CtpWorker, Producer, drain
from txnstream import Broker, testing

INPUT_TOPIC = "jin"
OUTPUT_TOPICS = ("jout-a", "jout-b")
FAULT_KINDS = ("write", "sync")
FAULT_ERRNOS = (5, 28)  # EIO, ENOSPC


@dataclass(frozen=True)
class WorkerArgs:
    """What the parent passes to one generation."""

    data: str
    history_dir: str
    gen: int
    partitions: int
    seed: int
    mode: str = "run"
    txn_timeout_ms: int = 1_000
    abort_share: float = 0.15
    stall_share: float = 0.02
    fault_every_ms: int = 300
    predecessor_wait_ms: int = 60_000
    run_deadline_ms: int = 120_000

    @classmethod
    def from_json(cls, text: str) -> WorkerArgs:
        """Parse the command line's JSON object."""
        raw: dict[str, Any] = json.loads(text)
        return cls(**raw)


class _StallingProducer:
    """A producer whose transactional sends sometimes stall past the timeout."""

    def __init__(self, inner: Producer, rng: random.Random, share: float, stall_ms: int) -> None:
        self._inner = inner
        self._rng = rng
        self._share = share
        self._stall_ms = stall_ms

    def send(
        self,
        value: bytes,
        key: str | None = None,
        properties: Mapping[str, str] | None = None,
        txn: Any = None,
    ) -> Any:
        if txn is not None and self._rng.random() < self._share:
            time.sleep(self._stall_ms / 1000.0)
        return self._inner.send(value, key=key, properties=properties, txn=txn)


class _SlowClient:
    """The real client, with producers that stall now and then (a slow client)."""

    def __init__(self, inner: Any, rng: random.Random, share: float, stall_ms: int) -> None:
        self._inner = inner
        self._rng = rng
        self._share = share
        self._stall_ms = stall_ms

    def producer(self, topic: str) -> Producer:
        return _StallingProducer(
            self._inner.producer(topic), self._rng, self._share, self._stall_ms
        )

    def subscribe(self, topic: str, subscription: str, isolation: str = "read_committed") -> Any:
        return self._inner.subscribe(topic, subscription, isolation=isolation)

    def transaction(self, timeout_ms: int) -> Any:
        return self._inner.transaction(timeout_ms=timeout_ms)


def partition_topic(partition: int) -> str:
    """The name a worker subscribes to: one partition of the input topic."""
    return f"{INPUT_TOPIC}-partition-{partition}"


def _wait_no_open_transactions(broker: Broker, deadline_ms: int) -> None:
    end = time.monotonic() + deadline_ms / 1000.0
    while broker.admin.open_transactions():
        if time.monotonic() > end:
            raise TimeoutError(
                f"predecessor's transactions still open after {deadline_ms} ms: "
                f"{broker.admin.open_transactions()}"
            )
        time.sleep(0.02)


def _fault_loop(
    broker: Broker, args: WorkerArgs, rng: random.Random, stop: threading.Event
) -> None:
    """Arm one fault at a time; each is logged to ``faults-g<gen>.jsonl`` first."""
    ml = broker.topic(OUTPUT_TOPICS[0] + "-partition-0").ml
    log = HistoryWriter(Path(args.history_dir) / f"faults-g{args.gen}.jsonl")
    while not stop.wait(rng.uniform(0.5, 1.5) * args.fault_every_ms / 1000.0):
        kind, errno = rng.choice(FAULT_KINDS), rng.choice(FAULT_ERRNOS)
        log.event({"e": "fault", "kind": kind, "errno": errno})
        testing.inject_fault(ml, kind, errno=errno)
    log.close()


def main(argv: list[str]) -> int:
    """Run one generation (see the module docstring); the process's exit code."""
    args = WorkerArgs.from_json(argv[0])
    history_dir = Path(args.history_dir)
    started = time.monotonic()
    broker = Broker.open(args.data, registry=None)
    _wait_no_open_transactions(broker, args.predecessor_wait_ms)
    stop = threading.Event()
    errors: list[str] = []
    workers: list[CtpWorker] = []
    for p in range(args.partitions):
        rng = random.Random(args.seed * 1_000 + p)
        client: Client = broker.client(f"jepsen-p{p}")
        if args.mode == "run":
            client = _SlowClient(client, rng, args.stall_share, args.txn_timeout_ms + 200)
        cfg = CtpConfig(
            input_topic=INPUT_TOPIC,
            subscribe_topic=partition_topic(p),
            output_topics=OUTPUT_TOPICS,
            abort_share=args.abort_share if args.mode == "run" else 0.0,
            txn_timeout_ms=args.txn_timeout_ms if args.mode == "run" else 30_000,
        )
        history = HistoryWriter(history_dir / f"p{p}-g{args.gen}.jsonl")
        workers.append(CtpWorker(client, history, f"p{p}g{args.gen}", cfg, rng))

    def run(worker: CtpWorker) -> None:
        try:
            if args.mode == "drain":
                drain(worker, empty_rounds=3)
                return
            deadline = started + args.run_deadline_ms / 1000.0
            while not stop.is_set() and time.monotonic() < deadline:
                worker.step()
        except BaseException:
            errors.append(f"{worker.process}: {traceback.format_exc()}")
            stop.set()

    threads = [threading.Thread(target=run, args=(w,), name=w.process) for w in workers]
    faults: threading.Thread | None = None
    if args.mode == "run" and args.fault_every_ms > 0:
        faults = threading.Thread(
            target=_fault_loop,
            args=(broker, args, random.Random(args.seed), stop),
            name="faults",
            daemon=True,
        )
    (history_dir / f"ready-g{args.gen}").touch()
    for t in threads:
        t.start()
    if faults is not None:
        faults.start()
    for t in threads:
        t.join()
    stop.set()
    if errors:
        sys.stderr.write("\n".join(errors))
        sys.stderr.flush()
        os._exit(3)
    if faults is not None:
        faults.join()
    testing.clear_faults(broker.topic(OUTPUT_TOPICS[0] + "-partition-0").ml)
    broker.close()
    for w in workers:
        w.history.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
