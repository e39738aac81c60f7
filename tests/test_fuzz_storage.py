"""Hypothesis fuzzing of on-disk damage: ledger files, their indexes, the
CATALOG, and journals of crash images of live data directories.

Whatever the damage, opening and reading a managed ledger either fails with a
typed ``TxnStreamError`` or returns entries that are byte-identical to what
was written at those positions — never garbage, never a crash.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

import txnstream as ts

ENTRIES = [bytes([i]) * (i * 37 % 300 + 1) for i in range(40)]
_TEMPLATE: Path | None = None


def template() -> Path:
    """A closed ledger holding ENTRIES (built once, copied per example)."""
    global _TEMPLATE
    if _TEMPLATE is None:
        root = Path(tempfile.mkdtemp(prefix="txnstream-fuzz-"))
        with ts.ManagedLedger.open(root, "log", max_entries_per_ledger=15) as ml:
            # One append_many never spans ledgers: three calls give sealed ledgers too.
            written = [p for i in (0, 15, 30) for p in ml.append_many(ENTRIES[i : i + 15])]
        assert len({p.ledger_id for p in written}) == 3
        _TEMPLATE = root
    return _TEMPLATE


def fresh_copy() -> tuple[Path, Path]:
    root = Path(tempfile.mkdtemp(prefix="txnstream-fuzz-case-"))
    shutil.copytree(template(), root, dirs_exist_ok=True)
    return root, root / "ledgers"


CATALOG = "CATALOG"


def expected() -> dict[tuple[int, int], bytes]:
    with ts.ManagedLedger.open(template(), "log", read_only=True) as ml:
        first, last = ml.first_position, ml.last_position
        assert first is not None and last is not None
        return {(p.ledger_id, p.entry_id): data for p, data in ml.read_range(first, last)}


def note(what: str) -> None:
    """Count an outcome in hypothesis statistics (``--hypothesis-show-statistics``)."""
    if currently_in_test_context():
        event(what)


def check_open(root: Path, *, lossless: bool = False) -> None:
    """Open and read back; with ``lossless``, an open that succeeds must keep every entry."""
    want = expected()
    try:
        with ts.ManagedLedger.open(root, "log") as ml:
            if lossless:
                assert ml.entry_count() == len(ENTRIES), "entries silently lost"
            first, last = ml.first_position, ml.last_position
            if first is None or last is None:
                return
            for p, data in ml.read_range(first, last):
                assert want.get((p.ledger_id, p.entry_id)) == data, f"garbage served at {p}"
        note("opened")
    except ts.TxnStreamError as e:
        note(f"typed error: {type(e).__name__}")  # detected and reported: fine
    finally:
        shutil.rmtree(root, ignore_errors=True)


damage = st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=8)
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(file_index=st.integers(0, 10), flips=damage, index=st.booleans())
def test_damaged_ledger_file_never_serves_garbage(
    file_index: int, flips: list[tuple[int, int]], index: bool
) -> None:
    root, ldir = fresh_copy()
    logs = sorted(ldir.glob("log@*.idx" if index else "log@*.log"))
    target = logs[file_index % len(logs)]
    data = bytearray(target.read_bytes())
    for offset, value in flips:
        data[offset % len(data)] ^= value or 1
    target.write_bytes(bytes(data))
    check_open(root)


@SETTINGS
@given(file_index=st.integers(0, 10), keep=st.floats(0, 1), index=st.booleans())
def test_truncated_ledger_file_never_serves_garbage(
    file_index: int, keep: float, index: bool
) -> None:
    root, ldir = fresh_copy()
    logs = sorted(ldir.glob("log@*.idx" if index else "log@*.log"))
    target = logs[file_index % len(logs)]
    data = target.read_bytes()
    target.write_bytes(data[: int(len(data) * keep)])
    check_open(root)


@SETTINGS
@given(meta=st.binary(max_size=200))
def test_garbage_catalog_is_a_typed_error(meta: bytes) -> None:
    root, _ = fresh_copy()
    (root / CATALOG).write_bytes(meta)
    check_open(root, lossless=True)


@SETTINGS
@given(flips=damage)
def test_damaged_catalog_never_loses_entries_silently(flips: list[tuple[int, int]]) -> None:
    root, _ = fresh_copy()
    data = bytearray((root / CATALOG).read_bytes())
    for offset, value in flips:
        data[offset % len(data)] ^= value or 1
    (root / CATALOG).write_bytes(bytes(data))
    check_open(root, lossless=True)


def test_every_single_bit_flip_of_the_catalog_is_caught() -> None:
    # Exhaustive: the CATALOG is small, and one flip there must never make open drop entries.
    size = len((template() / CATALOG).read_bytes())
    for bit in range(size * 8):
        root, _ = fresh_copy()
        data = bytearray((root / CATALOG).read_bytes())
        data[bit // 8] ^= 1 << (bit % 8)
        (root / CATALOG).write_bytes(bytes(data))
        check_open(root, lossless=True)


# --- crash images of a live directory: damage in the journal -------------------

_LIVE: Path | None = None
LIVE_ENTRIES = [bytes([i % 251]) * (i * 53 % 500 + 1) for i in range(60)]


def live_image() -> Path:
    """A crash image (kill -9 while open): everything acknowledged is in the
    journal, the synced hint says so, nothing is checkpointed."""
    global _LIVE
    if _LIVE is None:
        src = Path(tempfile.mkdtemp(prefix="txnstream-fuzz-live-"))
        ml = ts.ManagedLedger.open(
            src, "log", max_entries_per_ledger=25, checkpoint_interval_ms=3_600_000
        )
        for i in range(0, 60, 5):
            ml.append_many(LIVE_ENTRIES[i : i + 5])
        img = Path(tempfile.mkdtemp(prefix="txnstream-fuzz-img-"))
        shutil.copytree(src, img, dirs_exist_ok=True, ignore=lambda d, n: ["LOCK"])
        ml.close()
        _LIVE = img
    return _LIVE


def check_live_copy(damage_fn: object) -> None:
    """Open a damaged copy: a typed error, or every acknowledged entry intact
    (the synced hint in the image proves they were all acknowledged)."""
    root = Path(tempfile.mkdtemp(prefix="txnstream-fuzz-live-case-"))
    shutil.copytree(live_image(), root, dirs_exist_ok=True)
    seg = sorted((root / "journal").glob("*.wal"))[0]
    damage_fn(seg)  # type: ignore[operator]
    try:
        with ts.ManagedLedger.open(root, "log") as ml:
            first, last = ml.first_position, ml.last_position
            got = [d for _, d in ml.read_range(first, last)] if first and last else []
            assert got == LIVE_ENTRIES, "acknowledged entries lost or changed silently"
        note("opened")
    except ts.TxnStreamError as e:
        note(f"typed error: {type(e).__name__}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


@SETTINGS
@given(flips=damage)
def test_damaged_journal_never_loses_acknowledged_entries(flips: list[tuple[int, int]]) -> None:
    def flip(seg: Path) -> None:
        data = bytearray(seg.read_bytes())
        end = 64 + sum(48 + len(e) for e in LIVE_ENTRIES) + 48 * 8  # records + a margin
        for offset, value in flips:
            data[offset % min(len(data), end)] ^= value or 1
        seg.write_bytes(bytes(data))

    check_live_copy(flip)


@SETTINGS
@given(keep=st.floats(0, 1))
def test_truncated_journal_never_loses_acknowledged_entries(keep: float) -> None:
    def cut(seg: Path) -> None:
        data = seg.read_bytes()
        seg.write_bytes(data[: int(len(data) * keep)])

    check_live_copy(cut)


def test_swapped_ledger_files_are_caught() -> None:
    root, ldir = fresh_copy()
    try:
        logs = sorted(ldir.glob("log@*.log"))
        idxs = sorted(ldir.glob("log@*.idx"))
        a, b = logs[0].read_bytes(), logs[1].read_bytes()
        logs[0].write_bytes(b)
        logs[1].write_bytes(a)
        with ts.ManagedLedger.open(root, "log") as ml, pytest.raises(ts.CorruptLedgerError):
            ml.read_range(ml.first_position, ml.last_position)  # type: ignore[arg-type]
        logs[0].write_bytes(a)
        logs[1].write_bytes(b)
        a, b = idxs[0].read_bytes(), idxs[1].read_bytes()
        idxs[0].write_bytes(b)
        idxs[1].write_bytes(a)
        with ts.ManagedLedger.open(root, "log") as ml, pytest.raises(ts.CorruptLedgerError):
            ml.read_range(ml.first_position, ml.last_position)  # type: ignore[arg-type]
    finally:
        shutil.rmtree(root, ignore_errors=True)
