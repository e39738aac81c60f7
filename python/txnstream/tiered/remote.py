"""Remote storage for offloaded segments: a directory by default, any fsspec URL.

Every call is counted by kind (``segment``, ``offset_index``, ``txn_index``,
``metadata``) so tests and benchmarks can show exactly how many remote calls
a read made, and admin stats and Prometheus export the same counts.

Objects of one upload are named ``<topic>/<ledger_id>-<segment_id>.<suffix>``.
A directory remote writes each object to a temporary name, syncs it and
renames it into place, then syncs the directory: an object that exists is
complete. fsspec URLs rely on the store's own atomic put (object stores are).
"""

from __future__ import annotations

import hashlib
import os
import threading
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Final, TypeVar

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from txnstream._native import Position, crc32c
from txnstream.durable_file import is_own_temporary, make_dirs_durably, write_atomically
from txnstream.errors import CorruptEntryError, InvalidArgumentError, StorageError
from txnstream.metrics import remote_store_families

#: Kinds of remote calls, as counted and exported.
KINDS: Final = ("segment", "offset_index", "txn_index", "metadata")
#: Object-name suffix of each kind of uploaded object.
SUFFIX: Final = {"segment": "data", "offset_index": "offsets", "txn_index": "txnidx"}


_T = TypeVar("_T")


