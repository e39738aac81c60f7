"""Durable high-water mark of a coordinator's transaction sequence.

TxnID sequences must never go back, also across restarts, even when every
log record was deleted because every transaction ended. The coordinator
reserves ids in blocks: before issuing an id at or above the reserved mark
it durably raises the mark by ``block`` (one fsync per block, not per
transaction). After a restart issuing resumes at the mark, so ids may jump
forward but never repeat.

The mark lives in ``<data_dir>/coordinators/<tc_id>/max_local_txn_id`` as
ASCII digits, replaced atomically (write temp, fsync, rename, fsync dir), so
other processes (Spark readers) can read it too. Every directory created on
the way is made durable by fsyncing its parent: otherwise a power loss could
drop the directory, and with it the mark, and ids would repeat once the log
is trimmed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

from txnstream.errors import CorruptEntryError, StorageError


def fsync_dir(path: Path) -> None:
    """Make the entries of directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs_durable(path: Path) -> None:
    """Create ``path`` and missing parents, fsyncing the parent of each one created."""
    missing: list[Path] = []
    at = path
    while not at.is_dir():
        missing.append(at)
        if at.parent == at:
            break
        at = at.parent
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:
            if not d.is_dir():
                raise
        fsync_dir(d.parent)


class SequenceStore(Protocol):
    """Durable storage of the reserved-sequence mark."""

    def load(self) -> int:
        """Return the reserved mark (0 when never reserved)."""

    def store(self, mark: int) -> None:
        """Durably replace the mark."""


class InMemorySequence:
    """A :class:`SequenceStore` in memory (tests; survives only the process)."""

    def __init__(self) -> None:
        self.mark = 0
        self.stores = 0

    def load(self) -> int:
        """Return the mark."""
        return self.mark

    def store(self, mark: int) -> None:
        """Replace the mark."""
        self.mark = mark
        self.stores += 1


class SequenceFile:
    """The reserved-sequence mark of one coordinator."""

    def __init__(self, directory: str | os.PathLike[str], tc_id: int) -> None:
        self.dir = Path(directory) / "coordinators" / str(tc_id)
        self.path = self.dir / "max_local_txn_id"
        try:
            make_dirs_durable(self.dir)
        except OSError as exc:
            raise StorageError(
                f"cannot create {self.dir}: {exc}", path=str(self.dir), errno=exc.errno
            ) from exc

    def load(self) -> int:
        """Return the reserved mark (0 when never reserved)."""
        try:
            text = self.path.read_text(encoding="ascii")
        except FileNotFoundError:
            return 0
        except (OSError, UnicodeDecodeError) as exc:
            raise StorageError(f"cannot read {self.path}: {exc}", path=str(self.path)) from exc
        try:
            value = int(text.strip())
            if value < 0:
                raise ValueError
        except ValueError:
            raise CorruptEntryError(
                f"{self.path} does not hold a sequence number: {text[:40]!r}",
                path=str(self.path),
            ) from None
        return value

    def store(self, mark: int) -> None:
        """Durably replace the mark with ``mark``."""
        tmp = self.path.with_suffix(".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, f"{mark}\n".encode("ascii"))
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            fsync_dir(self.dir)
        except OSError as exc:
            raise StorageError(
                f"cannot persist sequence mark to {self.path}: {exc}",
                path=str(self.path),
                errno=exc.errno,
            ) from exc


__all__ = ["InMemorySequence", "SequenceFile", "SequenceStore", "fsync_dir", "make_dirs_durable"]
