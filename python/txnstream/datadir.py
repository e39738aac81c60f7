"""Read-only views of a data directory, from its files alone (``txnstream admin``).

Everything here opens the directory **read-only**: it never takes the
writer's lock (``<data>/LOCK``), never writes, and sees what the writer
made durable. So it works on a closed directory and on a live one whose
broker keeps running in another process (or in this one). Functions return
plain dicts and lists (JSON-able: positions are ``"ledger:entry"`` strings,
transaction ids ``"(most,least)"``, times wall-clock milliseconds).

- :func:`is_live`: is a writer holding the directory?
- :func:`describe_logs`, :func:`internal_stats`: managed ledgers, their
  ledgers, entries and cursors (Pulsar's ``topics stats-internal``);
- :func:`coordinator_stats`, :func:`open_transactions`,
  :func:`slow_transactions`, :func:`late_transactions`,
  :func:`transaction_metadata`: each coordinator's log folded read-only (the
  same Rust fold as recovery) plus its terminated-transaction store (PIP-255);
- :func:`transaction_buffer_stats`: a partition's ledger replayed like the
  transaction buffer's recovery (ongoing, aborted, ``max_read_position``), the
  coordinators' low water marks and the partition's snapshot;
- :func:`pending_ack_stats`: a subscription's pending-ack log replayed like
  the store's recovery, and its cursor's mark-delete position;
- :func:`batch_stats`: PIP-160 batch statistics of the coordinator or
  pending-ack logs computed from the stored entries (seed 000's admin section).

A live writer keeps changing the files, so each call is a consistent read of
what was durable when it opened the ledgers, not a frozen snapshot across
calls. Bad input raises :class:`~txnstream.errors.InvalidArgumentError` (or
:class:`~txnstream.errors.InvalidTopicNameError`) naming the value, before
anything is read; an unknown transaction raises
:class:`~txnstream.errors.TransactionNotFound`.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from txnstream._native import (
    CompactedTopic,
    ManagedLedger,
    Position,
    fold_txn_log,
    scan_log,
)
from txnstream.broker.topic_name import PENDING_ACK_SUFFIX, TopicName, subscription_arg
from txnstream.buffer.snapshot_reader import snapshot_topic
from txnstream.buffer.transaction_buffer import TransactionBuffer
from txnstream.config import read_dynamic_config
from txnstream.coordinator.metadata import TransactionInfo, TxnID, TxnStatus
from txnstream.coordinator.state import CURSOR as COORDINATOR_CURSOR
from txnstream.coordinator.state import (
    LOG_PREFIX,
    FoldResult,
    log_ids,
    log_name,
    terminated_topic_name,
)
from txnstream.errors import (
    CorruptEntryError,
    InvalidArgumentError,
    InvalidTopicNameError,
    StorageError,
    TransactionNotFound,
)
from txnstream.pendingack.store import LOG_CURSOR as PENDING_ACK_LOG_CURSOR
from txnstream.pendingack.store import LogFold, TxnAcks, absent_indexes, fold_log
from txnstream.proto import (
    TerminatedTxnState,
    TransactionBufferSnapshot,
)
from txnstream.replay import replay

__all__ = [
    "BATCH_BYTES_BUCKETS",
    "BATCH_DELAY_BUCKETS_S",
    "BATCH_RECORDS_BUCKETS",
    "CATALOG_FILE",
    "LOCK_FILE",
    "LOG_KINDS",
    "PENDING_ACK_OWNERS",
    "batch_stats",
    "check_data_dir",
    "coordinator_ids",
    "coordinator_stats",
    "describe_logs",
    "histogram",
    "internal_stats",
    "is_live",
    "late_transactions",
    "ledger_internal_stats",
    "log_kind",
    "low_water_marks",
    "open_transactions",
    "pending_ack_owner_map",
    "pending_ack_stats",
    "position_str",
    "replay_partition",
    "slow_transactions",
    "snapshot_info",
    "transaction_buffer_stats",
    "transaction_dict",
    "transaction_metadata",
]

#: The writer's lock file (``rust/core/src/ledger/store.rs``).
LOCK_FILE: Final = "LOCK"
#: The storage catalog every data directory holds (``rust/core/src/ledger/catalog.rs``).
CATALOG_FILE: Final = "CATALOG"
#: The compacted topic of topic metadata: base topic name -> partition count
#: (``txnstream.broker.broker.TOPICS_REGISTRY``, a layer above this module).
TOPICS_REGISTRY: Final = "__txnstream_topics"
#: The compacted topic of pending-ack log owners: log name -> ``topic\nsubscription``
#: (``txnstream.broker.broker.PENDING_ACK_OWNERS``; Pulsar's log names can collide).
PENDING_ACK_OWNERS: Final = "__txnstream_pending_ack_owners"

#: The two kinds of batched log, by their CLI name.
LOG_KINDS: Final = ("coordinator", "pending-ack")

#: Histogram bounds (upper, inclusive) of seed 000's batch metrics, as the writer's own.
BATCH_RECORDS_BUCKETS: Final = (10, 50, 100, 200, 500, 1000)
BATCH_BYTES_BUCKETS: Final = (128, 512, 1024, 2048, 4096, 16384, 102400, 1232896)
BATCH_DELAY_BUCKETS_S: Final = (0.001, 0.005, 0.01)


# ------------------------------------------------------------------ helpers


#: The dynamic setting that switches each log's batched writes (``batched-log enable``).
BATCH_SWITCH_KEY: dict[str, str] = {
    "coordinator": "transactionLogBatchedWriteEnabled",
    "pending-ack": "transactionPendingAckBatchedWriteEnabled",
}


def log_kind(name: str) -> str:
    """Return what the managed ledger ``name`` is: ``txn``, ``pending_ack`` or ``other``."""
    if name.startswith(LOG_PREFIX):
        return "txn"
    if name.endswith(PENDING_ACK_SUFFIX):
        return "pending_ack"
    return "other"


def position_str(p: Position | None) -> str | None:
    """Return ``"ledger:entry"`` (None stays None)."""
    return None if p is None else f"{p.ledger_id}:{p.entry_id}"


def _directory(directory: str | os.PathLike[str]) -> Path:
    if not isinstance(directory, str | os.PathLike):
        raise InvalidArgumentError(
            f"directory must be a path, got {directory!r}", argument="directory", value=directory
        )
    path = Path(directory)
    if not path.is_dir():
        raise InvalidArgumentError(
            f"data directory {str(path)!r} does not exist or is not a directory",
            argument="directory",
            value=str(path),
        )
    return path


def check_data_dir(directory: str | os.PathLike[str]) -> Path:
    """Return ``directory`` as a Path if it is a txnstream data directory.

    Raises :class:`InvalidArgumentError` naming it when it does not exist,
    is not a directory, or holds no storage catalog (never opened by a
    broker or a managed ledger).
    """
    path = _directory(directory)
    if not (path / CATALOG_FILE).is_file():
        raise InvalidArgumentError(
            f"{str(path)!r} is not a txnstream data directory (no {CATALOG_FILE})",
            argument="directory",
            value=str(path),
        )
    return path


def is_live(directory: str | os.PathLike[str]) -> bool:
    """Tell whether a writer (a broker) holds ``directory`` open now.

    Probes the writer's open-file-description lock on ``<data>/LOCK`` with
    ``F_OFD_GETLK``: nothing is taken, so it answers the same from any
    process, including the broker's own. No LOCK file: not live.
    """
    path = _directory(directory) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError as e:  # a symlink (refused: ELOOP), no permission, ...
        raise StorageError(f"cannot probe the writer lock {path}: {e}", errno=e.errno) from e
    try:
        # struct flock: l_type, l_whence, l_start, l_len, l_pid (+ padding).
        probe = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        cmd = getattr(fcntl, "F_OFD_GETLK", fcntl.F_GETLK)
        got = fcntl.fcntl(fd, cmd, probe)
        l_type = struct.unpack("hhqqi4x", got)[0]
        return bool(l_type != fcntl.F_UNLCK)
    finally:
        os.close(fd)


@contextmanager
def _ledger(directory: Path, name: str) -> Iterator[ManagedLedger | None]:
    """Open ``name`` read-only (None if the directory has no such ledger)."""
    try:
        ml = ManagedLedger.open(directory, name, read_only=True)
    except StorageError as e:
        if e.errno == errno.ENOENT:
            yield None
            return
        raise
    try:
        yield ml
    finally:
        ml.close()


def _compacted_items(directory: Path, name: str) -> list[tuple[str, bytes]]:
    """Every live key of compacted topic ``name`` (empty when it does not exist)."""
    try:
        topic = CompactedTopic.open(directory, name, read_only=True)
    except StorageError as e:
        if e.errno == errno.ENOENT:
            return []
        raise
    try:
        return topic.items()
    finally:
        topic.close()


def _compacted_get(directory: Path, name: str, key: str) -> bytes | None:
    try:
        topic = CompactedTopic.open(directory, name, read_only=True)
    except StorageError as e:
        if e.errno == errno.ENOENT:
            return None
        raise
    try:
        return topic.get(key)
    finally:
        topic.close()


def _names(directory: Path) -> list[str]:
    return sorted(ManagedLedger.names(directory))


def _now_ms(now_ms: int | None) -> int:
    if now_ms is None:
        return time.time_ns() // 1_000_000
    if isinstance(now_ms, bool) or not isinstance(now_ms, int) or now_ms < 0:
        raise InvalidArgumentError(
            f"now_ms must be a non-negative int, got {now_ms!r}", argument="now_ms", value=now_ms
        )
    return now_ms


def _txn_id_arg(value: object) -> TxnID:
    if isinstance(value, TxnID):
        return value
    if isinstance(value, str):
        return TxnID.parse(value)
    raise InvalidArgumentError(
        f"txn_id must be a TxnID or '(most,least)', got {value!r}", argument="txn_id", value=value
    )


# ---------------------------------------------------------- managed ledgers


def _ml_summary(ml: ManagedLedger) -> dict[str, Any]:
    ledgers = ml.ledgers()
    return {
        "ledgers": len(ledgers),
        "entries": sum(n for _, n, _ in ledgers),
        "first": position_str(ml.first_position),
        "last": position_str(ml.last_position),
    }


def describe_logs(directory: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Return one description per managed ledger of ``directory``, sorted by name.

    Each is a dict: ``name``, ``kind``, ``ledgers`` (count), ``entries``
    (stored now), ``first`` / ``last`` (``"ledger:entry"`` or None),
    ``cursors`` (name -> mark-delete position or None).
    """
    path = _directory(directory)
    out: list[dict[str, Any]] = []
    for name in _names(path):
        with _ledger(path, name) as ml:
            if ml is None:  # deleted since the listing
                continue
            cursors = {
                c: position_str(ml.open_cursor(c).mark_delete_position) for c in ml.cursor_names()
            }
            out.append(
                {"name": name, "kind": log_kind(name), **_ml_summary(ml), "cursors": cursors}
            )
    return out


