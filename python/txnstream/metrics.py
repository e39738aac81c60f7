"""Prometheus export of BufferedWriter metrics (SPEC §4.2, PIP-160).

Writers keep their counters and histogram buckets in Rust atomics; nothing
runs in Python per flush. At scrape time a custom collector reads one
snapshot per registered writer (``writer.stats()``) and emits::

    <prefix>_bufferedwriter_batch_records                    histogram {10,50,100,200,500,1000}
    <prefix>_bufferedwriter_batch_size_bytes                 histogram {128,…,1232896}
    <prefix>_bufferedwriter_batch_oldest_record_delay_seconds histogram {0.001,0.005,0.01}
    <prefix>_bufferedwriter_flush_trigger_max_records        counter
    <prefix>_bufferedwriter_flush_trigger_max_size           counter
    <prefix>_bufferedwriter_flush_trigger_max_delay          counter
    <prefix>_bufferedwriter_flush_trigger_large_data         counter

with ``<prefix>`` = ``txnstream_txn_tc`` for transaction logs and
``txnstream_txn_pending_ack_store`` for pending-ack logs, and a ``writer``
label naming each writer. (prometheus-client exposes counter samples with
the conventional ``_total`` suffix.)

Transaction coordinators (SPEC §4.10) are exported the same way: their
counters live in the coordinator and are read at scrape time by
:class:`CoordinatorCollector`, label ``coordinator`` = the TC id::

    txnstream_txn_tc_active_count          gauge   live transactions (open or ending)
    txnstream_txn_tc_open_count            gauge   transactions OPEN
    txnstream_txn_tc_created               counter transactions started
    txnstream_txn_tc_committed             counter transactions committed
    txnstream_txn_tc_aborted               counter transactions aborted (timed out included)
    txnstream_txn_tc_timed_out             counter transactions aborted by their timeout
    txnstream_txn_tc_append_log_errors     counter failed transaction-log writes
    txnstream_txn_tc_end_latency_seconds   histogram from the end decision (ending
                                           UPDATE) to the final record
    txnstream_txn_tc_late_count            gauge   live transactions past their timeout
                                           (not yet aborted, or stuck ending)

A broker (:class:`BrokerCollector`, label ``broker``; topics and
subscriptions as labels) adds, for every partition loaded in the process::

    txnstream_topic_read_committed_lag                 gauge   entries from max_read_position
                                                               to the end of the partition
    txnstream_txn_buffer_ongoing_count                 gauge   ongoing transactions
    txnstream_txn_buffer_aborted_count                 gauge   aborted transactions remembered
    txnstream_txn_pending_ack_store_transactions_count gauge   transactions holding acks
    txnstream_txn_pending_ack_store_held_entries       gauge   entries held by them
    txnstream_subscription_backlog                     gauge   entries after the mark-delete

and for its clients' commits::

    txnstream_client_commits / _aborts                 counter transactions ended by clients
    txnstream_client_commit_durable_waits              histogram sequential durable waits per
                                                               commit {0,1,2,3,4}
    txnstream_client_commit_latency_seconds            histogram time in commit()

and, once its tiered storage is in use, its remote store's calls and bytes
fetched (:class:`RemoteStoresCollector`; labels ``broker``, ``remote`` = the
location, ``kind``)::

    txnstream_tiered_remote_calls                      counter remote calls by kind
    txnstream_tiered_remote_read_bytes                 counter bytes fetched by kind

Each of these collectors is registered once per registry and exports every
broker (coordinator, writer) under its label: two collectors of the same
family names in one registry would make the exposition repeat a family,
which Prometheus rejects.
"""

from __future__ import annotations

import bisect
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, Literal, Protocol, TypeVar

