"""Tiered storage through the broker: indexes written as aborts happen, offload, remote reads."""

from __future__ import annotations

import random
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from txnstream import Broker
from txnstream._native import AbortedTxnIndex
from txnstream.config import BrokerConfig
from txnstream.tiered import object_name

TOPIC = "persistent://public/default/tiered"


def _config(**kw: object) -> BrokerConfig:
    return BrokerConfig(max_entries_per_ledger=10, transaction_timeout_ms=60_000, **kw)  # type: ignore[arg-type]


def _workload(broker: Broker, txns: int, seed: int = 5) -> tuple[set[bytes], set[bytes]]:
    """Interleaved transactions on one partition, some aborted; returns (committed, aborted)."""
    rng = random.Random(seed)
    client = broker.client("tiered-test")
    producer = client.producer(TOPIC)
    committed: set[bytes] = set()
    aborted: set[bytes] = set()
    open_txns: list[tuple[object, list[bytes]]] = []
    for i in range(txns):
        t = client.transaction()
        vals = [f"t{i}-{k}".encode() for k in range(rng.randint(1, 3))]
        for v in vals:
            producer.send(v, txn=t)
        open_txns.append((t, vals))
        producer.send(f"plain{i}".encode())
        committed.add(f"plain{i}".encode())
        if len(open_txns) > 2 or i == txns - 1:
            while open_txns:
                t2, v2 = open_txns.pop(rng.randrange(len(open_txns)))
                if rng.random() < 0.3:
                    t2.abort()  # type: ignore[attr-defined]
                    aborted.update(v2)
                else:
                    t2.commit()  # type: ignore[attr-defined]
                    committed.update(v2)
    producer.send(b"last")
    committed.add(b"last")
    return committed, aborted


def test_offload_then_remote_read_committed_equals_the_client(tmp_path: Path) -> None:
    reg = CollectorRegistry()
    with Broker.open(tmp_path / "data", _config(), registry=reg) as broker:
        committed, aborted = _workload(broker, 60)
        assert aborted
        segs = broker.admin.offload(TOPIC)
        assert len(segs) >= 5
        stats = broker.admin.tiered_stats()
        # The transaction buffer wrote exact index records as aborts happened:
        # the offloader found every index matching the ledger's ABORT markers.
        assert stats["offloader"].get("txn_index_rebuilt", 0) == 0
        assert stats["offloader"]["segments_offloaded"] == len(segs)
        assert any(not s.txn_idx_empty for s in segs) and any(s.txn_idx_empty for s in segs)
        # Exact records: the first position of each aborted transaction and a
        # real last-stable position (not the conservative lowest one).
        seg = next(s for s in segs if not s.txn_idx_empty)
        raw = (
            tmp_path
            / "data"
            / "remote"
            / object_name(seg.topic, seg.ledger_id, seg.segment_id, "txn_index")
        ).read_bytes()
        recs = AbortedTxnIndex.decode(raw).records()
        assert recs and all(r[1] <= r[2] and r[3] <= r[2] for r in recs)
        assert any(r[3].ledger_id > 0 for r in recs)  # real last-stable positions
        # A READ_COMMITTED read from remote segments alone (no local ledger)
        # returns what the client's READ_COMMITTED consumer returns there.
        before = broker.admin.tiered_stats()["calls"]
        reader = broker.tiered.reader()
        remote_vals = [m.payload for m in reader.read_committed(seg.topic)]
        consumer = broker.client("reader").subscribe(TOPIC, "rc")
        client_vals: list[bytes] = []
        while (m := consumer.receive(timeout_ms=500)) is not None:
            client_vals.append(m.value)
        assert remote_vals == client_vals[: len(remote_vals)]
        assert not set(remote_vals) & aborted
        assert set(client_vals) == committed
        # Every read counted; remote calls exported to Prometheus.
        after = broker.admin.tiered_stats()["calls"]
        calls = {k: after[k] - before[k] for k in after}
        assert calls["segment"] == len(segs)  # one data call per segment read
        non_empty = sum(1 for s in segs if not s.txn_idx_empty)
        assert calls["txn_index"] == non_empty < len(segs)  # only the non-empty indexes
        text = generate_latest(reg).decode()
        assert "txnstream_tiered_remote_calls_total" in text
        # Offloading again uploads nothing new.
        assert [s.segment_id for s in broker.admin.offload(TOPIC)] == [s.segment_id for s in segs]
    with Broker.open(tmp_path / "data", _config(), registry=None) as broker:
        assert len(broker.admin.offloaded_segments(TOPIC)[TOPIC]) == len(segs)


def test_offload_by_policy_in_maintenance(tmp_path: Path) -> None:
    with Broker.open(
        tmp_path / "data", _config(offload_threshold_bytes=0), registry=None
    ) as broker:
        _workload(broker, 30)
        broker.maintain_now()
        segs = broker.admin.offloaded_segments(TOPIC)[TOPIC]
        closed = [lid for lid, n, sealed in broker.topic(TOPIC).ml.ledgers() if sealed and n]
        assert [s.ledger_id for s in segs] == closed


def test_tiered_settings_from_pulsar_keys(tmp_path: Path) -> None:
    cfg = BrokerConfig.from_dict(
        {
            "managedLedgerOffloadThresholdInBytes": "1048576",
            "fileSystemURI": str(tmp_path / "elsewhere"),
        }
    )
    assert cfg.offload_threshold_bytes == 1 << 20 and cfg.offload_threshold_ms == -1
    with Broker.open(tmp_path / "data", cfg, registry=None) as broker:
        assert broker.tiered.remote.location == str(tmp_path / "elsewhere")
