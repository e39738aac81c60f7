"""What a transaction is: its id, status, allowed transitions, and live metadata.

Read this first. Everything else in the coordinator moves transactions
between the statuses defined here, and only along :data:`ALLOWED`.

- :class:`TxnID` ``(most_bits, least_bits)`` = (coordinator id, sequence).
- :class:`TxnStatus` OPEN, COMMITTING, COMMITTED, ABORTING, ABORTED (the
  protobuf enum values) and :class:`TxnAction` (what a client asks for).
- :class:`TxnMeta`: the coordinator's live record of one transaction.
- :class:`TransactionInfo`: the immutable snapshot ``get_transaction`` returns.

**One rule for changes (Kafka's prepare/complete).** ``TxnMeta.status`` is
the last status whose record is *durable*. A change in flight is held in
``TxnMeta.pending`` (the status being written) and becomes the status only
once its record is durable; a write that definitely failed clears
``pending`` and nothing else changed. A write whose outcome is unknown (an
interrupt while it was in flight) leaves the change *in doubt*: it may be
durable, so it is treated as decided and written again before anything
builds on it. Likewise a transaction's partitions and subscriptions change
only after their ADD record is durable -- except for the no-wait calls the
broker's client uses (``begin``, ``add_*_nowait``): there the names are
taken at once (ending a participant that holds nothing of the transaction
is a no-op, missing one is not) and the records' durability is awaited
before the commit decision (``adds``); a failed one (``failed``) lets the
transaction only abort.

States of a live transaction, as ``(status, pending)``:

=======================  =======================================================
(OPEN, OPEN)             starting: its NEW record is in flight; not visible yet
(OPEN, None)             open: may add partitions/subscriptions, end, time out
(OPEN, COMMITTING)       the commit decision is being logged (or is in doubt)
(COMMITTING, None)       decided: participants are being ended
(COMMITTING, COMMITTED)  the final record is in flight
=======================  =======================================================

(and the same with ABORTING/ABORTED). A transaction leaves memory once its
final record is durable.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from txnstream._native import TxnPosition
from txnstream.errors import InvalidArgumentError, InvalidTxnStatusError
from txnstream.proto import Subscription

_U64 = (1 << 64) - 1
#: Most transactions one ``new_transactions`` call starts.
MAX_BATCH = 1 << 20


class TxnID:
    """Identifier of one transaction; frozen, ordered, hashable.

    ``most_bits`` is the id of the coordinator that owns the transaction,
    ``least_bits`` the sequence that coordinator issued (it only grows).
    Ordering is by ``(most_bits, least_bits)``; ``str()`` gives ``"(most,least)"``.
    """

    __slots__ = ("_hash", "least_bits", "most_bits")

    most_bits: int
    least_bits: int
    _hash: int

    def __init__(self, most_bits: int, least_bits: int) -> None:
        for name, value in (("most_bits", most_bits), ("least_bits", least_bits)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _U64:
                raise InvalidArgumentError(
                    f"TxnID {name} must be an unsigned 64-bit integer, got {value!r}",
                    argument=name,
                    value=value,
                )
        object.__setattr__(self, "most_bits", most_bits)
        object.__setattr__(self, "least_bits", least_bits)
        object.__setattr__(self, "_hash", hash((most_bits, least_bits)))

    @classmethod
    def _trusted(cls, most_bits: int, least_bits: int) -> TxnID:
        """Build without validation (the coordinator's own, already checked ids)."""
        obj = object.__new__(cls)
        object.__setattr__(obj, "most_bits", most_bits)
        object.__setattr__(obj, "least_bits", least_bits)
        object.__setattr__(obj, "_hash", hash((most_bits, least_bits)))
        return obj

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"TxnID is immutable (cannot set {name})")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"TxnID is immutable (cannot delete {name})")

    def _key(self) -> tuple[int, int]:
        return (self.most_bits, self.least_bits)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TxnID):
            return NotImplemented
        return self.most_bits == other.most_bits and self.least_bits == other.least_bits

    def __lt__(self, other: TxnID) -> bool:
        if not isinstance(other, TxnID):
            return NotImplemented
        return self._key() < other._key()

    def __le__(self, other: TxnID) -> bool:
        if not isinstance(other, TxnID):
            return NotImplemented
        return self._key() <= other._key()

    def __gt__(self, other: TxnID) -> bool:
        if not isinstance(other, TxnID):
            return NotImplemented
        return self._key() > other._key()

    def __ge__(self, other: TxnID) -> bool:
        if not isinstance(other, TxnID):
            return NotImplemented
        return self._key() >= other._key()

    def __hash__(self) -> int:
        return self._hash  # a TxnID is a dict key on every hot path: hashed once

    def __str__(self) -> str:
        return f"({self.most_bits},{self.least_bits})"

    def __repr__(self) -> str:
        return f"TxnID(most_bits={self.most_bits}, least_bits={self.least_bits})"

    def __reduce__(self) -> tuple[type[TxnID], tuple[int, int]]:
        return (TxnID, (self.most_bits, self.least_bits))

    @classmethod
    def parse(cls, text: str) -> TxnID:
        """Parse the ``"(most,least)"`` form produced by ``str()``."""
        body = text.strip() if isinstance(text, str) else ""
        if body.startswith("(") and body.endswith(")"):
            body = body[1:-1]
        parts = body.split(",")
        try:
            if len(parts) != 2:
                raise ValueError
            return cls(int(parts[0]), int(parts[1]))
        except ValueError:
            raise InvalidArgumentError(
                f"not a transaction id: {text!r} (expected '(most,least)')", value=text
            ) from None


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

    @property
    def outcome(self) -> TxnStatus | None:
        """The final status this status leads to (None for OPEN)."""
        return _OUTCOME.get(self)

    @classmethod
    def parse(cls, value: object) -> TxnStatus:
        """Accept a :class:`TxnStatus` or its int value; anything else is refused."""
        if isinstance(value, TxnStatus):
            return value
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 4:
            return cls(value)
        raise InvalidArgumentError(
            f"status must be a TxnStatus (or its value 0..4), got {value!r}",
            argument="status",
            value=value,
        )