from prometheus_client.core import (
    REGISTRY,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

__all__ = [
    "COMMIT_LATENCY_BOUNDS_MS",
    "COMMIT_WAIT_BOUNDS",
    "END_LATENCY_BOUNDS_MS",
    "PENDING_ACK_PREFIX",
    "TC_PREFIX",
    "BrokerCollector",
    "BufferedWriterCollector",
    "CoordinatorCollector",
    "CoordinatorSource",
    "RemoteStoreSource",
    "RemoteStoresCollector",
    "StatsSource",
    "WriterKind",
    "check_coordinator_label",
    "check_writer_label",
    "collector_for",
    "coordinator_collector",
    "register_broker",
    "register_coordinator",
    "register_remote_store",
    "register_writer",
    "remote_store_families",
    "unregister_broker",
    "unregister_coordinator",
    "unregister_remote_store",
    "unregister_writer",
]

#: Metric prefix of transaction-coordinator logs.
TC_PREFIX: Final = "txnstream_txn_tc"
#: Metric prefix of pending-ack logs.
PENDING_ACK_PREFIX: Final = "txnstream_txn_pending_ack_store"

WriterKind = Literal["transaction_log", "pending_ack"]

_HISTOGRAMS: Final = (
    ("batch_records", "batch_records", "Records per batched entry."),
    ("batch_size_bytes", "batch_size_bytes", "Bytes per batched entry."),
    (
        "batch_oldest_record_delay_seconds",
        "oldest_record_delay_seconds",
        "Time the oldest record of a batch waited before the batch was written.",
    ),
)
_COUNTERS: Final = (
    ("flush_trigger_max_records", "flush_max_records", "max_records"),
    ("flush_trigger_max_size", "flush_max_size", "max_size"),
    ("flush_trigger_max_delay", "flush_max_delay", "max_delay"),
    ("flush_trigger_large_data", "flush_large_data", "a record of at least max_size"),
)


class StatsSource(Protocol):
    """Anything with a BufferedWriter-shaped ``stats()`` snapshot."""

    def stats(self) -> Mapping[str, Any]:
        """Return counters and histograms (see ``BufferedWriter.stats``)."""
        ...


def _buckets(hist: Mapping[str, Any]) -> list[tuple[str, float]]:
    """Turn per-bucket counts into Prometheus cumulative buckets ending at +Inf."""
    bounds: list[float] = list(hist["bounds"])
    counts: list[int] = list(hist["counts"])
    out: list[tuple[str, float]] = []
    total = 0
    for bound, count in zip([*bounds, float("inf")], counts, strict=True):
        total += count
        out.append(("+Inf" if bound == float("inf") else repr(float(bound)), float(total)))
    return out


class BufferedWriterCollector(Collector):
    """Collects the metrics of every writer registered under one prefix."""

    def __init__(self, prefix: str, label: str = "writer") -> None:
        """Create an empty collector for metric names starting with ``prefix``."""
        self.prefix = prefix
        self.label = label
        self._lock = threading.Lock()
        self._writers: dict[str, weakref.ref[StatsSource] | StatsSource] = {}

    def add(self, name: str, writer: StatsSource, *, exclusive: bool = False) -> None:
        """Export ``writer`` under label value ``name`` (held weakly when possible).

        Another source already exported under ``name`` is replaced, unless
        ``exclusive``: then that raises ``InvalidArgumentError`` naming the
        label (two live sources must never share one silently).
        """
        try:
            ref: weakref.ref[StatsSource] | StatsSource = weakref.ref(writer)
        except TypeError:
            ref = writer
        with self._lock:
            if exclusive:
                self._check_free(name)
            self._writers[name] = ref

    def _check_free(self, name: str) -> None:
        # Under the lock: refuse ``name`` if a live source holds it.
        ref = self._writers.get(name)
        current = ref() if isinstance(ref, weakref.ref) else ref
        if current is not None:
            from txnstream.errors import InvalidArgumentError

            raise InvalidArgumentError(
                f"metrics label {self.label}={name!r} is already exported by a live "
                f"{type(current).__name__} in this registry; give a distinct label "
                "(metrics_label=...) or another registry (registry=None: not exported)",
                argument=self.label,
                value=name,
            )

    def check_free(self, name: str) -> None:
        """Raise ``InvalidArgumentError`` if a live source is exported under ``name``."""
        with self._lock:
            self._check_free(name)

    def remove(self, name: str, writer: StatsSource | None = None) -> None:
        """Stop exporting the writer labelled ``name`` (no error if absent).

        With ``writer``, only if that is the one registered under ``name``
        (another may have replaced it since).
        """
        with self._lock:
            ref = self._writers.get(name)
            if ref is None:
                return
            current = ref() if isinstance(ref, weakref.ref) else ref
            if writer is None or current is writer or current is None:
                del self._writers[name]

    def names(self) -> list[str]:
        """Return the label values of live registered writers."""
        return [name for name, _ in self._live()]

    def _live(self) -> list[tuple[str, StatsSource]]:
        out: list[tuple[str, StatsSource]] = []
        with self._lock:
            for name, ref in list(self._writers.items()):
                writer = ref() if isinstance(ref, weakref.ref) else ref
                if writer is None:
                    del self._writers[name]  # the writer was garbage-collected
                else:
                    out.append((name, writer))
        return out

    def _families(self) -> tuple[list[HistogramMetricFamily], list[CounterMetricFamily]]:
        base = f"{self.prefix}_bufferedwriter_"
        hists = [
            HistogramMetricFamily(base + metric, doc, labels=[self.label])
            for metric, _, doc in _HISTOGRAMS
        ]
        counters = [
            CounterMetricFamily(
                base + metric, f"Batches written because of {why}.", labels=[self.label]
            )
            for metric, _, why in _COUNTERS
        ]
        return hists, counters

    def describe(self) -> Iterable[Metric]:
        """Return the metric families (without samples), for duplicate-name checks."""
        hists, counters = self._families()
        return [*hists, *counters]

    def collect(self) -> Iterator[Metric]:
        """Read one snapshot per writer and yield every family."""
        hists, counters = self._families()
        for name, writer in self._live():
            stats = writer.stats()
            for family, (_, key, _) in zip(hists, _HISTOGRAMS, strict=True):
                hist = stats[key]
                family.add_metric([name], _buckets(hist), float(hist["sum"]))
            for counter, (_, key, _) in zip(counters, _COUNTERS, strict=True):
                counter.add_metric([name], float(stats[key]))
        yield from hists
        yield from counters


_PREFIXES: Final[dict[str, str]] = {
    "transaction_log": TC_PREFIX,
    "pending_ack": PENDING_ACK_PREFIX,
}
# Collectors per registry, held weakly: a registry that is gone takes its
# entry with it (keyed by id(), a new registry at the same address was taken
# for the dead one: its metrics were never exported).
_collectors: weakref.WeakKeyDictionary[CollectorRegistry, dict[str, BufferedWriterCollector]] = (
    weakref.WeakKeyDictionary()
)
_collectors_lock = threading.Lock()


def collector_for(
    kind: WriterKind, registry: CollectorRegistry = REGISTRY
) -> BufferedWriterCollector:
    """Return the collector of ``kind`` in ``registry``, registering it on first use."""
    if kind not in _PREFIXES:
        raise ValueError(f"kind must be one of {sorted(_PREFIXES)}, got {kind!r}")
    with _collectors_lock:
        by_kind = _collectors.setdefault(registry, {})
        collector = by_kind.get(kind)
        if collector is None:
            collector = BufferedWriterCollector(_PREFIXES[kind])
            registry.register(collector)
            by_kind[kind] = collector
        return collector


def register_writer(
    writer: StatsSource,
    kind: WriterKind = "transaction_log",
    name: str | None = None,
    registry: CollectorRegistry = REGISTRY,
    *,
    exclusive: bool = False,
) -> str:
    """Export ``writer``'s metrics; returns the ``writer`` label value used.

    ``name`` defaults to ``writer.stats()["name"]``. Registering another
    writer under the same name replaces the first, unless ``exclusive``
    (then a live one under that name raises ``InvalidArgumentError``).
    """
    label = name if name is not None else str(writer.stats()["name"])
    collector_for(kind, registry).add(label, writer, exclusive=exclusive)
    return label


def check_writer_label(
    name: str, kind: WriterKind = "transaction_log", registry: CollectorRegistry = REGISTRY
) -> None:
    """Raise ``InvalidArgumentError`` if a live writer is exported under ``name``."""
    collector_for(kind, registry).check_free(name)


def unregister_writer(
    name: str,
    kind: WriterKind = "transaction_log",
    registry: CollectorRegistry = REGISTRY,
    writer: StatsSource | None = None,
) -> None:
    """Stop exporting the writer labelled ``name`` (with ``writer``: only if it is that one)."""
    collector_for(kind, registry).remove(name, writer)


#: Upper bounds (ms) of the coordinator's end-latency histogram buckets.
END_LATENCY_BOUNDS_MS: Final = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 60000)

