"""RemoteLogMetadataManager: which segments of which topic are in remote storage.

Every state change of an upload is one ``RemoteLogSegmentMetadata`` record
appended (durably) to the managed ledger ``__remote_log_metadata``, as
Kafka's topic-based RLMM does. The manager folds the log in memory: the
newest state of each upload wins. Readers see only uploads whose
COPY_SEGMENT_FINISHED record is durable, so an interrupted offload (a
COPY_SEGMENT_STARTED with nothing after it) is never read; the offloader
deletes its objects later (:meth:`unfinished`; the broker's maintenance round).

``next_segment_with_txn_index(topic, position)`` (KIP-1058): the default
returns the segment at or after the position, as Kafka's default does,
so a reader fetches every segment's aborted-transaction index; with
``skip_empty_txn_index=True`` it skips segments whose metadata says
``txn_idx_empty``, without any remote call. A record written without the
field reads as non-empty.
"""

from __future__ import annotations

import bisect
import threading
import time
import uuid
from dataclasses import dataclass
from typing import cast

from google.protobuf.message import DecodeError

from txnstream._native import ManagedLedger, Position
from txnstream.errors import CorruptEntryError
from txnstream.proto import RemoteLogSegmentMetadata
from txnstream.tiered.remote import RemoteStorage, instance_arg, int_arg, position_arg, topic_arg

#: The managed ledger that holds the records (SPEC §2).
METADATA_LEDGER = "__remote_log_metadata"

_State = RemoteLogSegmentMetadata.State
STARTED = RemoteLogSegmentMetadata.COPY_SEGMENT_STARTED
FINISHED = RemoteLogSegmentMetadata.COPY_SEGMENT_FINISHED
DELETE_STARTED = RemoteLogSegmentMetadata.DELETE_SEGMENT_STARTED
DELETED = RemoteLogSegmentMetadata.DELETE_SEGMENT_FINISHED


@dataclass(frozen=True)
class SegmentInfo:
    """One uploaded segment, as its newest metadata record says."""

    topic: str
    ledger_id: int
    segment_id: str
    state: int
    first_entry: int
    last_entry: int
    entry_count: int
    size_bytes: int
    #: KIP-1058 flag; False when the record does not carry it.
    txn_idx_empty: bool
    #: Whether the record carried the flag at all (old-format records do not).
    has_txn_idx_flag: bool
    #: Records in the uploaded aborted-transaction index (None: not recorded).
    txn_idx_records: int | None = None
    #: crc32c of the whole segment data (None: a record from before it was kept).
    data_crc32c: int | None = None

    @property
    def finished(self) -> bool:
        """The upload is complete and readable."""
        return self.state == FINISHED


def _info(r: RemoteLogSegmentMetadata) -> SegmentInfo:
    return SegmentInfo(
        topic=r.topic,
        ledger_id=r.ledger_id,
        segment_id=r.segment_id,
        state=r.state,
        first_entry=r.first_entry,
        last_entry=r.last_entry,
        entry_count=r.entry_count,
        size_bytes=r.size_bytes,
        txn_idx_empty=r.txn_idx_empty,
        has_txn_idx_flag=r.HasField("txn_idx_empty"),
        txn_idx_records=r.txn_idx_records if r.HasField("txn_idx_records") else None,
        data_crc32c=r.data_crc32c if r.HasField("data_crc32c") else None,
    )


