"""The Spark data source ``txnstream``: topic messages, READ_COMMITTED from the files alone.

::

    spark.read.format("txnstream")
        .option("path", "data/")
        .option("topic", "orders")            # a name, a comma list, or a glob pattern
        .option("isolation", "read_committed")
        .load()

Options (case-insensitive):

``path``
    the data directory (required), opened **read-only**: it may be closed,
    or live while a broker keeps writing.
``topic``
    (required) comma-separated topic names in any form Pulsar accepts
    (``orders``, ``ns/orders``, ``persistent://tenant/ns/orders``, one
    partition ``orders-partition-2``) or ``fnmatch`` patterns over full names
    (``persistent://public/default/orders-*``; a pattern without
    ``persistent://`` gets the defaults a name would get). A partitioned topic
    is read through all its partitions. Patterns leave out system topics
    (local names starting with ``__``); a name that matches no stored topic
    is an error.
``isolation``
    ``read_committed`` (default) or ``read_uncommitted``.
``startingPositions`` / ``endingPositions``
    ``earliest`` / ``latest`` (the defaults), or JSON per partition as
    spark-sql-kafka's offsets: ``{"orders": {"0": "3:17", "1": "earliest"}}``
    with partition ``-1`` for a non-partitioned topic. A position is
    ``"ledger:entry"``, ``[ledger, entry]``, ``"earliest"`` / ``-2`` or
    ``"latest"`` / ``-1``. The starting position is the first entry read
    (inclusive), the ending one the first entry not read (exclusive);
    partitions not named take the default.
``maxEntriesPerPartition``
    Spark partitions are ledgers of topic partitions, split into ranges of
    at most this many entries (default 8192).
``mode``
    ``messages`` (default: the columns below) or ``markers``: one row per
    marker entry (:data:`MARKER_FIELDS`: ``topic``, ``partition``,
    ``ledger_id``, ``entry_id``, ``marker_type``, ``marker`` =
    ``COMMIT``/``ABORT``/the type number, and the transaction id), from the
    Rust entry-metadata scanner (``scan_topic``). ``isolation`` does not
    apply: markers are read to the end seen at planning.
``remote``
    where offloaded segments live (tiered storage, SPEC §4.8): a directory
    or an fsspec URL; default ``<path>/remote``, the broker's default (a
    broker configured with another ``fileSystemURI`` needs it here).

Columns: ``value`` (binary), ``key``, ``topic`` (the topic's full name,
without the partition suffix), ``partition`` (-1: not partitioned),
``ledger_id``, ``entry_id``, ``batch_index``, ``batch_size``,
``publish_time`` (ms since the epoch), ``producer_name``, ``sequence_id``,
``txnid_most_bits`` / ``txnid_least_bits`` (null outside transactions) and
``properties`` (``map<string,string>``, empty when none). 64-bit unsigned
fields are two's complement ``bigint``.

**READ_COMMITTED** is what a READ_COMMITTED consumer of the broker sees,
decided from the files: the driver reads each partition's entry metadata
once (:class:`PartitionScan`, through the Rust ``scan_topic``) and finds the
aborted transactions (ABORT markers) and the transaction buffer's read
limit: the first message of the oldest transaction with no marker yet, or
the end of the log when none is open (Pulsar's ``maxReadPosition``). Every
Spark partition of a read carries that one cut, so tasks agree even while a
broker keeps writing. Markers are never rows; messages of aborted
transactions are dropped; nothing at or after the read limit is read.
**READ_UNCOMMITTED** drops only markers and reads to the end seen at
planning.

**Remote segments.** When the directory has tiered storage (a
``__remote_log_metadata`` ledger), every finished remote segment of a
selected partition whose ledger is no longer local (offloaded, then
trimmed) is one Spark partition, read from remote storage. READ_COMMITTED
drops there the transactions listed by the aborted-transaction indexes of
the partition's remote segments from the range on (a segment whose
metadata says ``txn_idx_empty`` is skipped without a remote call; a damaged
index is replaced, in memory only, by the segment's ABORT markers) and
those aborted by markers in the local ledgers. The read limit comes from
the local ledgers: the broker never trims past the oldest open
transaction's first message while a subscription reads the topic.
Streaming reads and mode ``markers`` read remote segments too.

Tasks read their range with the Rust columnar scan
(:func:`txnstream._native.scan_topic_columns` for a ledger,
:func:`~txnstream._native.scan_segment_columns` for remote segment data:
decode, marker skipping and aborted-transaction filtering in Rust, GIL
released) into numpy arrays and bytes, and wrap them as a
``pyarrow.RecordBatch`` of the schema without copying (``topic`` and
``partition`` are constants): no Python object per message. A damaged
entry fails the task with :class:`~txnstream.errors.CorruptEntryError`
naming its position, as it fails a consumer.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from txnstream._native import (
    ManagedLedger,
    Position,
    decode_segment,
    decode_topic_entry,
    scan_segment_columns,
    scan_topic,
    scan_topic_columns,
)
from txnstream.broker.topic_name import DOMAIN, TopicName
from txnstream.errors import (
    CorruptIndexError,
    InvalidArgumentError,
    InvalidTopicNameError,
    StorageError,
)
from txnstream.spark.columns import arrow_type, fixed_array, string_array, struct_type
from txnstream.tiered.metadata import METADATA_LEDGER, RemoteLogMetadataManager, SegmentInfo
from txnstream.tiered.reader import decode_txn_index
from txnstream.tiered.remote import RemoteStorage, object_name

__all__ = [
    "ISOLATIONS",
    "MARKER_FIELDS",
    "MODES",
    "TOPIC_FIELDS",
    "PartitionScan",
    "TopicDataSource",
    "TopicRange",
    "TopicSelection",
    "TopicStreamReader",
    "read_marker_range",
    "read_topic_range",
    "topic_batch",
    "topic_partitions",
]

READ_COMMITTED = "read_committed"
READ_UNCOMMITTED = "read_uncommitted"
ISOLATIONS = (READ_COMMITTED, READ_UNCOMMITTED)
MESSAGES = "messages"
MARKERS = "markers"
MODES = (MESSAGES, MARKERS)
EARLIEST = "earliest"
LATEST = "latest"
#: Marker types (Pulsar ``PulsarMarkers.proto``): transaction COMMIT and ABORT.
TXN_COMMIT = 21
TXN_ABORT = 22
DEFAULT_MAX_ENTRIES_PER_PARTITION = 8192
#: Entries per metadata scan call (driver) and per bulk read (task).
_SCAN_CHUNK = 4096
_READ_CHUNK = 1024
#: Payload bytes per record batch a task yields (the scan stops past it).
_READ_BYTES = 16 << 20
_U64 = 1 << 64

#: The schema of the data source, in column order.
TOPIC_FIELDS = [
    StructField("value", BinaryType()),
    StructField("key", StringType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("ledger_id", LongType()),
    StructField("entry_id", LongType()),
    StructField("batch_index", IntegerType()),
    StructField("batch_size", IntegerType()),
    StructField("publish_time", LongType()),
    StructField("producer_name", StringType()),
    StructField("sequence_id", LongType()),
    StructField("txnid_most_bits", LongType()),
    StructField("txnid_least_bits", LongType()),
    StructField("properties", MapType(StringType(), StringType())),
]
SCHEMA = struct_type(TOPIC_FIELDS)

#: The schema of mode ``markers``: one row per marker entry.
MARKER_FIELDS = [
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("ledger_id", LongType()),
    StructField("entry_id", LongType()),
    StructField("marker_type", IntegerType()),
    StructField("marker", StringType()),
    StructField("txnid_most_bits", LongType()),
    StructField("txnid_least_bits", LongType()),
]
MARKER_SCHEMA = struct_type(MARKER_FIELDS)

TxnKey = tuple[int, int]
#: An exclusive or inclusive entry position as ``(ledger_id, entry_id)``.
Pos = tuple[int, int]


def _bad(option: str, value: object, why: str) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"option {option} {why}, got {value!r}", argument=option, value=value
    )


def _option(options: Mapping[str, str], name: str) -> str | None:
    value = options.get(name)
    return None if value is None else str(value)


# ---------------------------------------------------------------- positions


def _parse_position(option: str, raw: object) -> Pos | str:
    """``earliest`` / ``latest`` or ``(ledger, entry)`` from one JSON value."""
    # Kafka's -2 / -1; an int only (-2.0 == -2, and True == 1, in Python).
    if raw == EARLIEST or (type(raw) is int and raw == -2):
        return EARLIEST
    if raw == LATEST or (type(raw) is int and raw == -1):
        return LATEST
    parts: list[Any]
    if isinstance(raw, str):
        parts = raw.split(":")
    elif isinstance(raw, list):
        parts = raw
    else:
        raise _bad(
            option, raw, 'positions must be "ledger:entry", [ledger, entry], earliest or latest'
        )
    try:
        if len(parts) != 2 or any(isinstance(p, bool | float) for p in parts):
            raise ValueError
        ledger, entry = int(parts[0]), int(parts[1])
    except (ValueError, TypeError):  # TypeError: [null, 0], [[1], 0], [0, {}]
        raise _bad(
            option, raw, 'positions must be "ledger:entry", [ledger, entry], earliest or latest'
        ) from None
    if not (0 <= ledger < _U64 and 0 <= entry < _U64):
        raise _bad(option, raw, "ledger and entry ids must be in 0..2**64-1")
    return (ledger, entry)


def _parse_positions(
    options: Mapping[str, str], option: str, default: str
) -> tuple[str, dict[tuple[str, int], Pos | str]]:
    """Return the default and the per-partition positions of ``option`` (by topic, index)."""
    raw = _option(options, option)
    if raw is None:
        return default, {}
    text = raw.strip()
    if text.lower() in (EARLIEST, LATEST):
        return text.lower(), {}
    try:
        doc = json.loads(text)
    except ValueError:
        raise _bad(
            option, raw, 'must be earliest, latest or JSON {"topic": {"partition": position}}'
        ) from None
    if not isinstance(doc, dict):
        raise _bad(option, raw, 'must be earliest, latest or JSON {"topic": {"partition": ...}}')
    out: dict[tuple[str, int], Pos | str] = {}
    for topic, parts in doc.items():
        try:
            tn = TopicName.parse(topic)
        except InvalidTopicNameError as e:
            raise _bad(option, topic, f"names a bad topic ({e})") from None
        if tn.is_partition:
            raise _bad(option, topic, 'keys are topics; give the partition as {"N": position}')
        if not isinstance(parts, dict):
            raise _bad(option, parts, f'must map topic {topic!r} to {{"partition": position}}')
        for index, pos in parts.items():
            try:
                n = int(index)
            except ValueError:
                raise _bad(
                    option, index, "partition keys must be integers (-1: unpartitioned)"
                ) from None
            if n < -1:
                raise _bad(option, index, "partition keys must be -1 or more")
            out[(tn.base.full, n)] = _parse_position(option, pos)
    return default, out


def _before(p: Pos) -> Position | None:
    """Return the exclusive ``after`` of ``read_messages`` that starts at ``p`` (inclusive)."""
    ledger, entry = p
    if entry > 0:
        return Position(ledger, entry - 1)
    if ledger > 0:
        return Position(ledger - 1, _U64 - 1)
    return None


# ---------------------------------------------------------------- planning


@dataclass
class PartitionScan:
    """A topic partition's transaction state computed from its entries' metadata.

    :meth:`advance` reads the entries after the last one it saw (so a
    streaming query scans each entry once): ``aborted`` maps each aborted
    transaction to the ledgers holding its messages; ``ongoing`` the
    transactions with no marker yet to their first position, oldest first.
    """

    ledger: str
    last: Pos | None = None
    ongoing: dict[TxnKey, Pos] = field(default_factory=dict)
    aborted: dict[TxnKey, set[int]] = field(default_factory=dict)
    _ledgers_of: dict[TxnKey, set[int]] = field(default_factory=dict)

    def advance(self, ml: ManagedLedger) -> None:
        """Scan every entry of ``ml`` after :attr:`last`."""
        while True:
            after = None if self.last is None else Position(*self.last)
            rows = scan_topic(ml, after, _SCAN_CHUNK)
            if not rows:
                return
            for lid, eid, marker, txn, _producer, _seqs in rows:
                if txn is None:
                    continue
                if marker is not None:
                    if marker in (TXN_COMMIT, TXN_ABORT):
                        self.ongoing.pop(txn, None)
                        ledgers = self._ledgers_of.pop(txn, set())
                        if marker == TXN_ABORT:
                            self.aborted.setdefault(txn, set()).update(ledgers)
                    continue
                if txn in self.aborted:
                    # Appends after an end are refused by the broker; stay safe anyway.
                    self.aborted[txn].add(lid)
                    continue
                if txn not in self.ongoing:
                    self.ongoing[txn] = (lid, eid)
                self._ledgers_of.setdefault(txn, set()).add(lid)
            self.last = (rows[-1][0], rows[-1][1])

    @property
    def end(self) -> Pos:
        """Exclusive end of everything scanned (READ_UNCOMMITTED's limit)."""
        return (0, 0) if self.last is None else (self.last[0], self.last[1] + 1)

    @property
    def read_limit(self) -> Pos:
        """READ_COMMITTED's exclusive limit: the oldest open transaction's first message."""
        for first in self.ongoing.values():
            return first
        return self.end

    def aborted_in(self, ledger_id: int) -> frozenset[TxnKey]:
        """Aborted transactions with messages in ``ledger_id``."""
        return frozenset(t for t, ls in self.aborted.items() if ledger_id in ls)


@dataclass(frozen=True)
class TopicRange(InputPartition):
    """One Spark partition: entries ``first_entry..=last_entry`` of one ledger of a partition."""

    ledger: str
    topic: str
    partition: int
    ledger_id: int
    first_entry: int
    last_entry: int
    #: Transactions whose messages are dropped (READ_COMMITTED; empty otherwise).
    aborted: frozenset[TxnKey]
    #: A remote segment's id when the ledger is read from remote storage.
    segment_id: str | None = None
    #: Remote storage location (option ``remote``): of ``segment_id``, or,
    #: for a local range, where its ledger is read from if it was offloaded
    #: and trimmed after the read was planned.
    remote: str | None = None
    #: First entry stored in the remote segment (entries before it were trimmed).
    segment_first_entry: int = 0
    #: The remote segment data's size and crc32c, as its metadata records them
    #: (checked on fetch; None: not known or not recorded).
    segment_size: int | None = None
    segment_crc32c: int | None = None


@dataclass(frozen=True)
class TopicSelection:
    """What a ``txnstream`` read covers: checked options and the matched topic partitions."""

    path: str
    #: Managed-ledger names of the selected partitions, sorted.
    ledgers: tuple[str, ...]
    isolation: str
    starting: tuple[str, dict[tuple[str, int], Pos | str]]
    ending: tuple[str, dict[tuple[str, int], Pos | str]]
    max_entries_per_partition: int
    #: ``messages`` or ``markers`` (option ``mode``).
    mode: str = MESSAGES
    #: Remote storage location (option ``remote``; ``<path>/remote`` by default).
    remote: str = ""

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> TopicSelection:
        """Check ``options`` and list the matching topic partitions of the directory."""
        path = _option(options, "path")
        if not path:
            raise _bad("path", path, "(the data directory) is required")
        if not os.path.isdir(path):
            raise _bad("path", path, "must be an existing data directory")
        raw_isolation = _option(options, "isolation")
        isolation = READ_COMMITTED if raw_isolation is None else raw_isolation.strip().lower()
        if isolation not in ISOLATIONS:
            raise _bad("isolation", raw_isolation, f"must be one of {ISOLATIONS}")
        raw_mode = _option(options, "mode")
        mode = MESSAGES if raw_mode is None else raw_mode.strip().lower()
        if mode not in MODES:
            raise _bad("mode", mode, f"must be one of {MODES}")
        raw_max = _option(options, "maxEntriesPerPartition")
        max_entries = DEFAULT_MAX_ENTRIES_PER_PARTITION
        if raw_max is not None:
            try:
                max_entries = int(raw_max)
            except ValueError:
                max_entries = 0
            if max_entries < 1:
                raise _bad("maxEntriesPerPartition", raw_max, "must be a positive integer")
        starting = _parse_positions(options, "startingPositions", EARLIEST)
        ending = _parse_positions(options, "endingPositions", LATEST)
        spec = _option(options, "topic")
        if not spec or not spec.strip():
            raise _bad("topic", spec, "(a topic name, a comma list or a pattern) is required")
        ledgers = _select(ManagedLedger.names(path), spec)
        known = {_key_of(name) for name in ledgers}
        for option, (_d, explicit) in (
            ("startingPositions", starting),
            ("endingPositions", ending),
        ):
            for topic, index in explicit:
                if (topic, index) not in known:
                    raise _bad(
                        option,
                        {topic: index},
                        "names a partition the option topic does not select "
                        f"(selected: {sorted(known)[:10]})",
                    )
        raw_remote = _option(options, "remote")
        if raw_remote is not None and not raw_remote.strip():
            raise _bad("remote", raw_remote, "must be a directory or an fsspec URL")
        remote = raw_remote.strip() if raw_remote else os.path.join(path, "remote")
        return cls(
            path,
            ledgers,
            isolation,
            starting,
            ending,
            max_entries,
            mode,
            remote,
        )

    @property
    def schema(self) -> StructType:
        """Return the Spark schema of this read (:data:`TOPIC_FIELDS` or :data:`MARKER_FIELDS`)."""
        return MARKER_SCHEMA if self.mode == MARKERS else SCHEMA

    def scan(self, ledger: str) -> tuple[PartitionScan, list[tuple[int, int, bool]]]:
        """Scan one partition's metadata; return the scan and its ledgers."""
        ml = ManagedLedger.open(self.path, ledger, read_only=True)
        try:
            state = PartitionScan(ledger)
            state.advance(ml)
            return state, ml.ledgers()
        finally:
            ml.close()

    def limit(self, state: PartitionScan) -> Pos:
        """Return the exclusive end the isolation allows in ``state`` (markers: the end)."""
        if self.mode == MARKERS or self.isolation != READ_COMMITTED:
            return state.end
        return state.read_limit

    def bounds(
        self,
        state: PartitionScan,
        ledgers: list[tuple[int, int, bool]],
        remote: Sequence[SegmentInfo] = (),
    ) -> tuple[Pos, Pos]:
        """Inclusive start and exclusive end of one partition under the options.

        ``remote``: the partition's segments read from remote storage (they
        come before the local ledgers; with nothing local, their end is the
        partition's end).
        """
        key = _key_of(state.ledger)
        limit = self.limit(state)
        first = self.earliest(ledgers, remote)
        if remote and state.last is None:
            limit = (remote[-1].ledger_id, remote[-1].last_entry + 1)
        start = _resolve(self.starting, key, first, limit)
        end = _resolve(self.ending, key, first, limit)
        return start, min(end, limit)

    def earliest(
        self, ledgers: list[tuple[int, int, bool]], remote: Sequence[SegmentInfo] = ()
    ) -> Pos:
        """Return a partition's first stored position: its first remote segment, or local ledger."""
        if remote:
            return (remote[0].ledger_id, remote[0].first_entry)
        return next(((lid, 0) for lid, n, _ in ledgers if n > 0), (0, 0))

    def ranges(self) -> list[TopicRange]:
        """Return the Spark partitions: ledger ranges of every selected topic partition.

        With tiered storage, remote segments of ledgers no longer stored
        locally come first, one Spark partition each (in both modes: the
        markers of an offloaded, trimmed ledger are read from its segment).
        """
        out: list[TopicRange] = []
        # Local ledgers first, then the remote metadata: a ledger is offloaded
        # before it is trimmed, so one trimmed in between is in the metadata.
        scans = [(ledger, *self.scan(ledger)) for ledger in self.ledgers]
        tiered = _TieredView.open(self)
        for ledger, state, ledgers in scans:
            remote = tiered.remote_segments(ledger, ledgers) if tiered else []
            start, end = self.bounds(state, ledgers, remote)
            if tiered and remote:
                out.extend(tiered.split(self, state, remote, start, end))
            out.extend(self.split(state, ledgers, start, end))
        return out

    def split(
        self, state: PartitionScan, ledgers: list[tuple[int, int, bool]], start: Pos, end: Pos
    ) -> list[TopicRange]:
        """Ledger ranges of ``state``'s partition from ``start`` (inclusive) to ``end``."""
        topic, index = _key_of(state.ledger)
        step = self.max_entries_per_partition
        out: list[TopicRange] = []
        for lid, count, _sealed in ledgers:
            if lid < start[0] or lid > end[0]:
                continue
            lo = start[1] if lid == start[0] else 0
            hi = min(count, end[1] if lid == end[0] else count)
            committed = self.isolation == READ_COMMITTED and self.mode == MESSAGES
            aborted = state.aborted_in(lid) if committed else frozenset()
            for first in range(lo, hi, step):
                last = min(first + step, hi) - 1
                out.append(
                    TopicRange(
                        state.ledger, topic, index, lid, first, last, aborted, remote=self.remote
                    )
                )
        return out


def _is_local(location: str) -> bool:
    return "://" not in location or location.startswith("file://")


class _TieredView:
    """The directory's tiered storage as the driver plans a read: read-only.

    The metadata comes from the ``__remote_log_metadata`` ledger (opened
    read-only, folded once); remote calls are the aborted-transaction
    indexes of segments whose metadata does not say ``txn_idx_empty``.
    """

    def __init__(self, location: str, storage: RemoteStorage, meta: RemoteLogMetadataManager):
        self.location = location
        self.storage = storage
        self.metadata = meta

    @classmethod
    def open(cls, sel: TopicSelection) -> _TieredView | None:
        """Return the view, or None when the directory has no tiered storage."""
        if METADATA_LEDGER not in ManagedLedger.names(sel.path):
            return None
        log = ManagedLedger.open(sel.path, METADATA_LEDGER, read_only=True)
        try:
            if log.first_position is None:
                return None
            if _is_local(sel.remote) and not os.path.isdir(sel.remote.removeprefix("file://")):
                raise _bad(
                    "remote",
                    sel.remote,
                    "names no directory, but the data directory lists remote segments "
                    "(give the broker's fileSystemURI)",
                )
            storage = RemoteStorage(sel.remote)
            return cls(sel.remote, storage, RemoteLogMetadataManager(log, storage))
        finally:
            log.close()

    def remote_segments(
        self, ledger: str, ledgers: list[tuple[int, int, bool]]
    ) -> list[SegmentInfo]:
        """Finished remote segments of partition ``ledger`` whose ledger is not stored locally."""
        local = {lid for lid, n, _ in ledgers if n > 0}
        return [
            s
            for s in self.metadata.segments_uncounted(ledger)
            if s.entry_count > 0 and s.ledger_id not in local
        ]

    def _aborts(self, seg: SegmentInfo) -> list[tuple[TxnKey, Pos, Pos]]:
        """``(txn, first, last)`` of each transaction aborted by a marker in ``seg``.

        From the segment's aborted-transaction index; a damaged one is
        replaced (in memory only: the reader writes nothing) by the segment's
        ABORT markers, with a conservative first position.
        """
        name = object_name(seg.topic, seg.ledger_id, seg.segment_id, "txn_index")
        try:
            index = decode_txn_index(self.storage.get(name, "txn_index"), seg, name)
            return [
                (r[0], (r[1].ledger_id, r[1].entry_id), (r[2].ledger_id, r[2].entry_id))
                for r in index.records()
            ]
        except CorruptIndexError:
            data = self.storage.get_segment(
                object_name(seg.topic, seg.ledger_id, seg.segment_id, "segment"),
                ledger_id=seg.ledger_id,
                first_entry=seg.first_entry,
                size_bytes=seg.size_bytes,
                data_crc32c=seg.data_crc32c,
            )
            out: list[tuple[TxnKey, Pos, Pos]] = []
            for i, entry in enumerate(decode_segment(seg.ledger_id, seg.first_entry, data)):
                d = decode_topic_entry(entry)
                if d["marker_type"] == TXN_ABORT and d["txn"] is not None:
                    out.append((d["txn"], (0, 0), (seg.ledger_id, seg.first_entry + i)))
            return out

    def split(
        self,
        sel: TopicSelection,
        state: PartitionScan,
        remote: Sequence[SegmentInfo],
        start: Pos,
        end: Pos,
    ) -> list[TopicRange]:
        """One Spark partition per remote segment overlapping ``[start, end)``.

        READ_COMMITTED: a segment's range drops the transactions aborted by a
        marker in a remote segment from ``start`` on whose messages overlap
        it (an ABORT marker follows its messages, so earlier segments hold
        none of the range's), and those aborted by a local marker.
        """
        topic, index = _key_of(state.ledger)
        committed = sel.isolation == READ_COMMITTED and sel.mode == MESSAGES
        aborts: list[tuple[TxnKey, Pos, Pos]] = []
        if committed:
            for seg in remote:
                if (seg.ledger_id, seg.last_entry) < start:
                    continue
                if seg.has_txn_idx_flag and seg.txn_idx_empty:
                    continue  # KIP-1058: nothing to fetch
                aborts.extend(self._aborts(seg))
        local = frozenset(state.aborted) if committed else frozenset()
        out: list[TopicRange] = []
        for seg in remote:
            lo = max((seg.ledger_id, seg.first_entry), start)
            hi = min((seg.ledger_id, seg.last_entry + 1), end)
            if lo >= hi:
                continue
            seg_first, seg_last = (seg.ledger_id, lo[1]), (seg.ledger_id, hi[1] - 1)
            dropped = local | {t for t, f, last in aborts if f <= seg_last and last >= seg_first}
            out.append(
                TopicRange(
                    state.ledger,
                    topic,
                    index,
                    seg.ledger_id,
                    lo[1],
                    hi[1] - 1,
                    frozenset(dropped),
                    segment_id=seg.segment_id,
                    remote=self.location,
                    segment_first_entry=seg.first_entry,
                    segment_size=seg.size_bytes,
                    segment_crc32c=seg.data_crc32c,
                )
            )
        return out


def _key_of(ledger: str) -> tuple[str, int]:
    tn = TopicName.parse(ledger)
    return tn.base.full, tn.partition


def _resolve(
    option: tuple[str, dict[tuple[str, int], Pos | str]],
    key: tuple[str, int],
    first: Pos,
    limit: Pos,
) -> Pos:
    default, explicit = option
    pos = explicit.get(key, default)
    if pos == EARLIEST:
        return first
    if pos == LATEST:
        return limit
    assert isinstance(pos, tuple)
    return pos


def topic_partitions(names: Sequence[str], *, system: bool = False) -> list[str]:
    """Return the managed-ledger names among ``names`` that are topic partitions, sorted.

    A partition (or non-partitioned topic) is stored under its full name;
    system topics (local names starting with ``__``) only when ``system``.
    """
    return sorted(
        name
        for name, tn in _topic_ledgers(names).items()
        if system or not tn.local.startswith("__")
    )


def _topic_ledgers(names: Sequence[str]) -> dict[str, TopicName]:
    """Return the stored managed ledgers that are topic partitions (by full name)."""
    out: dict[str, TopicName] = {}
    for name in names:
        if not name.startswith(f"{DOMAIN}://"):
            continue
        try:
            tn = TopicName.parse(name)
        except InvalidTopicNameError:
            continue  # a pending-ack log or another system ledger
        if tn.full == name:
            out[name] = tn
    return out


def _complete(pattern: str) -> str:
    """Give a pattern without a domain the defaults a topic name gets."""
    if "://" in pattern:
        return pattern
    parts = pattern.split("/")
    if len(parts) == 1:
        return f"{DOMAIN}://public/default/{pattern}"
    if len(parts) == 2:
        return f"{DOMAIN}://public/{pattern}"
    return f"{DOMAIN}://{pattern}"


def _unclosed_bracket(pattern: str) -> bool:
    """Return True if a '[' of ``pattern`` has no closing ']' (as ``fnmatch`` reads it)."""
    i, n = 0, len(pattern)
    while i < n:
        if pattern[i] == "[":
            j = i + 1
            if j < n and pattern[j] == "!":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1  # a ']' first in the set is a member
            close = pattern.find("]", j)
            if close < 0:
                return True
            i = close + 1
        else:
            i += 1
    return False


def _select(names: Sequence[str], spec: str) -> tuple[str, ...]:
    """Ledger names of the partitions ``spec`` (the option ``topic``) selects."""
    topics = _topic_ledgers(names)
    chosen: set[str] = set()
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            raise _bad("topic", spec, "holds an empty name")
        if any(c in item for c in "*?["):
            if _unclosed_bracket(item):
                # fnmatch takes an unclosed '[' literally: a query selecting nothing, forever.
                raise _bad("topic", item, "holds a '[' with no closing ']'")
            pattern = _complete(item)
            chosen.update(
                name
                for name, tn in topics.items()
                if not tn.local.startswith("__")
                and (
                    fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(tn.base.full, pattern)
                )
            )
            continue
        try:
            tn = TopicName.parse(item)
        except InvalidTopicNameError as e:
            raise _bad("topic", item, f"holds a bad topic name ({e})") from None
        if tn.is_partition:
            found = [tn.full] if tn.full in topics else []
        else:
            found = [n for n, t in topics.items() if t.base.full == tn.full]
        if not found:
            raise _bad(
                "topic",
                item,
                f"names no topic stored in the directory (topics: {sorted(topics)[:20]})",
            )
        chosen.update(found)
    return tuple(sorted(chosen))


# ---------------------------------------------------------------- reading

_ARROW_SCHEMA: pa.Schema | None = None


def arrow_schema() -> pa.Schema:
    """Return the Arrow schema Spark expects for :data:`TOPIC_FIELDS`."""
    global _ARROW_SCHEMA
    if _ARROW_SCHEMA is None:
        from pyspark.sql.pandas.types import to_arrow_schema

        _ARROW_SCHEMA = to_arrow_schema(SCHEMA)
    return _ARROW_SCHEMA


def topic_batch(topic: str, partition: int, c: Mapping[str, Any]) -> pa.RecordBatch:
    """Wrap the columns of a Rust topic scan as a RecordBatch of :data:`TOPIC_FIELDS`.

    ``c`` is what :func:`~txnstream._native.scan_topic_columns` or
    :func:`~txnstream._native.scan_segment_columns` returns. Numbers are
    viewed in place (``uint64`` as two's complement ``int64``), strings,
    binaries and the properties map reuse the scan's data and offsets;
    ``topic`` and ``partition`` are constant columns.
    """
    n = int(c["rows"])
    i64, i64t = np.int64, pa.int64()
    i32, i32t = np.int32, pa.int32()
    txn_valid = c["txn_valid"]
    props_type = arrow_type(TOPIC_FIELDS[-1].dataType)
    props = pa.MapArray.from_arrays(
        fixed_array(c["property_offsets"], i32, i32t),
        string_array(c["property_keys_data"], c["property_keys_offsets"]),
        string_array(c["property_values_data"], c["property_values_offsets"]),
        type=props_type,
    )
    value_offsets = np.ascontiguousarray(c["value_offsets"], dtype=np.int32)
    arrays = [
        pa.Array.from_buffers(
            pa.binary(),
            n,
            [None, pa.py_buffer(value_offsets), pa.py_buffer(c["value_data"])],
            null_count=0,
        ),
        string_array(c["key_data"], c["key_offsets"], c["key_valid"]),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, i32t), n),
        fixed_array(c["ledger_id"], i64, i64t),
        fixed_array(c["entry_id"], i64, i64t),
        fixed_array(c["batch_index"], i32, i32t),
        fixed_array(c["batch_size"], i32, i32t),
        fixed_array(c["publish_time"], i64, i64t),
        string_array(c["producer_name_data"], c["producer_name_offsets"]),
        fixed_array(c["sequence_id"], i64, i64t),
        fixed_array(c["txnid_most_bits"], i64, i64t, txn_valid),
        fixed_array(c["txnid_least_bits"], i64, i64t, txn_valid),
        props,
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema())


