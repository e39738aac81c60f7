"""Batched-entry framing (PIP-160), implemented in Rust.

A batched entry is ``MAGIC`` (u16 big-endian ``0x0E01``) + ``VERSION``
(u16 ``0x0001``) + a ``Batched*`` protobuf whose records sit in field 1.
An unbatched entry is the bare record. The codec is schema-agnostic.

Single-entry functions (:func:`encode_batch`, :func:`decode_entry`,
:func:`is_batched`) serve writers; the bulk decoders serve replay and Spark:
they decode many entries in one call into numpy columns.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, SupportsIndex, TypedDict

import numpy as np
import numpy.typing as npt

import txnstream._native as _native

if TYPE_CHECKING:
    from typing_extensions import Buffer

MAGIC: int = _native.MAGIC
VERSION: int = _native.VERSION


def encode_batch(records: Sequence[Buffer]) -> bytes:
    """Build one batched entry holding ``records`` (``bytes`` or any buffer) in order."""
    return _native.encode_batch(records)


def decode_entry(entry: Buffer) -> list[bytes]:
    """Split ``entry`` (bytes or any buffer) into its records; an unbatched entry is one record.

    Raises :class:`~txnstream.errors.CorruptEntryError` (with ``offset``) for
    an unknown version, a truncated prefix or malformed protobuf.
    """
    return _native.decode_entry(entry)


def is_batched(entry: Buffer) -> bool:
    """Tell whether ``entry`` starts with the batch magic ``0x0E01``."""
    return _native.is_batched(entry)


@dataclass(frozen=True)
class DecodedRecords:
    """Records of many entries, flattened (Arrow ``large_binary`` layout).

    Record ``i`` is ``data[offsets[i]:offsets[i + 1]]`` and came from
    ``entries[entry_index[i]]`` at ``batch_index[i]`` of ``batch_size[i]``.
    """

    data: bytes
    offsets: npt.NDArray[np.int64]
    entry_index: npt.NDArray[np.uint32]
    batch_index: npt.NDArray[np.uint32]
    batch_size: npt.NDArray[np.uint32]

    def __len__(self) -> int:
        """Return the number of records."""
        return len(self.entry_index)

    def record(self, i: SupportsIndex) -> bytes:
        """Return record ``i`` (a copy); a negative ``i`` counts from the end.

        Raises :class:`IndexError` out of range.
        """
        k = record_index(i, len(self))
        return self.data[int(self.offsets[k]) : int(self.offsets[k + 1])]

    def to_list(self) -> list[bytes]:
        """Return every record as its own ``bytes`` object."""
        view = memoryview(self.data)
        off = self.offsets.tolist()
        return [bytes(view[off[i] : off[i + 1]]) for i in range(len(self))]


def record_index(i: SupportsIndex, n: int) -> int:
    """Return record index ``i`` of ``n`` records as ``0 <= i < n`` (negative: from the end).

    Records are read at ``offsets[i]:offsets[i + 1]``: an unchecked
    negative index would read a wrong span (``b""`` for -1).
    """
    k = operator.index(i)
    if not -n <= k < n:
        raise IndexError(f"record index {k} out of range for {n} records")
    return k + n if k < 0 else k


def decode_entries(entries: Sequence[bytes]) -> DecodedRecords:
    """Decode many entries (batched or not) in one call, GIL released."""
    return DecodedRecords(*_native.decode_entries(entries))


U32 = npt.NDArray[np.uint32]
U64 = npt.NDArray[np.uint64]
I8 = npt.NDArray[np.int8]
I32 = npt.NDArray[np.int32]


class TxnLogColumns(TypedDict):
    """Columns of :func:`decode_txn_log_columns`, one row per record.

    ``<s>_data`` / ``<s>_offsets`` form an Arrow ``string`` column.
    """

    entry_index: U32
    batch_index: U32
    batch_size: U32
    metadata_op: I8
    txnid_most_bits: U64
    txnid_least_bits: U64
    expected_status: I8
    new_status: I8
    timeout_ms: U64
    start_time: U64
    last_modification_time: U64
    max_local_txn_id: U64
    timed_out: I8
    owner_data: bytes
    owner_offsets: I32
    client_name_data: bytes
    client_name_offsets: I32
    partition_offsets: I32
    partitions_data: bytes
    partitions_offsets: I32
    subscription_offsets: I32
    subscription_topics_data: bytes
    subscription_topics_offsets: I32
    subscription_names_data: bytes
    subscription_names_offsets: I32


class PendingAckColumns(TypedDict):
    """Columns of :func:`decode_pending_ack_columns`, one row per record."""

    entry_index: U32
    batch_index: U32
    batch_size: U32
    op: I8
    ack_type: I8
    txnid_most_bits: U64
    txnid_least_bits: U64
    position_offsets: I32
    ledger_id: U64
    entry_id: U64
    position_batch_size: I32
    ack_set_offsets: I32
    ack_set_words: npt.NDArray[np.int64]


def decode_txn_log_columns(entries: Sequence[bytes]) -> TxnLogColumns:
    """Decode transaction-log entries into columns, one row per record.

    Scalar fields are numpy arrays (absent enums are -1, absent integers 0);
    strings and lists are Arrow-shaped ``<name>_data`` bytes plus
    ``<name>_offsets`` int32 arrays; ``partition_offsets`` and
    ``subscription_offsets`` map rows to list items. No Python object is
    created per record.
    """
    return _native.decode_txn_log_columns(entries)


def decode_pending_ack_columns(entries: Sequence[bytes]) -> PendingAckColumns:
    """Decode pending-ack log entries into columns, one row per record.

    Acked positions are flattened: row ``i`` owns positions
    ``position_offsets[i]:position_offsets[i + 1]`` of ``ledger_id`` /
    ``entry_id`` / ``position_batch_size``; position ``j`` owns ack-set words
    ``ack_set_offsets[j]:ack_set_offsets[j + 1]`` of ``ack_set_words``.
    """
    return _native.decode_pending_ack_columns(entries)


def utf8_column(columns: TxnLogColumns, name: str) -> list[str]:
    """Materialise string column ``name`` (e.g. ``"partitions"``) as a list."""
    data = columns.get(f"{name}_data")
    offsets = columns.get(f"{name}_offsets")
    if not isinstance(data, bytes) or not isinstance(offsets, np.ndarray):
        raise KeyError(f"{name!r} is not a string column of this decode")
    off = offsets.tolist()
    return [data[off[i] : off[i + 1]].decode() for i in range(len(off) - 1)]


__all__ = [
    "MAGIC",
    "VERSION",
    "DecodedRecords",
    "PendingAckColumns",
    "TxnLogColumns",
    "decode_entries",
    "decode_entry",
    "decode_pending_ack_columns",
    "decode_txn_log_columns",
    "encode_batch",
    "is_batched",
    "utf8_column",
]
