"""Pending acks (SPEC §4.7): transactional acknowledgements of one subscription.

:class:`PendingAckStore` holds messages acknowledged by open transactions,
enforces the conflict table, logs every change through its own PIP-160
BufferedWriter (``PendingAckMetadataEntry``; metrics prefix
``txnstream_txn_pending_ack_store``), and applies (commit) or releases
(abort) the acks when the transaction ends. :class:`CursorAcks` applies
acks to a subscription's cursor.
"""

from __future__ import annotations

from txnstream.pendingack.cursor_acks import CursorAcks
from txnstream.pendingack.store import LOG_CURSOR, EndHook, PendingAckStore, encode_ack, encode_end

__all__ = ["LOG_CURSOR", "CursorAcks", "EndHook", "PendingAckStore", "encode_ack", "encode_end"]