def read_topic_range(path: str, part: TopicRange) -> Iterator[pa.RecordBatch]:
    """Yield the rows of one Spark partition as Arrow record batches (what a task runs).

    A local ledger range is scanned from the data directory (read-only), a
    remote one from its segment's data, fetched with one remote call.
    """
    if part.segment_id is not None:
        yield from _read_segment_range(part)
        return
    ml = ManagedLedger.open(path, part.ledger, read_only=True)
    try:
        after = _before((part.ledger_id, part.first_entry))
        limit = Position(part.ledger_id, part.last_entry + 1)
        aborted = part.aborted or None
        while True:
            c = scan_topic_columns(ml, after, limit, _READ_CHUNK, _READ_BYTES, aborted)
            if c["rows"]:
                yield topic_batch(part.topic, part.partition, c)
            last = c["last"]
            if c["entries"] == 0 or last is None:
                break
            after = last
    finally:
        ml.close()
    if after is not None and after >= Position(part.ledger_id, part.last_entry):
        return
    # The range came up short: its ledger was trimmed after the read was
    # planned. Read the rest from its remote copy; never return less silently.
    first = part.first_entry
    if after is not None and after.ledger_id == part.ledger_id:
        first = max(first, after.entry_id + 1)
    yield from _read_segment_range(_offloaded_rest(path, part, first))


