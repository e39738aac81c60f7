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
A read collects once per window of segments (as Kafka collects once per
fetch), not once per segment: an index with no record never completes a
collection, so per-segment collections would walk every later segment's
metadata again and again;
the local part's aborted transactions come from the transaction buffer's
aborted set (or, without it, from the local ledgers' ABORT markers).
Indexes are cached, so each is fetched at most once per reader: a full scan
costs one data call per segment plus one index call per segment whose index
is not known to be empty.

Completeness rests on the broker's hold
(:meth:`~txnstream.tiered.offload.Offloader.hold_trimming`): no ledger after
a remote one is trimmed before it is uploaded, so every ABORT marker after a
remote segment is in a later segment's index or in the local ledgers.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from txnstream._native import (
    AbortedTxnIndex,
    ManagedLedger,
    Position,
    decode_segment,
    decode_topic_entry,
)
from txnstream.errors import CorruptEntryError, CorruptIndexError, InvalidArgumentError
from txnstream.tiered.metadata import RemoteLogMetadataManager, SegmentInfo
from txnstream.tiered.remote import (
    RemoteStorage,
    instance_arg,
    int_arg,
    object_name,
    position_arg,
    topic_arg,
)

#: Remote segments per aborted-transaction collection (Kafka collects per fetch).
WINDOW_SEGMENTS = 64
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


