"""Bad input to the broker and client API: typed errors naming the value, nothing lost."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from txnstream import Broker, BrokerConfig, testing
from txnstream.broker import TopicName
from txnstream.client import Client
from txnstream.errors import (
    AlreadyClosedError,
    ConfigError,
    InvalidArgumentError,
    InvalidTopicNameError,
    InvalidTxnStatusError,
    StorageError,
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


def test_a_commit_through_a_closed_client_is_refused_and_abort_still_works(
    broker: Broker,
) -> None:
    """A closed client is fatal (SPEC §5): a commit not yet asked is refused, nothing ends."""
    client = broker.client()
    txn = client.transaction()
    client.producer("t").send(b"x", txn=txn)
    client.close()
    with pytest.raises(AlreadyClosedError, match="closed"):
        txn.commit()
    assert txn.state == "open"
    txn.abort()  # clean-up still works
    assert txn.state == "aborted"
    reader = broker.client().subscribe("t", "r")
    assert reader.receive(300) is None


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


def test_two_open_producers_cannot_share_a_name(broker: Broker) -> None:
    """They would share sequence ids: deduplication would drop the second's messages."""
    a, b = broker.client("etl"), broker.client("etl")
    p1 = a.producer("t", name="ingest")
    with pytest.raises(InvalidArgumentError, match="in use") as e:
        b.producer("t", name="ingest")
    assert e.value.details["value"] == "ingest"
    # Generated names skip the ones in use (two clients may share a name).
    g1, g2 = a.producer("t"), b.producer("t")
    assert g1.name != g2.name
    g1.send(b"one")
    g2.send(b"two")
    p1.close()
    b.producer("t", name="ingest").send(b"three")  # free again once closed
    c = a.subscribe("t", "s")
    got = []
    while (m := c.receive(200)) is not None:
        got.append(m.value)
    assert got == [b"one", b"two", b"three"]


def test_a_message_id_with_the_wrong_batch_size_is_refused(broker: Broker) -> None:
    from txnstream.client import MessageId

    client = broker.client()
    client.producer("t").send_many([b"m0", b"m1", b"m2"])
    c = client.subscribe("t", "s")
    got = [c.receive(1_000) for _ in range(3)]
    mid = got[0].message_id  # type: ignore[union-attr]
    # batch_size defaults to 1; naming the topic does not skip the check, nor does a
    # size larger than the entry's (its ack set would match no later ack).
    for rebuilt in (
        MessageId(mid.ledger_id, mid.entry_id, 0),
        MessageId(mid.ledger_id, mid.entry_id, 0, topic=mid.topic),
        MessageId(mid.ledger_id, mid.entry_id, 4, 5, mid.partition, mid.topic),
    ):
        for call in (c.ack, c.ack_cumulative, lambda m: c.ack(m, txn=client.transaction())):
            with pytest.raises(InvalidArgumentError, match="holds 3 message"):
                call(rebuilt)
    c.ack(MessageId(mid.ledger_id, mid.entry_id, 0, 3, mid.partition))  # the right size
    c.redeliver_unacknowledged()
    assert sorted(m.value for m in [c.receive(1_000), c.receive(1_000)]) == [b"m1", b"m2"]  # type: ignore[union-attr]


def test_text_that_is_not_utf8_is_refused_before_anything(broker: Broker) -> None:
    client = broker.client()
    p = client.producer("t")
    txn = client.transaction()
    for kw in ({"key": "\ud800"}, {"properties": {"k": "\udfff"}}, {"properties": {"\ud800": "v"}}):
        with pytest.raises(InvalidArgumentError, match="UTF-8"):
            p.send(b"x", txn=txn, **kw)
        with pytest.raises(InvalidArgumentError, match="UTF-8"):
            p.send_many([b"x"], **kw)
    assert p.last_sequence_id == -1
    assert broker._coordinators().get_transaction(txn.txn_id).partitions == ()
    txn.commit()


def test_an_oversize_send_in_a_transaction_leaves_it_usable(broker: Broker) -> None:
    from txnstream._native import MAX_ENTRY_SIZE

    client = broker.client()
    p = client.producer("t")
    with client.transaction() as txn:
        with pytest.raises(InvalidArgumentError, match="MAX_ENTRY_SIZE"):
            p.send(bytes(MAX_ENTRY_SIZE + 1), txn=txn)
        assert broker._coordinators().get_transaction(txn.txn_id).partitions == ()
        assert p.last_sequence_id == -1
        p.send(b"small", txn=txn)  # the transaction is still usable, and commits
    assert txn.state == "committed"


def test_waits_beyond_the_longest_are_refused_typed(broker: Broker) -> None:
    from txnstream.timer import MAX_WAIT_MS

    client = broker.client()
    c = client.subscribe("t", "s")
    txn = client.transaction()
    for call in (
        lambda: c.receive(MAX_WAIT_MS + 1),
        lambda: c.receive_many(1, 2**63),
        lambda: txn.wait_durable(10**13),
        lambda: broker.wait_recovered(10**13),
        lambda: client.subscribe("t", "s2", negative_ack_redelivery_delay_ms=10**13),
    ):
        with pytest.raises(InvalidArgumentError, match="milliseconds"):
            call()
    assert c.receive(0) is None
    txn.abort()


