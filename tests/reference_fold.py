"""The recovery fold in plain Python: the readable reference the Rust fold is checked against.

The coordinator recovers with the Rust fold (``rust/core/src/txnlog_fold.rs``);
this module restates its rules over the columns of a decoded log, and the tests
compare the two on random logs (they must agree, including on which logs are
corrupt). Rules (SPEC §4.3):

- only records of coordinator ``tc_id`` count; deleted records only bound the
  highest sequence;
- a transaction's UPDATE records apply in log order, each an allowed transition
  (OPEN -> COMMITTING|ABORTING|COMMITTED|ABORTED, COMMITTING -> COMMITTED,
  ABORTING -> ABORTED, the same status again is a no-op); anything else --
  both outcomes in one log, or going back -- is a ``CorruptEntryError``;
- a transaction whose NEW record is gone, or whose status is final, has ended:
  its remaining records are purged;
- timeout, start time and client name come from the NEW record; partitions and
  subscriptions are the union in first-seen order; ``last_modified`` is the
  largest of the start time and the other records' modification times.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from txnstream._native import TxnPosition
from txnstream.coordinator import TxnStatus
from txnstream.errors import CorruptEntryError
from txnstream.testing import InMemoryTransactionLog

OP_NEW, OP_ADD_PARTITION, OP_ADD_SUBSCRIPTION, OP_UPDATE = 0, 1, 2, 3

_ALLOWED = {
    0: {0, 1, 2, 3, 4},
    1: {1, 2},
    2: {2},
    3: {3, 4},
    4: {4},
}


@dataclass
class RecoveredTxn:
    """A live transaction rebuilt from the log."""

    seq: int
    status: TxnStatus
    timeout_ms: int
    start_time: int
    last_modified: int
    client_name: str | None
    partitions: list[str] = field(default_factory=list)
    subscriptions: list[tuple[str, str]] = field(default_factory=list)
    positions: list[TxnPosition] = field(default_factory=list)


@dataclass
class Recovered:
    """Result of folding a whole log."""

    txns: list[RecoveredTxn]
    purge: list[TxnPosition]
    max_seq: int
    records: int
    live_records: int
    foreign_records: int


def _strings(data: bytes, offsets: list[int], start: int, end: int) -> list[str]:
    return [data[offsets[i] : offsets[i + 1]].decode() for i in range(start, end)]


def fold(log: InMemoryTransactionLog, tc_id: int) -> Recovered:
    """Fold the live entries of ``log`` (in log order) into live transactions."""
    txns: dict[int, dict[str, Any]] = {}
    max_seq = -1
    records = foreign = 0
    for cols, ids, deleted in log.columns():
        c = cast("dict[str, Any]", cols)
        lists = {k: v.tolist() for k, v in c.items() if isinstance(v, np.ndarray)}
        for r in range(len(lists["metadata_op"])):
            records += 1
            most, seq = lists["txnid_most_bits"][r], lists["txnid_least_bits"][r]
            if most != tc_id:
                foreign += 0 if deleted[r] else 1
                continue
            max_seq = max(max_seq, seq, lists["max_local_txn_id"][r])
            if deleted[r]:
                continue
            pos = TxnPosition(
                0, ids[lists["entry_index"][r]], lists["batch_size"][r], lists["batch_index"][r]
            )
            t = txns.setdefault(
                seq,
                {"new": None, "status": 0, "parts": [], "subs": [], "positions": [], "modified": 0},
            )
            op = lists["metadata_op"][r]
            new_status = lists["new_status"][r]
            if op == OP_UPDATE and new_status >= 0:
                if new_status not in _ALLOWED[t["status"]]:
                    raise CorruptEntryError(
                        f"transaction ({tc_id},{seq}) goes from {t['status']} to {new_status}",
                        position=(0, pos.entry_id),
                    )
                t["status"] = new_status
            t["positions"].append(pos)
            if op == OP_NEW:
                name = _strings(c["client_name_data"], lists["client_name_offsets"], r, r + 1)[0]
                t["new"] = (lists["timeout_ms"][r], lists["start_time"][r], name or None)
                t["modified"] = max(t["modified"], lists["start_time"][r])
                continue
            if op == OP_ADD_PARTITION:
                po = lists["partition_offsets"]
                for p in _strings(
                    c["partitions_data"], lists["partitions_offsets"], po[r], po[r + 1]
                ):
                    if p not in t["parts"]:
                        t["parts"].append(p)
            elif op == OP_ADD_SUBSCRIPTION:
                so = lists["subscription_offsets"]
                topics = _strings(
                    c["subscription_topics_data"],
                    lists["subscription_topics_offsets"],
                    so[r],
                    so[r + 1],
                )
                names = _strings(
                    c["subscription_names_data"],
                    lists["subscription_names_offsets"],
                    so[r],
                    so[r + 1],
                )
                for sub in zip(topics, names, strict=True):
                    if sub not in t["subs"]:
                        t["subs"].append(sub)
            t["modified"] = max(t["modified"], lists["last_modification_time"][r])
    live: list[RecoveredTxn] = []
    purge: list[TxnPosition] = []
    live_records = 0
    for seq in sorted(txns):
        t = txns[seq]
        if t["new"] is None or t["status"] in (TxnStatus.COMMITTED, TxnStatus.ABORTED):
            purge.extend(t["positions"])
            continue
        timeout, start, client = t["new"]
        live_records += len(t["positions"])
        live.append(
            RecoveredTxn(
                seq,
                TxnStatus(t["status"]),
                timeout,
                start,
                t["modified"],
                client,
                t["parts"],
                t["subs"],
                t["positions"],
            )
        )
    return Recovered(live, purge, max_seq, records, live_records, foreign)
