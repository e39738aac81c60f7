"""Local aborted-transaction indexes of topic ledgers, written as aborts happen.

One file per (topic, ledger) under ``<data dir>/txnidx/``: the index header,
then one 68-byte record per ABORT marker (SPEC §3.4; format in
``rust/core/src/tiered/aborted_index.rs``). The transaction buffer appends a
record when it writes an ABORT marker, with the exact first position of the
transaction and the last-stable position at that moment. Appends are not
synced: the index is derived data. It is never trusted blindly: the
offloader checks it against the ABORT markers actually in the ledger and
rebuilds it from them when it is missing, damaged or stale.
"""

from __future__ import annotations

import os
import threading
import urllib.parse
from collections.abc import Mapping
from pathlib import Path

from txnstream._native import AbortedTxnIndex, Position
from txnstream.errors import CorruptIndexError, InvalidArgumentError, StorageError
from txnstream.tiered.remote import (
    NAME_MAX,
    hashed_topic_part,
    int_arg,
    position_arg,
    topic_arg,
    topic_part,
)

#: Directory of the index files inside a data directory.
INDEX_DIR = "txnidx"
_SUFFIX = ".txnidx"
#: ``@<ledger id>.txnidx`` is 9 to 27 bytes (ids below 2**63: at most 19 digits).
_SHORTEST, _LONGEST = len("@0" + _SUFFIX), len("@" + "9" * 19 + _SUFFIX)


def _file_parts(topic: str) -> tuple[str, ...]:
    # Every form ``path`` may give a topic's files: quoted if it fits with
    # some ledger id, hashed if it does not fit with some (see topic_part).
    quoted = urllib.parse.quote(topic, safe="")
    parts: tuple[str, ...] = (quoted,) if len(quoted) + _SHORTEST <= NAME_MAX else ()
    if len(quoted) + _LONGEST > NAME_MAX:
        parts += (hashed_topic_part(topic),)
    return parts


class TopicTxnIndexes:
    """The local aborted-transaction index files of a data directory."""

    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        if not isinstance(data_dir, str | os.PathLike):
            raise InvalidArgumentError(
                f"data_dir must be a path, not {type(data_dir).__name__}", argument="data_dir"
            )
        self._dir = Path(data_dir) / INDEX_DIR
        self._lock = threading.Lock()
        self._open: dict[tuple[str, int], AbortedTxnIndex] = {}
        # topic -> the bound of its last prune (files below it are gone).
        self._pruned: dict[str, int] = {}
        #: Directory listings made by :meth:`prune_many` (a count for tests).
        self.listings = 0

    def path(self, topic: str, ledger_id: int) -> Path:
        """Return the index file of one topic ledger."""
        topic_arg(topic)
        int_arg(ledger_id, "ledger_id")
        suffix = f"@{ledger_id}{_SUFFIX}"
        return self._dir / f"{topic_part(topic, room=len(suffix))}{suffix}"

    def append(
        self,
        topic: str,
        txn: tuple[int, int],
        first: Position | tuple[int, int],
        last: Position | tuple[int, int],
        last_stable: Position | tuple[int, int],
    ) -> None:
        """Record an aborted transaction whose ABORT marker is at ``last``."""
        topic_arg(topic)
        first = position_arg(first, "first")
        last = position_arg(last, "last")
        last_stable = position_arg(last_stable, "last_stable")
        key = (topic, last.ledger_id)
        with self._lock:
            index = self._open.get(key)
            path = self.path(topic, last.ledger_id)
            if index is None:
                # Aborts go to the topic's newest ledger: older ones are closed
                # and need no cached index (memory: one index per topic).
                for k in [k for k in self._open if k[0] == topic]:
                    del self._open[k]
                index = self._load_or_new(path, last.ledger_id)
                self._open[key] = index
            record = index.append(txn, first, last, last_stable)
            try:
                with open(path, "ab") as f:
                    f.write(record)
            except OSError as e:
                # Memory holds a record the file does not: forget it, so the
                # next append starts from the file (the offloader rebuilds an
                # index that misses a marker).
                del self._open[key]
                raise StorageError(f"append to {path} failed: {e}", errno=e.errno) from e

    def _load_or_new(self, path: Path, ledger_id: int) -> AbortedTxnIndex:
        try:
            return AbortedTxnIndex.decode(path.read_bytes())
        except (FileNotFoundError, CorruptIndexError):
            pass
        except OSError as e:
            raise StorageError(f"reading {path} failed: {e}", errno=e.errno) from e
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
            path.write_bytes(AbortedTxnIndex.encode_header(ledger_id))
        except OSError as e:
            raise StorageError(f"creating {path} failed: {e}", errno=e.errno) from e
        return AbortedTxnIndex(ledger_id)

    def load(self, topic: str, ledger_id: int) -> AbortedTxnIndex | None:
        """Return the index of one ledger, or None when it is missing or damaged."""
        path = self.path(topic, ledger_id)
        with self._lock:
            try:
                return AbortedTxnIndex.decode(path.read_bytes())
            except (FileNotFoundError, CorruptIndexError):
                return None
            except OSError as e:
                raise StorageError(f"reading {path} failed: {e}", errno=e.errno) from e

    def forget(self, topic: str) -> None:
        """Drop what is cached for ``topic`` (unloaded): its files stay, read again on use."""
        with self._lock:
            for k in [k for k in self._open if k[0] == topic]:
                del self._open[k]
            self._pruned.pop(topic, None)

    def prune(self, topic: str, below_ledger: int) -> int:
        """Delete the index files of ``topic``'s ledgers below ``below_ledger`` (trimmed)."""
        return self.prune_many({topic_arg(topic): int_arg(below_ledger, "below_ledger")})

    def prune_many(self, bounds: Mapping[str, int]) -> int:
        """:meth:`prune` for many topics with at most one directory listing.

        ``bounds`` maps topics to their first live ledger. A topic whose
        bound did not move since its last prune is skipped, so a maintenance
        round over many idle topics lists nothing; otherwise the directory
        is listed once for all of them (not once per topic).
        """
        if not isinstance(bounds, Mapping):
            raise InvalidArgumentError(
                f"bounds must be a mapping of topics to ledger ids, not {type(bounds).__name__}",
                argument="bounds",
            )
        with self._lock:
            todo: dict[str, tuple[str, int]] = {}
            for topic, below in bounds.items():
                topic_arg(topic)
                int_arg(below, "below_ledger")
                if self._pruned.get(topic, -1) < below:
                    for part in _file_parts(topic):
                        todo[part] = (topic, below)
            if not todo:
                return 0
            n = 0
            self.listings += 1
            try:
                entries = list(os.scandir(self._dir))
            except FileNotFoundError:
                entries = []
            for entry in entries:
                quoted, at, rest = entry.name.rpartition("@")
                if not at or not rest.endswith(_SUFFIX) or quoted not in todo:
                    continue
                topic, below = todo[quoted]
                try:
                    lid = int(rest[: -len(_SUFFIX)])
                except ValueError:
                    continue
                if lid < below:
                    self._open.pop((topic, lid), None)
                    Path(entry.path).unlink(missing_ok=True)
                    n += 1
            for topic, below in todo.values():
                self._pruned[topic] = below
        return n
