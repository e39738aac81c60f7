"""txnstream's consume-transform-produce benchmark (SPEC §6, issue 10 §11), group ``ctp``.

The unit is the one ``benches/test_ctp_sqlite.py`` runs on SQLite: receive one input,
send one output derived from it, ack the input, commit — exactly once, through the
client a user writes against:

    msg = consumer.receive(timeout_ms)               # shared subscription "ctp" on "in"
    txn = client.transaction()
    producer.send(transform(msg.value), txn=txn)     # to "out"
    consumer.ack(msg, txn=txn)
    txn.commit()                                     # durable and visible on return

at concurrency 1, 16 and 64, through the sync API (one thread per unit stream, each
with its own consumer and producer) and the asyncio API (``client.aio()``: one event
loop, one task per stream). Every round starts from a fresh data directory seeded with
the inputs (untimed, as SQLite's database is), and is checked afterwards: every input
acknowledged, one output per input, derived from it.

Recorded per benchmark (``extra_info``): ``items`` (units per round), units/s,
p50/p99 of ``commit()`` and of the whole unit, and the durable waits per transaction
as the engine counts them (``Transaction.durable_waits``: the commit phases that found
a write not yet durable; docs/architecture.md, "at most three"): mean and max.

Units per round: ``TXNSTREAM_CTP_UNITS`` (env), else SQLite's ``CTP_UNITS`` when
measuring, so the side-by-side table's "x vs baseline" compares rounds of equal
work (a different count still gives comparable items/s), and ``SMOKE_UNITS`` under
``--benchmark-disable`` (``make test``: a correctness pass only).

Run with the baseline (the SQLite module marks its best configuration ``baseline``):
``.venv/bin/pytest benches/test_ctp.py benches/test_ctp_sqlite.py --benchmark-only``.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest
from test_ctp_sqlite import CTP_UNITS, PAYLOAD_BYTES, ROUNDS, SMOKE_UNITS, transform

from txnstream import Broker
from txnstream.client import Client, Consumer, Producer
from txnstream.client.aio import AsyncClient, AsyncConsumer, AsyncProducer

GROUP = "ctp"
UNITS_ENV = "TXNSTREAM_CTP_UNITS"
CONCURRENCY = (1, 16, 64)
APIS = ("sync", "asyncio")
IN, OUT, SUB = "in", "out", "ctp"
POLL_MS = 20  # a stream with nothing to take polls this long, then checks if all are done
ROUND_DEADLINE_S = 600.0


def bench_units(disabled: bool) -> int:
    """Units per round (see the module docstring)."""
    raw = os.environ.get(UNITS_ENV)
    if raw:
        units = int(raw)
        if units < 1:
            raise ValueError(f"{UNITS_ENV} must be a positive int, got {raw!r}")
        return units
    return SMOKE_UNITS if disabled else CTP_UNITS


def payload(i: int) -> bytes:
    """Input ``i`` (the same bytes SQLite's inputs hold)."""
    return i.to_bytes(8, "big") * (PAYLOAD_BYTES // 8)


@dataclass(frozen=True)
class TxnCtpFigures:
    """One round: throughput, latency and durable waits."""

    engine: str
    api: str
    concurrency: int
    units: int
    seconds: float
    units_per_s: float
    commit_p50_ms: float
    commit_p99_ms: float
    unit_p50_ms: float
    unit_p99_ms: float
    durable_waits_per_txn: float
    durable_waits_max: int


@dataclass
class _Tally:
    commit: list[float] = field(default_factory=list)
    unit: list[float] = field(default_factory=list)
    waits: list[int] = field(default_factory=list)
    error: BaseException | None = None


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else 0.0


def _figures(
    api: str, concurrency: int, units: int, seconds: float, tallies: list[_Tally]
) -> TxnCtpFigures:
    commit = [x for t in tallies for x in t.commit]
    unit = [x for t in tallies for x in t.unit]
    waits = [w for t in tallies for w in t.waits]
    return TxnCtpFigures(
        engine="txnstream",
        api=api,
        concurrency=concurrency,
        units=len(unit),
        seconds=seconds,
        units_per_s=len(unit) / seconds,
        commit_p50_ms=_percentile(commit, 0.50) * 1e3,
        commit_p99_ms=_percentile(commit, 0.99) * 1e3,
        unit_p50_ms=_percentile(unit, 0.50) * 1e3,
        unit_p99_ms=_percentile(unit, 0.99) * 1e3,
        durable_waits_per_txn=sum(waits) / len(waits) if waits else 0.0,
        durable_waits_max=max(waits, default=0),
    )


def prepare(data: Path, units: int) -> Path:
    """A new data directory with ``units`` durable inputs on ``in`` (one entry each)."""
    with Broker.open(data, registry=None) as broker:
        producer = broker.client("seed").producer(IN)
        futures = [producer.send_async(payload(i)) for i in range(units)]
        for f in futures:
            f.result(timeout=120)
    return data


class _Round:
    """An open broker on a prepared directory with ``concurrency`` streams."""

    def __init__(self, data: Path, concurrency: int, units: int) -> None:
        self.data = data
        self.units = units
        self.concurrency = concurrency
        self.broker = Broker.open(data, registry=None)
        self.client: Client = self.broker.client("ctp-bench")
        self.consumers: list[Consumer] = [
            self.client.subscribe(IN, SUB) for _ in range(concurrency)
        ]
        self.producers: list[Producer] = [self.client.producer(OUT) for _ in range(concurrency)]
        self.done = 0
        self.lock = threading.Lock()
        self.finished = threading.Event()

    def count_one(self) -> None:
        with self.lock:
            self.done += 1
            if self.done >= self.units:
                self.finished.set()

    def close(self) -> None:
        self.broker.close()


def _sync_stream(r: _Round, consumer: Consumer, producer: Producer, tally: _Tally) -> None:
    deadline = time.monotonic() + ROUND_DEADLINE_S
    client = r.client
    while not r.finished.is_set():
        if time.monotonic() > deadline:
            raise TimeoutError(f"round not done after {ROUND_DEADLINE_S} s ({r.done} units)")
        t0 = time.perf_counter()
        msg = consumer.receive(POLL_MS)
        if msg is None:
            continue
        txn = client.transaction()
        producer.send(transform(msg.value), txn=txn)
        consumer.ack(msg, txn=txn)
        t1 = time.perf_counter()
        txn.commit()
        t2 = time.perf_counter()
        tally.commit.append(t2 - t1)
        tally.unit.append(t2 - t0)
        tally.waits.append(txn.durable_waits)
        r.count_one()


def run_sync(r: _Round) -> TxnCtpFigures:
    """Drain ``r`` with one thread per stream (the sync API)."""
    tallies = [_Tally() for _ in range(r.concurrency)]
    barrier = threading.Barrier(r.concurrency + 1)

    def work(i: int) -> None:
        barrier.wait()
        try:
            _sync_stream(r, r.consumers[i], r.producers[i], tallies[i])
        except BaseException as e:
            tallies[i].error = e
            r.finished.set()

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(r.concurrency)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join(ROUND_DEADLINE_S + 60)
        if t.is_alive():
            raise TimeoutError("a benchmark thread did not finish")
    seconds = time.perf_counter() - start
    for tally in tallies:
        if tally.error is not None:
            raise tally.error
    return _figures("sync", r.concurrency, r.units, seconds, tallies)


async def _async_stream(
    r: _Round,
    aclient: AsyncClient,
    consumer: AsyncConsumer,
    producer: AsyncProducer,
    tally: _Tally,
) -> None:
    deadline = time.monotonic() + ROUND_DEADLINE_S
    while not r.finished.is_set():
        if time.monotonic() > deadline:
            raise TimeoutError(f"round not done after {ROUND_DEADLINE_S} s ({r.done} units)")
        t0 = time.perf_counter()
        msg = await consumer.receive(POLL_MS)
        if msg is None:
            continue
        txn = aclient.transaction()
        await producer.send(transform(msg.value), txn=txn)
        await consumer.ack(msg, txn=txn)
        t1 = time.perf_counter()
        await txn.commit()
        t2 = time.perf_counter()
        tally.commit.append(t2 - t1)
        tally.unit.append(t2 - t0)
        tally.waits.append(txn.durable_waits)
        r.count_one()


def run_asyncio(r: _Round) -> TxnCtpFigures:
    """Drain ``r`` with one asyncio task per stream (``client.aio()``)."""
    aclient = r.client.aio()
    consumers = [AsyncConsumer(aclient, c) for c in r.consumers]
    producers = [AsyncProducer(p) for p in r.producers]
    tallies = [_Tally() for _ in range(r.concurrency)]

    async def main() -> float:
        start = time.perf_counter()
        await asyncio.wait_for(
            asyncio.gather(
                *(
                    _async_stream(r, aclient, c, p, t)
                    for c, p, t in zip(consumers, producers, tallies, strict=True)
                )
            ),
            ROUND_DEADLINE_S + 60,
        )
        return time.perf_counter() - start

    seconds = asyncio.run(main())
    return _figures("asyncio", r.concurrency, r.units, seconds, tallies)


def verify(data: Path, units: int) -> None:
    """Every input acknowledged, one output per input, derived from it (after a round)."""
    with Broker.open(data, registry=None) as broker:
        client = broker.client("verify")
        left = client.subscribe(IN, SUB).receive(0)
        outputs: list[bytes] = []
        reader = client.subscribe(OUT, "verify")
        while (m := reader.receive(200)) is not None:
            outputs.append(bytes(m.value))
    want = sorted(transform(payload(i)) for i in range(units))
    if left is not None or sorted(outputs) != want:
        raise RuntimeError(
            f"CTP round not exactly-once: input left: {left is not None}; "
            f"{len(outputs)} outputs for {units} inputs ({len(set(outputs))} distinct)"
        )


def txnstream_ctp(directory: Path, api: str, concurrency: int, units: int) -> TxnCtpFigures:
    """One round on a fresh directory in ``directory`` (checked), as a function."""
    data = prepare(directory / f"ctp-{api}-{concurrency}-{time.monotonic_ns()}", units)
    r = _Round(data, concurrency, units)
    try:
        figures = run_sync(r) if api == "sync" else run_asyncio(r)
    finally:
        r.close()
    verify(data, units)
    return figures


def one_round(api: str, concurrency: int, units: int, *, count_calls: bool = False) -> None:
    """Print one txnstream round's units/s and process CPU per unit (user, system).

    For profilers (``perf record``, ``perf stat``, ``py-spy``) wrapped around
    ``python benches/test_ctp.py one API CONCURRENCY UNITS``: the CPU figures
    cover the timed part only, not seeding or the check. ``count_calls``
    (``python benches/test_ctp.py calls asyncio CONCURRENCY UNITS``): also the
    Python function calls per unit made on the event loop's thread (cProfile's
    count, which is stable where seconds are not; the profiler slows the round,
    so its units/s mean nothing then).
    """
    import cProfile
    import pstats
    import tempfile

    if count_calls and api != "asyncio":
        raise SystemExit("calls counts the event loop's thread: asyncio only")
    profile = cProfile.Profile() if count_calls else None
    with tempfile.TemporaryDirectory(prefix="ctp-") as d:
        r = _Round(prepare(Path(d) / "data", units), concurrency, units)
        try:
            before = os.times()
            if profile is not None:
                profile.enable()
            f = run_sync(r) if api == "sync" else run_asyncio(r)
            if profile is not None:
                profile.disable()
            after = os.times()
        finally:
            r.close()
        verify(r.data, units)
    user = (after.user - before.user) / units * 1e6
    system = (after.system - before.system) / units * 1e6
    print(
        f"{api} c{concurrency}: {f.units_per_s:,.0f} units/s; CPU per unit: user {user:.0f} us, "
        f"system {system:.0f} us; durable waits per commit: max {f.durable_waits_max}"
    )
    if profile is not None:
        calls = pstats.Stats(profile).total_calls  # type: ignore[attr-defined]
        print(f"event-loop thread: {calls / units:,.0f} Python calls per unit")


def main() -> None:
    """``python benches/test_ctp.py [reps] [units]``: interleaved medians, both engines.

    Each repetition runs every configuration of both engines in turn (SQLite's four,
    then txnstream's six), so a disk whose fsync latency swings with other work on
    the machine slows them alike; pytest's run takes the modules one after the other.
    ``python benches/test_ctp.py one API CONCURRENCY UNITS`` runs one txnstream
    round instead (:func:`one_round`).
    """
    import sys
    import tempfile

    from test_ctp_sqlite import CtpFigures, sqlite_ctp_all

    if len(sys.argv) == 5 and sys.argv[1] in ("one", "calls"):
        one_round(
            sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), count_calls=sys.argv[1] == "calls"
        )
        return
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    units = int(sys.argv[2]) if len(sys.argv) > 2 else CTP_UNITS
    rows: dict[str, list[TxnCtpFigures | CtpFigures]] = {}
    with tempfile.TemporaryDirectory(prefix="ctp-") as d:
        for _ in range(reps):
            for sq in sqlite_ctp_all(Path(d), units):
                rows.setdefault(sq.name, []).append(sq)
            for api in APIS:
                for c in CONCURRENCY:
                    t = txnstream_ctp(Path(d), api, c, units)
                    rows.setdefault(f"txnstream-{api}-c{c}", []).append(t)
    med = {name: sorted(fs, key=lambda f: f.units_per_s)[len(fs) // 2] for name, fs in rows.items()}
    best = max(f.units_per_s for name, f in med.items() if name.startswith("sqlite"))
    print(f"{reps} interleaved runs of {units} units each; median units/s; SQLite best {best:,.0f}")
    print("| config | units/s | x SQLite best | commit p50 ms | commit p99 ms | waits/txn |")
    print("|---|---|---|---|---|---|")
    for name, m in med.items():
        waits = getattr(m, "durable_waits_per_txn", None)
        print(
            f"| {name} | {m.units_per_s:,.0f} | {m.units_per_s / best:.2f} "
            f"| {m.commit_p50_ms:.2f} | {m.commit_p99_ms:.2f} "
            f"| {'-' if waits is None else f'{waits:.2f}'} |"
        )


if __name__ == "__main__":
    main()


# ---------------------------------------------------------------------------- benches


@pytest.fixture
def rounds() -> Iterator[list[_Round]]:
    """Brokers of this benchmark's rounds, closed at the end whatever happens."""
    opened: list[_Round] = []
    yield opened
    for r in opened:
        r.close()


@pytest.mark.parametrize("concurrency", CONCURRENCY, ids=lambda c: f"c{c}")
@pytest.mark.parametrize("api", APIS)
def test_ctp_txnstream(
    benchmark: Any, tmp_path: Path, api: str, concurrency: int, rounds: list[_Round]
) -> None:
    benchmark.group = GROUP
    units = bench_units(benchmark.disabled)
    figures: list[TxnCtpFigures] = []

    def setup() -> tuple[tuple[_Round], dict[str, Any]]:
        if rounds:
            rounds[-1].close()  # the previous round's broker (untimed)
        data = prepare(tmp_path / f"round{len(rounds)}", units)
        rounds.append(_Round(data, concurrency, units))
        return (rounds[-1],), {}

    def unit_round(r: _Round) -> None:
        figures.append(run_sync(r) if api == "sync" else run_asyncio(r))

    benchmark.pedantic(unit_round, setup=setup, rounds=ROUNDS, iterations=1)
    for r in rounds:
        r.close()
        verify(r.data, units)
    assert figures
    assert all(f.units == units for f in figures)
    median = sorted(figures, key=lambda f: f.units_per_s)[len(figures) // 2]
    benchmark.extra_info.update(items=units, **asdict(median))
    benchmark.extra_info["durable_waits_max_all_rounds"] = max(f.durable_waits_max for f in figures)