def _offloaded_rest(path: str, part: TopicRange, first: int) -> TopicRange:
    """``part`` from entry ``first`` on, as a range of its ledger's remote segment."""
    seg = None
    if part.remote is not None and METADATA_LEDGER in ManagedLedger.names(path):
        log = ManagedLedger.open(path, METADATA_LEDGER, read_only=True)
        try:
            meta = RemoteLogMetadataManager(log, RemoteStorage(part.remote))
            seg = next(
                (s for s in meta.segments_uncounted(part.ledger) if s.ledger_id == part.ledger_id),
                None,
            )
        finally:
            log.close()
    if seg is None:
        raise StorageError(
            f"partition {part.ledger}: ledger {part.ledger_id} (entries {first}.."
            f"{part.last_entry} of this task) was trimmed after the read was planned and "
            "has no remote copy; plan the read again"
        )
    return dataclasses.replace(
        part,
        first_entry=first,
        segment_id=seg.segment_id,
        segment_first_entry=seg.first_entry,
        segment_size=seg.size_bytes,
        segment_crc32c=seg.data_crc32c,
    )


_MARKER_ARROW_SCHEMA: pa.Schema | None = None


def _marker_arrow_schema() -> pa.Schema:
    global _MARKER_ARROW_SCHEMA
    if _MARKER_ARROW_SCHEMA is None:
        from pyspark.sql.pandas.types import to_arrow_schema

        _MARKER_ARROW_SCHEMA = to_arrow_schema(MARKER_SCHEMA)
    return _MARKER_ARROW_SCHEMA


