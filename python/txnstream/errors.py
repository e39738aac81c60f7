"""The txnstream exception hierarchy (SPEC §5).

Every error txnstream raises derives from :class:`TxnStreamError`. Errors the
Rust core reports are mapped to these classes in one place
(``rust/py/src/errors.rs``); structured details (position, offset, key, …)
arrive as keyword arguments and become attributes.
"""

from __future__ import annotations

from typing import Any


class TxnStreamError(Exception):
    """Root of every txnstream error; details are exposed as attributes.

    Errors follow Kafka's split, told by two class attributes:

    - ``retriable``: the same call may succeed if made again (nothing
      changed, or the outcome is decided and being completed);
    - ``abortable``: the transaction cannot go on; abort it and start over
      with a new one;
    - neither: the call was wrong (bad input) or the client/broker is
      closed or broken (fatal for that object).
    """

    retriable = False
    abortable = False

    def __init__(self, message: str = "", **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details
        for key, value in details.items():
            setattr(self, key, value)


class InvalidArgumentError(TxnStreamError, ValueError, TypeError):
    """An argument has the wrong type or is outside its domain; the message names it.

    It is both a ``ValueError`` and a ``TypeError``, so code catching the
    built-in errors for bad arguments keeps working.
    """


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


class CorruptIndexError(TxnStreamError, ValueError):
    """An index is damaged or of an unknown version.

    The aborted-transaction index or a remote segment's offset index;
    txnstream rebuilds or refetches it. ``kind`` names the index, ``offset``
    the byte offset of the damage.
    """

    kind: str
    offset: int


class ConfigError(TxnStreamError, ValueError):
    """A configuration value was rejected; ``key`` and ``value`` name it."""

    key: str
    value: str


class StorageError(TxnStreamError, OSError):
    """The operating system failed an I/O call (``errno`` when known).

    A write that failed with it changed nothing; the call may be retried.
    """

    retriable = True


class StorageStoppedError(StorageError):
    """The data directory's storage stopped: a storage thread failed (a bug).

    Not retriable: every later write fails the same way until the data
    directory is opened again (which recovers everything acknowledged). A
    write that was in flight may or may not be durable.
    """

    retriable = False


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

    abortable = True


class TransactionConflictError(TransactionError):
    """A transactional ack conflicts with another ack; state is unchanged.

    Abortable: the transaction cannot take this message; abort it (its other
    acks are released and redelivered) and start over.
    """

    abortable = True


class InvalidTxnStatusError(TransactionError):
    """The requested transition is not allowed from the current status."""

    abortable = True


class TransactionWriteFailed(TransactionError):  # noqa: N818 - reads as a state
    """A write of the transaction (a message, an ack or a log record) failed.

    The transaction can no longer commit; ``cause`` is the storage error.
    When the client raises it from ``commit()``, ``aborted`` says whether the
    abort that followed is durable (False: the storage still fails; the
    coordinator aborts the transaction at its timeout). Start over.
    """

    abortable = True


class TransactionTimedOut(TransactionError):  # noqa: N818 - Pulsar's name
    """The transaction passed its timeout and was aborted."""

    abortable = True


class TransactionAlreadyCommitted(TransactionError):  # noqa: N818 - Pulsar's name
    """An abort was requested for a transaction that committed."""


class TransactionAlreadyAborted(TransactionError):  # noqa: N818 - Pulsar's name
    """A commit was requested for a transaction that aborted (``timed_out`` tells why)."""

    abortable = True


class TransactionEndPending(TransactionError):  # noqa: N818 - reads as a state
    """An end did not finish within the coordinator's ``end_timeout_ms``.

    ``outcome`` is the decided final status (COMMITTED or ABORTED), or None
    if the decision itself could not be made in time (the transaction is
    still OPEN then). A decided end is completed in the background; asking
    for the same end again returns the outcome once it is done.
    """

    retriable = True
    outcome: object


class ParticipantsFailed(TransactionEndPending):
    """Some participants could not be ended in time; ``failures`` names each and its error.

    The outcome (``outcome``) is decided and the transaction stays
    COMMITTING/ABORTING until the background (or the next recovery)
    finishes it on every participant.
    """


class CoordinatorNotFound(TxnStreamError):  # noqa: N818 - Pulsar's name
    """No transaction coordinator with that id is served here."""


class AlreadyClosedError(TxnStreamError):
    """The broker, client, producer or consumer was closed (Pulsar's AlreadyClosedException).

    Fatal for that object: ``what`` names it. Make a new one (reopen the broker).
    """


class OperationTimeoutError(TxnStreamError, TimeoutError):
    """A wait ran past its deadline (Pulsar's TimeoutException); ``what`` names it.

    It may be retried. A send that timed out (``what="send"``) may still be
    written: retry it with the same ``sequence_id`` (deduplicated); other
    calls that time out changed nothing.
    """

    retriable = True


def send_timed_out(what: str, timeout_ms: int) -> OperationTimeoutError:
    """Return the error of a send not done within ``timeout_ms`` (the disk did not answer)."""
    return OperationTimeoutError(
        f"{what} did not complete within {timeout_ms} ms; it may still complete: retry "
        "with the same sequence_id (a retry of a message already written writes nothing)",
        what="send",
    )


class InvalidTopicNameError(InvalidArgumentError):
    """A topic or subscription name is malformed; ``value`` is the name given."""


class DuplicateSequenceError(TxnStreamError):
    """A send repeats a sequence id persisted before, older than the deduplication window.

    The message is not written again (it was persisted); only its id is no
    longer remembered. ``producer_name`` and ``sequence_id`` name it.
    """


__all__ = [
    "AlreadyClosedError",
    "ConfigError",
    "CoordinatorNotFound",
    "CorruptEntryError",
    "CorruptIndexError",
    "CorruptLedgerError",
    "DuplicateSequenceError",
    "InvalidArgumentError",
    "InvalidTopicNameError",
    "InvalidTxnStatusError",
    "LedgerClosedError",
    "OperationTimeoutError",
    "ParticipantsFailed",
    "PositionNotFoundError",
    "ReadOnlyError",
    "StorageError",
    "StorageStoppedError",
    "TransactionAlreadyAborted",
    "TransactionAlreadyCommitted",
    "TransactionConflictError",
    "TransactionEndPending",
    "TransactionError",
    "TransactionNotFound",
    "TransactionTimedOut",
    "TransactionWriteFailed",
    "TxnStreamError",
    "WriterClosedError",
]
