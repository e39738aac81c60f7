"""Admin API of a live, in-process broker (SPEC §4.10): ``broker.admin``.

What users of Pulsar and Kafka transactions ask for, built in:

- :meth:`Admin.open_transactions` and :meth:`Admin.transactions_older_than`
  (Kafka's ``--find-hanging``, Pulsar's slow transactions);
- :meth:`Admin.force_abort` (Pulsar PIP-325, Kafka KIP-664): abort a stuck
  transaction whatever its client does;
- :meth:`Admin.late_transactions`: live transactions past their timeout
  (also the gauge ``txnstream_txn_tc_late_count``);
- :meth:`Admin.read_committed_lag`: per loaded partition, the entries from
  ``max_read_position`` to the end of the log (the gauge
  ``txnstream_topic_read_committed_lag``; lag tools that use the log end
  misreport READ_COMMITTED consumers);
- topic creation and stats, batched-log switches for the coordinators and
  the pending-ack stores, coordinator stats;
- tiered storage: :meth:`Admin.offload` on demand, :meth:`Admin.offloaded_segments`,
  :meth:`Admin.tiered_stats` (every remote call counted by kind);
- :meth:`Admin.transaction_buffer_stats`, :meth:`Admin.pending_ack_stats`,
  :meth:`Admin.internal_stats` and :meth:`Admin.batched_log_stats`: the
  broker's live state in the shapes of the read-only file views of
  :mod:`txnstream.datadir` (what ``txnstream admin --data DIR`` prints), so
  the two surfaces can be compared on the keys they share.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from txnstream._native import Position
from txnstream.broker.topic_name import TopicName, subscription_arg
from txnstream.coordinator import TransactionInfo, TxnID, TxnStatus
from txnstream.datadir import (
    LOG_KINDS,
    ledger_internal_stats,
    position_str,
    snapshot_info,
)
from txnstream.errors import InvalidArgumentError
from txnstream.tiered import SegmentInfo
from txnstream.tiered.offload import HOLD_CURSOR, LEGACY_HOLD_CURSOR, release_trimming

#: Largest age ``transactions_older_than`` takes (about 317 years: any start time).
MAX_AGE_S = 10**10

if TYPE_CHECKING:
    from txnstream.broker.broker import Broker


def _txn_id(value: object) -> TxnID:
    if isinstance(value, TxnID):
        return value
    if (
        isinstance(value, tuple)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        return TxnID(value[0], value[1])
    if isinstance(value, str):
        try:
            return TxnID.parse(value)
        except Exception:
            pass
    raise InvalidArgumentError(
        f"txn_id must be a TxnID, a (most_bits, least_bits) tuple or '(most,least)', got {value!r}",
        argument="txn_id",
        value=value,
    )


#: Why a writer flushed a batch (its ``flush_<cause>`` counters).
_FLUSH_CAUSES = ("max_records", "max_size", "max_delay", "large_data", "forced")


def _pos(value: object) -> str | None:
    """``"ledger:entry"`` of a position-valued stat (None stays None)."""
    if value is None:
        return None
    if not isinstance(value, Position):
        raise TypeError(f"expected a Position, got {value!r}")
    return position_str(value)


class Admin:
    """Administration of one live :class:`~txnstream.broker.Broker` (thread-safe)."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker

    # ------------------------------------------------------------ transactions

    def open_transactions(self) -> list[TransactionInfo]:
        """Return every live transaction, on every coordinator, oldest first.

        Live: OPEN, or decided (COMMITTING/ABORTING) and not completed yet --
        a transaction whose ``commit()`` returned is listed until its final
        record is written in the background (usually milliseconds later).
        """
        out: list[TransactionInfo] = []
        for tc in self._broker._coordinators().coordinators():
            out.extend(
                i
                for i in tc.list_transactions()
                if i.status not in (TxnStatus.COMMITTED, TxnStatus.ABORTED)
            )
        out.sort(key=lambda i: (i.start_time, i.txn_id))
        return out

    def transactions_older_than(self, seconds: float) -> list[TransactionInfo]:
        """Open transactions started at least ``seconds`` ago (wall clock), oldest first."""
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not 0 <= seconds <= MAX_AGE_S
        ):
            raise InvalidArgumentError(
                f"seconds must be a number in 0..{MAX_AGE_S}, got {seconds!r}",
                argument="seconds",
                value=seconds,
            )
        cutoff = self._broker.wall_ms() - int(seconds * 1000)
        return [i for i in self.open_transactions() if i.start_time <= cutoff]

    def late_transactions(self) -> list[TransactionInfo]:
        """Live transactions past their timeout (not aborted yet, or stuck ending)."""
        out: list[TransactionInfo] = []
        for tc in self._broker._coordinators().coordinators():
            out.extend(tc.late_transactions())
        out.sort(key=lambda i: (i.start_time, i.txn_id))
        return out

    def get_transaction(self, txn_id: TxnID | tuple[int, int] | str) -> TransactionInfo:
        """Metadata of one transaction (``TransactionNotFound`` if unknown)."""
        return self._broker._coordinators().get_transaction(_txn_id(txn_id))

    def force_abort(self, txn_id: TxnID | tuple[int, int] | str) -> TxnStatus:
        """Abort ``txn_id`` now, whatever its client does; return its final status.

        An OPEN transaction is aborted (``ABORTED``): its messages become
        invisible, its acks are released and redelivered, and a later commit
        by its client gets ``TransactionAlreadyAborted``. A transaction whose
        commit is already decided (COMMITTING) or done is never turned into
        an abort -- its commit may already be visible -- so the answer is
        ``COMMITTED``: check it. One decided to abort is finished now.
        """
        return self._broker._coordinators().force_abort(_txn_id(txn_id))

    def coordinator_stats(self) -> list[dict[str, Any]]:
        """Stats of every coordinator."""
        return self._broker._coordinators().stats()

    def set_transaction_log_batch_enabled(self, enabled: bool) -> None:
        """Switch batched writes of every coordinator's log (PIP-160), persisted.

        Checked as at open and written to the directory's dynamic settings
        first (``Broker.set_dynamic``): it survives a restart, as a Pulsar
        dynamic setting does.
        """
        tcs = self._broker._coordinators().coordinators()  # closed or opening: nothing written

        def switch(on: bool) -> None:
            for tc in tcs:
                tc.set_batch_enabled(on)

        self._broker.set_dynamic("transactionLogBatchedWriteEnabled", enabled, switch)

    def set_pending_ack_batch_enabled(self, enabled: bool) -> None:
        """Switch batched writes of every pending-ack log (PIP-160), persisted (as above)."""
        self._broker.set_pending_ack_batch_enabled(enabled)

    def pending_ack_batch_stats(self) -> dict[str, dict[str, Any]]:
        """Batch stats of every open pending-ack log's writer."""
        return {w.name: w.stats() for w in self._broker.pending_ack_writers()}

    def batched_log_stats(self, log: str) -> dict[str, Any]:
        """PIP-160 batch stats of the ``"coordinator"`` or ``"pending-ack"`` logs' writers.

        Seed 000's admin section: ``enabled`` (the switch now), and per
        writer (``writers``, by log name) its ``batch_enabled``, ``entries``,
        ``batched_entries``, ``records``, ``bytes``, the histograms
        ``records_per_entry``, ``bytes_per_entry`` and
        ``oldest_record_delay_seconds`` (seed 000's buckets), and
        ``flush_triggers`` by cause (``max_records``, ``max_size``,
        ``max_delay``, ``large_data``, ``forced``). Counted since the
        writer opened (``txnstream.datadir.batch_stats`` counts the stored
        entries instead). Pending-ack writers are listed once their
        subscription is open in this process.
        """
        if log not in LOG_KINDS:
            raise InvalidArgumentError(
                f"log must be one of {list(LOG_KINDS)}, got {log!r}", argument="log", value=log
            )
        if log == "coordinator":
            raw = [tc.stats()["log"] for tc in self._broker._coordinators().coordinators()]
            enabled = all(w["batch_enabled"] for w in raw)
        else:
            raw = [w.stats() for w in self._broker.pending_ack_writers()]
            enabled = self._broker.config.pending_ack_batched_write.enabled
        writers = []
        for w in raw:
            writers.append(
                {
                    "name": w["name"],
                    "batch_enabled": w["batch_enabled"],
                    "entries": w["entries"],
                    "batched_entries": w["batched_entries"],
                    "records": w["records"],
                    "bytes": w["bytes"],
                    "records_per_entry": w["batch_records"],
                    "bytes_per_entry": w["batch_size_bytes"],
                    "oldest_record_delay_seconds": w["oldest_record_delay_seconds"],
                    "flush_triggers": {cause: w[f"flush_{cause}"] for cause in _FLUSH_CAUSES},
                }
            )
        writers.sort(key=lambda w: str(w["name"]))
        return {"log": log, "enabled": enabled, "source": "writer", "writers": writers}

    # ------------------------------------------------------------ topics

    def create_topic(self, topic: str, partitions: int = 0) -> int:
        """Create ``topic`` with ``partitions`` partitions (0: not partitioned)."""
        return self._broker.create_topic(topic, partitions)

    def topics(self) -> list[tuple[str, int]]:
        """Every topic of the data directory with its partition count."""
        return self._broker.topic_names()

    def loaded_topics(self) -> dict[str, Any]:
        """Partitions loaded now (``loaded``, their ``names``) and ``unloaded`` since open.

        Idle partitions unload after ``topic_idle_unload_ms`` (``idle_unload_ms``).
        """
        names = sorted(t.full for t in self._broker.loaded_topics())
        return {
            "loaded": len(names),
            "names": names,
            "unloaded": self._broker.topics_unloaded,
            "idle_unload_ms": self._broker.config.topic_idle_unload_ms,
        }

    def topic_stats(self, topic: str) -> list[dict[str, object]]:
        """Per partition of ``topic``: transaction buffer, deduplication, subscriptions."""
        out: list[dict[str, object]] = []
        for tn in self._partitions(topic):
            with self._broker.using_topic(tn) as t:
                out.append(t.stats())
        return out

    def read_committed_lag(self, topic: str | None = None) -> dict[str, int]:
        """Entries from ``max_read_position`` to the log end, per partition.

        For ``topic`` (its partitions are loaded if needed), or every
        partition loaded in this process.
        """
        if topic is None:
            return {t.full: t.tb.lag() for t in self._broker.loaded_topics()}
        out: dict[str, int] = {}
        for tn in self._partitions(topic):  # a read: an unknown topic is an error, not created
            with self._broker.using_topic(tn) as t:
                out[tn.full] = t.tb.lag()
        return out

    def _partitions(self, topic: str) -> list[TopicName]:
        """Partitions of an existing ``topic`` (an unknown one is an error, not created)."""
        TopicName.parse(topic)
        self._broker.partitions(topic, create=False)
        return self._broker.partition_names(topic)

    def transaction_buffer_stats(self, topic: str) -> list[dict[str, Any]]:
        """Return each partition's transaction buffer (Pulsar's ``transaction-buffer-stats``).

        ``topic``, ``max_read_position`` and ``last_position``
        (``"ledger:entry"`` or None), ``lag``, ``ongoing`` and ``aborted``
        counts, ``ongoing_transactions`` (``txn_id``, ``first_position``,
        oldest first), ``ending``, ``markers_written``,
        ``rejected_appends``, every coordinator's ``low_water_marks`` (keys
        are coordinator ids as text) and ``snapshot`` (the newest durable
        snapshot, None when there is none). The keys it shares with
        :func:`txnstream.datadir.transaction_buffer_stats` mean the same there;
        the live counters ``ending``, ``markers_written`` and
        ``rejected_appends`` are only here, and the file view's ledger scan
        (``committed``, ``entries``, ``markers``) only there.
        """
        partitions = self._partitions(topic)
        lwm = {str(k): v for k, v in self._broker._coordinators().low_water_marks().items()}
        out: list[dict[str, Any]] = []
        for tn in partitions:
            with self._broker.using_topic(tn) as t:
                tb = t.tb
                stats = tb.stats()
                with tb.lock:
                    ongoing = list(tb.ongoing.items())
                max_read = tb.max_read_position
            out.append(
                {
                    "topic": tn.full,
                    "max_read_position": position_str(max_read),
                    "last_position": _pos(stats["last_durable"]),
                    "lag": stats["lag"],
                    "ongoing": stats["ongoing"],
                    "aborted": stats["aborted"],
                    "ongoing_transactions": [
                        {"txn_id": str(txn), "first_position": position_str(first)}
                        for txn, first in ongoing
                    ],
                    "ending": stats["ending"],
                    "markers_written": stats["markers_written"],
                    "rejected_appends": stats["rejected_appends"],
                    "low_water_marks": lwm,
                    "snapshot": snapshot_info(self._broker.path, tn),
                }
            )
        return out

    def pending_ack_stats(self, topic: str, subscription: str) -> list[dict[str, Any]]:
        """Return ``subscription``'s pending acks per partition (Pulsar's ``pending-ack-stats``).

        ``topic``, ``subscription``, ``mark_delete_position``, ``ongoing``
        (transactions holding acks), ``held_entries``, ``pending_trim`` and
        the store's counters (``counters``). The subscription is opened if it
        exists and is not open yet; one that does not exist is an
        :class:`InvalidArgumentError` (nothing is created).
        """
        partitions = self._partitions(topic)
        out: list[dict[str, Any]] = []
        for tn in partitions:
            sub = subscription_arg(subscription, tn)
            with self._broker.using_topic(tn) as t:
                if sub not in t.ml.cursor_names():
                    continue
                stats = t.subscription(sub).stats()
            pending = dict(stats["pending_ack"])  # type: ignore[call-overload]
            out.append(
                {
                    "topic": tn.full,
                    "subscription": sub,
                    "mark_delete_position": _pos(stats["mark_delete_position"]),
                    "ongoing": pending.pop("transactions"),
                    "held_entries": pending.pop("held_entries"),
                    "pending_trim": pending.pop("pending_trim"),
                    "counters": pending,
                }
            )
        if not out:
            raise InvalidArgumentError(
                f"subscription {subscription!r} not found on topic {topic!r}",
                argument="subscription",
                value=subscription,
            )
        return out

    def internal_stats(self, topic: str) -> dict[str, dict[str, Any]]:
        """Managed-ledger internal stats of ``topic``'s partitions (Pulsar's ``stats-internal``).

        Ledger name -> ledgers, entries, positions and cursors (mark-delete,
        individually deleted ranges), as
        :func:`txnstream.datadir.ledger_internal_stats` (and the CLI's
        ``topic-internal-stats``) report them.
        """
        out: dict[str, dict[str, Any]] = {}
        for tn in self._partitions(topic):
            with self._broker.using_topic(tn) as t:
                out[tn.full] = ledger_internal_stats(t.ml)
        return out

    # ------------------------------------------------------------ tiered storage

    def offload(self, topic: str) -> list[SegmentInfo]:
        """Offload every closed ledger of ``topic``'s partitions now (on demand).

        Returns the uploaded segments' metadata (ledgers offloaded before
        included). From a partition's first upload on, policy or not, its
        later ledgers stay local until they are offloaded too (Kafka's rule:
        the hold cursor ``__hold.tiered``, put in place before the first
        upload): an ABORT marker written after an upload lands in a later
        ledger, and a READ_COMMITTED read of the remote part needs it. Each
        call lets trimming go on through what it uploaded. See SPEC §4.8 and
        :mod:`txnstream.tiered.offload`.
        """
        partitions = self._partitions(topic)  # an unknown topic is an error, not created
        tiered = self._broker.tiered
        out: list[SegmentInfo] = []
        for tn in partitions:
            with self._broker.using_topic(tn) as t:  # not unloaded while uploading
                ml = t.ml
                # Before the first upload: no ledger after it is trimmed un-uploaded.
                tiered.offloader.hold_trimming(ml)
                for lid, n, sealed in ml.ledgers():
                    if sealed and n:
                        self._broker._check_open()  # a closing broker waits for one upload
                        out.append(tiered.offloader.offload(ml, lid))
                tiered.offloader.hold_trimming(ml)  # up to what is uploaded now
        return out

    def release_offload_hold(self, topic: str) -> int:
        """Let trimming of ``topic``'s partitions follow their subscriptions alone.

        Drops the hold that keeps ledgers until offloaded, left by a run
        with an offload policy whose partitions have no remote segment (no
        policy any more: nothing would offload them, so they would stay
        forever). Returns how many partitions had one. With a policy set,
        the next topic open puts the hold back.

        A partition with remote segments keeps its hold: raises
        :class:`InvalidArgumentError` naming it, and releases nothing
        (:meth:`offload` its ledgers instead, which lets trimming go on).
        Trimming a ledger after its remote ones before it is uploaded would
        lose the ABORT markers READ_COMMITTED reads of them need.
        """
        with contextlib.ExitStack() as using:  # the partitions stay loaded throughout
            return self._release_offload_hold(topic, using)

    def _release_offload_hold(self, topic: str, using: contextlib.ExitStack) -> int:
        held = []
        for tn in self._partitions(topic):
            ml = using.enter_context(self._broker.using_topic(tn)).ml
            names = ml.cursor_names()
            if HOLD_CURSOR in names or LEGACY_HOLD_CURSOR in names:
                held.append((tn, ml))
        if held:
            metadata = self._broker.tiered.metadata
            for tn, _ in held:
                if metadata.offloaded_ledgers(tn.full):
                    raise InvalidArgumentError(
                        f"{tn.full} has remote segments: its later ledgers stay local until "
                        "offloaded (READ_COMMITTED reads of the remote ones need their ABORT "
                        f"markers); offload them (admin.offload({topic!r})) to let trimming "
                        "go on",
                        argument="topic",
                        value=topic,
                    )
        for _, ml in held:
            release_trimming(ml)
        return len(held)

    def offloaded_segments(self, topic: str) -> dict[str, list[SegmentInfo]]:
        """Per partition of ``topic``: its readable remote segments, in ledger order."""
        partitions = self._partitions(topic)
        meta = self._broker.tiered.metadata
        return {tn.full: meta.segments(tn.full) for tn in partitions}

    def tiered_stats(self) -> dict[str, Any]:
        """Return remote calls and bytes by kind, and offloader counts.

        Kinds: segment data, offset index, txn index, metadata; offloader:
        segments and bytes offloaded, indexes rebuilt, interrupted uploads cleaned.
        """
        return self._broker.tiered.stats()


__all__ = ["Admin"]
