"""Transaction statuses and the transition table of SPEC §4.3."""

from __future__ import annotations

import enum

from txnstream.errors import InvalidArgumentError, InvalidTxnStatusError


class TxnStatus(enum.IntEnum):
    """Status of a transaction; values equal the protobuf ``TxnStatus`` enum."""

    OPEN = 0
    COMMITTING = 1
    COMMITTED = 2
    ABORTING = 3
    ABORTED = 4

    @property
    def is_final(self) -> bool:
        """True for COMMITTED and ABORTED."""
        return self in (TxnStatus.COMMITTED, TxnStatus.ABORTED)

    @property
    def is_ending(self) -> bool:
        """True for COMMITTING and ABORTING (end decided, participants pending)."""
        return self in (TxnStatus.COMMITTING, TxnStatus.ABORTING)


class TxnAction(enum.Enum):
    """What ``end_transaction`` asks for."""

    COMMIT = "commit"
    ABORT = "abort"

    @property
    def ending_status(self) -> TxnStatus:
        """The intermediate status this action moves an OPEN transaction to."""
        return TxnStatus.COMMITTING if self is TxnAction.COMMIT else TxnStatus.ABORTING

    @property
    def final_status(self) -> TxnStatus:
        """The status a transaction ends in after this action."""
        return TxnStatus.COMMITTED if self is TxnAction.COMMIT else TxnStatus.ABORTED

    @classmethod
    def parse(cls, value: TxnAction | str) -> TxnAction:
        """Accept a :class:`TxnAction` or ``"commit"`` / ``"abort"`` (any case)."""
        if isinstance(value, TxnAction):
            return value
        if isinstance(value, str):
            try:
                return cls(value.lower())
            except ValueError:
                pass
        raise InvalidArgumentError(
            f"transaction action must be 'commit' or 'abort', got {value!r}",
            argument="action",
            value=value,
        )


# OPEN -> OPEN|COMMITTING|ABORTING; COMMITTING -> COMMITTED; ABORTING -> ABORTED;
# staying in the same status is always a no-op success.
_ALLOWED: dict[TxnStatus, frozenset[TxnStatus]] = {
    TxnStatus.OPEN: frozenset({TxnStatus.OPEN, TxnStatus.COMMITTING, TxnStatus.ABORTING}),
    TxnStatus.COMMITTING: frozenset({TxnStatus.COMMITTING, TxnStatus.COMMITTED}),
    TxnStatus.COMMITTED: frozenset({TxnStatus.COMMITTED}),
    TxnStatus.ABORTING: frozenset({TxnStatus.ABORTING, TxnStatus.ABORTED}),
    TxnStatus.ABORTED: frozenset({TxnStatus.ABORTED}),
}


def can_transition(current: TxnStatus, new: TxnStatus) -> bool:
    """Tell whether ``current -> new`` is allowed (same status counts as allowed)."""
    return new in _ALLOWED[current]


def check_transition(txn_id: object, current: TxnStatus, new: TxnStatus) -> bool:
    """Validate ``current -> new``; return True when it changes the status.

    Returns False for a no-op (``current == new``); raises
    :class:`~txnstream.errors.InvalidTxnStatusError` naming the transaction and
    both statuses when the transition is not allowed.
    """
    if new not in _ALLOWED[current]:
        raise InvalidTxnStatusError(
            f"transaction {txn_id} cannot go from {current.name} to {new.name}",
            txn_id=txn_id,
            current=current,
            requested=new,
        )
    return current != new


__all__ = ["TxnAction", "TxnStatus", "can_transition", "check_transition"]