_TC_GAUGES: Final = (
    ("active_count", "active", "Live transactions (open or ending)."),
    ("open_count", "open", "Transactions in status OPEN."),
    ("late_count", "late", "Live transactions past their timeout (not aborted yet, or stuck)."),
)
_TC_COUNTERS: Final = (
    ("created", "created", "Transactions started."),
    ("committed", "committed", "Transactions committed."),
    ("aborted", "aborted", "Transactions aborted (timed out included)."),
    ("timed_out", "timed_out", "Transactions aborted because they timed out."),
    ("append_log_errors", "append_errors", "Transaction-log writes that failed."),
)


class CoordinatorSource(Protocol):
    """A coordinator's scrape-time snapshot (``TransactionCoordinator.metrics``)."""

    def metrics(self) -> Mapping[str, Any]:
        """Return counters, gauges and the end-latency bucket counts."""
        ...


class CoordinatorCollector(Collector):
    """Collects the metrics of every registered transaction coordinator."""

    def __init__(self, prefix: str = TC_PREFIX, label: str = "coordinator") -> None:
        """Create an empty collector for metric names starting with ``prefix``."""
        self.prefix = prefix
        self.label = label
        self._sources = BufferedWriterCollector(prefix, label)  # reuse its weak registry

    def add(self, name: str, source: CoordinatorSource) -> None:
        """Export ``source`` under label value ``name`` (held weakly); a live one there raises."""
        self._sources.add(name, source, exclusive=True)  # type: ignore[arg-type]

    def check_free(self, name: str) -> None:
        """Raise ``InvalidArgumentError`` if a live coordinator is exported under ``name``."""
        self._sources.check_free(name)

    def remove(self, name: str, source: CoordinatorSource | None = None) -> None:
        """Stop exporting ``name`` (with ``source``: only if it is that one)."""
        self._sources.remove(name, source)  # type: ignore[arg-type]

    def names(self) -> list[str]:
        """Return the label values of live registered coordinators."""
        return self._sources.names()

    def _families(
        self,
    ) -> tuple[list[GaugeMetricFamily], list[CounterMetricFamily], HistogramMetricFamily]:
        p = self.prefix
        gauges = [
            GaugeMetricFamily(f"{p}_{m}", doc, labels=[self.label]) for m, _, doc in _TC_GAUGES
        ]
        counters = [
            CounterMetricFamily(f"{p}_{m}", doc, labels=[self.label]) for m, _, doc in _TC_COUNTERS
        ]
        latency = HistogramMetricFamily(
            f"{p}_end_latency_seconds",
            "Time from the end decision (ending UPDATE) to the final COMMITTED/ABORTED record.",
            labels=[self.label],
        )
        return gauges, counters, latency

    def describe(self) -> Iterable[Metric]:
        """Return the metric families (without samples), for duplicate-name checks."""
        gauges, counters, latency = self._families()
        return [*gauges, *counters, latency]

    def collect(self) -> Iterator[Metric]:
        """Read one snapshot per coordinator and yield every family."""
        gauges, counters, latency = self._families()
        for name, source in self._sources._live():
            snap = source.metrics()  # type: ignore[attr-defined]
            for family, (_, key, _) in zip(gauges, _TC_GAUGES, strict=True):
                family.add_metric([name], float(snap[key]))
            for counter, (_, key, _) in zip(counters, _TC_COUNTERS, strict=True):
                counter.add_metric([name], float(snap[key]))
            hist = snap["end_latency_ms"]
            bounds = [b / 1000.0 for b in hist["bounds"]]
            latency.add_metric(
                [name],
                _buckets({"bounds": bounds, "counts": hist["counts"]}),
                float(hist["sum"]) / 1000.0,
            )
        yield from gauges
        yield from counters
        yield latency


