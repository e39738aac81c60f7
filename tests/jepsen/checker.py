"""Decide the anomalies of a transactional-log history (``shared/reference/jepsen-checker.md``).

:func:`check` reads a :class:`~tests.jepsen.history.History` and returns a
:class:`CheckResult`: one list of :class:`Anomaly` per kind, each naming its
evidence (values, positions, operation ids), a ``valid`` flag and a readable
:meth:`CheckResult.summary`.

The facts everything is decided from, in order:

1. **Writers.** Every value is written once, so each value maps to the one
   operation and :class:`Send` that wrote it (a value sent twice is a workload bug:
   :class:`ValueError`).
2. **Reads are observations.** A receive that returned a message happened, whatever
   became of the transaction it was in; so reads of ``fail`` and ``info`` operations
   count as reads. Reads through a ``read_uncommitted`` consumer are evidence about
   positions only (they may legitimately see anything).
3. **Status of a writer:** ``ok`` → committed, ``fail`` → aborted, ``info`` →
   committed once any read_committed read by *another* operation returned any of its
   writes, else unknown (treated as not committed).
4. **Offsets.** Per log (topic, partition): position → values, from every read and
   every send of a committed operation whose message id came back (the reference's
   "plus the writes of operations known to have committed": the id a failed write
   got back names no message, and a log may hand its position out again).
5. **Version order.** Per log, the positions holding at least one committed value,
   ranked with gaps removed: a value's *index*. Markers, aborted and unknown writes
   take no rank, so a read_committed consumer that passes over them does not skip.

The anomalies, each decided from those facts:

- ``inconsistent_offsets``: one position holds two different values.
- ``duplicates``: one value at two positions (or in two logs).
- ``aborted_reads`` (G1a): a read_committed read returned a value whose writer failed.
- ``own_uncommitted_reads``: a read_committed read returned a value written by the
  same operation (its own, not yet committed, write).
- ``lost_writes``: per log, the highest index any read_committed read reached; a
  committed value at or below it that no read_committed read returned is lost.
- ``nonmonotonic_polls`` / ``skipped_polls``: per consumer and log, consecutive
  read_committed reads (inside one operation and across its operations) must advance
  by exactly one index; going back or staying is non-monotonic, jumping is a skip
  (the values passed over are named). After an operation of that consumer ends
  ``fail`` or ``info``, its next read may start anywhere: an abort hands the acked
  inputs back for redelivery.
- ``nonmonotonic_sends``: per process and log, the positions its committed sends got
  back must increase in the order it sent.
- ``torn_transactions`` (with a final phase): a committed transaction some of whose
  writes were read and others never, within one log or across logs.
- ``unseen`` (with a final phase): committed values never read by the end that are
  neither lost nor part of a torn transaction.
- ``g1c_cycles``: a cycle among committed operations of write→read dependencies
  (T1 wrote what T2 read), which read-committed forbids.
- ``exactly_once`` (with a :class:`~tests.jepsen.history.CtpSpec` and a final
  phase): every committed input has exactly one read output per output topic whose
  ``source`` is that input, and is acked by exactly one committed operation; an output
  naming an input nobody wrote is reported too.
- ``phantom_reads``: a read returned a value no operation wrote.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from itertools import pairwise
from typing import Literal, TypeAlias

from tests.jepsen.history import History, Key, Operation, Poll, Position, Send

AnomalyKind: TypeAlias = Literal[
    "inconsistent_offsets",
    "duplicates",
    "aborted_reads",
    "own_uncommitted_reads",
    "lost_writes",
    "nonmonotonic_polls",
    "skipped_polls",
    "nonmonotonic_sends",
    "torn_transactions",
    "unseen",
    "g1c_cycles",
    "exactly_once",
    "phantom_reads",
]

Status: TypeAlias = Literal["committed", "aborted", "unknown"]


@dataclass(frozen=True)
class Anomaly:
    """One anomaly with its evidence: the values, positions and operations involved."""

    kind: AnomalyKind
    message: str
    key: Key | None = None
    values: tuple[str, ...] = ()
    positions: tuple[Position, ...] = ()
    ops: tuple[str, ...] = ()


@dataclass
class CheckResult:
    """Per-anomaly lists; the history is valid when every list is empty."""

    inconsistent_offsets: list[Anomaly] = field(default_factory=list)
    duplicates: list[Anomaly] = field(default_factory=list)
    aborted_reads: list[Anomaly] = field(default_factory=list)
    own_uncommitted_reads: list[Anomaly] = field(default_factory=list)
    lost_writes: list[Anomaly] = field(default_factory=list)
    nonmonotonic_polls: list[Anomaly] = field(default_factory=list)
    skipped_polls: list[Anomaly] = field(default_factory=list)
    nonmonotonic_sends: list[Anomaly] = field(default_factory=list)
    torn_transactions: list[Anomaly] = field(default_factory=list)
    unseen: list[Anomaly] = field(default_factory=list)
    g1c_cycles: list[Anomaly] = field(default_factory=list)
    exactly_once: list[Anomaly] = field(default_factory=list)
    phantom_reads: list[Anomaly] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)

    def by_kind(self) -> dict[str, list[Anomaly]]:
        """Every anomaly list by its kind name (empty ones too)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "stats"}

    def kinds(self) -> set[str]:
        """The kinds that were found."""
        return {kind for kind, found in self.by_kind().items() if found}

    @property
    def valid(self) -> bool:
        """No anomaly of any kind."""
        return not self.kinds()

    def add(self, anomaly: Anomaly) -> None:
        """File ``anomaly`` under its kind."""
        getattr(self, anomaly.kind).append(anomaly)

    def summary(self, max_each: int = 5) -> str:
        """A readable report: the counts, then up to ``max_each`` anomalies of each kind."""
        s = self.stats
        lines = [
            f"valid: {self.valid}",
            f"operations: {s.get('ok', 0)} ok, {s.get('fail', 0)} fail, {s.get('info', 0)} info "
            f"({s.get('info_committed', 0)} info counted as committed); "
            f"{s.get('committed_values', 0)} committed values, "
            f"{s.get('read_committed_reads', 0)} read_committed reads",
        ]
        for kind, found in self.by_kind().items():
            if not found:
                continue
            lines.append(f"{kind}: {len(found)}")
            lines.extend(f"  - {a.message}" for a in found[:max_each])
            if len(found) > max_each:
                lines.append(f"  ... and {len(found) - max_each} more")
        return "\n".join(lines)