def _marker_name(marker: int) -> str:
    return {TXN_COMMIT: "COMMIT", TXN_ABORT: "ABORT"}.get(marker, str(marker))


def read_marker_range(path: str, part: TopicRange) -> Iterator[pa.RecordBatch]:
    """Yield the marker entries of one Spark partition as Arrow record batches (mode ``markers``).

    The Rust scanner decodes only each entry's metadata; entries that are
    not markers are skipped there, so no message is parsed in Python.
    """
    if part.segment_id is not None:
        yield from _remote_marker_range(part)
        return
    ml = ManagedLedger.open(path, part.ledger, read_only=True)
    next_entry = part.first_entry
    try:
        after = _before((part.ledger_id, part.first_entry))
        while True:
            # No further than the range's last entry (the scan would run into later ledgers).
            want = min(_SCAN_CHUNK, part.last_entry - next_entry + 1)
            if want < 1:
                return
            rows = scan_topic(ml, after, want)
            inside = [r for r in rows if r[0] == part.ledger_id and r[1] <= part.last_entry]
            found = [(r[1], r[2], r[3]) for r in inside if r[2] is not None]
            if found:
                yield _marker_batch(part, found)
            if inside:
                next_entry = inside[-1][1] + 1
            if len(inside) < len(rows) or not rows:
                break
            after = Position(rows[-1][0], rows[-1][1])
    finally:
        ml.close()
    if next_entry <= part.last_entry:
        # Came up short: the ledger was trimmed after planning (see read_topic_range).
        yield from _remote_marker_range(_offloaded_rest(path, part, next_entry))


