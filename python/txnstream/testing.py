"""Test doubles, fault hooks and deterministic time for txnstream's own tests.

Nothing in the engine imports this module; it is not part of the public
API of the components. It holds:

- **fault hooks** for a real managed ledger (:func:`inject_fault`,
  :func:`hold_fault`, ...): an injected ``ENOSPC``/``EIO`` fails the writes
  or syncs it hits exactly as the operating system would;
- **deterministic time**: :class:`ManualClock` (monotonic and wall time
  move only when told; waiting on it advances it) and :func:`settle`,
  which runs due timers and waits for a coordinator's background work;
- **test doubles** of the coordinator's collaborators: an in-memory log,
  sequence store and terminated-store topic, and participants that record
  every end and fail on demand;
- access to a coordinator's internals that tests observe
  (:func:`live_meta`, :func:`set_step_hook`, :data:`STEPS`, ...).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import numpy as np

from txnstream import frame
from txnstream._native import ManagedLedger, TxnPosition, fold_txn_entries
from txnstream.coordinator.ending import STEPS
from txnstream.coordinator.state import PositionColumns
from txnstream.errors import StorageError, TransactionError, WriterClosedError

if TYPE_CHECKING:
    from txnstream.coordinator import AsyncCoordinator, TransactionCoordinator, TxnID
    from txnstream.coordinator.metadata import TxnMeta
    from txnstream.coordinator.state import FoldResult
    from txnstream.frame import TxnLogColumns
    from txnstream.timer import TimerService


# ------------------------------------------------------------------ fault hooks


def _hooks() -> Any:
    """Return the native fault hooks.

    They are built only with the cargo feature ``testing`` (as ``make build``
    does); a release wheel has none.
    """
    try:
        from txnstream._native import _testing  # type: ignore[attr-defined]
    except ImportError as e:  # pragma: no cover - depends on the build
        raise RuntimeError(
            "txnstream was built without the cargo feature 'testing': fault hooks are "
            "only in development builds (make build)"
        ) from e
    return _testing


def inject_fault(ml: ManagedLedger, kind: str, errno: int = 5, times: int = 1) -> None:
    """Make the next ``times`` calls of ``kind`` fail with ``errno``.

    The hooks act on ``ml``'s whole data directory (its ledgers share one
    journal). ``kind``: ``"write"`` (half the group reaches the journal, then the
    error), ``"sync"``, ``"preallocate"``, ``"read"``, ``"meta"`` (a
    catalog write at a checkpoint) or ``"checkpoint"`` (a checkpoint, after
    it listed the directory's ledgers).
    """
    _hooks().inject_fault(ml, kind, errno, times)


def inject_panic(ml: ManagedLedger, kind: str) -> None:
    """Make the next call of ``kind`` panic on the storage thread that makes it.

    A bug's worst case: every caller must still get an answer (an error),
    and nothing more is written until the directory is opened again.
    """
    _hooks().inject_panic(ml, kind)


def hold_fault(ml: ManagedLedger, kind: str) -> None:
    """Hold every later call of ``kind`` at a gate until :func:`release_fault`."""
    _hooks().hold_fault(ml, kind)


def release_fault(ml: ManagedLedger, kind: str) -> None:
    """Let calls held by :func:`hold_fault` go on."""
    _hooks().release_fault(ml, kind)


def wait_fault_held(ml: ManagedLedger, kind: str, timeout_ms: int = 10_000) -> bool:
    """Wait until a call of ``kind`` is held at its gate; False after ``timeout_ms``."""
    return bool(_hooks().wait_fault_held(ml, kind, timeout_ms))


def clear_faults(ml: ManagedLedger) -> None:
    """Disarm every injected fault and open every gate."""
    _hooks().clear_faults(ml)


# ------------------------------------------------------------ coordinator access


def log_ledger(tc: TransactionCoordinator) -> ManagedLedger:
    """Return the managed ledger under ``tc``'s transaction log (to inject faults into)."""
    ml: ManagedLedger = tc._log.ml  # type: ignore[attr-defined]
    return ml


def set_step_hook(tc: TransactionCoordinator, hook: Callable[[str, TxnID], None] | None) -> None:
    """Call ``hook(step, txn_id)`` at each of :data:`STEPS` of every end of ``tc``."""
    tc._driver.step_hook = hook


def live_meta(tc: TransactionCoordinator, txn: TxnID) -> TxnMeta | None:
    """``tc``'s live record of ``txn`` (None if not live). Read it, do not change it."""
    return tc._table.txns.get(txn.least_bits)


def fire_timeout(tc: TransactionCoordinator, txn: TxnID) -> None:
    """Run ``txn``'s timeout handler now, in this thread (as a late timer would)."""
    tc._driver.run_background(txn.least_bits, timed_out=True)


def wait_closed(tc: TransactionCoordinator, timeout_ms: int = 30_000) -> None:
    """Wait until ``tc.close()`` (running in another thread) has stopped intake."""
    wait_until(lambda: tc._table.closed, timeout_ms)


def queued_calls(aio: AsyncCoordinator) -> int:
    """Return how many calls are queued in ``aio``'s lanes, not yet taken by a bulk call."""
    return aio.queued()


def settle(
    tc: TransactionCoordinator, timers: TimerService | None = None, timeout_ms: int = 30_000
) -> None:
    """Run due timers and wait until ``tc``'s background ends are idle, until quiet.

    With a :class:`ManualClock` and ``TimerService(start=False)`` this makes
    background work deterministic: advance the clock, then settle.
    """
    end = time.monotonic() + timeout_ms / 1000.0
    while True:
        ran = timers.run_due() if timers is not None else 0
        if not tc._background.wait_idle(max(0.0, end - time.monotonic())):
            raise AssertionError("background ends did not finish in time")
        quiet = ran == 0 and (timers is None or timers.run_due() == 0)
        if quiet and tc._background.wait_idle(0):
            return
        if time.monotonic() > end:
            raise AssertionError("background work did not settle in time")


def wait_until(cond: Callable[[], bool], timeout_ms: int = 30_000) -> None:
    """Poll ``cond`` until true; fail after ``timeout_ms`` (a hang guard, not a timing test)."""
    end = time.monotonic() + timeout_ms / 1000.0
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("condition not reached in time")
        time.sleep(0.002)


def wait_child(pid: int, timeout_ms: int) -> int | None:
    """Wait for forked child ``pid``; its exit code, or None if it hung (it is then killed)."""
    end = time.monotonic() + timeout_ms / 1000.0
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return None


# ---------------------------------------------------------------------- time


class ManualClock:
    """A :class:`txnstream.timer.Clock` that moves only when told.

    :meth:`advance` moves monotonic and wall time together;
    :meth:`step_wall` moves only the wall clock (an NTP step). A wait on
    this clock waits for the event for at most the timeout in real time
    (another thread may set it), and if it was not set, the clock has
    moved on by the timeout: a wait is the only way time passes by itself.
    Timers on a ``TimerService(clock, start=False)`` run only on
    :func:`settle` (or ``run_due``), so background work stays deterministic.
    """

    def __init__(self, wall_ms: int = 1_700_000_000_000, monotonic_ms: int = 1_000_000) -> None:
        self._lock = threading.Lock()
        self.wall = wall_ms
        self.mono = monotonic_ms

    def monotonic_ms(self) -> int:
        """Return the manual monotonic time."""
        with self._lock:
            return self.mono

    def wall_ms(self) -> int:
        """Return the manual wall time."""
        with self._lock:
            return self.wall

    def wait(self, event: threading.Event, timeout_ms: float) -> bool:
        """Wait for ``event`` up to ``timeout_ms``; if it stays unset, advance by that much."""
        if event.wait(max(0.0, timeout_ms) / 1000.0):
            return True
        self.advance(max(0, int(timeout_ms)))
        return event.is_set()

    def advance(self, ms: int) -> None:
        """Let ``ms`` milliseconds pass (both clocks)."""
        with self._lock:
            self.mono += ms
            self.wall += ms

    def step_wall(self, ms: int) -> None:
        """Step only the wall clock by ``ms`` (may be negative)."""
        with self._lock:
            self.wall += ms


# ------------------------------------------------------------------- doubles


class InMemoryTransactionLog:
    """A coordinator log held in memory: same records, framing and fold (not durable).

    Each record becomes its own entry unless written with :meth:`write_many`,
    which frames them as one batched entry, so recovery sees the same mix of
    batched and unbatched entries as a real log.
    """

    def __init__(self) -> None:
        self._entries: list[bytes | None] = []
        self._deleted: dict[int, set[int]] = {}
        self._sizes: list[int] = []
        self._lock = threading.Lock()
        self._closed = False
        self.batch_enabled = True

    def reopen(self) -> InMemoryTransactionLog:
        """Return a new log over the same records (simulates a restart)."""
        other = InMemoryTransactionLog()
        other._entries = self._entries
        other._deleted = self._deleted
        other._sizes = self._sizes
        return other

    @staticmethod
    def _done(pos: TxnPosition) -> Future[TxnPosition]:
        fut: Future[TxnPosition] = Future()
        fut.set_result(pos)
        return fut

    def write(self, record: bytes) -> Future[TxnPosition]:
        """Store ``record`` as its own entry."""
        with self._lock:
            if self._closed:
                raise WriterClosedError("in-memory transaction log is closed")
            self._entries.append(record)
            self._sizes.append(1)
            return self._done(TxnPosition(0, len(self._entries) - 1, 1, 0))

    def write_sync(self, record: bytes, timeout_ms: int | None = None) -> TxnPosition:
        """Store ``record`` as its own entry and return its position."""
        return self.write(record).result(None if timeout_ms is None else timeout_ms / 1000.0)

    def write_many(self, records: Sequence[bytes]) -> list[Future[TxnPosition]]:
        """Store ``records`` as one batched entry."""
        with self._lock:
            if self._closed:
                raise WriterClosedError("in-memory transaction log is closed")
            self._entries.append(frame.encode_batch(list(records)))
            self._sizes.append(len(records))
            eid = len(self._entries) - 1
            n = len(records)
            return [self._done(TxnPosition(0, eid, n, i)) for i in range(n)]

    def write_many_sync(
        self, records: Sequence[bytes], timeout_ms: int | None = None
    ) -> list[TxnPosition]:
        """Store ``records`` as one batched entry and return their positions."""
        wait = None if timeout_ms is None else timeout_ms / 1000.0
        return [f.result(wait) for f in self.write_many(records)]

    def delete(self, records: PositionColumns | Sequence[TxnPosition]) -> None:
        """Delete records; an entry whose records are all deleted is dropped."""
        if isinstance(records, PositionColumns):
            pairs = list(zip(records.entry_id.tolist(), records.batch_index.tolist(), strict=True))
        else:
            pairs = [(p.entry_id, p.batch_index) for p in records]
        with self._lock:
            for eid, bidx in pairs:
                if eid >= len(self._entries) or self._entries[eid] is None:
                    continue
                gone = self._deleted.setdefault(eid, set())
                gone.add(bidx)
                if len(gone) >= self._sizes[eid]:
                    self._entries[eid] = None
                    del self._deleted[eid]

    def fold(self, tc_id: int) -> FoldResult:
        """Fold the live entries in Rust (as the ledger log does)."""
        from txnstream.coordinator.state import FoldResult

        with self._lock:
            live = [(i, e) for i, e in enumerate(self._entries) if e is not None]
            deleted = [sorted(self._deleted.get(i, ())) for i, _ in live]
        return FoldResult.from_native(
            fold_txn_entries(
                [e for _, e in live], [0] * len(live), [i for i, _ in live], deleted, tc_id
            )
        )

    def live_entries(self) -> int:
        """Return how many entries still hold a live record."""
        with self._lock:
            return sum(e is not None for e in self._entries)

    def entries(self) -> list[bytes | None]:
        """Return the entries (None: deleted whole)."""
        with self._lock:
            return list(self._entries)

    def columns(self) -> Iterator[tuple[TxnLogColumns, list[int], np.ndarray[Any, Any]]]:
        """Yield the live entries decoded: ``(columns, entry ids, deleted mask per record)``."""
        with self._lock:
            live = [(i, e) for i, e in enumerate(self._entries) if e is not None]
            deleted = {k: set(v) for k, v in self._deleted.items()}
        if not live:
            return
        cols = frame.decode_txn_log_columns([e for _, e in live])
        ids = [i for i, _ in live]
        ent, bidx = cols["entry_index"].tolist(), cols["batch_index"].tolist()
        mask = np.array(
            [b in deleted.get(ids[e], ()) for e, b in zip(ent, bidx, strict=True)], np.bool_
        )
        yield cols, ids, mask

    def set_batch_enabled(self, enabled: bool) -> None:
        """Record the switch (the in-memory log never delays records)."""
        self.batch_enabled = enabled

    def stats(self) -> dict[str, Any]:
        """Return entry counts."""
        return {"entries": len(self._entries), "live_entries": self.live_entries()}

    def close(self) -> None:
        """Reject further writes."""
        with self._lock:
            self._closed = True


class InMemorySequence:
    """A sequence-mark store in memory; :meth:`fail_next` makes stores fail (ENOSPC)."""

    def __init__(self) -> None:
        self.mark = 0
        self.stores = 0
        self._fail = 0

    def fail_next(self, n: int) -> None:
        """Make the next ``n`` stores raise ``StorageError`` (nothing stored)."""
        self._fail = n

    def load(self) -> int:
        """Return the mark."""
        return self.mark

    def store(self, mark: int) -> None:
        """Replace the mark, or fail as told."""
        if self._fail:
            self._fail -= 1
            raise StorageError("injected: no space left to store the sequence mark", errno=28)
        self.mark = mark
        self.stores += 1


class InMemoryTerminatedPersistence:
    """Compacted-topic semantics in memory (newest value per key; None deletes).

    ``entries`` counts records as a topic would hold them (tombstones and
    overwritten values included) until :meth:`compact`; :meth:`fail_next`
    makes writes fail.
    """

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.puts = 0
        self.entries = 0
        self.compactions = 0
        self._fail = 0
        self._lock = threading.Lock()

    def fail_next(self, n: int) -> None:
        """Make the next ``n`` writes raise ``StorageError`` (nothing stored)."""
        self._fail = n

    def put(self, key: str, value: bytes | None) -> None:
        """Store or delete ``key``."""
        self.put_many([(key, value)])

    def put_many(
        self, records: Sequence[tuple[str, bytes | None]], timeout_ms: float | None = None
    ) -> None:
        """Store or delete every key, in order (or fail as told); never waits."""
        with self._lock:
            if self._fail:
                self._fail -= 1
                raise StorageError("injected: the terminated-store write failed", errno=5)
            for key, value in records:
                self.puts += 1
                self.entries += 1
                if value is None:
                    self.data.pop(key, None)
                else:
                    self.data[key] = value

    def items(self) -> list[tuple[str, bytes]]:
        """Return every key and value."""
        with self._lock:
            return list(self.data.items())

    def compact(self) -> dict[str, int]:
        """Forget garbage: only the live keys remain."""
        with self._lock:
            before, self.entries = self.entries, len(self.data)
            self.compactions += 1
            return {"entries_before": before, "entries_after": self.entries}


class TransientParticipantError(TransactionError):
    """A participant is temporarily unable to end a transaction (retry later)."""

    retriable = True


class RecordingParticipant:
    """In-memory participant that records every end and can fail on demand.

    ``fail_next(n)`` makes the next ``n`` calls raise
    :class:`TransientParticipantError`; ``hook`` (if set) runs before each
    successful end, e.g. to block or kill the process in tests. ``outcomes``
    maps each transaction to the outcome it ended with; a later call with
    the opposite outcome is recorded in ``conflicts`` (it would be a bug).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: list[tuple[TxnID, bool]] = []
        self.outcomes: dict[TxnID, bool] = {}
        self.conflicts: list[tuple[TxnID, bool]] = []
        self.failures = 0
        self.hook: Callable[[TxnID, bool], object] | None = None
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
    "STEPS",
    "InMemorySequence",
    "InMemoryTerminatedPersistence",
    "InMemoryTransactionLog",
    "ManualClock",
    "RecordingParticipant",
    "RecordingParticipants",
    "TransientParticipantError",
    "clear_faults",
    "fire_timeout",
    "hold_fault",
    "inject_fault",
    "inject_panic",
    "live_meta",
    "log_ledger",
    "queued_calls",
    "release_fault",
    "set_step_hook",
    "settle",
    "wait_closed",
    "wait_fault_held",
    "wait_until",
]


# ---------------------------------------------------------------- tiered storage


def set_remote_call_hook(remote: Any, hook: Callable[[str, str], None] | None) -> None:
    """Call ``hook(kind, op)`` before every call of a ``RemoteStorage``.

    The hook may sleep (a per-call latency standing in for object storage)
    or raise (a remote failure at that call). ``None`` removes it.
    """
    remote._before_call = hook


def remote_latency(ms: float) -> Callable[[str, str], None]:
    """Return a remote-call hook that sleeps ``ms`` milliseconds per remote call.

    ``metadata`` calls are served from the local ``__remote_log_metadata``
    ledger, so they are counted but not delayed.
    """

    def sleep(kind: str, op: str) -> None:
        if kind != "metadata":
            time.sleep(ms / 1000)

    return sleep
