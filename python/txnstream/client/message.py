"""What consumers receive: :class:`Message` and its :class:`MessageId`.

A ``MessageId`` is the address of one message: partition index (-1 for a
non-partitioned topic), ledger id, entry id, and -- for a message of a
batch written by ``send_many`` -- its batch index and the batch size.
Message ids of one partition are ordered as the partition's log; equality
and hashing use the same fields (the batch size is informative), so ids
work as dict keys and compare equal to what ``send`` returned. The ids
that ``receive`` and ``send`` return also name their partition (``topic``;
None in ids built by callers), so acking one on a consumer of another topic
is refused.
"""

from __future__ import annotations

from typing import Any

from txnstream._native import TxnPosition


class MessageId:
    """Address of one message; frozen, ordered within a partition, hashable."""

    __slots__ = ("batch_index", "batch_size", "entry_id", "ledger_id", "partition", "topic")

    ledger_id: int
    entry_id: int
    batch_index: int
    batch_size: int
    partition: int
    topic: str | None

    def __init__(
        self,
        ledger_id: int,
        entry_id: int,
        batch_index: int = 0,
        batch_size: int = 1,
        partition: int = -1,
        topic: str | None = None,
    ) -> None:
        object.__setattr__(self, "ledger_id", ledger_id)
        object.__setattr__(self, "entry_id", entry_id)
        object.__setattr__(self, "batch_index", batch_index)
        object.__setattr__(self, "batch_size", batch_size)
        object.__setattr__(self, "partition", partition)
        object.__setattr__(self, "topic", topic)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"MessageId is immutable (cannot set {name})")

    def _key(self) -> tuple[int, int, int, int]:
        return (self.partition, self.ledger_id, self.entry_id, self.batch_index)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MessageId):
            return NotImplemented
        return self._key() == other._key()

    def __lt__(self, other: MessageId) -> bool:
        if not isinstance(other, MessageId):
            return NotImplemented
        return self._key() < other._key()

    def __le__(self, other: MessageId) -> bool:
        if not isinstance(other, MessageId):
            return NotImplemented
        return self._key() <= other._key()

    def __gt__(self, other: MessageId) -> bool:
        if not isinstance(other, MessageId):
            return NotImplemented
        return self._key() > other._key()

    def __ge__(self, other: MessageId) -> bool:
        if not isinstance(other, MessageId):
            return NotImplemented
        return self._key() >= other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __reduce__(
        self,
    ) -> tuple[type[MessageId], tuple[int, int, int, int, int, str | None]]:
        return (
            MessageId,
            (
                self.ledger_id,
                self.entry_id,
                self.batch_index,
                self.batch_size,
                self.partition,
                self.topic,
            ),
        )

    @property
    def position(self) -> TxnPosition:
        """The storage position of the message (entry + batch index)."""
        return TxnPosition(self.ledger_id, self.entry_id, self.batch_size, self.batch_index)

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}:{self.partition}:{self.batch_index}"

    def __repr__(self) -> str:
        return (
            f"MessageId(ledger_id={self.ledger_id}, entry_id={self.entry_id}, "
            f"batch_index={self.batch_index}, batch_size={self.batch_size}, "
            f"partition={self.partition})"
        )


class Message:
    """One received message.

    ``value`` is the payload (``data()`` too, as in pulsar-client), ``key``
    the partition key (or None), ``properties`` a dict (empty if none),
    ``publish_time`` milliseconds since the epoch, ``redelivery_count`` how
    many times it was delivered before, ``topic`` the partition it came from.
    """

    __slots__ = (
        "key",
        "message_id",
        "producer_name",
        "properties",
        "publish_time",
        "redelivery_count",
        "sequence_id",
        "topic",
        "value",
    )

    def __init__(
        self,
        value: bytes,
        key: str | None,
        properties: dict[str, str],
        message_id: MessageId,
        publish_time: int,
        producer_name: str,
        redelivery_count: int,
        sequence_id: int,
        topic: str,
    ) -> None:
        self.value = value
        self.key = key
        self.properties = properties
        self.message_id = message_id
        self.publish_time = publish_time
        self.producer_name = producer_name
        self.redelivery_count = redelivery_count
        self.sequence_id = sequence_id
        self.topic = topic

    def data(self) -> bytes:
        """Return the payload (pulsar-client's name)."""
        return self.value

    def __repr__(self) -> str:
        v = self.value if len(self.value) <= 32 else self.value[:32] + b"..."
        return (
            f"Message({v!r}, key={self.key!r}, message_id={self.message_id}, "
            f"redelivery_count={self.redelivery_count})"
        )


__all__ = ["Message", "MessageId"]
