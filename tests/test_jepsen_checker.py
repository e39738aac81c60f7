"""The Jepsen checker fires on every anomaly it knows, and only then.

Three kinds of evidence:

- hand-written histories, each planting one anomaly (and clean ones that must pass,
  with ``info`` operations and crashes);
- an in-memory *simulated log* with Pulsar's transaction-buffer semantics (markers,
  ``max_read_position``, aborted set, pending acks) driven by the real
  :class:`~tests.jepsen.workload.CtpWorker`, with faults that plant anomalies the
  way a broken broker would (a reader that ignores markers, a dropped commit marker,
  a duplicated append, a commit on one partition only, a consumer that skips or
  rewinds);
- hypothesis: random schedules of the simulated log (crashes, crashes inside
  commit, timeouts, write failures, aborts, live readers) give valid histories, and
  one mutation of such a history is reported as the anomaly it plants.

Plus the history file format: round trip, torn last line, a worker killed with
``kill -9`` while appending.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.jepsen.checker import CheckResult, check
from tests.jepsen.history import (
    Ack,
    CtpSpec,
    History,
    HistoryFormatError,
    HistoryWriter,
    Isolation,
    Operation,
    OpType,
    Phase,
    Poll,
    Position,
    Send,
    dump_history,
    load_history,
)
from tests.jepsen.workload import CtpConfig, CtpWorker, drain, final_read, seed_inputs
from txnstream.errors import (
    StorageError,
    TransactionAlreadyAborted,
    TransactionAlreadyCommitted,
    TransactionTimedOut,
)

ROOT = Path(__file__).resolve().parent.parent

# ------------------------------------------------------------------ hand-written histories


def pos(n: int) -> Position:
    return (0, n, 0)


def w(topic: str, value: str, part: int | None, n: int | None, source: str | None = None) -> Send:
    """A send that landed at (part, n); None when it never returned."""
    return Send(
        topic,
        value,
        key=source,
        source=source,
        partition=part,
        position=None if n is None else pos(n),
    )


def r(topic: str, value: str, part: int, n: int) -> Poll:
    return Poll(topic, part, pos(n), value)


def ack(topic: str, value: str, part: int, n: int) -> Ack:
    return Ack(topic, part, pos(n), value)


def op(
    op_id: str,
    type_: OpType,
    *micro: Poll | Send | Ack,
    consumer: str | None = None,
    phase: Phase = "workload",
    isolation: Isolation = "read_committed",
) -> Operation:
    """An operation of process ``op_id``'s prefix; setup (seeding) is not transactional."""
    process = op_id.split(".")[0]
    return Operation(
        op_id,
        process,
        type_,
        tuple(micro),
        consumer=consumer if consumer is not None else f"{process}-c",
        isolation=isolation,
        phase=phase,
        transactional=phase != "setup",
    )


def assert_only(history: History, *kinds: str) -> CheckResult:
    result = check(history)
    assert result.kinds() == set(kinds), result.summary()
    return result


# A clean consume-transform-produce history: inputs a, b, c; outputs on A and B.
# p1 processes a, aborts b (its output b>A#1 at A0:1 is aborted; the marker at A0:2),
# processes b again (a redelivery: allowed after a fail); p2 dies mid-transaction
# (c>A#0 never got a position), p2's successor dies inside commit after the commit
# decision (info, but its outputs are read: committed).
CTP = CtpSpec(("in",), ("A", "B"))
SEED = op("s.0", "ok", w("in", "a", 0, 0), w("in", "b", 0, 1), w("in", "c", 1, 0), phase="setup")
T1 = op(
    "p1.0",
    "ok",
    r("in", "a", 0, 0),
    w("A", "a>A", 0, 0, "a"),
    w("B", "a>B", 0, 0, "a"),
    ack("in", "a", 0, 0),
)
T2 = op("p1.1", "fail", r("in", "b", 0, 1), w("A", "b>A#1", 0, 1, "b"), ack("in", "b", 0, 1))
T3 = op(
    "p1.2",
    "ok",
    r("in", "b", 0, 1),
    w("A", "b>A", 0, 3, "b"),
    w("B", "b>B", 0, 1, "b"),
    ack("in", "b", 0, 1),
)
T4 = op("p2.0", "info", r("in", "c", 1, 0), w("A", "c>A#0", None, None, "c"))
T5 = op(
    "p3.0",
    "info",
    r("in", "c", 1, 0),
    w("A", "c>A", 1, 0, "c"),
    w("B", "c>B", 0, 2, "c"),
    ack("in", "c", 1, 0),
)
FINAL_IN = op(
    "f.in", "ok", r("in", "a", 0, 0), r("in", "b", 0, 1), r("in", "c", 1, 0), phase="final"
)
FINAL_A = op(
    "f.A", "ok", r("A", "a>A", 0, 0), r("A", "b>A", 0, 3), r("A", "c>A", 1, 0), phase="final"
)
FINAL_B = op(
    "f.B", "ok", r("B", "a>B", 0, 0), r("B", "b>B", 0, 1), r("B", "c>B", 0, 2), phase="final"
)
CLEAN = History((SEED, T1, T2, T3, T4, T5, FINAL_IN, FINAL_A, FINAL_B), CTP)


def test_clean_ctp_history_with_aborts_and_crashes_is_valid() -> None:
    result = check(CLEAN)
    assert result.valid, result.summary()
    assert result.stats["info"] == 2
    assert result.stats["info_committed"] == 1  # p3.0: its outputs were read
    assert "valid: True" in result.summary()


def test_without_final_phase_unread_values_are_not_judged() -> None:
    history = History((SEED, T1, T2, T3, T4, T5), CTP)
    result = check(history)
    assert result.valid, result.summary()
    assert result.stats["info_committed"] == 0  # nobody read p3.0's writes yet


def test_info_operation_read_only_by_read_uncommitted_stays_unknown() -> None:
    ru = op("obs.0", "ok", r("A", "c>A", 1, 0), isolation="read_uncommitted")
    history = History((SEED, T5, ru), None)
    result = check(history)
    assert result.valid, result.summary()
    assert result.stats["info_committed"] == 0


def test_inconsistent_offsets() -> None:
    # x's writer crashed before its send returned, so only the reads place it.
    history = History(
        (
            op("s.0", "ok", w("t", "v", 0, 0)),
            op("x.0", "info", w("t", "x", None, None)),
            op("r1.0", "ok", r("t", "v", 0, 0)),
            op("r2.0", "ok", r("t", "x", 0, 0)),
        )
    )
    result = assert_only(history, "inconsistent_offsets")
    (a,) = result.inconsistent_offsets
    assert a.key == ("t", 0) and a.positions == (pos(0),) and set(a.values) == {"v", "x"}


