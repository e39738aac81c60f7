"""Shared snapshot readers (SPEC §4.6, seed 003): one reader per namespace.

Transaction-buffer snapshots of every topic of a namespace live in one
compacted topic, ``<tenant>/<namespace>/__transaction_buffer_snapshot``,
keyed by topic. When many topics recover at once (a broker opening a data
directory with thousands of topics), one reader per topic would read that
whole topic once per topic: n·x entry reads. Here the topics of a namespace
share one :class:`SharedSnapshotReader` whose Rust
:class:`~txnstream._native.SnapshotDemux` reads forward once and routes each
record to its topic: x reads (see ``rust/core/src/demux.rs`` for the rules:
newest record per topic, snapshots written during recovery seen, deleted
topics answer none).

Lifetime: :meth:`SnapshotReaders.acquire` gives the namespace's reader and
counts a user; :meth:`SharedSnapshotReader.release` uncounts it, and the last
release closes the reader (its ledger handle and routed records). A reader
that nobody read from for ``idle_timeout_ms`` (default 60 s, as Pulsar's
TableView cache) is closed even while held; a holder that reads again gets
a new one transparently. Every wait is bounded: reads hold the reader's
lock only while the demux reads (no callbacks run under it).
"""

from __future__ import annotations

import contextlib
import errno
import threading
from collections.abc import Callable

from google.protobuf.message import DecodeError

from txnstream._native import ManagedLedger, SnapshotDemux
from txnstream.errors import (
    AlreadyClosedError,
    CorruptEntryError,
    InvalidArgumentError,
    StorageError,
)
from txnstream.proto import TransactionBufferSnapshot
from txnstream.timer import Clock, TimerHandle, TimerScope

#: Default idle time after which an unused reader is closed (Pulsar's TableView cache).
DEFAULT_IDLE_TIMEOUT_MS = 60_000
#: Entries read per step of a catch-up (a close is noticed between steps).
CHUNK_ENTRIES = 4096
#: Retry delay of an idle check that found a read in progress.
IDLE_RECHECK_MS = 1_000
#: Name of a namespace's snapshot topic (SPEC §2).
SNAPSHOT_TOPIC = "__transaction_buffer_snapshot"


def snapshot_topic(namespace: str) -> str:
    """Return the managed-ledger name of ``namespace``'s snapshot topic."""
    if not isinstance(namespace, str) or namespace.count("/") != 1 or "" in namespace.split("/"):
        raise InvalidArgumentError(
            f"namespace must be 'tenant/namespace', got {namespace!r}",
            argument="namespace",
            value=namespace,
        )
    return f"{namespace}/{SNAPSHOT_TOPIC}"


