"""BrokerConfig: Pulsar key names, broker.conf / TOML loading, PIP-160 validation."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from txnstream.config import BatchedWriteConfig, BrokerConfig
from txnstream.errors import ConfigError, TxnStreamError

PULSAR_CONF = """\
# Pulsar broker.conf excerpt
clusterName=standalone
transactionCoordinatorEnabled=true

### --- Transaction batched writes (PIP-160) --- ###
transactionLogBatchedWriteEnabled=true
transactionLogBatchedWriteMaxRecords=256
transactionLogBatchedWriteMaxSize=1048576
transactionLogBatchedWriteMaxDelayInMillis = 2
transactionPendingAckBatchedWriteEnabled: false
transactionPendingAckBatchedWriteMaxRecords=
! an empty value means "use the default", as in Pulsar
"""


def test_defaults_match_pulsar() -> None:
    cfg = BrokerConfig()
    for section in (cfg.transaction_log_batched_write, cfg.pending_ack_batched_write):
        assert section == BatchedWriteConfig(False, 512, 4 << 20, 1.0)
    assert cfg.to_pulsar_dict()["transactionLogBatchedWriteMaxSize"] == 4 * 1024 * 1024


def test_broker_conf(tmp_path: Path) -> None:
    path = tmp_path / "broker.conf"
    path.write_text(PULSAR_CONF)
    cfg = BrokerConfig.load(path)
    assert cfg.transaction_log_batched_write == BatchedWriteConfig(True, 256, 1 << 20, 2.0)
    assert cfg.pending_ack_batched_write == BatchedWriteConfig()
    assert cfg.extra == {"clusterName": "standalone", "transactionCoordinatorEnabled": "true"}
    assert cfg.transaction_log_batched_write.writer_kwargs() == {
        "max_records": 256,
        "max_size": 1 << 20,
        "max_delay_ms": 2.0,
        "batch_enabled": True,
    }


def test_toml_flat_keys_and_tables(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text(
        "transactionLogBatchedWriteEnabled = true\n"
        "transactionLogBatchedWriteMaxDelayInMillis = 5\n"
        "[pending_ack_batched_write]\n"
        "enabled = true\nmax_records = 64\nmax_size = 262144\nmax_delay_ms = 1.5\n"
    )
    cfg = BrokerConfig.load(path)
    assert cfg.transaction_log_batched_write == BatchedWriteConfig(True, 512, 4 << 20, 5.0)
    assert cfg.pending_ack_batched_write == BatchedWriteConfig(True, 64, 262144, 1.5)


def test_round_trip_through_pulsar_keys() -> None:
    cfg = BrokerConfig.from_dict({"transactionPendingAckBatchedWriteEnabled": "true", "x": 1})
    assert BrokerConfig.from_dict(cfg.to_pulsar_dict()) == cfg


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("transactionLogBatchedWriteMaxRecords", 9),
        ("transactionLogBatchedWriteMaxSize", 128 * 1024 - 1),
        ("transactionLogBatchedWriteMaxDelayInMillis", 0),
        ("transactionPendingAckBatchedWriteMaxRecords", "5"),
        ("transactionPendingAckBatchedWriteMaxSize", "1024"),
        ("transactionPendingAckBatchedWriteMaxDelayInMillis", "0.5"),
    ],
)
def test_broker_limits_when_enabled(key: str, value: object) -> None:
    prefix = key[: key.index("BatchedWrite") + len("BatchedWrite")]
    with pytest.raises(ConfigError) as info:
        BrokerConfig.from_dict({prefix + "Enabled": True, key: value})
    assert info.value.key == key
    assert info.value.value == str(value)
    assert key in str(info.value)
    # The same values are fine while the feature is off.
    BrokerConfig.from_dict({prefix + "Enabled": False, key: value})


def test_boundaries_are_accepted() -> None:
    cfg = BrokerConfig.from_dict(
        {
            "transactionLogBatchedWriteEnabled": "TRUE",
            "transactionLogBatchedWriteMaxRecords": "10",
            "transactionLogBatchedWriteMaxSize": str(128 * 1024),
            "transactionLogBatchedWriteMaxDelayInMillis": "1",
        }
    )
    assert cfg.transaction_log_batched_write.max_records == 10


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("transactionLogBatchedWriteEnabled", "yes"),
        ("transactionLogBatchedWriteMaxRecords", "many"),
        ("transactionLogBatchedWriteMaxRecords", 1.5),
        ("transactionLogBatchedWriteMaxSize", True),
        ("transactionLogBatchedWriteMaxDelayInMillis", "soon"),
        ("transactionLogBatchedWriteMaxDelayInMillis", "nan"),
        ("transactionLogBatchedWriteMaxRecords", 0),
        ("transactionLogBatchedWriteMaxDelayInMillis", -1),
    ],
)
def test_bad_values_name_key_and_value(key: str, value: object) -> None:
    with pytest.raises(ConfigError) as info:
        BrokerConfig.from_dict({key: value})
    assert isinstance(info.value, ValueError | TxnStreamError)
    assert info.value.value == str(value)
    assert info.value.key == key


def test_direct_construction_checks_writer_limits() -> None:
    with pytest.raises(ConfigError, match="max_records"):
        BatchedWriteConfig(max_records=0)
    with pytest.raises(ConfigError, match="max_delay_ms"):
        BatchedWriteConfig(max_delay_ms=-0.1)
    with pytest.raises(ConfigError, match="enabled"):
        BatchedWriteConfig(enabled="true")  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as info:
        BrokerConfig(transaction_log_batched_write=BatchedWriteConfig(True, 5))
    assert info.value.key == "transactionLogBatchedWriteMaxRecords"
    # The writer's upper bounds too, under the Pulsar key (were refused at open, misnamed).
    for key, value in (
        ("transactionLogBatchedWriteMaxDelayInMillis", 1e300),
        ("transactionLogBatchedWriteMaxSize", 2**70),
        ("transactionPendingAckBatchedWriteMaxRecords", 10**9),
    ):
        with pytest.raises(ConfigError, match="must be in") as info:
            BrokerConfig.from_dict({key: value})
        assert info.value.key == key


def test_runtime_set_is_validated_and_atomic() -> None:
    cfg = BrokerConfig()
    cfg.set("transactionLogBatchedWriteEnabled", "true")
    assert cfg.transaction_log_batched_write.enabled
    with pytest.raises(ConfigError) as info:
        cfg.set("transactionLogBatchedWriteMaxRecords", 3)
    assert info.value.key == "transactionLogBatchedWriteMaxRecords"
    assert cfg.transaction_log_batched_write.max_records == 512
    with pytest.raises(ConfigError):
        cfg.set("clusterName", "x")


def test_unknown_table_key_and_bad_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"transaction_log_batched_write\.maxRecords"):
        BrokerConfig.from_dict({"transaction_log_batched_write": {"maxRecords": 10}})
    bad = tmp_path / "bad.toml"
    bad.write_text("transactionLogBatchedWriteEnabled = \n")
    with pytest.raises(ConfigError):
        BrokerConfig.load(bad)


def test_properties_continuation_and_separators() -> None:
    cfg = BrokerConfig.from_broker_conf_text(
        "transactionLogBatchedWriteMaxRecords \\\n   = 77\n"
        "transactionPendingAckBatchedWriteMaxSize 300000\n"
    )
    assert cfg.transaction_log_batched_write.max_records == 77
    assert cfg.pending_ack_batched_write.max_size == 300000


def test_properties_follow_java_rules_and_lose_no_line() -> None:
    """The key ends at the first '=', ':' or whitespace; a last-line continuation is kept."""
    cfg = BrokerConfig.from_broker_conf_text(
        "fileSystemURI file:///tmp/x\ntransactionCoordinatorCount=4\\"
    )
    assert cfg.tiered_storage_location == "file:///tmp/x"  # was key 'fileSystemURI file'
    assert cfg.coordinators == 4  # the line was dropped
    for bad in ("=5\n", ":5\n"):
        with pytest.raises(ConfigError, match="line without a key"):
            BrokerConfig.from_broker_conf_text(bad)


def test_unreadable_config_files_are_config_errors(tmp_path: Path) -> None:
    binary = tmp_path / "broker.conf"
    binary.write_bytes(b"\xff\xfe\x00bad")
    for path in (tmp_path / "missing.conf", tmp_path / "missing.toml", tmp_path, binary):
        with pytest.raises(ConfigError, match="cannot be read") as err:
            BrokerConfig.load(path)
        assert err.value.key == str(path)


def test_wrong_types_are_config_errors_naming_the_setting(tmp_path: Path) -> None:
    from txnstream.coordinator import CoordinatorConfig

    loose: Any = BrokerConfig  # called with wrong types on purpose
    bad: list[tuple[Any, str]] = [
        (lambda: loose(transaction_log_batched_write={"enabled": True}), "transaction_log"),
        (lambda: loose(extra=None), "extra"),
        (lambda: loose.from_dict(None), "settings"),
        (lambda: loose.from_dict({"transaction_log_batched_write": 5}), "transaction_log"),
    ]
    for make, key in bad:
        with pytest.raises(ConfigError) as err:
            make()
        assert err.value.key.startswith(key)
    toml = tmp_path / "c.toml"
    toml.write_text("transaction_log_batched_write = 5\n")
    with pytest.raises(ConfigError, match="expected a table"):
        BrokerConfig.load(toml)
    for value in (True, 2.9):
        cfg = BrokerConfig.from_dict({"transactionMetaPersistCount": value})
        with pytest.raises(ConfigError, match="transactionMetaPersistCount"):
            CoordinatorConfig.from_broker_config(cfg)


def test_config_loaders_refuse_what_is_not_a_path_or_text(tmp_path: Path) -> None:
    calls: list[Callable[[], object]] = [
        lambda: BrokerConfig.load(None),  # type: ignore[arg-type]
        lambda: BrokerConfig.load(5),  # type: ignore[arg-type]
        lambda: BrokerConfig.from_toml(str(tmp_path / "a\0b.toml")),
        lambda: BrokerConfig.from_broker_conf(str(tmp_path / "a\0b.conf")),
        lambda: BrokerConfig.from_broker_conf_text(None),  # type: ignore[arg-type]
        lambda: BrokerConfig.from_broker_conf_text(b"a=1"),  # type: ignore[arg-type]
    ]
    for call in calls:
        with pytest.raises(ConfigError):
            call()
    deep = tmp_path / "deep.toml"
    deep.write_text("x = " + "[" * 3000 + "]" * 3000 + "\n")
    with pytest.raises(ConfigError, match=r"deep\.toml"):
        BrokerConfig.load(deep)


def test_pulsars_offload_seconds_key_is_read_and_near_misses_of_ours_are_warned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cfg = BrokerConfig.from_broker_conf_text("managedLedgerOffloadThresholdInSeconds=3600\n")
    assert cfg.offload_threshold_ms == 3_600_000
    off = BrokerConfig.from_broker_conf_text("managedLedgerOffloadThresholdInSeconds=-1\n")
    assert off.offload_threshold_ms == -1
    both = "managedLedgerOffloadThresholdInSeconds=2\nmanagedLedgerOffloadThresholdMs=2000\n"
    assert BrokerConfig.from_broker_conf_text(both).offload_threshold_ms == 2000  # they agree
    with pytest.raises(ConfigError, match="disagrees") as e:
        BrokerConfig.from_broker_conf_text(both.replace("=2000", "=5"))
    assert e.value.key == "managedLedgerOffloadThresholdInSeconds"
    with pytest.raises(ConfigError, match="-1"):
        BrokerConfig.from_broker_conf_text("managedLedgerOffloadThresholdInSeconds=-2\n")
    stock_pulsar = (  # keys of Pulsar's broker.conf that txnstream does not read
        "transactionCoordinatorEnabled",
        "managedLedgerCursorMaxEntriesPerLedger",
        "managedLedgerMaxLedgerRolloverTimeMinutes",
        "brokerDeduplicationEntriesInterval",
        "transactionBufferSnapshotSegmentSize",
        "transactionPendingAckLogIndexMinLag",
        "allowAutoSubscriptionCreation",
        "defaultNumberOfNamespaceBundles",
    )
    with caplog.at_level(logging.WARNING, logger="txnstream.config"):
        cfg = BrokerConfig.from_broker_conf_text(
            "transactionLogBatchedWriteEnable=true\n"  # a "d" short
            + "".join(f"{k}=1\n" for k in stock_pulsar)
        )
        not_str: Any = {"coordinator": 4, 1: 2}  # an attribute name's typo; a key not a str
        BrokerConfig.from_dict(not_str)
    assert not cfg.transaction_log_batched_write.enabled
    assert "did you mean 'transactionLogBatchedWriteEnabled'" in caplog.text
    assert "did you mean 'coordinators'" in caplog.text
    assert not [k for k in stock_pulsar if k in caplog.text]
    assert set(cfg.extra) == {"transactionLogBatchedWriteEnable", *stock_pulsar}


def test_a_setting_given_twice_under_two_names_with_two_values_is_refused() -> None:
    # A Pulsar key and its attribute name: the last one used to win silently.
    with pytest.raises(ConfigError) as e:
        BrokerConfig.from_dict({"transactionCoordinatorCount": 4, "coordinators": 2})
    assert e.value.key == "coordinators"
    assert "transactionCoordinatorCount=4" in str(e.value)
    # A section table and its flat Pulsar key.
    with pytest.raises(ConfigError) as e:
        BrokerConfig.from_dict(
            {
                "transactionLogBatchedWriteMaxRecords": 64,
                "transaction_log_batched_write": {"max_records": 128},
            }
        )
    assert "transactionLogBatchedWriteMaxRecords=64" in str(e.value)
    # The same value under both names is one setting, given twice.
    cfg = BrokerConfig.from_dict({"transactionCoordinatorCount": "4", "coordinators": 4})
    assert cfg.coordinators == 4
    cfg = BrokerConfig.from_dict(
        {
            "transactionLogBatchedWriteMaxRecords": 64,
            "transaction_log_batched_write": {"max_records": "64"},
        }
    )
    assert cfg.transaction_log_batched_write.max_records == 64
