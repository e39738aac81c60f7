"""The embedded broker: one data directory, its coordinators, topics, subscriptions and their logs.

``Broker.open(path)`` is the engine a client talks to (SPEC §4.5, §4.9). It
owns the wiring -- which managed ledgers exist, one timer service, the
threads -- and hands components what they need; components never open
ledgers of their own.

- **The data directory** holds every log behind one journal (the storage
  layer): topic partitions under their full names, pending-ack logs
  (``<partition>-<subscription>__transaction_pending_ack``), coordinator
  logs (``__transaction_log_<tc_id>``), the terminated-transaction stores,
  ``__txnstream_topics`` (a compacted topic: partitions per topic) and
  ``__txnstream_pending_ack_owners`` (which subscription each pending-ack
  log belongs to: Pulsar's log names can collide). The
  first ledger the broker opens takes the directory's writer lock; another
  process opening it for writing gets a ``StorageError``.
- **Coordinators** ``0..n-1`` share the broker's timer service. They run
  with idempotent end on (PIP-255, ``transactionMetaPersistCount`` default
  1000 per client name) and complete ends off the client's path.
- **Topics open lazily**: a partition is opened, recovered and reconciled on
  first use (a send, a subscribe, or a coordinator ending a transaction on
  it). A broker with 10,000 topics opens only the ones in use; storage
  threads and descriptors do not grow with them either. With
  ``topicRecoveryMode=eager`` every partition recovers in the background
  from open on a bounded pool (:mod:`.recovery`: progress, failures,
  cancel on close).
- **Snapshots** (SPEC §4.5, §4.6): a partition recovers from its newest
  transaction-buffer snapshot plus the ledger after it. Snapshots are read
  through one shared reader per namespace (held by the broker; its handle
  closes after 60 s idle) and written by the maintenance thread to the
  namespace's write-only snapshot topic when due
  (``transactionBufferSnapshotMaxTransactionCount`` changes or
  ``transactionBufferSnapshotMinTimeInMillis``), and for every changed
  partition on close.
- **Recovery reconciliation.** Coordinators recover first; a partition or
  subscription opened later asks them about every transaction it still
  holds: committed -> commit marker / acks applied; aborted, or unknown ->
  abort; open -> stays until its own end (timeout). Coordinators resuming
  decided ends open the partitions they name, so those are reconciled at
  open; any other partition is reconciled before it serves anything.
- **Maintenance**: every ``pending_ack_trim_interval_ms`` the broker
  deletes ended transactions' pending-ack records (after flushing the
  cursors holding their acks), and unloads partitions idle for
  ``topic_idle_unload_ms``.
- **Idle partitions unload** (as Pulsar unloads a bundle): a partition with
  no Producer or Consumer attached (counted by :meth:`Broker.attach` and
  :meth:`Broker.detach`; a producer attaches with its name, a consumer for
  its life), nothing in flight (open transactions, pending acks, writes,
  subscriptions opening, uploads: those run with the partition attached)
  and no lookup since the idle time began writes its snapshot, closes as on
  ``close()`` and leaves :attr:`Broker._topics`; its next use reloads it
  the way a restart does (snapshot, ledger after it, reconciliation), so
  memory follows the partitions in use. A lookup racing an unload waits for
  it and loads the partition again: internal users attach first (or hold
  :meth:`Broker.using_topic`), so they never get a closed partition.

``close()`` stops clients, then coordinators (ends in flight finish), then
topics and logs, then the timer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from prometheus_client.registry import REGISTRY, CollectorRegistry

from txnstream._native import BufferedWriter, CompactedTopic, ManagedLedger, Position
from txnstream.broker.recovery import TopicRecovery
from txnstream.broker.topic import Topic, await_opening
from txnstream.broker.topic_name import MAX_PARTITIONS, TopicName
from txnstream.buffer import TxnOutcomes
from txnstream.buffer.snapshot_reader import SharedSnapshotReader, SnapshotReaders
from txnstream.buffer.snapshot_writer import SnapshotWriter
from txnstream.config import BrokerConfig, apply_dynamic_config, write_dynamic_config
from txnstream.coordinator import (
    CoordinatorConfig,
    TransactionCoordinator,
    TransactionCoordinators,
    TxnID,
    log_name,
)
from txnstream.coordinator.coordinator import directory_arg
from txnstream.coordinator.ending import Participant
from txnstream.coordinator.state import log_ids
from txnstream.durable_file import make_dirs_durably
from txnstream.errors import (
    AlreadyClosedError,
    ConfigError,
    CoordinatorNotFound,
    InvalidArgumentError,
    InvalidTopicNameError,
    TxnStreamError,
)
from txnstream.metrics import (
    CommitTally,
    register_broker,
    register_remote_store,
    register_writer,
    unregister_broker,
    unregister_remote_store,
    unregister_writer,
)
from txnstream.proto import TransactionBufferSnapshot
from txnstream.tiered import (
    METADATA_LEDGER,
    Offloader,
    ReadMessage,
    RemoteLogMetadataManager,
    RemoteStorage,
    TieredReader,
    TopicTxnIndexes,
)
from txnstream.tiered.offload import HOLD_CURSOR, LEGACY_HOLD_CURSOR, install_hold
from txnstream.timer import Clock, TimerHandle, TimerService, clock_arg, timeout_ms_arg

if TYPE_CHECKING:
    from txnstream.admin import Admin
    from txnstream.client import Client

# Forks seen by this process: a handle made before a fork compares its count with
# this one. ``os.getpid()`` is a system call (180 ns here, ``python -m timeit``)
# made on every client call, about ten per consume-transform-produce unit.
_forks = 0


def _count_fork() -> None:
    global _forks
    _forks += 1


os.register_at_fork(after_in_child=_count_fork)


def fork_count() -> int:
    """Forks between the process that first imported txnstream and this one."""
    return _forks


log = logging.getLogger(__name__)

#: Seconds between sweeps for transactions a crash left ongoing on a participant
#: its coordinator no longer knows (see ``Topic.sweep_orphans``).
ORPHAN_SWEEP_S = 5.0
#: Compacted topic of topic metadata: base topic name -> partitions (0: not partitioned).
TOPICS_REGISTRY = "__txnstream_topics"
#: Compacted topic: pending-ack log name -> the ``topic\nsubscription`` it belongs to.
PENDING_ACK_OWNERS = "__txnstream_pending_ack_owners"
#: Idempotent end is on through the broker: ends remembered per client name.
DEFAULT_PERSIST_COUNT = 1000


class Tiered:
    """A broker's tiered storage (SPEC §4.8): what :attr:`Broker.tiered` wires together."""

    def __init__(
        self,
        remote: RemoteStorage,
        metadata: RemoteLogMetadataManager,
        offloader: Offloader,
        metadata_ml: ManagedLedger,
    ) -> None:
        self.remote = remote
        self.metadata = metadata
        self.offloader = offloader
        self.metadata_ml = metadata_ml
        self._swept = False  # the temporaries of interrupted writes (once per open)

    @property
    def clean_up_pending(self) -> bool:
        """Tell whether uploads wait for their objects to be deleted (or the first sweep)."""
        return not self._swept or bool(self.metadata.unfinished())

    def clean_up(self, cancelled: Callable[[], bool] | None = None) -> int:
        """Run the pending clean-up of interrupted uploads; return how many it deleted.

        The maintenance round calls it every round: an upload whose deletes
        failed (here or before a crash) is retried until they succeed.
        """
        if not self.clean_up_pending:
            return 0
        n = self.offloader.clean_up(cancelled)
        if cancelled is None or not cancelled():
            self._swept = True
        return n

    def reader(self) -> TieredReader:
        """Return a new reader of local-or-remote topic data (its own caches)."""
        return TieredReader(self.remote, self.metadata)

    def read_committed(self, topic: Topic, start: Position | None = None) -> Iterator[ReadMessage]:
        """Yield ``topic``'s READ_COMMITTED messages from ``start``, remote and local.

        Bounded by the partition's transaction buffer (``max_read_position``
        and its aborted set, taken at the call), as a READ_COMMITTED consumer is.
        """
        if not isinstance(topic, Topic):
            raise InvalidArgumentError(
                f"topic must be a Topic (broker.topic(name)), not {type(topic).__name__}",
                argument="topic",
                value=repr(topic)[:80],
            )
        tb = topic.tb
        with tb.lock:  # one state of the buffer: its aborted set, limit and last readable entry
            aborted = set(tb.aborted)
            limit = tb.read_limit
            local_last = tb.max_read_position
        return self.reader().read_committed(
            topic.full,
            topic.ml,
            max_read_position=self._last_readable(topic, limit, local_last),
            aborted=aborted,
            start=start,
        )

    def _last_readable(
        self, topic: Topic, limit: Position | None, local_last: Position | None
    ) -> Position | None:
        """Return the last entry before the exclusive READ_COMMITTED ``limit``, local or remote.

        The transaction buffer finds it through the local ledgers only; when
        the limit is the first entry of a ledger and the ledgers before it
        were trimmed after offload, it is the end of the last remote segment.
        """
        if limit is None:
            return None
        if limit.entry_id > 0:
            return Position(limit.ledger_id, limit.entry_id - 1)
        found = local_last
        for s in self.metadata.segments(topic.full):
            end = Position(s.ledger_id, s.last_entry)
            if (
                s.entry_count > 0
                and s.ledger_id < limit.ledger_id
                and (found is None or end > found)
            ):
                found = end
        return found

    def stats(self) -> dict[str, Any]:
        """Remote calls and bytes by kind, and what the offloader did."""
        return {
            "location": self.remote.location,
            "calls": self.remote.calls(),
            "bytes_read": self.remote.bytes_read(),
            "offloader": dict(self.offloader.stats),
            "clean_up_pending": self.clean_up_pending,
        }