# ------------------------------------------------------------------------------- facts


@dataclass
class _Read:
    op: Operation
    poll: Poll


@dataclass
class _Facts:
    """What the anomalies are decided from (module docstring, steps 1-5)."""

    history: History
    writer: dict[str, tuple[Operation, Send]]
    rc_reads: list[_Read]
    rc_readers: dict[str, list[_Read]]  # value -> its read_committed reads by other ops
    status: dict[str, Status]  # op id -> status
    offsets: dict[Key, dict[Position, dict[str, list[str]]]]  # value -> evidence lines
    rank: dict[Key, dict[Position, int]]
    ranked: dict[Key, list[Position]]

    def value_status(self, value: str) -> Status | None:
        """The status of ``value``'s writer; None when no operation wrote it."""
        w = self.writer.get(value)
        return None if w is None else self.status[w[0].id]

    def own(self, op: Operation, poll: Poll) -> bool:
        """Whether ``poll`` returned a value ``op`` itself wrote."""
        w = self.writer.get(poll.value)
        return w is not None and w[0].id == op.id

    def committed_values(self) -> Iterable[tuple[Operation, Send]]:
        """The writes of committed operations, in history order."""
        for op in self.history:
            if self.status[op.id] == "committed":
                for send in op.sends:
                    yield op, send

    def values_at_ranks(self, key: Key, lo: int, hi: int) -> list[str]:
        """Committed values whose index on ``key`` is in ``lo..hi`` (inclusive)."""
        out: list[str] = []
        for pos in self.ranked[key][max(lo, 0) : hi + 1]:
            out.extend(v for v in self.offsets[key][pos] if self.value_status(v) == "committed")
        return out


