"""SQLite baseline of the consume-transform-produce benchmark (SPEC §6, issue 10 §11).

What a Python user would otherwise pick for an embedded durable queue: SQLite in WAL
mode with ``synchronous=FULL`` (every COMMIT waits for the WAL to be synced), doing
the unit txnstream does — receive one, send one, ack, commit — in one database
transaction:

    BEGIN IMMEDIATE
    UPDATE delivery SET consumed = 1 WHERE grp = :g AND input_id =
        (SELECT first input not yet consumed by group :g) RETURNING input_id
    SELECT value FROM input WHERE id = :input_id
    INSERT INTO output (input_id, value) VALUES (:input_id, transform(value))
    COMMIT

``BEGIN IMMEDIATE`` takes SQLite's single write lock up front (a deferred
transaction that reads and then writes can fail with ``SQLITE_BUSY`` that no busy
timeout helps). Each thread has its own connection; ``SQLITE_BUSY`` waits in SQLite's
busy handler up to ``busy_timeout_ms`` and is then retried by us and counted.

Run: ``.venv/bin/pytest benches/test_ctp_sqlite.py --benchmark-only`` (group ``ctp``:
threads at concurrency 1, 16 and 64, and one connection in a loop, the
single-writer figure; the best of them is marked ``baseline``, so txnstream's CTP
benchmarks in group ``ctp`` are reported as ratios to it). As a function:
:func:`sqlite_ctp` for one configuration, :func:`sqlite_ctp_all` for all four; as a
script, ``.venv/bin/python benches/test_ctp_sqlite.py 5`` prints medians of 5
interleaved runs of each.

Durable waits: SQLite does not count its syncs; by design WAL + FULL syncs the WAL
once per COMMIT, plus the WAL and database file at each checkpoint (every 1000 WAL
pages by default). ``benches/RESULTS.md`` has a count taken with ``strace -f -c``.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest

GROUP = "ctp"
#: Units per round: txnstream's CTP benchmarks use the same so the ratios compare rounds.
CTP_UNITS = 2_000
SMOKE_UNITS = 200  # under --benchmark-disable (make test): a correctness pass only
PAYLOAD_BYTES = 100
ROUNDS = 3
CONCURRENCY = (1, 16, 64)

SCHEMA = """
CREATE TABLE input (id INTEGER PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE delivery (
    grp TEXT NOT NULL, input_id INTEGER NOT NULL, consumed INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (grp, input_id)
) WITHOUT ROWID;
CREATE INDEX delivery_pending ON delivery (grp, input_id) WHERE consumed = 0;
CREATE TABLE output (id INTEGER PRIMARY KEY, input_id INTEGER NOT NULL, value BLOB NOT NULL);
"""
TAKE = (
    "UPDATE delivery SET consumed = 1 WHERE grp = ?1 AND input_id = "
    "(SELECT input_id FROM delivery WHERE grp = ?1 AND consumed = 0 ORDER BY input_id LIMIT 1) "
    "RETURNING input_id"
)


@dataclass(frozen=True)
class CtpFigures:
    """One configuration's run: throughput, latency and contention."""

    engine: str
    mode: str  # "threads" or "single-writer"
    concurrency: int
    units: int
    seconds: float
    units_per_s: float
    commit_p50_ms: float  # the COMMIT statement (WAL sync included)
    commit_p99_ms: float
    unit_p50_ms: float  # BEGIN to COMMIT done, busy waits included
    unit_p99_ms: float
    busy_retries: int  # units retried after SQLITE_BUSY outlasted the busy timeout
    durable_waits_per_unit: float | None = None  # not counted by SQLite itself

    @property
    def name(self) -> str:
        """``sqlite-threads-c16`` and the like."""
        suffix = "single-writer" if self.mode == "single-writer" else f"threads-c{self.concurrency}"
        return f"{self.engine}-{suffix}"


def transform(value: bytes) -> bytes:
    """The derived output value (the same transform the txnstream side applies)."""
    return b"out:" + value[::-1]


def connect(path: Path, busy_timeout_ms: int = 5_000) -> sqlite3.Connection:
    """A connection as the benchmark uses it: autocommit (explicit BEGIN), FULL sync."""
    conn = sqlite3.connect(
        path, timeout=busy_timeout_ms / 1000, isolation_level=None, check_same_thread=False
    )
    conn.execute("PRAGMA synchronous=FULL")
    conn.create_function("ctp_transform", 1, transform, deterministic=True)
    return conn


def prepare(path: Path, units: int, group: str = GROUP) -> Path:
    """A new WAL database at ``path`` holding ``units`` inputs not yet consumed by ``group``."""
    conn = connect(path)
    try:
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode != "wal":
            raise RuntimeError(f"{path}: journal_mode is {mode!r}, not 'wal'")
        conn.executescript(SCHEMA)
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO input (id, value) VALUES (?, ?)",
            ((i, i.to_bytes(8, "big") * (PAYLOAD_BYTES // 8)) for i in range(units)),
        )
        conn.executemany(
            "INSERT INTO delivery (grp, input_id) VALUES (?, ?)", ((group, i) for i in range(units))
        )
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return path


def _is_busy(error: sqlite3.OperationalError) -> bool:
    code = getattr(error, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


@dataclass
class _Tally:
    units: int = 0
    retries: int = 0
    commit: list[float] = field(default_factory=list)
    unit: list[float] = field(default_factory=list)
    error: BaseException | None = None


def consume_until_empty(conn: sqlite3.Connection, tally: _Tally, group: str = GROUP) -> None:
    """Run units on ``conn`` until no input is left for ``group``."""
    while True:
        t0 = time.perf_counter()
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                row = conn.execute(TAKE, (group,)).fetchone()
                if row is None:
                    conn.execute("ROLLBACK")
                    return
                (value,) = conn.execute("SELECT value FROM input WHERE id = ?", row).fetchone()
                conn.execute(
                    "INSERT INTO output (input_id, value) VALUES (?, ?)", (row[0], transform(value))
                )
                t1 = time.perf_counter()
                conn.execute("COMMIT")
                t2 = time.perf_counter()
                break
            except sqlite3.OperationalError as e:
                if not _is_busy(e):
                    raise
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                tally.retries += 1
        tally.units += 1
        tally.commit.append(t2 - t1)
        tally.unit.append(t2 - t0)


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else 0.0


def run_units(path: Path, concurrency: int, single_writer: bool = False) -> CtpFigures:
    """Drain the prepared database at ``path`` with ``concurrency`` threads (or one loop)."""
    if single_writer and concurrency != 1:
        raise ValueError(f"single-writer runs one connection, not {concurrency}")
    conns = [connect(path) for _ in range(concurrency)]
    tallies = [_Tally() for _ in range(concurrency)]
    try:
        if single_writer:
            start = time.perf_counter()
            consume_until_empty(conns[0], tallies[0])
            seconds = time.perf_counter() - start
        else:
            barrier = threading.Barrier(concurrency + 1)

            def work(conn: sqlite3.Connection, tally: _Tally) -> None:
                barrier.wait()
                try:
                    consume_until_empty(conn, tally)
                except BaseException as e:
                    tally.error = e

            threads = [
                threading.Thread(target=work, args=(c, t), daemon=True)
                for c, t in zip(conns, tallies, strict=True)
            ]
            for t in threads:
                t.start()
            barrier.wait()
            start = time.perf_counter()
            for t in threads:
                t.join()
            seconds = time.perf_counter() - start
            for tally in tallies:
                if tally.error is not None:
                    raise tally.error
    finally:
        for c in conns:
            c.close()
    commit = [x for t in tallies for x in t.commit]
    unit = [x for t in tallies for x in t.unit]
    units = sum(t.units for t in tallies)
    return CtpFigures(
        engine="sqlite",
        mode="single-writer" if single_writer else "threads",
        concurrency=concurrency,
        units=units,
        seconds=seconds,
        units_per_s=units / seconds,
        commit_p50_ms=_percentile(commit, 0.50) * 1e3,
        commit_p99_ms=_percentile(commit, 0.99) * 1e3,
        unit_p50_ms=_percentile(unit, 0.50) * 1e3,
        unit_p99_ms=_percentile(unit, 0.99) * 1e3,
        busy_retries=sum(t.retries for t in tallies),
    )


def verify(path: Path, group: str = GROUP) -> None:
    """Every input consumed once, one output each, derived from it (after a run)."""
    conn = connect(path)
    try:
        _verify(conn, group)
    finally:
        conn.close()


def _verify(conn: sqlite3.Connection, group: str) -> None:
    left = conn.execute(
        "SELECT COUNT(*) FROM delivery WHERE grp = ? AND consumed = 0", (group,)
    ).fetchone()[0]
    inputs, outputs, distinct = conn.execute(
        "SELECT (SELECT COUNT(*) FROM input), COUNT(*), COUNT(DISTINCT input_id) FROM output"
    ).fetchone()
    wrong = conn.execute(
        "SELECT COUNT(*) FROM output o JOIN input i ON i.id = o.input_id "
        "WHERE o.value != ctp_transform(i.value)"
    ).fetchone()[0]
    if left or outputs != inputs or distinct != inputs or wrong:
        raise RuntimeError(
            f"CTP run not exactly-once: {left} inputs left, {outputs} outputs for {inputs} "
            f"inputs ({distinct} distinct), {wrong} outputs not derived from their input"
        )


def sqlite_ctp(directory: Path, concurrency: int, units: int = CTP_UNITS) -> CtpFigures:
    """One configuration on a fresh database in ``directory``; concurrency 0 = single writer."""
    path = prepare(directory / f"ctp-{concurrency}-{time.monotonic_ns()}.db", units)
    figures = run_units(path, max(concurrency, 1), single_writer=concurrency == 0)
    verify(path)
    return figures


def sqlite_ctp_all(directory: Path, units: int = CTP_UNITS, reps: int = 1) -> list[CtpFigures]:
    """Threads at 1, 16 and 64 and the single writer (concurrency 0), ``reps`` times.

    The configurations take turns (1, 16, 64, single, 1, 16, ...), so a disk shared
    with other work slows them alike rather than whichever ran during a busy spell.
    """
    return [sqlite_ctp(directory, c, units) for _ in range(reps) for c in (*CONCURRENCY, 0)]


def main() -> None:
    """``python benches/test_ctp_sqlite.py [reps] [units]``: medians of interleaved runs."""
    import sys
    import tempfile

    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    units = int(sys.argv[2]) if len(sys.argv) > 2 else CTP_UNITS
    with tempfile.TemporaryDirectory(prefix="ctp-sqlite-") as d:
        runs = sqlite_ctp_all(Path(d), units, reps)
    print(f"{reps} interleaved runs of {units} units each; median (min-max)")
    print("| config | units/s | commit p50 ms | commit p99 ms | unit p99 ms | busy retries |")
    print("|---|---|---|---|---|---|")
    for name in dict.fromkeys(f.name for f in runs):
        mine = [f for f in runs if f.name == name]

        def med(attr: str, mine: list[CtpFigures] = mine) -> str:
            xs = sorted(getattr(f, attr) for f in mine)
            return f"{xs[len(xs) // 2]:,.{0 if attr == 'units_per_s' else 2}f}"

        rates = sorted(f.units_per_s for f in mine)
        print(
            f"| {name} | {med('units_per_s')} ({rates[0]:,.0f}-{rates[-1]:,.0f}) "
            f"| {med('commit_p50_ms')} | {med('commit_p99_ms')} | {med('unit_p99_ms')} "
            f"| {sum(f.busy_retries for f in mine)} |"
        )


if __name__ == "__main__":
    main()


# ---------------------------------------------------------------------------- benches


@pytest.fixture(scope="module")
def sqlite_rows() -> Iterator[list[Any]]:
    """The SQLite benchmarks of this module; afterwards the fastest is marked the baseline."""
    rows: list[Any] = []
    yield rows
    measured = [b for b in rows if getattr(b, "stats", None) is not None]
    if measured:
        best = min(measured, key=lambda b: b.stats.stats.median)  # same units per round
        best.extra_info["baseline"] = True


@pytest.mark.parametrize(
    "concurrency", [*CONCURRENCY, 0], ids=lambda c: f"threads-c{c}" if c else "single-writer"
)
def test_ctp_sqlite(
    benchmark: Any, tmp_path: Path, concurrency: int, sqlite_rows: list[Any]
) -> None:
    benchmark.group = "ctp"
    units = SMOKE_UNITS if benchmark.disabled else CTP_UNITS
    figures: list[CtpFigures] = []

    def setup() -> tuple[tuple[Path], dict[str, Any]]:
        # Named by round: the round before this one has appended its figures.
        return (prepare(tmp_path / f"round{len(figures)}.db", units),), {}

    def unit_round(path: Path) -> None:
        figures.append(run_units(path, max(concurrency, 1), single_writer=concurrency == 0))

    benchmark.pedantic(unit_round, setup=setup, rounds=ROUNDS, iterations=1)
    for n in range(len(figures)):
        verify(tmp_path / f"round{n}.db")
    assert figures
    assert all(f.units == units for f in figures)
    median = sorted(figures, key=lambda f: f.units_per_s)[len(figures) // 2]
    benchmark.extra_info.update(items=units, **asdict(median))
    sqlite_rows.append(benchmark)