def test_duplicate_value_at_two_positions() -> None:
    history = History(
        (
            op("s.0", "ok", w("t", "v", 0, 0), w("t", "u", 0, 1)),
            op("r1.0", "ok", r("t", "v", 0, 0), r("t", "u", 0, 1), r("t", "v", 0, 2)),
        )
    )
    result = assert_only(history, "duplicates")
    (a,) = result.duplicates
    assert a.values == ("v",) and a.positions == (pos(0), pos(2)) and a.ops == ("s.0",)


def test_aborted_read() -> None:
    history = History(
        (
            op("s.0", "ok", w("t", "v", 0, 0)),
            op("s.1", "fail", w("t", "x", 0, 1)),
            op("r1.0", "ok", r("t", "v", 0, 0), r("t", "x", 0, 1)),
        )
    )
    result = assert_only(history, "aborted_reads")
    (a,) = result.aborted_reads
    assert a.values == ("x",) and a.ops == ("r1.0", "s.1")


def test_aborted_value_read_uncommitted_is_no_anomaly() -> None:
    history = History(
        (
            op("s.0", "ok", w("t", "v", 0, 0)),
            op("s.1", "fail", w("t", "x", 0, 1)),
            op("r1.0", "ok", r("t", "v", 0, 0), r("t", "x", 0, 1), isolation="read_uncommitted"),
        )
    )
    assert check(history).valid


def test_read_of_own_uncommitted_write() -> None:
    history = History((op("p.0", "ok", w("t", "v", 0, 0), r("t", "v", 0, 0)),))
    result = assert_only(history, "own_uncommitted_reads")
    assert result.own_uncommitted_reads[0].ops == ("p.0",)


def test_lost_write_by_the_index_rule() -> None:
    writes = (op("s.0", "ok", w("t", "v0", 0, 0)), op("s.1", "ok", w("t", "v1", 0, 2)))
    # A reader that reached v1 (index 1) never saw v0 (index 0): lost.
    lost = History((*writes, op("r.0", "ok", r("t", "v1", 0, 2))))
    result = assert_only(lost, "lost_writes")
    (a,) = result.lost_writes
    assert a.values == ("v0",) and a.positions == (pos(0),) and a.ops == ("s.0", "r.0")
    # A reader that stopped at v0 does not make v1 lost (it may not have arrived yet).
    assert check(History((*writes, op("r.0", "ok", r("t", "v0", 0, 0))))).valid


def test_poll_that_goes_back_within_a_consumer() -> None:
    writes = op("s.0", "ok", w("t", "v0", 0, 0), w("t", "v1", 0, 1), w("t", "v2", 0, 2))
    history = History(
        (
            writes,
            op("c.0", "ok", r("t", "v0", 0, 0), r("t", "v1", 0, 1)),
            op("c.1", "ok", r("t", "v1", 0, 1), r("t", "v2", 0, 2)),
        )
    )
    result = assert_only(history, "nonmonotonic_polls")
    (a,) = result.nonmonotonic_polls
    assert a.values == ("v1", "v1") and a.ops == ("c.0", "c.1")


def test_poll_that_skips_within_one_operation() -> None:
    writes = op("s.0", "ok", w("t", "v0", 0, 0), w("t", "v1", 0, 1), w("t", "v2", 0, 2))
    history = History(
        (
            writes,
            op("c.0", "ok", r("t", "v0", 0, 0), r("t", "v2", 0, 2)),
            op("d.0", "ok", r("t", "v1", 0, 1)),
        )
    )
    result = assert_only(history, "skipped_polls")
    assert result.skipped_polls[0].values == ("v0", "v1", "v2")


def test_rewind_after_a_failed_operation_is_allowed() -> None:
    writes = op("s.0", "ok", w("t", "v0", 0, 0), w("t", "v1", 0, 1))
    history = History(
        (
            writes,
            op("c.0", "fail", r("t", "v0", 0, 0), r("t", "v1", 0, 1)),
            op("c.1", "ok", r("t", "v0", 0, 0), r("t", "v1", 0, 1)),
        )
    )
    assert check(history).valid
    rewinds_after_ok = History(
        (writes, replace(history.operations[1], type="ok"), history.operations[2])
    )
    assert_only(rewinds_after_ok, "nonmonotonic_polls")


def test_markers_and_aborted_entries_are_not_skips() -> None:
    # Positions 1 (aborted data) and 2 (its marker) hold nothing committed.
    history = History(
        (
            op("s.0", "ok", w("t", "v0", 0, 0)),
            op("s.1", "fail", w("t", "x", 0, 1)),
            op("s.2", "ok", w("t", "v3", 0, 3)),
            op("c.0", "ok", r("t", "v0", 0, 0), r("t", "v3", 0, 3)),
        )
    )
    assert check(history).valid


def test_nonmonotonic_send() -> None:
    history = History(
        (
            op("p.0", "ok", w("t", "v0", 0, 5)),
            op("p.1", "ok", w("t", "v1", 0, 3)),
            op("c.0", "ok", r("t", "v1", 0, 3), r("t", "v0", 0, 5)),
        )
    )
    result = assert_only(history, "nonmonotonic_sends")
    assert result.nonmonotonic_sends[0].positions == (pos(5), pos(3))


def test_torn_transaction_across_partitions() -> None:
    history = History(
        (
            op("p.0", "ok", w("t", "a", 0, 0), w("t", "b", 1, 0)),
            op("f.0", "ok", r("t", "a", 0, 0), phase="final"),
        )
    )
    result = assert_only(history, "torn_transactions")
    (a,) = result.torn_transactions
    assert a.values == ("b",) and a.key == ("t", 1) and a.ops == ("p.0",)


def test_torn_transaction_within_one_partition() -> None:
    history = History(
        (
            op("p.0", "ok", w("t", "a", 0, 0), w("t", "b", 0, 1)),
            op("f.0", "ok", r("t", "a", 0, 0), phase="final"),
        )
    )
    assert assert_only(history, "torn_transactions").torn_transactions[0].values == ("b",)