def _facts(history: History) -> _Facts:
    writer: dict[str, tuple[Operation, Send]] = {}
    for op in history:
        for send in op.sends:
            if send.value in writer:
                other = writer[send.value][0].id
                raise ValueError(
                    f"value {send.value!r} is sent by {other!r} and again by {op.id!r}: "
                    "a workload must write unique values"
                )
            writer[send.value] = (op, send)

    rc_reads = [
        _Read(op, p) for op in history if op.isolation == "read_committed" for p in op.polls
    ]
    rc_readers: dict[str, list[_Read]] = defaultdict(list)
    for r in rc_reads:
        w = writer.get(r.poll.value)
        if w is None or w[0].id != r.op.id:
            rc_readers[r.poll.value].append(r)

    status: dict[str, Status] = {}
    for op in history:
        if op.type == "ok":
            status[op.id] = "committed"
        elif op.type == "fail":
            status[op.id] = "aborted"
        else:
            seen = any(rc_readers.get(s.value) for s in op.sends)
            status[op.id] = "committed" if seen else "unknown"

    offsets: dict[Key, dict[Position, dict[str, list[str]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list))
    )
    for op in history:
        for m in op.ops:
            if isinstance(m, Poll):
                offsets[m.key][m.position][m.value].append(f"read by {op.id}")
            elif (
                isinstance(m, Send)
                and m.log is not None
                and m.position is not None
                and status[op.id] == "committed"
            ):
                offsets[m.log][m.position][m.value].append(f"sent by {op.id}")

    rank: dict[Key, dict[Position, int]] = {}
    ranked: dict[Key, list[Position]] = {}
    for key, by_pos in offsets.items():
        positions = sorted(
            pos
            for pos, values in by_pos.items()
            if any(
                writer.get(v) is not None and status[writer[v][0].id] == "committed" for v in values
            )
        )
        ranked[key] = positions
        rank[key] = {pos: i for i, pos in enumerate(positions)}
    return _Facts(history, writer, rc_reads, dict(rc_readers), status, offsets, rank, ranked)


# --------------------------------------------------------------------------- anomalies


def _offset_anomalies(f: _Facts, result: CheckResult) -> None:
    """Inconsistent offsets (a position with two values) and duplicates (a value twice)."""
    where: dict[str, list[tuple[Key, Position]]] = defaultdict(list)
    for key, by_pos in sorted(f.offsets.items()):
        for pos, values in sorted(by_pos.items()):
            if len(values) > 1:
                detail = "; ".join(f"{v!r} ({', '.join(ev)})" for v, ev in values.items())
                result.add(
                    Anomaly(
                        "inconsistent_offsets",
                        f"{key} position {pos} holds {len(values)} values: {detail}",
                        key=key,
                        values=tuple(values),
                        positions=(pos,),
                    )
                )
            for v in values:
                where[v].append((key, pos))
    for value, places in where.items():
        if len(places) > 1:
            result.add(
                Anomaly(
                    "duplicates",
                    f"value {value!r} appears at {len(places)} positions: {places}",
                    key=places[0][0],
                    values=(value,),
                    positions=tuple(p for _, p in places),
                    ops=_ops_of(f, value),
                )
            )


def _ops_of(f: _Facts, value: str) -> tuple[str, ...]:
    w = f.writer.get(value)
    return () if w is None else (w[0].id,)


