"""Fixtures shared by several test modules."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from txnstream import ManagedLedger, testing


@pytest.fixture
def gated_ledger(tmp_path: Path) -> Iterator[ManagedLedger]:
    """A ledger for tests that hold its writes or syncs at fault gates.

    Teardown opens every gate first: a failing assertion must not leave the
    writer or sync thread held, which would hang ``close()``.
    """
    ledger = ManagedLedger.open(tmp_path, "gated")
    yield ledger
    testing.clear_faults(ledger)
    ledger.close()
