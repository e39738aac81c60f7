"""Participants of a transaction end: produced partitions and acked subscriptions.

Ending a transaction means telling every produced partition (its transaction
buffer writes a COMMIT/ABORT marker) and every acked subscription (its pending
ack commits or releases the acks). The coordinator only needs the
:class:`Participant` protocol; the transaction buffer and pending ack
implement it, and a :class:`ParticipantResolver` maps names to them.

``Participant.end`` must be idempotent: after a crash or a transient failure
the coordinator calls it again for the same transaction and outcome.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from txnstream.coordinator.txn_id import TxnID
from txnstream.errors import InvalidArgumentError, TransactionError

log = logging.getLogger(__name__)


@runtime_checkable
class Participant(Protocol):
    """One produced partition or acked subscription of a transaction."""

    def end(self, txn_id: TxnID, commit: bool) -> None:
        """Commit (``commit=True``) or abort the transaction here; idempotent.

        Raising any exception means "not done yet": the coordinator retries
        with backoff.
        """


@runtime_checkable
class ParticipantResolver(Protocol):
    """Finds the participant that serves a partition or subscription."""

    def partition(self, name: str) -> Participant:
        """Return the transaction buffer of topic partition ``name``."""

    def subscription(self, topic: str, subscription: str) -> Participant:
        """Return the pending ack of ``subscription`` on ``topic``."""


class _Nothing:
    def end(self, txn_id: TxnID, commit: bool) -> None:
        return None


class NullParticipants:
    """Resolver for a coordinator that runs without buffers (log-only use).

    Every end succeeds at once; the coordinator still logs the full
    COMMITTING -> COMMITTED sequence.
    """

    _nothing = _Nothing()

    def partition(self, name: str) -> Participant:
        """Return a participant that has nothing to end."""
        return self._nothing

    def subscription(self, topic: str, subscription: str) -> Participant:
        """Return a participant that has nothing to end."""
        return self._nothing


@dataclass(frozen=True)
class RetryPolicy:
    """Capped exponential backoff for transient participant failures.

    ``max_attempts=None`` retries until the coordinator closes (an ended
    transaction's outcome is decided; giving up is never correct, only
    pausing until recovery or the next end request resumes it). That
    applies to a client's end request; background ends (timeouts, recovery)
    make at most ``CoordinatorConfig.background_end_attempts`` attempts per
    run and then reschedule themselves, so they never hold a pool thread.
    """

    initial_backoff_ms: float = 5.0
    max_backoff_ms: float = 1000.0
    multiplier: float = 2.0
    max_attempts: int | None = None

    def __post_init__(self) -> None:
        if self.initial_backoff_ms < 0 or self.max_backoff_ms < self.initial_backoff_ms:
            raise InvalidArgumentError(
                "retry backoff must satisfy 0 <= initial_backoff_ms <= max_backoff_ms, got "
                f"{self.initial_backoff_ms} and {self.max_backoff_ms}",
                argument="initial_backoff_ms",
                value=self.initial_backoff_ms,
            )
        if self.multiplier < 1:
            raise InvalidArgumentError(
                f"retry multiplier must be >= 1, got {self.multiplier}",
                argument="multiplier",
                value=self.multiplier,
            )
        if self.max_attempts is not None and self.max_attempts < 1:
            raise InvalidArgumentError(
                f"max_attempts must be >= 1 or None, got {self.max_attempts}",
                argument="max_attempts",
                value=self.max_attempts,
            )

    def backoff_ms(self, attempt: int) -> float:
        """Delay before retry number ``attempt`` (1-based)."""
        return float(
            min(self.max_backoff_ms, self.initial_backoff_ms * self.multiplier ** (attempt - 1))
        )


class ParticipantsFailed(TransactionError):  # noqa: N818 - reads as an outcome
    """Some participants could not be ended within the retry policy.

    The transaction stays COMMITTING/ABORTING; a later end request or the
    next recovery finishes it. ``failures`` names each participant and error.
    """


def end_participants(
    txn_id: TxnID,
    commit: bool,
    partitions: Sequence[str],
    subscriptions: Sequence[tuple[str, str]],
    resolver: ParticipantResolver,
    policy: RetryPolicy,
    stop: threading.Event,
    sleep: Callable[[float], object] | None = None,
) -> int:
    """End ``txn_id`` on every participant, retrying failures with backoff.

    Returns the number of retries needed. Only failed participants are
    retried. Raises :class:`ParticipantsFailed` when ``policy.max_attempts``
    is exhausted or ``stop`` is set while some are still failing.
    """
    pending: list[tuple[str, Callable[[], Participant]]] = [
        (f"partition {p}", functools.partial(resolver.partition, p)) for p in partitions
    ]
    pending += [
        (f"subscription {t}/{s}", functools.partial(resolver.subscription, t, s))
        for t, s in subscriptions
    ]
    wait = sleep if sleep is not None else stop.wait
    attempt = 0
    retries = 0
    while pending:
        attempt += 1
        failed: list[tuple[str, Callable[[], Participant]]] = []
        errors: list[tuple[str, str]] = []
        for label, get in pending:
            try:
                get().end(txn_id, commit)
            except Exception as exc:
                failed.append((label, get))
                errors.append((label, repr(exc)))
        if not failed:
            break
        retries += len(failed)
        if (policy.max_attempts is not None and attempt >= policy.max_attempts) or stop.is_set():
            raise ParticipantsFailed(
                f"ending transaction {txn_id} failed on {len(failed)} participant(s) after "
                f"{attempt} attempt(s): {errors[0][0]}: {errors[0][1]}",
                txn_id=txn_id,
                failures=errors,
            )
        log.debug("retrying end of %s on %d participants", txn_id, len(failed))
        wait(policy.backoff_ms(attempt) / 1000.0)
        pending = failed
    return retries


class TransientParticipantError(TransactionError):
    """A participant is temporarily unable to end a transaction (retry later)."""


class RecordingParticipant:
    """In-memory participant that records every end and can fail on demand.

    ``fail_next(n)`` makes the next ``n`` calls raise
    :class:`TransientParticipantError`; ``hook`` (if set) runs before each
    successful end, e.g. to kill the process in crash tests. ``outcomes``
    maps each transaction to the outcome it ended with; a later call with the
    opposite outcome is recorded in ``conflicts`` (it would be a bug).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: list[tuple[TxnID, bool]] = []
        self.outcomes: dict[TxnID, bool] = {}
        self.conflicts: list[tuple[TxnID, bool]] = []
        self.failures = 0
        self.hook: Callable[[TxnID, bool], None] | None = None
        self._fail_remaining = 0
        self._lock = threading.Lock()

    def fail_next(self, n: int) -> None:
        """Make the next ``n`` calls fail transiently."""
        with self._lock:
            self._fail_remaining = n

    def end(self, txn_id: TxnID, commit: bool) -> None:
        """Record the end, or fail if a failure is pending."""
        with self._lock:
            self.calls.append((txn_id, commit))
            if self._fail_remaining > 0:
                self._fail_remaining -= 1
                self.failures += 1
                raise TransientParticipantError(
                    f"{self.name}: injected transient failure for {txn_id}", txn_id=txn_id
                )
        if self.hook is not None:
            self.hook(txn_id, commit)
        with self._lock:
            prev = self.outcomes.setdefault(txn_id, commit)
            if prev != commit:
                self.conflicts.append((txn_id, commit))