def test_info_operation_partly_visible_is_torn() -> None:
    history = History(
        (
            op("p.0", "info", w("t", "a", 0, 0), w("u", "b", 0, 0)),
            op("f.0", "ok", r("t", "a", 0, 0), phase="final"),
        )
    )
    assert_only(history, "torn_transactions")


def test_unseen_values_of_non_transactional_sends_are_not_torn() -> None:
    history = History(
        (
            op("s.0", "ok", w("t", "a", 0, 0), w("t", "b", 0, 1), phase="setup"),
            op("f.0", "ok", r("t", "a", 0, 0), phase="final"),
        )
    )
    assert assert_only(history, "unseen").unseen[0].values == ("b",)


def test_unseen_committed_value() -> None:
    history = History(
        (
            op("p.0", "ok", w("t", "a", 0, 0)),
            op("p.1", "ok", w("t", "b", 0, 1)),
            op("f.0", "ok", r("t", "a", 0, 0), phase="final"),
        )
    )
    assert assert_only(history, "unseen").unseen[0].values == ("b",)


def test_g1c_cycle_of_write_read_dependencies() -> None:
    history = History(
        (
            op("p.0", "ok", w("t", "x", 0, 0), r("u", "y", 0, 0)),
            op("q.0", "ok", w("u", "y", 0, 0), r("t", "x", 0, 0)),
        )
    )
    result = assert_only(history, "g1c_cycles")
    assert set(result.g1c_cycles[0].ops) == {"p.0", "q.0"}
    assert set(result.g1c_cycles[0].values) == {"x", "y"}


def test_phantom_read() -> None:
    history = History(
        (op("s.0", "ok", w("t", "v", 0, 0)), op("c.0", "ok", r("t", "v", 0, 0), r("t", "zz", 0, 1)))
    )
    assert assert_only(history, "phantom_reads").phantom_reads[0].values == ("zz",)


def test_input_processed_twice_breaks_exactly_once() -> None:
    # p9 (a new consumer) processed c again and committed: outputs at new positions.
    again = op(
        "p9.0",
        "ok",
        r("in", "c", 1, 0),
        w("A", "c>A'", 1, 1, "c"),
        w("B", "c>B'", 0, 3, "c"),
        ack("in", "c", 1, 0),
    )
    ops = list(CLEAN.operations)
    ops.insert(6, again)
    ops.append(op("f2.0", "ok", r("A", "c>A'", 1, 1), r("B", "c>B'", 0, 3), phase="final"))
    result = assert_only(History(tuple(ops), CTP), "exactly_once")
    (a,) = result.exactly_once
    assert a.values[0] == "c" and "2 outputs on A" in a.message and "acked by 2" in a.message


def test_input_never_processed_breaks_exactly_once() -> None:
    final_a = op("f.A", "ok", r("A", "a>A", 0, 0), r("A", "c>A", 1, 0), phase="final")
    final_b = op("f.B", "ok", r("B", "a>B", 0, 0), r("B", "c>B", 0, 2), phase="final")
    history = History((SEED, T1, T2, T4, T5, FINAL_IN, final_a, final_b), CTP)
    result = assert_only(history, "exactly_once")
    assert result.exactly_once[0].values == ("b",)


def test_output_committed_without_its_ack_breaks_exactly_once() -> None:
    no_ack = replace(T5, ops=T5.ops[:-1])
    history = History((SEED, T1, T2, T3, T4, no_ack, FINAL_IN, FINAL_A, FINAL_B), CTP)
    result = assert_only(history, "exactly_once")
    assert result.exactly_once[0].values[0] == "c"
    assert "acked by 0 committed operations" in result.exactly_once[0].message


def test_value_overwritten_at_its_position_is_inconsistent_and_lost() -> None:
    # v's send came back at position 0, but the log serves x there (x's position unknown).
    history = History(
        (
            op("s.0", "ok", w("t", "v", 0, 0)),
            op("x.0", "info", w("t", "x", None, None)),
            op("r.0", "ok", r("t", "x", 0, 0)),
        )
    )
    result = assert_only(history, "inconsistent_offsets", "lost_writes")
    assert result.lost_writes[0].values == ("v",)


def test_value_written_twice_is_a_workload_error() -> None:
    with pytest.raises(ValueError, match=r"'v' is sent by 'p\.0' and again by 'q\.0'"):
        check(History((op("p.0", "ok", w("t", "v", 0, 0)), op("q.0", "ok", w("t", "v", 0, 1)))))


def test_summary_names_the_evidence() -> None:
    history = History((op("s.1", "fail", w("t", "x", 0, 1)), op("r1.0", "ok", r("t", "x", 0, 1))))
    text = check(history).summary()
    assert "valid: False" in text and "aborted_reads: 1" in text
    assert "'x'" in text and "s.1" in text and "r1.0" in text and "(0, 1, 0)" in text


# ------------------------------------------------------------------- the simulated log


class SimCrash(BaseException):
    """The simulated process dies here (a BaseException: the worker must not catch it)."""


@dataclass(frozen=True)
class SimMessageId:
    partition: int
    ledger_id: int
    entry_id: int
    batch_index: int = 0


@dataclass(frozen=True)
class SimMessage:
    value: bytes
    message_id: SimMessageId


@dataclass
class Entry:
    value: str | None  # None: a commit/abort marker
    txn: int | None