def ledger_internal_stats(ml: ManagedLedger) -> dict[str, Any]:
    """Return the internal stats of one open managed ledger (read-only or the broker's own).

    ``ledgers`` (each ``ledger_id``, ``entries``, ``sealed``), entry counts
    and positions, and per cursor its ``mark_delete_position`` and the
    ``individually_deleted`` ranges above it (``[from, to]``, as the cursor
    reports them).
    """
    _ledger_arg(ml)
    cursors: dict[str, Any] = {}
    for c in ml.cursor_names():
        cur = ml.open_cursor(c)
        ranges = [[position_str(a), position_str(b)] for a, b in cur.deleted_ranges()]
        cursors[c] = {
            "mark_delete_position": position_str(cur.mark_delete_position),
            "individually_deleted": ranges,
        }
    ledgers = ml.ledgers()
    return {
        "name": ml.name,
        "kind": log_kind(ml.name),
        "number_of_entries": sum(n for _, n, _ in ledgers),
        "first_position": position_str(ml.first_position),
        "last_position": position_str(ml.last_position),
        "ledgers": [
            {"ledger_id": lid, "entries": n, "sealed": sealed} for lid, n, sealed in ledgers
        ],
        "cursors": cursors,
    }


def _partition_count(path: Path, topic: str) -> int | None:
    """``topic``'s partition count in the topics registry (None: not registered)."""
    raw = _compacted_get(path, TOPICS_REGISTRY, topic)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise CorruptEntryError(
            f"{TOPICS_REGISTRY}: the partition count of {topic} is {raw!r}, not a number",
            position=None,
            offset=0,
        ) from None


