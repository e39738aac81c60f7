"""Reads of topics whose older ledgers live in remote storage.

A ledger is read from the local data directory while it is there, and from
its remote segment otherwise (trimmed locally, or read with no local
ledger at all), through a small cache of fetched segment data.

READ_COMMITTED over remote segments (SPEC §4.8, KIP-1058). To read the
segment of ledger L (``[L:first, L:last]``) the reader needs every aborted
transaction with messages in that range. It asks the metadata manager for
the next segment at or after L whose aborted-transaction index must be
fetched (:meth:`RemoteLogMetadataManager.next_segment_with_txn_index`),
fetches that index, collects its records overlapping the range, and goes
on from the following segment until a record completes the collection
(its last-stable position is past the range) or the remote segments end.
A read collects once for its whole remote range, not once per segment: an
index with no record never completes a collection, so per-segment
collections would walk every later segment's metadata again and again;
the local part's aborted transactions come from its own ABORT markers (the
transaction buffer's aborted set). Indexes are cached, so each is fetched
at most once per reader: a full scan costs one data call per segment plus
one index call per segment whose index is not known to be empty.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from txnstream._native import (
    AbortedTxnIndex,
    ManagedLedger,
    Position,
    decode_segment,
    decode_topic_entry,
)
from txnstream.errors import CorruptIndexError
from txnstream.tiered.metadata import RemoteLogMetadataManager, SegmentInfo
from txnstream.tiered.remote import RemoteStorage, object_name

#: MessageMetadata.marker_type of an ABORT marker (Pulsar's TXN_ABORT).
_TXN_ABORT = 22


@dataclass(frozen=True)
class ReadMessage:
    """One message of a READ_COMMITTED read (markers are never returned)."""

    position: Position
    batch_index: int
    payload: bytes
    key: str | None
    txn: tuple[int, int] | None
    producer_name: str
    sequence_id: int


class TieredReader:
    """Reads topic entries from local ledgers and remote segments."""

    def __init__(
        self,
        remote: RemoteStorage,
        metadata: RemoteLogMetadataManager,
        *,
        cache_bytes: int = 64 << 20,
    ) -> None:
        self.remote = remote
        self.metadata = metadata
        self._cache_bytes = cache_bytes
        self._lock = threading.Lock()
        self._data: OrderedDict[str, tuple[int, list[bytes]]] = OrderedDict()
        self._cached = 0
        self._indexes: dict[str, AbortedTxnIndex] = {}
        self.txn_indexes_rebuilt = 0

    # ------------------------------------------------------------ segments

    def segment_entries(self, seg: SegmentInfo) -> list[bytes]:
        """All entries of a remote segment (one remote call unless cached)."""
        with self._lock:
            hit = self._data.get(seg.segment_id)
            if hit is not None:
                self._data.move_to_end(seg.segment_id)
                return hit[1]
        name = object_name(seg.topic, seg.ledger_id, seg.segment_id, "segment")
        data = self.remote.get(name, "segment")
        entries = decode_segment(seg.ledger_id, seg.first_entry, data)
        with self._lock:
            self._data[seg.segment_id] = (len(data), entries)
            self._cached += len(data)
            while self._cached > self._cache_bytes and len(self._data) > 1:
                _, (n, _) = self._data.popitem(last=False)
                self._cached -= n
        return entries

    def txn_index(self, seg: SegmentInfo) -> AbortedTxnIndex:
        """Return a segment's aborted-transaction index (one remote call unless cached).

        A damaged remote index is rebuilt from the segment's ABORT markers and
        uploaded again (counted in ``txn_indexes_rebuilt``).
        """
        with self._lock:
            hit = self._indexes.get(seg.segment_id)
        if hit is not None:
            return hit
        name = object_name(seg.topic, seg.ledger_id, seg.segment_id, "txn_index")
        try:
            index = AbortedTxnIndex.decode(self.remote.get(name, "txn_index"))
            if index.ledger_id != seg.ledger_id:
                raise CorruptIndexError(
                    f"remote txn index {name} is of ledger {index.ledger_id}, not {seg.ledger_id}",
                    kind="aborted-txn index",
                    offset=12,
                )
        except CorruptIndexError:
            aborts = []
            for i, entry in enumerate(self.segment_entries(seg)):
                d = decode_topic_entry(entry)
                if d["marker_type"] == _TXN_ABORT and d["txn"] is not None:
                    aborts.append((d["txn"], Position(seg.ledger_id, seg.first_entry + i)))
            index = AbortedTxnIndex.rebuild(seg.ledger_id, aborts)
            self.remote.put(name, index.encode(), "txn_index")
            self.txn_indexes_rebuilt += 1
        with self._lock:
            self._indexes[seg.segment_id] = index
        return index

    def collect_aborted(
        self, topic: str, fetch_start: Position, upper_bound: Position
    ) -> tuple[set[tuple[int, int]], bool]:
        """Collect aborted transactions overlapping ``[fetch_start, upper_bound)``.

        From the remote indexes; also says whether the collection is complete.
        """
        aborted: set[tuple[int, int]] = set()
        at = fetch_start
        while True:
            seg = self.metadata.next_segment_with_txn_index(topic, at)
            if seg is None:
                return aborted, False
            records, complete = self.txn_index(seg).collect(fetch_start, upper_bound)
            aborted.update(r[0] for r in records)
            if complete:
                return aborted, True
            at = Position(seg.ledger_id + 1, 0)

    # ------------------------------------------------------------ reads

    def read_committed(
        self,
        topic: str,
        ml: ManagedLedger | None = None,
        *,
        start: Position | None = None,
        max_read_position: Position | None = None,
    ) -> Iterator[ReadMessage]:
        """Yield READ_COMMITTED messages of ``topic`` from ``start``.

        From the beginning by default, up to ``max_read_position`` (inclusive;
        default: the end).

        Ledgers present in ``ml`` are read locally, the others from their
        remote segments. Markers and messages of aborted transactions are
        never returned.
        """
        start = start if start is not None else Position(0, 0)
        local_ledgers = {lid: n for lid, n, _ in ml.ledgers() if n > 0} if ml is not None else {}
        if ml is not None and ml.first_position is not None:
            local_first = ml.first_position
            local_ledgers = {
                lid: n for lid, n in local_ledgers.items() if lid >= local_first.ledger_id
            }
        remote = [
            s
            for s in self.metadata.segments(topic)
            if s.ledger_id not in local_ledgers
            and s.entry_count > 0
            and Position(s.ledger_id, s.last_entry) >= start
        ]
        local_aborts = _local_aborts(ml, local_ledgers) if ml is not None else set()
        if remote:
            # One collection for the whole remote part of the read: each index
            # is asked once, and a read that would stop early still only
            # over-collects (aborted ids filter by id, so extra ones are harmless).
            seg_start = max(start, Position(remote[0].ledger_id, remote[0].first_entry))
            upper = Position(remote[-1].ledger_id, remote[-1].last_entry + 1)
            aborted, complete = self.collect_aborted(topic, seg_start, upper)
            if not complete:
                aborted |= local_aborts
        for seg in remote:
            for i, entry in enumerate(self.segment_entries(seg)):
                pos = Position(seg.ledger_id, seg.first_entry + i)
                if pos < start:
                    continue
                if max_read_position is not None and pos > max_read_position:
                    return
                yield from _messages(pos, decode_topic_entry(entry), aborted)
        if ml is None:
            return
        floor = ml.first_position or Position(0, 0)
        for lid in sorted(local_ledgers):
            n = local_ledgers[lid]
            if Position(lid, n - 1) < max(start, floor):
                continue
            first = max(start, floor, Position(lid, 0))
            for pos, entry in ml.read_range(first, Position(lid, n - 1)):
                if max_read_position is not None and pos > max_read_position:
                    return
                yield from _messages(pos, decode_topic_entry(entry), local_aborts)


def _local_aborts(ml: ManagedLedger, ledgers: dict[int, int]) -> set[tuple[int, int]]:
    out: set[tuple[int, int]] = set()
    floor = ml.first_position or Position(0, 0)
    for lid in sorted(ledgers):
        last = Position(lid, ledgers[lid] - 1)
        if last < floor:
            continue
        for _, entry in ml.read_range(max(floor, Position(lid, 0)), last):
            d = decode_topic_entry(entry)
            if d["marker_type"] == _TXN_ABORT and d["txn"] is not None:
                out.add(d["txn"])
    return out


def _messages(
    pos: Position, d: dict[str, Any], aborted: set[tuple[int, int]]
) -> Iterator[ReadMessage]:
    if d["marker_type"] is not None:
        return
    txn = d["txn"]
    if txn is not None and txn in aborted:
        return
    for m in d["messages"]:
        yield ReadMessage(
            position=pos,
            batch_index=m["batch_index"],
            payload=m["payload"],
            key=m["key"],
            txn=txn,
            producer_name=d["producer_name"],
            sequence_id=m["sequence_id"],
        )