_OUTCOME = {
    TxnStatus.COMMITTING: TxnStatus.COMMITTED,
    TxnStatus.COMMITTED: TxnStatus.COMMITTED,
    TxnStatus.ABORTING: TxnStatus.ABORTED,
    TxnStatus.ABORTED: TxnStatus.ABORTED,
}


class TxnAction(enum.Enum):
    """What ``end_transaction`` asks for (``"commit"`` / ``"abort"`` are accepted too)."""

    COMMIT = "commit"
    ABORT = "abort"

    @property
    def ending_status(self) -> TxnStatus:
        """The status that decides this action (COMMITTING or ABORTING)."""
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
            f"transaction action must be TxnAction.COMMIT/ABORT or 'commit'/'abort', got {value!r}",
            argument="action",
            value=value,
        )


#: SPEC §4.3: OPEN -> OPEN|COMMITTING|ABORTING; COMMITTING -> COMMITTED;
#: ABORTING -> ABORTED; staying in the same status is a no-op success.
ALLOWED: dict[TxnStatus, frozenset[TxnStatus]] = {
    TxnStatus.OPEN: frozenset({TxnStatus.OPEN, TxnStatus.COMMITTING, TxnStatus.ABORTING}),
    TxnStatus.COMMITTING: frozenset({TxnStatus.COMMITTING, TxnStatus.COMMITTED}),
    TxnStatus.COMMITTED: frozenset({TxnStatus.COMMITTED}),
    TxnStatus.ABORTING: frozenset({TxnStatus.ABORTING, TxnStatus.ABORTED}),
    TxnStatus.ABORTED: frozenset({TxnStatus.ABORTED}),
}


def can_transition(current: TxnStatus, new: TxnStatus) -> bool:
    """Tell whether ``current -> new`` is allowed (same status counts as allowed)."""
    return new in ALLOWED[current]


def check_transition(txn_id: object, current: TxnStatus, new: TxnStatus) -> bool:
    """Validate ``current -> new``; return True when it changes the status.

    Returns False for a no-op (``current == new``); raises
    :class:`~txnstream.errors.InvalidTxnStatusError` naming the transaction and
    both statuses when the transition is not allowed.
    """
    if new not in ALLOWED[current]:
        raise InvalidTxnStatusError(
            f"transaction {txn_id} cannot go from {current.name} to {new.name}",
            txn_id=txn_id,
            current=current,
            requested=new,
        )
    return current != new


#: Names a transaction holds in a list up to this many; beyond, in a dict
#: (insertion-ordered, O(1) membership), so adding n names costs O(n).
_SMALL = 8


def _add_names(have: list[Any] | dict[Any, None] | None, names: list[Any]) -> list[Any]:
    """Return the names of ``names`` (in order, once each) that ``have`` lacks."""
    if len(names) == 1:  # the common call: one name
        return [] if have and names[0] in have else names
    new = list(dict.fromkeys(names))
    if have:
        new = [n for n in new if n not in have]
    return new


def _merged(
    have: list[Any] | dict[Any, None] | None, new: list[Any]
) -> list[Any] | dict[Any, None]:
    if have is None:
        have = []
    if isinstance(have, list):
        if len(have) + len(new) <= _SMALL:
            have.extend(new)
            return have
        have = dict.fromkeys(have)
    have.update(dict.fromkeys(new))
    return have