def pending_ack_owner_map(directory: str | os.PathLike[str]) -> dict[str, tuple[str, str]]:
    r"""Return ``{log: (partition, subscription)}``: the owner of each pending-ack log, read-only.

    From the broker's own record (:data:`PENDING_ACK_OWNERS`, written
    before a subscription's log is opened), not from the log's name: topic
    ``a`` with subscription ``b-c`` and topic ``a-b`` with subscription
    ``c`` have the same log name. A value that is not ``topic\nsubscription``
    is a :class:`CorruptEntryError` naming the log.
    """
    owners = {}
    for log, raw in _compacted_items(_directory(directory), PENDING_ACK_OWNERS):
        topic, sep, sub = raw.decode("utf-8", "replace").partition("\n")
        if not sep or not topic or not sub:
            raise CorruptEntryError(
                f"{PENDING_ACK_OWNERS}: the owner of {log} is {raw!r}, not 'topic\\nsubscription'",
                position=None,
                offset=0,
            )
        owners[log] = (topic, sub)
    return owners


def _partitions(path: Path, topic: str, names: set[str]) -> list[TopicName]:
    """Return the partitions of ``topic`` the directory knows (InvalidTopicNameError if none)."""
    tn = TopicName.parse(topic)
    if tn.is_partition:
        if tn.full in names:
            return [tn]
        count = _partition_count(path, tn.base.full)
        if count is not None and tn.partition < count:
            return [tn]
    else:
        n = _partition_count(path, tn.full)
        if n is not None:
            return [tn] if n == 0 else [tn.partition_name(i) for i in range(n)]
        if tn.full in names:
            return [tn]
    raise InvalidTopicNameError(
        f"topic {tn.full} does not exist in {path}", argument="topic", value=topic
    )


def internal_stats(directory: str | os.PathLike[str], name: str) -> dict[str, dict[str, Any]]:
    """Return the internal stats of a topic's managed ledgers, or of any managed ledger.

    ``name`` is a managed-ledger name as listed by :func:`describe_logs`
    (``__transaction_log_0``, a pending-ack log) or a topic name in any
    accepted form (a partitioned topic gives one entry per partition).
    Returns ledger name -> :func:`ledger_internal_stats`.
    """
    path = _directory(directory)
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError(
            f"name must be a non-empty str, got {name!r}", argument="topic", value=name
        )
    names = set(_names(path))
    wanted = [name] if name in names else [p.full for p in _partitions(path, name, names)]
    out: dict[str, dict[str, Any]] = {}
    for ledger in wanted:
        with _ledger(path, ledger) as ml:
            if ml is None:  # a partition never written yet
                out[ledger] = {
                    "name": ledger,
                    "kind": log_kind(ledger),
                    "number_of_entries": 0,
                    "first_position": None,
                    "last_position": None,
                    "ledgers": [],
                    "cursors": {},
                }
            else:
                out[ledger] = ledger_internal_stats(ml)
    return out


# ------------------------------------------------------------- coordinators


def coordinator_ids(directory: str | os.PathLike[str]) -> list[int]:
    """Ids of the coordinators whose log is in ``directory``, ascending."""
    return log_ids(_names(_directory(directory)))


def _remembered(path: Path, tc_id: int) -> dict[TxnID, tuple[TxnStatus, int, bool, str]]:
    """Read ``tc_id``'s terminated-transaction store: txn -> (status, end, timed out, client)."""
    out: dict[TxnID, tuple[TxnStatus, int, bool, str]] = {}
    for key, value in _compacted_items(path, terminated_topic_name(tc_id)):
        state = TerminatedTxnState()
        try:
            state.ParseFromString(value)
            t = state.txns[0]
            status = TxnStatus(t.status)
        except Exception as exc:
            raise CorruptEntryError(
                f"terminated-transaction state of coordinator {tc_id} under key {key!r} is "
                f"corrupt: {exc}",
                key=key,
            ) from exc
        final = TxnStatus.ABORTED if status is TxnStatus.ABORTING else status
        out[TxnID(t.txnid_most_bits, t.txnid_least_bits)] = (
            final,
            t.end_time,
            t.timed_out,
            state.client_name,
        )
    return out