def _read_anomalies(f: _Facts, result: CheckResult) -> None:
    """Aborted reads (G1a), reads of the reader's own uncommitted write, phantom reads."""
    for r in f.rc_reads:
        w = f.writer.get(r.poll.value)
        if w is None:
            continue
        wop = w[0]
        if wop.id == r.op.id:
            result.add(
                Anomaly(
                    "own_uncommitted_reads",
                    f"{r.op.id} ({r.op.consumer}) read its own write {r.poll.value!r} "
                    f"at {r.poll.key} {r.poll.position} under read_committed",
                    key=r.poll.key,
                    values=(r.poll.value,),
                    positions=(r.poll.position,),
                    ops=(r.op.id,),
                )
            )
        elif f.status[wop.id] == "aborted":
            result.add(
                Anomaly(
                    "aborted_reads",
                    f"{r.op.id} ({r.op.type}, {r.op.consumer}) read {r.poll.value!r} at "
                    f"{r.poll.key} {r.poll.position}, written by {wop.id} which failed"
                    + (f" ({wop.error})" if wop.error else ""),
                    key=r.poll.key,
                    values=(r.poll.value,),
                    positions=(r.poll.position,),
                    ops=(r.op.id, wop.id),
                )
            )
    phantoms: dict[str, list[tuple[Operation, Poll]]] = defaultdict(list)
    for op in f.history:
        for p in op.polls:
            if p.value not in f.writer:
                phantoms[p.value].append((op, p))
    for value, reads in phantoms.items():
        result.add(
            Anomaly(
                "phantom_reads",
                f"value {value!r} was read but never written: "
                + ", ".join(f"{op.id} at {p.key} {p.position}" for op, p in reads),
                key=reads[0][1].key,
                values=(value,),
                positions=tuple(p.position for _, p in reads),
                ops=tuple(op.id for op, _ in reads),
            )
        )


def _lost_writes(f: _Facts, result: CheckResult) -> set[str]:
    """Committed values at or below the highest index read on their log, never read."""
    top: dict[Key, tuple[int, _Read]] = {}
    for r in f.rc_reads:
        if f.own(r.op, r.poll):
            continue  # judged as an own uncommitted read
        idx = f.rank.get(r.poll.key, {}).get(r.poll.position)
        if idx is not None and (r.poll.key not in top or idx > top[r.poll.key][0]):
            top[r.poll.key] = (idx, r)
    lost: set[str] = set()
    for op, send in f.committed_values():
        log = send.log
        if log is None or send.position is None or send.value in f.rc_readers:
            continue
        idx = f.rank[log][send.position]
        if log in top and idx <= top[log][0]:
            hi, r = top[log]
            lost.add(send.value)
            result.add(
                Anomaly(
                    "lost_writes",
                    f"{send.value!r} committed by {op.id} at {log} {send.position} (index {idx}) "
                    f"was never read, though {r.op.id} read {r.poll.value!r} at "
                    f"{r.poll.position} (index {hi})",
                    key=log,
                    values=(send.value,),
                    positions=(send.position,),
                    ops=(op.id, r.op.id),
                )
            )
    return lost


def _poll_order(f: _Facts, result: CheckResult) -> None:
    """Per consumer and log, each read advances exactly one index past the previous."""
    last: dict[tuple[str, Key], tuple[int, _Read]] = {}
    for op in f.history:
        if op.isolation != "read_committed":
            continue
        consumer = op.consumer if op.consumer is not None else op.process
        for p in op.polls:
            idx = f.rank.get(p.key, {}).get(p.position)
            if idx is None or f.own(op, p):
                continue  # aborted, unknown, phantom or own values: judged elsewhere
            prev = last.get((consumer, p.key))
            last[(consumer, p.key)] = (idx, _Read(op, p))
            if prev is None:
                continue
            pidx, pr = prev
            where = (
                f"consumer {consumer} on {p.key}: {pr.op.id} read {pr.poll.value!r} at "
                f"{pr.poll.position} (index {pidx}), then {op.id} read {p.value!r} at "
                f"{p.position} (index {idx})"
            )
            ops = tuple(dict.fromkeys((pr.op.id, op.id)))
            values: tuple[str, ...]
            if idx <= pidx:
                kind: AnomalyKind = "nonmonotonic_polls"
                message, values = where, (pr.poll.value, p.value)
            elif idx > pidx + 1:
                kind = "skipped_polls"
                skipped = f.values_at_ranks(p.key, pidx + 1, idx - 1)
                message, values = f"{where}, skipping {skipped}", (pr.poll.value, *skipped, p.value)
            else:
                continue
            result.add(Anomaly(kind, message, p.key, values, (pr.poll.position, p.position), ops))
        if op.type != "ok":
            for k in [k for k in last if k[0] == consumer]:
                del last[k]