class TxnMeta:
    """Live state of one transaction (guarded by the transaction table's lock).

    Thousands may be live at once, so it uses ``__slots__``, stores the
    coordinator-local sequence only, keeps names as ``None`` until first
    added, and keeps its records' log positions as the writer's own
    ``TxnPosition`` objects (a recovered transaction's sit in one shared
    columnar table instead: ``span``, see :mod:`.state`).
    """

    __slots__ = (
        "adds",
        "client_name",
        "deadline",
        "decided_at",
        "done",
        "driver",
        "failed",
        "in_doubt",
        "last_modified",
        "participants_done",
        "partitions",
        "pending",
        "pending_timed_out",
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
        deadline: int,
        client_name: str | None,
        status: TxnStatus = TxnStatus.OPEN,
        pending: TxnStatus | None = None,
    ) -> None:
        self.seq = seq
        #: Last status whose record is durable.
        self.status = status
        #: Status whose record is in flight (or in doubt), or None.
        self.pending = pending
        #: ``pending`` may be durable although its write did not report so.
        self.in_doubt = False
        self.timed_out = False
        self.pending_timed_out = False
        self.timeout_ms = timeout_ms
        #: Wall-clock ms (logged); ``deadline`` is monotonic ms (in-process).
        self.start_time = start_time
        self.last_modified = start_time
        self.deadline = deadline
        #: Monotonic ms at which the end was decided (end latency).
        self.decided_at = 0
        self.client_name = client_name
        self.partitions: list[str] | dict[str, None] | None = None
        self.subscriptions: list[tuple[str, str]] | dict[tuple[str, str], None] | None = None
        self.positions: list[TxnPosition] = []
        #: Index of its slice of the recovered position table; -1: none.
        self.span = -1
        #: NEW/ADD records in flight (an end waits for them before deciding).
        self.adds = 0
        #: A record written without waiting (``begin``, ``add_*_nowait``)
        #: failed: the transaction may lack a participant in the log, so it
        #: can only abort.
        self.failed: BaseException | None = None
        #: Some thread drives the end; waiters block on ``done``.
        self.driver = False
        self.done: threading.Event | None = None
        #: Cancellation handle of the armed timeout (OPEN) or of the next
        #: background run of a stalled end (COMMITTING/ABORTING).
        self.timer: object | None = None
        #: Background runs of the end that failed (backoff).
        self.retries = 0
        #: Every participant has ended it (only the final steps remain).
        self.participants_done = False

    @property
    def visible(self) -> bool:
        """False while its NEW record is in flight (the client has no id yet)."""
        return self.pending is not TxnStatus.OPEN

    @property
    def decision(self) -> TxnStatus | None:
        """COMMITTING/ABORTING once the end is decided durably (or in doubt), else None."""
        if self.status.is_ending:
            return self.status
        if self.in_doubt and self.pending is not None and self.pending.is_ending:
            return self.pending
        return None

    @property
    def deciding(self) -> bool:
        """An ending UPDATE is in flight and not in doubt (it may still fail)."""
        return self.pending is not None and self.pending.is_ending and not self.in_doubt

    def new_partitions(self, names: list[str]) -> list[str]:
        """Partitions of ``names`` it does not have yet (in order, once each)."""
        return _add_names(self.partitions, names)

    def new_subscriptions(self, subs: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """Subscriptions of ``subs`` it does not have yet (in order, once each)."""
        return _add_names(self.subscriptions, subs)

    def add_partitions(self, names: list[str]) -> None:
        """Record durably added partitions (ignoring ones it has)."""
        self.partitions = _merged(self.partitions, self.new_partitions(names))

    def add_subscriptions(self, subs: list[tuple[str, str]]) -> None:
        """Record durably added subscriptions (ignoring ones it has)."""
        self.subscriptions = _merged(self.subscriptions, self.new_subscriptions(subs))

    def partition_list(self) -> list[str]:
        """Its partitions in the order they were added."""
        return list(self.partitions or ())

    def subscription_list(self) -> list[tuple[str, str]]:
        """Its subscriptions in the order they were added."""
        return list(self.subscriptions or ())

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

    ``status`` is the last durable status (a decision still being logged
    shows as OPEN). Times are wall-clock milliseconds as logged. For a
    transaction only remembered by the terminated store, ``partitions`` and
    ``subscriptions`` are empty and ``start_time`` is 0.
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


# ----------------------------------------------------------------- arguments
#
# What valid input for a transaction is. Bad input is an InvalidArgumentError
# (also a ValueError and a TypeError) naming the argument and the value,
# raised before anything is changed.


def bad_argument(argument: str, value: object, what: str) -> InvalidArgumentError:
    """Return the error for ``argument`` = ``value``, which must be ``what``."""
    return InvalidArgumentError(
        f"{argument} must be {what}, got {value!r}", argument=argument, value=value
    )


def is_int(value: object) -> bool:
    """Tell whether ``value`` is an int (and not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool)


def txn_id_arg(txn_id: object) -> TxnID:
    """Return ``txn_id`` if it is a :class:`TxnID`."""
    if not isinstance(txn_id, TxnID):
        raise bad_argument("txn_id", txn_id, "a TxnID")
    return txn_id


def tc_id_arg(tc_id: object) -> int:
    """Return ``tc_id`` if it is an int in ``0..2**64-1``."""
    if not is_int(tc_id) or not 0 <= tc_id <= _U64:  # type: ignore[operator]
        raise bad_argument("tc_id", tc_id, "an unsigned 64-bit integer")
    return tc_id  # type: ignore[return-value]


def timeout_arg(timeout_ms: object, max_timeout_ms: int) -> int:
    """Return ``timeout_ms`` if it is an int in ``1..max_timeout_ms``."""
    if not is_int(timeout_ms) or not 0 < timeout_ms <= max_timeout_ms:  # type: ignore[operator]
        raise bad_argument("timeout_ms", timeout_ms, f"an integer in 1..{max_timeout_ms}")
    return timeout_ms  # type: ignore[return-value]


def is_text(value: object) -> bool:
    """Tell whether ``value`` is a non-empty str that encodes as UTF-8 (no lone surrogates)."""
    if not isinstance(value, str) or not value:
        return False
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def client_arg(client_name: object) -> str | None:
    """Return the client name (None for none or empty); it must be valid UTF-8 text."""
    if client_name is None or client_name == "":
        return None
    if not is_text(client_name):
        raise bad_argument("client_name", client_name, "a string of valid UTF-8 text or None")
    return client_name  # type: ignore[return-value]


def partition_names(partitions: object) -> list[str]:
    """Return the partition names as a list of non-empty strings."""
    if isinstance(partitions, str):
        names: list[object] = [partitions]
    elif isinstance(partitions, Iterable) and not isinstance(partitions, bytes | bytearray):
        names = list(partitions)
    else:
        raise bad_argument("partitions", partitions, "an iterable of partition names")
    for p in names:
        if not is_text(p):
            raise bad_argument("partitions", p, "non-empty strings of valid UTF-8 text")
    return names  # type: ignore[return-value]


def subscription_pairs(subscriptions: object) -> list[tuple[str, str]]:
    """Return ``(topic, subscription)`` pairs of non-empty strings."""
    if not isinstance(subscriptions, Iterable) or isinstance(subscriptions, str | bytes):
        raise bad_argument(
            "subscriptions", subscriptions, "an iterable of (topic, subscription) pairs"
        )
    subs: list[tuple[str, str]] = []
    for s in subscriptions:
        pair = (s.topic, s.subscription) if isinstance(s, Subscription) else s
        if not isinstance(pair, tuple) or len(pair) != 2 or not all(is_text(x) for x in pair):
            raise bad_argument(
                "subscriptions", s, "(topic, subscription) pairs of non-empty UTF-8 strings"
            )
        subs.append(pair)
    return subs


def count_arg(count: object) -> int:
    """Return ``count`` if it is an int in ``0..MAX_BATCH``."""
    if not is_int(count) or not 0 <= count <= MAX_BATCH:  # type: ignore[operator]
        raise bad_argument("count", count, f"an integer in 0..{MAX_BATCH}")
    return count  # type: ignore[return-value]


def items_arg(items: object) -> list[tuple[Any, Any]]:
    """Return the ``(txn_id, value)`` pairs of a bulk call."""
    if not isinstance(items, Iterable) or isinstance(items, str | bytes):
        raise bad_argument("items", items, "an iterable of (txn_id, value) pairs")
    out: list[tuple[Any, Any]] = []
    for item in items:
        if not isinstance(item, tuple) or len(item) != 2:
            raise bad_argument("items", item, "(txn_id, value) pairs")
        out.append(item)
    return out


__all__ = [
    "ALLOWED",
    "MAX_BATCH",
    "TransactionInfo",
    "TxnAction",
    "TxnID",
    "TxnMeta",
    "TxnStatus",
    "bad_argument",
    "can_transition",
    "check_transition",
    "client_arg",
    "count_arg",
    "is_int",
    "is_text",
    "items_arg",
    "partition_names",
    "subscription_pairs",
    "tc_id_arg",
    "timeout_arg",
    "txn_id_arg",
]
