"""Bad input to the broker and client API: typed errors naming the value, nothing lost."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from txnstream import Broker, BrokerConfig
from txnstream.broker import TopicName
from txnstream.client import Client
from txnstream.errors import (
    AlreadyClosedError,
    ConfigError,
    InvalidArgumentError,
    InvalidTopicNameError,
    InvalidTxnStatusError,
    TxnStreamError,
)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker.open(tmp_path, registry=None)
    yield b
    b.close()


@pytest.fixture
def client(broker: Broker) -> Client:
    return broker.client("inputs")


BAD_TOPICS: list[Any] = [
    "",
    "a/b/c/d",
    "http://public/default/t",
    "persistent://public/default",
    "persistent://public/default/t/x",
    "public//t",
    "/t",
    "t/",
    "bad tenant/ns/t",
    "ns/has space",
    "t\n",
    "x" * 300,
    "t__transaction_pending_ack",
    "-partition-3",
    None,
    5,
    b"t",
]


@pytest.mark.parametrize("name", BAD_TOPICS, ids=repr)
def test_bad_topic_names_are_refused_naming_the_value(client: Client, name: Any) -> None:
    for call in (lambda: client.producer(name), lambda: client.subscribe(name, "s")):
        with pytest.raises(InvalidTopicNameError) as e:
            call()
        assert repr(name)[:40] in str(e.value)
        assert e.value.value == name  # type: ignore[attr-defined]


def test_good_topic_names_parse() -> None:
    assert TopicName.parse("t").full == "persistent://public/default/t"
    assert TopicName.parse("ns/t").full == "persistent://public/ns/t"
    tn = TopicName.parse("persistent://a/b/c-partition-7")
    assert (tn.partition, tn.base.full) == (7, "persistent://a/b/c")


@pytest.mark.parametrize("sub", ["", "__reserved", "a/b", "with space", None, 3, "s" * 300])
def test_bad_subscription_names(client: Client, sub: Any) -> None:
    with pytest.raises(InvalidTopicNameError) as e:
        client.subscribe("t", sub)
    assert repr(sub)[:40] in str(e.value)


BadCall = Callable[[Client], object]

BAD_CALLS: list[tuple[str, BadCall]] = [
    ("value str", lambda c: c.producer("t").send("text")),  # type: ignore[arg-type]
    ("value int", lambda c: c.producer("t").send(5)),  # type: ignore[arg-type]
    ("value None", lambda c: c.producer("t").send(None)),  # type: ignore[arg-type]
    ("key int", lambda c: c.producer("t").send(b"x", key=5)),  # type: ignore[arg-type]
    ("properties list", lambda c: c.producer("t").send(b"x", properties=[("a", "b")])),  # type: ignore[arg-type]
    ("properties value", lambda c: c.producer("t").send(b"x", properties={"a": 1})),  # type: ignore[dict-item]
    ("txn str", lambda c: c.producer("t").send(b"x", txn="txn")),  # type: ignore[arg-type]
    ("sequence_id negative", lambda c: c.producer("t").send(b"x", sequence_id=-1)),
    ("sequence_id float", lambda c: c.producer("t").send(b"x", sequence_id=1.5)),  # type: ignore[arg-type]
    ("sequence_id bool", lambda c: c.producer("t").send(b"x", sequence_id=True)),
    ("send_many bytes", lambda c: c.producer("t").send_many(b"abc")),  # type: ignore[arg-type]
    ("send_many keys", lambda c: c.producer("t").send_many([b"a"], keys=["x", "y"])),
    ("producer name", lambda c: c.producer("t", name="")),
    ("isolation", lambda c: c.subscribe("t", "s", isolation="serializable")),
    ("initial_position", lambda c: c.subscribe("t", "s", initial_position="middle")),
    ("receive timeout", lambda c: c.subscribe("t", "s").receive(-1)),
    ("receive timeout float", lambda c: c.subscribe("t", "s").receive(1.5)),  # type: ignore[arg-type]
    ("receive_many max", lambda c: c.subscribe("t", "s").receive_many(0)),
    ("ack junk", lambda c: c.subscribe("t", "s").ack("m1")),  # type: ignore[arg-type]
    ("transaction timeout", lambda c: c.transaction(timeout_ms="1s")),  # type: ignore[arg-type]
    ("transaction timeout negative", lambda c: c.transaction(timeout_ms=-5)),
    ("wait_durable timeout", lambda c: c.transaction().wait_durable(-1)),
    ("create_topic partitions", lambda c: c.broker.admin.create_topic("pt", -1)),
    ("force_abort junk", lambda c: c.broker.admin.force_abort("nope")),
    ("older_than", lambda c: c.broker.admin.transactions_older_than(-1)),
    ("older_than inf", lambda c: c.broker.admin.transactions_older_than(float("inf"))),
    ("older_than nan", lambda c: c.broker.admin.transactions_older_than(float("nan"))),
]


@pytest.mark.parametrize(("what", "call"), BAD_CALLS, ids=[w for w, _ in BAD_CALLS])
def test_bad_arguments_raise_typed_errors(
    broker: Broker, client: Client, what: str, call: BadCall
) -> None:
    keep = client.producer("keep").send(b"kept")
    with pytest.raises(TxnStreamError) as e:
        call(client)
    assert isinstance(e.value, InvalidArgumentError), repr(e.value)
    assert not e.value.retriable
    # Nothing lost, nothing written by the refused call.
    c = client.subscribe("keep", f"check-{abs(hash(what))}")
    m = c.receive(1000)
    assert m is not None and m.message_id == keep and m.value == b"kept"
    assert c.receive(50) is None


def test_bad_argument_message_names_value(client: Client) -> None:
    with pytest.raises(InvalidArgumentError, match="'text'"):
        client.producer("t").send("text")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="-7"):
        client.subscribe("t", "s").receive(-7)


def test_bad_config_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="transactionCoordinatorCount"):
        Broker.open(tmp_path, BrokerConfig(coordinators=0))
    with pytest.raises(InvalidArgumentError):
        Broker.open(tmp_path, config={"coordinators": 1})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="allowAutoTopicCreationType"):
        BrokerConfig.from_dict({"allowAutoTopicCreationType": "sometimes"})


def test_auto_topic_creation_off(tmp_path: Path) -> None:
    cfg = BrokerConfig.from_dict({"allowAutoTopicCreation": "false"})
    with Broker.open(tmp_path, cfg, registry=None) as b:
        client = b.client()
        with pytest.raises(InvalidTopicNameError, match="does not exist"):
            client.producer("t")
        b.admin.create_topic("t")
        client.producer("t").send(b"x")


def test_consumer_and_producer_used_after_close(client: Client) -> None:
    p = client.producer("t")
    c = client.subscribe("t", "s")
    p.send(b"x")
    c.close()
    p.close()
    with pytest.raises(AlreadyClosedError, match="consumer"):
        c.receive(0)
    with pytest.raises(AlreadyClosedError, match="consumer"):
        c.ack(object())  # type: ignore[arg-type]
    with pytest.raises(AlreadyClosedError, match="producer"):
        p.send(b"y")
    # The message is still there for a new consumer.
    m = client.subscribe("t", "s").receive(1000)
    assert m is not None and m.value == b"x"


def test_closed_client(broker: Broker) -> None:
    client = broker.client()
    p = client.producer("t")
    client.close()
    with pytest.raises(AlreadyClosedError, match="client"):
        p.send(b"x")
    with pytest.raises(AlreadyClosedError):
        client.transaction()


def test_txn_used_after_it_ended(client: Client) -> None:
    p = client.producer("t")
    c = client.subscribe("t", "s")
    p.send(b"in")
    msg = c.receive(1000)
    assert msg is not None
    txn = client.transaction()
    txn.commit()
    with pytest.raises(InvalidTxnStatusError) as e:
        p.send(b"late", txn=txn)
    assert str(txn.txn_id) in str(e.value) and e.value.abortable
    with pytest.raises(InvalidTxnStatusError):
        c.ack(msg, txn=txn)
    aborted = client.transaction()
    aborted.abort()
    with pytest.raises(InvalidTxnStatusError):
        p.send(b"late", txn=aborted)
    # Nothing of the refused calls landed; the input is still unacked.
    assert client.subscribe("t", "other").receive_many(10, 200)[0].value == b"in"
    c.redeliver_unacknowledged()
    again = c.receive(1000)
    assert again is not None and again.value == b"in"


def test_txn_of_another_broker_is_refused(tmp_path: Path) -> None:
    with (
        Broker.open(tmp_path / "a", registry=None) as a,
        Broker.open(tmp_path / "b", registry=None) as b,
    ):
        txn = a.client().transaction()
        with pytest.raises(InvalidArgumentError, match="same broker"):
            b.client().producer("t").send(b"x", txn=txn)
        txn.abort()


def test_message_of_another_partition_is_refused(broker: Broker) -> None:
    broker.admin.create_topic("pt", 2)
    client = broker.client()
    client.producer("pt").send(b"x", key="a")
    c = client.subscribe("pt-partition-0", "s")
    other = client.subscribe("pt", "s2")
    m = other.receive(1000)
    assert m is not None
    if m.message_id.partition != 0:
        with pytest.raises(InvalidArgumentError, match="partition"):
            c.ack(m)
    with pytest.raises(InvalidTopicNameError, match="partitioned"):
        broker.topic("pt")


def test_broker_settings_from_broker_conf_and_toml(tmp_path: Path) -> None:
    cfg = BrokerConfig.from_broker_conf_text(
        "transactionCoordinatorCount=2\nbrokerDeduplicationWindowSize=16\n"
        "allowAutoTopicCreationType=partitioned\ndefaultNumPartitions=3\n"
    )
    assert (cfg.coordinators, cfg.deduplication_window) == (2, 16)
    toml = tmp_path / "b.toml"
    toml.write_text("coordinators = 3\ntransaction_timeout_ms = 5000\n")
    assert BrokerConfig.load(toml).coordinators == 3
    with Broker.open(tmp_path / "d", cfg, registry=None) as b:
        client = b.client()
        assert b.partitions("auto") == 3
        # Transactions spread over both coordinators.
        txns = [client.transaction() for _ in range(4)]
        assert {t.txn_id.most_bits for t in txns} == {0, 1}
        p = client.producer("auto")
        for t in txns:
            p.send(b"x", key="k", txn=t)
            t.commit()
        c = client.subscribe("auto", "s")
        assert len(c.receive_many(10, 500)) >= 1


def test_parsed_topic_names_are_remembered_within_a_bound() -> None:
    """Parsing a name again gives the same answer; bad names fail every time; memory is bounded."""
    from txnstream.broker import topic_name as tn_mod

    first = TopicName.parse("cache-me")
    assert TopicName.parse("cache-me") == first
    assert first.full == "persistent://public/default/cache-me"
    for _ in range(2):
        with pytest.raises(InvalidTopicNameError):
            TopicName.parse("a/b/c/d")
    for i in range(tn_mod.PARSED_CACHE + 10):
        TopicName.parse(f"t{i}")
    assert len(tn_mod._PARSED) <= tn_mod.PARSED_CACHE
    assert TopicName.parse("cache-me") == first


@pytest.mark.parametrize("auto_create", [True, False])
def test_a_partition_name_needs_its_partitioned_topic_and_creates_nothing(
    tmp_path: Path, auto_create: bool
) -> None:
    from txnstream import ManagedLedger

    cfg = BrokerConfig(allow_auto_topic_creation=auto_create)
    with Broker.open(tmp_path, cfg, registry=None) as b:
        b.admin.create_topic("pt", 3)
        b.admin.create_topic("plain", 0)
        before = sorted(ManagedLedger.names(tmp_path))
        client = b.client()
        for name, why in (
            ("ghost-partition-0", "ghost does not exist"),
            ("pt-partition-3", "pt has 3 partition"),
            ("plain-partition-0", "plain is not partitioned"),
        ):
            for call in (
                lambda n=name: client.producer(n).send(b"x"),
                lambda n=name: client.subscribe(n, "s"),
                lambda n=name: b.admin.topic_stats(n),
                lambda n=name: b.admin.read_committed_lag(n),
            ):
                with pytest.raises(InvalidTopicNameError, match=why) as e:
                    call()
                assert e.value.details["value"].endswith(name)
        assert sorted(ManagedLedger.names(tmp_path)) == before
        assert sorted(b.topic_names()) == [
            ("persistent://public/default/plain", 0),
            ("persistent://public/default/pt", 3),
        ]
        client.producer("pt-partition-2").send(b"ok")  # a real partition
        m = client.subscribe("pt", "s").receive(2_000)
        assert m is not None and m.value == b"ok"