def decode_txn_index(data: bytes, seg: SegmentInfo, name: str) -> AbortedTxnIndex:
    """Decode segment ``seg``'s remote aborted-transaction index ``name``, checked whole.

    An index cut short at a record boundary still decodes: its records are
    counted against the metadata's (``txn_idx_records``; or, in a record
    without the count, its ``txn_idx_empty`` flag). Raises
    :class:`CorruptIndexError` for an index of another ledger or of the
    wrong size, so the caller rebuilds it from the segment's ABORT markers
    (the broker's reader and a Spark task alike).
    """
    index = AbortedTxnIndex.decode(data)
    if index.ledger_id != seg.ledger_id:
        raise CorruptIndexError(
            f"remote txn index {name} is of ledger {index.ledger_id}, not {seg.ledger_id}",
            kind="aborted-txn index",
            offset=12,
        )
    want = seg.txn_idx_records
    if want is None and seg.has_txn_idx_flag and not seg.txn_idx_empty and not len(index):
        want = -1  # says it has records, holds none
    if want is not None and len(index) != want:
        raise CorruptIndexError(
            f"remote txn index {name} holds {len(index)} records; its metadata says "
            + ("some" if want < 0 else str(want)),
            kind="aborted-txn index",
            offset=0,
        )
    return index


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
        self._cache_bytes = int_arg(cache_bytes, "cache_bytes")
        self._lock = threading.Lock()
        self._data: OrderedDict[str, tuple[int, list[bytes]]] = OrderedDict()
        self._cached = 0
        self._indexes: dict[str, AbortedTxnIndex] = {}
        self.txn_indexes_rebuilt = 0

    # ------------------------------------------------------------ segments

    def segment_entries(self, seg: SegmentInfo) -> list[bytes]:
        """All entries of a remote segment (one remote call unless cached)."""
        instance_arg(seg, "seg", SegmentInfo)
        with self._lock:
            hit = self._data.get(seg.segment_id)
            if hit is not None:
                self._data.move_to_end(seg.segment_id)
                return hit[1]
        name = object_name(seg.topic, seg.ledger_id, seg.segment_id, "segment")
        data = self.remote.get_segment(
            name,
            ledger_id=seg.ledger_id,
            first_entry=seg.first_entry,
            size_bytes=seg.size_bytes,
            data_crc32c=seg.data_crc32c,
        )
        entries = decode_segment(seg.ledger_id, seg.first_entry, data)
        if len(entries) != seg.entry_count:
            raise CorruptEntryError(
                f"remote segment {name} holds {len(entries)} entries; its metadata says "
                f"{seg.entry_count}",
                position=(seg.ledger_id, seg.first_entry + min(len(entries), seg.entry_count)),
                offset=0,
            )
        with self._lock:
            if seg.segment_id in self._data:  # another thread fetched it meanwhile
                return self._data[seg.segment_id][1]
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
        instance_arg(seg, "seg", SegmentInfo)
        with self._lock:
            hit = self._indexes.get(seg.segment_id)
        if hit is not None:
            return hit
        name = object_name(seg.topic, seg.ledger_id, seg.segment_id, "txn_index")
        try:
            index = decode_txn_index(self.remote.get(name, "txn_index"), seg, name)
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

        From the remote indexes; also says whether the collection is
        complete. Complete assumes the topic's offloaded ledgers are
        contiguous from ``fetch_start`` on (Kafka's rule): a ledger between
        them that has no remote copy is not looked at
        (:meth:`read_committed` adds the local aborts then).
        """
        topic_arg(topic)
        fetch_start = position_arg(fetch_start, "fetch_start")
        upper_bound = position_arg(upper_bound, "upper_bound")
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
        max_read_position: Position | None,
        aborted: Collection[tuple[int, int]] | None = None,
        start: Position | None = None,
    ) -> Iterator[ReadMessage]:
        """Yield READ_COMMITTED messages of ``topic`` from ``start`` (default: the beginning).

        ``max_read_position`` is required: the partition's transaction-buffer
        bound (the last readable entry; None: nothing is readable). Without
        it, messages of open transactions would be returned.

        ``aborted``: the partition's aborted transactions as its transaction
        buffer knows them (it covers the local ledgers). When not given they
        are read from the ABORT markers of ``ml``'s local ledgers. Remote
        segments contribute their aborted-txn indexes, collected per window
        of :data:`WINDOW_SEGMENTS` segments until a record completes the
        collection. With neither ``ml`` nor ``aborted``, a read whose remote
        collection is not complete raises :class:`InvalidArgumentError`
        rather than guess: an ABORT marker may lie beyond the remote part.

        Ledgers present in ``ml`` are read locally, the others from their
        remote segments. Markers and messages of aborted transactions are
        never returned.
        """
        # Every argument is checked here, at the call, not at the first next():
        # the generator below only reads.
        topic_arg(topic)
        if ml is not None:
            instance_arg(ml, "ml", ManagedLedger)
        start = position_arg(start, "start") if start is not None else Position(0, 0)
        local_aborted = None if aborted is None else _aborted_arg(aborted)
        if max_read_position is None:
            return iter(())
        max_read_position = position_arg(max_read_position, "max_read_position")
        return self._read_committed(topic, ml, max_read_position, local_aborted, start)

    def _read_committed(
        self,
        topic: str,
        ml: ManagedLedger | None,
        max_read_position: Position,
        local_aborted: set[tuple[int, int]] | None,
        start: Position,
    ) -> Iterator[ReadMessage]:
        # The READ_COMMITTED read itself (checked arguments; see read_committed).
        local_ledgers: dict[int, int] = {}
        floor = Position(0, 0)
        if ml is not None:
            floor = ml.first_position or Position(0, 0)
            local_ledgers = {
                lid: n for lid, n, _ in ml.ledgers() if n > 0 and lid >= floor.ledger_id
            }
        segments = self.metadata.segments(topic)
        remote = [
            s
            for s in segments
            if s.ledger_id not in local_ledgers
            and s.entry_count > 0
            and Position(s.ledger_id, s.last_entry) >= start
            and Position(s.ledger_id, s.first_entry) <= max_read_position
        ]
        # A remote collection is complete only over contiguous offloaded
        # ledgers: an older ledger kept only locally between offloaded ones
        # (offloaded out of order, on demand) may hold ABORT markers no
        # index has, so the local aborts then always count. The caller's
        # aborted set always counts too: it costs nothing.
        offloaded = {s.ledger_id for s in segments}
        newest_offloaded = max(offloaded, default=-1)
        interleaved = any(lid < newest_offloaded and lid not in offloaded for lid in local_ledgers)
        for w in range(0, len(remote), WINDOW_SEGMENTS):
            window = remote[w : w + WINDOW_SEGMENTS]
            fetch_start = max(start, Position(window[0].ledger_id, window[0].first_entry))
            upper = Position(window[-1].ledger_id, window[-1].last_entry + 1)
            found, complete = self.collect_aborted(topic, fetch_start, upper)
            if not complete or interleaved or local_aborted is not None:
                if local_aborted is None:
                    if ml is None:
                        raise InvalidArgumentError(
                            f"READ_COMMITTED read of {topic}: the remote aborted-transaction "
                            "indexes are not complete for this range; pass the partition's "
                            "aborted transactions (aborted=) or its ledger (ml=)"
                        )
                    local_aborted = _local_aborts(ml, local_ledgers)
                found |= local_aborted
            for seg in window:
                for i, entry in enumerate(self.segment_entries(seg)):
                    pos = Position(seg.ledger_id, seg.first_entry + i)
                    if pos < start:
                        continue
                    if pos > max_read_position:
                        return
                    yield from _messages(pos, decode_topic_entry(entry), found)
        if ml is None or not local_ledgers:
            return
        if local_aborted is None:
            local_aborted = _local_aborts(ml, local_ledgers)
        for lid in sorted(local_ledgers):
            n = local_ledgers[lid]
            if Position(lid, n - 1) < max(start, floor):
                continue
            first = max(start, floor, Position(lid, 0))
            entries: list[tuple[Position, bytes]] = ml.read_range(first, Position(lid, n - 1))
            if len(entries) != n - first.entry_id:
                # Trimmed since the listing (this read is a generator: the
                # caller may take its time): from its remote copy if it has
                # one; if not, it is gone, as for a read started now.
                entries = self._remote_part(topic, lid, first, n - 1)
            for pos, entry in entries:
                if pos > max_read_position:
                    return
                yield from _messages(pos, decode_topic_entry(entry), local_aborted)

    def _remote_part(
        self, topic: str, ledger_id: int, first: Position, last_entry: int
    ) -> list[tuple[Position, bytes]]:
        # Entries ``first``..``last_entry`` of ledger ``ledger_id`` from its
        # remote segment (none when it has no remote copy).
        seg = next((s for s in self.metadata.segments(topic) if s.ledger_id == ledger_id), None)
        if seg is None:
            return []
        out = []
        for i, entry in enumerate(self.segment_entries(seg)):
            pos = Position(ledger_id, seg.first_entry + i)
            if first <= pos and pos.entry_id <= last_entry:
                out.append((pos, entry))
        return out


def _aborted_arg(aborted: object) -> set[tuple[int, int]]:
    # The caller's aborted transactions: (most significant, least
    # significant) bits of each id, as a transaction buffer keeps them.
    bad = None
    if isinstance(aborted, (str, bytes)) or not isinstance(aborted, Iterable):
        bad = aborted
    else:
        out: set[tuple[int, int]] = set()
        for t in aborted:
            if (
                isinstance(t, tuple)
                and len(t) == 2
                and all(type(x) is int and 0 <= x < 1 << 64 for x in t)
            ):
                out.add(t)
            else:
                bad = t
                break
        else:
            return out
    raise InvalidArgumentError(
        f"aborted must be a collection of transaction ids as (most, least) bit pairs, got {bad!r}",
        argument="aborted",
        value=repr(bad)[:200],
    )


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