class SimPartition:
    """One partition's log and transaction buffer (Pulsar's TopicTransactionBuffer)."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.entries: list[Entry] = []
        self.ongoing: dict[int, int] = {}  # txn -> its first entry, in that order
        self.aborted: set[int] = set()

    def max_read(self) -> int:
        """Entries below this are decided: before the first ongoing transaction."""
        return next(iter(self.ongoing.values()), len(self.entries))

    def append(self, value: str, txn: int | None) -> int:
        if txn is not None and txn not in self.ongoing:
            self.ongoing[txn] = len(self.entries)
        self.entries.append(Entry(value, txn))
        return len(self.entries) - 1

    def end(self, txn: int, commit: bool) -> None:
        if txn not in self.ongoing:
            return
        self.entries.append(Entry(None, txn))
        del self.ongoing[txn]
        if not commit:
            self.aborted.add(txn)

    def readable(self, i: int, read_committed: bool) -> bool:
        e = self.entries[i]
        if e.value is None:
            return False  # no consumer ever sees a marker
        return not read_committed or (i < self.max_read() and e.txn not in self.aborted)


class SimSubscription:
    """A cursor on one partition: individually acked, pending (held by a txn), next."""

    def __init__(self, partition: SimPartition) -> None:
        self.partition = partition
        self.acked: set[int] = set()
        self.pending: dict[int, int] = {}
        self.next = 0

    def take(self, read_committed: bool) -> int | None:
        p = self.partition
        bound = p.max_read() if read_committed else len(p.entries)
        i = self.next
        while i < bound:
            if p.readable(i, read_committed) and i not in self.acked and i not in self.pending:
                self.next = i + 1
                return i
            i += 1
        self.next = i
        return None


@dataclass
class Faults:
    """How the simulated broker misbehaves (nothing by default)."""

    ignore_markers: set[str] = field(default_factory=set)  # subscriptions reading past them
    drop_commit_marker: set[tuple[str, int]] = field(default_factory=set)  # (topic, partition)
    torn_commits: set[int] = field(default_factory=set)  # n-th commit: first partition only
    duplicate_appends: set[int] = field(default_factory=set)  # n-th transactional append twice
    skip_receive: dict[str, int] = field(default_factory=dict)  # subscription -> n-th receive
    rewind_receive: dict[str, int] = field(default_factory=dict)
    fail_sends: set[str] = field(default_factory=set)  # processes whose next send fails
    crash_in_commit: dict[str, int] = field(default_factory=dict)  # process -> markers written


class SimTxn:
    def __init__(self, log: SimLog, txn_id: int, owner: str) -> None:
        self.log = log
        self.id = txn_id
        self.owner = owner
        self.state = "open"
        self.partitions: list[tuple[str, SimPartition]] = []
        self.acks: list[tuple[SimSubscription, int]] = []
        self.finished = False

    def commit(self) -> None:
        self.log.commit(self)

    def abort(self) -> None:
        self.log.abort(self)


class SimLog:
    """Topics of partitions, subscriptions, a coordinator: the broker, in memory."""

    def __init__(self, partitions: Mapping[str, int], faults: Faults | None = None) -> None:
        self.topics = {t: [SimPartition(i) for i in range(n)] for t, n in partitions.items()}
        self.subs: dict[tuple[str, int, str], SimSubscription] = {}
        self.txns: list[SimTxn] = []
        self.faults = faults if faults is not None else Faults()
        self.commits = 0
        self.txn_appends = 0
        self.round_robin = 0

    def resolve(self, topic: str) -> tuple[str, list[SimPartition]]:
        base, sep, n = topic.rpartition("-partition-")
        if sep:
            return base, [self.topics[base][int(n)]]
        return topic, self.topics[topic]

    def client(self, process: str) -> SimClient:
        return SimClient(self, process)

    def send(
        self, process: str, topic: str, value: str, key: str | None, txn: SimTxn | None
    ) -> SimMessageId:
        if process in self.faults.fail_sends:
            self.faults.fail_sends.discard(process)
            raise StorageError(f"injected write failure for {value!r}")
        if txn is not None and txn.state != "open":
            raise TransactionTimedOut(f"transaction {txn.id} is {txn.state}")
        parts = self.topics[topic]
        if key is not None:
            index = zlib.crc32(key.encode()) % len(parts)
        else:
            index, self.round_robin = self.round_robin % len(parts), self.round_robin + 1
        p = parts[index]
        entry = p.append(value, None if txn is None else txn.id)
        if txn is not None:
            if all(q is not p for _, q in txn.partitions):
                txn.partitions.append((topic, p))
            self.txn_appends += 1
            if self.txn_appends in self.faults.duplicate_appends:
                p.append(value, txn.id)
        return SimMessageId(p.index, 0, entry)

    def commit(self, txn: SimTxn) -> None:
        if txn.state == "aborted":
            raise TransactionAlreadyAborted(f"transaction {txn.id} aborted")
        if txn.state == "committed":
            return
        txn.state = "committed"
        self.commits += 1
        markers = self.faults.crash_in_commit.pop(txn.owner, None)
        if markers is not None:
            for topic, p in txn.partitions[:markers]:
                self._end_on(txn, topic, p)
            raise SimCrash
        self.finish(txn)

    def _end_on(self, txn: SimTxn, topic: str, p: SimPartition) -> None:
        if (topic, p.index) in self.faults.drop_commit_marker:
            return
        torn = self.commits in self.faults.torn_commits
        p.end(txn.id, commit=not torn or p is txn.partitions[0][1])

    def finish(self, txn: SimTxn) -> None:
        """Write the commit markers and apply the acks (recovery finishes a decided commit)."""
        if txn.finished:
            return
        for topic, p in txn.partitions:
            self._end_on(txn, topic, p)
        for sub, i in txn.acks:
            sub.pending.pop(i, None)
            sub.acked.add(i)
        txn.finished = True

    def abort(self, txn: SimTxn) -> None:
        if txn.state == "committed":
            raise TransactionAlreadyCommitted(f"transaction {txn.id} committed")
        if txn.state == "aborted":
            return
        txn.state = "aborted"
        for _, p in txn.partitions:
            p.end(txn.id, commit=False)
        for sub, i in txn.acks:  # released and redelivered
            sub.pending.pop(i, None)
            sub.next = min(sub.next, i)
        txn.finished = True

    def expire(self, process: str) -> None:
        """A process's transactions time out; decided commits are finished (recovery)."""
        for txn in self.txns:
            if txn.owner == process:
                if txn.state == "open":
                    self.abort(txn)
                elif txn.state == "committed":
                    self.finish(txn)


class SimProducer:
    def __init__(self, log: SimLog, process: str, topic: str) -> None:
        self.log, self.process, self.topic = log, process, topic

    def send(
        self,
        value: bytes,
        key: str | None = None,
        properties: Mapping[str, str] | None = None,
        txn: Any = None,
    ) -> SimMessageId:
        return self.log.send(self.process, self.topic, value.decode(), key, txn)