_coordinator_collectors: weakref.WeakKeyDictionary[CollectorRegistry, CoordinatorCollector] = (
    weakref.WeakKeyDictionary()
)


def coordinator_collector(registry: CollectorRegistry = REGISTRY) -> CoordinatorCollector:
    """Return the coordinator collector of ``registry``, registering it on first use."""
    with _collectors_lock:
        collector = _coordinator_collectors.get(registry)
        if collector is None:
            collector = CoordinatorCollector()
            registry.register(collector)
            _coordinator_collectors[registry] = collector
        return collector


def register_coordinator(
    coordinator: CoordinatorSource, name: str, registry: CollectorRegistry = REGISTRY
) -> str:
    """Export a coordinator's metrics under label ``coordinator=name``; returns ``name``.

    Two live coordinators never share a label: a second one raises
    ``InvalidArgumentError`` instead of silently replacing the first.
    """
    coordinator_collector(registry).add(name, coordinator)
    return name


def check_coordinator_label(name: str, registry: CollectorRegistry = REGISTRY) -> None:
    """Raise ``InvalidArgumentError`` if a live coordinator is exported as ``name``."""
    coordinator_collector(registry).check_free(name)


def unregister_coordinator(
    name: str, coordinator: CoordinatorSource | None = None, registry: CollectorRegistry = REGISTRY
) -> None:
    """Stop exporting coordinator ``name`` (with ``coordinator``: only if it is that one)."""
    coordinator_collector(registry).remove(name, coordinator)


