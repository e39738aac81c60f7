"""Recovery fold in Python: transaction-log records -> live transactions.

The coordinator recovers with the Rust fold (:mod:`.recovery`,
``rust/core/src/txnlog_fold.rs``); this module is its readable reference
(tests compare the two on random logs) and serves tools that already hold
:class:`LogChunk` columns.

The log is decoded in Rust into columns (``frame.decode_txn_log_columns``);
everything per *record* here is numpy (final status per transaction, which
records to purge, the highest sequence seen). Python objects are built only
for records of transactions that are still live -- usually a small part of
the log -- and for the positions to delete.

Rules (SPEC §4.3): a transaction's status is that of its last UPDATE record
(OPEN if none). A transaction whose NEW record is gone, or whose status is
COMMITTED/ABORTED, has ended: its remaining records are purged (a crash hit
between logging the final status and deleting the records). Records already
deleted (by batch index) are skipped but still count for the sequence mark.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from txnstream._native import TxnPosition
from txnstream.coordinator.status import TxnStatus
from txnstream.frame import TxnLogColumns

OP_NEW, OP_ADD_PARTITION, OP_ADD_SUBSCRIPTION, OP_UPDATE = 0, 1, 2, 3


@dataclass
class LogChunk:
    """Decoded records of consecutive log entries.

    ``columns`` is a ``decode_txn_log_columns`` result over the entries;
    ``ledger_id``/``entry_id`` give each entry's position; ``deleted`` marks
    records (one per row of ``columns``) already deleted, or is None.
    """

    columns: TxnLogColumns
    ledger_id: npt.NDArray[np.uint64]
    entry_id: npt.NDArray[np.uint64]
    deleted: npt.NDArray[np.bool_] | None = None

    def __len__(self) -> int:
        """Return the number of records."""
        return len(self._arr("txnid_least_bits"))

    def _arr(self, name: str) -> npt.NDArray[np.generic]:
        value = cast("dict[str, Any]", self.columns)[name]
        assert isinstance(value, np.ndarray)
        return value


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


def fold(chunks: Iterable[LogChunk], tc_id: int) -> Recovered:
    """Fold the log chunks (in log order) into live transactions."""
    chunk_list = [c for c in chunks if len(c)]
    if not chunk_list:
        return Recovered([], [], -1, 0, 0, 0)

    def cat(name: str) -> npt.NDArray[np.generic]:
        return np.concatenate([c._arr(name) for c in chunk_list])

    op = cat("metadata_op").astype(np.int8)
    least = cat("txnid_least_bits").astype(np.uint64)
    most = cat("txnid_most_bits").astype(np.uint64)
    new_status = cat("new_status").astype(np.int8)
    max_ids = cat("max_local_txn_id").astype(np.uint64)
    sizes = [len(c) for c in chunk_list]
    chunk_of = np.repeat(np.arange(len(chunk_list), dtype=np.int32), sizes)
    row_of = np.concatenate([np.arange(n, dtype=np.int64) for n in sizes])
    deleted = np.concatenate(
        [c.deleted if c.deleted is not None else np.zeros(len(c), np.bool_) for c in chunk_list]
    )
    total = len(op)
    mine = most == np.uint64(tc_id)
    # Deleted records were durable once: they still bound the sequence.
    max_seq = (
        int(max(max_ids[mine].max(initial=0), least[mine].max(initial=0))) if mine.any() else -1
    )
    keep = mine & ~deleted
    foreign = int(np.count_nonzero(~mine & ~deleted))
    idx = np.nonzero(keep)[0]
    if len(idx) == 0:
        return Recovered([], [], max_seq, total, 0, foreign)

    k_least = least[idx]
    uniq, inv = np.unique(k_least, return_inverse=True)
    k_op = op[idx]
    status = np.full(len(uniq), -1, np.int8)
    upd = k_op == OP_UPDATE
    # The two branches never mix, so the largest status reached is the last one.
    np.maximum.at(status, inv[upd], new_status[idx][upd])
    status[status < 0] = TxnStatus.OPEN
    has_new = np.zeros(len(uniq), np.bool_)
    has_new[inv[k_op == OP_NEW]] = True
    final = (status == TxnStatus.COMMITTED) | (status == TxnStatus.ABORTED)
    live_txn = has_new & ~final
    live_row = live_txn[inv]

    # Positions per record: entry position from the chunk, batch fields from the decode.
    def positions(rows: npt.NDArray[np.int64]) -> list[TxnPosition]:
        out: list[TxnPosition] = []
        for ci, chunk in enumerate(chunk_list):
            sel = rows[chunk_of[rows] == ci]
            if len(sel) == 0:
                continue
            r = row_of[sel]
            ent = chunk._arr("entry_index")[r].astype(np.int64)
            led = chunk.ledger_id[ent].tolist()
            eid = chunk.entry_id[ent].tolist()
            bs = chunk._arr("batch_size")[r].tolist()
            bi = chunk._arr("batch_index")[r].tolist()
            out.extend(map(TxnPosition, led, eid, bs, bi))
        return out

    purge_rows = idx[~live_row]
    purge = positions(purge_rows)

    live_rows = idx[live_row]
    order = np.argsort(inv[live_row], kind="stable")
    live_rows = live_rows[order]
    live_pos = positions(np.sort(live_rows))
    # positions() returns rows in (chunk, row) order == log order; map back.
    pos_by_row = dict(zip(np.sort(live_rows).tolist(), live_pos, strict=True))

    cache: dict[int, dict[str, list[int]]] = {}
    lists = (
        "timeout_ms",
        "start_time",
        "last_modification_time",
        "client_name_offsets",
        "partition_offsets",
        "partitions_offsets",
        "subscription_offsets",
        "subscription_topics_offsets",
        "subscription_names_offsets",
    )

    def col(ci: int) -> dict[str, list[int]]:
        got = cache.get(ci)
        if got is None:
            got = cache[ci] = {n: chunk_list[ci]._arr(n).tolist() for n in lists}
        return got

    def data(ci: int, name: str) -> bytes:
        value = cast("dict[str, Any]", chunk_list[ci].columns)[f"{name}_data"]
        assert isinstance(value, bytes)
        return value

    txns: list[RecoveredTxn] = []
    cur: RecoveredTxn | None = None
    st_list = status.tolist()
    for g, rec_row in zip(inv[live_row][order].tolist(), live_rows.tolist(), strict=True):
        seq = int(uniq[g])
        if cur is None or cur.seq != seq:
            cur = RecoveredTxn(seq, TxnStatus(st_list[g]), 0, 0, 0, None)
            txns.append(cur)
        ci = int(chunk_of[rec_row])
        r = int(row_of[rec_row])
        c = col(ci)
        kind = int(op[rec_row])
        cur.positions.append(pos_by_row[rec_row])
        if kind == OP_NEW:
            cur.timeout_ms = c["timeout_ms"][r]
            cur.start_time = c["start_time"][r]
            cur.last_modified = max(cur.last_modified, cur.start_time)
            name = _strings(data(ci, "client_name"), c["client_name_offsets"], r, r + 1)[0]
            cur.client_name = name or None
        elif kind == OP_ADD_PARTITION:
            po = c["partition_offsets"]
            for p in _strings(data(ci, "partitions"), c["partitions_offsets"], po[r], po[r + 1]):
                if p not in cur.partitions:
                    cur.partitions.append(p)
        elif kind == OP_ADD_SUBSCRIPTION:
            so = c["subscription_offsets"]
            topics = _strings(
                data(ci, "subscription_topics"), c["subscription_topics_offsets"], so[r], so[r + 1]
            )
            names = _strings(
                data(ci, "subscription_names"), c["subscription_names_offsets"], so[r], so[r + 1]
            )
            for sub in zip(topics, names, strict=True):
                if sub not in cur.subscriptions:
                    cur.subscriptions.append(sub)
        if kind != OP_NEW:
            cur.last_modified = max(cur.last_modified, c["last_modification_time"][r])
    txns.sort(key=lambda t: t.seq)
    return Recovered(txns, purge, max_seq, total, len(live_rows), foreign)


__all__ = ["LogChunk", "Recovered", "RecoveredTxn", "fold"]
