"""Offload of closed topic ledgers to remote storage.

One offload of ledger L of topic T, in this order:

1. read L (closed, so immutable), encode the segment data and its offset
   index, and find L's ABORT markers (Rust, GIL released);
2. take the local aborted-transaction index of L if it holds exactly those
   markers, else rebuild it from them (counted in ``stats["txn_index_rebuilt"]``);
3. append COPY_SEGMENT_STARTED to ``__remote_log_metadata`` (durable);
4. upload the data, the offset index and the aborted-transaction index;
5. append COPY_SEGMENT_FINISHED with ``txn_idx_empty`` (durable).

Readers use only finished uploads, so a crash anywhere before step 5 leaves
no metadata pointing at a partial upload; :meth:`Offloader.clean_up`
(run at start) deletes the objects of unfinished uploads and records them
deleted. Offload is by policy (:meth:`Offloader.offload_by_policy`: the
topic's closed ledgers beyond a local size threshold, or older than an age)
or on demand (:meth:`Offloader.offload`).
"""

from __future__ import annotations

import threading
import time
from collections import Counter

from txnstream._native import (
    AbortedTxnIndex,
    ManagedLedger,
    SegmentIndex,
    decode_topic_entry,
    export_segment,
)
from txnstream.errors import InvalidArgumentError, StorageError
from txnstream.tiered.metadata import RemoteLogMetadataManager, SegmentInfo
from txnstream.tiered.remote import RemoteStorage, object_name
from txnstream.tiered.txn_index import TopicTxnIndexes


class Offloader:
    """Uploads closed ledgers of topics and keeps their metadata."""

    def __init__(
        self,
        remote: RemoteStorage,
        metadata: RemoteLogMetadataManager,
        indexes: TopicTxnIndexes | None = None,
        *,
        write_txn_idx_flag: bool = True,
    ) -> None:
        self.remote = remote
        #: False writes metadata as a writer from before KIP-1058 did (no
        #: ``txn_idx_empty``); for compatibility tests and benchmarks.
        self.write_txn_idx_flag = write_txn_idx_flag
        self.metadata = metadata
        self.indexes = indexes
        self._lock = threading.Lock()  # one offload at a time per offloader
        self.stats: Counter[str] = Counter()

    def clean_up(self) -> int:
        """Delete the objects of uploads that never finished; return how many."""
        n = 0
        for seg in self.metadata.unfinished():
            for kind in ("segment", "offset_index", "txn_index"):
                self.remote.delete(
                    object_name(seg.topic, seg.ledger_id, seg.segment_id, kind), kind
                )
            self.metadata.deleted(seg)
            n += 1
        self.stats["interrupted_cleaned"] += n
        return n

    def offload(self, ml: ManagedLedger, ledger_id: int) -> SegmentInfo:
        """Upload one closed ledger of ``ml`` (on demand); return its metadata.

        A ledger already offloaded is not uploaded again.
        """
        topic = ml.name
        with self._lock:
            if ledger_id in self.metadata.offloaded_ledgers(topic):
                done = [s for s in self.metadata.segments(topic) if s.ledger_id == ledger_id]
                return done[0]
            data, offsets, aborts = export_segment(ml, ledger_id)
            local = self.indexes.load(topic, ledger_id) if self.indexes is not None else None
            if local is not None and local.matches(aborts):
                index = local
            elif local is None and not aborts:
                index = AbortedTxnIndex(ledger_id)  # no abort here: nothing to index
            else:
                index = AbortedTxnIndex.rebuild(ledger_id, aborts)
                self.stats["txn_index_rebuilt"] += 1
            seg_index = SegmentIndex.decode(offsets)
            started = self.metadata.copy_started(
                topic,
                ledger_id,
                seg_index.first_entry,
                seg_index.last_entry if seg_index.last_entry is not None else 0,
                seg_index.entry_count,
                len(data),
            )
            sid = started.segment_id
            self.remote.put(object_name(topic, ledger_id, sid, "segment"), data, "segment")
            self.remote.put(
                object_name(topic, ledger_id, sid, "offset_index"), offsets, "offset_index"
            )
            self.remote.put(
                object_name(topic, ledger_id, sid, "txn_index"), index.encode(), "txn_index"
            )
            empty = index.is_empty() if self.write_txn_idx_flag else None
            finished = self.metadata.copy_finished(started, txn_idx_empty=empty)
            self.stats["segments_offloaded"] += 1
            self.stats["bytes_offloaded"] += len(data)
            return finished

    def offload_by_policy(
        self,
        ml: ManagedLedger,
        *,
        threshold_bytes: int | None = None,
        min_age_ms: int | None = None,
    ) -> list[SegmentInfo]:
        """Offloads the topic's closed ledgers the policy selects, oldest first.

        ``threshold_bytes``: keep at most this many bytes of closed ledgers
        local (Pulsar's ``managedLedgerOffloadThresholdInBytes``);
        ``min_age_ms``: offload closed ledgers whose newest message is older
        (by publish time). Either or both; at least one must be given.
        """
        if threshold_bytes is None and min_age_ms is None:
            raise InvalidArgumentError("give threshold_bytes or min_age_ms (or both)")
        for name, v in (("threshold_bytes", threshold_bytes), ("min_age_ms", min_age_ms)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise InvalidArgumentError(f"{name} must be an int >= 0, got {v!r}")
        done = self.metadata.offloaded_ledgers(ml.name)
        closed = [
            (lid, n) for lid, n, sealed in ml.ledgers() if sealed and n > 0 and lid not in done
        ]
        chosen: set[int] = set()
        if min_age_ms is not None:
            now_ms = time.time() * 1000
            for lid, n in closed:
                newest = decode_topic_entry(ml.read((lid, n - 1)))
                if now_ms - newest["publish_time"] >= min_age_ms:
                    chosen.add(lid)
        if threshold_bytes is not None:
            sizes = {lid: _ledger_bytes(ml, lid, n) for lid, n in closed}
            local = sum(sizes.values())
            for lid, _ in closed:  # oldest first
                if local <= threshold_bytes:
                    break
                chosen.add(lid)
                local -= sizes[lid]
        out = []
        for lid, _ in closed:
            if lid in chosen:
                try:
                    out.append(self.offload(ml, lid))
                except StorageError:
                    self.stats["offload_failed"] += 1
                    raise
        return out


def _ledger_bytes(ml: ManagedLedger, ledger_id: int, count: int) -> int:
    return sum(len(d) for _, d in ml.read_range((ledger_id, 0), (ledger_id, count - 1)))