def _segment_data(storage: RemoteStorage, name: str, part: TopicRange) -> bytes:
    """Fetch a task's remote segment data, checked whole against the planned metadata."""
    return storage.get_segment(
        name,
        ledger_id=part.ledger_id,
        first_entry=part.segment_first_entry,
        size_bytes=part.segment_size,
        data_crc32c=part.segment_crc32c,
    )


def _remote_marker_range(part: TopicRange) -> Iterator[pa.RecordBatch]:
    """:func:`read_marker_range` of a remote segment's range (one remote call)."""
    assert part.remote is not None
    assert part.segment_id is not None
    name = object_name(part.ledger, part.ledger_id, part.segment_id, "segment")
    data = _segment_data(RemoteStorage(part.remote), name, part)
    found: list[tuple[int, int, TxnKey | None]] = []
    for i, entry in enumerate(decode_segment(part.ledger_id, part.segment_first_entry, data)):
        e = part.segment_first_entry + i
        if part.first_entry <= e <= part.last_entry:
            d = decode_topic_entry(entry)
            if d["marker_type"] is not None:
                found.append((e, d["marker_type"], d["txn"]))
    if found:
        yield _marker_batch(part, found)


def _marker_batch(part: TopicRange, found: list[tuple[int, int, TxnKey | None]]) -> pa.RecordBatch:
    """Marker rows ``(entry_id, marker_type, txn)`` of one ledger as an Arrow record batch."""
    n = len(found)
    types = [m for _e, m, _t in found]
    txns = [t for _e, _m, t in found]
    no_txn = np.array([t is None for t in txns], dtype=np.bool_)
    most = np.array([0 if t is None else t[0] for t in txns], dtype=np.uint64)
    least = np.array([0 if t is None else t[1] for t in txns], dtype=np.uint64)
    arrays = [
        pa.array([part.topic] * n, pa.string()),
        pa.array(np.full(n, part.partition, dtype=np.int32)),
        pa.array(np.full(n, part.ledger_id, dtype=np.uint64).view(np.int64)),
        pa.array(np.array([e for e, _m, _t in found], dtype=np.int64)),
        pa.array(np.array(types, dtype=np.int32)),
        pa.array([_marker_name(m) for m in types], pa.string()),
        pa.array(most.view(np.int64), pa.int64(), mask=no_txn),
        pa.array(least.view(np.int64), pa.int64(), mask=no_txn),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=_marker_arrow_schema())


