"""What the Python API says a log holds, row for row as ``txnstream-log`` shows it.

An independent oracle for the data source: entries come from
``ManagedLedger.read_range``, records from ``frame.decode_entry`` and the
generated protobuf classes (not the Rust columnar decoders), deleted flags
from the ``Cursor`` API.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from txnstream import ManagedLedger, frame
from txnstream.proto import pending_ack_pb2, txn_log_pb2

Row = dict[str, Any]

_OPS = txn_log_pb2.TransactionMetadataEntry.TransactionMetadataOp


def _txn_fields(rec: bytes) -> Row:
    m = txn_log_pb2.TransactionMetadataEntry.FromString(rec)

    def enum(name: str, wrapper: Any) -> str | None:
        return wrapper.Name(getattr(m, name)) if m.HasField(name) else None

    return {
        "metadata_op": enum("metadata_op", _OPS),
        "txnid_most_bits": m.txnid_most_bits,
        "txnid_least_bits": m.txnid_least_bits,
        "expected_status": enum("expected_status", txn_log_pb2.TxnStatus),
        "new_status": enum("new_status", txn_log_pb2.TxnStatus),
        "partitions": list(m.partitions),
        "subscriptions": [
            {"topic": s.topic, "subscription": s.subscription} for s in m.subscriptions
        ],
        "timeout_ms": m.timeout_ms,
        "start_time": m.start_time,
        "last_modification_time": m.last_modification_time,
        "max_local_txn_id": m.max_local_txn_id,
        "owner": m.owner or None,
        "client_name": m.client_name or None,
        "timed_out": m.timed_out,
        "error": None,
    }


def _ack_fields(rec: bytes) -> Row:
    m = pending_ack_pb2.PendingAckMetadataEntry.FromString(rec)
    return {
        "op": pending_ack_pb2.PendingAckOp.Name(m.pending_ack_op)
        if m.HasField("pending_ack_op")
        else None,
        "ack_type": pending_ack_pb2.AckType.Name(m.ack_type) if m.HasField("ack_type") else None,
        "txnid_most_bits": m.txnid_most_bits,
        "txnid_least_bits": m.txnid_least_bits,
        "positions": [
            {
                "ledger_id": p.ledgerId,
                "entry_id": p.entryId,
                "batch_size": p.batch_size if p.HasField("batch_size") else None,
                "ack_set": list(p.ack_set),
            }
            for p in m.pending_ack_metadata
        ],
        "error": None,
    }


def python_rows(directory: Path, log: str, kind: str) -> list[Row]:
    """Every stored record of ``log`` with its position and deleted flag (all cursors)."""
    ml = ManagedLedger.open(directory, log, read_only=True)
    try:
        cursors = [ml.open_cursor(n) for n in ml.cursor_names()]
        first, last = ml.first_position, ml.last_position
        if first is None or last is None:
            return []
        rows: list[Row] = []
        for pos, entry in ml.read_range(first, last):
            records = frame.decode_entry(entry)
            for i, rec in enumerate(records):
                deleted = bool(cursors) and all(
                    c.is_deleted(pos) or ((s := c.batch_ack_set(pos)) is not None and not s.get(i))
                    for c in cursors
                )
                fields = _txn_fields(rec) if kind == "txn" else _ack_fields(rec)
                rows.append(
                    {
                        "log": log,
                        "ledger_id": pos.ledger_id,
                        "entry_id": pos.entry_id,
                        "batch_size": len(records),
                        "batch_index": i,
                        "entry_size": len(entry),
                        "batched": frame.is_batched(entry),
                        "deleted": deleted,
                        **fields,
                    }
                )
        return rows
    finally:
        ml.close()


def spark_rows(df: Any) -> list[Row]:
    """Rows of a DataFrame as plain dicts, in log order."""
    rows = [r.asDict(recursive=True) for r in df.collect()]
    return sorted(
        rows, key=lambda r: (r["log"], r["ledger_id"], r["entry_id"], r["batch_index"] or 0)
    )