#: Upper bounds of the commit durable-wait histogram.
COMMIT_WAIT_BOUNDS: Final = (0, 1, 2, 3, 4)
#: Upper bounds (ms) of the client commit-latency histogram.
COMMIT_LATENCY_BOUNDS_MS: Final = (0.5, 1, 2, 5, 10, 25, 50, 100, 250, 1000, 10000)


class CommitTally:
    """Commits and aborts of clients, with histograms of durable waits and latency (ms).

    Thread-safe. Each client keeps one; a closed client's is merged into its
    broker's (counters never go back, and the broker forgets the client).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.commits = 0
        self.aborts = 0
        self.waits = [0] * (len(COMMIT_WAIT_BOUNDS) + 1)
        self.latency = [0] * (len(COMMIT_LATENCY_BOUNDS_MS) + 1)
        self.latency_sum_ms = 0.0

    def add(self, committed: bool, waits: int, seconds: float) -> None:
        """Count one ended transaction."""
        with self._lock:
            if not committed:
                self.aborts += 1
                return
            self.commits += 1
            self.waits[_bucket(COMMIT_WAIT_BOUNDS, waits)] += 1
            ms = seconds * 1000.0
            self.latency[_bucket(COMMIT_LATENCY_BOUNDS_MS, ms)] += 1
            self.latency_sum_ms += ms

    def merge(self, other: CommitTally) -> None:
        """Add ``other``'s counts to these."""
        self.add_snapshot(other.snapshot())

    def add_snapshot(self, snap: Mapping[str, Any]) -> None:
        """Add the counts of a :meth:`snapshot` to these."""
        with self._lock:
            self.commits += snap["commits"]
            self.aborts += snap["aborts"]
            self.waits = [a + b for a, b in zip(self.waits, snap["waits"], strict=True)]
            self.latency = [a + b for a, b in zip(self.latency, snap["latency"], strict=True)]
            self.latency_sum_ms += snap["latency_sum_ms"]

    def snapshot(self) -> dict[str, Any]:
        """Return the counts (``commits``, ``aborts``, ``waits``, ``latency``, sums, bounds)."""
        with self._lock:
            return {
                "commits": self.commits,
                "aborts": self.aborts,
                "waits": list(self.waits),
                "wait_bounds": COMMIT_WAIT_BOUNDS,
                "latency": list(self.latency),
                "latency_bounds_ms": COMMIT_LATENCY_BOUNDS_MS,
                "latency_sum_ms": self.latency_sum_ms,
            }


def _bucket(bounds: Sequence[float], value: float) -> int:
    # Index of the first bucket whose upper bound holds ``value`` (last: +Inf).
    return bisect.bisect_left(bounds, value)


class BrokerSource(Protocol):
    """A broker's scrape-time snapshot (``Broker.metrics``)."""

    def metrics(self) -> Mapping[str, Any]:
        """Return per-partition gauges and client commit histograms."""
        ...