def _read_range(sel: TopicSelection, part: TopicRange) -> Iterator[pa.RecordBatch]:
    if sel.mode == MARKERS:
        return read_marker_range(sel.path, part)
    return read_topic_range(sel.path, part)


def _read_segment_range(part: TopicRange) -> Iterator[pa.RecordBatch]:
    """Yield the rows of a remote segment's range (see :class:`_TieredView`)."""
    if part.remote is None or part.segment_id is None:
        raise InvalidArgumentError(
            f"partition {part.ledger} ledger {part.ledger_id} names no remote segment",
            argument="partition",
            value=part.segment_id,
        )
    storage = RemoteStorage(part.remote)
    name = object_name(part.ledger, part.ledger_id, part.segment_id, "segment")
    data = _segment_data(storage, name, part)
    offset, entry = 0, part.segment_first_entry
    aborted = part.aborted or None
    while True:
        c = scan_segment_columns(
            data,
            part.ledger_id,
            offset,
            entry,
            part.first_entry,
            part.last_entry,
            _READ_CHUNK,
            _READ_BYTES,
            aborted,
        )
        if c["rows"]:
            yield topic_batch(part.topic, part.partition, c)
        if c["next_offset"] is None:
            return
        offset, entry = c["next_offset"], c["next_entry"]


