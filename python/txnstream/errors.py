"""The txnstream exception hierarchy (SPEC §5).

Every error txnstream raises derives from :class:`TxnStreamError`. Errors the
Rust core reports are mapped to these classes in one place
(``rust/py/src/errors.rs``); structured details (position, offset, key, …)
arrive as keyword arguments and become attributes.
"""

from __future__ import annotations

from typing import Any


class TxnStreamError(Exception):
    """Root of every txnstream error; details are exposed as attributes."""

    def __init__(self, message: str = "", **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details
        for key, value in details.items():
            setattr(self, key, value)


class InvalidArgumentError(TxnStreamError, ValueError):
    """An argument is outside its accepted domain; the message names it."""


class CorruptEntryError(TxnStreamError, ValueError):
    """An entry's bytes cannot be decoded.

    ``position`` is ``(ledger_id, entry_id)`` when known, ``offset`` the byte
    offset inside the entry where decoding failed.
    """

    position: tuple[int, int] | None
    offset: int


class CorruptLedgerError(TxnStreamError, ValueError):
    """A ledger file is damaged before valid data (never silently dropped).

    ``path`` names the file, ``position`` the first unreadable entry and
    ``offset`` its byte offset in the file.
    """

    path: str
    position: tuple[int, int]
    offset: int


class ConfigError(TxnStreamError, ValueError):
    """A configuration value was rejected; ``key`` and ``value`` name it."""

    key: str
    value: str


class StorageError(TxnStreamError, OSError):
    """The operating system failed an I/O call (``errno`` when known)."""


class WriterClosedError(TxnStreamError):
    """A buffered writer was closed before the record was written."""


class LedgerClosedError(TxnStreamError):
    """The managed ledger is closed."""


class ReadOnlyError(TxnStreamError):
    """The managed ledger was opened read-only."""


class PositionNotFoundError(TxnStreamError, LookupError):
    """No entry exists at the requested position (never written or trimmed)."""

    position: tuple[int, int]


class TransactionError(TxnStreamError):
    """Base of errors about one transaction."""


class TransactionNotFound(TransactionError):  # noqa: N818 - Pulsar's name
    """The transaction is unknown to the coordinator and its terminated store."""


class TransactionConflictError(TransactionError):
    """A transactional ack conflicts with another ack; state is unchanged."""


class InvalidTxnStatusError(TransactionError):
    """The requested transition is not allowed from the current status."""


class TransactionTimedOut(TransactionError):  # noqa: N818 - Pulsar's name
    """The transaction passed its timeout and was aborted."""


class TransactionAlreadyCommitted(TransactionError):  # noqa: N818 - Pulsar's name
    """An abort was requested for a transaction that committed."""


class TransactionAlreadyAborted(TransactionError):  # noqa: N818 - Pulsar's name
    """A commit was requested for a transaction that aborted (``timed_out`` tells why)."""


class CoordinatorNotFound(TxnStreamError):  # noqa: N818 - Pulsar's name
    """No transaction coordinator with that id is served here."""


__all__ = [
    "ConfigError",
    "CoordinatorNotFound",
    "CorruptEntryError",
    "CorruptLedgerError",
    "InvalidArgumentError",
    "InvalidTxnStatusError",
    "LedgerClosedError",
    "PositionNotFoundError",
    "ReadOnlyError",
    "StorageError",
    "TransactionAlreadyAborted",
    "TransactionAlreadyCommitted",
    "TransactionConflictError",
    "TransactionError",
    "TransactionNotFound",
    "TransactionTimedOut",
    "TxnStreamError",
    "WriterClosedError",
]
