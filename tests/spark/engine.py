"""Logs written by the real engine for the Spark tests, with violations planted on request.

A coordinator (``TransactionCoordinator``) runs real transactions; its
participants are pending-ack logs written here the way a pending-ack store
writes them: a ``PendingAckMetadataEntry`` ACK record (through a
``BufferedWriter`` over the subscription's ``ManagedLedger``) when a
transaction acks, and a COMMIT or ABORT record when the coordinator ends it.
A :class:`Plant` makes a participant misbehave in one precise way, so the
audit has something to find.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txnstream import BufferedWriter, ManagedLedger, TransactionCoordinator, TxnPosition
from txnstream.coordinator import TxnID
from txnstream.proto import pending_ack_pb2 as pb
from txnstream.spark.log_source import pending_ack_log_name

#: A message a transaction acks: (ledger_id, entry_id, batch_size, batch_index).
Msg = tuple[int, int, int, int]


@dataclass
class Plant:
    """Ways to make participants break the protocol."""

    #: Transactions whose pending-ack COMMIT record is not written (but the end succeeds).
    skip_commit: set[TxnID] = field(default_factory=set)
    #: Transactions whose abort writes a COMMIT record (acks of an aborted txn applied).
    commit_on_abort: set[TxnID] = field(default_factory=set)


class PendingAckLog:
    """A subscription's pending-ack log, written through a BufferedWriter."""

    def __init__(self, directory: Path, topic: str, subscription: str, plant: Plant) -> None:
        self.name = pending_ack_log_name(topic, subscription)
        self.ml = ManagedLedger.open(directory, self.name)
        self.writer = BufferedWriter(self.ml, max_records=64, max_delay_ms=1)
        self.plant = plant

    def ack(self, txn: TxnID, msgs: Iterable[Msg], cumulative: bool = False) -> TxnPosition:
        rec = pb.PendingAckMetadataEntry(
            pending_ack_op=pb.ACK,
            ack_type=pb.Cumulative if cumulative else pb.Individual,
            txnid_most_bits=txn.most_bits,
            txnid_least_bits=txn.least_bits,
        )
        for ledger_id, entry_id, size, index in msgs:
            m = rec.pending_ack_metadata.add(ledgerId=ledger_id, entryId=entry_id)
            if size > 1:
                m.batch_size = size
                words = [0] * ((size + 63) // 64)
                for i in range(size):
                    if i != index:
                        words[i // 64] |= 1 << (i % 64)
                while words and words[-1] == 0:
                    words.pop()
                m.ack_set.extend(w - (1 << 64) if w >= 1 << 63 else w for w in words)
        return self.writer.write(rec.SerializeToString()).result(timeout=10)

    def end(self, txn_id: TxnID, commit: bool) -> Future[None] | None:
        if commit and txn_id in self.plant.skip_commit:
            return None
        if not commit and txn_id in self.plant.commit_on_abort:
            commit = True
        rec = pb.PendingAckMetadataEntry(
            pending_ack_op=pb.COMMIT if commit else pb.ABORT,
            txnid_most_bits=txn_id.most_bits,
            txnid_least_bits=txn_id.least_bits,
        )
        done: Future[None] = Future()
        fut = self.writer.write(rec.SerializeToString())
        fut.add_done_callback(
            lambda f: done.set_exception(e) if (e := f.exception()) else done.set_result(None)
        )
        return done

    def close(self) -> None:
        self.writer.close()
        self.ml.close()


class _NoBuffer:
    def end(self, txn_id: TxnID, commit: bool) -> None:
        return None


class Participants:
    """Resolver handing the coordinator pending-ack logs (topics: nothing to end yet)."""

    def __init__(self, directory: Path, plant: Plant | None = None) -> None:
        self.directory = directory
        self.plant = plant or Plant()
        self.logs: dict[tuple[str, str], PendingAckLog] = {}
        self._lock = threading.Lock()

    def partition(self, name: str) -> _NoBuffer:
        return _NoBuffer()

    def subscription(self, topic: str, subscription: str) -> PendingAckLog:
        with self._lock:
            key = (topic, subscription)
            if key not in self.logs:
                self.logs[key] = PendingAckLog(self.directory, topic, subscription, self.plant)
            return self.logs[key]

    def close(self) -> None:
        for log in self.logs.values():
            log.close()


def open_coordinator(
    directory: Path, participants: Participants, tc_id: int = 0, **settings: Any
) -> TransactionCoordinator:
    """A coordinator on ``directory`` whose subscriptions are ``participants``' logs."""
    return TransactionCoordinator.open(
        directory, tc_id, participants=participants, registry=None, **settings
    )


def workload(
    tc: TransactionCoordinator, parts: Participants, txns: int, *, first_msg: int = 0
) -> dict[TxnID, str]:
    """Run ``txns`` transactions in rounds of 8 concurrent ones; return their outcomes.

    Each produces to ``out``, acks one record of a batched input message in
    ``(in, sub)`` and commits, except every 5th aborts and every 7th is left
    open. Half-way, the coordinator log switches batching off, so the log
    mixes batched and unbatched entries.
    """
    outcome: dict[TxnID, str] = {}
    pending = parts.subscription("in", "sub")
    k = first_msg
    for start in range(0, txns, 8):
        if start >= txns // 2:
            tc.set_batch_enabled(False)
        ids = tc.new_transactions(min(8, txns - start), timeout_ms=600_000, client_name="etl")
        tc.add_produced_partitions_many([(t, ["out"]) for t in ids])
        tc.add_acked_subscriptions_many([(t, [("in", "sub")]) for t in ids])
        ends: list[tuple[TxnID, str]] = []
        for t in ids:
            pending.ack(t, [(7, k // 4, 4, k % 4)])
            k += 1
            n = t.least_bits
            if n % 7 == 6:
                outcome[t] = "OPEN"
                continue
            outcome[t] = "ABORTED" if n % 5 == 4 else "COMMITTED"
            ends.append((t, "abort" if n % 5 == 4 else "commit"))
        tc.end_transactions(ends)
    tc.set_batch_enabled(True)
    return outcome