def _sequence_mark(path: Path, tc_id: int) -> int | None:
    """Read the reserved-sequence mark (``coordinators/<id>/max_local_txn_id``; None: absent)."""
    p = path / "coordinators" / str(tc_id) / "max_local_txn_id"
    try:
        text = p.read_text("ascii").strip()
    except (FileNotFoundError, UnicodeDecodeError):
        return None  # absent, or not a number: no mark (as the coordinator reads it)
    except OSError as e:
        raise StorageError(f"{p}: cannot be read: {e}", errno=e.errno) from e
    return int(text) if text.isdigit() else None


class _Coordinator:
    """One coordinator as its files show it: the folded log, the remembered ends."""

    def __init__(self, path: Path, tc_id: int) -> None:
        self.tc_id = tc_id
        with _ledger(path, log_name(tc_id)) as ml:
            if ml is None:
                raise InvalidArgumentError(
                    f"coordinator {tc_id} has no log in {path}", argument="tc_id", value=tc_id
                )
            # The fold opens the coordinator's durable cursor: read-only, its
            # state is the one the writer persisted and nothing is written.
            self.fold = FoldResult.from_native(fold_txn_log(ml, COORDINATOR_CURSOR, tc_id))
            self.summary = _ml_summary(ml)
            self.mark_delete = position_str(ml.open_cursor(COORDINATOR_CURSOR).mark_delete_position)
        self.remembered = _remembered(path, tc_id)
        self.sequence_mark = _sequence_mark(path, tc_id)

    def infos(self) -> list[TransactionInfo]:
        f = self.fold
        statuses = list(TxnStatus)
        out = []
        for i, seq in enumerate(f.seq):
            parts = f.partitions[i] or []
            subs = f.subscriptions[i] or []
            out.append(
                TransactionInfo(
                    txn_id=TxnID(self.tc_id, seq),
                    status=statuses[f.status[i]],
                    timed_out=f.timed_out[i],
                    timeout_ms=f.timeout_ms[i],
                    start_time=f.start_time[i],
                    last_modification_time=f.last_modified[i],
                    client_name=f.client_name[i],
                    partitions=tuple(parts),
                    subscriptions=tuple((t, s) for t, s in subs),
                    log_records=f.positions.count(i),
                )
            )
        return out

    def low_water_mark(self) -> int:
        """Every transaction with ``least_bits <=`` it has ended (from the files).

        With live transactions: the smallest one's sequence - 1, exactly as
        the coordinator computes it. With none: the highest id the log or
        the terminated store names (a lower bound of the live value, which
        is the last id issued; both say the same for what the files hold).
        """
        if self.fold.seq:
            return min(self.fold.seq) - 1
        seen = [t.least_bits for t in self.remembered if t.most_bits == self.tc_id]
        if self.fold.records:
            seen.append(self.fold.max_seq)
        return max(seen, default=-1)


def _coordinators(path: Path, tc_id: int | None = None) -> list[_Coordinator]:
    ids = coordinator_ids(path)
    if tc_id is not None:
        if isinstance(tc_id, bool) or not isinstance(tc_id, int) or tc_id not in ids:
            raise InvalidArgumentError(
                f"coordinator {tc_id!r} not found in {path} (coordinators: {ids})",
                argument="tc_id",
                value=tc_id,
            )
        ids = [tc_id]
    return [_Coordinator(path, i) for i in ids]


def transaction_dict(info: TransactionInfo) -> dict[str, Any]:
    """Return one transaction's metadata as a JSON-able dict (Pulsar's ``transaction-metadata``).

    ``txn_id`` is ``"(most,least)"``, ``status`` its name, ``timeout_at``
    the wall-clock deadline (``start_time + timeout_ms``; 0 when unknown).
    """
    return {
        "txn_id": str(info.txn_id),
        "tc_id": info.txn_id.most_bits,
        "status": info.status.name,
        "timed_out": info.timed_out,
        "timeout_ms": info.timeout_ms,
        "start_time": info.start_time,
        "timeout_at": info.start_time + info.timeout_ms if info.start_time else 0,
        "last_modification_time": info.last_modification_time,
        "client_name": info.client_name,
        "partitions": list(info.partitions),
        "subscriptions": [{"topic": t, "subscription": s} for t, s in info.subscriptions],
        "log_records": info.log_records,
    }


def coordinator_stats(
    directory: str | os.PathLike[str], tc_id: int | None = None
) -> list[dict[str, Any]]:
    """Stats of every coordinator (or of ``tc_id``) from its log and terminated store.

    Per coordinator: ``tc_id``, ``live`` (not yet COMMITTED/ABORTED),
    ``open``, ``ending`` (COMMITTING/ABORTING), ``low_water_mark``,
    ``sequence_mark`` (ids reserved so far), ``terminated_remembered`` and
    its ``remembered_committed`` / ``remembered_aborted``, and ``log``:
    ``ledgers``, ``entries``, ``records`` and ``live_records`` read,
    ``mark_delete`` of the coordinator's cursor.
    """
    path = _directory(directory)
    out = []
    for c in _coordinators(path, tc_id):
        statuses = [TxnStatus(s) for s in c.fold.status]
        ending = sum(1 for s in statuses if s.is_ending)
        remembered = [v[0] for v in c.remembered.values()]
        out.append(
            {
                "tc_id": c.tc_id,
                "live": len(statuses),
                "open": len(statuses) - ending,
                "ending": ending,
                "low_water_mark": c.low_water_mark(),
                "sequence_mark": c.sequence_mark,
                "terminated_remembered": len(remembered),
                "remembered_committed": remembered.count(TxnStatus.COMMITTED),
                "remembered_aborted": remembered.count(TxnStatus.ABORTED),
                "log": {
                    "name": log_name(c.tc_id),
                    **c.summary,
                    "records": c.fold.records,
                    "live_records": c.fold.live_records,
                    "mark_delete": c.mark_delete,
                },
            }
        )
    return out


