"""Tiered storage through the broker: indexes written as aborts happen, offload, remote reads."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from txnstream import Broker, Position
from txnstream._native import AbortedTxnIndex
from txnstream.config import BrokerConfig
from txnstream.errors import InvalidTopicNameError
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


def _drain(broker: Broker, sub: str) -> list[bytes]:
    consumer = broker.client(f"reader-{sub}").subscribe(TOPIC, sub)
    out: list[bytes] = []
    while (m := consumer.receive(timeout_ms=300)) is not None:
        out.append(m.value)
        consumer.ack(m)
    consumer.close()
    return out


def _wait_trimmed_past(broker: Broker, ledger_id: int) -> None:
    ml = broker.topic(TOPIC).ml
    deadline = time.monotonic() + 20
    while (ml.first_position or Position(0, 0)).ledger_id <= ledger_id:
        assert time.monotonic() < deadline, f"ledgers up to {ledger_id} were not trimmed"
        broker.maintain_now()
        ml.checkpoint()
        time.sleep(0.02)


@pytest.mark.parametrize("seed", [1, 2, 3, 5])
def test_offload_then_remote_read_committed_equals_the_client(tmp_path: Path, seed: int) -> None:
    reg = CollectorRegistry()
    with Broker.open(tmp_path / "data", _config(), registry=reg) as broker:
        committed, aborted = _workload(broker, 60, seed)
        assert aborted
        # The subscription exists before the offload: its cursor keeps the data
        # local until it is consumed (consumers read local ledgers only).
        broker.client("reader-rc").subscribe(TOPIC, "rc").close()
        segs = broker.admin.offload(TOPIC)  # from now on trimming waits for offload
        assert len(segs) >= 5
        client_vals = _drain(broker, "rc")  # READ_COMMITTED through the client, all acked
        assert set(client_vals) == committed
        stats = broker.admin.tiered_stats()
        # The transaction buffer wrote exact index records as aborts happened:
        # the offloader found every index matching the ledger's ABORT markers.
        assert stats["offloader"].get("txn_index_rebuilt", 0) == 0
        assert stats["offloader"]["segments_offloaded"] == len(segs)
        assert any(not s.txn_idx_empty for s in segs)
        # Exact records: real first and last-stable positions, not the conservative lowest.
        seg = next(s for s in segs if not s.txn_idx_empty)
        raw = (
            tmp_path
            / "data"
            / "remote"
            / object_name(seg.topic, seg.ledger_id, seg.segment_id, "txn_index")
        ).read_bytes()
        recs = AbortedTxnIndex.decode(raw).records()
        assert recs and all(r[1] <= r[2] and r[3] <= r[2] for r in recs)
        assert any(r[3].ledger_id > 0 for r in recs)
        # An open transaction's messages are never read (the buffer's bound).
        client = broker.client("late")
        t = client.transaction()
        client.producer(TOPIC).send(b"uncommitted", txn=t)
        # The subscription acked everything: the offloaded ledgers go locally.
        _wait_trimmed_past(broker, segs[len(segs) // 2].ledger_id)
        before = broker.admin.tiered_stats()["calls"]
        topic = broker.topic(TOPIC)
        got = [m.payload for m in broker.tiered.read_committed(topic)]
        after = broker.admin.tiered_stats()["calls"]
        assert got == client_vals  # remote + local equals what the client read
        assert b"uncommitted" not in got and not set(got) & aborted
        calls = {k: after[k] - before[k] for k in after}
        assert calls["segment"] >= 1  # the trimmed part came from remote
        text = generate_latest(reg).decode()
        assert "txnstream_tiered_remote_calls_total" in text
        t.commit()
        assert b"uncommitted" in [m.payload for m in broker.tiered.read_committed(topic)]
        # Offloading again uploads nothing new.
        uploaded = broker.admin.tiered_stats()["offloader"]["segments_offloaded"]
        again = broker.admin.offload(TOPIC)
        assert {s.segment_id for s in again} <= {s.segment_id for s in segs}
        assert broker.admin.tiered_stats()["offloader"]["segments_offloaded"] == uploaded
    with Broker.open(tmp_path / "data", _config(), registry=None) as broker:
        assert len(broker.admin.offloaded_segments(TOPIC)[TOPIC]) >= len(segs)


def test_local_ledgers_stay_until_offloaded(tmp_path: Path) -> None:
    # Policy on (but by size it never triggers): trimming waits for offload,
    # so a READ_COMMITTED read over remote + local data never has a gap.
    with Broker.open(
        tmp_path / "data", _config(offload_threshold_bytes=1 << 40), registry=None
    ) as broker:
        committed, _ = _workload(broker, 30)
        ml = broker.topic(TOPIC).ml
        first = ml.first_position
        assert first is not None
        assert set(_drain(broker, "all")) == committed  # everything acked
        for _ in range(5):
            broker.maintain_now()
            ml.checkpoint()
        assert ml.first_position == first  # nothing offloaded: nothing trimmed
        segs = broker.admin.offload(TOPIC)
        _wait_trimmed_past(broker, segs[0].ledger_id)  # offloaded: trimming goes on
        got = [m.payload for m in broker.tiered.read_committed(broker.topic(TOPIC))]
        assert set(got) == committed


def test_offload_of_an_unknown_topic_is_an_error(tmp_path: Path) -> None:
    with Broker.open(tmp_path / "data", _config(), registry=None) as broker:
        with pytest.raises(InvalidTopicNameError, match="does not exist"):
            broker.admin.offload("persistent://public/default/typo")
        assert broker.admin.topics() == []  # not created by the call


def test_offload_by_policy_in_maintenance(tmp_path: Path) -> None:
    with Broker.open(
        tmp_path / "data", _config(offload_threshold_bytes=0), registry=None
    ) as broker:
        _workload(broker, 30)
        broker.maintain_now()
        segs = broker.admin.offloaded_segments(TOPIC)[TOPIC]
        closed = [lid for lid, n, sealed in broker.topic(TOPIC).ml.ledgers() if sealed and n]
        assert [s.ledger_id for s in segs] == closed
        # Once consumed, offloaded ledgers are trimmed, and the same maintenance
        # round deletes their local aborted-transaction indexes.
        full = broker.topic(TOPIC).full
        indexed = [lid for lid in closed if broker.txn_indexes.path(full, lid).exists()]
        assert indexed, "the workload aborts transactions in closed ledgers"
        _drain(broker, "all")
        _wait_trimmed_past(broker, max(indexed))
        broker.maintain_now()
        assert [lid for lid in indexed if broker.txn_indexes.path(full, lid).exists()] == []


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


def test_read_committed_when_an_open_transaction_starts_a_ledger_after_trimmed_ones(
    tmp_path: Path,
) -> None:
    """The read limit at entry 0 of a ledger, every earlier one trimmed: all is remote.

    The transaction buffer's ``max_read_position`` (found through the local
    ledgers) is None then; the remote read must still return everything
    before the open transaction.
    """
    with Broker.open(tmp_path / "data", _config(), registry=None) as broker:
        client = broker.client("c")
        client.subscribe(TOPIC, "rc").close()
        producer = client.producer(TOPIC)
        ml = broker.topic(TOPIC).ml
        plain: list[bytes] = []
        while len(plain) < 15 or (ml.last_position and ml.last_position.entry_id != 9):
            plain.append(f"plain{len(plain)}".encode())
            producer.send(plain[-1])  # until a ledger (10 entries) is full
        t = client.transaction()
        producer.send(b"uncommitted", txn=t)
        t.wait_durable(10_000)
        first_of_txn = ml.last_position
        assert first_of_txn is not None and first_of_txn.entry_id == 0  # starts a ledger
        broker.admin.offload(TOPIC)
        assert _drain(broker, "rc") == plain
        _wait_trimmed_past(broker, first_of_txn.ledger_id - 1)
        topic = broker.topic(TOPIC)
        assert topic.tb.max_read_position is None  # nothing readable is stored locally
        got = [m.payload for m in broker.tiered.read_committed(topic)]
        assert got == plain
        t.abort()
