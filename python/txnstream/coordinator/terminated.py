"""TerminatedTxnStore (PIP-255): remembers how recent transactions ended.

Per client name the store keeps the newest ``persist_count`` terminated
transactions (id, final status, end time, timed-out flag). Each change is
persisted -- the client's whole list, keyed by client name, in a compacted
topic -- *before* the coordinator logs the final COMMITTED/ABORTED record, so
a crash cannot lose it. Entries older than ``persist_time_ms`` are dropped by
:meth:`TerminatedTxnStore.sweep`, which the coordinator runs every
``expire_check_interval`` (clients left with nothing are deleted from the
topic). Memory is bounded by ``persist_count`` x clients.

Concurrent ends of one client are coalesced: each change bumps the client's
version and a flush that persists version *v* satisfies every waiter at or
below *v* (PIP-255's append/flush split).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from txnstream.coordinator.status import TxnStatus
from txnstream.coordinator.timeouts import Clock, wall_clock_ms
from txnstream.coordinator.txn_id import TxnID
from txnstream.errors import CorruptEntryError, InvalidArgumentError
from txnstream.proto import TerminatedTxnState

_STRIPES = 64


class TerminatedPersistence(Protocol):
    """Durable key/value storage for the store (a compacted topic)."""

    def put(self, key: str, value: bytes | None) -> object:
        """Store ``value`` under ``key`` durably; ``None`` deletes the key."""

    def items(self) -> Iterable[tuple[str, bytes]]:
        """Every live key and its newest value."""


class InMemoryTerminatedPersistence:
    """Compacted-topic semantics in memory (newest value per key; None deletes)."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.puts = 0
        self._lock = threading.Lock()

    def put(self, key: str, value: bytes | None) -> None:
        """Store or delete ``key``."""
        with self._lock:
            self.puts += 1
            if value is None:
                self.data.pop(key, None)
            else:
                self.data[key] = value

    def items(self) -> list[tuple[str, bytes]]:
        """Return every key and value."""
        with self._lock:
            return list(self.data.items())


@dataclass(frozen=True, slots=True)
class TerminatedRecord:
    """How a transaction ended, as the store remembers it."""

    txn_id: TxnID
    client_name: str
    status: TxnStatus
    end_time: int
    timed_out: bool


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


class TerminatedTxnStore:
    """Per-client memory of terminated transactions, persisted and expiring."""

    def __init__(
        self,
        persist_count: int = 0,
        persist_time_ms: int = 72 * 3_600_000,
        *,
        persistence: TerminatedPersistence | None = None,
        clock: Clock = wall_clock_ms,
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
        self._persistence = persistence
        self._clock = clock
        self._lock = threading.Lock()
        # client -> {txn_id: (status, end_time, timed_out)} in end order (oldest first).
        self._clients: dict[str, dict[TxnID, tuple[TxnStatus, int, bool]]] = {}
        self._index: dict[TxnID, str] = {}
        self._version: dict[str, int] = {}
        self._persisted: dict[str, int] = {}
        self._flush_locks = [threading.Lock() for _ in range(_STRIPES)]
        self.puts = 0

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
    ) -> bool:
        """Remember that ``txn_id`` ended with ``status`` and persist it durably.

        Returns False (nothing stored) when the store is disabled or the
        transaction has no client name. Recording the same transaction again
        is a no-op apart from waiting until it is durable.
        """
        if not self.enabled or not client_name:
            return False
        final = _final(status)
        with self._lock:
            entries = self._clients.get(client_name)
            if entries is None:
                entries = self._clients[client_name] = {}
            if txn_id not in entries:
                entries[txn_id] = (
                    final,
                    self._clock() if end_time is None else end_time,
                    timed_out,
                )
                self._index[txn_id] = client_name
                while len(entries) > self.persist_count:
                    oldest = next(iter(entries))
                    del entries[oldest]
                    del self._index[oldest]
                self._version[client_name] = self._version.get(client_name, 0) + 1
            version = self._version.get(client_name, 0)
        self._flush(client_name, version)
        return True

    def _encode(self, client: str) -> bytes | None:
        entries = self._clients.get(client)
        if not entries:
            return None
        state = TerminatedTxnState(client_name=client)
        for tid, (status, end_time, timed_out) in entries.items():
            state.txns.add(
                txnid_least_bits=tid.least_bits,
                txnid_most_bits=tid.most_bits,
                status=int(status),
                end_time=end_time,
                timed_out=timed_out,
            )
        return state.SerializeToString()

    def _flush(self, client: str, version: int) -> None:
        if self._persistence is None:
            return
        with self._flush_locks[hash(client) % _STRIPES]:
            with self._lock:
                if self._persisted.get(client, 0) >= version:
                    return  # a concurrent flush already covered this change
                current = self._version.get(client, 0)
                value = self._encode(client)
            self._persistence.put(client, value)
            with self._lock:
                self.puts += 1
                if value is None and self._version.get(client) == current:
                    # Deleted for good: forget the bookkeeping too (bounded memory).
                    self._version.pop(client, None)
                    self._persisted.pop(client, None)
                else:
                    self._persisted[client] = current

    def sweep(self) -> int:
        """Drop entries older than ``persist_time_ms``; return how many went."""
        cutoff = self._clock() - self.persist_time_ms
        changed: list[tuple[str, int]] = []
        dropped = 0
        with self._lock:
            for client in list(self._clients):
                entries = self._clients[client]
                n = 0
                # Entries are in end order; stop at the first one still young.
                for tid, (_, end_time, _) in list(entries.items()):
                    if end_time > cutoff:
                        break
                    del entries[tid]
                    del self._index[tid]
                    n += 1
                if n:
                    dropped += n
                    if not entries:
                        del self._clients[client]
                    self._version[client] = self._version.get(client, 0) + 1
                    changed.append((client, self._version[client]))
        for client, version in changed:
            self._flush(client, version)
        return dropped

    def restore(self) -> int:
        """Load the persisted state (recovery); expired entries are dropped.

        Returns the number of transactions restored. A value that is not a
        ``TerminatedTxnState`` raises :class:`CorruptEntryError` naming the key.
        """
        if self._persistence is None:
            return 0
        cutoff = self._clock() - self.persist_time_ms
        stale: list[str] = []
        with self._lock:
            self._clients.clear()
            self._index.clear()
            for key, value in self._persistence.items():
                state = TerminatedTxnState()
                try:
                    state.ParseFromString(value)
                    rows = [
                        (
                            TxnID(t.txnid_most_bits, t.txnid_least_bits),
                            _final(TxnStatus(t.status)),
                            t.end_time,
                            t.timed_out,
                        )
                        for t in state.txns
                    ]
                except Exception as exc:
                    raise CorruptEntryError(
                        f"terminated-transaction state for client {key!r} is corrupt: {exc}",
                        key=key,
                    ) from exc
                rows = [r for r in rows if r[2] > cutoff]
                rows.sort(key=lambda r: r[2])
                rows = rows[-self.persist_count :] if self.persist_count else []
                if not rows:
                    stale.append(key)
                    continue
                entries = self._clients[key] = {}
                for tid, status, end_time, timed_out in rows:
                    entries[tid] = (status, end_time, timed_out)
                    self._index[tid] = key
                self._version[key] = self._persisted[key] = 1
            restored = len(self._index)
        for key in stale:
            # Expired (or feature switched off) while we were down.
            self._persistence.put(key, None)
        return restored


__all__ = [
    "InMemoryTerminatedPersistence",
    "TerminatedPersistence",
    "TerminatedRecord",
    "TerminatedTxnStore",
]
