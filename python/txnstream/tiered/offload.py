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
(run by the broker's maintenance round, retried until the remote store lets
it) deletes the objects of unfinished uploads and records them deleted.
Local produce and consume never wait for the remote store: opening a topic
puts the hold in place (:func:`install_hold`) without reading the metadata.
Offload is by policy (:meth:`Offloader.offload_by_policy`: the topic's
closed ledgers beyond a local size threshold, or older than an age) or on
demand (:meth:`Offloader.offload`).

Kafka's rule holds from a topic's first upload on, policy or not: no ledger
after an offloaded one is deleted locally before it is uploaded too
(:meth:`Offloader.hold_trimming`). A ledger holding a transaction still open
may be uploaded; that transaction's ABORT marker lands in a later ledger,
whose aborted-transaction index (remote once uploaded, else the local
markers) is where a READ_COMMITTED read of the earlier one finds it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

from txnstream._native import (
    HOLD_CURSOR_PREFIX,
    AbortedTxnIndex,
    Cursor,
    ManagedLedger,
    Position,
    SegmentIndex,
    crc32c,
    decode_topic_entry,
    export_segment,
)
from txnstream.errors import InvalidArgumentError, OperationTimeoutError, StorageError
from txnstream.tiered.metadata import STARTED, RemoteLogMetadataManager, SegmentInfo
from txnstream.tiered.remote import RemoteStorage, instance_arg, int_arg, object_name
from txnstream.tiered.txn_index import TopicTxnIndexes

log = logging.getLogger(__name__)