class SimConsumer:
    def __init__(self, log: SimLog, topic: str, subscription: str, isolation: str) -> None:
        base, parts = log.resolve(topic)
        self.log, self.name = log, subscription
        self.read_committed = (
            isolation == "read_committed" and subscription not in log.faults.ignore_markers
        )
        self.subs = [
            log.subs.setdefault((base, p.index, subscription), SimSubscription(p)) for p in parts
        ]
        self.redeliver_unacknowledged()  # a new consumer gets every unacked message again
        self.receives = 0

    def receive(self, timeout_ms: int) -> SimMessage | None:
        self.receives += 1
        for sub in self.subs:
            if self.log.faults.rewind_receive.get(self.name) == self.receives:
                sub.next = max(0, sub.next - 2)
            i = sub.take(self.read_committed)
            if i is not None and self.log.faults.skip_receive.get(self.name) == self.receives:
                i = sub.take(self.read_committed)
            if i is not None:
                value = sub.partition.entries[i].value
                assert value is not None
                return SimMessage(value.encode(), SimMessageId(sub.partition.index, 0, i))
        return None

    def ack(self, msg: SimMessage, txn: Any = None) -> None:
        sub = next(s for s in self.subs if s.partition.index == msg.message_id.partition)
        i = msg.message_id.entry_id
        if txn is None:
            sub.acked.add(i)
            return
        assert isinstance(txn, SimTxn)
        if txn.state != "open":
            raise TransactionTimedOut(f"transaction {txn.id} is {txn.state}")
        sub.pending[i] = txn.id
        txn.acks.append((sub, i))

    def redeliver_unacknowledged(self) -> None:
        for sub in self.subs:
            sub.next = 0  # take() passes over acked and pending entries


class SimClient:
    def __init__(self, log: SimLog, process: str) -> None:
        self.log, self.process = log, process

    def producer(self, topic: str) -> SimProducer:
        return SimProducer(self.log, self.process, topic)

    def subscribe(
        self, topic: str, subscription: str, isolation: str = "read_committed"
    ) -> SimConsumer:
        return SimConsumer(self.log, topic, subscription, isolation)

    def transaction(self, timeout_ms: int) -> SimTxn:
        txn = SimTxn(self.log, len(self.log.txns), self.process)
        self.log.txns.append(txn)
        return txn


# ------------------------------------------------------------------ the simulated workload

IN, OUT = "in", ("out-a", "out-b")


class SimRun:
    """Workers (one per input partition), a live reader, crashes and restarts, then the end.

    Restarts follow the workload's rule: a dead process's transactions are resolved
    (timed out, or a decided commit finished by recovery) before its successor reads.
    """

    def __init__(
        self,
        path: Path,
        workers: int,
        inputs: int,
        out_partitions: int = 2,
        faults: Faults | None = None,
        seed: int = 0,
        abort_share: float = 0.15,
        max_inputs: int = 3,
    ) -> None:
        self.log = SimLog({IN: workers, OUT[0]: out_partitions, OUT[1]: out_partitions}, faults)
        self.path = path
        self.history = HistoryWriter(path)
        self.history.spec(CtpSpec((IN,), OUT))
        self.rng = random.Random(seed)
        self.abort_share, self.max_inputs = abort_share, max_inputs
        seed_inputs(self.log.client("seed"), self.history, IN, [f"i{n}" for n in range(inputs)])
        self.generation = [0] * workers
        self.workers: list[CtpWorker | None] = [self.start(n) for n in range(workers)]
        self.running: list[Iterator[None] | None] = [None] * workers
        self.readers = [
            self.log.client("obs").subscribe(f"{t}-partition-{p}", "obs")
            for t in OUT
            for p in range(out_partitions)
        ]
        self.reads = 0

    def start(self, n: int, prefix: str = "w") -> CtpWorker:
        process = f"{prefix}{n}g{self.generation[n]}"
        config = CtpConfig(
            IN, f"{IN}-partition-{n}", OUT, abort_share=self.abort_share, max_inputs=self.max_inputs
        )
        return CtpWorker(
            self.log.client(process),
            self.history,
            process,
            config,
            random.Random(self.rng.random()),
        )

    def advance(self, n: int) -> None:
        """One client call of worker n (a new transaction when none is running)."""
        worker = self.workers[n]
        if worker is None:
            return
        gen = self.running[n] or worker.transaction()
        self.running[n] = gen
        try:
            next(gen)
        except StopIteration:
            self.running[n] = None
        except SimCrash:
            self.crash(n)

    def crash(self, n: int) -> None:
        """kill -9: the worker stops where it is; its transaction stays as it was."""
        self.workers[n] = None
        self.running[n] = None

    def restart(self, n: int) -> None:
        if self.workers[n] is not None:
            return
        self.log.expire(f"w{n}g{self.generation[n]}")
        self.generation[n] += 1
        self.workers[n] = self.start(n)

    def time_out(self, n: int) -> None:
        """The running transaction of a live worker passes its timeout."""
        worker = self.workers[n]
        if worker is not None:
            for txn in self.log.txns:
                if txn.owner == worker.process and txn.state == "open":
                    self.log.abort(txn)

    def fail_next_send(self, n: int) -> None:
        worker = self.workers[n]
        if worker is not None:
            self.log.faults.fail_sends.add(worker.process)

    def crash_in_next_commit(self, n: int, markers: int) -> None:
        worker = self.workers[n]
        if worker is not None:
            self.log.faults.crash_in_commit[worker.process] = markers

    def observe(self, k: int, count: int) -> None:
        """The live reader reads up to ``count`` messages from one output partition."""
        consumer = self.readers[k % len(self.readers)]
        base = OUT[(k % len(self.readers)) // (len(self.readers) // 2)]
        polls = []
        for _ in range(count):
            msg = consumer.receive(0)
            if msg is None:
                break
            mid = msg.message_id
            polls.append(Poll(base, mid.partition, (0, mid.entry_id, 0), msg.value.decode()))
        if polls:
            self.history.operation(
                Operation(f"obs.{self.reads}", "obs", "ok", tuple(polls), consumer="obs")
            )
            self.reads += 1

    def finish(self) -> History:
        """Unfinished transactions end, the dead are resolved, inputs drained, all read."""
        self.log.faults.fail_sends.clear()
        self.log.faults.crash_in_commit.clear()
        for gen in self.running:
            if gen is not None:
                for _ in gen:
                    pass
        for n, worker in enumerate(self.workers):
            if worker is None:
                self.restart(n)
        for n in range(len(self.workers)):
            drainer = self.start(n, prefix="drain")
            drainer.config = replace(drainer.config, abort_share=0.0)
            drain(drainer)
        client = self.log.client("final")
        for topic in (IN, *OUT):
            final_read(client, self.history, topic)
        self.history.close()
        return load_history(self.path)


Action = tuple[str, int, int]


def run_schedule(
    path: Path, workers: int, inputs: int, actions: list[Action], seed: int, **kw: Any
) -> History:
    run = SimRun(path, workers, inputs, seed=seed, **kw)
    for kind, a, b in actions:
        n = a % workers
        if kind == "step":
            for _ in range(b):
                run.advance(n)
        elif kind == "crash":
            run.crash(n)
        elif kind == "restart":
            run.restart(n)
        elif kind == "timeout":
            run.time_out(n)
        elif kind == "fail_send":
            run.fail_next_send(n)
        elif kind == "crash_in_commit":
            run.crash_in_next_commit(n, b)
        elif kind == "observe":
            run.observe(a, b)
        else:
            raise AssertionError(kind)
    return run.finish()


STEPS = st.tuples(st.just("step"), st.integers(0, 2), st.integers(1, 24))
ACTIONS = st.one_of(
    STEPS,
    STEPS,
    STEPS,
    st.tuples(
        st.sampled_from(["crash", "restart", "timeout", "fail_send"]), st.integers(0, 2), st.just(0)
    ),
    st.tuples(st.just("crash_in_commit"), st.integers(0, 2), st.integers(0, 4)),
    st.tuples(st.just("observe"), st.integers(0, 3), st.integers(1, 6)),
)


@st.composite
def sim_histories(draw: st.DrawFn, tmp: Path) -> History:
    workers = draw(st.integers(1, 3))
    inputs = draw(st.integers(1, 20))
    actions = draw(st.lists(ACTIONS, min_size=10, max_size=60))
    seed = draw(st.integers(0, 2**32))
    path = tmp / f"h{time.monotonic_ns()}.jsonl"
    return run_schedule(path, workers, inputs, actions, seed)


SIM = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.filter_too_much,
        HealthCheck.too_slow,
    ],
)


