"""The client API (SPEC §4.9): producers, consumers, transactions; sync and asyncio.

Obtain a :class:`Client` from a broker (``broker.client(name)``); see
:mod:`txnstream.client.client` for the sync API, :mod:`txnstream.client.aio`
for asyncio, :mod:`txnstream.client.transaction` for the commit path.
"""

from __future__ import annotations

from txnstream.client.aio import AsyncClient, AsyncConsumer, AsyncProducer, AsyncTransaction
from txnstream.client.client import Client, Consumer, Producer, java_string_hash
from txnstream.client.message import Message, MessageId
from txnstream.client.transaction import Transaction

__all__ = [
    "AsyncClient",
    "AsyncConsumer",
    "AsyncProducer",
    "AsyncTransaction",
    "Client",
    "Consumer",
    "Message",
    "MessageId",
    "Producer",
    "Transaction",
    "java_string_hash",
]