def _send_order(f: _Facts, result: CheckResult) -> None:
    """Per process and log, the positions sends got back increase in send order."""
    last: dict[tuple[str, Key], tuple[Operation, Send, Position]] = {}
    for op in f.history:
        if f.status[op.id] != "committed":
            continue  # a write that never took effect held no position
        for s in op.sends:
            if s.log is None or s.position is None:
                continue
            prev = last.get((op.process, s.log))
            last[(op.process, s.log)] = (op, s, s.position)
            if prev is not None:
                pop, ps, ppos = prev
                if s.position <= ppos:
                    result.add(
                        Anomaly(
                            "nonmonotonic_sends",
                            f"process {op.process} on {s.log}: {pop.id} sent {ps.value!r} -> "
                            f"{ps.position}, then {op.id} sent {s.value!r} -> {s.position}",
                            key=s.log,
                            values=(ps.value, s.value),
                            positions=(ppos, s.position),
                            ops=tuple(dict.fromkeys((pop.id, op.id))),
                        )
                    )


def _torn_and_unseen(f: _Facts, result: CheckResult, lost: set[str]) -> None:
    """After the final phase: partly visible committed operations, then unseen values."""
    torn: set[str] = set()
    for op in f.history:
        if f.status[op.id] != "committed" or not op.sends or not op.transactional:
            continue
        seen = [s for s in op.sends if s.value in f.rc_readers]
        missing = [s for s in op.sends if s.value not in f.rc_readers]
        if seen and missing:
            torn.update(s.value for s in missing)

            def where(sends: list[Send]) -> str:
                return ", ".join(f"{s.value!r}@{s.log or s.topic}{s.position or ''}" for s in sends)

            result.add(
                Anomaly(
                    "torn_transactions",
                    f"{op.id} ({op.type}) committed {len(op.sends)} writes; read: {where(seen)}; "
                    f"never read: {where(missing)}",
                    key=missing[0].log,
                    values=tuple(s.value for s in missing),
                    positions=tuple(s.position for s in missing if s.position is not None),
                    ops=(op.id,),
                )
            )
    for op, s in f.committed_values():
        if s.value in f.rc_readers or s.value in lost or s.value in torn:
            continue
        result.add(
            Anomaly(
                "unseen",
                f"{s.value!r} committed by {op.id} ({op.type}) at {s.log or s.topic} "
                f"{s.position} was never read",
                key=s.log,
                values=(s.value,),
                positions=() if s.position is None else (s.position,),
                ops=(op.id,),
            )
        )


def _g1c(f: _Facts, result: CheckResult) -> None:
    """Cycles of write->read dependencies among committed operations (Tarjan's SCCs)."""
    edges: dict[str, dict[str, str]] = defaultdict(dict)  # writer -> reader -> a value
    for r in f.rc_reads:
        w = f.writer.get(r.poll.value)
        if w is None or w[0].id == r.op.id:
            continue
        if f.status[w[0].id] == "committed" and f.status[r.op.id] == "committed":
            edges[w[0].id].setdefault(r.op.id, r.poll.value)
    for scc in _sccs(edges):
        if len(scc) < 2:
            continue
        cycle = _cycle_in(edges, scc)
        steps = [f"{a} -[{edges[a][b]!r}]-> {b}" for a, b in pairwise(cycle)]
        result.add(
            Anomaly(
                "g1c_cycles",
                "write->read cycle: " + ", ".join(steps),
                values=tuple(edges[a][b] for a, b in pairwise(cycle)),
                ops=tuple(cycle[:-1]),
            )
        )


