"""Transaction buffers (SPEC §4.5): one per topic partition, the marker approach.

:class:`TransactionBuffer` keeps a partition's ongoing and aborted
transactions and its READ_COMMITTED read limit (``max_read_position``),
writes COMMIT/ABORT markers when the coordinator ends a transaction, and
reconciles leftovers with the coordinator at recovery.
"""

from __future__ import annotations

from txnstream.buffer.transaction_buffer import (
    TXN_ABORT,
    TXN_COMMIT,
    TransactionBuffer,
    TxnOutcomes,
    after,
    resolve_outcome,
    snapshot_covers,
)

__all__ = [
    "TXN_ABORT",
    "TXN_COMMIT",
    "TransactionBuffer",
    "TxnOutcomes",
    "after",
    "resolve_outcome",
    "snapshot_covers",
]