class RemoteLogMetadataManager:
    """Remote segment metadata of every topic of a data directory.

    ``log`` is the ``__remote_log_metadata`` managed ledger (the broker opens
    it); ``remote`` counts each query as a ``metadata`` call.
    """

    def __init__(
        self,
        log: ManagedLedger,
        remote: RemoteStorage,
        *,
        skip_empty_txn_index: bool = True,
    ) -> None:
        self._log = instance_arg(log, "log", ManagedLedger)
        self._remote = instance_arg(remote, "remote", RemoteStorage)
        self.skip_empty_txn_index = skip_empty_txn_index
        self._lock = threading.Lock()
        # (topic, segment_id) -> newest record; topic -> finished segments by ledger id.
        self._uploads: dict[tuple[str, str], SegmentInfo] = {}
        self._finished: dict[str, dict[int, SegmentInfo]] = {}
        # Sorted ledger ids of each topic's finished segments (bisect, not re-sorted per query).
        self._order: dict[str, list[int]] = {}
        first, last = log.first_position, log.last_position
        if first is not None and last is not None:
            for pos, data in log.read_range(first, last):
                r = RemoteLogSegmentMetadata()
                try:
                    r.ParseFromString(data)
                    if not r.IsInitialized():
                        raise DecodeError("required fields missing")
                except DecodeError as e:
                    raise CorruptEntryError(
                        f"{log.name} at {pos}: not a RemoteLogSegmentMetadata record: {e}",
                        position=(pos.ledger_id, pos.entry_id),
                        offset=0,
                    ) from e
                self._apply(_info(r))

    def _apply(self, s: SegmentInfo) -> None:
        self._uploads[(s.topic, s.segment_id)] = s
        by_ledger = self._finished.setdefault(s.topic, {})
        order = self._order.setdefault(s.topic, [])
        if s.state == FINISHED:
            if s.ledger_id not in by_ledger:
                bisect.insort(order, s.ledger_id)
            by_ledger[s.ledger_id] = s
        elif s.ledger_id in by_ledger and by_ledger[s.ledger_id].segment_id == s.segment_id:
            del by_ledger[s.ledger_id]
            order.pop(bisect.bisect_left(order, s.ledger_id))

    def _write(self, s: SegmentInfo, *, write_flag: bool = True) -> SegmentInfo:
        r = RemoteLogSegmentMetadata(
            topic=s.topic,
            ledger_id=s.ledger_id,
            segment_id=s.segment_id,
            state=cast(RemoteLogSegmentMetadata.State, s.state),
            first_entry=s.first_entry,
            last_entry=s.last_entry,
            entry_count=s.entry_count,
            size_bytes=s.size_bytes,
            event_time=int(time.time() * 1000),
        )
        if write_flag:
            r.txn_idx_empty = s.txn_idx_empty
        if s.txn_idx_records is not None:
            r.txn_idx_records = s.txn_idx_records
        if s.data_crc32c is not None:
            r.data_crc32c = s.data_crc32c
        self._log.append(r.SerializeToString())  # durable before memory changes
        with self._lock:
            self._apply(s)
        return s

    # ------------------------------------------------------------ writes

    def copy_started(
        self,
        topic: str,
        ledger_id: int,
        first_entry: int,
        last_entry: int,
        entry_count: int,
        size_bytes: int,
        data_crc32c: int | None = None,
    ) -> SegmentInfo:
        """Record the start of an upload; return it with a new segment id.

        ``data_crc32c`` is the crc32c of the whole segment data (readers
        check the data they fetch against it).
        """
        topic_arg(topic)
        for name, v in (
            ("ledger_id", ledger_id),
            ("first_entry", first_entry),
            ("last_entry", last_entry),
            ("entry_count", entry_count),
            ("size_bytes", size_bytes),
        ):
            int_arg(v, name)
        if data_crc32c is not None:
            int_arg(data_crc32c, "data_crc32c", 0, 0xFFFFFFFF)
        s = SegmentInfo(
            topic,
            ledger_id,
            uuid.uuid4().hex,
            STARTED,
            first_entry,
            last_entry,
            entry_count,
            size_bytes,
            False,
            False,
            None,
            data_crc32c,
        )
        return self._write(s, write_flag=False)

    def copy_finished(
        self,
        started: SegmentInfo,
        txn_idx_empty: bool | None,
        txn_idx_records: int | None = None,
    ) -> SegmentInfo:
        """Record a complete upload.

        ``txn_idx_empty=None`` writes a record without the field, as a writer
        from before KIP-1058 did; ``txn_idx_records`` is the uploaded index's
        record count (readers check the index they fetch against it).
        """
        instance_arg(started, "started", SegmentInfo)
        s = SegmentInfo(
            started.topic,
            started.ledger_id,
            started.segment_id,
            FINISHED,
            started.first_entry,
            started.last_entry,
            started.entry_count,
            started.size_bytes,
            bool(txn_idx_empty),
            txn_idx_empty is not None,
            txn_idx_records,
            started.data_crc32c,
        )
        return self._write(s, write_flag=txn_idx_empty is not None)

    def delete_started(self, seg: SegmentInfo) -> None:
        """Record that an upload is abandoned and its objects are to be deleted.

        Never read again from here on; :meth:`unfinished` lists it until
        :meth:`deleted` records the objects gone, so a delete that failed is
        retried by the next clean-up.
        """
        self._write_state(seg, DELETE_STARTED)

    def deleted(self, seg: SegmentInfo) -> None:
        """Record that an upload's objects are deleted (it is never looked at again)."""
        self._write_state(seg, DELETED)

    def _write_state(self, seg: SegmentInfo, state: int) -> None:
        instance_arg(seg, "seg", SegmentInfo)
        s = SegmentInfo(
            seg.topic,
            seg.ledger_id,
            seg.segment_id,
            state,
            seg.first_entry,
            seg.last_entry,
            seg.entry_count,
            seg.size_bytes,
            seg.txn_idx_empty,
            seg.has_txn_idx_flag,
            seg.txn_idx_records,
            seg.data_crc32c,
        )
        self._write(s, write_flag=seg.has_txn_idx_flag)

    # ------------------------------------------------------------ queries

    def unfinished(self) -> list[SegmentInfo]:
        """Return uploads whose objects may still need deleting.

        Started and never finished (objects may be partial), or abandoned
        (DELETE_SEGMENT_STARTED) with the deletes not recorded done.
        """
        with self._lock:
            return [s for s in self._uploads.values() if s.state in (STARTED, DELETE_STARTED)]

    def segments(self, topic: str) -> list[SegmentInfo]:
        """Return the topic's readable remote segments in ledger order (one metadata call)."""
        topic_arg(topic)
        self._remote._count("metadata", "list")
        return self.segments_uncounted(topic)

    def segments_uncounted(self, topic: str) -> list[SegmentInfo]:
        """:meth:`segments` without counting a call (the offloader's own bookkeeping)."""
        with self._lock:
            by_ledger = self._finished.get(topic, {})
            return [by_ledger[k] for k in self._order.get(topic, [])]

    def offloaded_ledgers(self, topic: str) -> set[int]:
        """Return ledger ids of the topic with a readable remote copy.

        Not counted as a call: this is the offloader's own bookkeeping.
        """
        with self._lock:
            return set(self._finished.get(topic, {}))

    def next_segment_with_txn_index(self, topic: str, position: Position) -> SegmentInfo | None:
        """Return the next segment at or after ``position`` whose index must be fetched.

        KIP-1058; see the module docstring.
        """
        topic_arg(topic)
        position = position_arg(position, "position")
        self._remote._count("metadata", "next_segment_with_txn_index")
        return self._at_or_after(topic, position, skip_empty=self.skip_empty_txn_index)

    def _at_or_after(
        self, topic: str, position: Position, *, skip_empty: bool
    ) -> SegmentInfo | None:
        with self._lock:
            by_ledger = self._finished.get(topic, {})
            order = self._order.get(topic, [])
            for lid in order[bisect.bisect_left(order, position.ledger_id) :]:
                s = by_ledger[lid]
                if lid == position.ledger_id and position.entry_id > s.last_entry:
                    continue
                if skip_empty and s.has_txn_idx_flag and s.txn_idx_empty:
                    continue
                return s
        return None