class RecordingParticipants:
    """Resolver creating one :class:`RecordingParticipant` per name on demand."""

    def __init__(self) -> None:
        self.partitions: dict[str, RecordingParticipant] = {}
        self.subscriptions: dict[tuple[str, str], RecordingParticipant] = {}
        self._lock = threading.Lock()

    def partition(self, name: str) -> RecordingParticipant:
        """Return the recorder for partition ``name``."""
        with self._lock:
            p = self.partitions.get(name)
            if p is None:
                p = self.partitions[name] = RecordingParticipant(name)
            return p

    def subscription(self, topic: str, subscription: str) -> RecordingParticipant:
        """Return the recorder for ``subscription`` on ``topic``."""
        key = (topic, subscription)
        with self._lock:
            p = self.subscriptions.get(key)
            if p is None:
                p = self.subscriptions[key] = RecordingParticipant(f"{topic}/{subscription}")
            return p

    def all(self) -> list[RecordingParticipant]:
        """Every recorder created so far."""
        with self._lock:
            return [*self.partitions.values(), *self.subscriptions.values()]


__all__ = [
    "NullParticipants",
    "Participant",
    "ParticipantResolver",
    "ParticipantsFailed",
    "RecordingParticipant",
    "RecordingParticipants",
    "RetryPolicy",
    "TransientParticipantError",
    "end_participants",
]