class BrokerCollector(Collector):
    """Collects the metrics of every registered broker (label ``broker``)."""

    def __init__(self) -> None:
        """Create an empty collector."""
        self._sources = BufferedWriterCollector("txnstream", "broker")

    def add(self, name: str, source: BrokerSource) -> None:
        """Export ``source`` under label value ``name``; a live one there raises."""
        self._sources.add(name, source, exclusive=True)  # type: ignore[arg-type]

    def remove(self, name: str, source: BrokerSource | None = None) -> None:
        """Stop exporting ``name`` (with ``source``: only if it is that one)."""
        self._sources.remove(name, source)  # type: ignore[arg-type]

    def _families(self) -> list[Any]:
        t, s = ["broker", "topic"], ["broker", "topic", "subscription"]
        return [
            GaugeMetricFamily(
                "txnstream_topic_read_committed_lag",
                "Entries from max_read_position to the end of the partition.",
                labels=t,
            ),
            GaugeMetricFamily(
                "txnstream_txn_buffer_ongoing_count", "Ongoing transactions.", labels=t
            ),
            GaugeMetricFamily(
                "txnstream_txn_buffer_aborted_count", "Aborted transactions remembered.", labels=t
            ),
            GaugeMetricFamily(
                "txnstream_txn_pending_ack_store_transactions_count",
                "Transactions holding acks on the subscription.",
                labels=s,
            ),
            GaugeMetricFamily(
                "txnstream_txn_pending_ack_store_held_entries",
                "Entries held by open transactions' acks.",
                labels=s,
            ),
            GaugeMetricFamily(
                "txnstream_subscription_backlog", "Entries after the mark-delete.", labels=s
            ),
            GaugeMetricFamily(
                "txnstream_broker_loaded_topics",
                "Partitions loaded (idle ones unload after topic_idle_unload_ms).",
                labels=["broker"],
            ),
            CounterMetricFamily(
                "txnstream_broker_topics_unloaded",
                "Partitions unloaded while idle since the broker opened.",
                labels=["broker"],
            ),
            CounterMetricFamily(
                "txnstream_client_commits", "Transactions committed by clients.", labels=["broker"]
            ),
            CounterMetricFamily(
                "txnstream_client_aborts", "Transactions aborted by clients.", labels=["broker"]
            ),
            HistogramMetricFamily(
                "txnstream_client_commit_durable_waits",
                "Sequential durable waits per commit.",
                labels=["broker"],
            ),
            HistogramMetricFamily(
                "txnstream_client_commit_latency_seconds",
                "Time spent in commit().",
                labels=["broker"],
            ),
        ]

    def describe(self) -> Iterable[Metric]:
        """Return the metric families (without samples)."""
        return self._families()

    def collect(self) -> Iterator[Metric]:
        """Read one snapshot per broker and yield every family."""
        fams = self._families()
        lag, ongoing, aborted, txns, held, backlog, loaded, unloaded = fams[:8]
        commits, aborts, waits, latency = fams[8:]
        for name, source in self._sources._live():
            snap = source.metrics()  # type: ignore[attr-defined]
            for topic, t_lag, t_ongoing, t_aborted, subs in snap["topics"]:
                lag.add_metric([name, topic], float(t_lag))
                ongoing.add_metric([name, topic], float(t_ongoing))
                aborted.add_metric([name, topic], float(t_aborted))
                for sub, n_txns, n_held, n_backlog in subs:
                    txns.add_metric([name, topic, sub], float(n_txns))
                    held.add_metric([name, topic, sub], float(n_held))
                    backlog.add_metric([name, topic, sub], float(n_backlog))
            loaded.add_metric([name], float(snap["loaded_topics"]))
            unloaded.add_metric([name], float(snap["topics_unloaded"]))
            commits.add_metric([name], float(snap["commits"]))
            aborts.add_metric([name], float(snap["aborts"]))
            waits.add_metric(
                [name],
                _buckets({"bounds": COMMIT_WAIT_BOUNDS, "counts": snap["waits"]}),
                float(sum(i * n for i, n in enumerate(snap["waits"]))),
            )
            latency.add_metric(
                [name],
                _buckets(
                    {
                        "bounds": [b / 1000.0 for b in COMMIT_LATENCY_BOUNDS_MS],
                        "counts": snap["latency"],
                    }
                ),
                float(snap["latency_sum_ms"]) / 1000.0,
            )
        yield from fams


_broker_collectors: weakref.WeakKeyDictionary[CollectorRegistry, BrokerCollector] = (
    weakref.WeakKeyDictionary()
)


_C = TypeVar("_C", BrokerCollector, "RemoteStoresCollector")