# ------------------------------------------------------------- simulated log: clean runs


def test_simulated_workload_with_crashes_timeouts_and_failures_is_valid(tmp_path: Path) -> None:
    actions: list[Action] = [
        ("step", 0, 8),
        ("observe", 0, 3),
        ("step", 1, 3),
        ("crash", 1, 0),  # dies mid-transaction: its outputs stay ongoing
        ("step", 0, 8),
        ("observe", 1, 5),  # pinned behind the dead transaction on some partitions
        ("crash_in_commit", 0, 1),
        ("step", 0, 12),  # decided commit, one marker written, then dead: info
        ("observe", 2, 6),
        ("restart", 0, 0),
        ("restart", 1, 0),
        ("fail_send", 1, 0),
        ("step", 1, 8),
        ("step", 0, 3),
        ("timeout", 0, 0),
        ("step", 0, 8),
        ("observe", 3, 6),
    ]
    history = run_schedule(tmp_path / "h.jsonl", 2, 10, actions, seed=7)
    result = check(history)
    assert result.valid, result.summary()
    types = {o.type for o in history if o.phase == "workload" and o.process != "obs"}
    assert types == {"ok", "fail", "info"}, types
    assert result.stats["info_committed"] >= 1  # the commit that crashed after its decision


@given(data=st.data())
@SIM
def test_random_simulated_histories_are_valid(tmp_path: Path, data: st.DataObject) -> None:
    history = data.draw(sim_histories(tmp_path))
    result = check(history)
    assert result.valid, result.summary()


# ------------------------------------------------- simulated log: faults plant anomalies


def scenario(
    tmp_path: Path, faults: Faults, actions: list[Action], inputs: int = 3, **kw: Any
) -> CheckResult:
    kw.setdefault("abort_share", 0.0)
    kw.setdefault("max_inputs", 1)
    history = run_schedule(tmp_path / "h.jsonl", 1, inputs, actions, seed=1, faults=faults, **kw)
    return check(history)


# One transaction with max_inputs=1 yields after: receive, begin, send out-a, send out-b,
# ack; the sixth step commits and ends it.
ONE_TXN: Action = ("step", 0, 6)


def test_sim_reader_ignoring_markers_reads_aborted_data(tmp_path: Path) -> None:
    result = scenario(
        tmp_path,
        Faults(ignore_markers={"obs"}),
        [
            ONE_TXN,
            ("step", 0, 4),
            ("timeout", 0, 0),
            ONE_TXN,
            *[("observe", k, 9) for k in range(4)],
        ],
        out_partitions=1,
    )
    assert result.kinds() == {"aborted_reads"}, result.summary()
    assert len(result.aborted_reads) == 2  # both outputs of the timed-out transaction


def test_sim_correct_reader_does_not_see_aborted_data(tmp_path: Path) -> None:
    result = scenario(
        tmp_path,
        Faults(),
        [
            ONE_TXN,
            ("step", 0, 4),
            ("timeout", 0, 0),
            ONE_TXN,
            *[("observe", k, 9) for k in range(4)],
        ],
        out_partitions=1,
    )
    assert result.valid, result.summary()


def test_sim_dropped_commit_marker_tears_transactions(tmp_path: Path) -> None:
    result = scenario(
        tmp_path, Faults(drop_commit_marker={("out-a", 0)}), [ONE_TXN, ONE_TXN], out_partitions=1
    )
    # out-a stays pinned behind the first transaction: every output there is never read.
    assert result.kinds() == {"torn_transactions", "exactly_once"}, result.summary()
    assert len(result.torn_transactions) == 3
    assert all(a.key == ("out-a", 0) for a in result.torn_transactions)


def test_sim_duplicated_append(tmp_path: Path) -> None:
    result = scenario(tmp_path, Faults(duplicate_appends={2}), [ONE_TXN, ONE_TXN], out_partitions=1)
    assert result.kinds() == {"duplicates"}, result.summary()
    assert result.duplicates[0].values == ("i0>out-b@w0g0.0",)


def test_sim_last_transaction_committed_on_one_partition_only(tmp_path: Path) -> None:
    result = scenario(tmp_path, Faults(torn_commits={1}), [ONE_TXN], inputs=1, out_partitions=1)
    assert result.kinds() == {"torn_transactions", "exactly_once"}, result.summary()
    assert result.torn_transactions[0].values == ("i0>out-b@w0g0.0",)


def test_sim_transaction_committed_on_one_partition_then_later_ones_read(tmp_path: Path) -> None:
    # Later outputs on out-b are read past the torn one: it is lost by the index rule.
    result = scenario(tmp_path, Faults(torn_commits={1}), [ONE_TXN, ONE_TXN], out_partitions=1)
    assert result.kinds() == {"torn_transactions", "lost_writes", "exactly_once"}, result.summary()
    assert result.lost_writes[0].values == ("i0>out-b@w0g0.0",)


