"""Prometheus export of a coordinator and of its transaction log's BufferedWriter."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from txnstream.config import BatchedWriteConfig
from txnstream.coordinator import TransactionCoordinator, TxnStatus
from txnstream.errors import TransactionAlreadyAborted

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(registry: CollectorRegistry) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def tc_value(samples: Samples, name: str, tc: str = "0", **labels: str) -> float:
    key = (name, tuple(sorted({"coordinator": tc, **labels}.items())))
    return samples[key]


def test_coordinator_and_writer_metrics_are_scraped(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    tc = TransactionCoordinator.open(
        tmp_path,
        0,
        registry=registry,
        transaction_meta_persist_count=10,
        batched_write=BatchedWriteConfig(enabled=True),
    )
    closed = False
    try:
        committed = [tc.new_transaction() for _ in range(3)]
        aborted = tc.new_transaction()
        late = tc.new_transaction(timeout_ms=5, client_name="c")
        still_open = tc.new_transaction()
        for txn in committed:
            tc.add_produced_partitions(txn, ["p"])
            assert tc.commit(txn) is TxnStatus.COMMITTED
        assert tc.abort(aborted) is TxnStatus.ABORTED
        deadline = time.monotonic() + 10
        while tc.get_transaction(late).status is not TxnStatus.ABORTED:
            assert time.monotonic() < deadline, "the timeout never fired"
            time.sleep(0.005)
        with pytest.raises(TransactionAlreadyAborted):
            tc.commit(late)

        s = scrape(registry)
        p = "txnstream_txn_tc"
        assert tc_value(s, f"{p}_created_total") == 6
        assert tc_value(s, f"{p}_committed_total") == 3
        assert tc_value(s, f"{p}_aborted_total") == 2
        assert tc_value(s, f"{p}_timed_out_total") == 1
        assert tc_value(s, f"{p}_append_log_errors_total") == 0
        assert tc_value(s, f"{p}_active_count") == 1
        assert tc_value(s, f"{p}_open_count") == 1
        assert tc_value(s, f"{p}_end_latency_seconds_count") == 5
        assert tc_value(s, f"{p}_end_latency_seconds_bucket", le="+Inf") == 5
        assert tc_value(s, f"{p}_end_latency_seconds_sum") >= 0
        # The log's BufferedWriter, labelled with the log's name.
        w = (("writer", "__transaction_log_0"),)
        assert s[(f"{p}_bufferedwriter_batch_records_count", w)] >= 1
        assert s[(f"{p}_bufferedwriter_flush_trigger_max_delay_total", w)] >= 0
        assert still_open in [i.txn_id for i in tc.list_transactions()]

        tc.close()
        closed = True
        s = scrape(registry)
        assert not [k for k in s if dict(k[1]).get("coordinator") == "0"]
        assert not [k for k in s if dict(k[1]).get("writer") == "__transaction_log_0"]
    finally:
        if not closed:
            tc.close()


def test_two_coordinators_each_labelled(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    tcs = [TransactionCoordinator.open(tmp_path, i, registry=registry) for i in (0, 1)]
    try:
        tcs[1].commit(tcs[1].new_transaction())
        s = scrape(registry)
        assert tc_value(s, "txnstream_txn_tc_committed_total", "0") == 0
        assert tc_value(s, "txnstream_txn_tc_committed_total", "1") == 1
        writers = {dict(k[1]).get("writer") for k in s} - {None}
        assert writers == {"__transaction_log_0", "__transaction_log_1"}
    finally:
        for tc in tcs:
            tc.close()
