"""Settings of one transaction coordinator (names follow Pulsar's broker.conf)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from txnstream.config import BatchedWriteConfig
from txnstream.coordinator.participants import RetryPolicy
from txnstream.errors import ConfigError

#: Flat keyword aliases of ``CoordinatorConfig.batched_write`` fields.
_BATCHED_ALIASES = {
    "batched_write_enabled": "enabled",
    "batched_write_max_records": "max_records",
    "batched_write_max_size": "max_size",
    "batched_write_max_delay_ms": "max_delay_ms",
}


@dataclass(frozen=True)
class CoordinatorConfig:
    """Coordinator settings; :meth:`replace` validates changed copies.

    ``batched_write`` configures the log's BufferedWriter (PIP-160). It is
    a :class:`~txnstream.config.BatchedWriteConfig`, the one definition and
    validation of batched-write settings (the broker's ``BrokerConfig``
    holds the same object). Batching is **off** by default, as Pulsar's
    ``transactionLogBatchedWriteEnabled=false``: callers that want it say
    so (``batched_write=BatchedWriteConfig(enabled=True)``, or the flat
    aliases ``batched_write_enabled``/``_max_records``/``_max_size``/
    ``_max_delay_ms`` accepted by :meth:`replace` and
    ``TransactionCoordinator.open``). Only the writer's own limits are
    checked here; the broker's stricter PIP-160 minimums apply where
    broker settings are read (``BrokerConfig``).

    ``transaction_meta_persist_*`` are PIP-255's three settings (count 0 =
    idempotent end off; the durations must be finite and positive).
    ``sequence_reserve_block`` is how many ids one durable reservation of
    the sequence mark covers. ``end_workers`` threads run background ends
    (timeouts, recovery resumes); each run makes at most
    ``background_end_attempts`` attempts on failing participants, then the
    end is rescheduled with backoff (``retry``) so the pool keeps moving.
    """

    default_timeout_ms: int = 60_000
    max_timeout_ms: int = 7 * 24 * 3_600_000
    batched_write: BatchedWriteConfig = field(default_factory=BatchedWriteConfig)
    transaction_meta_persist_count: int = 0
    transaction_meta_persist_time_in_hour: float = 72
    transaction_meta_expire_check_interval_in_second: float = 300
    sequence_reserve_block: int = 1 << 16
    end_workers: int = 4
    background_end_attempts: int = 3
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        positive_ints = (
            "default_timeout_ms",
            "max_timeout_ms",
            "sequence_reserve_block",
            "end_workers",
            "background_end_attempts",
        )
        for key in positive_ints:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(
                    f"{key} must be a positive integer, got {value!r}", key=key, value=str(value)
                )
        if not isinstance(self.batched_write, BatchedWriteConfig):
            raise ConfigError(
                f"batched_write must be a BatchedWriteConfig, got {self.batched_write!r}",
                key="batched_write",
                value=str(self.batched_write),
            )
        value = self.transaction_meta_persist_count
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            key = "transaction_meta_persist_count"
            raise ConfigError(
                f"{key} must be an integer >= 0, got {value!r}", key=key, value=str(value)
            )
        for key, unit_ms in (
            ("transaction_meta_persist_time_in_hour", 3_600_000),
            ("transaction_meta_expire_check_interval_in_second", 1000),
        ):
            value = getattr(self, key)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value * unit_ms < 1
            ):
                raise ConfigError(
                    f"{key} must be a finite number of at least 1 ms, got {value!r}",
                    key=key,
                    value=str(value),
                )
        if self.default_timeout_ms > self.max_timeout_ms:
            raise ConfigError(
                f"default_timeout_ms {self.default_timeout_ms} exceeds max_timeout_ms "
                f"{self.max_timeout_ms}",
                key="default_timeout_ms",
                value=str(self.default_timeout_ms),
            )

    @property
    def batched_write_enabled(self) -> bool:
        """``batched_write.enabled``."""
        return self.batched_write.enabled

    @property
    def batched_write_max_records(self) -> int:
        """``batched_write.max_records``."""
        return self.batched_write.max_records

    @property
    def batched_write_max_size(self) -> int:
        """``batched_write.max_size``."""
        return self.batched_write.max_size

    @property
    def batched_write_max_delay_ms(self) -> float:
        """``batched_write.max_delay_ms``."""
        return self.batched_write.max_delay_ms

    @property
    def persist_time_ms(self) -> int:
        """``transaction_meta_persist_time_in_hour`` in milliseconds."""
        return int(self.transaction_meta_persist_time_in_hour * 3_600_000)

    @property
    def expire_check_interval_ms(self) -> int:
        """``transaction_meta_expire_check_interval_in_second`` in milliseconds."""
        return int(self.transaction_meta_expire_check_interval_in_second * 1000)

    @classmethod
    def from_broker_config(cls, broker: Any, **changes: Any) -> CoordinatorConfig:
        """Build from a :class:`txnstream.config.BrokerConfig`.

        Takes its ``transaction_log_batched_write`` section and the PIP-255
        keys from its Pulsar-named extras (``transactionMetaPersistCount``,
        ``transactionMetaPersistTimeInHour``,
        ``transactionMetaExpireCheckIntervalInSecond``; a leading capital as
        in the PIP is accepted too).
        """
        values: dict[str, Any] = {"batched_write": broker.transaction_log_batched_write}
        extra: dict[str, Any] = dict(getattr(broker, "extra", {}) or {})
        keys = {
            "transactionMetaPersistCount": ("transaction_meta_persist_count", int),
            "transactionMetaPersistTimeInHour": ("transaction_meta_persist_time_in_hour", float),
            "transactionMetaExpireCheckIntervalInSecond": (
                "transaction_meta_expire_check_interval_in_second",
                float,
            ),
        }
        for key, (name, conv) in keys.items():
            for spelling in (key, key[0].upper() + key[1:]):
                if spelling in extra:
                    raw = extra[spelling]
                    try:
                        values[name] = conv(raw)
                    except (TypeError, ValueError):
                        raise ConfigError(
                            f"{spelling} must be a number, got {raw!r}",
                            key=spelling,
                            value=str(raw),
                        ) from None
        values.update(changes)
        return cls().replace(**values)

    def replace(self, **changes: Any) -> CoordinatorConfig:
        """Return a copy with ``changes`` applied; unknown keys raise ConfigError.

        The flat ``batched_write_*`` aliases change fields of ``batched_write``.
        """
        names = {f.name for f in dataclasses.fields(self)}
        batched: dict[str, Any] = {}
        for key in list(changes):
            if key in _BATCHED_ALIASES:
                batched[_BATCHED_ALIASES[key]] = changes.pop(key)
            elif key not in names:
                raise ConfigError(f"unknown coordinator setting {key!r}", key=key, value="")
        if batched:
            base = changes.get("batched_write", self.batched_write)
            try:
                changes["batched_write"] = dataclasses.replace(base, **batched)
            except ConfigError as e:
                alias = next(k for k, v in _BATCHED_ALIASES.items() if v == e.key)
                raise ConfigError(
                    f"{alias}: {e.message}", key=alias, value=str(batched.get(str(e.key)))
                ) from None
        return dataclasses.replace(self, **changes)


__all__ = ["CoordinatorConfig"]
