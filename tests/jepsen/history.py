"""Histories of a consume-transform-produce workload on a transactional log.

An *operation* is one transaction (or one non-transactional call) of one logical,
single-threaded client *process*: a sequence of micro-operations

- :class:`Poll`: a receive that returned ``value`` from ``(topic, partition)`` at
  ``position``;
- :class:`Send`: a send of ``value`` to ``topic`` (routing ``key``), with the
  ``(partition, position)`` of the returned ``MessageId`` once known, and the input
  value it was derived from (``source``) in a consume-transform-produce step;
- :class:`Ack`: an ack of a received input,

and a final type: ``ok`` (it definitely happened: committed), ``fail`` (it
definitely did not: aborted) or ``info`` (unknown: the process crashed or the
commit timed out). Every value written is unique, so each read traces back to the
one operation that wrote it. Operations of phase ``final`` are the closing reads
of every partition from the beginning to its end.

Positions are tuples ordered like ``MessageId`` within a partition:
``(ledger_id, entry_id, batch_index)``.

On disk a history is JSON lines of *events* (:class:`HistoryWriter`), one line per
step, written with a single ``write`` to an ``O_APPEND`` file: a worker killed with
``kill -9`` leaves every completed step behind, and at most a torn last line,
which :func:`load_history` drops. An operation without a ``complete`` event became
``info``: its fate is unknown.

Events (``"e"`` names the kind; ``"op"`` the operation id)::

    {"e": "spec", "input_topics": [...], "output_topics": [...]}
    {"e": "invoke", "op": "w1.7", "process": "w1", "consumer": "w1-c0",
     "isolation": "read_committed", "phase": "workload", "transactional": true}
    {"e": "poll", "op": ..., "topic": ..., "partition": 0, "position": [0, 5, 0], "value": ...}
    {"e": "send", "op": ..., "topic": ..., "value": ..., "key": ..., "source": ...}
    {"e": "sent", "op": ..., "value": ..., "partition": 1, "position": [0, 9, 0]}
    {"e": "ack", "op": ..., "topic": ..., "partition": 0, "position": [0, 5, 0], "value": ...}
    {"e": "complete", "op": ..., "type": "ok", "error": null}

``send`` is written *before* the call (the value is known even if the process dies
inside it), ``sent`` after it returned the message id.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, TypeAlias

Position: TypeAlias = tuple[int, ...]
"""A position within one partition, ordered like a ``MessageId`` there."""

Key: TypeAlias = tuple[str, int]
"""``(topic, partition)``: one log, the unit of ordering."""

OpType: TypeAlias = Literal["ok", "fail", "info"]
Isolation: TypeAlias = Literal["read_committed", "read_uncommitted"]
Phase: TypeAlias = Literal["setup", "workload", "final"]

OP_TYPES: tuple[OpType, ...] = ("ok", "fail", "info")
ISOLATIONS: tuple[Isolation, ...] = ("read_committed", "read_uncommitted")
PHASES: tuple[Phase, ...] = ("setup", "workload", "final")


class HistoryFormatError(ValueError):
    """A history file or event that cannot be read (other than a torn last line)."""


@dataclass(frozen=True)
class Poll:
    """A receive that returned ``value`` from ``(topic, partition)`` at ``position``."""

    topic: str
    partition: int
    position: Position
    value: str

    @property
    def key(self) -> Key:
        """The log this read came from."""
        return (self.topic, self.partition)


@dataclass(frozen=True)
class Send:
    """A send of ``value`` to ``topic``.

    ``key`` is the message key (routing); ``partition`` and ``position`` come from the
    returned ``MessageId`` and are ``None`` when the call never returned. ``source``
    is the input value a consume-transform-produce step derived this output from.
    """

    topic: str
    value: str
    key: str | None = None
    source: str | None = None
    partition: int | None = None
    position: Position | None = None

    @property
    def log(self) -> Key | None:
        """The log this value landed in, when the send returned."""
        return None if self.partition is None else (self.topic, self.partition)


@dataclass(frozen=True)
class Ack:
    """An ack (inside the operation's transaction, if any) of a received input."""

    topic: str
    partition: int
    position: Position
    value: str


MicroOp: TypeAlias = Poll | Send | Ack


@dataclass(frozen=True)
class Operation:
    """One transaction (or non-transactional calls) of one logical process.

    ``consumer`` names the consumer the polls went through (a process that restarts
    gets a new one); ``isolation`` is that consumer's isolation level.
    ``transactional`` is False for plain sends, each durable on its own (seeding).
    """

    id: str
    process: str
    type: OpType
    ops: tuple[MicroOp, ...] = ()
    consumer: str | None = None
    isolation: Isolation = "read_committed"
    phase: Phase = "workload"
    error: str | None = None
    transactional: bool = True

    @property
    def polls(self) -> tuple[Poll, ...]:
        """The receives of this operation, in order."""
        return tuple(m for m in self.ops if isinstance(m, Poll))

    @property
    def sends(self) -> tuple[Send, ...]:
        """The sends of this operation, in order."""
        return tuple(m for m in self.ops if isinstance(m, Send))

    @property
    def acks(self) -> tuple[Ack, ...]:
        """The acks of this operation, in order."""
        return tuple(m for m in self.ops if isinstance(m, Ack))


@dataclass(frozen=True)
class CtpSpec:
    """The consume-transform-produce shape: each input yields one output per output topic.

    Outputs name their input in :attr:`Send.source`.
    """

    input_topics: tuple[str, ...]
    output_topics: tuple[str, ...]


@dataclass(frozen=True)
class History:
    """Operations in the order they were invoked (per process and consumer, real order)."""

    operations: tuple[Operation, ...]
    ctp: CtpSpec | None = None

    def __iter__(self) -> Iterator[Operation]:
        return iter(self.operations)

    def __len__(self) -> int:
        return len(self.operations)

    @property
    def has_final_phase(self) -> bool:
        """Whether the history ends with reads of every partition from the beginning."""
        return any(op.phase == "final" for op in self.operations)


# ----------------------------------------------------------------------------- encoding


def _pos_json(position: Position | None) -> list[int] | None:
    return None if position is None else list(position)


def _invoke_event(
    op_id: str,
    process: str,
    consumer: str | None,
    isolation: Isolation,
    phase: Phase,
    transactional: bool,
) -> dict[str, Any]:
    return {
        "e": "invoke",
        "op": op_id,
        "process": process,
        "consumer": consumer,
        "isolation": isolation,
        "phase": phase,
        "transactional": transactional,
    }


def _located_event(op_id: str, m: Poll | Ack) -> dict[str, Any]:
    return {
        "e": "poll" if isinstance(m, Poll) else "ack",
        "op": op_id,
        "topic": m.topic,
        "partition": m.partition,
        "position": list(m.position),
        "value": m.value,
    }


def _send_event(
    op_id: str, topic: str, value: str, key: str | None, source: str | None
) -> dict[str, Any]:
    return {"e": "send", "op": op_id, "topic": topic, "value": value, "key": key, "source": source}


def _sent_event(
    op_id: str, value: str, partition: int | None, position: Position | None
) -> dict[str, Any]:
    return {
        "e": "sent",
        "op": op_id,
        "value": value,
        "partition": partition,
        "position": _pos_json(position),
    }


def _complete_event(op_id: str, type_: OpType, error: str | None) -> dict[str, Any]:
    return {"e": "complete", "op": op_id, "type": type_, "error": error}


def operation_events(op: Operation) -> list[dict[str, Any]]:
    """The events that record ``op`` (what a worker writes step by step)."""
    events = [
        _invoke_event(op.id, op.process, op.consumer, op.isolation, op.phase, op.transactional)
    ]
    for m in op.ops:
        if isinstance(m, Send):
            events.append(_send_event(op.id, m.topic, m.value, m.key, m.source))
            if m.partition is not None or m.position is not None:
                events.append(_sent_event(op.id, m.value, m.partition, m.position))
        else:
            events.append(_located_event(op.id, m))
    events.append(_complete_event(op.id, op.type, op.error))
    return events


def history_events(history: History) -> list[dict[str, Any]]:
    """Every event of ``history``, operation after operation."""
    events: list[dict[str, Any]] = []
    if history.ctp is not None:
        events.append(_spec_event(history.ctp))
    for op in history.operations:
        events.extend(operation_events(op))
    return events


def _spec_event(spec: CtpSpec) -> dict[str, Any]:
    return {
        "e": "spec",
        "input_topics": list(spec.input_topics),
        "output_topics": list(spec.output_topics),
    }


def dump_history(history: History, path: Path) -> None:
    """Write ``history`` as JSON lines to ``path`` (replacing it)."""
    with path.open("w", encoding="utf-8") as f:
        for event in history_events(history):
            f.write(json.dumps(event, separators=(",", ":")) + "\n")


# ------------------------------------------------------------------------------ writing


class HistoryWriter:
    """Appends events to a JSON-lines file, one ``write`` per line.

    The file is opened ``O_APPEND``: a line is in the file once :meth:`event`
    returns, so a ``kill -9`` loses nothing already recorded (the page cache
    survives the process). Several threads may share one writer.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def event(self, event: Mapping[str, Any]) -> None:
        """Append one event as one line."""
        if self._fd is None:
            raise ValueError(f"history writer for {self.path} is closed")
        data = (json.dumps(event, separators=(",", ":")) + "\n").encode()
        written = os.write(self._fd, data)
        if written != len(data):
            raise OSError(f"short write to {self.path}: {written} of {len(data)} bytes")

    def spec(self, spec: CtpSpec) -> None:
        """Record the workload's consume-transform-produce shape."""
        self.event(_spec_event(spec))

    def invoke(
        self,
        op_id: str,
        process: str,
        *,
        consumer: str | None = None,
        isolation: Isolation = "read_committed",
        phase: Phase = "workload",
        transactional: bool = True,
    ) -> None:
        """Record the start of operation ``op_id``."""
        self.event(_invoke_event(op_id, process, consumer, isolation, phase, transactional))

    def poll(self, op_id: str, poll: Poll) -> None:
        """Record a receive that returned a message."""
        self.event(_located_event(op_id, poll))

    def send(
        self,
        op_id: str,
        topic: str,
        value: str,
        *,
        key: str | None = None,
        source: str | None = None,
    ) -> None:
        """Record a send about to be made (before the call: the value is known)."""
        self.event(_send_event(op_id, topic, value, key, source))

    def sent(self, op_id: str, value: str, partition: int, position: Position) -> None:
        """Record where a send recorded by :meth:`send` landed."""
        self.event(_sent_event(op_id, value, partition, position))

    def ack(self, op_id: str, ack: Ack) -> None:
        """Record an ack of a received input."""
        self.event(_located_event(op_id, ack))

    def complete(self, op_id: str, type_: OpType, error: str | None = None) -> None:
        """Record the end of operation ``op_id``: ``ok``, ``fail`` or ``info``."""
        self.event(_complete_event(op_id, type_, error))

    def operation(self, op: Operation) -> None:
        """Record a whole operation at once (final reads, setup)."""
        for event in operation_events(op):
            self.event(event)

    def close(self) -> None:
        """Close the file; later events raise."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# ------------------------------------------------------------------------------ reading


def read_events(path: Path) -> list[dict[str, Any]]:
    """The events of one file; a torn last line (a write cut by a crash) is dropped.

    A line that does not parse anywhere else is damage, not a crash:
    :class:`HistoryFormatError` names the file and line.
    """
    text = path.read_bytes().decode("utf-8", errors="replace")
    lines = text.split("\n")
    events: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        last = number == len(lines)  # no newline after it: the write may have been cut
        try:
            event = json.loads(line)
        except json.JSONDecodeError as e:
            if last:
                break
            raise HistoryFormatError(f"{path}:{number}: not JSON: {line[:80]!r}") from e
        if not isinstance(event, dict):
            raise HistoryFormatError(f"{path}:{number}: not an object: {line[:80]!r}")
        events.append(event)
    return events


def _get(event: Mapping[str, Any], name: str, kind: type[Any]) -> Any:
    value = event.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise HistoryFormatError(f"event {dict(event)!r}: {name!r} must be {kind.__name__}")
    return value


def _opt_str(event: Mapping[str, Any], name: str) -> str | None:
    return None if event.get(name) is None else str(_get(event, name, str))


def _position(event: Mapping[str, Any]) -> Position:
    raw = _get(event, "position", list)
    if not raw or not all(isinstance(x, int) and not isinstance(x, bool) for x in raw):
        raise HistoryFormatError(f"event {dict(event)!r}: position must be a list of ints")
    return tuple(raw)


def _located(event: Mapping[str, Any]) -> tuple[str, int, Position, str]:
    """``(topic, partition, position, value)`` of a poll or ack event."""
    return (
        str(_get(event, "topic", str)),
        int(_get(event, "partition", int)),
        _position(event),
        str(_get(event, "value", str)),
    )


def _choice(event: Mapping[str, Any], name: str, allowed: Sequence[str]) -> str:
    value = _get(event, name, str)
    if value not in allowed:
        raise HistoryFormatError(f"event {dict(event)!r}: {name} must be one of {allowed}")
    return str(value)


@dataclass
class _OpBuilder:
    id: str
    process: str
    consumer: str | None
    isolation: Isolation
    phase: Phase
    transactional: bool
    ops: list[MicroOp] = field(default_factory=list)
    type: OpType | None = None
    error: str | None = None

    def build(self) -> Operation:
        return Operation(
            id=self.id,
            process=self.process,
            type=self.type if self.type is not None else "info",
            ops=tuple(self.ops),
            consumer=self.consumer,
            isolation=self.isolation,
            phase=self.phase,
            transactional=self.transactional,
            error=self.error
            if self.type is not None
            else "no completion recorded (the process died)",
        )


def history_from_events(events: Iterable[Mapping[str, Any]]) -> History:
    """Fold events into operations (in invoke order); unfinished ones become ``info``."""
    builders: dict[str, _OpBuilder] = {}
    spec: CtpSpec | None = None
    for event in events:
        kind = event.get("e")
        if kind == "spec":
            spec = CtpSpec(
                tuple(str(t) for t in _get(event, "input_topics", list)),
                tuple(str(t) for t in _get(event, "output_topics", list)),
            )
            continue
        op_id = str(_get(event, "op", str))
        if kind == "invoke":
            if op_id in builders:
                raise HistoryFormatError(f"operation {op_id!r} invoked twice")
            builders[op_id] = _OpBuilder(
                id=op_id,
                process=str(_get(event, "process", str)),
                consumer=_opt_str(event, "consumer"),
                isolation=_choice(event, "isolation", ISOLATIONS),  # type: ignore[arg-type]
                phase=_choice(event, "phase", PHASES),  # type: ignore[arg-type]
                transactional=bool(_get(event, "transactional", bool))
                if "transactional" in event
                else True,
            )
            continue
        b = builders.get(op_id)
        if b is None:
            raise HistoryFormatError(f"event {dict(event)!r} for an operation never invoked")
        if b.type is not None:
            raise HistoryFormatError(f"event {dict(event)!r} after operation {op_id!r} completed")
        if kind == "poll":
            b.ops.append(Poll(*_located(event)))
        elif kind == "ack":
            b.ops.append(Ack(*_located(event)))
        elif kind == "send":
            b.ops.append(
                Send(
                    topic=str(_get(event, "topic", str)),
                    value=str(_get(event, "value", str)),
                    key=_opt_str(event, "key"),
                    source=_opt_str(event, "source"),
                )
            )
        elif kind == "sent":
            _apply_sent(b, event)
        elif kind == "complete":
            b.type = _choice(event, "type", OP_TYPES)  # type: ignore[assignment]
            b.error = _opt_str(event, "error")
        else:
            raise HistoryFormatError(f"unknown event kind {kind!r} in {dict(event)!r}")
    return History(tuple(b.build() for b in builders.values()), spec)


def _apply_sent(b: _OpBuilder, event: Mapping[str, Any]) -> None:
    value = str(_get(event, "value", str))
    partition = None if event.get("partition") is None else int(_get(event, "partition", int))
    position = None if event.get("position") is None else _position(event)
    for i in range(len(b.ops) - 1, -1, -1):
        m = b.ops[i]
        if isinstance(m, Send) and m.value == value and m.partition is None and m.position is None:
            b.ops[i] = replace(m, partition=partition, position=position)
            return
    raise HistoryFormatError(f"'sent' of {value!r} in {b.id!r} without an earlier 'send'")


def load_history(*paths: Path) -> History:
    """Read and fold the events of ``paths`` (e.g. one file per worker generation)."""
    events: list[dict[str, Any]] = []
    for path in paths:
        events.extend(read_events(path))
    return history_from_events(events)
