"""Broker configuration: :class:`BrokerConfig`, loadable from Pulsar's key names.

Settings come from a dict, a Pulsar-style ``broker.conf`` (``key=value``
lines) or TOML, under Pulsar's names where Pulsar has one::

    transactionLogBatchedWriteEnabled=true
    transactionLogBatchedWriteMaxRecords=512
    transactionLogBatchedWriteMaxSize=4194304
    transactionLogBatchedWriteMaxDelayInMillis=1
    transactionPendingAckBatchedWriteEnabled=false
    ...

TOML may also group a section's settings in a table named after the
attribute (``[transaction_log_batched_write]`` with ``enabled``,
``max_records``, ``max_size``, ``max_delay_ms``). Keys txnstream does not
know are kept in :attr:`BrokerConfig.extra` (a real ``broker.conf`` holds
hundreds), so later components can read their own (the coordinator reads
PIP-255's ``transactionMetaPersist*`` keys from there); one within two
typos of a key txnstream reads is logged as a warning.

The embedded broker's own settings (:data:`BROKER_SETTINGS`) take Pulsar's
key where Pulsar has one (``managedLedgerMaxEntriesPerLedger``,
``brokerDeduplicationEnabled``, ``allowAutoTopicCreation``, ...) and a
key in the same style where it has none (``transactionCoordinatorCount``);
the attribute name is accepted too (``coordinators = 2`` in TOML). Pulsar's
``managedLedgerOffloadThresholdInSeconds`` sets ``offload_threshold_ms``
(as ``managedLedgerOffloadThresholdMs`` does; both given must agree).

Validation follows PIP-160: with batched writes enabled, ``max_records``
below 10, ``max_size`` below 128 KiB or ``max_delay`` below 1 ms are rejected
with a :class:`~txnstream.errors.ConfigError` naming the key and value.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from txnstream._native import MAX_BATCH_SIZE, MAX_ENTRY_SIZE
from txnstream.durable_file import write_atomically
from txnstream.errors import ConfigError

log = logging.getLogger(__name__)

__all__ = [
    "BROKER_SETTINGS",
    "DYNAMIC_CONFIG_FILE",
    "DYNAMIC_SETTINGS",
    "MIN_BROKER_MAX_DELAY_MS",
    "MIN_BROKER_MAX_RECORDS",
    "MIN_BROKER_MAX_SIZE",
    "BatchedWriteConfig",
    "BrokerConfig",
    "apply_dynamic_config",
    "read_dynamic_config",
    "write_dynamic_config",
]

#: Smallest ``…BatchedWriteMaxRecords`` the broker accepts with the feature on.
MIN_BROKER_MAX_RECORDS: Final = 10
#: Smallest ``…BatchedWriteMaxSize`` (bytes) accepted with the feature on.
MIN_BROKER_MAX_SIZE: Final = 128 * 1024
#: Smallest ``…BatchedWriteMaxDelayInMillis`` accepted with the feature on.
MIN_BROKER_MAX_DELAY_MS: Final = 1.0
#: Longest batching delay the writer takes (a day; Rust `delay_from_millis`).
MAX_WRITER_DELAY_MS: Final = 86_400_000

# Attribute of BrokerConfig -> Pulsar key prefix.
_SECTIONS: Final = {
    "transaction_log_batched_write": "transactionLogBatchedWrite",
    "pending_ack_batched_write": "transactionPendingAckBatchedWrite",
}
# Pulsar key suffix -> BatchedWriteConfig field.
_SUFFIXES: Final = {
    "Enabled": "enabled",
    "MaxRecords": "max_records",
    "MaxSize": "max_size",
    "MaxDelayInMillis": "max_delay_ms",
}
_FIELD_SUFFIX: Final = {v: k for k, v in _SUFFIXES.items()}
_PULSAR_KEYS: Final = {
    prefix + suffix: (section, fld)
    for section, prefix in _SECTIONS.items()
    for suffix, fld in _SUFFIXES.items()
}


def _config_path(path: object) -> Path:
    """Return ``path`` as a Path if it is a usable file path (else ConfigError naming it)."""
    if not isinstance(path, str | os.PathLike):
        raise ConfigError(
            f"a configuration file path must be a str or os.PathLike, got {path!r}",
            key="path",
            value=repr(path),
        )
    text = os.fspath(path)
    if not isinstance(text, str) or not text or "\0" in text:
        raise ConfigError(
            f"a configuration file path must be a non-empty text path without NUL, got {path!r}",
            key="path",
            value=repr(path),
        )
    return Path(text)


def is_finite_number(value: object) -> bool:
    """Return True for a finite int or float (not a bool; an int must fit a float)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond a float's range
        return False


