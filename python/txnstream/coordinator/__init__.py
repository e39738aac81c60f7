"""Transaction coordinator (SPEC §4.3, §4.4): state machine, log, timeouts, PIP-255 store.

Modules: :mod:`.txn_id` (``TxnID``), :mod:`.status` (``TxnStatus`` and the
transition table), :mod:`.metadata` (live per-transaction state),
:mod:`.timeouts` (one timer over a heap), :mod:`.participants` (partitions and
subscriptions a transaction ends on), :mod:`.terminated` (``TerminatedTxnStore``),
:mod:`.replay` (bulk recovery fold), :mod:`.log` / :mod:`.ledger_log` (the log),
:mod:`.coordinator` (``TransactionCoordinator``), :mod:`.coordinators` (N per broker).
"""

from __future__ import annotations

from txnstream.coordinator.config import CoordinatorConfig
from txnstream.coordinator.coordinator import TransactionCoordinator
from txnstream.coordinator.coordinators import TransactionCoordinators
from txnstream.coordinator.metadata import TransactionInfo
from txnstream.coordinator.participants import (
    NullParticipants,
    Participant,
    ParticipantResolver,
    ParticipantsFailed,
    RecordingParticipant,
    RecordingParticipants,
    RetryPolicy,
    TransientParticipantError,
)
from txnstream.coordinator.status import TxnAction, TxnStatus
from txnstream.coordinator.terminated import TerminatedRecord, TerminatedTxnStore
from txnstream.coordinator.timeouts import TimerService
from txnstream.coordinator.txn_id import TxnID

__all__ = [
    "CoordinatorConfig",
    "NullParticipants",
    "Participant",
    "ParticipantResolver",
    "ParticipantsFailed",
    "RecordingParticipant",
    "RecordingParticipants",
    "RetryPolicy",
    "TerminatedRecord",
    "TerminatedTxnStore",
    "TimerService",
    "TransactionCoordinator",
    "TransactionCoordinators",
    "TransactionInfo",
    "TransientParticipantError",
    "TxnAction",
    "TxnID",
    "TxnStatus",
]
