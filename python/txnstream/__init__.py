"""txnstream: a durable, embeddable, transactional message log with a Rust core.

Lower layers are public: :mod:`txnstream.frame` (batched-entry framing),
:class:`AckSet` (batch-index ack sets), :mod:`txnstream.proto` (generated
protobuf classes) and the :mod:`txnstream.errors` hierarchy.
"""

from __future__ import annotations

from txnstream import frame
from txnstream._native import (
    BufferedWriter,
    CompactedTopic,
    Cursor,
    ManagedLedger,
    Position,
    TxnPosition,
)
from txnstream.ackset import AckSet
from txnstream.config import BrokerConfig
from txnstream.coordinator import TransactionCoordinator, TxnID, TxnStatus
from txnstream.errors import (
    ConfigError,
    CoordinatorNotFound,
    CorruptEntryError,
    CorruptLedgerError,
    InvalidArgumentError,
    InvalidTxnStatusError,
    LedgerClosedError,
    PositionNotFoundError,
    ReadOnlyError,
    StorageError,
    TransactionAlreadyAborted,
    TransactionAlreadyCommitted,
    TransactionConflictError,
    TransactionError,
    TransactionNotFound,
    TransactionTimedOut,
    TxnStreamError,
    WriterClosedError,
)

__all__ = [
    "AckSet",
    "BrokerConfig",
    "BufferedWriter",
    "CompactedTopic",
    "ConfigError",
    "CoordinatorNotFound",
    "CorruptEntryError",
    "CorruptLedgerError",
    "Cursor",
    "InvalidArgumentError",
    "InvalidTxnStatusError",
    "LedgerClosedError",
    "ManagedLedger",
    "Position",
    "PositionNotFoundError",
    "ReadOnlyError",
    "StorageError",
    "TransactionAlreadyAborted",
    "TransactionAlreadyCommitted",
    "TransactionConflictError",
    "TransactionCoordinator",
    "TransactionError",
    "TransactionNotFound",
    "TransactionTimedOut",
    "TxnID",
    "TxnPosition",
    "TxnStatus",
    "TxnStreamError",
    "WriterClosedError",
    "frame",
]