def test_sim_consumer_that_skips(tmp_path: Path) -> None:
    result = scenario(
        tmp_path,
        Faults(skip_receive={"obs": 2}),
        [ONE_TXN, ONE_TXN, ONE_TXN, ("observe", 0, 3)],
        out_partitions=1,
    )
    assert result.kinds() == {"skipped_polls"}, result.summary()
    assert result.skipped_polls[0].values == (
        "i0>out-a@w0g0.0",
        "i1>out-a@w0g0.1",
        "i2>out-a@w0g0.2",
    )


def test_sim_consumer_that_rewinds(tmp_path: Path) -> None:
    result = scenario(
        tmp_path,
        Faults(rewind_receive={"obs": 3}),
        [ONE_TXN, ONE_TXN, ONE_TXN, ("observe", 0, 4)],
        out_partitions=1,
    )
    assert result.kinds() == {"nonmonotonic_polls"}, result.summary()


# ------------------------------------------- hypothesis: one mutation, one anomaly


Mutation = Callable[[History, st.DataObject], History]
FRESH = (10**6, 0, 0)  # a position after everything the simulated log wrote


def committed_ops(h: History) -> list[Operation]:
    return [
        o for o in h if o.phase == "workload" and o.process != "obs" and o.sends and o.type == "ok"
    ]


def final_polls(h: History) -> list[tuple[Operation, int, Poll]]:
    return [
        (o, i, p)
        for o in h
        if o.phase == "final"
        for i, p in enumerate(o.ops)
        if isinstance(p, Poll)
    ]


def read_outside_final(h: History, value: str) -> bool:
    return any(p.value == value for o in h if o.phase != "final" for p in o.polls)


def with_op(h: History, new: Operation) -> History:
    return replace(h, operations=(*h.operations, new))


def replace_op(h: History, old: Operation, new: Operation) -> History:
    return replace(h, operations=tuple(new if o is old else o for o in h.operations))


def m_aborted_read(h: History, data: st.DataObject) -> History:
    aborted = [
        s
        for o in h
        if o.type == "fail"
        for s in o.sends
        if s.log is not None and s.position is not None
    ]
    assume(aborted)
    s = data.draw(st.sampled_from(aborted))
    assert s.log is not None and s.position is not None
    return with_op(h, op("m.0", "ok", Poll(s.topic, s.log[1], s.position, s.value)))


def m_duplicate(h: History, data: st.DataObject) -> History:
    _, _, p = data.draw(st.sampled_from(final_polls(h)))
    return with_op(h, op("m.0", "ok", Poll(p.topic, p.partition, FRESH, p.value)))


def m_inconsistent(h: History, data: st.DataObject) -> History:
    aborted = [s for o in h if o.type == "fail" for s in o.sends]
    assume(aborted)
    s = data.draw(st.sampled_from(aborted))
    _, _, p = data.draw(st.sampled_from(final_polls(h)))
    return with_op(
        h,
        op(
            "m.0",
            "ok",
            Poll(p.topic, p.partition, p.position, s.value),
            isolation="read_uncommitted",
        ),
    )


def drop_final_read(
    h: History, data: st.DataObject, keep: Callable[[Poll, bool, bool], bool]
) -> History:
    """Remove one final-phase read chosen among those ``keep(poll, earlier, later)`` accepts.

    ``earlier`` / ``later``: the same final read has reads of that log before / after it.
    """
    candidates = []
    for o, i, p in final_polls(h):
        earlier = any(isinstance(q, Poll) and q.key == p.key for q in o.ops[:i])
        later = any(isinstance(q, Poll) and q.key == p.key for q in o.ops[i + 1 :])
        if keep(p, earlier, later):
            candidates.append((o, i))
    assume(candidates)
    o, i = data.draw(st.sampled_from(candidates))
    return replace_op(h, o, replace(o, ops=o.ops[:i] + o.ops[i + 1 :]))


def m_lost(h: History, data: st.DataObject) -> History:
    """An output nobody else read vanishes from the middle of the final read."""
    return drop_final_read(
        h, data, lambda p, _, later: later and p.topic in OUT and not read_outside_final(h, p.value)
    )


def m_unseen_or_torn(h: History, data: st.DataObject) -> History:
    """An output nobody else read vanishes from the end of the final read."""
    return drop_final_read(
        h,
        data,
        lambda p, _, later: not later and p.topic in OUT and not read_outside_final(h, p.value),
    )


def m_rewind(h: History, data: st.DataObject) -> History:
    polls = final_polls(h)
    o, _, p = data.draw(st.sampled_from(polls))
    return replace_op(h, o, replace(o, ops=(*o.ops, p)))


def m_skip(h: History, data: st.DataObject) -> History:
    """The final reader misses a value in the middle that others did read."""
    return drop_final_read(
        h, data, lambda p, earlier, later: earlier and later and read_outside_final(h, p.value)
    )


def m_send_order(h: History, data: st.DataObject) -> History:
    candidates = []
    for o in h:
        sends = [
            (i, m) for i, m in enumerate(o.ops) if isinstance(m, Send) and m.position is not None
        ]
        for (i, a), (j, b) in pairwise(sends):
            if a.log == b.log:
                candidates.append((o, i, j))
    assume(candidates)
    o, i, j = data.draw(st.sampled_from(candidates))
    ops = list(o.ops)
    ops[i], ops[j] = ops[j], ops[i]
    return replace_op(h, o, replace(o, ops=tuple(ops)))


def m_own_write(h: History, data: st.DataObject) -> History:
    ops = committed_ops(h)
    assume(ops)
    o = data.draw(st.sampled_from(ops))
    s = o.sends[0]
    assert s.log is not None and s.position is not None
    return replace_op(h, o, replace(o, ops=(*o.ops, Poll(s.topic, s.log[1], s.position, s.value))))


def m_g1c(h: History, data: st.DataObject) -> History:
    ops = committed_ops(h)
    pairs = [(a, b) for a in ops for b in ops if a.process < b.process]
    assume(pairs)
    a, b = data.draw(st.sampled_from(pairs))
    sa, sb = a.sends[0], b.sends[0]
    assert (
        sa.log is not None
        and sa.position is not None
        and sb.log is not None
        and sb.position is not None
    )
    h = replace_op(h, a, replace(a, ops=(*a.ops, Poll(sb.topic, sb.log[1], sb.position, sb.value))))
    return replace_op(
        h, b, replace(b, ops=(*b.ops, Poll(sa.topic, sa.log[1], sa.position, sa.value)))
    )


