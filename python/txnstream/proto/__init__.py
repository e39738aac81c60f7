"""Generated protobuf classes for every txnstream storage format.

Generated from ``proto/*.proto`` by ``scripts/gen_proto.py`` (do not edit the
``*_pb2`` modules by hand; ``tests/test_proto.py`` fails when they are stale).
Field numbers are the compatibility contract (SPEC §3.2).
"""

from txnstream.proto.ledger_pb2 import (
    BatchDeletion,
    Catalog,
    CompactedRecord,
    CursorState,
    DeletedRange,
    LedgerInfo,
    ManagedLedgerState,
)
from txnstream.proto.pending_ack_pb2 import (
    ABORT,
    ACK,
    COMMIT,
    AckType,
    BatchedPendingAckMetadataEntry,
    Cumulative,
    Individual,
    PendingAckMetadata,
    PendingAckMetadataEntry,
    PendingAckOp,
)
from txnstream.proto.pulsar_api_pb2 import (
    TXN_ABORT,
    TXN_COMMIT,
    TXN_COMMITTING,
    CompressionType,
    KeyValue,
    MarkerType,
    MessageMetadata,
    SingleMessageMetadata,
)
from txnstream.proto.remote_log_pb2 import RemoteLogSegmentMetadata
from txnstream.proto.tb_snapshot_pb2 import (
    AbortTxnMetadata,
    ProducerSequence,
    TransactionBufferSnapshot,
    TxnRef,
)
from txnstream.proto.terminated_pb2 import TerminatedTxn, TerminatedTxnState
from txnstream.proto.txn_log_pb2 import (
    ABORTED,
    ABORTING,
    COMMITTED,
    COMMITTING,
    OPEN,
    BatchedTransactionMetadataEntry,
    Subscription,
    TransactionMetadataEntry,
    TxnStatus,
)

__all__ = [
    "ABORT",
    "ABORTED",
    "ABORTING",
    "ACK",
    "COMMIT",
    "COMMITTED",
    "COMMITTING",
    "OPEN",
    "TXN_ABORT",
    "TXN_COMMIT",
    "TXN_COMMITTING",
    "AbortTxnMetadata",
    "AckType",
    "BatchDeletion",
    "BatchedPendingAckMetadataEntry",
    "BatchedTransactionMetadataEntry",
    "Catalog",
    "CompactedRecord",
    "CompressionType",
    "Cumulative",
    "CursorState",
    "DeletedRange",
    "Individual",
    "KeyValue",
    "LedgerInfo",
    "ManagedLedgerState",
    "MarkerType",
    "MessageMetadata",
    "PendingAckMetadata",
    "PendingAckMetadataEntry",
    "PendingAckOp",
    "ProducerSequence",
    "RemoteLogSegmentMetadata",
    "SingleMessageMetadata",
    "Subscription",
    "TerminatedTxn",
    "TerminatedTxnState",
    "TransactionBufferSnapshot",
    "TransactionMetadataEntry",
    "TxnRef",
    "TxnStatus",
]