class SharedSnapshotReader:
    """The snapshot reader of one namespace, shared by the topics that recover."""

    def __init__(self, owner: SnapshotReaders, namespace: str) -> None:
        self.namespace = namespace
        self._owner = owner
        self._lock = threading.Lock()
        self._ml: ManagedLedger | None = None
        self._demux: SnapshotDemux | None = None
        self.users = 0
        self.opened = 0  # times its ledger was opened (1 unless closed by idleness)
        self._last_used_ms = owner.clock.monotonic_ms()
        self._idle_timer: TimerHandle | None = None
        self._stats: dict[str, int] = {}
        self._refreshed_at: int | None = None
        # The writer's generation when the snapshot topic was found missing.
        self._missing_at: int | None = None

    def read(self, topic: str) -> TransactionBufferSnapshot | None:
        """Return ``topic``'s newest snapshot (None: it has none); one answer per topic.

        Reads in chunks of :data:`CHUNK_ENTRIES` entries and stops with
        :class:`~txnstream.errors.AlreadyClosedError` between chunks once the
        readers are closed (recovery cancelled on close).
        """
        if not isinstance(topic, str) or not topic:
            raise InvalidArgumentError(
                f"topic must be a non-empty str, got {topic!r}", argument="topic", value=topic
            )
        with self._lock:
            if self.users <= 0:
                raise AlreadyClosedError(
                    f"snapshot reader of {self.namespace} was released", what="snapshot reader"
                )
            if self._demux is None or self._ml is None:
                gen = self._owner.generation
                seen = None if gen is None else gen()
                if seen is not None and seen == self._missing_at:
                    return None  # still no snapshot topic: nothing was written since
                try:
                    self._ml = self._owner.open_ledger(snapshot_topic(self.namespace))
                except StorageError as e:
                    if e.errno != errno.ENOENT:
                        raise
                    # No snapshot written in this namespace yet. Remembered until the
                    # writer writes again: each try costs a look at the directory, and
                    # every partition of a new partitioned topic asks (quadratic).
                    self._missing_at = seen
                    return None
                self._missing_at = None
                self._demux = SnapshotDemux()
                self.opened += 1
            if self._ml.read_only:
                gen = self._owner.generation
                seen = None if gen is None else gen()
                if seen is None or seen != self._refreshed_at:
                    self._ml.refresh()  # see snapshots synced since (writers in this process too)
                    self._refreshed_at = seen
            while not self._demux.catch_up(self._ml, CHUNK_ENTRIES):
                if self._owner.closed:
                    raise AlreadyClosedError(
                        "snapshot readers closed: recovery cancelled", what="snapshot reader"
                    )
            self._last_used_ms = self._owner.clock.monotonic_ms()
            self._arm_idle_timer()  # before the answer is taken: a failure loses nothing
            got = self._demux.take_routed(topic)
        if got is None:
            return None
        snap = TransactionBufferSnapshot()
        try:
            snap.ParseFromString(got[1])
        except DecodeError as e:
            raise CorruptEntryError(
                f"snapshot of {topic} at {got[0]} in {snapshot_topic(self.namespace)} "
                f"is not a TransactionBufferSnapshot: {e}",
                position=(got[0].ledger_id, got[0].entry_id),
                offset=0,
            ) from e
        return snap

    def reopen(self, topic: str) -> None:
        """Let ``topic`` answer again (it is being unloaded and will recover anew).

        A topic that took its answer is done: its later snapshots are not
        kept. Call this before writing its last snapshot, so the reader keeps
        that one for the next load (a reader not open reads it from the start).
        """
        with self._lock:
            if self._demux is not None:
                self._demux.reopen(topic)

    def forget(self, topic: str) -> None:
        """Forget ``topic`` (deleted while recovery runs)."""
        with self._lock:
            if self._demux is not None:
                self._demux.forget(topic)

    def stats(self) -> dict[str, int]:
        """Return demux counters (entries_read, reads, routed, dropped, answered), all openings."""
        with self._lock:
            out = dict(self._stats)
            if self._demux is not None:
                for k, v in self._demux.stats().items():
                    out[k] = out.get(k, 0) + v
            return out

    @property
    def is_open(self) -> bool:
        """True while the reader holds its ledger handle and routed records."""
        with self._lock:
            return self._ml is not None

    def release(self) -> None:
        """Stop using the reader; the last user's release closes it."""
        self._owner._release(self)

    # ------------------------------------------------------------ internals

    def _arm_idle_timer(self) -> None:
        # Under the lock.
        if self._idle_timer is not None:
            self._owner.scope.cancel(self._idle_timer)
        due = self._last_used_ms + self._owner.idle_timeout_ms
        try:
            self._idle_timer = self._owner.scope.schedule(due, self._idle_check)
        except RuntimeError:  # the timer scope is closed: the owner closes readers itself
            self._idle_timer = None

    def _idle_check(self) -> None:
        # On the shared timer thread: never wait for a read in progress.
        if not self._lock.acquire(blocking=False):
            with contextlib.suppress(RuntimeError):  # scope closed: the broker is closing
                self._idle_timer = self._owner.scope.schedule(
                    self._owner.clock.monotonic_ms() + IDLE_RECHECK_MS, self._idle_check
                )
            return
        try:
            self._idle_timer = None
            if self._ml is None:
                return
            if self._owner.clock.monotonic_ms() - self._last_used_ms < self._owner.idle_timeout_ms:
                self._arm_idle_timer()
                return
            self._close_locked()
        finally:
            self._lock.release()

    def _close_locked(self) -> None:
        if self._demux is not None:
            for k, v in self._demux.stats().items():
                self._stats[k] = self._stats.get(k, 0) + v
        if self._idle_timer is not None:
            self._owner.scope.cancel(self._idle_timer)
            self._idle_timer = None
        ml, self._ml, self._demux = self._ml, None, None
        if ml is not None:
            ml.close()


