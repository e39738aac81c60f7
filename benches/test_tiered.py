"""READ_COMMITTED scans over remote segments, with and without KIP-1058's flag.

Side by side in one run, per segment count (group ``tiered-<n>-segments``):
the baseline reads metadata written without ``txn_idx_empty`` (as before
KIP-1058: every segment's aborted-txn index is fetched); the other reads
the same segments with the flag set (no aborts: no index is fetched). The
remote is a directory with a per-call latency injected (``TIERED_LATENCY_MS``,
default 2 ms) to stand in for object storage. Each round uses a new reader
(cold caches). ``extra_info`` records the remote calls of one scan by kind.

Segment counts: ``TIERED_SEGMENTS`` (default ``10``; the RESULTS run uses ``10,100,1000``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from txnstream import ManagedLedger, Position
from txnstream._native import encode_message
from txnstream.testing import remote_latency, set_remote_call_hook
from txnstream.tiered import Offloader, RemoteLogMetadataManager, RemoteStorage, TieredReader

TOPIC = "persistent://public/default/tiered-bench"
SEGMENTS = [int(s) for s in os.environ.get("TIERED_SEGMENTS", "10").split(",")]
LATENCY_MS = float(os.environ.get("TIERED_LATENCY_MS", "2"))
PER_LEDGER = 8


@pytest.fixture(scope="module", params=SEGMENTS, ids=lambda n: f"{n}seg")
def offloaded(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    n: int = request.param
    root = tmp_path_factory.mktemp(f"tiered{n}")
    ml = ManagedLedger.open(root / "data", TOPIC, max_entries_per_ledger=PER_LEDGER)
    for k in range(n + 1):  # one call per ledger: a call's entries stay in one ledger
        ml.append_many(
            [encode_message(b"v" * 100, "p", k * PER_LEDGER + i, 1_000) for i in range(PER_LEDGER)]
        )
    out: dict[str, Any] = {"n": n, "messages": n * PER_LEDGER}
    assert sum(1 for _, c, sealed in ml.ledgers() if sealed and c) == n
    for flag in (True, False):
        log = ManagedLedger.open(root / "data", f"__remote_log_metadata_{flag}")
        remote = RemoteStorage(root / f"remote-{flag}")
        rlmm = RemoteLogMetadataManager(log, remote)
        off = Offloader(remote, rlmm, write_txn_idx_flag=flag)
        for lid, count, sealed in ml.ledgers():
            if sealed and count:
                off.offload(ml, lid)
        out[str(flag)] = (remote, rlmm, log)
    yield out
    for flag in (True, False):
        out[str(flag)][2].close()
    ml.close()


def _scan(offloaded: dict[str, Any], flag: bool, benchmark: Any, baseline: bool) -> None:
    remote, rlmm, _ = offloaded[str(flag)]
    set_remote_call_hook(remote, remote_latency(LATENCY_MS))
    calls: dict[str, int] = {}

    def scan() -> int:
        before = remote.calls()
        reader = TieredReader(remote, rlmm)
        end = Position(1 << 62, 0)  # no transaction is open: everything is readable
        n = sum(1 for _ in reader.read_committed(TOPIC, max_read_position=end, aborted=()))
        after = remote.calls()
        calls.update({k: after[k] - before[k] for k in after})
        return n

    n = benchmark.pedantic(scan, rounds=3 if offloaded["n"] >= 1000 else 5, iterations=1)
    set_remote_call_hook(remote, None)
    assert n == offloaded["messages"]
    assert calls["segment"] == offloaded["n"]
    assert calls["txn_index"] == (0 if flag else offloaded["n"])
    benchmark.extra_info.update(
        items=n,
        segments=offloaded["n"],
        latency_ms=LATENCY_MS,
        **{f"calls_{k}": v for k, v in calls.items()},
    )
    if baseline:
        benchmark.extra_info["baseline"] = True


def test_read_committed_without_flag(benchmark: Any, offloaded: dict[str, Any]) -> None:
    benchmark.group = f"tiered-{offloaded['n']}-segments"
    _scan(offloaded, False, benchmark, baseline=True)


def test_read_committed_with_txn_idx_empty(benchmark: Any, offloaded: dict[str, Any]) -> None:
    benchmark.group = f"tiered-{offloaded['n']}-segments"
    _scan(offloaded, True, benchmark, baseline=False)