def m_processed_twice(h: History, data: st.DataObject) -> History:
    ops = committed_ops(h)
    assume(ops)
    o = data.draw(st.sampled_from(ops))
    micro: list[Poll | Send | Ack] = []
    reads: list[Poll] = []
    for n, m in enumerate(o.ops):
        if isinstance(m, Send):
            assert m.partition is not None
            s = replace(m, value=m.value + "'", position=(10**6, n, 0))
            micro.append(s)
            reads.append(Poll(s.topic, m.partition, (10**6, n, 0), s.value))
        else:
            micro.append(m)
    again = Operation("m.0", "m", "ok", tuple(micro), consumer="m")
    return with_op(with_op(h, again), op("mf.0", "ok", *reads, phase="final"))


def m_phantom(h: History, data: st.DataObject) -> History:
    _, _, p = data.draw(st.sampled_from(final_polls(h)))
    return with_op(h, op("m.0", "ok", Poll(p.topic, p.partition, FRESH, "never-written")))


# mutation -> (the kind it plants, the kinds it may bring along as consequences)
MUTATIONS: dict[str, tuple[Mutation, str, set[str]]] = {
    "aborted_read": (m_aborted_read, "aborted_reads", set()),
    "duplicate": (m_duplicate, "duplicates", set()),
    # An aborted value placed at a committed position; it also sits at its own position.
    "inconsistent": (m_inconsistent, "inconsistent_offsets", {"duplicates"}),
    # The final reader passed over it; its transaction's other writes were read.
    "lost": (m_lost, "lost_writes", {"skipped_polls", "torn_transactions", "exactly_once"}),
    "unseen_or_torn": (m_unseen_or_torn, "torn_transactions", {"exactly_once"}),
    "rewind": (m_rewind, "nonmonotonic_polls", set()),
    "skip": (m_skip, "skipped_polls", set()),
    "send_order": (m_send_order, "nonmonotonic_sends", set()),
    "own_write": (m_own_write, "own_uncommitted_reads", set()),
    "g1c": (m_g1c, "g1c_cycles", set()),
    "processed_twice": (m_processed_twice, "exactly_once", set()),
    "phantom": (m_phantom, "phantom_reads", set()),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
@given(data=st.data())
@settings(SIM, max_examples=25)
def test_mutated_simulated_history_reports_the_planted_anomaly(
    tmp_path: Path, name: str, data: st.DataObject
) -> None:
    mutate, planted, consequences = MUTATIONS[name]
    history = data.draw(sim_histories(tmp_path))
    assert check(history).valid
    result = check(mutate(history, data))
    assert planted in result.kinds(), result.summary()
    assert result.kinds() <= {planted, *consequences}, result.summary()


def test_unseen_is_reported_for_a_single_write_transaction() -> None:
    history = History(
        (
            op("p.0", "ok", w("t", "a", 0, 0)),
            op("p.1", "ok", w("t", "b", 0, 1)),
            op("f.0", "ok", r("t", "a", 0, 0), phase="final"),
        )
    )
    assert_only(history, "unseen")


# ------------------------------------------------------------------------ file format


@given(data=st.data())
@SIM
def test_history_file_round_trip(tmp_path: Path, data: st.DataObject) -> None:
    history = data.draw(sim_histories(tmp_path))
    path = tmp_path / f"copy{time.monotonic_ns()}.jsonl"
    dump_history(history, path)
    assert load_history(path) == history


def test_hand_written_history_round_trip(tmp_path: Path) -> None:
    dump_history(CLEAN, tmp_path / "h.jsonl")
    assert load_history(tmp_path / "h.jsonl") == CLEAN


def test_torn_last_line_is_dropped_and_unfinished_operation_is_info(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    with HistoryWriter(path) as h:
        h.invoke("p.0", "p", consumer="c")
        h.poll("p.0", Poll("t", 0, (0, 1, 0), "v"))
        h.send("p.0", "u", "x", key="v", source="v")
    with path.open("a") as f:
        f.write('{"e":"sent","op":"p.0","value":"x","partit')  # cut by the kill
    history = load_history(path)
    (o,) = history.operations
    assert o.type == "info" and o.error is not None and "died" in o.error
    assert o.ops == (Poll("t", 0, (0, 1, 0), "v"), Send("u", "x", key="v", source="v"))


def test_damage_before_the_last_line_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text(
        '{"e":"invoke","op":"p.0","process":"p","consumer":null,"isolation":"read_committed","phase":"workload"}\n{oops\n{"e":"complete","op":"p.0","type":"ok","error":null}\n'
    )
    with pytest.raises(HistoryFormatError, match=r"h.jsonl:2: not JSON"):
        load_history(path)


@pytest.mark.parametrize(
    ("line", "match"),
    [
        (
            '{"e":"poll","op":"nope","topic":"t","partition":0,"position":[1],"value":"v"}',
            "never invoked",
        ),
        (
            '{"e":"invoke","op":"p.0","process":"p","consumer":null,"isolation":"dirty","phase":"workload"}',
            "isolation",
        ),
        (
            '{"e":"invoke","op":"p.0","process":7,"consumer":null,"isolation":"read_committed","phase":"workload"}',
            "'process' must be str",
        ),
        ('{"e":"what","op":"p.0"}', "never invoked"),
    ],
)
def test_bad_events_are_named(tmp_path: Path, line: str, match: str) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(HistoryFormatError, match=match):
        load_history(path)


CHILD = """
import sys
from pathlib import Path
from tests.jepsen.history import Poll, HistoryWriter
h = HistoryWriter(Path(sys.argv[1]))
n = 0
while True:
    op = f"p.{n}"
    h.invoke(op, "p", consumer="c")
    h.poll(op, Poll("t", 0, (0, n, 0), f"v{n}"))
    h.send(op, "u", f"x{n}", source=f"v{n}")
    h.sent(op, f"x{n}", 0, (0, n, 0))
    h.complete(op, "ok")
    n += 1
    if n == 200:
        print("ready", flush=True)
"""


def test_history_survives_kill_9_of_the_writer(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    history = load_history(path)
    assert len(history) >= 200
    *done, last = history.operations
    assert all(o.type == "ok" and len(o.ops) == 2 for o in done)
    assert [o.id for o in history] == [f"p.{n}" for n in range(len(history))]
    assert last.type in ("ok", "info")
