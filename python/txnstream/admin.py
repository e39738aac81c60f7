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
  :meth:`Admin.tiered_stats` (every remote call counted by kind).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from txnstream.broker.topic_name import TopicName
from txnstream.coordinator import TransactionInfo, TxnID, TxnStatus
from txnstream.errors import InvalidArgumentError
from txnstream.tiered import SegmentInfo

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
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds >= 0:
            raise InvalidArgumentError(
                f"seconds must be a non-negative number, got {seconds!r}",
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
        """Abort ``txn_id`` now, whatever its client does; its final status.

        Its messages become invisible, its acks are released and
        redelivered; a later commit by its client gets
        ``TransactionAlreadyAborted``.
        """
        return self._broker._coordinators().force_abort(_txn_id(txn_id))

    def coordinator_stats(self) -> list[dict[str, Any]]:
        """Stats of every coordinator."""
        return self._broker._coordinators().stats()

    def set_transaction_log_batch_enabled(self, enabled: bool) -> None:
        """Switch batched writes of every coordinator's log (PIP-160)."""
        if not isinstance(enabled, bool):
            raise InvalidArgumentError(
                f"enabled must be a bool, got {enabled!r}", argument="enabled", value=enabled
            )
        for tc in self._broker._coordinators().coordinators():
            tc.set_batch_enabled(enabled)

    def set_pending_ack_batch_enabled(self, enabled: bool) -> None:
        """Switch batched writes of every pending-ack log (PIP-160)."""
        self._broker.set_pending_ack_batch_enabled(enabled)

    def pending_ack_batch_stats(self) -> dict[str, dict[str, Any]]:
        """Batch stats of every open pending-ack log's writer."""
        return {w.name: w.stats() for w in self._broker.pending_ack_writers()}

    # ------------------------------------------------------------ topics

    def create_topic(self, topic: str, partitions: int = 0) -> int:
        """Create ``topic`` with ``partitions`` partitions (0: not partitioned)."""
        return self._broker.create_topic(topic, partitions)

    def topics(self) -> list[tuple[str, int]]:
        """Every topic of the data directory with its partition count."""
        return self._broker.topic_names()

    def topic_stats(self, topic: str) -> list[dict[str, object]]:
        """Per partition of ``topic``: transaction buffer, deduplication, subscriptions."""
        return [self._broker.topic(tn).stats() for tn in self._broker.partition_names(topic)]

    def read_committed_lag(self, topic: str | None = None) -> dict[str, int]:
        """Entries from ``max_read_position`` to the log end, per partition.

        For ``topic`` (its partitions are loaded if needed), or every
        partition loaded in this process.
        """
        if topic is None:
            return {t.full: t.tb.lag() for t in self._broker.loaded_topics()}
        TopicName.parse(topic)
        out: dict[str, int] = {}
        for tn in self._broker.partition_names(topic):
            out[tn.full] = self._broker.topic(tn).tb.lag()
        return out

    # ------------------------------------------------------------ tiered storage

    def offload(self, topic: str) -> list[SegmentInfo]:
        """Offload every closed ledger of ``topic``'s partitions now (on demand).

        Returns the uploaded segments' metadata (ledgers offloaded before
        included). See SPEC §4.8 and :mod:`txnstream.tiered.offload`.
        """
        TopicName.parse(topic)
        self._broker.partitions(topic, create=False)  # an unknown topic is an error, not created
        tiered = self._broker.tiered
        out: list[SegmentInfo] = []
        for tn in self._broker.partition_names(topic):
            ml = self._broker.topic(tn).ml
            for lid, n, sealed in ml.ledgers():
                if sealed and n:
                    out.append(tiered.offloader.offload(ml, lid))
            # From now on this partition's ledgers stay local until offloaded.
            tiered.offloader.hold_trimming(ml)
        return out

    def offloaded_segments(self, topic: str) -> dict[str, list[SegmentInfo]]:
        """Per partition of ``topic``: its readable remote segments, in ledger order."""
        TopicName.parse(topic)
        self._broker.partitions(topic, create=False)
        meta = self._broker.tiered.metadata
        return {tn.full: meta.segments(tn.full) for tn in self._broker.partition_names(topic)}

    def tiered_stats(self) -> dict[str, Any]:
        """Return remote calls and bytes by kind, and offloader counts.

        Kinds: segment data, offset index, txn index, metadata; offloader:
        segments and bytes offloaded, indexes rebuilt, interrupted uploads cleaned.
        """
        return self._broker.tiered.stats()


__all__ = ["Admin"]
