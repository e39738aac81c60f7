"""Transaction coordinator (SPEC §4.3, §4.4): state machine, log, timeouts, PIP-255 store.

Modules: :mod:`.txn_id` (``TxnID``), :mod:`.status` (``TxnStatus`` and the
transition table), :mod:`.metadata` (live per-transaction state),
:mod:`.timeouts` (one timer over a heap), :mod:`.participants` (partitions and
subscriptions a transaction ends on), :mod:`.terminated` (``TerminatedTxnStore``),
:mod:`.recovery` (the Rust recovery fold's columnar result), :mod:`.replay`
(its Python reference), :mod:`.log` / :mod:`.ledger_log` (the log),
:mod:`.sequence` (the durable id mark), :mod:`.coordinator`
(``TransactionCoordinator``, a facade over :mod:`.table` (lock, live
transactions, LWM), :mod:`.durable`, :mod:`.starting`, :mod:`.adding`,
:mod:`.ending` (the end driver), :mod:`.end_requests`, :mod:`.answers`,
:mod:`.background` (timeouts, resumes, retries), :mod:`.rebuild` (recovery
into the table), :mod:`.queries`, :mod:`.counters` and :mod:`.maintenance`),
:mod:`.aio` (``AsyncCoordinator``, its asyncio front end),
:mod:`.coordinators` (N per broker).
"""

from __future__ import annotations

from txnstream.coordinator.aio import AsyncCoordinator
from txnstream.coordinator.config import CoordinatorConfig
from txnstream.coordinator.coordinator import (
    STEPS,
    TransactionCoordinator,
    log_name,
    terminated_topic_name,
)
from txnstream.coordinator.coordinators import TransactionCoordinators
from txnstream.coordinator.ledger_log import LedgerTransactionLog, open_terminated_topic
from txnstream.coordinator.log import InMemoryTransactionLog, TransactionLog
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
from txnstream.coordinator.sequence import InMemorySequence, SequenceFile, SequenceStore
from txnstream.coordinator.status import TxnAction, TxnStatus
from txnstream.coordinator.terminated import (
    InMemoryTerminatedPersistence,
    TerminatedPersistence,
    TerminatedRecord,
    TerminatedTxnStore,
)
from txnstream.coordinator.timeouts import TimerService
from txnstream.coordinator.txn_id import TxnID

__all__ = [
    "STEPS",
    "AsyncCoordinator",
    "CoordinatorConfig",
    "InMemorySequence",
    "InMemoryTerminatedPersistence",
    "InMemoryTransactionLog",
    "LedgerTransactionLog",
    "NullParticipants",
    "Participant",
    "ParticipantResolver",
    "ParticipantsFailed",
    "RecordingParticipant",
    "RecordingParticipants",
    "RetryPolicy",
    "SequenceFile",
    "SequenceStore",
    "TerminatedPersistence",
    "TerminatedRecord",
    "TerminatedTxnStore",
    "TimerService",
    "TransactionCoordinator",
    "TransactionCoordinators",
    "TransactionInfo",
    "TransactionLog",
    "TransientParticipantError",
    "TxnAction",
    "TxnID",
    "TxnStatus",
    "log_name",
    "open_terminated_topic",
    "terminated_topic_name",
]