def _all_infos(path: Path, tc_id: int | None) -> list[TransactionInfo]:
    infos = [i for c in _coordinators(path, tc_id) for i in c.infos()]
    infos.sort(key=lambda i: (i.start_time, i.txn_id))
    return infos


def open_transactions(
    directory: str | os.PathLike[str], tc_id: int | None = None
) -> list[dict[str, Any]]:
    """Every live transaction (OPEN, COMMITTING, ABORTING), oldest first.

    What ``broker.admin.open_transactions()`` answers in the broker's own
    process, from the durable log: a decision still being logged shows as
    OPEN, and a transaction whose final record is durable has left.
    """
    return [transaction_dict(i) for i in _all_infos(_directory(directory), tc_id)]


def slow_transactions(
    directory: str | os.PathLike[str],
    min_age_ms: int,
    *,
    now_ms: int | None = None,
    tc_id: int | None = None,
) -> list[dict[str, Any]]:
    """Live transactions started at least ``min_age_ms`` before ``now_ms`` (wall clock)."""
    if isinstance(min_age_ms, bool) or not isinstance(min_age_ms, int) or min_age_ms < 0:
        raise InvalidArgumentError(
            f"min_age_ms must be a non-negative int, got {min_age_ms!r}",
            argument="min_age_ms",
            value=min_age_ms,
        )
    cutoff = _now_ms(now_ms) - min_age_ms
    infos = _all_infos(_directory(directory), tc_id)
    return [transaction_dict(i) for i in infos if i.start_time <= cutoff]


def late_transactions(
    directory: str | os.PathLike[str], *, now_ms: int | None = None, tc_id: int | None = None
) -> list[dict[str, Any]]:
    """Live transactions past their timeout at ``now_ms`` (not aborted yet, or stuck ending)."""
    now = _now_ms(now_ms)
    infos = _all_infos(_directory(directory), tc_id)
    return [transaction_dict(i) for i in infos if i.start_time + i.timeout_ms <= now]


def transaction_metadata(directory: str | os.PathLike[str], txn_id: TxnID | str) -> dict[str, Any]:
    """Metadata of one transaction: live in its coordinator's log, or remembered as ended.

    A remembered one (PIP-255 store) has its final ``status``,
    ``last_modification_time`` = its end time, no partitions and
    ``start_time`` 0, as ``broker.admin.get_transaction`` answers.
    Raises :class:`TransactionNotFound` when neither knows it.
    """
    tid = _txn_id_arg(txn_id)
    path = _directory(directory)
    if tid.most_bits not in coordinator_ids(path):
        raise TransactionNotFound(
            f"transaction {tid} not found: no coordinator {tid.most_bits} in {path}", txn_id=tid
        )
    c = _Coordinator(path, tid.most_bits)
    for info in c.infos():
        if info.txn_id == tid:
            return transaction_dict(info)
    rec = c.remembered.get(tid)
    if rec is None:
        raise TransactionNotFound(
            f"transaction {tid} not found (unknown, or ended and not remembered)", txn_id=tid
        )
    status, end_time, timed_out, client = rec
    return transaction_dict(
        TransactionInfo(
            txn_id=tid,
            status=status,
            timed_out=timed_out,
            timeout_ms=0,
            start_time=0,
            last_modification_time=end_time,
            client_name=client or None,
            partitions=(),
            subscriptions=(),
        )
    )


# ------------------------------------------------------- transaction buffer


class _NoOutcomes:
    """Outcomes for a buffer only replayed (a read-only view asks none)."""

    def low_water_mark(self, tc_id: int) -> int:
        return -1

    def participant_outcome(self, txn_id: TxnID) -> bool | None:
        return None


def replay_partition(ml: ManagedLedger, partition: str) -> dict[str, Any]:
    """Replay a partition's whole ledger with the transaction buffer's own recovery.

    Returns ``entries``, ``markers``, ``committed`` / ``aborted`` (markers
    seen), ``ongoing`` (txn -> first position, oldest first),
    ``last_position``, ``max_read_position`` and ``lag`` (entries from the
    READ_COMMITTED limit to the end), as :class:`TransactionBuffer` computes
    them for the broker. Positions are :class:`Position` objects here.
    """
    _ledger_arg(ml)
    if not isinstance(partition, str) or not partition:
        raise InvalidArgumentError(
            f"partition must be a non-empty str, not {partition!r:.80}",
            argument="partition",
            value=repr(partition)[:80],
        )
    tb = TransactionBuffer(partition, ml, _NoOutcomes())
    counts = tb.recover()
    end = tb.uncommitted_limit  # just after the last durable entry
    return {
        "entries": counts["entries"],
        "markers": counts["markers"],
        "committed": counts["committed"],
        "aborted": counts["aborted"],
        "ongoing": {(t.most_bits, t.least_bits): p for t, p in tb.ongoing.items()},
        "last_position": None if end is None else Position(end.ledger_id, end.entry_id - 1),
        "max_read_position": tb.max_read_position,
        "lag": tb.lag(),
    }