def _check_remote_location(location: str) -> None:
    # fileSystemURI: a path, or a URL whose file system fsspec knows and can
    # load (checked without connecting or creating anything).
    if "\0" in location:
        raise _error("fileSystemURI", location, "must not contain NUL")
    if "://" not in location:
        return  # a path
    import fsspec  # type: ignore[import-untyped]

    for part in location.split("::"):  # fsspec chains: simplecache::s3://...
        protocol = fsspec.core.split_protocol(part)[0]
        if protocol in (None, "file", "local"):
            continue
        try:
            fsspec.get_filesystem_class(protocol)
        except (ImportError, ValueError) as e:
            raise _error(
                "fileSystemURI", location, f"no usable file system for {protocol!r}: {e}"
            ) from e


def _error(key: str, value: object, reason: str) -> ConfigError:
    message = f"invalid configuration {key}={value!r}: {reason}"
    return ConfigError(message, key=key, value=str(value))


def _as_bool(key: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise _error(key, value, "expected true or false")


#: Pulsar's offload-by-age setting (seconds; -1: off): sets ``offload_threshold_ms``.
OFFLOAD_SECONDS_KEY: Final = "managedLedgerOffloadThresholdInSeconds"
#: Keys read from ``extra`` by the coordinators (PIP-255; a leading capital too).
_PIP_255_KEYS: Final = (
    "transactionMetaPersistCount",
    "transactionMetaPersistTimeInHour",
    "transactionMetaExpireCheckIntervalInSecond",
)


def _known_keys() -> list[str]:
    # Every key txnstream reads: Pulsar's names, attribute names, sections, PIP-255's.
    keys = [*BROKER_SETTINGS, *_SETTING_KEY, *_PULSAR_KEYS, *_SECTIONS, OFFLOAD_SECONDS_KEY]
    for k in _PIP_255_KEYS:
        keys += [k, k[0].upper() + k[1:]]
    return keys


def _within_two_edits(a: str, b: str) -> bool:
    # Levenshtein distance <= 2 (a typo), case-insensitively; stops early.
    a, b = a.lower(), b.lower()
    if abs(len(a) - len(b)) > 2 or len(set(a) ^ set(b)) > 4:  # an edit changes at most 2
        return False
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
        if min(row) > 2:
            return False
    return row[-1] <= 2


def _warn_near_misses(extra: Mapping[Any, Any]) -> None:
    """Log a warning for each kept key within two typos of one txnstream reads.

    Unknown keys are kept, not refused (a Pulsar broker.conf has hundreds
    txnstream does not use); a misspelling of one it does use would
    otherwise leave that setting at its default without a word. Pulsar's
    own keys are further than that from txnstream's (checked in the tests).
    """
    known = _known_keys()
    for key in extra:
        if not isinstance(key, str) or key in known:
            continue
        close = next((k for k in known if _within_two_edits(key, k)), None)
        if close is not None:
            log.warning(
                "setting %r is not one txnstream reads (kept, unused); did you mean %r?",
                key,
                close,
            )


def _as_int(key: str, value: object) -> int:
    if isinstance(value, bool):
        raise _error(key, value, "expected an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip().replace("_", ""), 10)
        except ValueError:
            pass
    raise _error(key, value, "expected an integer")


def _as_str(key: str, value: object) -> str:
    if isinstance(value, str) and value.isprintable():
        return value.strip()
    raise _error(key, value, "expected a printable string")


def _as_millis(key: str, value: object) -> float:
    if isinstance(value, bool):
        raise _error(key, value, "expected a number of milliseconds")
    ms: float
    if isinstance(value, int | float):
        ms = value
    elif isinstance(value, str):
        # Integral text stays an int, so errors echo the value as written.
        try:
            ms = int(value.strip(), 10)
        except ValueError:
            try:
                ms = float(value.strip())
            except ValueError:
                raise _error(key, value, "expected a number of milliseconds") from None
    else:
        raise _error(key, value, "expected a number of milliseconds")
    if not is_finite_number(ms):
        raise _error(key, value, "must be finite")
    return ms


_COERCE: Final = {
    "enabled": _as_bool,
    "max_records": _as_int,
    "max_size": _as_int,
    "max_delay_ms": _as_millis,
}


def _as_recovery_mode(key: str, value: object) -> str:
    if value not in ("lazy", "eager"):
        raise _error(key, value, "must be 'lazy' or 'eager'")
    return str(value)


def _as_partition_type(key: str, value: object) -> str:
    if isinstance(value, str) and value.strip() in ("non-partitioned", "partitioned"):
        return value.strip()
    raise _error(key, value, "expected non-partitioned or partitioned")


#: The broker's own settings: key -> (attribute, coerce, minimum, maximum).
#: Bounds apply to ints; durations carry their unit in the key.
BROKER_SETTINGS: Final[dict[str, tuple[str, Any, int | None, int | None]]] = {
    "transactionCoordinatorCount": ("coordinators", _as_int, 1, 1024),
    "transactionTimeoutMs": ("transaction_timeout_ms", _as_int, 1, 1 << 40),
    "transactionMaxTimeoutMs": ("max_transaction_timeout_ms", _as_int, 1, 1 << 40),
    "transactionEndTimeoutMs": ("end_timeout_ms", _as_int, 1, 1 << 40),
    "transactionPendingAckTrimIntervalMs": ("pending_ack_trim_interval_ms", _as_int, 1, 1 << 31),
    "brokerDeduplicationEnabled": ("deduplication_enabled", _as_bool, None, None),
    "brokerDeduplicationWindowSize": ("deduplication_window", _as_int, 1, 1 << 24),
    "brokerDeduplicationMaxNumberOfProducers": ("deduplication_max_producers", _as_int, 1, 1 << 24),
    "managedLedgerMaxEntriesPerLedger": ("max_entries_per_ledger", _as_int, 1, 1 << 40),
    "managedLedgerMaxSizePerLedgerMbytes": ("max_size_per_ledger_mb", _as_int, 1, 1 << 20),
    "allowAutoTopicCreation": ("allow_auto_topic_creation", _as_bool, None, None),
    "allowAutoTopicCreationType": ("auto_topic_creation_type", _as_partition_type, None, None),
    "defaultNumPartitions": ("default_num_partitions", _as_int, 1, 10_000),
    "managedLedgerOffloadThresholdInBytes": ("offload_threshold_bytes", _as_int, -1, 1 << 50),
    "managedLedgerOffloadThresholdMs": ("offload_threshold_ms", _as_int, -1, 1 << 50),
    "fileSystemURI": ("tiered_storage_location", _as_str, None, None),
    "transactionBufferSnapshotMaxTransactionCount": (
        "tb_snapshot_max_changes",
        _as_int,
        1,
        1 << 31,
    ),
    "transactionBufferSnapshotMinTimeInMillis": ("tb_snapshot_min_time_ms", _as_int, 1, 1 << 40),
    "topicRecoveryMode": ("topic_recovery", _as_recovery_mode, None, None),
    "topicRecoveryThreads": ("topic_recovery_threads", _as_int, 1, 64),
    "topicIdleUnloadMs": ("topic_idle_unload_ms", _as_int, 0, 1 << 40),
}
_SETTING_KEY: Final = {attr: key for key, (attr, _, _, _) in BROKER_SETTINGS.items()}


@dataclass(frozen=True)
class BatchedWriteConfig:
    """Batched writes (PIP-160) of one kind of log: the thresholds of its BufferedWriter.

    ``enabled`` defaults to ``False`` as in Pulsar. Constructing checks the
    writer's own limits (``max_records >= 1``, ``max_size >= 1``,
    ``max_delay_ms >= 0``); the broker's stricter limits apply through
    :meth:`validate` when the feature is enabled.
    """

    enabled: bool = False
    max_records: int = 512
    max_size: int = 4 << 20
    max_delay_ms: float = 1.0

    def __post_init__(self) -> None:
        """Check types and the writer's own limits (keys named by field)."""
        if not isinstance(self.enabled, bool):
            raise _error("enabled", self.enabled, "expected a bool")
        for name in ("max_records", "max_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise _error(name, value, "expected an int")
        delay = self.max_delay_ms
        if not is_finite_number(delay):
            raise _error("max_delay_ms", delay, "expected a finite number of milliseconds")
        # The writer's own bounds (a batch of up to 2 x max_size must fit one
        # entry; a delay beyond a day is absurd), checked here so the error
        # names the setting at construction, not at the broker's open.
        if not 1 <= self.max_records <= MAX_BATCH_SIZE:
            raise _error("max_records", self.max_records, f"must be in 1..{MAX_BATCH_SIZE}")
        if not 1 <= self.max_size <= MAX_ENTRY_SIZE // 2:
            raise _error("max_size", self.max_size, f"must be in 1..{MAX_ENTRY_SIZE // 2} bytes")
        if not 0 <= self.max_delay_ms <= MAX_WRITER_DELAY_MS:
            raise _error(
                "max_delay_ms", self.max_delay_ms, f"must be in 0..{MAX_WRITER_DELAY_MS} ms"
            )

    def validate(self, prefix: str = "transactionLogBatchedWrite") -> None:
        """Apply the broker limits of PIP-160 when enabled; keys named ``prefix + suffix``."""
        if not self.enabled:
            return
        checks = (
            ("max_records", self.max_records, MIN_BROKER_MAX_RECORDS, ""),
            ("max_size", self.max_size, MIN_BROKER_MAX_SIZE, " bytes"),
            ("max_delay_ms", self.max_delay_ms, MIN_BROKER_MAX_DELAY_MS, " ms"),
        )
        for name, value, minimum, unit in checks:
            if value < minimum:
                key = prefix + _FIELD_SUFFIX[name]
                raise _error(
                    key,
                    value,
                    f"must be at least {minimum}{unit} when {prefix}Enabled=true",
                )

    def writer_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :class:`txnstream.BufferedWriter`."""
        return {
            "max_records": self.max_records,
            "max_size": self.max_size,
            "max_delay_ms": self.max_delay_ms,
            "batch_enabled": self.enabled,
        }


@dataclass
class BrokerConfig:
    """The configuration of one embedded broker (SPEC §4.10).

    Holds the batched-write settings of the transaction coordinator log and
    of pending-ack logs; other components add their sections here. Use
    :meth:`from_dict`, :meth:`from_broker_conf`, :meth:`from_toml` or
    :meth:`load` to read Pulsar-named settings; construction validates.
    """

    transaction_log_batched_write: BatchedWriteConfig = field(default_factory=BatchedWriteConfig)
    pending_ack_batched_write: BatchedWriteConfig = field(default_factory=BatchedWriteConfig)
    extra: dict[str, Any] = field(default_factory=dict)
    #: Transaction coordinators (ids 0..n-1), each with its own log.
    coordinators: int = 1
    #: Timeout of a transaction started without one.
    transaction_timeout_ms: int = 60_000
    #: Longest timeout a transaction may ask for.
    max_transaction_timeout_ms: int = 3 * 3_600_000
    #: How long a commit/abort waits for participants before answering
    #: ``TransactionEndPending`` (the end goes on in the background).
    end_timeout_ms: int = 30_000
    #: How often ended transactions' records are deleted from pending-ack logs.
    pending_ack_trim_interval_ms: int = 200
    #: A retried send (same producer and sequence id) returns the original id.
    deduplication_enabled: bool = True
    #: Recent sequence ids remembered per producer and partition.
    deduplication_window: int = 1024
    #: Producers remembered per partition (least recently used ones go).
    deduplication_max_producers: int = 10_000
    #: Ledger rollover of topic partitions and logs.
    max_entries_per_ledger: int = 50_000
    max_size_per_ledger_mb: int = 2048
    #: Topics are created on first use (else ``admin.create_topic`` first).
    allow_auto_topic_creation: bool = True
    #: ``non-partitioned`` or ``partitioned`` (with ``default_num_partitions``).
    auto_topic_creation_type: str = "non-partitioned"
    default_num_partitions: int = 1
    #: Tiered storage (SPEC §4.8): closed ledgers of a topic partition are
    #: offloaded by the broker's maintenance once the partition holds more
    #: than this many bytes of closed ledgers locally (-1: never by size).
    offload_threshold_bytes: int = -1
    #: ... or once a closed ledger's newest message is older than this (-1: never by age).
    offload_threshold_ms: int = -1
    #: Where offloaded segments go: a directory or an fsspec URL ("": ``<data>/remote``).
    tiered_storage_location: str = ""
    #: A partition's transaction buffer writes a snapshot (SPEC §4.5) after
    #: this many changes (entries and markers) ...
    tb_snapshot_max_changes: int = 1000
    #: ... or this long after its last one when anything changed, and on close.
    tb_snapshot_min_time_ms: int = 5000
    #: ``lazy``: a partition recovers on first use; ``eager``: every partition
    #: recovers in the background from open, on ``topic_recovery_threads`` threads.
    topic_recovery: str = "lazy"
    topic_recovery_threads: int = 4
    #: A loaded partition idle this long (no producer or consumer attached,
    #: nothing in flight) is unloaded by the maintenance round and reloads on
    #: next use, as after a restart (0: never). Memory then follows the
    #: partitions in use, not every partition ever used. Ten minutes: a
    #: reload costs a snapshot read and the subscriptions' pending-ack
    #: recovery, so a partition used every few minutes stays loaded. What a
    #: restart forgets, a reload forgets too (as Pulsar's bundle unload): the
    #: redelivery counts and negative-ack delays of messages not acked, and
    #: a producer's retries older than the snapshot's last 128 sequence ids
    #: (refused as duplicates, never written twice). A partition stays
    #: loaded while it must refuse late sends of a transaction that ended
    #: above its coordinator's low-water mark, and, under an offload policy,
    #: while closed ledgers wait for their upload.
    topic_idle_unload_ms: int = 600_000

    def __post_init__(self) -> None:
        """Validate every section under its Pulsar key names."""
        self.validate()

    def validate(self) -> None:
        """Raise :class:`ConfigError` for the first invalid setting."""
        for section, prefix in _SECTIONS.items():
            value = getattr(self, section)
            if not isinstance(value, BatchedWriteConfig):
                raise _error(section, value, "expected a BatchedWriteConfig")
            value.validate(prefix)
        if not isinstance(self.extra, dict):
            raise _error("extra", self.extra, "expected a dict of Pulsar-named settings")
        for key, (attr, coerce, lo, hi) in BROKER_SETTINGS.items():
            value = getattr(self, attr)
            checked = coerce(key, value)
            if isinstance(value, str) != isinstance(checked, str) or checked != value:
                raise _error(key, value, f"expected a {type(checked).__name__}")
            if lo is not None and hi is not None and not lo <= checked <= hi:
                raise _error(key, value, f"must be in {lo}..{hi}")
        if self.transaction_timeout_ms > self.max_transaction_timeout_ms:
            raise _error(
                "transactionTimeoutMs",
                self.transaction_timeout_ms,
                f"exceeds transactionMaxTimeoutMs={self.max_transaction_timeout_ms}",
            )
        _check_remote_location(self.tiered_storage_location)

    # -- loading ---------------------------------------------------------

    @classmethod
    def from_dict(cls, settings: Mapping[str, Any]) -> BrokerConfig:
        """Build from Pulsar-named keys (values may be strings, as in broker.conf).

        Nested mappings named after a section (``transaction_log_batched_write``,
        ``pending_ack_batched_write``) are read with field names as keys.
        """
        if not isinstance(settings, Mapping):
            raise _error("settings", settings, "expected a mapping of setting names to values")
        values: dict[str, dict[str, Any]] = {s: {} for s in _SECTIONS}
        extra: dict[str, Any] = {}
        flat: dict[str, Any] = {}
        offload_seconds: int | None = None
        # Where each setting was given: one given twice, under two names (a
        # Pulsar key and its attribute, or a section table and its flat key),
        # with two values is refused rather than letting the last one win.
        given: dict[tuple[str, str], tuple[str, object]] = {}

        def once(slot: tuple[str, str], key: str, value: object) -> None:
            first = given.setdefault(slot, (key, value))
            if first[1] != value:
                raise _error(
                    key, value, f"also given as {first[0]}={first[1]!r}; give one of the two"
                )

        for key, value in settings.items():
            named = key
            if key in _SETTING_KEY:  # the attribute name of a broker setting
                key = _SETTING_KEY[key]
            if key == OFFLOAD_SECONDS_KEY:  # Pulsar's offload-by-age key, in seconds
                if isinstance(value, str) and value.strip() == "":
                    continue
                offload_seconds = _as_int(key, value)
                if not -1 <= offload_seconds <= 1 << 40:
                    raise _error(key, value, f"expected an integer in -1..{1 << 40}")
            elif key in BROKER_SETTINGS:
                if isinstance(value, str) and value.strip() == "":
                    continue
                attr, coerce, _, _ = BROKER_SETTINGS[key]
                flat[attr] = coerce(key, value)
                once(("", attr), named, flat[attr])
            elif key in _SECTIONS and not isinstance(value, Mapping):
                raise _error(key, value, "expected a table of settings")
            elif key in _SECTIONS:
                assert isinstance(value, Mapping)
                prefix = _SECTIONS[key]
                for name, v in value.items():
                    if name not in _COERCE:
                        raise _error(f"{key}.{name}", v, f"unknown setting; use {list(_COERCE)}")
                    values[key][name] = _COERCE[name](f"{prefix}{_FIELD_SUFFIX[name]}", v)
                    once((key, name), f"{key}.{name}", values[key][name])
            elif key in _PULSAR_KEYS:
                section, name = _PULSAR_KEYS[key]
                if isinstance(value, str) and value.strip() == "":
                    continue  # Pulsar treats an empty value as "use the default"
                values[section][name] = _COERCE[name](key, value)
                once((section, name), key, values[section][name])
            else:
                extra[key] = value
        if offload_seconds is not None:
            ms = -1 if offload_seconds < 0 else offload_seconds * 1000
            if flat.get("offload_threshold_ms", ms) != ms:
                raise _error(
                    OFFLOAD_SECONDS_KEY,
                    offload_seconds,
                    f"disagrees with managedLedgerOffloadThresholdMs={flat['offload_threshold_ms']}"
                    "; give one of the two",
                )
            flat["offload_threshold_ms"] = ms
        _warn_near_misses(extra)
        sections = {s: _section(s, v) for s, v in values.items()}
        return cls(
            transaction_log_batched_write=sections["transaction_log_batched_write"],
            pending_ack_batched_write=sections["pending_ack_batched_write"],
            extra=extra,
            **flat,
        )

    @classmethod
    def from_broker_conf(cls, path: str | Path) -> BrokerConfig:
        """Read a Pulsar ``broker.conf`` (Java properties: ``key=value``, ``#`` comments)."""
        try:
            text = _config_path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path}: cannot be read: {e}", key=str(path), value="") from e
        return cls.from_dict(dict(_parse_properties(text, str(path))))

    @classmethod
    def from_broker_conf_text(cls, text: str) -> BrokerConfig:
        """Like :meth:`from_broker_conf`, from the file's text."""
        if not isinstance(text, str):
            raise ConfigError(
                f"broker.conf text must be a str, got {type(text).__name__}",
                key="<text>",
                value=repr(text)[:80],
            )
        return cls.from_dict(dict(_parse_properties(text, "<text>")))

    @classmethod
    def from_toml(cls, path: str | Path) -> BrokerConfig:
        """Read TOML with Pulsar keys at top level and/or section tables."""
        try:
            with _config_path(path).open("rb") as f:
                data = tomllib.load(f)
        except (tomllib.TOMLDecodeError, RecursionError) as e:  # RecursionError: nested too deep
            raise ConfigError(f"{path}: not TOML we can read: {e}", key=str(path), value="") from e
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path}: cannot be read: {e}", key=str(path), value="") from e
        return cls.from_dict(data)

    @classmethod
    def load(cls, path: str | Path) -> BrokerConfig:
        """Read ``*.toml`` as TOML and anything else as ``broker.conf``."""
        p = _config_path(path)
        return cls.from_toml(p) if p.suffix.lower() == ".toml" else cls.from_broker_conf(p)

    # -- export and runtime changes ---------------------------------------

    def to_pulsar_dict(self) -> dict[str, Any]:
        """Return the settings under Pulsar's key names (round-trips via :meth:`from_dict`)."""
        out: dict[str, Any] = {}
        for section, prefix in _SECTIONS.items():
            cfg = getattr(self, section)
            for suffix, name in _SUFFIXES.items():
                out[prefix + suffix] = getattr(cfg, name)
        for key, (attr, _, _, _) in BROKER_SETTINGS.items():
            out[key] = getattr(self, attr)
        out.update(self.extra)
        return out

    def setting(self, key: str) -> Any:
        """Return a broker setting by its key (``transactionCoordinatorCount``) or attribute."""
        attr = BROKER_SETTINGS[key][0] if key in BROKER_SETTINGS else key
        if attr not in _SETTING_KEY:
            raise _error(key, "", f"unknown broker setting; use one of {sorted(BROKER_SETTINGS)}")
        return getattr(self, attr)

    def set(self, key: str, value: Any) -> None:
        """Change one Pulsar-named setting at runtime, validating first (all or nothing)."""
        if key not in _PULSAR_KEYS:
            raise _error(key, value, "not a dynamic batched-write setting")
        section, name = _PULSAR_KEYS[key]
        updated = dataclasses.replace(getattr(self, section), **{name: _COERCE[name](key, value)})
        updated.validate(_SECTIONS[section])
        setattr(self, section, updated)


def _section(section: str, values: dict[str, Any]) -> BatchedWriteConfig:
    """Build a section, naming a rejected setting by its Pulsar key."""
    try:
        return BatchedWriteConfig(**values)
    except ConfigError as e:
        if e.key not in _FIELD_SUFFIX:
            raise
        key = _SECTIONS[section] + _FIELD_SUFFIX[e.key]
        raise _error(key, values.get(e.key, e.value), e.message.split(": ", 1)[-1]) from None


def _parse_properties(text: str, origin: str) -> Iterator[tuple[str, str]]:
    """Yield ``(key, value)`` of a Java-properties text (``=``, ``:`` or space separated)."""
    pending = ""
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = pending + raw.strip()
        if not pending and (not line or line[0] in "#!"):
            continue
        pending = ""
        if line.endswith("\\") and not line.endswith("\\\\"):
            pending = line[:-1]
            continue
        yield _property(line, origin, lineno, raw)
    if pending:
        # The last line continues onto a line that is not there.
        yield _property(pending, origin, lineno, pending)


def _property(line: str, origin: str, lineno: int, raw: str) -> tuple[str, str]:
    # Java's rule: the key ends at the first '=', ':' or whitespace; then
    # whitespace, at most one '=' or ':', and whitespace again.
    at = next((i for i, c in enumerate(line) if c in "=:" or c.isspace()), len(line))
    key, rest = line[:at], line[at:].lstrip()
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip()
    if not key:
        raise ConfigError(f"{origin}:{lineno}: line without a key", key="", value=raw)
    return key, rest


# -- dynamic settings persisted in the data directory --------------------------

#: The data directory's persisted dynamic settings (Pulsar keeps its dynamic
#: configuration in the metadata store; here it is a file beside the data).
DYNAMIC_CONFIG_FILE: Final = "dynamic-config.toml"
#: Keys that may be persisted there: the batched-write settings, Pulsar-named.
DYNAMIC_SETTINGS: Final = tuple(_PULSAR_KEYS)


def _dynamic_path(directory: str | os.PathLike[str]) -> Path:
    return Path(directory) / DYNAMIC_CONFIG_FILE


def read_dynamic_config(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """Return the settings persisted in ``<directory>/dynamic-config.toml`` ({} if none).

    Values are coerced and checked (:class:`ConfigError` naming the file
    and the key for an unknown key, a bad value or unreadable TOML).
    """
    path = _dynamic_path(directory)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e}", key=str(path), value="") from e
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError) as e:
        raise ConfigError(f"{path}: {e}", key=str(path), value="") from e
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key not in _PULSAR_KEYS:
            raise _error(key, value, f"not a dynamic setting (in {path}); use {DYNAMIC_SETTINGS}")
        out[key] = _COERCE[_PULSAR_KEYS[key][1]](key, value)
    return out


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)  # int or float