class SnapshotReaders:
    """The shared snapshot readers of one broker: one per namespace, reference counted.

    ``open_ledger`` opens a managed ledger of the broker's data directory
    read-only (the broker owns ledgers; the snapshot topic's writer may be
    open in the same process); ``scope`` runs the idle timers.

    ``generation``, when given, counts the snapshot records written so far by
    the only writer of the directory (the broker's own): a reader then
    refreshes its view of the topic only when that count moved, instead of
    before every answer (a refresh costs about a millisecond, which at
    10,000 topics was most of the recovery).
    """

    def __init__(
        self,
        open_ledger: Callable[[str], ManagedLedger],
        scope: TimerScope,
        clock: Clock,
        *,
        idle_timeout_ms: int = DEFAULT_IDLE_TIMEOUT_MS,
        generation: Callable[[], int] | None = None,
    ) -> None:
        if (
            isinstance(idle_timeout_ms, bool)
            or not isinstance(idle_timeout_ms, int)
            or idle_timeout_ms < 1
        ):
            raise InvalidArgumentError(
                f"idle_timeout_ms must be an int >= 1, got {idle_timeout_ms!r}",
                argument="idle_timeout_ms",
                value=idle_timeout_ms,
            )
        self.open_ledger = open_ledger
        self.scope = scope
        self.clock = clock
        self.idle_timeout_ms = idle_timeout_ms
        self.generation = generation
        self._lock = threading.Lock()
        self._readers: dict[str, SharedSnapshotReader] = {}
        self._closed = False

    def acquire(self, namespace: str) -> SharedSnapshotReader:
        """Return ``namespace``'s shared reader, counting one more user."""
        snapshot_topic(namespace)
        with self._lock:
            if self._closed:
                raise AlreadyClosedError("snapshot readers are closed", what="snapshot readers")
            reader = self._readers.get(namespace)
            if reader is None:
                reader = self._readers[namespace] = SharedSnapshotReader(self, namespace)
            reader.users += 1
            return reader

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called (reads in progress stop between chunks)."""
        return self._closed

    def _release(self, reader: SharedSnapshotReader) -> None:
        with self._lock:  # users are counted under the owner's lock only
            if reader.users <= 0:
                return
            reader.users -= 1
            if reader.users > 0:
                return
            if self._readers.get(reader.namespace) is reader:
                del self._readers[reader.namespace]
        with reader._lock:  # outside the owner's lock: other namespaces go on
            if reader.users == 0:
                reader._close_locked()

    def namespaces(self) -> list[str]:
        """Namespaces with a reader in use."""
        with self._lock:
            return sorted(self._readers)

    def close(self) -> None:
        """Close every reader (a broker closing: recovery in progress is cancelled)."""
        with self._lock:
            self._closed = True
            readers, self._readers = list(self._readers.values()), {}
            for r in readers:
                r.users = 0
        for r in readers:  # each waits at most one chunk of a read in progress
            with r._lock:
                r._close_locked()


__all__ = [
    "CHUNK_ENTRIES",
    "DEFAULT_IDLE_TIMEOUT_MS",
    "SNAPSHOT_TOPIC",
    "SharedSnapshotReader",
    "SnapshotReaders",
    "snapshot_topic",
]