def int_arg(value: object, name: str, low: int = 0, high: int = (1 << 63) - 1) -> int:
    """Check an int argument in ``low..high`` (bools are not ints here)."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidArgumentError(f"{name} must be an int in {low}..{high}, got {value!r}")
    return value


def instance_arg(value: _T, name: str, kind: type[Any]) -> _T:
    """Check that argument ``name`` is a ``kind`` (typed error naming it otherwise)."""
    if not isinstance(value, kind):
        raise InvalidArgumentError(
            f"{name} must be a {kind.__name__}, not {type(value).__name__}",
            argument=name,
            value=repr(value)[:200],
        )
    return value


def position_arg(value: object, name: str) -> Position:
    """Check a position argument: a :class:`Position` or a ``(ledger_id, entry_id)`` pair."""
    if isinstance(value, Position):
        return value
    if isinstance(value, tuple) and len(value) == 2:
        return Position(int_arg(value[0], f"{name}[0]"), int_arg(value[1], f"{name}[1]"))
    raise InvalidArgumentError(
        f"{name} must be a Position or a (ledger_id, entry_id) pair, got {value!r}"
    )


def topic_arg(topic: object) -> str:
    """Check a topic (managed ledger) name argument: a non-empty str."""
    if not isinstance(topic, str) or not topic:
        raise InvalidArgumentError(f"topic must be a non-empty str, got {topic!r}")
    return topic


#: Longest file name (bytes) the file systems we run on allow.
NAME_MAX: Final = 255


def topic_part(topic: str, room: int = 0) -> str:
    """Return ``topic`` as (part of) one file-name component.

    Percent-quoted, as always, when that and ``room`` more bytes fit in
    :data:`NAME_MAX`: every name that could be written before keeps its
    form, so existing files and objects are found. Longer (a topic name of
    224 escaped bytes can quote to 700: ``:`` and non-ASCII letters take
    three bytes each): :func:`hashed_topic_part`.
    """
    quoted = urllib.parse.quote(topic, safe="")
    if len(quoted) + room <= NAME_MAX:
        return quoted
    return hashed_topic_part(topic)


def hashed_topic_part(topic: str) -> str:
    """Return the quoted name's first 120 bytes, ``..`` and a hash of the whole (154 bytes)."""
    quoted = urllib.parse.quote(topic, safe="")
    digest = hashlib.sha256(topic.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{quoted[:120]}..{digest}"


def object_name(topic: str, ledger_id: int, segment_id: str, kind: str) -> str:
    """Return the remote object name of one part of an upload."""
    if kind not in SUFFIX:
        raise InvalidArgumentError(f"kind must be one of {sorted(SUFFIX)}, got {kind!r}")
    topic_arg(topic)
    int_arg(ledger_id, "ledger_id")
    if not isinstance(segment_id, str) or not segment_id:
        raise InvalidArgumentError(f"segment_id must be a non-empty str, got {segment_id!r}")
    return f"{topic_part(topic)}/{ledger_id}-{segment_id}.{SUFFIX[kind]}"


class RemoteStorage:
    """A remote store of segment objects, with every call counted by kind.

    ``location`` is a directory path or an fsspec URL (``memory://bucket``,
    ``s3://...`` with the matching fsspec backend installed).
    """

    def __init__(self, location: str | os.PathLike[str]) -> None:
        try:
            text = os.fspath(location)
        except TypeError:
            text = None
        if not isinstance(text, str) or not text:
            raise InvalidArgumentError(
                f"remote location must be a non-empty path or URL, got {location!r}"
            )
        self._lock = threading.Lock()
        self._calls: Counter[str] = Counter()
        self._bytes: Counter[str] = Counter()
        #: Test hook (``txnstream.testing``): called before every remote call
        #: with its kind and operation; may sleep (latency) or raise (faults).
        self._before_call: Callable[[str, str], None] | None = None
        self._fs: Any = None
        if "://" in text and not text.startswith("file://"):
            try:
                import fsspec  # type: ignore[import-untyped]
            except ImportError as e:  # pragma: no cover - fsspec is a dependency
                raise InvalidArgumentError(f"remote URL {text!r} needs fsspec installed") from e
            try:
                self._fs, root = fsspec.core.url_to_fs(text)
            except (ImportError, ValueError, TypeError) as e:
                raise InvalidArgumentError(
                    f"remote location {text!r}: {e}", argument="location", value=text
                ) from e
            except OSError as e:
                raise StorageError(f"remote location {text!r}: {e}", errno=e.errno) from e
            self._root = str(root).rstrip("/")
        else:
            path = Path(text.removeprefix("file://"))
            self._root = str(path)
            try:
                make_dirs_durably(path)  # objects in it are durable only with it
            except (OSError, ValueError) as e:
                raise StorageError(
                    f"remote location {text!r} is not a usable directory: {e}",
                    errno=getattr(e, "errno", None),
                ) from e
        self.location = text

    # ------------------------------------------------------------ counting

    def calls(self) -> dict[str, int]:
        """Remote calls made so far, by kind (every kind present)."""
        with self._lock:
            return {k: self._calls[k] for k in KINDS}

    def bytes_read(self) -> dict[str, int]:
        """Bytes fetched so far, by kind."""
        with self._lock:
            return {k: self._bytes[k] for k in KINDS}

    def collector(self) -> Collector:
        """Return a Prometheus collector of this store's calls and bytes by kind.

        Metrics: ``txnstream_tiered_remote_calls_total{kind}`` and
        ``txnstream_tiered_remote_read_bytes_total{kind}``, labelled with
        ``remote`` = the location. Register it with a registry of your choice
        (one where no broker exports its tiered storage: the broker's
        collector has these names, and registering raises ``ValueError``).
        """
        return _RemoteCollector(self)

    def _count(self, kind: str, op: str, nbytes: int = 0) -> None:
        hook = self._before_call
        if hook is not None:
            hook(kind, op)
        with self._lock:
            self._calls[kind] += 1
            self._bytes[kind] += nbytes

    # ------------------------------------------------------------ objects

    def _path(self, name: str) -> str:
        # Object names are relative and stay under the root: no '..', no absolute name.
        if (
            not isinstance(name, str)
            or not name
            or name.startswith("/")
            or "\\" in name
            or any(part in ("", ".", "..") for part in name.split("/"))
        ):
            raise InvalidArgumentError(
                f"remote object name must be a relative name under the root, got {name!r}"
            )
        return f"{self._root}/{name}"

    def put(self, name: str, data: bytes, kind: str) -> None:
        """Upload one object (complete or not at all)."""
        path = self._path(name)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidArgumentError(
                f"remote put of {name}: data must be bytes-like, not {type(data).__name__}"
            )
        try:
            self._count(kind, "put")
            if self._fs is not None:
                self._fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
                self._fs.pipe_file(path, data)
                return
            write_atomically(Path(path), data)
        except OSError as e:
            raise StorageError(f"remote put of {name} failed: {e}", errno=e.errno) from e

    def get(self, name: str, kind: str, start: int | None = None, end: int | None = None) -> bytes:
        """Fetch one object, or the byte range ``[start, end)`` of it."""
        for arg, v in (("start", start), ("end", end)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise InvalidArgumentError(f"{arg} must be an int >= 0 or None, got {v!r}")
        if start is not None and end is not None and end < start:
            raise InvalidArgumentError(f"byte range [{start}, {end}) of {name} is reversed")
        try:
            if self._fs is not None:
                data = bytes(self._fs.cat_file(self._path(name), start=start, end=end))
            else:
                with open(self._path(name), "rb") as f:
                    if start:
                        f.seek(start)
                    data = f.read(-1 if end is None else end - (start or 0))
        except FileNotFoundError as e:
            self._count(kind, "get")
            raise StorageError(f"remote object {name} is missing", errno=e.errno) from e
        except OSError as e:
            self._count(kind, "get")
            raise StorageError(f"remote get of {name} failed: {e}", errno=e.errno) from e
        self._count(kind, "get", len(data))
        return data

    def get_segment(
        self,
        name: str,
        *,
        ledger_id: int,
        first_entry: int,
        size_bytes: int | None,
        data_crc32c: int | None,
    ) -> bytes:
        """Fetch segment data ``name`` and check it whole against its metadata.

        A size that differs (data cut short at a frame boundary still decodes,
        to fewer entries) or a crc32c that differs (frames swapped or
        reordered each still pass their own checksum) raises
        :class:`CorruptEntryError`; ``None`` skips a check (metadata from
        before the crc32c was recorded).
        """
        data = self.get(name, "segment")
        if size_bytes is not None and len(data) != size_bytes:
            raise CorruptEntryError(
                f"remote segment {name} holds {len(data)} bytes; its metadata says {size_bytes}",
                position=(ledger_id, first_entry),
                offset=min(len(data), size_bytes),
            )
        if data_crc32c is not None:
            actual = crc32c(data)
            if actual != data_crc32c:
                raise CorruptEntryError(
                    f"remote segment {name}: crc32c of its data is {actual:#010x}; its "
                    f"metadata says {data_crc32c:#010x} (frames damaged, swapped or reordered)",
                    position=(ledger_id, first_entry),
                    offset=0,
                )
        return data

    def delete(self, name: str, kind: str) -> None:
        """Delete one object; a missing object is not an error."""
        try:
            self._count(kind, "delete")
            if self._fs is not None:
                if self._fs.exists(self._path(name)):
                    self._fs.rm_file(self._path(name))
            else:
                Path(self._path(name)).unlink(missing_ok=True)
        except OSError as e:
            raise StorageError(f"remote delete of {name} failed: {e}", errno=e.errno) from e

    def sweep_temporaries(self) -> int:
        """Delete leftovers of interrupted directory writes; return how many.

        A process killed inside :meth:`put` leaves a ``.<name>.<pid>.<ns>.tmp``
        file next to where the object would be (never a partial object).
        This process's own are left alone (a put of it may be writing one),
        so it may run at any time (fsspec stores have none).
        """
        if self._fs is not None:
            return 0
        n = 0
        for tmp in Path(self._root).rglob(".*.tmp"):
            if is_own_temporary(tmp.name):
                continue
            tmp.unlink(missing_ok=True)
            n += 1
        return n


class _RemoteCollector(Collector):
    def __init__(self, remote: RemoteStorage) -> None:
        self._remote = remote

    def describe(self) -> Iterable[Metric]:
        # Registering it where another collector exports these names raises
        # (a repeated family would make Prometheus reject the scrape).
        return remote_store_families(["remote", "kind"])

    def collect(self) -> Iterator[Metric]:
        calls, read = remote_store_families(["remote", "kind"])
        loc = self._remote.location
        for kind, n in self._remote.calls().items():
            calls.add_metric([loc, kind], n)
        for kind, n in self._remote.bytes_read().items():
            read.add_metric([loc, kind], n)
        yield calls
        yield read
