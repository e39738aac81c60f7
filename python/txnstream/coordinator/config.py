"""Settings of one transaction coordinator (names follow Pulsar's broker.conf).

:class:`CoordinatorConfig` holds them, validated at construction;
:class:`RetryPolicy` is the backoff for participants that fail transiently.
Every duration carries its unit in its name (``*_ms``; PIP-255's own keys
say ``_in_hour`` / ``_in_second``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from txnstream.config import BatchedWriteConfig, is_finite_number
from txnstream.errors import ConfigError, InvalidArgumentError


def _number(value: object) -> bool:
    return is_finite_number(value)


@dataclass(frozen=True)
class RetryPolicy:
    """Capped exponential backoff for participants that fail transiently.

    A client's end retries until its deadline (``end_timeout_ms``); a
    background end makes one attempt per run and schedules the next run
    after :meth:`backoff_ms` through the timer, so it never holds a thread.
    ``max_attempts`` (None: no limit) caps the attempts of one client call.
    """

    initial_backoff_ms: float = 5.0
    max_backoff_ms: float = 1000.0
    multiplier: float = 2.0
    max_attempts: int | None = None

    def __post_init__(self) -> None:
        for name in ("initial_backoff_ms", "max_backoff_ms", "multiplier"):
            value = getattr(self, name)
            if not _number(value):
                raise InvalidArgumentError(
                    f"{name} must be a finite number, got {value!r}", argument=name, value=value
                )
        if self.initial_backoff_ms < 0 or self.max_backoff_ms < self.initial_backoff_ms:
            raise InvalidArgumentError(
                "retry backoff must satisfy 0 <= initial_backoff_ms <= max_backoff_ms, got "
                f"{self.initial_backoff_ms} and {self.max_backoff_ms}",
                argument="initial_backoff_ms",
                value=self.initial_backoff_ms,
            )
        if self.multiplier < 1:
            raise InvalidArgumentError(
                f"retry multiplier must be >= 1, got {self.multiplier}",
                argument="multiplier",
                value=self.multiplier,
            )
        attempts = self.max_attempts
        if attempts is not None and (
            isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1
        ):
            raise InvalidArgumentError(
                f"max_attempts must be an int >= 1 or None, got {attempts!r}",
                argument="max_attempts",
                value=attempts,
            )

    def backoff_ms(self, attempt: int) -> float:
        """Delay before retry number ``attempt`` (1-based)."""
        exponent = min(max(attempt - 1, 0), 64)  # beyond that the cap applies anyway
        return float(min(self.max_backoff_ms, self.initial_backoff_ms * self.multiplier**exponent))


#: Upper bounds of integer settings (ids, deadlines and counts stay far
#: inside 64 bits and inside what one process can use).
_INT_LIMITS = {
    "default_timeout_ms": 1 << 40,
    "max_timeout_ms": 1 << 40,
    "sequence_reserve_block": 1 << 32,
    "end_workers": 256,
    "end_timeout_ms": 1 << 40,
}

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
    the sequence mark covers. ``end_timeout_ms`` is how long a client's end
    (or ``close()`` draining ends) waits for participants and other
    drivers; after it the caller gets ``TransactionEndPending`` (or its
    subclass ``ParticipantsFailed``) naming the decided outcome, and the
    end completes in the background. ``end_workers`` threads run
    background ends (timeouts, recovery resumes, retries with ``retry``'s
    backoff). ``complete_in_background`` (the broker's choice; off for a
    bare coordinator) lets a client's end return once every participant
    ended -- the outcome durable and visible -- and writes the terminated
    store record and the final COMMITTED/ABORTED record off its path.
    """

    default_timeout_ms: int = 60_000
    max_timeout_ms: int = 7 * 24 * 3_600_000
    batched_write: BatchedWriteConfig = field(default_factory=BatchedWriteConfig)
    transaction_meta_persist_count: int = 0
    transaction_meta_persist_time_in_hour: float = 72
    transaction_meta_expire_check_interval_in_second: float = 300
    sequence_reserve_block: int = 1 << 16
    end_workers: int = 4
    end_timeout_ms: int = 30_000
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    complete_in_background: bool = False

    def __post_init__(self) -> None:
        for key, limit in _INT_LIMITS.items():
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
                raise ConfigError(
                    f"{key} must be an integer in 1..{limit}, got {value!r}",
                    key=key,
                    value=str(value),
                )
        if not isinstance(self.complete_in_background, bool):
            raise ConfigError(
                f"complete_in_background must be a bool, got {self.complete_in_background!r}",
                key="complete_in_background",
                value=str(self.complete_in_background),
            )
        if not isinstance(self.retry, RetryPolicy):
            raise ConfigError(
                f"retry must be a RetryPolicy, got {self.retry!r}",
                key="retry",
                value=str(self.retry),
            )
        if not isinstance(self.batched_write, BatchedWriteConfig):
            raise ConfigError(
                f"batched_write must be a BatchedWriteConfig, got {self.batched_write!r}",
                key="batched_write",
                value=str(self.batched_write),
            )
        value = self.transaction_meta_persist_count
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1 << 32:
            key = "transaction_meta_persist_count"
            raise ConfigError(
                f"{key} must be an integer in 0..{1 << 32}, got {value!r}",
                key=key,
                value=str(value),
            )
        for key, unit_ms in (
            ("transaction_meta_persist_time_in_hour", 3_600_000),
            ("transaction_meta_expire_check_interval_in_second", 1000),
        ):
            value = getattr(self, key)
            if not is_finite_number(value) or not 1 <= value * unit_ms <= 1 << 40:
                raise ConfigError(
                    f"{key} must be a finite number from 1 ms to 2**40 ms, got {value!r}",
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
        given: dict[str, str] = {}  # field name -> the key the user wrote
        for key, (name, conv) in keys.items():
            for spelling in (key, key[0].upper() + key[1:]):
                if spelling in extra:
                    given[name] = spelling
                    raw = extra[spelling]
                    try:
                        if isinstance(raw, bool) or (conv is int and isinstance(raw, float)):
                            raise TypeError  # True is not 1, nor 2.9 a count of 2
                        values[name] = conv(raw)
                    except (TypeError, ValueError, OverflowError):
                        raise ConfigError(
                            f"{spelling} must be a number, got {raw!r}",
                            key=spelling,
                            value=str(raw),
                        ) from None
        values.update(changes)
        try:
            return cls().replace(**values)
        except ConfigError as e:
            if e.key not in given:
                raise
            spelling = given[e.key]  # name the key the user wrote, not our field
            raise ConfigError(
                str(e).replace(e.key, spelling), key=spelling, value=str(extra[spelling])
            ) from None

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


__all__ = ["CoordinatorConfig", "RetryPolicy"]
