"""The Spark data source ``txnstream-log``: coordinator and pending-ack logs, one row per record.

::

    spark.read.format("txnstream-log")
        .option("path", "data/")
        .option("log", "__transaction_log_*")     # a name or a glob pattern
        .load()

Options (case-insensitive):

``path``
    the data directory (required). It is opened **read-only**, from the files
    alone, so it may be closed or live: a writer process can keep appending.
``log``
    a managed-ledger name or an ``fnmatch`` pattern; ``allCoordinators=true``
    selects every ``__transaction_log_<id>`` instead.
``kind``
    ``txn`` (coordinator log) or ``pending_ack``; inferred from the names
    (``__transaction_log_<id>``, ``<topic>-<subscription>__transaction_pending_ack``)
    when not given. All selected logs must be of one kind.
``cursors``
    comma-separated cursor names deciding the ``deleted`` flag; default every
    cursor of the log. A record is deleted when every one of them deleted it
    (mark-delete, deleted ranges, batch-index ack sets).
``mode``
    ``records`` (default: decoded records) or ``entries`` (one row per entry
    with its raw bytes, for the UDFs of :mod:`txnstream.spark.udfs`; a damaged
    entry is a row with a null ``entry`` and the reason in ``error``).
``maxEntriesPerPartition`` / ``maxRowsPerBatch``
    tuning: partitions are ledgers, split into ranges of at most this many
    entries (default 8192); Arrow batches hold about this many rows (65536).

Records mode columns: ``log``, the position (``ledger_id``, ``entry_id``,
``batch_size``, ``batch_index``), ``entry_size``, ``batched``, ``deleted``, the
decoded fields (:data:`~txnstream.spark.columns.TXN_LOG_FIELDS` or
:data:`~txnstream.spark.columns.PENDING_ACK_FIELDS`) and ``error``. Batched
entries are exploded. A malformed entry is one row with null fields (and null
batch fields) and the reason in ``error``; a malformed record inside a good
batch is a row with null fields; an entry whose stored bytes fail their
checksum is an error row too. The job never fails on them.

Each task reads its ledger range with the Rust scanner
(:func:`txnstream._native.scan_log`) and yields ``pyarrow.RecordBatch``es built
from its columns: no record is parsed in Python.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from txnstream._native import ManagedLedger, Position, scan_log
from txnstream.errors import (
    CorruptEntryError,
    CorruptLedgerError,
    InvalidArgumentError,
    PositionNotFoundError,
)
from txnstream.spark.columns import (
    ENTRY_FIELDS,
    PENDING_ACK_FIELDS,
    POSITION_FIELDS,
    TXN_LOG_FIELDS,
    bool_array,
    fixed_array,
    pending_ack_arrays,
    string_array,
    struct_type,
    txn_log_arrays,
)

__all__ = [
    "COORDINATOR_LOG_PREFIX",
    "PENDING_ACK_LOG_SUFFIX",
    "LedgerRange",
    "LogSelection",
    "TxnLogDataSource",
    "log_kind",
    "pending_ack_log_name",
    "read_range",
    "schema_of",
]

#: Managed-ledger name prefix of the coordinator logs (``__transaction_log_<tc_id>``).
COORDINATOR_LOG_PREFIX = "__transaction_log_"
#: Managed-ledger name suffix of the pending-ack logs.
PENDING_ACK_LOG_SUFFIX = "__transaction_pending_ack"

KINDS = ("txn", "pending_ack")
MODES = ("records", "entries")
DEFAULT_MAX_ENTRIES_PER_PARTITION = 8192
DEFAULT_MAX_ROWS_PER_BATCH = 65536
#: Entries per read in ``entries`` mode.
_ENTRY_WINDOW = 1024


def pending_ack_log_name(topic: str, subscription: str) -> str:
    """Return the pending-ack log of ``subscription`` on ``topic`` (SPEC §2 naming)."""
    return f"{topic}-{subscription}{PENDING_ACK_LOG_SUFFIX}"


def log_kind(name: str) -> str | None:
    """Return ``"txn"`` or ``"pending_ack"`` for a system log name, None for other logs."""
    if name.startswith(COORDINATOR_LOG_PREFIX):
        return "txn"
    if name.endswith(PENDING_ACK_LOG_SUFFIX):
        return "pending_ack"
    return None


def schema_of(kind: str, mode: str = "records") -> StructType:
    """Return the Spark schema of ``kind`` logs read in ``mode``."""
    if mode == "entries":
        return struct_type(ENTRY_FIELDS)
    fields = TXN_LOG_FIELDS if kind == "txn" else PENDING_ACK_FIELDS
    return struct_type([*POSITION_FIELDS, *fields])


def _option(options: Mapping[str, str], name: str) -> str | None:
    value = options.get(name)
    return None if value is None else str(value)


def _positive(options: Mapping[str, str], name: str, default: int) -> int:
    raw = _option(options, name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value < 1 << 63:
        raise InvalidArgumentError(
            f"option {name} must be an integer in 1..2**63-1, got {raw!r}",
            argument=name,
            value=raw,
        )
    return value


@dataclass(frozen=True)
class LogSelection:
    """What a ``txnstream-log`` read covers: checked options and the matched logs."""

    path: str
    logs: tuple[str, ...]
    kind: str
    mode: str
    cursors: tuple[str, ...] | None
    max_entries_per_partition: int
    max_rows_per_batch: int

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> LogSelection:
        """Check ``options`` and list the matching logs of the data directory."""
        path = _option(options, "path")
        if not path:
            raise InvalidArgumentError(
                "option path (the data directory) is required", argument="path", value=path
            )
        every = (_option(options, "allCoordinators") or "false").strip().lower()
        if every not in ("true", "false"):
            raise InvalidArgumentError(
                f"option allCoordinators must be true or false, got {every!r}",
                argument="allCoordinators",
                value=every,
            )
        pattern = _option(options, "log")
        if every == "true":
            if pattern is not None:
                raise InvalidArgumentError(
                    "give either option log or allCoordinators=true, not both",
                    argument="log",
                    value=pattern,
                )
            pattern = COORDINATOR_LOG_PREFIX + "*"
        if not pattern:
            raise InvalidArgumentError(
                "option log (a log name or pattern) or allCoordinators=true is required",
                argument="log",
                value=pattern,
            )
        mode = (_option(options, "mode") or "records").strip().lower()
        if mode not in MODES:
            raise InvalidArgumentError(
                f"option mode must be one of {MODES}, got {mode!r}", argument="mode", value=mode
            )
        names = ManagedLedger.names(path)
        logs = tuple(sorted(n for n in names if n == pattern or fnmatch.fnmatchcase(n, pattern)))
        kind = _option(options, "kind")
        if kind is not None:
            kind = kind.strip().lower()
            if kind not in KINDS:
                raise InvalidArgumentError(
                    f"option kind must be one of {KINDS}, got {kind!r}", argument="kind", value=kind
                )
            named = sorted(n for n in logs if log_kind(n) not in (None, kind))
            if named:
                # Decoding a log as another kind yields wrong rows, not an error.
                raise InvalidArgumentError(
                    f"option kind {kind!r} contradicts the logs it selects: {named[:5]} are "
                    f"{log_kind(named[0])} logs",
                    argument="kind",
                    value=kind,
                )
        else:
            kinds = {log_kind(n) for n in logs} or {log_kind(pattern.rstrip("*"))}
            if kinds == {None} and not logs:
                # The pattern says nothing and matched nothing: name what exists.
                raise InvalidArgumentError(
                    f"no log in {path} matches {pattern!r} (logs: {sorted(names)[:20]})",
                    argument="log",
                    value=pattern,
                )
            if len(kinds) != 1 or None in kinds:
                raise InvalidArgumentError(
                    f"option log {pattern!r} selects logs of several or unknown kinds "
                    f"({sorted(logs)[:10]}); narrow it or give option kind",
                    argument="log",
                    value=pattern,
                )
            kind = next(iter(kinds))
            assert kind is not None
        raw_cursors = _option(options, "cursors")
        cursors = (
            None
            if raw_cursors is None
            else tuple(c.strip() for c in raw_cursors.split(",") if c.strip())
        )
        return cls(
            path=path,
            logs=logs,
            kind=kind,
            mode=mode,
            cursors=cursors,
            max_entries_per_partition=_positive(
                options, "maxEntriesPerPartition", DEFAULT_MAX_ENTRIES_PER_PARTITION
            ),
            max_rows_per_batch=_positive(options, "maxRowsPerBatch", DEFAULT_MAX_ROWS_PER_BATCH),
        )

    @property
    def schema(self) -> StructType:
        """Return the Spark schema of this read."""
        return schema_of(self.kind, self.mode)

    def ranges(self) -> list[LedgerRange]:
        """Return the partitions: every ledger of every log, split into entry ranges."""
        out: list[LedgerRange] = []
        step = self.max_entries_per_partition
        for log in self.logs:
            ml = ManagedLedger.open(self.path, log, read_only=True)
            try:
                ledgers = ml.ledgers()
                known = ml.cursor_names()
            finally:
                ml.close()
            for name in self.cursors or ():
                if name not in known:
                    raise InvalidArgumentError(
                        f"option cursors: log {log!r} has no cursor {name!r} (it has {known})",
                        argument="cursors",
                        value=name,
                    )
            for ledger_id, entries, _sealed in ledgers:
                for first in range(0, entries, step):
                    out.append(LedgerRange(log, ledger_id, first, min(first + step, entries) - 1))
        return out


@dataclass(frozen=True)
class LedgerRange(InputPartition):
    """One partition: entries ``first_entry..=last_entry`` of a ledger of ``log``."""

    log: str
    ledger_id: int
    first_entry: int
    last_entry: int


def _repeat_string(s: str, n: int) -> pa.Array:
    b = s.encode()
    offsets = np.arange(n + 1, dtype=np.int32) * len(b)
    return string_array(b * n, offsets)


def _records_batch(sel: LogSelection, log: str, d: Mapping[str, Any]) -> pa.RecordBatch:
    """One RecordBatch of ``scan_log`` output ``d``."""
    status = d["status"]
    n = len(status)
    ok = status == 0
    whole = status != 2  # the entry split into records: batch fields are known
    deleted = d["deleted"]
    error_offsets = d["error_offsets"]
    i64, i32 = pa.int64(), pa.int32()
    arrays = [
        _repeat_string(log, n),
        fixed_array(d["at_ledger_id"], np.int64, i64),
        fixed_array(d["at_entry_id"], np.int64, i64),
        fixed_array(d["batch_size"], np.int32, i32, whole),
        fixed_array(d["batch_index"], np.int32, i32, whole),
        fixed_array(d["entry_size"], np.int32, i32),
        bool_array(d["batched"]),
        bool_array(deleted == 1, deleted != 2),
        *(txn_log_arrays(d, ok) if sel.kind == "txn" else pending_ack_arrays(d, ok)),
        string_array(d["error_data"], error_offsets, np.diff(error_offsets) > 0),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=_arrow_schema(sel))


def _arrow_schema(sel: LogSelection) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(sel.schema)


def read_range(sel: LogSelection, part: LedgerRange) -> Iterator[pa.RecordBatch]:
    """Yield the rows of one partition as Arrow record batches (what a task runs)."""
    ml = ManagedLedger.open(sel.path, part.log, read_only=True)
    try:
        if sel.mode == "entries":
            yield from _entries(sel, ml, part)
            return
        first: int | None = part.first_entry
        while first is not None:
            d = scan_log(
                ml,
                sel.kind,
                part.ledger_id,
                first,
                part.last_entry,
                list(sel.cursors) if sel.cursors is not None else None,
                sel.max_rows_per_batch,
            )
            if len(d["status"]):
                yield _records_batch(sel, part.log, d)
            first = d["next_entry"]
    finally:
        ml.close()


def _entries(sel: LogSelection, ml: ManagedLedger, part: LedgerRange) -> Iterator[pa.RecordBatch]:
    schema = _arrow_schema(sel)
    at = part.first_entry
    while at <= part.last_entry:
        end = min(at + _ENTRY_WINDOW - 1, part.last_entry)
        rows: list[tuple[int, bytes | None, str | None]]
        try:
            window = ml.read_range(Position(part.ledger_id, at), Position(part.ledger_id, end))
            rows = [(p.entry_id, e, None) for p, e in window]
        except PositionNotFoundError:  # past the end of the log: nothing more to read
            return
        except (CorruptLedgerError, CorruptEntryError):
            rows = _entries_one_by_one(ml, part.ledger_id, at, end)
        at = end + 1
        if not rows:
            continue
        n = len(rows)
        yield pa.RecordBatch.from_arrays(
            [
                _repeat_string(part.log, n),
                pa.array(np.full(n, part.ledger_id, dtype=np.int64)),
                pa.array(np.array([e for e, _, _ in rows], dtype=np.int64)),
                pa.array([d for _, d, _ in rows], pa.binary()),
                pa.array([err for _, _, err in rows], pa.string()),
            ],
            schema=schema,
        )


def _entries_one_by_one(
    ml: ManagedLedger, ledger_id: int, first: int, last: int
) -> list[tuple[int, bytes | None, str | None]]:
    # A window with damage, entry by entry: each damaged entry is an error row.
    out: list[tuple[int, bytes | None, str | None]] = []
    for entry_id in range(first, last + 1):
        try:
            out.append((entry_id, ml.read(Position(ledger_id, entry_id)), None))
        except PositionNotFoundError:
            break
        except (CorruptLedgerError, CorruptEntryError) as e:
            out.append((entry_id, None, str(e)))
    return out


class _Reader(DataSourceReader):
    def __init__(self, sel: LogSelection) -> None:
        self.sel = sel

    def partitions(self) -> Sequence[InputPartition]:
        return self.sel.ranges()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, LedgerRange):
            # Spark reads one default partition when partitions() has none.
            return iter(())
        return read_range(self.sel, partition)


class TxnLogDataSource(DataSource):
    """Spark data source ``txnstream-log`` (see the module docs for options and columns)."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.selection = LogSelection.from_options(options)

    @classmethod
    def name(cls) -> str:
        """Return the format name, ``txnstream-log``."""
        return "txnstream-log"

    def schema(self) -> StructType:
        """Return the schema for the selected kind and mode."""
        return self.selection.schema

    def reader(self, schema: StructType) -> DataSourceReader:
        """Return the batch reader."""
        return _Reader(self.selection)
