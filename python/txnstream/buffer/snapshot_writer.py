"""Writing transaction-buffer snapshots to the namespaces' snapshot topics (SPEC §4.5).

Each namespace has one compacted snapshot topic,
``<tenant>/<namespace>/__transaction_buffer_snapshot``, keyed by partition
(see :mod:`.snapshot_reader` for the reading side). The broker hands
:meth:`SnapshotWriter.write` the records of the partitions whose snapshots
are due; records of one namespace go out in one group commit.

The topics are opened **write-only** (no key index: opening reads nothing,
memory does not grow with the number of partitions). Once a namespace's
topic has taken more than ``compact_after`` records plus twice the number
of partitions it has seen, it is compacted (the newest record per
partition is kept; that reads the topic once). Callers are the broker's
maintenance thread and its close: one at a time per writer (a lock).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from txnstream._native import CompactedTopic
from txnstream.buffer.snapshot_reader import snapshot_topic
from txnstream.errors import AlreadyClosedError

#: Records a namespace's topic takes before compaction is considered.
DEFAULT_COMPACT_AFTER = 4096


class _Namespace:
    __slots__ = ("keys", "puts", "topic")

    def __init__(self, topic: CompactedTopic) -> None:
        self.topic = topic
        self.puts = 0
        self.keys: set[str] = set()


class SnapshotWriter:
    """The snapshot topics of one broker, opened on first write (thread-safe).

    ``open_topic(name)`` opens the named compacted topic write-only (the
    broker owns ledgers).
    """

    def __init__(
        self,
        open_topic: Callable[[str], CompactedTopic],
        *,
        compact_after: int = DEFAULT_COMPACT_AFTER,
    ) -> None:
        self._open_topic = open_topic
        self.compact_after = compact_after
        self._lock = threading.Lock()
        self._namespaces: dict[str, _Namespace] = {}
        self._closed = False
        self.records_written = 0
        self.compactions = 0
        #: Moves after every write and every compaction: readers of the same
        #: process refresh their view only when it moved.
        self.generation = 0

    def write(self, records: Sequence[tuple[str, str, bytes]]) -> None:
        """Durably write ``(namespace, partition, snapshot bytes)`` records.

        One group commit per namespace. Raises the storage error of a
        namespace whose write failed (records of namespaces written before
        it are durable; the caller retries the rest later).
        """
        by_ns: dict[str, list[tuple[str, bytes | None]]] = {}
        for namespace, partition, value in records:
            by_ns.setdefault(namespace, []).append((partition, value))
        with self._lock:
            if self._closed:
                raise AlreadyClosedError("the snapshot writer is closed", what="snapshot writer")
            for namespace, recs in by_ns.items():
                ns = self._namespaces.get(namespace)
                if ns is None:
                    ns = self._namespaces[namespace] = _Namespace(
                        self._open_topic(snapshot_topic(namespace))
                    )
                try:
                    ns.topic.put_many(recs)
                finally:
                    self.generation += 1  # a failed write may still have cut the log back
                ns.puts += len(recs)
                ns.keys.update(k for k, _ in recs)
                self.records_written += len(recs)
                if ns.puts > self.compact_after + 2 * len(ns.keys):
                    try:
                        ns.topic.compact()
                    finally:
                        self.generation += 1  # the log was rewritten under the readers
                    ns.puts = 0
                    self.compactions += 1

    def stats(self) -> dict[str, int]:
        """Return records written, compactions, and namespaces open."""
        with self._lock:
            return {
                "records_written": self.records_written,
                "compactions": self.compactions,
                "namespaces": len(self._namespaces),
            }

    def close(self) -> None:
        """Close every snapshot topic (later writes raise AlreadyClosedError)."""
        with self._lock:
            self._closed = True
            namespaces, self._namespaces = list(self._namespaces.values()), {}
        for ns in namespaces:
            ns.topic.close()


__all__ = ["DEFAULT_COMPACT_AFTER", "SnapshotWriter"]