def snapshot_info(
    directory: str | os.PathLike[str], partition: TopicName | str, *, now_ms: int | None = None
) -> dict[str, Any] | None:
    """Return the partition's newest transaction-buffer snapshot, or None if it has none.

    Read from its namespace's compacted snapshot topic: ``max_read_position``,
    ``aborted`` (count), ``snapshot_time_ms`` and ``age_ms`` (None when the
    snapshot carries no time).
    """
    now = _now_ms(now_ms)
    if not isinstance(partition, TopicName):
        partition = TopicName.parse(partition)  # a name: parsed, or a typed error naming it
    raw = _compacted_get(
        _directory(directory), snapshot_topic(partition.namespace_name), partition.full
    )
    if raw is None:
        return None
    snap = TransactionBufferSnapshot()
    try:
        snap.ParseFromString(raw)
    except Exception as exc:
        raise CorruptEntryError(
            f"snapshot of {partition.full} is not a TransactionBufferSnapshot: {exc}",
            key=partition.full,
        ) from exc
    taken = snap.snapshot_time_ms if snap.HasField("snapshot_time_ms") else None
    return {
        "max_read_position": f"{snap.max_read_position_ledgerId}:{snap.max_read_position_entryId}",
        "aborted": len(snap.abort_txn_metadata),
        "snapshot_time_ms": taken,
        "age_ms": None if taken is None else max(0, now - taken),
    }


def low_water_marks(directory: str | os.PathLike[str]) -> dict[str, int]:
    """Every coordinator's low water mark from the files (keys: coordinator ids as text)."""
    return {str(c.tc_id): c.low_water_mark() for c in _coordinators(_directory(directory))}


def transaction_buffer_stats(
    directory: str | os.PathLike[str], topic: str, *, now_ms: int | None = None
) -> list[dict[str, Any]]:
    """Transaction-buffer stats of every partition of ``topic``, from its ledger.

    Per partition: ``topic`` (full name), ``max_read_position``,
    ``last_position``, ``lag`` (READ_COMMITTED lag in entries), ``ongoing``
    and ``aborted`` counts, ``committed`` (COMMIT markers in the ledger),
    ``ongoing_transactions`` (``txn_id``, ``first_position``), ``entries``,
    ``markers``, the coordinators' ``low_water_marks`` and ``snapshot``
    (:func:`snapshot_info`, None when the partition has none).
    """
    path = _directory(directory)
    partitions = _partitions(path, topic, set(_names(path)))
    lwm = low_water_marks(path)
    out = []
    for tn in partitions:
        with _ledger(path, tn.full) as ml:
            if ml is None:
                r: dict[str, Any] = {
                    "entries": 0,
                    "markers": 0,
                    "committed": 0,
                    "aborted": 0,
                    "ongoing": {},
                    "last_position": None,
                    "max_read_position": None,
                    "lag": 0,
                }
            else:
                r = replay_partition(ml, tn.full)
        out.append(
            {
                "topic": tn.full,
                "max_read_position": position_str(r["max_read_position"]),
                "last_position": position_str(r["last_position"]),
                "lag": r["lag"],
                "ongoing": len(r["ongoing"]),
                "aborted": r["aborted"],
                "committed": r["committed"],
                "ongoing_transactions": [
                    {"txn_id": f"({t[0]},{t[1]})", "first_position": position_str(p)}
                    for t, p in r["ongoing"].items()
                ],
                "entries": r["entries"],
                "markers": r["markers"],
                "low_water_marks": lwm,
                "snapshot": snapshot_info(path, tn, now_ms=now_ms),
            }
        )
    return out


# ---------------------------------------------------------------- pending ack


def _held_dict(txn: TxnID, acks: TxnAcks) -> dict[str, Any]:
    """One transaction's held acks as the admin shows them (JSON-ready)."""
    held: list[dict[str, Any]] = []
    if acks.cumulative is not None:
        c = acks.cumulative
        ack: dict[str, Any] = {"position": f"{c.ledger_id}:{c.entry_id}"}
        if c.batch_size > 1:
            ack["batch_size"] = c.batch_size
            ack["batch_index"] = c.batch_index
        held.append(ack)
    for entry, (size, acked) in acks.individual.items():
        ack = {"position": f"{entry.ledger_id}:{entry.entry_id}"}
        if acked is not None:
            ack["batch_size"] = size
            ack["batch_indexes"] = list(absent_indexes(acked, size))
        held.append(ack)
    return {
        "txn_id": str(txn),
        "ack_type": "cumulative" if acks.cumulative is not None else "individual",
        "acks": held,
    }