def _sccs(edges: dict[str, dict[str, str]]) -> list[list[str]]:
    """Strongly connected components (iterative Tarjan: histories can be long)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    nodes = list(dict.fromkeys([*edges, *(b for targets in edges.values() for b in targets)]))
    for root in nodes:
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, list(edges.get(root, {})))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, list(edges.get(nxt, {}))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                scc: list[str] = []
                while True:
                    n = stack.pop()
                    on_stack.discard(n)
                    scc.append(n)
                    if n == node:
                        break
                out.append(scc)
    return out


def _cycle_in(edges: dict[str, dict[str, str]], scc: list[str]) -> list[str]:
    """A shortest cycle through ``scc[0]`` inside the component: [a, b, ..., a]."""
    members = set(scc)
    start = scc[0]
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt: list[str] = []
        for node in frontier:
            for b in edges.get(node, {}):
                if b not in members:
                    continue
                if b == start:
                    path = [start]
                    while node != start:
                        path.append(node)
                        node = parent[node]
                    return [start, *reversed(path[1:]), start]
                if b not in parent:
                    parent[b] = node
                    nxt.append(b)
        frontier = nxt
    raise AssertionError(f"no cycle through {start} in its component {scc}")


def _exactly_once(f: _Facts, result: CheckResult) -> None:
    """Every committed input: one read output per output topic, one committed ack."""
    spec = f.history.ctp
    assert spec is not None
    inputs = [s.value for _, s in f.committed_values() if s.topic in spec.input_topics]
    input_set = set(inputs)
    outputs: dict[tuple[str, str], list[str]] = defaultdict(list)
    for value in f.rc_readers:
        w = f.writer.get(value)
        if w is None or w[1].topic not in spec.output_topics or f.status[w[0].id] != "committed":
            continue  # phantoms and aborted reads are judged on their own
        src = w[1].source
        if src is None or src not in input_set:
            result.add(
                Anomaly(
                    "exactly_once",
                    f"output {value!r} on {w[1].topic} (by {w[0].id}) names input {src!r}, "
                    "which no committed operation wrote",
                    values=(value,),
                    ops=(w[0].id,),
                )
            )
            continue
        outputs[(w[1].topic, src)].append(value)
    acks: dict[str, list[str]] = defaultdict(list)
    for op in f.history:
        if f.status[op.id] == "committed":
            for a in op.acks:
                acks[a.value].append(op.id)
    for x in inputs:
        problems = [
            f"{len(outputs[(t, x)])} outputs on {t} {outputs[(t, x)]}"
            for t in spec.output_topics
            if len(outputs[(t, x)]) != 1
        ]
        if len(acks[x]) != 1:
            problems.append(f"acked by {len(acks[x])} committed operations {acks[x]}")
        if problems:
            out_values = tuple(v for t in spec.output_topics for v in outputs[(t, x)])
            ops = [f.writer[v][0].id for v in out_values] + acks[x]
            result.add(
                Anomaly(
                    "exactly_once",
                    f"input {x!r}: " + "; ".join(problems) + " (want exactly 1 each)",
                    values=(x, *out_values),
                    ops=tuple(dict.fromkeys(ops)),
                )
            )


# ------------------------------------------------------------------------------- entry


def check(history: History) -> CheckResult:
    """Decide every anomaly of ``history`` (see the module docstring for the rules)."""
    f = _facts(history)
    result = CheckResult()
    _offset_anomalies(f, result)
    _read_anomalies(f, result)
    lost = _lost_writes(f, result)
    _poll_order(f, result)
    _send_order(f, result)
    if history.has_final_phase:
        _torn_and_unseen(f, result, lost)
        if history.ctp is not None:
            _exactly_once(f, result)
    _g1c(f, result)
    result.stats = {
        "ok": sum(op.type == "ok" for op in history),
        "fail": sum(op.type == "fail" for op in history),
        "info": sum(op.type == "info" for op in history),
        "info_committed": sum(
            op.type == "info" and f.status[op.id] == "committed" for op in history
        ),
        "committed_values": sum(1 for _ in f.committed_values()),
        "read_committed_reads": len(f.rc_reads),
    }
    return result