def write_dynamic_config(
    directory: str | os.PathLike[str], settings: Mapping[str, Any]
) -> dict[str, Any]:
    """Persist ``settings`` (merged over what is there) in ``<directory>/dynamic-config.toml``.

    Every key must be one of :data:`DYNAMIC_SETTINGS`; values are checked
    first (nothing is written on a :class:`ConfigError`). The file is
    replaced atomically and durably (temp file, fsync, rename, directory
    fsync). Returns every persisted setting. The CLI writes it for a closed
    directory (a running broker reads it at its next open); a running broker
    writes it itself when switched live (``Broker.set_dynamic``).
    """
    if not isinstance(settings, Mapping):
        raise ConfigError(
            f"settings must be a mapping, got {settings!r}", key="settings", value=str(settings)
        )
    merged = read_dynamic_config(directory)
    for key, value in settings.items():
        if key not in _PULSAR_KEYS:
            raise _error(key, value, f"not a dynamic setting; use {DYNAMIC_SETTINGS}")
        merged[key] = _COERCE[_PULSAR_KEYS[key][1]](key, value)
    path = _dynamic_path(directory)
    text = "# Dynamic settings persisted by `txnstream admin`; applied at Broker.open.\n" + "".join(
        f"{k} = {_toml_value(v)}\n" for k, v in sorted(merged.items())
    )
    try:
        write_atomically(path, text.encode("utf-8"))
    except OSError as e:
        raise ConfigError(f"{path}: cannot write: {e}", key=str(path), value="") from e
    return merged


def apply_dynamic_config(directory: str | os.PathLike[str], config: BrokerConfig) -> BrokerConfig:
    """Return ``config`` with the settings persisted in ``directory`` applied over it.

    What ``Broker.open`` calls: dynamic settings changed while the broker
    was closed (``txnstream admin --data DIR batched-log enable``) win over
    the given configuration, as Pulsar's dynamic configuration wins over
    ``broker.conf``. ``config`` itself is not changed; without a persisted
    file it is returned as is. A persisted setting the configuration
    rejects (e.g. batching enabled with ``max_records`` below 10) is a
    :class:`ConfigError` naming the file.
    """
    settings = read_dynamic_config(directory)
    if not settings:
        return config
    out = dataclasses.replace(config, extra=dict(config.extra))
    for key, value in settings.items():
        try:
            out.set(key, value)
        except ConfigError as e:
            raise ConfigError(
                f"{_dynamic_path(directory)}: {e.message}", key=key, value=str(value)
            ) from e
    return out
