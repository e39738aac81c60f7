"""Small files replaced atomically and durably (temp file, fsync, rename, directory fsync).

For the few plain files txnstream keeps beside its ledgers: remote-segment
files of the local tiered store, the dynamic settings ``txnstream admin``
persists, and (their own variant, with fault hooks) the coordinators'
sequence marks. A reader sees the old file or the new one, never a mix;
once the call returns, a power cut keeps the new one.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Make the entries of directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs_durably(directory: Path) -> None:
    """Create ``directory`` and its missing parents, each new one's parent fsynced.

    ``os.makedirs`` alone leaves new directories' entries in the page cache:
    a power cut could take a data directory, with everything acknowledged in
    it, away with them.
    """
    missing: list[Path] = []
    at = directory
    while not at.exists():
        missing.append(at)
        if at.parent == at:
            break
        at = at.parent
    for d in reversed(missing):
        d.mkdir(exist_ok=True)
        fsync_dir(d.parent)
    if not directory.is_dir():  # it existed, as a file (mkdir would have said so)
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(directory))


def temporary_path(path: Path) -> Path:
    """Return the temp file :func:`write_atomically` writes ``path`` through."""
    return path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")


def is_own_temporary(name: str) -> bool:
    """Tell whether ``name`` is a temp file of :func:`write_atomically` made by this process."""
    parts = name.removesuffix(".tmp").rsplit(".", 2)  # .<name>, <pid>, <ns>
    return name.endswith(".tmp") and len(parts) == 3 and parts[1] == str(os.getpid())


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically and durably (creating its parents durably).

    The temp file is ``.<name>.<pid>.<ns>.tmp`` beside it, created with
    ``O_EXCL | O_NOFOLLOW`` (no symlink is followed, no other writer's temp
    file is reused). Raises ``OSError``; the temp file is removed then.
    """
    make_dirs_durably(path.parent)
    tmp = temporary_path(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


__all__ = ["fsync_dir", "write_atomically"]
