"""Prometheus export of BufferedWriter metrics: names, buckets, labels, values."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from txnstream import BufferedWriter, ManagedLedger
from txnstream.metrics import (
    PENDING_ACK_PREFIX,
    TC_PREFIX,
    collector_for,
    register_writer,
    unregister_writer,
)

RECORD_BOUNDS = [10.0, 50.0, 100.0, 200.0, 500.0, 1000.0]
SIZE_BOUNDS = [128.0, 512.0, 1024.0, 2048.0, 4096.0, 16384.0, 102400.0, 1232896.0]
DELAY_BOUNDS = [0.001, 0.005, 0.01]


def hist(bounds: list[float], counts: list[int], total: float) -> dict[str, Any]:
    return {"bounds": bounds, "counts": counts, "sum": total, "count": sum(counts)}


class FakeWriter:
    """A stats source shaped like BufferedWriter.stats()."""

    def __init__(self, name: str, scale: int = 1) -> None:
        self.name = name
        self.scale = scale

    def stats(self) -> Mapping[str, Any]:
        s = self.scale
        return {
            "name": self.name,
            "flush_max_records": 3 * s,
            "flush_max_size": 1 * s,
            "flush_max_delay": 7 * s,
            "flush_large_data": 2 * s,
            "batch_records": hist(RECORD_BOUNDS, [s, 0, 2 * s, 0, 0, 0, 1], 500.0 * s),
            "batch_size_bytes": hist(SIZE_BOUNDS, [0, 0, s, 0, 0, 0, 0, 0, 2 * s], 9e6 * s),
            "oldest_record_delay_seconds": hist(DELAY_BOUNDS, [s, s, 0, 0], 0.004 * s),
        }


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_names_buckets_labels_and_values() -> None:
    reg = CollectorRegistry()
    # The collector holds writers weakly: keep them alive here.
    writers = [FakeWriter("tc-0"), FakeWriter("tc-1", scale=10)]
    for w in writers:
        register_writer(w, "transaction_log", registry=reg)
    got = samples(reg)
    base = f"{TC_PREFIX}_bufferedwriter_"
    w0 = (("writer", "tc-0"),)
    assert got[(base + "flush_trigger_max_records_total", w0)] == 3
    assert got[(base + "flush_trigger_max_size_total", w0)] == 1
    assert got[(base + "flush_trigger_max_delay_total", w0)] == 7
    assert got[(base + "flush_trigger_large_data_total", w0)] == 2
    assert got[(base + "flush_trigger_max_delay_total", (("writer", "tc-1"),))] == 70
    # Cumulative buckets with the spec's bounds.
    cum = [
        got[(base + "batch_records_bucket", (("le", le), *w0))]
        for le in ["10.0", "50.0", "100.0", "200.0", "500.0", "1000.0", "+Inf"]
    ]
    assert cum == [1, 1, 3, 3, 3, 3, 4]
    assert got[(base + "batch_records_count", w0)] == 4
    assert got[(base + "batch_records_sum", w0)] == 500
    assert got[(base + "batch_size_bytes_bucket", (("le", "1232896.0"), *w0))] == 1
    assert got[(base + "batch_size_bytes_bucket", (("le", "+Inf"), *w0))] == 3
    delay = base + "batch_oldest_record_delay_seconds_bucket"
    assert got[(delay, (("le", "0.001"), *w0))] == 1
    assert got[(delay, (("le", "0.005"), *w0))] == 2
    assert got[(delay, (("le", "+Inf"), *w0))] == 2


def test_pending_ack_prefix_and_unregister() -> None:
    reg = CollectorRegistry()
    writer = FakeWriter("t-sub")
    label = register_writer(writer, "pending_ack", registry=reg)
    assert label == "t-sub"
    names = {k[0] for k in samples(reg)}
    assert f"{PENDING_ACK_PREFIX}_bufferedwriter_flush_trigger_max_records_total" in names
    assert not any(n.startswith(TC_PREFIX + "_") for n in names)
    unregister_writer("t-sub", "pending_ack", registry=reg)
    assert samples(reg) == {}
    assert collector_for("pending_ack", reg) is collector_for("pending_ack", reg)


def test_dead_writers_disappear() -> None:
    reg = CollectorRegistry()
    w = FakeWriter("gone")
    register_writer(w, registry=reg)
    assert collector_for("transaction_log", reg).names() == ["gone"]
    del w
    assert collector_for("transaction_log", reg).names() == []


def test_bad_kind() -> None:
    with pytest.raises(ValueError, match="kind"):
        collector_for("nope", CollectorRegistry())  # type: ignore[arg-type]


def test_real_writer_export_matches_stats(tmp_path: Path) -> None:
    reg = CollectorRegistry()
    with ManagedLedger.open(tmp_path, "__transaction_log_3") as ml:
        w = BufferedWriter(ml, max_records=10, max_size=1024, max_delay_ms=3_600_000, name="tc-3")
        label = register_writer(w, "transaction_log", registry=reg)
        assert label == "tc-3"
        # 3 batches by max_records, 1 by max_size, then one large record.
        w.write_many_blocking([b"\x08" + bytes(20) for _ in range(30)])
        w.write_many_blocking([b"\x08" + bytes(299) for _ in range(4)])
        w.write_blocking(b"\x08" + bytes(4000))
        got = samples(reg)
        stats = w.stats()
        base = f"{TC_PREFIX}_bufferedwriter_"
        lbl = (("writer", "tc-3"),)
        assert got[(base + "flush_trigger_max_records_total", lbl)] == 3
        assert got[(base + "flush_trigger_max_size_total", lbl)] == 1
        assert got[(base + "flush_trigger_max_delay_total", lbl)] == 0
        assert got[(base + "flush_trigger_large_data_total", lbl)] == 1
        # Records per batch: three of 10 (le=10), one of 4 (le=10).
        assert got[(base + "batch_records_bucket", (("le", "10.0"), *lbl))] == 4
        assert got[(base + "batch_records_sum", lbl)] == 34
        # Entry sizes: 4 + 10 * 23 = 234 bytes (le=512); 4 + 4 * 303 = 1216 (le=2048).
        size = base + "batch_size_bytes_bucket"
        assert got[(size, (("le", "128.0"), *lbl))] == 0
        assert got[(size, (("le", "512.0"), *lbl))] == 3
        assert got[(size, (("le", "2048.0"), *lbl))] == 4
        assert got[(base + "batch_size_bytes_sum", lbl)] == stats["batch_size_bytes"]["sum"]
        assert got[(base + "batch_size_bytes_sum", lbl)] == 3 * 234 + 1216
        assert got[(base + "batch_oldest_record_delay_seconds_count", lbl)] == 4
        w.close()


def test_unregister_with_writer_leaves_a_replacement() -> None:
    """Closing an old log must not drop the metrics of a new one with the same name."""
    registry = CollectorRegistry()
    old, new = FakeWriter("same"), FakeWriter("same", scale=2)
    register_writer(old, "transaction_log", registry=registry)
    register_writer(new, "transaction_log", registry=registry)  # replaces the old one
    unregister_writer("same", "transaction_log", registry, writer=old)
    assert collector_for("transaction_log", registry).names() == ["same"]
    unregister_writer("same", "transaction_log", registry, writer=new)
    assert collector_for("transaction_log", registry).names() == []


def test_collectors_of_a_dead_registry_go_with_it(tmp_path: Path) -> None:
    """Held weakly by registry: no leak, and no dead registry's entry for a new one at its address.

    Keyed by ``id(registry)`` before, an entry outlived its registry; a new
    registry allocated at the same address then found it and registered
    nothing, so its broker's metrics were never exported.
    """
    import gc

    from txnstream import Broker
    from txnstream import metrics as m

    def sizes() -> tuple[int, int, int]:
        return len(m._collectors), len(m._coordinator_collectors), len(m._broker_collectors)

    def one_broker(path: Path) -> None:
        reg = CollectorRegistry()
        with Broker.open(path, registry=reg) as b:
            c = b.client("x")
            with c.transaction() as t:
                c.producer("t").send(b"x", txn=t)
            assert "txnstream_txn_tc_committed_total" in generate_latest(reg).decode()
        assert sizes() != before  # this registry's collectors are known while it lives

    gc.collect()
    before = sizes()
    for i in range(3):
        one_broker(tmp_path / str(i))
        gc.collect()
        assert sizes() == before
