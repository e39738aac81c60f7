"""Transaction coordinator (SPEC §4.3, §4.4): ids, state machine, log, timeouts, PIP-255.

Read in this order (each file one concept, dependencies pointing down the list):

- :mod:`.metadata` -- what a transaction is: ``TxnID``, ``TxnStatus``,
  ``TxnAction``, the transition table, live metadata, valid input;
- :mod:`.config` -- ``CoordinatorConfig`` and ``RetryPolicy``;
- :mod:`.state` -- the table of live transactions, the log, the sequence
  mark and recovery;
- :mod:`.terminated` -- ``TerminatedTxnStore`` (idempotent end, PIP-255);
- :mod:`.ending` -- how a transaction ends: decide, participants, complete,
  background ends and retries;
- :mod:`.coordinator` -- ``TransactionCoordinator`` (the API) and
  ``TransactionCoordinators`` (several per broker);
- :mod:`.aio` -- ``AsyncCoordinator``, the asyncio front end.

Test doubles (in-memory log and store, recording participants) live in
:mod:`txnstream.testing`.
"""

from __future__ import annotations

from txnstream.coordinator.aio import AsyncCoordinator
from txnstream.coordinator.config import CoordinatorConfig, RetryPolicy
from txnstream.coordinator.coordinator import (
    TransactionCoordinator,
    TransactionCoordinators,
    log_name,
    terminated_topic_name,
)
from txnstream.coordinator.ending import NullParticipants, Participant, ParticipantResolver
from txnstream.coordinator.metadata import TransactionInfo, TxnAction, TxnID, TxnStatus
from txnstream.coordinator.state import (
    LedgerTransactionLog,
    SequenceFile,
    SequenceStore,
    TransactionLog,
)
from txnstream.coordinator.terminated import (
    TerminatedPersistence,
    TerminatedRecord,
    TerminatedTxnStore,
)
from txnstream.errors import ParticipantsFailed, TransactionEndPending

__all__ = [
    "AsyncCoordinator",
    "CoordinatorConfig",
    "LedgerTransactionLog",
    "NullParticipants",
    "Participant",
    "ParticipantResolver",
    "ParticipantsFailed",
    "RetryPolicy",
    "SequenceFile",
    "SequenceStore",
    "TerminatedPersistence",
    "TerminatedRecord",
    "TerminatedTxnStore",
    "TransactionCoordinator",
    "TransactionCoordinators",
    "TransactionEndPending",
    "TransactionInfo",
    "TransactionLog",
    "TxnAction",
    "TxnID",
    "TxnStatus",
    "log_name",
    "terminated_topic_name",
]