def test_send_many_and_message_ids_of_wrong_types_are_refused(broker: Broker) -> None:
    from txnstream.client import MessageId

    client = broker.client()
    p = client.producer("t")
    c = client.subscribe("t", "s")
    for call in (
        lambda: p.send_many(None),  # type: ignore[arg-type]
        lambda: p.send_many([b"a"], keys=5),  # type: ignore[arg-type]
        lambda: p.send_many([b"a"], keys=(k for k in ["a"])),  # type: ignore[arg-type]
        lambda: c.ack(MessageId(1, 0, 0, "1")),  # type: ignore[arg-type]
        lambda: c.ack(MessageId(1, 0, None)),  # type: ignore[arg-type]
        lambda: c.ack(MessageId(1, 0, partition=[])),  # type: ignore[arg-type]
    ):
        with pytest.raises(InvalidArgumentError):
            call()


@pytest.mark.parametrize(
    "extra",
    [
        {"transactionMetaPersistCount": "abc"},
        {"transactionMetaPersistCount": -1},
        {"transactionMetaPersistTimeInHour": 0},
        {"transactionMetaPersistTimeInHour": 10**400},
        {"transactionMetaExpireCheckIntervalInSecond": float("inf")},
    ],
)
def test_broker_open_checks_the_coordinator_settings_before_creating_anything(
    tmp_path: Path, extra: dict[str, object]
) -> None:
    cfg = BrokerConfig(extra=extra)
    with pytest.raises(ConfigError):
        Broker.open(tmp_path / "data", cfg, registry=None)
    assert not (tmp_path / "data").exists()


def test_huge_numbers_in_settings_are_config_errors() -> None:
    from txnstream.config import BatchedWriteConfig
    from txnstream.coordinator.config import CoordinatorConfig

    for call in (
        lambda: BatchedWriteConfig(max_delay_ms=10**400),
        lambda: BrokerConfig().set("transactionLogBatchedWriteMaxDelayInMillis", 10**400),
        lambda: BrokerConfig.from_broker_conf_text(
            "transactionLogBatchedWriteMaxDelayInMillis=" + "1" * 400
        ),
        lambda: CoordinatorConfig(transaction_meta_persist_time_in_hour=10**400),
    ):
        with pytest.raises(TxnStreamError):
            call()


def test_a_directory_path_with_nul_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="NUL"):
        Broker.open(str(tmp_path / "da\0ta"), registry=None)


def test_a_message_or_its_id_from_another_topic_is_refused_by_ack(broker: Broker) -> None:
    """Ledger ids are per topic: 1:0 exists in both, so a received id names its topic."""
    import pickle

    client = broker.client()
    client.producer("a").send(b"a0")
    client.producer("b").send(b"b0")
    ca, cb = client.subscribe("a", "s"), client.subscribe("b", "s")
    mb = cb.receive(1_000)
    assert mb is not None and mb.message_id.topic == "persistent://public/default/b"
    for msg in (mb, mb.message_id, pickle.loads(pickle.dumps(mb.message_id))):
        with pytest.raises(
            InvalidArgumentError, match="it came from persistent://public/default/b"
        ):
            ca.ack(msg)
    a0 = ca.receive(1_000)
    assert a0 is not None and a0.value == b"a0"  # nothing of "a" was acked
    # The ids send returns name their topic too (sync, async, batches).
    sent = [
        client.producer("b").send(b"b1"),
        client.producer("b").send_async(b"b2").result(10),
        *client.producer("b").send_many([b"b3", b"b4"]),
    ]
    assert {i.topic for i in sent} == {"persistent://public/default/b"}
    for mid in sent:
        for call in (ca.ack, lambda m: ca.ack(m, txn=client.transaction())):
            with pytest.raises(InvalidArgumentError, match="it came from"):
                call(mid)
    left = [m.value for m in iter(lambda: cb.receive(500), None)]
    assert left == [b"b1", b"b2", b"b3", b"b4"]  # none of them was acked


def test_a_partition_ledger_written_before_the_check_stays_usable(tmp_path: Path) -> None:
    """Directories from before partition names were checked may hold such a ledger."""
    from txnstream import ManagedLedger

    with ManagedLedger.open(tmp_path, "persistent://public/default/x-partition-1"):
        pass  # what an older broker left: the ledger, no registered topic "x"
    with Broker.open(tmp_path, registry=None) as b:
        client = b.client()
        client.producer("x-partition-1").send(b"still here")
        m = client.subscribe("x-partition-1", "s").receive(2_000)
        assert m is not None and m.value == b"still here"
        with pytest.raises(InvalidTopicNameError, match="names no partition"):
            client.producer("x-partition-2")  # a new one is still refused


def test_a_transaction_whose_abort_failed_cannot_commit(broker: Broker) -> None:
    """After abort() failed, commit() went to the coordinator, found it OPEN and committed.

    As in Pulsar's client, an asked abort leaves only abort: commit() is
    refused, and abort() again finishes it.
    """
    client = broker.client()
    txn = client.transaction()
    client.producer("t").send(b"x", txn=txn)
    # The fault hits the directory's next write: let none of the send's be pending.
    assert txn.wait_durable(10_000)
    testing.inject_fault(testing.log_ledger(txn._tc), "write", errno=5, times=1)
    with pytest.raises(StorageError):
        txn.abort()  # its decision could not be logged: nothing changed
    with pytest.raises(InvalidTxnStatusError, match="aborting"):
        txn.commit()
    txn.abort()
    assert txn.state == "aborted"
    assert broker.client().subscribe("t", "r").receive(300) is None
