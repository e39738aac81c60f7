"""txnstream: a durable, embeddable, transactional message log with a Rust core.

Lower layers are public: :mod:`txnstream.frame` (batched-entry framing),
:class:`AckSet` (batch-index ack sets), :mod:`txnstream.proto` (generated
protobuf classes) and the :mod:`txnstream.errors` hierarchy; above them the
managed ledger, the BufferedWriter and the transaction coordinator.

Names are loaded on first use (PEP 562), so importing a low-level module
(``txnstream.ackset``, ``txnstream.frame``) does not import the
coordinator; ``from txnstream import TransactionCoordinator`` works as usual.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from txnstream.errors import (
    ConfigError,
    CoordinatorNotFound,
    CorruptEntryError,
    CorruptIndexError,
    CorruptLedgerError,
    InvalidArgumentError,
    InvalidTxnStatusError,
    LedgerClosedError,
    ParticipantsFailed,
    PositionNotFoundError,
    ReadOnlyError,
    StorageError,
    StorageStoppedError,
    TransactionAlreadyAborted,
    TransactionAlreadyCommitted,
    TransactionConflictError,
    TransactionEndPending,
    TransactionError,
    TransactionNotFound,
    TransactionTimedOut,
    TxnStreamError,
    WriterClosedError,
)

if TYPE_CHECKING:
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
    from txnstream.broker import Broker
    from txnstream.client import Client, Message, MessageId
    from txnstream.config import BrokerConfig
    from txnstream.coordinator import TransactionCoordinator, TxnAction, TxnID, TxnStatus

# name -> module it is loaded from
_LAZY = {
    "BufferedWriter": "txnstream._native",
    "CompactedTopic": "txnstream._native",
    "Cursor": "txnstream._native",
    "ManagedLedger": "txnstream._native",
    "Position": "txnstream._native",
    "TxnPosition": "txnstream._native",
    "AckSet": "txnstream.ackset",
    "BrokerConfig": "txnstream.config",
    "Broker": "txnstream.broker",
    "Client": "txnstream.client",
    "Message": "txnstream.client",
    "MessageId": "txnstream.client",
    "TransactionCoordinator": "txnstream.coordinator",
    "TxnAction": "txnstream.coordinator",
    "TxnID": "txnstream.coordinator",
    "TxnStatus": "txnstream.coordinator",
}


def __getattr__(name: str) -> Any:
    if name == "frame":
        return importlib.import_module("txnstream.frame")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'txnstream' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "AckSet",
    "Broker",
    "BrokerConfig",
    "BufferedWriter",
    "Client",
    "CompactedTopic",
    "ConfigError",
    "CoordinatorNotFound",
    "CorruptEntryError",
    "CorruptIndexError",
    "CorruptLedgerError",
    "Cursor",
    "InvalidArgumentError",
    "InvalidTxnStatusError",
    "LedgerClosedError",
    "ManagedLedger",
    "Message",
    "MessageId",
    "ParticipantsFailed",
    "Position",
    "PositionNotFoundError",
    "ReadOnlyError",
    "StorageError",
    "StorageStoppedError",
    "TransactionAlreadyAborted",
    "TransactionAlreadyCommitted",
    "TransactionConflictError",
    "TransactionCoordinator",
    "TransactionEndPending",
    "TransactionError",
    "TransactionNotFound",
    "TransactionTimedOut",
    "TxnAction",
    "TxnID",
    "TxnPosition",
    "TxnStatus",
    "TxnStreamError",
    "WriterClosedError",
    "frame",
]