def pending_ack_stats(
    directory: str | os.PathLike[str], topic: str, subscription: str
) -> list[dict[str, Any]]:
    """Pending-ack stats of ``subscription`` on every partition of ``topic``, from its log.

    Per partition: ``topic``, ``subscription``, ``mark_delete_position`` of
    the subscription's cursor, ``ongoing`` (transactions holding acks) with
    ``ongoing_transactions`` (``txn_id``, ``ack_type``, ``acks``: what
    the transaction holds, as the store's recovery folds its records: each
    ``position`` and, for a batched message, ``batch_size`` and the
    ``batch_indexes`` acked -- for a cumulative ack, its one position and
    ``batch_index``), ``committed_in_log`` / ``aborted_in_log``
    (ended transactions whose records are not trimmed yet) and ``log``
    (``name``, ``records`` live, ``entries`` stored).

    A partition counts only when the broker recorded ``subscription`` on it
    as its pending-ack log's owner (:func:`pending_ack_owner_map`); none:
    :class:`InvalidArgumentError`.
    """
    path = _directory(directory)
    names = set(_names(path))
    partitions = _partitions(path, topic, names)
    owners = pending_ack_owner_map(path)
    out = []
    found = False
    for tn in partitions:
        sub = subscription_arg(subscription, tn)
        log_ml_name = tn.pending_ack_ledger(sub)
        if owners.get(log_ml_name) != (tn.full, sub):
            # Not this subscription's log (another pair with the same log
            # name owns it) or a subscription the broker never opened here.
            continue
        with _ledger(path, tn.full) as ml:
            has_cursor = ml is not None and sub in ml.cursor_names()
            mark = (
                position_str(ml.open_cursor(sub).mark_delete_position)
                if ml is not None and has_cursor
                else None
            )
        found = True
        fold = LogFold()
        entries = 0
        with _ledger(path, log_ml_name) as log_ml:
            if log_ml is not None:
                entries = _ml_summary(log_ml)["entries"]
                fold = fold_log(replay(log_ml, PENDING_ACK_LOG_CURSOR), log_ml_name)
        ongoing = [_held_dict(txn, acks) for txn, acks in fold.pending.items()]
        out.append(
            {
                "topic": tn.full,
                "subscription": sub,
                "mark_delete_position": mark,
                "ongoing": len(ongoing),
                "ongoing_transactions": ongoing,
                "committed_in_log": len(fold.committed),
                "aborted_in_log": len(fold.aborted),
                "log": {"name": log_ml_name, "records": fold.records, "entries": entries},
            }
        )
    if not found:
        raise InvalidArgumentError(
            f"subscription {subscription!r} not found on topic {topic!r} in {path}",
            argument="subscription",
            value=subscription,
        )
    return out


# ------------------------------------------------------------- batch stats


def _ledger_arg(ml: object) -> None:
    if not isinstance(ml, ManagedLedger):
        raise InvalidArgumentError(
            f"ml must be a ManagedLedger, not {type(ml).__name__}",
            argument="ml",
            value=repr(ml)[:80],
        )


def histogram(values: npt.ArrayLike, bounds: Sequence[float]) -> dict[str, Any]:
    """Return a fixed-bucket histogram shaped like the writer's (Prometheus ``le`` bounds).

    ``bounds`` (upper, inclusive), ``counts`` per bucket (not cumulative;
    the last is ``+Inf``), ``count``, ``sum``, and ``min`` / ``mean`` /
    ``max`` (None when empty).
    """
    try:
        v = np.asarray(values, dtype=np.float64)
        edges = np.asarray(bounds, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(
            f"values and bounds must be sequences of numbers: {e}", argument="values"
        ) from e
    if v.ndim != 1 or edges.ndim != 1:
        raise InvalidArgumentError(
            f"values and bounds must be 1-D (got {v.ndim}-D and {edges.ndim}-D)",
            argument="bounds" if edges.ndim != 1 else "values",
        )
    idx = np.searchsorted(edges, v, side="left")
    counts = (
        np.bincount(idx, minlength=len(bounds) + 1).tolist() if len(v) else [0] * (len(bounds) + 1)
    )
    empty = len(v) == 0
    return {
        "bounds": list(bounds),
        "counts": [int(c) for c in counts],
        "count": len(v),
        "sum": float(v.sum()),
        "min": None if empty else float(v.min()),
        "mean": None if empty else round(float(v.mean()), 3),
        "max": None if empty else float(v.max()),
    }


def _refuse_damage(ml: ManagedLedger, d: Mapping[str, Any]) -> None:
    """Raise :class:`CorruptEntryError` at the first row of scan ``d`` that could not be read.

    Its entry or record is damaged: counting it would give wrong figures,
    skipping it would hide the damage.
    """
    bad = np.flatnonzero(np.asarray(d["status"]) != 0)
    if not len(bad):
        return
    i = int(bad[0])
    lid, eid = int(d["at_ledger_id"][i]), int(d["at_entry_id"][i])
    offsets = d["error_offsets"]
    reason = bytes(d["error_data"][int(offsets[i]) : int(offsets[i + 1])]).decode(
        "utf-8", "replace"
    )
    raise CorruptEntryError(
        f"{ml.name}: entry {lid}:{eid} cannot be read ({reason or 'damaged'}): the first of"
        f" {len(bad)} unreadable row(s) among entries {lid}:{int(d['at_entry_id'][0])}-"
        f"{int(d['at_entry_id'][-1])} scanned",
        position=(lid, eid),
        offset=0,
    )


def _scan_entries(ml: ManagedLedger, kind: str) -> dict[str, npt.NDArray[Any]]:
    """Per stored entry of ``ml``: records, bytes, batched, and the record time spread (ms).

    An entry or record that cannot be read is a :class:`CorruptEntryError`
    naming its position, never counted or skipped.
    """
    records: list[npt.NDArray[Any]] = []
    sizes: list[npt.NDArray[Any]] = []
    batched: list[npt.NDArray[Any]] = []
    spread: list[npt.NDArray[Any]] = []
    for lid, n, _sealed in ml.ledgers():
        first: int | None = 0
        while n and first is not None:
            d = scan_log(ml, kind, lid, first, n - 1, None, 65536)
            first = d["next_entry"]
            eids = np.asarray(d["at_entry_id"], dtype=np.int64)
            if not len(eids):
                continue
            _refuse_damage(ml, d)
            # Rows of one entry are contiguous: cut where the entry changes.
            starts = np.flatnonzero(np.r_[True, eids[1:] != eids[:-1]])
            counts = np.diff(np.r_[starts, len(eids)])
            records.append(counts)
            sizes.append(np.asarray(d["entry_size"], dtype=np.int64)[starts])
            batched.append(np.asarray(d["batched"], dtype=np.bool_)[starts])
            if kind == "txn":
                t = np.asarray(d["last_modification_time"], dtype=np.int64)
                ok = np.asarray(d["status"]) == 0
                t = np.where(ok & (t > 0), t, -1)
                hi = np.maximum.reduceat(t, starts)
                lo = np.minimum.reduceat(np.where(t < 0, np.iinfo(np.int64).max, t), starts)
                spread.append(np.where(hi >= 0, hi - np.minimum(lo, hi), -1))

    def cat(parts: list[npt.NDArray[Any]], dtype: Any) -> npt.NDArray[Any]:
        return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)

    return {
        "records": cat(records, np.int64),
        "bytes": cat(sizes, np.int64),
        "batched": cat(batched, np.bool_),
        "spread_ms": cat(spread, np.int64),
    }