def _coordinator_config(cfg: BrokerConfig) -> CoordinatorConfig:
    """Return the coordinators' settings of a broker configuration (raises ConfigError)."""
    tc_config = CoordinatorConfig.from_broker_config(
        cfg,
        default_timeout_ms=cfg.transaction_timeout_ms,
        max_timeout_ms=cfg.max_transaction_timeout_ms,
        end_timeout_ms=cfg.end_timeout_ms,
        complete_in_background=True,
    )
    if not {"transactionMetaPersistCount", "TransactionMetaPersistCount"} & set(cfg.extra):
        tc_config = tc_config.replace(transaction_meta_persist_count=DEFAULT_PERSIST_COUNT)
    return tc_config


class Broker:
    """The embedded engine on one data directory. Build with :meth:`open`."""

    def __init__(
        self,
        path: str,
        config: BrokerConfig,
        *,
        clock: Clock,
        registry: CollectorRegistry | None,
        metrics_label: str | None,
    ) -> None:
        self.path = path
        self.config = config
        self._clock = clock
        self._registry = registry
        self._label = metrics_label
        self._lock = threading.Lock()
        self._closed = False
        self._ready = threading.Event()
        self._topics: dict[str, Topic] = {}
        self._opening: dict[str, Future[Topic]] = {}
        # Partitions being unloaded: a load waits for the unload to finish.
        self._unloading: dict[str, Future[None]] = {}
        # Partition -> live Producer/Consumer objects and using_topic holds on it.
        self._attached: dict[str, int] = {}
        #: Partitions unloaded while idle since open (metrics).
        self.topics_unloaded = 0
        # (partition, producer name) of every open producer.
        self._producer_names: set[tuple[str, str]] = set()
        self._forks = _forks
        # Open clients by id(): a closed one leaves, its commit counts go to _retired.
        self._clients: dict[int, Client] = {}
        self._dynamic_lock = threading.Lock()  # one dynamic switch at a time (set_dynamic)
        self._retired = CommitTally()
        self._writers: dict[str, BufferedWriter] = {}
        self._maintenance_timer: TimerHandle | None = None
        self._next_orphan_sweep = time.monotonic() + ORPHAN_SWEEP_S
        self._maintenance_pool = ThreadPoolExecutor(1, thread_name_prefix="txnstream-broker-maint")
        self._admin: Admin | None = None
        self._registry_topic: CompactedTopic | None = None
        self._owners_topic: CompactedTopic | None = None
        self._owners_lock = threading.Lock()
        self.timers = TimerService(clock, name="txnstream-broker-timer")
        self._scope = self.timers.scope()
        self.coordinators: TransactionCoordinators | None = None
        self._ledger_options = {
            "max_entries_per_ledger": config.max_entries_per_ledger,
            "max_bytes_per_ledger": config.max_size_per_ledger_mb << 20,
        }
        self.recovery: dict[str, Any] = {}
        #: Aborted-transaction indexes of topic ledgers, written as aborts happen.
        self.txn_indexes = TopicTxnIndexes(path)
        self._tiered: Tiered | None = None
        #: The last failure of tiered storage in the maintenance round (opening
        #: its metadata, the clean-up of interrupted uploads); None once a
        #: round got through. Local produce and consume never wait for it.
        self.tiered_error: Exception | None = None
        #: The directory held remote segment metadata at open (tiered storage was used).
        self._had_remote_metadata = False
        self._tiered_lock = threading.Lock()
        self.snapshot_writer = SnapshotWriter(self._open_snapshot_topic)
        # The broker holds the directory's writer lock: its own writer is the
        # only one, so readers refresh only after it wrote.
        self.snapshot_readers = SnapshotReaders(
            self._open_ledger_ro,
            self._scope,
            clock,
            generation=lambda: self.snapshot_writer.generation,
        )
        self._ns_readers: dict[str, SharedSnapshotReader] = {}
        # Snapshots answered to an open that then failed: the retry needs them
        # (the shared reader answers each partition once).
        self._unused_snapshots: dict[str, TransactionBufferSnapshot] = {}
        self._snapshots_lock = threading.Lock()  # one write_snapshots at a time
        self._topic_recovery: TopicRecovery | None = None

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        config: BrokerConfig | None = None,
        *,
        clock: Clock | None = None,
        registry: CollectorRegistry | None = REGISTRY,
        metrics_label: str | None = None,
    ) -> Broker:
        """Open (creating, recovering) the broker on data directory ``path``.

        ``config`` is a :class:`~txnstream.config.BrokerConfig` (defaults
        if None; ``BrokerConfig.load("broker.conf" or "*.toml")`` reads
        Pulsar-named settings). Metrics are exported to ``registry`` (None:
        not exported); ``metrics_label`` tells two brokers of one process
        apart in it. Every argument is checked before anything is created.
        """
        directory = directory_arg(path)
        if config is None:
            config = BrokerConfig()
        elif not isinstance(config, BrokerConfig):
            raise InvalidArgumentError(
                f"config must be a BrokerConfig or None, got {config!r}",
                argument="config",
                value=config,
            )
        config.validate()
        # Settings changed while the broker was closed (`txnstream admin ... batched-log`).
        config = apply_dynamic_config(directory, config)
        clk = clock_arg(clock)
        if registry is not None and not isinstance(registry, CollectorRegistry):
            raise InvalidArgumentError(
                f"registry must be a prometheus CollectorRegistry or None, got {registry!r}",
                argument="registry",
                value=registry,
            )
        if metrics_label is not None and (not isinstance(metrics_label, str) or not metrics_label):
            raise InvalidArgumentError(
                f"metrics_label must be a non-empty str or None, got {metrics_label!r}",
                argument="metrics_label",
                value=metrics_label,
            )
        _coordinator_config(config)  # its settings too, before anything is created
        make_dirs_durably(Path(directory))  # the storage finds it there: it syncs no parent
        broker = cls(directory, config, clock=clk, registry=registry, metrics_label=metrics_label)
        try:
            broker._start()
        except BaseException:
            broker._shutdown()
            raise
        return broker

    def _check_coordinator_count(self) -> None:
        """Refuse a coordinator count below the coordinator logs the directory holds.

        A coordinator left out would strand its transactions: a partition
        asking about one finds no coordinator and aborts it, even when its
        log says COMMITTED -- a torn transaction. As in Pulsar (the count is
        the coordinator topic's partitions), the count cannot be lowered.
        """
        present = log_ids(ManagedLedger.names(self.path))
        count = self.config.coordinators
        if present and max(present) >= count:
            raise ConfigError(
                f"transactionCoordinatorCount={count}, but {self.path} holds the log of "
                f"coordinator {max(present)} ({log_name(max(present))}): the count cannot be "
                f"lowered (its transactions would lose their coordinator); set it to at least "
                f"{max(present) + 1}",
                key="transactionCoordinatorCount",
                value=str(count),
            )

    def _start(self) -> None:
        started = time.monotonic()
        # The first ledger takes the directory's writer lock.
        self._registry_topic = CompactedTopic.open(
            self.path,
            TOPICS_REGISTRY,
            max_entries_per_ledger=self.config.max_entries_per_ledger,
            max_bytes_per_ledger=self.config.max_size_per_ledger_mb << 20,
        )
        cfg = self.config
        tc_config = _coordinator_config(cfg)
        self._check_coordinator_count()
        self._had_remote_metadata = METADATA_LEDGER in ManagedLedger.names(self.path)
        opened: list[TransactionCoordinator] = []
        try:
            for tc_id in range(cfg.coordinators):
                label = None if self._label is None else f"{self._label}/{tc_id}"
                opened.append(
                    TransactionCoordinator.open(
                        self.path,
                        tc_id,
                        config=tc_config,
                        participants=self,
                        clock=self._clock,
                        timers=self.timers,
                        log_options=dict(self._ledger_options),
                        registry=self._registry,
                        metrics_label=label,
                    )
                )
        except BaseException:
            for tc in opened:
                tc.close()
            raise
        self.coordinators = TransactionCoordinators(opened)
        self._ready.set()
        if self._registry is not None:
            register_broker(self, self._label or "broker", self._registry)
        self._schedule_maintenance()
        self.recovery = {
            "coordinators": [tc.recovery for tc in opened],
            "seconds": time.monotonic() - started,
        }
        if cfg.topic_recovery == "eager":
            # Partitions with a ledger: one never written to has nothing to
            # recover (and is not created here: it opens on first use).
            stored = set(ManagedLedger.names(self.path))
            names = [
                tn.full
                for base, _ in self.topic_names()
                for tn in self.partition_names(base)
                if tn.full in stored
            ]
            self._topic_recovery = TopicRecovery(names, self.topic, cfg.topic_recovery_threads)
            self._topic_recovery.start()

    def recovery_status(self) -> dict[str, Any]:
        """Progress of the eager recovery wave (``topicRecoveryMode=eager``), and totals.

        Keys: mode; total, recovered, failed, skipped, pending, errors
        (partition -> error), seconds, cancelled (eager only); loaded partitions; how
        they recovered (from a snapshot or a full replay; entries
        replayed); snapshot entries read by the shared readers.
        """
        out: dict[str, Any] = {"mode": self.config.topic_recovery}
        if self._topic_recovery is not None:
            out.update(self._topic_recovery.status())
        topics = self.loaded_topics()
        out["loaded"] = len(topics)
        out["from_snapshot"] = sum(t.recovery.get("from_snapshot", 0) for t in topics)
        out["entries_replayed"] = sum(t.recovery.get("entries", 0) for t in topics)
        with self._lock:
            readers = list(self._ns_readers.values())
        out["snapshot_entries_read"] = sum(r.stats().get("entries_read", 0) for r in readers)
        return out

    def wait_recovered(self, timeout_ms: int) -> bool:
        """Wait up to ``timeout_ms`` for the eager recovery wave; True once finished (or lazy)."""
        if timeout_ms_arg(timeout_ms) is None:
            raise InvalidArgumentError(
                "timeout_ms must be an int >= 0, got None", argument="timeout_ms", value=None
            )
        rec = self._topic_recovery
        return True if rec is None else rec.wait(timeout_ms)

    # ------------------------------------------------------------ clients

    def client(self, name: str | None = None) -> Client:
        """Return a client of this broker; ``name`` (generated if None) enables idempotent end."""
        from txnstream.client import Client

        self._check_open()
        c = Client(self, name)
        with self._lock:
            self._clients[id(c)] = c
        return c

    def forget_client(self, client: Client) -> None:
        """Drop a closed client; its commit counts stay in the broker's metrics."""
        with self._lock:  # metrics() never sees its counts both here and there
            if self._clients.pop(id(client), None) is not None:
                client._retire(self._retired)

    @property
    def admin(self) -> Admin:
        """The admin API of this live broker (:class:`txnstream.admin.Admin`)."""
        from txnstream.admin import Admin

        with self._lock:
            if self._admin is None:
                self._admin = Admin(self)
            return self._admin

    # ------------------------------------------------------------ topics

    def _check_open(self) -> None:
        if self._closed:
            raise AlreadyClosedError(f"the broker on {self.path} is closed", what="broker")
        self.check_process()

    def forked(self) -> bool:
        """Tell whether this is a child forked after the broker opened (see :meth:`close`)."""
        return _forks != self._forks

    def check_process(self) -> None:
        """Raise :class:`AlreadyClosedError` in a child forked after the broker opened.

        The child has none of the broker's threads: its handles fail fast
        (SPEC §4.1), and nothing waits for work the parent had in flight.
        """
        if self.forked():
            raise AlreadyClosedError(
                f"the broker on {self.path} was opened before fork(): open it again in this "
                "process",
                what="broker",
            )

    def claim_producer_name(self, partitions: list[TopicName], name: str) -> bool:
        """Reserve ``name`` on ``partitions`` for a new producer; False if an open one has it.

        A claimed name attaches the producer to ``partitions`` (they stay
        loaded) until :meth:`release_producer_name`.
        """
        keys = [(tn.full, name) for tn in partitions]
        with self._lock:
            if any(k in self._producer_names for k in keys):
                return False
            self._producer_names.update(keys)
            self._attach_locked(partitions)
        return True

    def release_producer_name(self, partitions: list[TopicName], name: str) -> None:
        """Free ``name`` on ``partitions`` (its producer closed); detaches the producer."""
        keys = [(tn.full, name) for tn in partitions]
        with self._lock:
            if not all(k in self._producer_names for k in keys):
                return  # released before: detached then
            self._producer_names.difference_update(keys)
            self._detach_locked(partitions)

    def attach(self, partitions: list[TopicName]) -> None:
        """Count a client object on ``partitions``: they are not unloaded until :meth:`detach`.

        Call before looking the partitions up: a lookup after it never gets a
        partition an unload closes. Pair every call with one :meth:`detach`.
        """
        with self._lock:
            self._attach_locked(partitions)

    def detach(self, partitions: list[TopicName]) -> None:
        """Uncount what :meth:`attach` counted; a partition's idle time starts at the last one."""
        with self._lock:
            self._detach_locked(partitions)

    def _attach_locked(self, partitions: list[TopicName]) -> None:
        attached = self._attached
        for tn in partitions:
            attached[tn.full] = attached.get(tn.full, 0) + 1

    def _detach_locked(self, partitions: list[TopicName]) -> None:
        attached = self._attached
        for tn in partitions:
            n = attached.get(tn.full, 0) - 1
            if n > 0:
                attached[tn.full] = n
                continue
            attached.pop(tn.full, None)  # the map holds partitions in use only
            t = self._topics.get(tn.full)
            if t is not None:
                t.used = True  # idle from the next maintenance round

    @contextlib.contextmanager
    def using_topic(self, name: str | TopicName) -> Iterator[Topic]:
        """Hold partition ``name`` loaded (never unloaded) for the ``with`` block; yield it."""
        tn = name if isinstance(name, TopicName) else TopicName.parse(name)
        self.attach([tn])
        try:
            yield self.topic(tn)
        finally:
            self.detach([tn])

    @property
    def _topics_registry(self) -> CompactedTopic:
        reg = self._registry_topic
        if reg is None:
            raise AlreadyClosedError(f"the broker on {self.path} is closed", what="broker")
        return reg

    def partitions(self, name: str | TopicName, *, create: bool = True) -> int:
        """Partitions of topic ``name`` (0: not partitioned), creating it if allowed."""
        topic = name if isinstance(name, TopicName) else TopicName.parse(name)
        base = topic.base
        if topic.is_partition:
            self._check_partition(topic)
            return 0
        value = self._topics_registry.get(base.full)
        if value is not None:
            return int(value)
        if not create or not self.config.allow_auto_topic_creation:
            how = (
                "allowAutoTopicCreation=false: create it with broker.admin.create_topic first"
                if create
                else "create it with broker.admin.create_topic"
            )
            raise InvalidTopicNameError(
                f"topic {base.full} does not exist ({how})",
                argument="topic",
                value=str(name),
            )
        n = (
            self.config.default_num_partitions
            if self.config.auto_topic_creation_type == "partitioned"
            else 0
        )
        return self.create_topic(base, n, exist_ok=True)

    def _check_partition(self, topic: TopicName) -> None:
        """Refuse a partition name unless its topic exists with that many partitions.

        Partitions are never created on their own: a name ``t-partition-N``
        needs topic ``t`` created partitioned with more than ``N`` partitions
        (else what is written there is read by no consumer of ``t``).
        """
        value = self._topics_registry.get(topic.base.full)
        n = None if value is None else int(value)
        if n is not None and topic.partition < n:
            return
        if topic.full in ManagedLedger.names(self.path):
            return  # written before this check existed: it stays usable
        why = (
            "does not exist"
            if n is None
            else "is not partitioned"
            if n == 0
            else f"has {n} partition(s)"
        )
        raise InvalidTopicNameError(
            f"{topic.full} names no partition: topic {topic.base.full} {why}",
            argument="topic",
            value=topic.full,
        )

    def create_topic(
        self, name: str | TopicName, partitions: int = 0, *, exist_ok: bool = False
    ) -> int:
        """Create topic ``name`` with ``partitions`` partitions (0: not partitioned).

        Returns its partition count. An existing topic raises
        :class:`InvalidTopicNameError` unless ``exist_ok`` (then its count
        is returned, whatever ``partitions`` says).
        """
        self._check_open()
        topic = name if isinstance(name, TopicName) else TopicName.parse(name)
        if topic.is_partition:
            raise InvalidTopicNameError(
                f"{topic.full} names a partition; create the topic {topic.base.full}",
                argument="topic",
                value=str(name),
            )
        if isinstance(partitions, bool) or not isinstance(partitions, int):
            raise InvalidArgumentError(
                f"partitions must be an int, got {partitions!r}",
                argument="partitions",
                value=partitions,
            )
        if not 0 <= partitions <= MAX_PARTITIONS:
            raise InvalidArgumentError(
                f"partitions must be in 0..{MAX_PARTITIONS}, got {partitions}",
                argument="partitions",
                value=partitions,
            )
        reg = self._topics_registry
        with self._lock:
            existing = reg.get(topic.full)
            if existing is not None:
                if exist_ok:
                    return int(existing)
                raise InvalidTopicNameError(
                    f"topic {topic.full} already exists with {int(existing)} partition(s)",
                    argument="topic",
                    value=str(name),
                )
            if not topic.storable_with(partitions):
                raise InvalidTopicNameError(
                    f"topic name {topic.full} is too long to store with {partitions} "
                    "partitions (its partitions' log names would exceed the limit)",
                    argument="topic",
                    value=str(name),
                )
            reg.put(topic.full, str(partitions).encode())
        return partitions

    def topic_names(self) -> list[tuple[str, int]]:
        """Every topic created in this data directory with its partition count."""
        return [(k, int(v)) for k, v in self._topics_registry.items()]

    def partition_names(self, name: str | TopicName) -> list[TopicName]:
        """Return the partitions of ``name`` (itself when not partitioned)."""
        topic = name if isinstance(name, TopicName) else TopicName.parse(name)
        if topic.is_partition:
            self._check_partition(topic)
            return [topic]
        n = self.partitions(topic)
        return [topic] if n == 0 else [topic.partition_name(i) for i in range(n)]

    def topic(self, name: str | TopicName) -> Topic:
        """Return partition (or unpartitioned topic) ``name``, opened and recovered on first use.

        Once idle for ``topic_idle_unload_ms`` (nothing attached, nothing in
        flight) the partition unloads and the object returned here is closed;
        the next call loads it again. To keep using one object, hold it with
        :meth:`using_topic` (or an open Producer/Consumer on it).
        """
        self._check_open()
        tn = name if isinstance(name, TopicName) else TopicName.parse(name)
        t = self._topics.get(tn.full)  # loaded: the common case, one dict lookup
        if t is not None:
            t.used = True
            return t
        if not tn.is_partition and self.partitions(tn) > 0:
            raise InvalidTopicNameError(
                f"topic {tn.full} is partitioned; name one of its partitions "
                f"({tn.partition_name(0).full}, ...)",
                argument="topic",
                value=str(name),
            )
        full = tn.full
        with self._lock:
            t = self._topics.get(full)
            if t is not None:
                return t
        if tn.is_partition:
            self._check_partition(tn)  # before anything is opened for it
        while True:
            with self._lock:
                t = self._topics.get(full)
                if t is not None:
                    t.used = True
                    return t
                unloading = self._unloading.get(full)
                if unloading is None:
                    opening = self._opening.get(full)
                    owner = opening is None
                    if opening is None:
                        opening = self._opening[full] = Future()
                    break
            # Being unloaded: load it again once its logs are closed.
            await_opening(unloading, self.config.end_timeout_ms, f"topic {full} (unloading)")
        if not owner:
            return await_opening(opening, self.config.end_timeout_ms, f"topic {full}")
        try:
            t = self._open_topic(tn)
        except BaseException as exc:
            with self._lock:
                del self._opening[full]
            opening.set_exception(exc)
            raise
        with self._lock:
            self._topics[full] = t
            del self._opening[full]
            closed = self._closed
        opening.set_result(t)
        if closed:
            t.close()
            self._check_open()
        return t

    def _snapshot_of(self, tn: TopicName) -> TransactionBufferSnapshot | None:
        """``tn``'s newest snapshot, through its namespace's shared reader (None: none)."""
        ns = tn.namespace_name
        with self._lock:
            kept = self._unused_snapshots.pop(tn.full, None)
            if kept is not None:
                return kept
            reader = self._ns_readers.get(ns)
            if reader is None:
                # Held until close: partitions opened later share what it read
                # (its handle closes itself after the idle timeout).
                reader = self._ns_readers[ns] = self.snapshot_readers.acquire(ns)
        try:
            return reader.read(tn.full)
        except AlreadyClosedError:
            raise
        except TxnStreamError as e:  # a damaged snapshot topic: replay the ledger instead
            log.warning("%s: snapshot unreadable (%s); replaying the whole ledger", tn.full, e)
            return None

    def _open_topic(self, tn: TopicName) -> Topic:
        snapshot = self._snapshot_of(tn)
        try:
            ml = self.open_ledger(tn.full)
        except BaseException:
            self._keep_unused(tn, snapshot)
            raise
        try:
            t = Topic(tn, ml, self)
            t.recover(snapshot, cancelled=lambda: self._closed)
            if self.offload_policy_on():
                # Trimming waits for offload from the start (no ledger is lost
                # between the topic's load and its first offload). Only the
                # hold: local produce and consume never wait for the remote
                # store or its metadata (the maintenance round moves it on).
                install_hold(ml)
            elif HOLD_CURSOR in ml.cursor_names() or LEGACY_HOLD_CURSOR in ml.cursor_names():
                # Kept: dropping it here would let a broker opened without the
                # policy (a one-off admin run) trim ledgers never offloaded.
                log.info(
                    "%s keeps its ledgers until offloaded and no offload policy is set: "
                    "admin.offload(topic) lets trimming go on",
                    tn.full,
                )
        except BaseException:
            ml.close()
            self._keep_unused(tn, snapshot)
            raise
        return t

    def _keep_unused(self, tn: TopicName, snapshot: TransactionBufferSnapshot | None) -> None:
        if snapshot is not None:
            with self._lock:
                self._unused_snapshots[tn.full] = snapshot

    def loaded_topics(self) -> list[Topic]:
        """Partitions open in this process."""
        with self._lock:
            return list(self._topics.values())

    # ------------------------------------------------------------ TopicContext

    @property
    def outcomes(self) -> TxnOutcomes:
        """The coordinators, as participants see them."""
        return self

    def wall_ms(self) -> int:
        """Wall-clock milliseconds of the broker's clock."""
        return self._clock.wall_ms()

    def _open_ledger_ro(self, name: str) -> ManagedLedger:
        return ManagedLedger.open(self.path, name, read_only=True)

    def _open_snapshot_topic(self, name: str) -> CompactedTopic:
        return CompactedTopic.open(
            self.path,
            name,
            write_only=True,
            max_entries_per_ledger=self.config.max_entries_per_ledger,
            max_bytes_per_ledger=self.config.max_size_per_ledger_mb << 20,
        )

    def write_snapshots(self, *, due_only: bool = True) -> int:
        """Write the snapshots of loaded partitions (those due, or every changed one).

        Returns how many were written. Runs on the maintenance thread, and on
        close; a failed write is logged and retried at the next round.
        """
        with self._snapshots_lock:
            return self._write_snapshots(due_only)

    def _write_snapshots(self, due_only: bool) -> int:
        cfg = self.config
        now = self.wall_ms()
        taken: list[tuple[Topic, bytes, int, Position | None]] = []
        for t in self.loaded_topics():
            if t.tb.changes <= 0:
                continue
            if due_only and not t.snapshot_due(
                now, cfg.tb_snapshot_max_changes, cfg.tb_snapshot_min_time_ms
            ):
                continue
            taken.append((t, *t.take_snapshot()))
        self._write_taken(taken, now)
        return len(taken)

    def _write_taken(
        self, taken: list[tuple[Topic, bytes, int, Position | None]], now: int
    ) -> None:
        # Under _snapshots_lock: write snapshots taken at ``now`` (one write),
        # then tell each partition what became durable.
        if not taken:
            return
        self.snapshot_writer.write([(t.name.namespace_name, t.full, v) for t, v, _, _ in taken])
        for t, _, changes, covered in taken:
            t.tb.snapshot_written(changes, now)
            t.snapshot_durable(covered)

    def open_ledger(self, name: str) -> ManagedLedger:
        """Open (creating) managed ledger ``name`` in the data directory."""
        return ManagedLedger.open(
            self.path,
            name,
            max_entries_per_ledger=self.config.max_entries_per_ledger,
            max_bytes_per_ledger=self.config.max_size_per_ledger_mb << 20,
        )

    def record_abort(
        self,
        partition: str,
        txn: tuple[int, int],
        first: Position,
        last: Position,
        last_stable: Position,
    ) -> None:
        """Record an aborted transaction in ``partition``'s aborted-txn index."""
        self.txn_indexes.append(partition, txn, first, last, last_stable)

    @property
    def tiered(self) -> Tiered:
        """Tiered storage of this broker (opened on first use: remote store and metadata).

        Opening makes no remote call; a metadata record that does not decode
        raises :class:`CorruptEntryError` here (at every use, until repaired).
        The clean-up of uploads a crash interrupted runs in the maintenance
        round, retried until the remote store lets it
        (:attr:`Tiered.clean_up_pending`).
        """
        self._check_open()
        with self._tiered_lock:
            if self._tiered is None:
                location = self.config.tiered_storage_location or os.path.join(self.path, "remote")
                remote = RemoteStorage(location)
                log_ml = self.open_ledger(METADATA_LEDGER)
                try:
                    metadata = RemoteLogMetadataManager(log_ml, remote)
                    offloader = Offloader(remote, metadata, self.txn_indexes)
                except BaseException:
                    log_ml.close()
                    raise
                self._tiered = Tiered(remote, metadata, offloader, log_ml)
                if self._registry is not None:
                    # Brokers sharing the registry: one family, a label each.
                    try:
                        register_remote_store(remote, self._label or "broker", self._registry)
                    except ValueError as e:  # the names are taken by a collector of the user's
                        log.warning("remote-store calls not exported (in admin stats): %s", e)
            return self._tiered

    def offload_policy_on(self) -> bool:
        """Return True when an offload policy (size or age threshold) is configured."""
        cfg = self.config
        return cfg.offload_threshold_bytes >= 0 or cfg.offload_threshold_ms >= 0

    def _offload_by_policy(self) -> None:
        """Offload what the policy selects, topic by topic (one topic's failure is logged).

        Policy or not, a loaded topic with remote segments keeps its ledgers
        after them until they are offloaded (the hold is put back on a topic
        offloaded by a version that did not keep it). Then delete the local
        aborted-transaction indexes of trimmed ledgers (an index is written
        whenever a transaction aborts).
        """
        if self.offload_policy_on() or self._tiered_in_use():
            self._offload_loaded()
        firsts: dict[str, int] = {}
        for t in self.loaded_topics():
            first = t.ml.first_position
            if first is not None:
                firsts[t.full] = first.ledger_id
        try:
            self.txn_indexes.prune_many(firsts)
        except Exception:
            if not self._closed:
                log.exception("pruning aborted-transaction indexes")

    def _tiered_in_use(self) -> bool:
        """Tell whether tiered storage is in use (here, or by an earlier run of the directory)."""
        return self._tiered is not None or self._had_remote_metadata

    def _offload_loaded(self) -> None:
        # A failure of tiered storage is recorded and logged: trimming and
        # snapshots (the rest of the round) go on all the same.
        cfg = self.config
        policy = self.offload_policy_on()
        try:
            tiered = self.tiered
        except AlreadyClosedError:
            return
        except Exception as exc:
            self._tiered_failed("opening tiered storage", exc)
            return
        failed = False
        try:
            tiered.clean_up(cancelled=lambda: self._closed)
        except Exception as exc:  # retried next round; new uploads use new names
            failed = True
            self._tiered_failed("cleaning up interrupted uploads", exc)
        for t in self.loaded_topics():
            if self._closed:  # close waits for the upload in progress only
                return
            try:
                if policy:
                    tiered.offloader.offload_by_policy(
                        t.ml,
                        threshold_bytes=None
                        if cfg.offload_threshold_bytes < 0
                        else cfg.offload_threshold_bytes,
                        min_age_ms=None
                        if cfg.offload_threshold_ms < 0
                        else cfg.offload_threshold_ms,
                        cancelled=lambda: self._closed,
                    )
                if policy or tiered.metadata.offloaded_ledgers(t.full):
                    tiered.offloader.hold_trimming(t.ml)
            except Exception:
                if self._closed:
                    return
                log.exception("offload of %s", t.full)
        if not failed:
            self.tiered_error = None

    def _tiered_failed(self, what: str, exc: Exception) -> None:
        if self._closed:
            return
        self.tiered_error = exc
        log.warning("tiered storage: %s failed (retried next round): %s", what, exc)

    def claim_pending_ack_log(self, log_name: str, topic: str, subscription: str) -> None:
        """Check that pending-ack log ``log_name`` is ``subscription`` on ``topic``'s.

        The log's name is Pulsar's, ``<topic>-<subscription>__transaction_pending_ack``,
        which is the same for topic ``a`` with subscription ``b-c`` and topic
        ``a-b`` with subscription ``c``. The first pair to use it owns it
        (recorded durably before the log is opened; a log from before this
        record goes to the first pair that opens it); the other pair is
        refused with :class:`InvalidArgumentError` naming both, instead of
        being handed the first pair's acks (which it applied to its own
        cursor after a restart, then trimmed away from the owner).
        """
        owner = f"{topic}\n{subscription}".encode()
        with self._owners_lock:
            self.check_process()
            owners = self._owners_topic
            if owners is None:
                if self._closed:
                    raise AlreadyClosedError(f"the broker on {self.path} is closed", what="broker")
                owners = self._owners_topic = CompactedTopic.open(
                    self.path,
                    PENDING_ACK_OWNERS,
                    max_entries_per_ledger=self.config.max_entries_per_ledger,
                    max_bytes_per_ledger=self.config.max_size_per_ledger_mb << 20,
                )
            held = owners.get(log_name)
            if held is None:
                owners.put(log_name, owner)
                return
        if held != owner:
            other_topic, _, other_sub = held.decode("utf-8", "replace").partition("\n")
            raise InvalidArgumentError(
                f"subscription {subscription!r} on {topic} cannot be used: its pending-ack "
                f"log {log_name} is the log of subscription {other_sub!r} on {other_topic} "
                "(Pulsar names both the same); choose another subscription name",
                argument="subscription",
                value=subscription,
            )

    def pending_ack_writer(self, ml: ManagedLedger, name: str) -> BufferedWriter:
        """Return a BufferedWriter for pending-ack log ``ml`` (pending-ack store metrics)."""
        writer = BufferedWriter(ml, **self.config.pending_ack_batched_write.writer_kwargs())
        if self._registry is not None:
            label = name if self._label is None else f"{name}@{self._label}"
            register_writer(writer, "pending_ack", name=label, registry=self._registry)
        with self._lock:
            self._writers[name] = writer
        return writer

    def release_writer(self, name: str, writer: BufferedWriter) -> None:
        """Stop exporting a pending-ack writer."""
        with self._lock:
            self._writers.pop(name, None)
        if self._registry is not None:
            label = name if self._label is None else f"{name}@{self._label}"
            unregister_writer(label, "pending_ack", self._registry, writer)

    def pending_ack_writers(self) -> list[BufferedWriter]:
        """Every open pending-ack log writer."""
        with self._lock:
            return list(self._writers.values())

    def set_pending_ack_batch_enabled(self, enabled: bool) -> None:
        """Switch batched writes of every pending-ack log on or off.

        Now, for new logs, and after a restart (persisted: :meth:`set_dynamic`).
        """

        def switch(on: bool) -> None:
            for w in self.pending_ack_writers():
                w.set_batch_enabled(on)

        self.set_dynamic("transactionPendingAckBatchedWriteEnabled", enabled, switch)

    def set_dynamic(self, key: str, enabled: bool, apply: Callable[[bool], None]) -> None:
        """Check, persist and take one dynamic batch switch (Pulsar's dynamic configuration).

        Refused on a closed broker (its directory may be another process's
        by now). Checked as at open (a batch limit the writers refuse is a
        :class:`ConfigError`, nothing changed), then written durably to the
        directory's ``dynamic-config.toml`` -- so the next open and the
        CLI's file views see it, as Pulsar persists dynamic settings --
        then applied to :attr:`config` and, by ``apply(enabled)``, to the
        writers. One switch at a time: the file's read-merge-write and the
        writers' state never interleave with another switch's.
        """
        if not isinstance(enabled, bool):
            raise InvalidArgumentError(
                f"enabled must be a bool, got {enabled!r}", argument="enabled", value=enabled
            )
        with self._dynamic_lock:
            self._check_open()
            dataclasses.replace(self.config).set(key, enabled)  # check on a copy first
            write_dynamic_config(self.path, {key: enabled})
            self.config.set(key, enabled)
            apply(enabled)

    # ------------------------------------------------------------ TxnOutcomes

    def _coordinators(self) -> TransactionCoordinators:
        # is_set() first: Event.wait takes a Python-level Condition even when set.
        ready = self._ready
        if not ready.is_set() and not ready.wait(self.config.end_timeout_ms / 1000.0):
            raise CoordinatorNotFound("the broker's coordinators are still opening")
        tcs = self.coordinators
        if tcs is None:
            raise AlreadyClosedError(f"the broker on {self.path} is closed", what="broker")
        return tcs

    def low_water_mark(self, tc_id: int) -> int:
        """Coordinator ``tc_id``'s low water mark."""
        return self._coordinators().get(tc_id).low_water_mark()

    def participant_outcome(self, txn_id: TxnID) -> bool | None:
        """How a participant must end ``txn_id`` (see the coordinator)."""
        return self._coordinators().participant_outcome(txn_id)

    # ------------------------------------------------------------ ParticipantResolver

    def partition(self, name: str) -> Participant:
        """Return the transaction buffer of partition ``name`` (for coordinators' ends).

        An unload may close it once idle: then no transaction is open there
        and its ``end`` answers without writing (nothing to end).
        """
        self._coordinators()
        with self.using_topic(name) as t:
            return cast(Participant, t.tb)

    def subscription(self, topic: str, subscription: str) -> Participant:
        """Return the pending-ack store of ``subscription`` on partition ``topic``.

        Opened with the partition held loaded (see :meth:`partition`).
        """
        self._coordinators()
        with self.using_topic(topic) as t:
            return cast(Participant, t.pending_ack(subscription))

    # ------------------------------------------------------------ maintenance

    def _schedule_maintenance(self) -> None:
        if self._closed:
            return
        due = self._clock.monotonic_ms() + self.config.pending_ack_trim_interval_ms
        with contextlib.suppress(RuntimeError):  # the timer is closed: closing
            self._maintenance_timer = self._scope.schedule(due, self._maintenance_due)

    def _maintenance_due(self) -> None:
        with contextlib.suppress(RuntimeError):  # the pool is shut down: closing
            self._maintenance_pool.submit(self._maintain)

    def _maintain(self) -> None:
        try:
            self.maintain_now()
        except Exception:
            if not self._closed:
                log.exception("broker maintenance")
        finally:
            self._schedule_maintenance()

    def maintain_now(self) -> None:
        """Run maintenance now, here (the maintenance thread runs it every round).

        Offload by policy, pending-ack trimming, due snapshots, every
        :data:`ORPHAN_SWEEP_S` the sweep for orphaned transactions
        (``Topic.sweep_orphans``), then the unload of idle partitions
        (:meth:`unload_idle`).
        """
        self._offload_by_policy()  # before trimming: trimming follows offload
        for t in self.loaded_topics():
            t.trim()
        self.write_snapshots()
        now = time.monotonic()
        if now >= self._next_orphan_sweep:
            self._next_orphan_sweep = now + ORPHAN_SWEEP_S
            for t in self.loaded_topics():
                try:
                    t.sweep_orphans()
                except Exception:  # one topic's failure must not stop the others' sweeps
                    if not self._closed:
                        log.exception("%s: sweeping orphaned transactions", t.full)
        self.unload_idle()

    def unload_idle(self) -> int:
        """Unload the partitions idle for ``topic_idle_unload_ms``; return how many.

        A partition is idle from the first round that finds nothing attached
        (:meth:`attach`), nothing in flight (``Topic.begin_unload``) and no
        lookup since the round before. One partition's failure is logged and
        leaves it loaded.
        """
        idle_ms = self.config.topic_idle_unload_ms
        if idle_ms <= 0 or self._closed:
            return 0
        now = self._clock.monotonic_ms()
        due = []
        with self._lock:
            attached = self._attached
            for t in self._topics.values():
                if t.used or t.full in attached:
                    t.used = False
                    t.idle_since_ms = now
                elif now - t.idle_since_ms >= idle_ms:
                    due.append(t)
        n = 0
        for t in due:
            if self._closed:
                break
            try:
                n += self._unload(t)
            except Exception:
                if not self._closed:
                    log.exception("unloading idle topic %s", t.full)
        return n

    def _unload(self, t: Topic) -> bool:
        """Unload ``t`` if it is still idle: snapshot, close, forget; True if it went."""
        full = t.full
        with self._lock:
            if self._closed or self._topics.get(full) is not t or full in self._attached:
                return False
            if t.used:  # looked up since the round began: in use again
                return False
            del self._topics[full]  # from here a lookup waits for the unload below
            done: Future[None] = Future()
            self._unloading[full] = done
        unloaded = False
        try:
            busy = self._keeps_loaded(t) or t.begin_unload()
            if busy is not None:
                log.debug("%s stays loaded: %s", full, busy)
                return False
            try:
                self._write_last_snapshot(t)
            except BaseException:
                t.cancel_unload()
                raise
            unloaded = True
            try:
                t.close()
            finally:
                self.txn_indexes.forget(full)
        finally:
            with self._lock:
                if not unloaded:
                    self._topics[full] = t
                    t.idle_since_ms = self._clock.monotonic_ms()  # tried again an idle time on
                else:
                    self.topics_unloaded += 1
                del self._unloading[full]
                closing = self._closed
            done.set_result(None)
            if closing and not unloaded:  # close() did not see it: closed here
                t.close()
        log.debug("unloaded idle topic %s", full)
        return True

    def _keeps_loaded(self, t: Topic) -> str | None:
        """Say why ``t`` must stay loaded though idle (None: it may unload).

        The offload policy runs on loaded partitions only (the maintenance
        round): under a policy, one with closed ledgers not uploaded yet
        stays loaded until they are, or they would stay local for good.
        """
        if not self.offload_policy_on():
            return None
        sealed = [lid for lid, n, _ in t.ml.ledgers()[:-1] if n > 0]
        if not sealed:
            return None
        try:
            done = self.tiered.metadata.offloaded_ledgers(t.full)
        except Exception:  # tiered storage unavailable: the round offloads nothing now
            return "tiered storage unavailable"
        if any(lid not in done for lid in sealed):
            return "closed ledgers waiting for the offload policy"
        return None

    def _write_last_snapshot(self, t: Topic) -> None:
        # The snapshot the next load recovers from (always: the namespace's
        # shared reader answered this partition once and dropped its later
        # records; reopened, it keeps the one written now).
        with self._lock:
            reader = self._ns_readers.get(t.name.namespace_name)
        if reader is not None:
            reader.reopen(t.full)
        with self._snapshots_lock:
            self._write_taken([(t, *t.take_snapshot())], self.wall_ms())

    # ------------------------------------------------------------ metrics

    def metrics(self) -> dict[str, Any]:
        """Return a scrape-time snapshot: per partition lag and buffer, per subscription acks."""
        topics = []
        for t in self.loaded_topics():
            tb = t.tb
            with tb.lock:
                ongoing, aborted = len(tb.ongoing), len(tb.aborted)
            subs = []
            for name, sub in t.subscriptions().items():
                st = sub.pending.stats()
                subs.append((name, st["transactions"], st["held_entries"], sub.backlog()))
            topics.append((t.full, tb.lag(), ongoing, aborted, subs))
        total = CommitTally()
        with self._lock:  # open clients and the closed ones' tally, at one moment
            for c in self._clients.values():
                total.add_snapshot(c.commit_stats())
            total.merge(self._retired)
        return {
            "topics": topics,
            "loaded_topics": len(topics),
            "topics_unloaded": self.topics_unloaded,
            **total.snapshot(),
        }

    # ------------------------------------------------------------ close

    def iter_clients(self) -> Iterator[Client]:
        """Return the open clients made by :meth:`client`."""
        with self._lock:
            return iter(list(self._clients.values()))

    def close(self) -> None:
        """Close clients, coordinators (ends in flight finish), topics and logs, then timers.

        In a child forked after the broker opened it only marks the broker
        closed: the handles are the parent's (its threads are not here, a
        lock one of them held stays held), and writing with them would put
        the child's stale state into the parent's directory.
        """
        if self.forked():
            self._closed = True
            return
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._shutdown()

    def _shutdown(self) -> None:
        self._closed = True
        if self._topic_recovery is not None:
            # Recovery in progress stops: reads between chunks, the rest skipped
            # (marked first, so a read the closing readers fail counts as skipped).
            self._topic_recovery.stopping()
            self.snapshot_readers.close()
            self._topic_recovery.cancel(self.config.end_timeout_ms)
        for c in list(self.iter_clients()):
            try:
                c.close()
            except Exception:
                log.exception("closing a client")
        if self._maintenance_timer is not None:
            self._scope.cancel(self._maintenance_timer)
        self._scope.close()
        self._maintenance_pool.shutdown(wait=True, cancel_futures=True)
        if self.coordinators is not None:
            try:
                self.coordinators.close()
            except Exception:
                log.exception("closing coordinators")
        self.coordinators = None
        # Topics being opened finish (they see the broker closed and close
        # themselves); bounded by the end timeout.
        deadline = time.monotonic() + self.config.end_timeout_ms / 1000.0
        while time.monotonic() < deadline:
            with self._lock:
                opening: list[Future[Any]] = [*self._opening.values(), *self._unloading.values()]
            if not opening:
                break
            for f in opening:
                with contextlib.suppress(Exception):
                    f.result(timeout=max(0.0, deadline - time.monotonic()))
        try:
            self.write_snapshots(due_only=False)  # clean close: recovery replays nothing
        except Exception:
            log.exception("writing transaction-buffer snapshots on close")
        self.snapshot_readers.close()
        self.snapshot_writer.close()
        for t in self.loaded_topics():
            try:
                t.close()
            except Exception:
                log.exception("closing topic %s", t.full)
        with self._lock:
            self._topics.clear()
        if self._registry is not None:
            unregister_broker(self._label or "broker", self, self._registry)
        # The last logs: their failure (e.g. the storage stopped) is raised,
        # after the timers are closed all the same.
        failure: BaseException | None = None
        tiered, self._tiered = self._tiered, None
        if tiered is not None:
            if self._registry is not None:
                unregister_remote_store(self._label or "broker", tiered.remote, self._registry)
            try:
                tiered.metadata_ml.close()
            except Exception as exc:
                failure = exc
        with self._owners_lock:
            owners, self._owners_topic = self._owners_topic, None
        for reg in (owners, self._registry_topic):
            if reg is not None:
                try:
                    reg.close()
                except Exception as exc:
                    failure = failure or exc
        self._registry_topic = None
        self.timers.close()
        if failure is not None:
            raise failure

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._topics)} topics loaded"
        return f"Broker({self.path!r}, {state})"


__all__ = ["DEFAULT_PERSIST_COUNT", "TOPICS_REGISTRY", "Broker"]
