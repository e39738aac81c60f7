"""The exception hierarchy (SPEC §5)."""

from __future__ import annotations

import pytest

import txnstream as ts
from txnstream import errors


@pytest.mark.parametrize(
    ("cls", "bases"),
    [
        (ts.CorruptEntryError, (ts.TxnStreamError, ValueError)),
        (ts.CorruptLedgerError, (ts.TxnStreamError, ValueError)),
        (ts.ConfigError, (ts.TxnStreamError, ValueError)),
        (ts.InvalidArgumentError, (ts.TxnStreamError, ValueError)),
        (ts.StorageError, (ts.TxnStreamError, OSError)),
        (ts.StorageStoppedError, (ts.StorageError, ts.TxnStreamError, OSError)),
        (ts.WriterClosedError, (ts.TxnStreamError,)),
        (ts.TransactionNotFound, (ts.TransactionError, ts.TxnStreamError)),
        (ts.TransactionConflictError, (ts.TransactionError,)),
        (ts.InvalidTxnStatusError, (ts.TransactionError,)),
        (ts.TransactionTimedOut, (ts.TransactionError,)),
        (ts.TransactionAlreadyCommitted, (ts.TransactionError,)),
        (ts.TransactionAlreadyAborted, (ts.TransactionError,)),
    ],
)
def test_hierarchy(cls: type, bases: tuple[type, ...]) -> None:
    for b in bases:
        assert issubclass(cls, b)


def test_details_become_attributes() -> None:
    e = errors.ConfigError("bad", key="maxRecords", value="3")
    assert e.key == "maxRecords" and e.value == "3" and str(e) == "bad"


def test_rust_error_carries_details() -> None:
    with pytest.raises(ts.CorruptEntryError) as info:
        ts.frame.decode_entry(b"\x0e\x01\x00\x07")
    assert info.value.offset == 2
    assert info.value.position is None
