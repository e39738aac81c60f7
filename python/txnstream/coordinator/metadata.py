"""Per-transaction state kept by a coordinator while a transaction is live.

Memory per open transaction matters (thousands may be open at once), so the
live record uses ``__slots__``, stores the coordinator-local sequence only,
keeps partitions/subscriptions as ``None`` until first added, and keeps the
log positions of its records as the writer's own ``TxnPosition`` objects
(no copies) so they can be deleted by position and batch index at the end.
A recovered transaction's records sit in one shared columnar table instead
(``span``), see :mod:`.recovery`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from txnstream._native import TxnPosition
from txnstream.coordinator.status import TxnStatus
from txnstream.coordinator.txn_id import TxnID


class TxnMeta:
    """Mutable state of one live transaction (guarded by the coordinator lock)."""

    __slots__ = (
        "client_name",
        "done",
        "driver",
        "last_modified",
        "partitions",
        "positions",
        "retries",
        "seq",
        "span",
        "start_time",
        "status",
        "subscriptions",
        "timed_out",
        "timeout_ms",
        "timer",
    )

    def __init__(
        self,
        seq: int,
        timeout_ms: int,
        start_time: int,
        client_name: str | None,
        status: TxnStatus = TxnStatus.OPEN,
    ) -> None:
        self.seq = seq
        self.status = status
        self.timed_out = False
        self.timeout_ms = timeout_ms
        self.start_time = start_time
        self.last_modified = start_time
        self.client_name = client_name
        self.partitions: list[str] | None = None
        self.subscriptions: list[tuple[str, str]] | None = None
        self.positions: list[TxnPosition] = []
        # Recovered transactions: index of their slice of the coordinator's
        # recovered position table (no TxnPosition object per record); -1: none.
        self.span = -1
        # Set while some thread drives the end; waiters block on ``done``.
        self.driver = False
        self.done: threading.Event | None = None
        # Cancellation handle of the armed timeout (OPEN) or of the next
        # background retry of a stalled end (COMMITTING/ABORTING).
        self.timer: object | None = None
        # Background runs of the end that failed on participants (backoff).
        self.retries = 0

    @property
    def deadline(self) -> int:
        """Wall-clock ms at which an OPEN transaction times out."""
        return self.start_time + self.timeout_ms

    def add_partitions(self, names: list[str]) -> list[str]:
        """Add partitions not yet present; return the newly added ones in order."""
        if self.partitions is None:
            self.partitions = []
        have = self.partitions
        new = [p for p in dict.fromkeys(names) if p not in have]
        have.extend(new)
        return new

    def add_subscriptions(self, subs: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """Add subscriptions not yet present; return the newly added ones in order."""
        if self.subscriptions is None:
            self.subscriptions = []
        have = self.subscriptions
        new = [s for s in dict.fromkeys(subs) if s not in have]
        have.extend(new)
        return new

    def info(self, tc_id: int, recovered_records: int = 0) -> TransactionInfo:
        """Return an immutable snapshot (``recovered_records``: records in its span)."""
        return TransactionInfo(
            txn_id=TxnID._trusted(tc_id, self.seq),
            status=self.status,
            timed_out=self.timed_out,
            timeout_ms=self.timeout_ms,
            start_time=self.start_time,
            last_modification_time=self.last_modified,
            client_name=self.client_name,
            partitions=tuple(self.partitions or ()),
            subscriptions=tuple(self.subscriptions or ()),
            log_records=len(self.positions) + recovered_records,
        )


@dataclass(frozen=True, slots=True)
class TransactionInfo:
    """What ``get_transaction`` returns: a snapshot of one transaction.

    For a transaction that already ended and is only known to the terminated
    store, ``partitions``/``subscriptions`` are empty and ``start_time`` is 0.
    """

    txn_id: TxnID
    status: TxnStatus
    timed_out: bool
    timeout_ms: int
    start_time: int
    last_modification_time: int
    client_name: str | None
    partitions: tuple[str, ...]
    subscriptions: tuple[tuple[str, str], ...]
    log_records: int = 0

    @property
    def age_ms(self) -> int:
        """Milliseconds between start and last modification."""
        return max(0, self.last_modification_time - self.start_time)


__all__ = ["TransactionInfo", "TxnMeta"]