class _Reader(DataSourceReader):
    def __init__(self, sel: TopicSelection) -> None:
        self.sel = sel

    def partitions(self) -> Sequence[InputPartition]:
        return self.sel.ranges()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, TopicRange):
            # Spark reads one default partition when partitions() has none.
            return iter(())
        return _read_range(self.sel, partition)


def _offset_of(pos: Pos) -> str:
    return f"{pos[0]}:{pos[1]}"


def _pos_of(offset: object) -> Pos:
    parsed = _parse_position("offset", offset)
    if not isinstance(parsed, tuple):
        raise InvalidArgumentError(
            f"checkpointed offset {offset!r} is not a position", argument="offset", value=offset
        )
    return parsed


class TopicStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Streaming reads of topics: offsets are, per topic partition, the next position to read.

    An offset is ``{"<partition's full name>": "ledger:entry"}``: everything
    before the position was read. :meth:`latestOffset` is each partition's
    READ_COMMITTED limit (the oldest open transaction's first message, or the
    end) or, under READ_UNCOMMITTED, its end; a micro-batch reads the ledger
    ranges between two offsets with the aborted sets of the driver's scan.
    Spark keeps the offsets in the query's checkpoint, so a restarted query
    resumes after the last batch it committed. The partitions are the ones
    the option ``topic`` selected when the query started. With tiered
    storage, positions in ledgers offloaded and no longer stored locally are
    read from their remote segments, as batch reads do (a query that starts
    at ``earliest`` after an offload, or falls behind one, loses nothing).
    """

    def __init__(self, sel: TopicSelection) -> None:
        self.sel = sel
        self.states: dict[str, PartitionScan] = {}
        self._target: dict[str, str] | None = None

    @staticmethod
    def _remote(
        tiered: _TieredView | None, ledger: str, ledgers: list[tuple[int, int, bool]]
    ) -> list[SegmentInfo]:
        return [] if tiered is None else tiered.remote_segments(ledger, ledgers)

    def _scan(self, ledger: str) -> tuple[PartitionScan, list[tuple[int, int, bool]]]:
        state = self.states.get(ledger)
        if state is None:
            state = self.states[ledger] = PartitionScan(ledger)
        ml = ManagedLedger.open(self.sel.path, ledger, read_only=True)
        try:
            state.advance(ml)
            return state, ml.ledgers()
        finally:
            ml.close()

    def initialOffset(self) -> dict[str, str]:  # noqa: N802 (Spark API name)
        """Return the option ``startingPositions`` resolved per partition."""
        out = {}
        # The metadata is read once per call (offloads go on while a query
        # runs), after the local listing (see TopicSelection.ranges).
        scans = [(ledger, *self._scan(ledger)) for ledger in self.sel.ledgers]
        tiered = _TieredView.open(self.sel)
        for ledger, state, ledgers in scans:
            remote = self._remote(tiered, ledger, ledgers)
            start, _end = self.sel.bounds(state, ledgers, remote)
            out[ledger] = _offset_of(start)
        return out

    def _latest(self, start: dict[str, Any]) -> dict[str, str]:
        out = {}
        tiered: _TieredView | None = None
        for ledger in self.sel.ledgers:
            state, ledgers = self._scan(ledger)
            limit = self.sel.limit(state)
            if state.last is None:  # nothing stored locally: the remote end, if any
                tiered = tiered or _TieredView.open(self.sel)
                remote = self._remote(tiered, ledger, ledgers)
                if remote:
                    limit = (remote[-1].ledger_id, remote[-1].last_entry + 1)
            if ledger in start:
                limit = max(limit, _pos_of(start[ledger]))
            out[ledger] = _offset_of(limit)
        return out

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 (Spark API name)
        """Fix the target of an ``availableNow`` query: the limits right now."""
        self._target = self._latest({})

    def latestOffset(  # noqa: N802 (Spark API name)
        self, start: dict[str, Any], limit: ReadLimit
    ) -> dict[str, str]:
        """Return each partition's current limit (never below ``start``)."""
        latest = self._latest(start)
        if self._target is not None:
            for ledger, target in self._target.items():
                if ledger in latest:
                    latest[ledger] = _offset_of(
                        max(
                            _pos_of(start.get(ledger, target)),
                            min(_pos_of(latest[ledger]), _pos_of(target)),
                        )
                    )
        return latest

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """Return the ledger ranges from ``start`` (inclusive) to ``end`` (exclusive)."""
        out: list[InputPartition] = []
        # Local listings before the remote metadata (see TopicSelection.ranges);
        # the scans' aborted sets cover everything before each ``hi``.
        scans = [
            (ledger, until, *self._scan(ledger))
            for ledger, until in end.items()
            if ledger in self.sel.ledgers
        ]
        tiered = _TieredView.open(self.sel)
        for ledger, until, state, ledgers in scans:
            remote = self._remote(tiered, ledger, ledgers)
            hi = _pos_of(until)
            # A partition the checkpoint does not know (selected since the
            # last run: a new topic matching the pattern, or a partition
            # first stored since) starts at its earliest position, as
            # spark-sql-kafka starts newly found partitions.
            lo = _pos_of(start[ledger]) if ledger in start else self.sel.earliest(ledgers, remote)
            if lo >= hi:
                continue
            if tiered is not None and remote:
                out.extend(tiered.split(self.sel, state, remote, lo, hi))
            out.extend(self.sel.split(state, ledgers, lo, hi))
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Read one ledger range (as the batch reader does)."""
        if not isinstance(partition, TopicRange):
            return iter(())
        return _read_range(self.sel, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: the source holds no resources between batches."""


class TopicDataSource(DataSource):
    """Spark data source ``txnstream`` (see the module docs for options and columns)."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.selection = TopicSelection.from_options(options)

    @classmethod
    def name(cls) -> str:
        """Return the format name, ``txnstream``."""
        return "txnstream"

    def schema(self) -> StructType:
        """Return :data:`TOPIC_FIELDS` (mode ``markers``: :data:`MARKER_FIELDS`) as a schema."""
        return self.selection.schema

    def reader(self, schema: StructType) -> DataSourceReader:
        """Return the batch reader."""
        return _Reader(self.selection)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        """Return the streaming reader (option ``endingPositions`` is for batch reads only)."""
        if self.selection.ending != (LATEST, {}):
            raise _bad(
                "endingPositions", self.selection.ending[0], "is for batch reads, not streaming"
            )
        return TopicStreamReader(self.selection)