def _registry_collector(
    table: weakref.WeakKeyDictionary[CollectorRegistry, _C],
    registry: CollectorRegistry,
    make: Callable[[], _C],
) -> _C:
    """Return the registry's one collector of a kind, made and registered on first use."""
    with _collectors_lock:
        collector = table.get(registry)
        if collector is None:
            collector = make()
            registry.register(collector)
            table[registry] = collector
    return collector


def register_broker(broker: BrokerSource, name: str, registry: CollectorRegistry = REGISTRY) -> str:
    """Export a broker's metrics under label ``broker=name``; returns ``name``."""
    collector = _registry_collector(_broker_collectors, registry, BrokerCollector)
    collector.add(name, broker)
    return name


def unregister_broker(
    name: str, broker: BrokerSource | None = None, registry: CollectorRegistry = REGISTRY
) -> None:
    """Stop exporting broker ``name`` (with ``broker``: only if it is that one)."""
    with _collectors_lock:
        collector = _broker_collectors.get(registry)
    if collector is not None:
        collector.remove(name, broker)


class RemoteStoreSource(Protocol):
    """A remote store's call counts (``txnstream.tiered.RemoteStorage``)."""

    location: str

    def calls(self) -> Mapping[str, int]:
        """Return remote calls made so far, by kind."""
        ...

    def bytes_read(self) -> Mapping[str, int]:
        """Return bytes fetched so far, by kind."""
        ...


def remote_store_families(labels: Sequence[str]) -> list[CounterMetricFamily]:
    """Return the (empty) families of remote-store calls and bytes, with ``labels``."""
    return [
        CounterMetricFamily(
            "txnstream_tiered_remote_calls", "Remote storage calls by kind", labels=labels
        ),
        CounterMetricFamily(
            "txnstream_tiered_remote_read_bytes",
            "Bytes fetched from remote storage by kind",
            labels=labels,
        ),
    ]


class RemoteStoresCollector(Collector):
    """Collects the remote-store calls of every registered broker (labels broker, remote, kind)."""

    def __init__(self) -> None:
        """Create an empty collector."""
        self._sources = BufferedWriterCollector("txnstream", "broker")

    def add(self, name: str, source: RemoteStoreSource) -> None:
        """Export ``source`` under label value ``broker=name`` (replacing a previous one)."""
        self._sources.add(name, source)  # type: ignore[arg-type]

    def remove(self, name: str, source: RemoteStoreSource | None = None) -> None:
        """Stop exporting ``name`` (with ``source``: only if it is that one)."""
        self._sources.remove(name, source)  # type: ignore[arg-type]

    def describe(self) -> Iterable[Metric]:
        """Return the metric families (without samples), for duplicate-name checks."""
        return remote_store_families(["broker", "remote", "kind"])

    def collect(self) -> Iterator[Metric]:
        """Read every registered store's counts and yield both families."""
        calls, read = remote_store_families(["broker", "remote", "kind"])
        for name, source in self._sources._live():
            store: RemoteStoreSource = source  # type: ignore[assignment]
            loc = store.location
            for kind, n in store.calls().items():
                calls.add_metric([name, loc, kind], float(n))
            for kind, n in store.bytes_read().items():
                read.add_metric([name, loc, kind], float(n))
        yield calls
        yield read


_remote_collectors: weakref.WeakKeyDictionary[CollectorRegistry, RemoteStoresCollector] = (
    weakref.WeakKeyDictionary()
)


def register_remote_store(
    store: RemoteStoreSource, name: str, registry: CollectorRegistry = REGISTRY
) -> str:
    """Export a broker's remote-store counts under label ``broker=name``; returns ``name``.

    One collector per registry: brokers sharing a registry (distinct
    ``metrics_label``) are samples of one family each, never two families.
    """
    collector = _registry_collector(_remote_collectors, registry, RemoteStoresCollector)
    collector.add(name, store)
    return name


def unregister_remote_store(
    name: str, store: RemoteStoreSource | None = None, registry: CollectorRegistry = REGISTRY
) -> None:
    """Stop exporting broker ``name``'s remote store (with ``store``: only if it is that one)."""
    with _collectors_lock:
        collector = _remote_collectors.get(registry)
    if collector is not None:
        collector.remove(name, store)
