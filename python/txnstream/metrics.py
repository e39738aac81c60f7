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
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final, Literal, Protocol

from prometheus_client.core import REGISTRY, CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

__all__ = [
    "PENDING_ACK_PREFIX",
    "TC_PREFIX",
    "BufferedWriterCollector",
    "StatsSource",
    "WriterKind",
    "collector_for",
    "register_writer",
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

    def add(self, name: str, writer: StatsSource) -> None:
        """Export ``writer`` under label value ``name`` (held weakly when possible)."""
        try:
            ref: weakref.ref[StatsSource] | StatsSource = weakref.ref(writer)
        except TypeError:
            ref = writer
        with self._lock:
            self._writers[name] = ref

    def remove(self, name: str) -> None:
        """Stop exporting the writer labelled ``name`` (no error if absent)."""
        with self._lock:
            self._writers.pop(name, None)

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
_collectors: dict[tuple[int, str], BufferedWriterCollector] = {}
_collectors_lock = threading.Lock()


def collector_for(
    kind: WriterKind, registry: CollectorRegistry = REGISTRY
) -> BufferedWriterCollector:
    """Return the collector of ``kind`` in ``registry``, registering it on first use."""
    if kind not in _PREFIXES:
        raise ValueError(f"kind must be one of {sorted(_PREFIXES)}, got {kind!r}")
    key = (id(registry), kind)
    with _collectors_lock:
        collector = _collectors.get(key)
        if collector is None:
            collector = BufferedWriterCollector(_PREFIXES[kind])
            registry.register(collector)
            _collectors[key] = collector
        return collector


def register_writer(
    writer: StatsSource,
    kind: WriterKind = "transaction_log",
    name: str | None = None,
    registry: CollectorRegistry = REGISTRY,
) -> str:
    """Export ``writer``'s metrics; returns the ``writer`` label value used.

    ``name`` defaults to ``writer.stats()["name"]``. Registering another
    writer under the same name replaces the first.
    """
    label = name if name is not None else str(writer.stats()["name"])
    collector_for(kind, registry).add(label, writer)
    return label


def unregister_writer(
    name: str, kind: WriterKind = "transaction_log", registry: CollectorRegistry = REGISTRY
) -> None:
    """Stop exporting the writer labelled ``name``."""
    collector_for(kind, registry).remove(name)
