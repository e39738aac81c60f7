"""Several coordinators in one broker (ids 0..N-1), each with its own log.

A client picks a coordinator per transaction (round robin here, as Pulsar's
client does); every later call is routed by the TxnID's ``most_bits``.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Iterable
from typing import Any

from txnstream.coordinator.arguments import txn_id_arg
from txnstream.coordinator.config import CoordinatorConfig
from txnstream.coordinator.coordinator import TransactionCoordinator
from txnstream.coordinator.metadata import TransactionInfo
from txnstream.coordinator.participants import ParticipantResolver
from txnstream.coordinator.status import TxnAction, TxnStatus
from txnstream.coordinator.timeouts import Clock, wall_clock_ms
from txnstream.coordinator.txn_id import TxnID
from txnstream.errors import CoordinatorNotFound, InvalidArgumentError


class TransactionCoordinators:
    """The coordinators of one broker, routing calls by TxnID."""

    def __init__(self, coordinators: Iterable[TransactionCoordinator]) -> None:
        self._by_id = {tc.tc_id: tc for tc in coordinators}
        if not self._by_id:
            raise InvalidArgumentError("at least one coordinator is required", argument="count")
        self._ids = sorted(self._by_id)
        self._next = itertools.cycle(self._ids)
        self._lock = threading.Lock()

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        count: int = 1,
        *,
        config: CoordinatorConfig | None = None,
        participants: ParticipantResolver | None = None,
        clock: Clock = wall_clock_ms,
        **settings: Any,
    ) -> TransactionCoordinators:
        """Open (recovering) coordinators ``0..count-1`` on ``directory``."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise InvalidArgumentError(
                f"number of coordinators must be a positive integer, got {count!r}",
                argument="count",
                value=count,
            )
        opened: list[TransactionCoordinator] = []
        try:
            for tc_id in range(count):
                opened.append(
                    TransactionCoordinator.open(
                        directory,
                        tc_id,
                        config=config,
                        participants=participants,
                        clock=clock,
                        **settings,
                    )
                )
        except BaseException:
            for tc in opened:
                tc.close()
            raise
        return cls(opened)

    def __len__(self) -> int:
        """Return the number of coordinators."""
        return len(self._ids)

    def get(self, tc_id: int) -> TransactionCoordinator:
        """Return coordinator ``tc_id``; :class:`CoordinatorNotFound` if not served."""
        tc = self._by_id.get(tc_id)
        if tc is None:
            raise CoordinatorNotFound(
                f"transaction coordinator {tc_id} is not served here (have {self._ids})",
                tc_id=tc_id,
            )
        return tc

    def of(self, txn_id: TxnID) -> TransactionCoordinator:
        """Return the coordinator that owns ``txn_id``."""
        return self.get(txn_id_arg(txn_id).most_bits)

    def new_transaction(
        self, timeout_ms: int | None = None, client_name: str | None = None
    ) -> TxnID:
        """Start a transaction on the next coordinator (round robin)."""
        with self._lock:
            tc_id = next(self._next)
        return self._by_id[tc_id].new_transaction(timeout_ms, client_name)

    def add_produced_partitions(self, txn_id: TxnID, partitions: Iterable[str]) -> None:
        """Route to the owner's ``add_produced_partitions``."""
        self.of(txn_id).add_produced_partitions(txn_id, partitions)

    def add_acked_subscriptions(
        self, txn_id: TxnID, subscriptions: Iterable[tuple[str, str]]
    ) -> None:
        """Route to the owner's ``add_acked_subscriptions``."""
        self.of(txn_id).add_acked_subscriptions(txn_id, subscriptions)

    def end_transaction(self, txn_id: TxnID, action: TxnAction | str) -> TxnStatus:
        """Route to the owner's ``end_transaction``."""
        return self.of(txn_id).end_transaction(txn_id, action)

    def get_transaction(self, txn_id: TxnID) -> TransactionInfo:
        """Route to the owner's ``get_transaction``."""
        return self.of(txn_id).get_transaction(txn_id)

    def low_water_marks(self) -> dict[int, int]:
        """Return the LWM of every coordinator."""
        return {i: self._by_id[i].low_water_mark() for i in self._ids}

    def stats(self) -> list[dict[str, Any]]:
        """Return every coordinator's stats."""
        return [self._by_id[i].stats() for i in self._ids]

    def close(self) -> None:
        """Close every coordinator."""
        for i in self._ids:
            self._by_id[i].close()

    def __enter__(self) -> TransactionCoordinators:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["TransactionCoordinators"]