def _log_batch_stats(
    name: str, e: dict[str, npt.NDArray[Any]], max_records: int, max_size: int, timed: bool
) -> dict[str, Any]:
    recs, size, batched = e["records"], e["bytes"], e["batched"]
    mean_record = np.where(recs > 0, size / np.maximum(recs, 1), 0)
    by_records = batched & (recs >= max_records)
    # One more record of this entry's mean size would not have fitted.
    by_size = batched & ~by_records & (size + mean_record > max_size)
    triggers = {
        "max_records": int(by_records.sum()),
        "max_size": int(by_size.sum()),
        "max_delay_or_forced": int((batched & ~by_records & ~by_size).sum()),
        "unbatched": int((~batched).sum()),
    }
    delay: dict[str, Any] | None = None
    if timed:
        known = e["spread_ms"][batched & (e["spread_ms"] >= 0)]
        delay = histogram(known / 1000.0, BATCH_DELAY_BUCKETS_S)
    return {
        "name": name,
        "entries": len(recs),
        "batched_entries": int(batched.sum()),
        "records": int(recs.sum()),
        "bytes": int(size.sum()),
        "records_per_entry": histogram(recs, BATCH_RECORDS_BUCKETS),
        "bytes_per_entry": histogram(size, BATCH_BYTES_BUCKETS),
        "flush_triggers": triggers,
        "oldest_record_delay_seconds": delay,
    }


def batch_stats(
    directory: str | os.PathLike[str],
    log: str,
    *,
    max_records: int = 512,
    max_size: int = 4 << 20,
) -> dict[str, Any]:
    """PIP-160 batch statistics of the coordinator or pending-ack logs, from the stored entries.

    ``log`` is ``"coordinator"`` or ``"pending-ack"``. Returns ``log``,
    ``enabled`` (the persisted runtime switch, None when never set: the
    broker's configuration decides), ``source`` = ``"files"``, ``total``
    and ``logs`` (one per ledger), each with ``entries``,
    ``batched_entries``, ``records``, ``bytes``, the histograms
    ``records_per_entry`` and ``bytes_per_entry`` (seed 000's buckets, plus
    min/mean/max), ``flush_triggers`` and ``oldest_record_delay_seconds``.

    Flush triggers are inferred, as the Spark audit does: a batched entry
    holding ``max_records`` records was flushed by count, one that one more
    record of its mean size would overflow past ``max_size`` by size, any
    other by the delay (or a forced flush); ``unbatched`` entries were
    written with batching off. The oldest record's delay is not stored: for
    coordinator logs it is bounded below by the spread of the record times
    inside each batched entry (pending-ack records carry no time: None).
    Entries trimmed after their transactions ended are not counted; an entry
    that cannot be read is a :class:`CorruptEntryError` naming its position.
    """
    if log not in LOG_KINDS:
        raise InvalidArgumentError(
            f"log must be one of {list(LOG_KINDS)}, got {log!r}", argument="log", value=log
        )
    for arg, value in (("max_records", max_records), ("max_size", max_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidArgumentError(
                f"{arg} must be a positive int, got {value!r}", argument=arg, value=value
            )
    path = _directory(directory)
    kind = "txn" if log == "coordinator" else "pending_ack"
    logs = []
    parts: list[dict[str, npt.NDArray[Any]]] = []
    for name in _names(path):
        if log_kind(name) != kind:
            continue
        with _ledger(path, name) as ml:
            if ml is None:
                continue
            e = _scan_entries(ml, kind)
        parts.append(e)
        logs.append(_log_batch_stats(name, e, max_records, max_size, kind == "txn"))
    merged = {
        k: np.concatenate([p[k] for p in parts]) if parts else np.zeros(0, np.int64)
        for k in ("records", "bytes", "batched", "spread_ms")
    }
    merged["batched"] = merged["batched"].astype(np.bool_)
    key = BATCH_SWITCH_KEY[log]
    return {
        "log": log,
        "enabled": read_dynamic_config(path).get(key),
        "source": "files",
        "max_records_assumed": max_records,
        "max_size_assumed": max_size,
        "total": _log_batch_stats("total", merged, max_records, max_size, kind == "txn"),
        "logs": logs,
    }
