"""Transaction coordinator benchmarks (SPEC §6), side by side in one run.

Run: ``.venv/bin/pytest benches/test_coordinator.py --benchmark-only``

- ``tc-throughput-c<N>``: committed durable transactions/s (new -> add
  partition -> add subscription -> commit), N client threads, batching on vs
  off (off = baseline).
- ``tc-throughput-c256`` also holds the bulk API (``new_transactions`` /
  ``add_*_many`` / ``end_transactions``) at the same 256 transactions in
  flight: 4 client threads x 64 transactions per call; and the asyncio
  front end (``tc.aio()``) with 256 tasks on one event loop.
- ``tc-recovery``: reopening a coordinator whose log holds 1M records
  (batched + unbatched entries, deleted batch indexes mixed in) vs the same
  fold with per-record Python protobuf parsing (baseline).
- ``tc-idempotent``: latency of a repeated commit answered by the
  terminated-transaction store vs the first commit (baseline).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from txnstream import frame, proto
from txnstream._native import BufferedWriter, ManagedLedger, TxnPosition
from txnstream.coordinator import TransactionCoordinator, TxnStatus, log_name
from txnstream.coordinator.state import CURSOR, SequenceFile

TXNS_PER_ROUND = {True: 6_000, False: 600}


def run_threads(client: Callable[[int], None], n: int, errors: list[BaseException]) -> None:
    """Run ``client(k)`` on ``n`` threads; re-raise the first error a client hit."""
    ts = [threading.Thread(target=client, args=(k,)) for k in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]


def run_clients(tc: TransactionCoordinator, threads: int, total: int) -> None:
    per = max(1, total // threads)
    errors: list[BaseException] = []

    def client(k: int) -> None:
        try:
            for _ in range(per):
                txn = tc.new_transaction(timeout_ms=60_000)
                tc.add_produced_partitions(txn, [f"out-{k % 8}"])
                tc.add_acked_subscriptions(txn, [("in", f"sub-{k % 4}")])
                tc.end_transaction(txn, "commit")
        except BaseException as exc:
            errors.append(exc)

    run_threads(client, threads, errors)


@pytest.mark.parametrize("concurrency", [1, 16, 256])
@pytest.mark.parametrize("batching", [True, False], ids=["batched", "unbatched"])
def test_commit_throughput(
    benchmark: Any, tmp_path: Path, concurrency: int, batching: bool
) -> None:
    benchmark.group = f"tc-throughput-c{concurrency}"
    total = TXNS_PER_ROUND[batching]
    if concurrency == 1:
        total //= 4
    total = max(concurrency, total // concurrency * concurrency)
    benchmark.extra_info.update(items=total, baseline=not batching, concurrency=concurrency)
    tc = TransactionCoordinator.open(tmp_path, 0, batched_write_enabled=batching)
    try:
        benchmark.pedantic(run_clients, args=(tc, concurrency, total), rounds=3, iterations=1)
        stats = tc.stats()
        benchmark.extra_info["committed"] = stats["committed"]
        benchmark.extra_info["log"] = {
            k: v for k, v in stats["log"].items() if isinstance(v, int | float)
        }
    finally:
        tc.close()


BULK_THREADS, BULK_PER_CALL = 4, 64


def run_bulk_clients(tc: TransactionCoordinator, total: int) -> None:
    """The same transactions through the bulk API: 4 threads x 64 per call."""
    rounds = max(1, total // (BULK_THREADS * BULK_PER_CALL))
    errors: list[BaseException] = []

    def client(k: int) -> None:
        try:
            for _ in range(rounds):
                txns = tc.new_transactions(BULK_PER_CALL, timeout_ms=60_000)
                refused = tc.add_produced_partitions_many([(t, [f"out-{k % 8}"]) for t in txns])
                refused += tc.add_acked_subscriptions_many(
                    [(t, [("in", f"sub-{k % 4}")]) for t in txns]
                )
                assert not any(refused), refused
                ends = tc.end_transactions([(t, "commit") for t in txns])
                assert all(e is TxnStatus.COMMITTED for e in ends), ends
        except BaseException as exc:
            errors.append(exc)

    run_threads(client, BULK_THREADS, errors)


def test_commit_throughput_bulk(benchmark: Any, tmp_path: Path) -> None:
    benchmark.group = "tc-throughput-c256"
    per_round = BULK_THREADS * BULK_PER_CALL
    total = 40_000 // per_round * per_round
    benchmark.extra_info.update(items=total, concurrency=per_round, api="bulk")
    tc = TransactionCoordinator.open(tmp_path, 0, batched_write_enabled=True)
    try:
        benchmark.pedantic(run_bulk_clients, args=(tc, total), rounds=3, iterations=1)
        done = tc.stats()["committed"]
        assert done > 0
        assert done % total == 0
    finally:
        tc.close()


def run_async_clients(tc: TransactionCoordinator, tasks: int, total: int) -> None:
    """The same transactions as ``tasks`` asyncio tasks on one event loop."""
    aio = tc.aio()
    per = max(1, total // tasks)

    async def client(k: int) -> None:
        for _ in range(per):
            txn = await aio.new_transaction(timeout_ms=60_000)
            await aio.add_produced_partitions(txn, [f"out-{k % 8}"])
            await aio.add_acked_subscriptions(txn, [("in", f"sub-{k % 4}")])
            await aio.end_transaction(txn, "commit")

    async def main() -> None:
        await asyncio.gather(*(client(k) for k in range(tasks)))

    asyncio.run(main())


def test_commit_throughput_async(benchmark: Any, tmp_path: Path) -> None:
    benchmark.group = "tc-throughput-c256"
    total = 40_000 // 256 * 256
    benchmark.extra_info.update(items=total, concurrency=256, api="asyncio")
    tc = TransactionCoordinator.open(tmp_path, 0, batched_write_enabled=True)
    try:
        benchmark.pedantic(run_async_clients, args=(tc, 256, total), rounds=3, iterations=1)
        assert tc.stats()["live"] == 0
    finally:
        tc.close()


# ---------------------------------------------------------------- recovery

RECOVERY_RECORDS = int(os.environ.get("TXNSTREAM_BENCH_RECOVERY_RECORDS", 1_000_000))


def _rec(op: Any, seq: int, **kw: Any) -> bytes:
    return proto.TransactionMetadataEntry(
        metadata_op=op, txnid_least_bits=seq, txnid_most_bits=0, **kw
    ).SerializeToString()


def build_log(directory: Path, records: int) -> dict[str, int]:
    """Write ``records`` log records: 4 per transaction; half the transactions
    ended (their batch indexes deleted), the rest open; every 8th entry unbatched."""
    ml = ManagedLedger.open(str(directory), log_name(0))
    cursor = ml.open_cursor(CURSOR)
    writer = BufferedWriter(ml, max_records=512, max_delay_ms=5)
    t = proto.TransactionMetadataEntry
    txns = records // 4
    start = time.time_ns() // 1_000_000  # open transactions must not time out on recovery
    futures = []
    for seq in range(txns):
        recs = [
            _rec(
                t.NEW,
                seq,
                new_status=proto.OPEN,
                timeout_ms=3_600_000,
                start_time=start,
                max_local_txn_id=seq,
                client_name=f"c{seq % 100}",
            ),
            _rec(t.ADD_PARTITION, seq, partitions=[f"out-{seq % 16}"]),
            _rec(
                t.ADD_SUBSCRIPTION,
                seq,
                subscriptions=[proto.Subscription(topic="in", subscription=f"s{seq % 4}")],
            ),
            _rec(
                t.UPDATE,
                seq,
                expected_status=proto.OPEN,
                new_status=proto.COMMITTING if seq % 2 else proto.ABORTING,
            ),
        ]
        if seq % 2 == 0:
            recs[-1] = _rec(t.UPDATE, seq, expected_status=proto.OPEN, new_status=proto.OPEN)
        writer.set_batch_enabled(seq % 8 != 0)
        futures.append(writer.write_many(recs))
    deletes: list[TxnPosition] = []
    for seq, fut in enumerate(futures):
        positions = fut.result()
        if seq % 2:  # ended: delete all four of its records
            deletes.extend(positions)
    cursor.delete(deletes)
    cursor.flush()
    writer.close()
    ml.close()
    # As a coordinator does before it issues an id (it refuses a written log
    # without this mark: ids would repeat).
    SequenceFile(directory, 0).store(txns)
    return {"txns": txns, "open": (txns + 1) // 2, "deleted_records": len(deletes)}


@pytest.fixture(scope="module")
def recovery_log() -> Iterator[tuple[Path, dict[str, int]]]:
    root = Path(tempfile.mkdtemp(prefix="tc-recovery-"))
    info = build_log(root, RECOVERY_RECORDS)
    yield root, info
    shutil.rmtree(root, ignore_errors=True)


def test_recovery_1m(benchmark: Any, recovery_log: tuple[Path, dict[str, int]]) -> None:
    src, info = recovery_log
    benchmark.group = "tc-recovery"
    benchmark.extra_info.update(items=RECOVERY_RECORDS, **info)
    work = Path(tempfile.mkdtemp(prefix="tc-recovery-run-"))

    def setup() -> tuple[tuple[Path], dict[str, Any]]:
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(src, work)
        return (work,), {}

    def recover(path: Path) -> None:
        tc = TransactionCoordinator.open(path, 0, default_timeout_ms=3_600_000)
        assert tc.stats()["open"] == info["open"]
        tc.close()

    try:
        benchmark.pedantic(recover, setup=setup, rounds=3, iterations=1)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def python_fold(path: Path) -> int:
    """Baseline: the same fold with one upb protobuf parse per record in Python."""
    ml = ManagedLedger.open(str(path), log_name(0))
    cursor = ml.open_cursor(CURSOR)
    cursor.rewind()
    live: dict[int, list[Any]] = {}
    ended: set[int] = set()
    while True:
        got = cursor.read_next(4096)
        if not got:
            break
        for pos, entry in got:
            acks = cursor.batch_ack_set(pos)
            for i, raw in enumerate(frame.decode_entry(entry)):
                if acks is not None and not acks.get(i):
                    continue
                m = proto.TransactionMetadataEntry.FromString(raw)
                seq = m.txnid_least_bits
                if m.metadata_op == m.NEW:
                    live[seq] = [m.timeout_ms, m.start_time, m.client_name, [], []]
                elif m.metadata_op == m.ADD_PARTITION and seq in live:
                    live[seq][3].extend(m.partitions)
                elif m.metadata_op == m.ADD_SUBSCRIPTION and seq in live:
                    live[seq][4].extend((s.topic, s.subscription) for s in m.subscriptions)
                elif m.metadata_op == m.UPDATE and m.new_status in (proto.COMMITTED, proto.ABORTED):
                    ended.add(seq)
    ml.close()
    return len(live) - len(ended & live.keys())


def test_recovery_1m_python_baseline(
    benchmark: Any, recovery_log: tuple[Path, dict[str, int]]
) -> None:
    src, info = recovery_log
    benchmark.group = "tc-recovery"
    benchmark.extra_info.update(items=RECOVERY_RECORDS, baseline=True)
    open_txns = benchmark.pedantic(python_fold, args=(src,), rounds=1, iterations=1)
    assert open_txns == info["open"]


# ----------------------------------------------------------- idempotent retry


@pytest.fixture
def store_tc(tmp_path: Path) -> Iterator[TransactionCoordinator]:
    tc = TransactionCoordinator.open(tmp_path, 0, transaction_meta_persist_count=100)
    yield tc
    tc.close()


def test_first_commit_latency(benchmark: Any, store_tc: TransactionCoordinator) -> None:
    benchmark.group = "tc-idempotent"
    benchmark.extra_info.update(items=1, baseline=True)

    def setup() -> tuple[tuple[Any], dict[str, Any]]:
        txn = store_tc.new_transaction(client_name="bench")
        store_tc.add_produced_partitions(txn, ["out"])
        return (txn,), {}

    benchmark.pedantic(store_tc.commit, setup=setup, rounds=200, iterations=1)


def test_idempotent_retry_latency(benchmark: Any, store_tc: TransactionCoordinator) -> None:
    benchmark.group = "tc-idempotent"
    benchmark.extra_info.update(items=1)
    txn = store_tc.new_transaction(client_name="bench")
    store_tc.add_produced_partitions(txn, ["out"])
    store_tc.commit(txn)
    result = benchmark(store_tc.commit, txn)
    assert result.name == "COMMITTED"
