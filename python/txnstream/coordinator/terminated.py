"""TerminatedTxnStore (PIP-255): remembers how recent transactions ended.

Per client name the store keeps the newest ``persist_count`` terminated
transactions (id, final status, end time, timed-out flag) in memory; memory
is bounded by ``persist_count`` x clients. Each end is persisted *before*
the coordinator logs the final COMMITTED/ABORTED record, so a crash cannot
lose it.

Layout of the compacted topic (``__terminated_txn_state_<tc_id>``): one key
**per transaction**, ``"<most>:<least>"``, whose value is a
``TerminatedTxnState`` holding that client's name and the one transaction.
Pulsar keys its topic by client name and rewrites the client's whole list
on every end; that costs O(``persist_count``) bytes per end and makes the
topic grow by that much each time. With a key per transaction an end costs
O(1) bytes: one record for the new transaction plus a tombstone for the one
it pushes out of the client's newest ``persist_count`` (both in one group
commit). "Newest ``count`` per client" is rebuilt on :meth:`restore` by
grouping the values by client name.

Tombstones and overwritten values are garbage until the topic is
compacted: :meth:`sweep` (run every ``expire_check_interval`` by
:class:`StoreMaintenance`) drops entries older than ``persist_time_ms``
and compacts when a quarter of the records are garbage, and writes request
a compaction once the topic holds more than about twice the live keys, so
the topic stays O(live keys).

End times are wall-clock milliseconds: they are persisted and compared
across restarts. With the feature off (``persist_count == 0``) nothing is
recorded and nothing stored is touched, so switching it off for a while
loses no stored outcome.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from txnstream.coordinator.metadata import TxnID, TxnStatus
from txnstream.errors import CorruptEntryError, InvalidArgumentError
from txnstream.proto import TerminatedTxnState
from txnstream.timer import Clock, TimerScope, clock_arg

log = logging.getLogger(__name__)

#: Writes request a compaction once garbage exceeds the live keys plus this.
COMPACT_SLACK = 1024


def _takes_timeout(put_many: Callable[..., object]) -> bool:
    # Whether a persistence's put_many accepts ``timeout_ms`` (an older one may not).
    try:
        params = inspect.signature(put_many).parameters
    except (TypeError, ValueError):  # a builtin without a signature: try it
        return True
    return "timeout_ms" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


class TerminatedPersistence(Protocol):
    """Durable key/value storage for the store (a compacted topic)."""

    def put_many(
        self, records: Sequence[tuple[str, bytes | None]], timeout_ms: float | None = None
    ) -> object:
        """Store every ``(key, value)`` durably, in order; a ``None`` value deletes.

        ``timeout_ms`` bounds the wait (the built-in ``TimeoutError``; the
        records may still be written). A persistence without the parameter
        still works: its writes are not bounded.
        """

    def items(self) -> Iterable[tuple[str, bytes]]:
        """Every live key and its newest value."""

    def compact(self) -> object:
        """Drop everything but the newest value of each live key."""


@dataclass(frozen=True, slots=True)
class TerminatedRecord:
    """How a transaction ended, as the store remembers it."""

    txn_id: TxnID
    client_name: str
    status: TxnStatus
    end_time: int
    timed_out: bool


def txn_key(txn_id: TxnID) -> str:
    """Topic key of one terminated transaction: ``"<most>:<least>"``."""
    return f"{txn_id.most_bits}:{txn_id.least_bits}"


def _final(status: TxnStatus) -> TxnStatus:
    # ABORTING counts as ABORTED, COMMITTING as COMMITTED: the outcome is decided.
    if status in (TxnStatus.ABORTING, TxnStatus.ABORTED):
        return TxnStatus.ABORTED
    if status in (TxnStatus.COMMITTING, TxnStatus.COMMITTED):
        return TxnStatus.COMMITTED
    raise InvalidArgumentError(
        f"only ended transactions can be stored, got status {status.name}",
        argument="status",
        value=status,
    )


def _encode(client: str, txn_id: TxnID, status: TxnStatus, end_time: int, timed_out: bool) -> bytes:
    state = TerminatedTxnState(client_name=client)
    state.txns.add(
        txnid_least_bits=txn_id.least_bits,
        txnid_most_bits=txn_id.most_bits,
        status=int(status),
        end_time=end_time,
        timed_out=timed_out,
    )
    return state.SerializeToString()


class TerminatedTxnStore:
    """Per-client memory of terminated transactions, persisted and expiring.

    ``schedule_compaction``, when set, is called (without locks held) when
    writes have left enough garbage in the topic; it should arrange for
    :meth:`compact` to run in the background. Unset, writes compact inline.
    """

    def __init__(
        self,
        persist_count: int = 0,
        persist_time_ms: int = 72 * 3_600_000,
        *,
        persistence: TerminatedPersistence | None = None,
        clock: Clock | None = None,
    ) -> None:
        if isinstance(persist_count, bool) or not isinstance(persist_count, int):
            raise InvalidArgumentError(
                f"transaction_meta_persist_count must be an int, got {persist_count!r}",
                argument="transaction_meta_persist_count",
                value=persist_count,
            )
        if persist_count < 0:
            raise InvalidArgumentError(
                f"transaction_meta_persist_count must be >= 0, got {persist_count}",
                argument="transaction_meta_persist_count",
                value=persist_count,
            )
        if persist_time_ms <= 0:
            raise InvalidArgumentError(
                f"transaction_meta_persist_time must be > 0, got {persist_time_ms} ms",
                argument="transaction_meta_persist_time_in_hour",
                value=persist_time_ms,
            )
        self.persist_count = persist_count
        self.persist_time_ms = persist_time_ms
        self.schedule_compaction: Callable[[], None] | None = None
        self._persistence = persistence
        # Persistences written before ``timeout_ms`` existed take the records only.
        self._put_deadline = persistence is not None and _takes_timeout(persistence.put_many)
        self._clock = clock_arg(clock)
        self._lock = threading.Lock()
        # client -> {txn_id: (status, end_time, timed_out)} in end order (oldest first).
        self._clients: dict[str, dict[TxnID, tuple[TxnStatus, int, bool]]] = {}
        self._index: dict[TxnID, str] = {}
        # Records in the topic (live + garbage) as far as this process knows;
        # ``_unknown``: the topic may hold garbage from before the restore.
        self._entries = 0
        self._unknown = False
        self._compaction_due = False
        self._compact_lock = threading.Lock()
        self.puts = 0
        self.compactions = 0

    @property
    def enabled(self) -> bool:
        """False when ``persist_count == 0`` (the default, as in Pulsar)."""
        return self.persist_count > 0

    def __len__(self) -> int:
        """Return the number of remembered transactions."""
        with self._lock:
            return len(self._index)

    def clients(self) -> list[str]:
        """Client names with at least one remembered transaction."""
        with self._lock:
            return list(self._clients)

    def topic_entries(self) -> int:
        """Return the records in the topic (live keys + garbage not yet compacted)."""
        with self._lock:
            return self._entries

    def lookup(self, txn_id: TxnID) -> TerminatedRecord | None:
        """How ``txn_id`` ended, or None if the store does not remember it."""
        with self._lock:
            client = self._index.get(txn_id)
            if client is None:
                return None
            status, end_time, timed_out = self._clients[client][txn_id]
            return TerminatedRecord(txn_id, client, status, end_time, timed_out)

    def record(
        self,
        txn_id: TxnID,
        client_name: str | None,
        status: TxnStatus,
        *,
        timed_out: bool = False,
        end_time: int | None = None,
        timeout_ms: int | None = None,
    ) -> bool:
        """Remember that ``txn_id`` ended with ``status`` and persist it durably.

        ``end_time`` (wall-clock ms, default now) orders the client's
        transactions: the coordinator passes the time of its decision, which
        a retry repeats. Returns False (nothing stored) when the store is
        disabled, the transaction has no client name, or it ended before all
        of the client's newest ``persist_count`` (a retried end of a
        transaction already pushed out stays out). Writes one record (plus a
        tombstone for the client's transaction it pushes out); recording the
        same transaction again rewrites its record, so it returns only once
        that record is durable too.
        """
        if not self.enabled or not client_name:
            return False
        times = None if end_time is None else [end_time]
        item = [(txn_id, client_name, status, timed_out)]
        return self.record_many(item, end_times=times, timeout_ms=timeout_ms) == 1

    def record_many(
        self,
        items: Sequence[tuple[TxnID, str | None, TxnStatus, bool]],
        *,
        end_times: Sequence[int] | None = None,
        timeout_ms: int | None = None,
    ) -> int:
        """:meth:`record` for many ``(txn_id, client_name, status, timed_out)`` at once.

        ``end_times``, when given, holds each item's end time (else all end
        now). One durable write for all of them (plus their tombstones);
        items without a client name, or older than all of the client's
        newest ``persist_count``, are skipped. Returns how many were recorded.
        """
        if not self.enabled:
            return 0
        if end_times is not None and len(end_times) != len(items):
            raise InvalidArgumentError(
                f"{len(end_times)} end times for {len(items)} transactions",
                argument="end_times",
                value=len(end_times),
            )
        writes: list[tuple[str, bytes | None]] = []
        recorded: list[TxnID] = []
        with self._lock:
            now = self._clock.wall_ms()
            for i, (txn_id, client_name, status, timed_out) in enumerate(items):
                if not client_name:
                    continue
                final = _final(status)
                entries = self._clients.get(client_name)
                if entries is None:
                    entries = self._clients[client_name] = {}
                row = entries.get(txn_id)
                if row is None:
                    row = (final, now if end_times is None else end_times[i], timed_out)
                    if not self._insert(entries, txn_id, row):
                        continue
                    self._index[txn_id] = client_name
                writes.append((txn_key(txn_id), _encode(client_name, txn_id, *row)))
                recorded.append(txn_id)
                while len(entries) > self.persist_count:
                    oldest = next(iter(entries))
                    del entries[oldest]
                    del self._index[oldest]
                    writes.append((txn_key(oldest), None))
        self._write(writes, timeout_ms)
        self._forget_if_gone(recorded)
        return len(recorded)

    def _insert(
        self,
        entries: dict[TxnID, tuple[TxnStatus, int, bool]],
        txn_id: TxnID,
        row: tuple[TxnStatus, int, bool],
    ) -> bool:
        # Under the lock: keep ``entries`` in end-time order (ties: the later
        # call is newer). False: it ended before every one of a full client's
        # remembered transactions, so it would be pushed out at once.
        end_time = row[1]
        if not entries or end_time >= next(reversed(entries.values()))[1]:
            entries[txn_id] = row  # the usual case: it is the newest
            return True
        if len(entries) >= self.persist_count and end_time < next(iter(entries.values()))[1]:
            return False
        # Ends decided concurrently arrive a little out of order: lift off the
        # few newer ones from the end, put this one down, put them back. The
        # work follows how late it is, not how many are remembered (rebuilding
        # the whole dict cost 366 TxnID hashes per unit at 16 threads, benches/RESULTS.md).
        newer: list[tuple[TxnID, tuple[TxnStatus, int, bool]]] = []
        while entries:
            tid, r = entries.popitem()
            if r[1] <= end_time:
                entries[tid] = r  # back where it was: the newest not after this one
                break
            newer.append((tid, r))
        entries[txn_id] = row
        for tid, r in reversed(newer):
            entries[tid] = r
        return True

    def _write(self, writes: list[tuple[str, bytes | None]], timeout_ms: int | None = None) -> None:
        if self._persistence is None or not writes:
            return
        if timeout_ms is not None and self._put_deadline:
            self._persistence.put_many(writes, timeout_ms=timeout_ms)
        else:
            self._persistence.put_many(writes)
        with self._lock:
            self.puts += len(writes)
            self._entries += len(writes)
            due = not self._compaction_due and self._entries > 2 * len(self._index) + COMPACT_SLACK
            if due:
                self._compaction_due = True
        if due:
            if self.schedule_compaction is not None:
                self.schedule_compaction()
            else:
                self.compact()

    def _forget_if_gone(self, txn_ids: Iterable[TxnID]) -> None:
        # A record that became durable after its transaction was pushed out
        # or expired by another thread (whose tombstone may have landed
        # first) must not stay live in the topic.
        if self._persistence is None:
            return
        with self._lock:
            gone: list[tuple[str, bytes | None]] = [
                (txn_key(t), None) for t in txn_ids if t not in self._index
            ]
        if gone:
            self._write(gone)

    def compact(self, min_garbage_ratio: float = 0.0) -> bool:
        """Compact the topic if garbage exceeds ``min_garbage_ratio`` x live keys.

        Returns True when it compacted. Any garbage at all counts with the
        default ratio 0; garbage from before the last restore is unknown and
        always counts.
        """
        if self._persistence is None:
            return False
        with self._compact_lock:
            with self._lock:
                live = len(self._index)
                garbage = self._entries - live
                wanted = self._unknown or (garbage > 0 and garbage >= min_garbage_ratio * live)
                if not wanted:
                    self._compaction_due = False
                    return False
            self._persistence.compact()
            with self._lock:
                self._entries = len(self._index)
                self._unknown = False
                self._compaction_due = False
                self.compactions += 1
            return True

    def sweep(self) -> int:
        """Drop entries older than ``persist_time_ms``; return how many went.

        Their keys are deleted from the topic, which is then compacted when
        at least a quarter of its records are garbage.
        """
        cutoff = self._clock.wall_ms() - self.persist_time_ms
        writes: list[tuple[str, bytes | None]] = []
        with self._lock:
            for client in list(self._clients):
                entries = self._clients[client]
                # Entries are in end order; stop at the first one still young.
                for tid, (_, end_time, _) in list(entries.items()):
                    if end_time > cutoff:
                        break
                    del entries[tid]
                    del self._index[tid]
                    writes.append((txn_key(tid), None))
                if not entries:
                    del self._clients[client]
        self._write(writes)
        self.compact(min_garbage_ratio=0.25)
        return len(writes)

    def restore(self) -> int:
        """Load the persisted state (recovery); return the transactions restored.

        Keeps the newest ``persist_count`` per client that are younger than
        ``persist_time_ms``; keys of the others are deleted. With the store
        off nothing is loaded and nothing deleted. A value that is not a
        ``TerminatedTxnState`` holding the one transaction its key names
        raises :class:`CorruptEntryError` naming the key.
        """
        if self._persistence is None or not self.enabled:
            return 0
        cutoff = self._clock.wall_ms() - self.persist_time_ms
        # client -> txn -> (status, end_time, timed_out)
        found: dict[str, dict[TxnID, tuple[TxnStatus, int, bool]]] = {}
        writes: list[tuple[str, bytes | None]] = []
        keys = 0
        for key, value in self._persistence.items():
            keys += 1
            state = TerminatedTxnState()
            try:
                state.ParseFromString(value)
                if len(state.txns) != 1:
                    raise ValueError(f"{len(state.txns)} transactions in one value")
                t = state.txns[0]
                tid = TxnID(t.txnid_most_bits, t.txnid_least_bits)
                if key != txn_key(tid):
                    raise ValueError(f"it holds transaction {tid}")
                row = (_final(TxnStatus(t.status)), t.end_time, t.timed_out)
            except Exception as exc:
                raise CorruptEntryError(
                    f"terminated-transaction state under key {key!r} is corrupt: {exc}",
                    key=key,
                ) from exc
            found.setdefault(state.client_name, {})[tid] = row
        with self._lock:
            self._clients.clear()
            self._index.clear()
            for name, txns in found.items():
                ordered = sorted(txns.items(), key=lambda kv: kv[1][1])
                keep = [kv for kv in ordered[-self.persist_count :] if kv[1][1] > cutoff]
                kept = {tid for tid, _ in keep}
                writes.extend((txn_key(tid), None) for tid, _ in ordered if tid not in kept)
                if not keep:
                    continue
                entries = self._clients[name] = {}
                for tid, row in keep:
                    entries[tid] = row
                    self._index[tid] = name
            restored = len(self._index)
            self._entries = keys
            self._unknown = True  # garbage written before the restart is not counted
        self._write(writes)
        return restored


class StoreMaintenance:
    """Upkeep of the store: the expiry sweep by timer, compactions on demand.

    Both run on one maintenance thread of their own, so they never queue
    behind transaction ends (and ends never wait for them). The sweep is
    scheduled on the coordinator's timer scope, every ``interval_ms``.
    """

    def __init__(
        self,
        store: TerminatedTxnStore,
        timers: TimerScope,
        interval_ms: int,
        *,
        name: str,
    ) -> None:
        self._store = store
        self._timers = timers
        self._interval_ms = interval_ms
        self._stopped = False
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=name)
        store.schedule_compaction = self._schedule_compaction

    def _submit(self, fn: Callable[[], None]) -> None:
        # RuntimeError: the pool is shut down, the coordinator is closing.
        with contextlib.suppress(RuntimeError):
            self._pool.submit(fn)

    def _schedule_compaction(self) -> None:
        self._submit(self._compact)

    def _compact(self) -> None:
        try:
            self._store.compact()
        except Exception:
            if not self._stopped:
                log.exception("compacting the terminated-transaction topic failed")

    def start_sweeps(self) -> None:
        """Sweep expired entries every interval until shutdown (nothing if the store is off)."""
        if self._store.enabled:
            self._arm()

    def _arm(self) -> None:
        with contextlib.suppress(RuntimeError):  # the scope is closed
            self._timers.schedule(
                self._timers.clock.monotonic_ms() + self._interval_ms,
                lambda: self._submit(self._sweep),
            )

    def _sweep(self) -> None:
        try:
            self._store.sweep()
        except Exception:
            log.exception("terminated-transaction sweep failed")
        if not self._stopped:
            self._arm()

    def shutdown(self) -> None:
        """Stop the maintenance thread (queued work is dropped)."""
        self._stopped = True
        self._pool.shutdown(wait=True, cancel_futures=True)


__all__ = [
    "StoreMaintenance",
    "TerminatedPersistence",
    "TerminatedRecord",
    "TerminatedTxnStore",
    "txn_key",
]
