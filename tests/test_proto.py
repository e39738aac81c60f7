"""The committed Python protobuf classes are fresh and keep SPEC §3.2 numbers."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from txnstream import proto

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "python" / "txnstream" / "proto"


def load_generator() -> object:
    spec = importlib.util.spec_from_file_location("gen_proto", ROOT / "scripts" / "gen_proto.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gen_proto"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    gen = load_generator()
    produced = gen.generate(tmp_path)  # type: ignore[attr-defined]
    assert produced, "no files generated"
    committed = sorted(p.name for p in PKG.glob("*_pb2.py*"))
    assert sorted(p.name for p in produced) == committed
    for p in produced:
        assert p.read_bytes() == (PKG / p.name).read_bytes(), (
            f"{p.name} is stale: run `make proto` and commit the result"
        )


def fields(msg: type) -> dict[str, int]:
    return {f.name: f.number for f in msg.DESCRIPTOR.fields}  # type: ignore[attr-defined]


def test_spec_field_numbers() -> None:
    assert fields(proto.TransactionMetadataEntry) == {
        "metadata_op": 1,
        "txnid_least_bits": 2,
        "txnid_most_bits": 3,
        "expected_status": 4,
        "new_status": 5,
        "partitions": 6,
        "subscriptions": 7,
        "timeout_ms": 8,
        "start_time": 9,
        "last_modification_time": 10,
        "max_local_txn_id": 11,
        "owner": 12,
        "client_name": 13,
        "timed_out": 1000,  # txnstream extension, far above Pulsar's numbers
    }
    assert fields(proto.BatchedTransactionMetadataEntry) == {"transaction_log": 1}
    assert fields(proto.BatchedPendingAckMetadataEntry) == {"pending_ack_log": 1}
    assert fields(proto.PendingAckMetadata) == {
        "ledgerId": 1,
        "entryId": 2,
        "ack_set": 3,
        "batch_size": 4,
    }
    assert fields(proto.PendingAckMetadataEntry) == {
        "pending_ack_op": 1,
        "ack_type": 2,
        "txnid_least_bits": 3,
        "txnid_most_bits": 4,
        "pending_ack_metadata": 5,
    }
    assert fields(proto.TransactionBufferSnapshot) == {
        "topic_name": 1,
        "max_read_position_ledgerId": 2,
        "max_read_position_entryId": 3,
        "abort_txn_metadata": 4,
        # txnstream's own, from 1000 (Pulsar skips them): deduplication state.
        "producer_sequences": 1000,
        "message_txns": 1001,
        "snapshot_time_ms": 1002,
        "dedup_complete": 1003,
    }
    assert fields(proto.ProducerSequence) == {
        "producer_name": 1,
        "last_sequence_id": 2,
        "sequence_ids": 3,
        "ledger_ids": 4,
        "entry_ids": 5,
        "batch_indexes": 6,
        "batch_sizes": 7,
        "txn_refs": 8,
    }
    assert fields(proto.TxnRef) == {"txnid_most_bits": 1, "txnid_least_bits": 2, "aborted": 3}
    assert fields(proto.AbortTxnMetadata) == {
        "txnid_least_bits": 1,
        "txnid_most_bits": 2,
        "ledgerId": 3,
        "entryId": 4,
    }
    assert [proto.OPEN, proto.COMMITTING, proto.COMMITTED, proto.ABORTING, proto.ABORTED] == [
        0,
        1,
        2,
        3,
        4,
    ]
    assert (proto.ACK, proto.COMMIT, proto.ABORT) == (1, 2, 3)
    assert (proto.Individual, proto.Cumulative) == (0, 1)


def test_pulsar_message_metadata_field_numbers() -> None:
    """Topic entries keep Pulsar's PulsarApi.proto / PulsarMarkers.proto numbers."""
    want = {
        "producer_name": 1,
        "sequence_id": 2,
        "publish_time": 3,
        "properties": 4,
        "replicated_from": 5,
        "partition_key": 6,
        "replicate_to": 7,
        "compression": 8,
        "uncompressed_size": 9,
        "num_messages_in_batch": 11,
        "event_time": 12,
        "partition_key_b64_encoded": 17,
        "ordering_key": 18,
        "deliver_at_time": 19,
        "marker_type": 20,
        "txnid_least_bits": 22,
        "txnid_most_bits": 23,
        "highest_sequence_id": 24,
        "null_value": 25,
        "uuid": 26,
        "num_chunks_from_msg": 27,
        "total_chunk_msg_size": 28,
        "chunk_id": 29,
        "null_partition_key": 30,
    }
    assert fields(proto.MessageMetadata) == want
    assert fields(proto.SingleMessageMetadata) == {
        "properties": 1,
        "partition_key": 2,
        "payload_size": 3,
        "compacted_out": 4,
        "event_time": 5,
        "partition_key_b64_encoded": 6,
        "ordering_key": 7,
        "sequence_id": 8,
        "null_value": 9,
        "null_partition_key": 10,
    }
    assert fields(proto.KeyValue) == {"key": 1, "value": 2}
    assert (proto.TXN_COMMITTING, proto.TXN_COMMIT, proto.TXN_ABORT) == (20, 21, 22)
    assert proto.MarkerType.Value("UNKNOWN_MARKER") == 0