class Offloader:
    """Uploads closed ledgers of topics and keeps their metadata."""

    def __init__(
        self,
        remote: RemoteStorage,
        metadata: RemoteLogMetadataManager,
        indexes: TopicTxnIndexes | None = None,
        *,
        write_txn_idx_flag: bool = True,
        lock_timeout_ms: int = 60_000,
    ) -> None:
        self.remote = remote
        #: How long an offload waits for another one in progress.
        self.lock_timeout_ms = int_arg(lock_timeout_ms, "lock_timeout_ms")
        # Bytes of closed (immutable) ledgers, measured once: (topic, ledger) -> bytes.
        self._sizes: dict[tuple[str, int], int] = {}
        #: False writes metadata as a writer from before KIP-1058 did (no
        #: ``txn_idx_empty``); for compatibility tests and benchmarks.
        self.write_txn_idx_flag = write_txn_idx_flag
        self.metadata = metadata
        self.indexes = indexes
        self._lock = threading.Lock()  # one offload at a time per offloader
        self.stats: Counter[str] = Counter()

    def clean_up(self, cancelled: Callable[[], bool] | None = None) -> int:
        """Delete the objects of uploads that never finished; return how many.

        It also removes the temporaries of directory writes a crash
        interrupted (another process's: this one's own are left alone). Runs
        between uploads (one at a time per offloader), so it may run at any
        time and be retried after a failure; the broker runs it in its
        maintenance round. ``cancelled`` (checked between uploads) stops it
        early: the rest stays for the next call.
        """
        with self._locked("clean-up of interrupted uploads"):
            self.stats["temporaries_removed"] += self.remote.sweep_temporaries()
            n = 0
            for seg in self.metadata.unfinished():
                if cancelled is not None and cancelled():
                    break
                if seg.state == STARTED:
                    # As _abandon does: its FINISHED record may be durable after a
                    # write that raised, so it is recorded abandoned before any
                    # object goes (else a restart could read a segment with none).
                    self.metadata.delete_started(seg)
                for kind in ("segment", "offset_index", "txn_index"):
                    self.remote.delete(
                        object_name(seg.topic, seg.ledger_id, seg.segment_id, kind), kind
                    )
                self.metadata.deleted(seg)
                n += 1
                self.stats["interrupted_cleaned"] += 1
        return n

    @contextlib.contextmanager
    def _locked(self, what: str) -> Iterator[None]:
        # One offload (or clean-up) at a time per offloader, waited for with a deadline.
        if not self._lock.acquire(timeout=self.lock_timeout_ms / 1000):
            raise OperationTimeoutError(
                f"{what}: another offload held the offloader for more than "
                f"{self.lock_timeout_ms} ms",
                what="offloader",
            )
        try:
            yield
        finally:
            self._lock.release()

    def offload(self, ml: ManagedLedger, ledger_id: int) -> SegmentInfo:
        """Upload one closed ledger of ``ml`` (on demand); return its metadata.

        A ledger already offloaded is not uploaded again.
        """
        instance_arg(ml, "ml", ManagedLedger)
        int_arg(ledger_id, "ledger_id")
        topic = ml.name
        with self._locked(f"offload of {topic} ledger {ledger_id}"):
            if ledger_id in self.metadata.offloaded_ledgers(topic):
                done = [
                    s for s in self.metadata.segments_uncounted(topic) if s.ledger_id == ledger_id
                ]
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
                crc32c(data),
            )
            sid = started.segment_id
            parts = (
                ("segment", data),
                ("offset_index", offsets),
                ("txn_index", index.encode()),
            )
            try:
                for kind, blob in parts:
                    self.remote.put(object_name(topic, ledger_id, sid, kind), blob, kind)
                empty = index.is_empty() if self.write_txn_idx_flag else None
                records = len(index) if self.write_txn_idx_flag else None
                finished = self.metadata.copy_finished(started, empty, records)
            except BaseException:
                self._abandon(started)
                raise
            self.stats["segments_offloaded"] += 1
            self.stats["bytes_offloaded"] += len(data)
            self._sizes.pop((topic, ledger_id), None)  # offloaded: no longer measured
            return finished

    def _abandon(self, started: SegmentInfo) -> None:
        # A failed upload: record DELETE_STARTED durably, delete what it
        # wrote, then record DELETE_FINISHED. Recorded first: the FINISHED
        # record whose write raised may be durable all the same (a failed
        # sync of written data), and objects deleted under a FINISHED record
        # that survives would lose the ledger once it is trimmed locally. If
        # DELETE_STARTED fails too, the objects stay, matching whichever
        # record survives (clean_up deletes them later if that is STARTED).
        # Until DELETE_FINISHED is recorded, clean_up retries the deletes.
        try:
            self.metadata.delete_started(started)
        except Exception:
            log.warning(
                "offload of %s ledger %d: recording the failed upload failed; its objects "
                "stay until the next clean-up",
                started.topic,
                started.ledger_id,
            )
            return
        try:
            for kind in ("segment", "offset_index", "txn_index"):
                self.remote.delete(
                    object_name(started.topic, started.ledger_id, started.segment_id, kind), kind
                )
            self.metadata.deleted(started)
            self.stats["offload_failed_cleaned"] += 1
        except Exception:
            log.warning(
                "offload of %s ledger %d: deleting the failed upload's objects failed; "
                "the next clean-up retries (they are never read)",
                started.topic,
                started.ledger_id,
            )

    def hold_trimming(self, ml: ManagedLedger) -> None:
        """Keep ``ml``'s local ledgers until they are offloaded (Kafka's rule).

        Opens the hold cursor :data:`HOLD_CURSOR` on the topic and moves its
        mark-delete to the end of the longest run of offloaded ledgers from
        the first one: trimming (which follows the slowest cursor) never
        removes a ledger that has no remote copy, so a READ_COMMITTED read
        over remote and local data has no gap. Being a hold, it never trims
        a topic that no subscription consumed (subscriptions read local
        ledgers only). The broker holds from a topic's first upload on, on
        demand or by policy (:meth:`txnstream.admin.Admin.offload` calls this
        before it uploads anything), and from a topic's open while a policy
        is set: an ABORT marker written after an upload is in a later ledger,
        and reads of the remote part need it from that ledger's index or
        locally.
        """
        cursor = install_hold(ml)
        done = self.metadata.offloaded_ledgers(ml.name)
        upto: Position | None = None
        for lid, n, sealed in ml.ledgers():
            if not sealed or lid not in done:
                break
            if n:
                upto = Position(lid, n - 1)
        current = cursor.mark_delete_position
        if upto is not None and (current is None or upto > current):
            cursor.mark_delete(upto)

    def offload_by_policy(
        self,
        ml: ManagedLedger,
        *,
        threshold_bytes: int | None = None,
        min_age_ms: int | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> list[SegmentInfo]:
        """Offloads the topic's closed ledgers the policy selects, oldest first.

        ``threshold_bytes``: keep at most this many bytes of closed ledgers
        local (Pulsar's ``managedLedgerOffloadThresholdInBytes``);
        ``min_age_ms``: offload closed ledgers whose newest message is older
        (by publish time). Either or both; at least one must be given.
        ``cancelled`` is asked before each upload: once it says True the
        rest waits for a later call (a closing broker waits for one upload,
        not for the whole selection).
        """
        instance_arg(ml, "ml", ManagedLedger)
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
            sizes = {}
            for lid, n in closed:  # closed ledgers never change: measured once
                key = (ml.name, lid)
                if key not in self._sizes:
                    self._sizes[key] = _ledger_bytes(ml, lid, n)
                sizes[lid] = self._sizes[key]
            local = sum(sizes.values())
            for lid, _ in closed:  # oldest first
                if local <= threshold_bytes:
                    break
                chosen.add(lid)
                local -= sizes[lid]
        out = []
        for lid, _ in closed:
            if lid in chosen:
                if cancelled is not None and cancelled():
                    break
                try:
                    out.append(self.offload(ml, lid))
                except StorageError:
                    self.stats["offload_failed"] += 1
                    raise
        return out


def _ledger_bytes(ml: ManagedLedger, ledger_id: int, count: int) -> int:
    return sum(len(d) for _, d in ml.read_range((ledger_id, 0), (ledger_id, count - 1)))


#: Hold cursor keeping a topic's ledgers until offloaded (a hold: it never trims alone).
HOLD_CURSOR = HOLD_CURSOR_PREFIX + "tiered"
#: Its name before holds existed: an ordinary cursor, which let a topic with no
#: subscription be trimmed once offloaded. Replaced (or removed) when met.
LEGACY_HOLD_CURSOR = "__tiered"


def install_hold(ml: ManagedLedger) -> Cursor:
    """Open ``ml``'s offload hold (a new one holds every ledger); return its cursor.

    No metadata and no remote call: the broker puts it in place when it
    opens a topic while an offload policy is set, whether or not the remote
    store is reachable; :meth:`Offloader.hold_trimming` moves it on. The
    cursor of the same job from before holds existed is removed.
    """
    instance_arg(ml, "ml", ManagedLedger)
    if LEGACY_HOLD_CURSOR in ml.cursor_names():
        ml.delete_cursor(LEGACY_HOLD_CURSOR)
    return ml.open_cursor(HOLD_CURSOR)


def release_trimming(ml: ManagedLedger) -> None:
    """Drop ``ml``'s offload hold (no offload policy: nothing waits for offload any more).

    Without this, a hold left by an earlier run with a policy would keep
    every ledger after its last offload forever.
    """
    names = ml.cursor_names()
    for name in (HOLD_CURSOR, LEGACY_HOLD_CURSOR):
        if name in names:
            ml.delete_cursor(name)
