"""Topic and subscription names (Pulsar's ``persistent://tenant/namespace/topic``).

Accepted forms, as in Pulsar's client:

- ``persistent://tenant/namespace/topic`` -- the full name;
- ``tenant/namespace/topic`` -- ``persistent://`` is implied;
- ``namespace/topic`` -- tenant ``public`` is implied;
- ``topic`` -- ``public/default`` is implied.

A partition of a partitioned topic is ``<topic>-partition-<N>``. Tenant and
namespace use Pulsar's characters (letters, digits, ``-_=:.``); a topic's
local name may hold any printable character but ``/``. The suffix
``__transaction_pending_ack`` is reserved (pending-ack logs live under such
names). Every name is checked before anything is created: a bad one is an
:class:`~txnstream.errors.InvalidTopicNameError` naming the value.

Managed-ledger names: a partition (or non-partitioned topic) is stored
under its full name; a subscription's pending-ack log under
``<partition>-<subscription>__transaction_pending_ack``. The storage layer
escapes names into file names of at most 224 bytes, which bounds how long a
topic plus subscription name may be; that is checked here too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final

from txnstream.errors import InvalidTopicNameError

#: The only domain txnstream serves.
DOMAIN: Final = "persistent"
DEFAULT_TENANT: Final = "public"
DEFAULT_NAMESPACE: Final = "default"
PARTITION_SUFFIX: Final = "-partition-"
PENDING_ACK_SUFFIX: Final = "__transaction_pending_ack"
#: Longest escaped managed-ledger name the storage accepts.
MAX_LEDGER_NAME: Final = 224
#: Most partitions a partitioned topic may have.
MAX_PARTITIONS: Final = 10_000

_ENTITY = re.compile(r"[A-Za-z0-9_=:.\-]+")
_PARTITION = re.compile(r"^(.*)-partition-(0|[1-9][0-9]{0,8})$")


def _bad(value: object, why: str, argument: str = "topic") -> InvalidTopicNameError:
    return InvalidTopicNameError(
        f"invalid {argument} name {value!r}: {why}", argument=argument, value=value
    )


def _printable(text: str) -> bool:
    return text.isprintable() and not any(c.isspace() for c in text)


def escaped_len(name: str) -> int:
    """Length of ``name`` as the storage layer escapes it into a file name."""
    n = len(name.encode("utf-8"))
    n += 2 * (name.count("/") + name.count("%"))
    if name.startswith("."):
        n += 2
    return n


#: Most parsed names remembered (the hot path names the same topics over and over).
PARSED_CACHE: Final = 4096

_PARSED: dict[str, TopicName] = {}


@dataclass(frozen=True, slots=True)
class TopicName:
    """A parsed topic name; ``partition`` is -1 unless it names one partition."""

    tenant: str
    namespace: str
    local: str
    partition: int = -1
    #: The full name, e.g. ``persistent://public/default/t-partition-0``
    #: (made once: every send, ack and lookup uses it).
    full: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        suffix = f"{PARTITION_SUFFIX}{self.partition}" if self.partition >= 0 else ""
        full = f"{DOMAIN}://{self.tenant}/{self.namespace}/{self.local}{suffix}"
        object.__setattr__(self, "full", full)  # frozen: set once, here

    @classmethod
    def parse(cls, name: object) -> TopicName:
        """Parse any accepted form; raise :class:`InvalidTopicNameError` naming ``name``."""
        if type(name) is not str or cls is not TopicName:
            return cls._parse(name)
        got = _PARSED.get(name)
        if got is None:
            got = cls._parse(name)
            if len(_PARSED) >= PARSED_CACHE:
                _PARSED.clear()  # bounded: a name in use is parsed again once
            _PARSED[name] = got
        return got

    @classmethod
    def _parse(cls, name: object) -> TopicName:
        if not isinstance(name, str):
            raise _bad(name, f"must be a str, not {type(name).__name__}")
        if not name:
            raise _bad(name, "must not be empty")
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise _bad(name, "is not valid UTF-8 text") from None
        rest = name
        if "://" in name:
            domain, rest = name.split("://", 1)
            if domain != DOMAIN:
                raise _bad(name, f"only the {DOMAIN}:// domain is served, not {domain}://")
        parts = rest.split("/")
        if "://" in name and len(parts) != 3:
            raise _bad(name, "a full name is persistent://tenant/namespace/topic")
        if len(parts) == 1:
            tenant, namespace, local = DEFAULT_TENANT, DEFAULT_NAMESPACE, parts[0]
        elif len(parts) == 2:
            tenant, (namespace, local) = DEFAULT_TENANT, parts
        elif len(parts) == 3:
            tenant, namespace, local = parts
        else:
            raise _bad(name, "has too many '/'-separated parts (at most tenant/namespace/topic)")
        for what, part in (("tenant", tenant), ("namespace", namespace)):
            if not part:
                raise _bad(name, f"the {what} is empty")
            if not _ENTITY.fullmatch(part):
                raise _bad(name, f"the {what} {part!r} may hold only letters, digits and -_=:.")
        if not local:
            raise _bad(name, "the topic part is empty")
        if not _printable(local):
            raise _bad(name, "the topic part holds whitespace or control characters")
        if local.endswith(PENDING_ACK_SUFFIX):
            raise _bad(name, f"the suffix {PENDING_ACK_SUFFIX!r} is reserved")
        partition = -1
        m = _PARTITION.match(local)
        if m is not None:
            local, partition = m.group(1), int(m.group(2))
            if not local:
                raise _bad(name, "the topic part before -partition-N is empty")
        topic = cls(tenant, namespace, local, partition)
        if escaped_len(topic.pending_ack_ledger("x")) > MAX_LEDGER_NAME:
            raise _bad(name, "is too long to store")
        return topic

    @property
    def base(self) -> TopicName:
        """The topic this partition belongs to (itself if not a partition)."""
        if self.partition < 0:
            return self
        return TopicName(self.tenant, self.namespace, self.local)

    @property
    def is_partition(self) -> bool:
        """True if it names one partition of a partitioned topic."""
        return self.partition >= 0

    def storable_with(self, partitions: int) -> bool:
        """Tell whether every partition's logs (0: the topic's) have names short enough to store.

        A name fits alone but not with ``-partition-N`` appended: producers
        could write, and no subscription could ever open.
        """
        last = self if partitions <= 0 else self.partition_name(partitions - 1)
        return escaped_len(last.pending_ack_ledger("x")) <= MAX_LEDGER_NAME

    def partition_name(self, index: int) -> TopicName:
        """Partition ``index`` of this (base) topic."""
        return TopicName(self.tenant, self.namespace, self.local, index)

    @property
    def namespace_name(self) -> str:
        """``tenant/namespace``."""
        return f"{self.tenant}/{self.namespace}"

    def pending_ack_ledger(self, subscription: str) -> str:
        """Managed-ledger name of ``subscription``'s pending-ack log on this partition."""
        return f"{self.full}-{subscription}{PENDING_ACK_SUFFIX}"

    def __str__(self) -> str:
        return self.full


def subscription_arg(name: object, topic: TopicName) -> str:
    """Check a subscription name: non-empty printable text that fits the storage."""
    if not isinstance(name, str):
        raise _bad(name, f"must be a str, not {type(name).__name__}", "subscription")
    if not name:
        raise _bad(name, "must not be empty", "subscription")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise _bad(name, "is not valid UTF-8 text", "subscription") from None
    if not _printable(name) or "/" in name:
        raise _bad(name, "may not hold '/', whitespace or control characters", "subscription")
    if name.startswith("__"):
        raise _bad(name, "names starting with '__' are reserved", "subscription")
    if escaped_len(topic.pending_ack_ledger(name)) > MAX_LEDGER_NAME:
        raise _bad(name, f"is too long for topic {topic.full}", "subscription")
    return name


__all__ = [
    "DOMAIN",
    "MAX_PARTITIONS",
    "PENDING_ACK_SUFFIX",
    "TopicName",
    "escaped_len",
    "subscription_arg",
]
