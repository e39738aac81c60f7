"""Tiered storage (SPEC §4.8, KIP-405 + KIP-1058).

- :mod:`~txnstream.tiered.remote`: :class:`RemoteStorage`, a directory or any
  fsspec URL, every call counted by kind;
- :mod:`~txnstream.tiered.metadata`: :class:`RemoteLogMetadataManager`, the
  ``__remote_log_metadata`` log and ``next_segment_with_txn_index``;
- :mod:`~txnstream.tiered.txn_index`: :class:`TopicTxnIndexes`, the local
  aborted-transaction indexes written as aborts happen;
- :mod:`~txnstream.tiered.offload`: :class:`Offloader`, uploads of closed ledgers;
- :mod:`~txnstream.tiered.reader`: :class:`TieredReader`, local-or-remote reads
  and READ_COMMITTED with the fewest remote calls.

Dependencies point one way: reader/offload -> metadata, txn_index -> remote -> _native.
"""

from txnstream.tiered.metadata import METADATA_LEDGER, RemoteLogMetadataManager, SegmentInfo
from txnstream.tiered.offload import Offloader
from txnstream.tiered.reader import ReadMessage, TieredReader
from txnstream.tiered.remote import KINDS, RemoteStorage, object_name
from txnstream.tiered.txn_index import TopicTxnIndexes

__all__ = [
    "KINDS",
    "METADATA_LEDGER",
    "Offloader",
    "ReadMessage",
    "RemoteLogMetadataManager",
    "RemoteStorage",
    "SegmentInfo",
    "TieredReader",
    "TopicTxnIndexes",
    "object_name",
]
