"""Settings of one transaction coordinator (names follow Pulsar's broker.conf)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from txnstream.coordinator.participants import RetryPolicy
from txnstream.errors import ConfigError


@dataclass(frozen=True)
class CoordinatorConfig:
    """Coordinator settings; :meth:`replace` validates changed copies.

    ``transaction_meta_persist_*`` are PIP-255's three settings (count 0 =
    idempotent end off). ``batched_write_*`` configure the log's
    BufferedWriter (PIP-160). ``sequence_reserve_block`` is how many ids one
    durable reservation of the sequence mark covers. ``end_workers`` threads
    run background ends (timeouts, recovery resumes); each run makes at most
    ``background_end_attempts`` attempts on failing participants, then the
    end is rescheduled with backoff (``retry``) so the pool keeps moving.
    """

    default_timeout_ms: int = 60_000
    max_timeout_ms: int = 7 * 24 * 3_600_000
    batched_write_enabled: bool = True
    batched_write_max_records: int = 512
    batched_write_max_size: int = 4 << 20
    batched_write_max_delay_ms: float = 1
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
            "batched_write_max_records",
            "batched_write_max_size",
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
        delay = self.batched_write_max_delay_ms
        if isinstance(delay, bool) or not isinstance(delay, int | float) or not 0 <= delay < 1e9:
            raise ConfigError(
                f"batched_write_max_delay_ms must be a number >= 0, got {delay!r}",
                key="batched_write_max_delay_ms",
                value=str(delay),
            )
        for key, value in (
            ("transaction_meta_persist_count", self.transaction_meta_persist_count),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(
                    f"{key} must be an integer >= 0, got {value!r}", key=key, value=str(value)
                )
        for key in (
            "transaction_meta_persist_time_in_hour",
            "transaction_meta_expire_check_interval_in_second",
        ):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"{key} must be > 0, got {value!r}", key=key, value=str(value))
        if self.default_timeout_ms > self.max_timeout_ms:
            raise ConfigError(
                f"default_timeout_ms {self.default_timeout_ms} exceeds max_timeout_ms "
                f"{self.max_timeout_ms}",
                key="default_timeout_ms",
                value=str(self.default_timeout_ms),
            )

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
        bw = broker.transaction_log_batched_write
        values: dict[str, Any] = {
            "batched_write_enabled": bw.enabled,
            "batched_write_max_records": bw.max_records,
            "batched_write_max_size": bw.max_size,
            "batched_write_max_delay_ms": bw.max_delay_ms,
        }
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
        """Return a copy with ``changes`` applied; unknown keys raise ConfigError."""
        names = {f.name for f in dataclasses.fields(self)}
        for key in changes:
            if key not in names:
                raise ConfigError(f"unknown coordinator setting {key!r}", key=key, value="")
        return dataclasses.replace(self, **changes)


__all__ = ["CoordinatorConfig"]
