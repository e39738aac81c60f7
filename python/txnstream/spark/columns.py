"""Arrow arrays from the Rust columnar decoders, and the Spark schemas they fill.

The Rust core decodes many log entries at once into numpy columns (values
plus Arrow-style offsets, see :mod:`txnstream.frame`). This module wraps
those buffers as ``pyarrow`` arrays without touching single records in
Python: numbers are viewed in place, strings and lists reuse the offsets the
decoder produced, enums become strings through one ``take``. The data
source ``txnstream-log`` and the Arrow UDFs both build their output here, so
both show a record the same way.

Conventions (the columnar decoders cannot tell an absent proto2 integer from
0, so integers are given as decoded):

- enums are strings (``"NEW"``, ``"COMMITTED"``, ``"ACK"``, ``"Individual"``),
  null when absent;
- ``owner`` / ``client_name`` are null when absent or empty;
- ``uint64`` fields are Spark ``bigint`` (two's complement above 2**63);
- a row whose record could not be decoded has every decoded field null and
  says why in ``error``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from txnstream.proto import pending_ack_pb2, txn_log_pb2

__all__ = [
    "ENTRY_FIELDS",
    "PENDING_ACK_FIELDS",
    "POSITION_FIELDS",
    "TXN_LOG_FIELDS",
    "arrow_type",
    "bool_array",
    "fixed_array",
    "list_array",
    "pending_ack_arrays",
    "string_array",
    "struct_type",
    "txn_log_arrays",
]

Columns = Mapping[str, Any]
Mask = npt.NDArray[np.bool_]

#: Where each row sits in its log (the data source's leading columns).
POSITION_FIELDS = [
    StructField("log", StringType()),
    StructField("ledger_id", LongType()),
    StructField("entry_id", LongType()),
    StructField("batch_size", IntegerType()),
    StructField("batch_index", IntegerType()),
    StructField("entry_size", IntegerType()),
    StructField("batched", BooleanType()),
    StructField("deleted", BooleanType()),
]

#: Decoded ``TransactionMetadataEntry`` fields, then ``error``.
TXN_LOG_FIELDS = [
    StructField("metadata_op", StringType()),
    StructField("txnid_most_bits", LongType()),
    StructField("txnid_least_bits", LongType()),
    StructField("expected_status", StringType()),
    StructField("new_status", StringType()),
    StructField("partitions", ArrayType(StringType())),
    StructField(
        "subscriptions",
        ArrayType(
            StructType(
                [StructField("topic", StringType()), StructField("subscription", StringType())]
            )
        ),
    ),
    StructField("timeout_ms", LongType()),
    StructField("start_time", LongType()),
    StructField("last_modification_time", LongType()),
    StructField("max_local_txn_id", LongType()),
    StructField("owner", StringType()),
    StructField("client_name", StringType()),
    StructField("timed_out", BooleanType()),
    StructField("error", StringType()),
]

_ACKED_POSITION = StructType(
    [
        StructField("ledger_id", LongType()),
        StructField("entry_id", LongType()),
        StructField("batch_size", IntegerType()),
        StructField("ack_set", ArrayType(LongType())),
    ]
)

#: Decoded ``PendingAckMetadataEntry`` fields, then ``error``.
PENDING_ACK_FIELDS = [
    StructField("op", StringType()),
    StructField("ack_type", StringType()),
    StructField("txnid_most_bits", LongType()),
    StructField("txnid_least_bits", LongType()),
    StructField("positions", ArrayType(_ACKED_POSITION)),
    StructField("error", StringType()),
]

#: One row per entry (``mode=entries``): the raw bytes, for the UDFs; an
#: entry whose stored bytes are damaged has a null ``entry`` and the reason
#: in ``error``.
ENTRY_FIELDS = [
    StructField("log", StringType()),
    StructField("ledger_id", LongType()),
    StructField("entry_id", LongType()),
    StructField("entry", BinaryType()),
    StructField("error", StringType()),
]


def struct_type(fields: Sequence[StructField]) -> StructType:
    """Return a Spark ``StructType`` of ``fields``."""
    return StructType(list(fields))


def arrow_type(dt: DataType) -> pa.DataType:
    """Return the Arrow type Spark expects for ``dt`` (``string``, ``list<element: …>``)."""
    schema = to_arrow_schema(StructType([StructField("x", dt)]))
    return schema.field("x").type


def _enum_names(enum: Any) -> list[str | None]:
    values = dict(enum.items())
    top = max(values.values())
    names: list[str | None] = [None] * (top + 1)
    for name, v in values.items():
        names[v] = name
    return names


_TXN_OPS = _enum_names(txn_log_pb2.TransactionMetadataEntry.TransactionMetadataOp)
_TXN_STATUS = _enum_names(txn_log_pb2.TxnStatus)
_ACK_OPS = _enum_names(pending_ack_pb2.PendingAckOp)
_ACK_TYPES = _enum_names(pending_ack_pb2.AckType)


def _validity(valid: Mask | None) -> tuple[pa.Buffer | None, int]:
    """Arrow validity bitmap of ``valid`` (None when every value is valid)."""
    if valid is None:
        return None, 0
    nulls = int(len(valid) - np.count_nonzero(valid))
    if nulls == 0:
        return None, 0
    return pa.py_buffer(np.packbits(valid, bitorder="little")), nulls


def fixed_array(
    values: npt.NDArray[Any], dtype: npt.DTypeLike, typ: pa.DataType, valid: Mask | None = None
) -> pa.Array:
    """Wrap a numpy column as an Arrow array of ``typ`` (viewed, or cast to ``dtype``)."""
    want = np.dtype(dtype)
    arr = values.view(want) if values.dtype.itemsize == want.itemsize else values.astype(want)
    arr = np.ascontiguousarray(arr)
    bitmap, nulls = _validity(valid)
    return pa.Array.from_buffers(typ, len(arr), [bitmap, pa.py_buffer(arr)], null_count=nulls)


def bool_array(values: npt.NDArray[Any], valid: Mask | None = None) -> pa.Array:
    """Wrap a numpy bool (or 0/1) column as an Arrow ``bool`` array."""
    bits = np.packbits(values.astype(np.bool_), bitorder="little")
    bitmap, nulls = _validity(valid)
    return pa.Array.from_buffers(pa.bool_(), len(values), [bitmap, pa.py_buffer(bits)], nulls)


def string_array(
    data: bytes, offsets: npt.NDArray[np.int32], valid: Mask | None = None
) -> pa.Array:
    """Wrap a decoder string column (``data`` + int32 ``offsets``) as Arrow ``string``."""
    n = len(offsets) - 1
    bitmap, nulls = _validity(valid)
    off = np.ascontiguousarray(offsets, dtype=np.int32)
    return pa.Array.from_buffers(
        pa.string(), n, [bitmap, pa.py_buffer(off), pa.py_buffer(data)], null_count=nulls
    )


def list_array(
    typ: pa.DataType, offsets: npt.NDArray[np.int32], child: pa.Array, valid: Mask | None = None
) -> pa.Array:
    """Wrap ``child`` cut by int32 ``offsets`` as an Arrow list array of ``typ``."""
    n = len(offsets) - 1
    bitmap, nulls = _validity(valid)
    off = np.ascontiguousarray(offsets, dtype=np.int32)
    return pa.Array.from_buffers(
        typ, n, [bitmap, pa.py_buffer(off)], null_count=nulls, children=[child]
    )


def _enum_array(codes: npt.NDArray[np.int8], names: list[str | None], valid: Mask) -> pa.Array:
    idx = codes.astype(np.int32)
    known = valid & (idx >= 0) & (idx < len(names))
    idx = np.where(known, idx, 0)
    dictionary = pa.array(names, pa.string())
    return dictionary.take(pa.array(idx, mask=~known))


def _string_field(d: Columns, name: str, valid: Mask, empty_is_null: bool) -> pa.Array:
    offsets: npt.NDArray[np.int32] = d[f"{name}_offsets"]
    ok = valid & (np.diff(offsets) > 0) if empty_is_null else valid
    return string_array(d[f"{name}_data"], offsets, ok)


def _field_type(fields: Sequence[StructField], name: str) -> pa.DataType:
    for f in fields:
        if f.name == name:
            return arrow_type(f.dataType)
    raise KeyError(name)


def txn_log_arrays(d: Columns, valid: Mask) -> list[pa.Array]:
    """Arrays for :data:`TXN_LOG_FIELDS` (without ``error``) from decoder columns ``d``.

    ``valid[i]`` is False for rows whose record did not decode (all null).
    """
    i64, i64t = np.int64, pa.int64()
    parts = string_array(d["partitions_data"], d["partitions_offsets"])
    subs = pa.StructArray.from_arrays(
        [
            string_array(d["subscription_topics_data"], d["subscription_topics_offsets"]),
            string_array(d["subscription_names_data"], d["subscription_names_offsets"]),
        ],
        fields=list(_field_type(TXN_LOG_FIELDS, "subscriptions").value_type),
    )
    timed_out: npt.NDArray[np.int8] = d["timed_out"]
    return [
        _enum_array(d["metadata_op"], _TXN_OPS, valid),
        fixed_array(d["txnid_most_bits"], i64, i64t, valid),
        fixed_array(d["txnid_least_bits"], i64, i64t, valid),
        _enum_array(d["expected_status"], _TXN_STATUS, valid),
        _enum_array(d["new_status"], _TXN_STATUS, valid),
        list_array(_field_type(TXN_LOG_FIELDS, "partitions"), d["partition_offsets"], parts, valid),
        list_array(
            _field_type(TXN_LOG_FIELDS, "subscriptions"), d["subscription_offsets"], subs, valid
        ),
        fixed_array(d["timeout_ms"], i64, i64t, valid),
        fixed_array(d["start_time"], i64, i64t, valid),
        fixed_array(d["last_modification_time"], i64, i64t, valid),
        fixed_array(d["max_local_txn_id"], i64, i64t, valid),
        _string_field(d, "owner", valid, empty_is_null=True),
        _string_field(d, "client_name", valid, empty_is_null=True),
        bool_array(timed_out == 1, valid),
    ]


def pending_ack_arrays(d: Columns, valid: Mask) -> list[pa.Array]:
    """Arrays for :data:`PENDING_ACK_FIELDS` (without ``error``) from decoder columns ``d``."""
    i64, i64t = np.int64, pa.int64()
    pos_type = _field_type(PENDING_ACK_FIELDS, "positions")
    words = fixed_array(d["ack_set_words"], i64, i64t)
    sizes: npt.NDArray[np.int32] = d["position_batch_size"]
    struct_fields = list(pos_type.value_type)
    positions = pa.StructArray.from_arrays(
        [
            fixed_array(d["ledger_id"], i64, i64t),
            fixed_array(d["entry_id"], i64, i64t),
            fixed_array(sizes, np.int32, pa.int32(), sizes >= 0),
            list_array(struct_fields[3].type, d["ack_set_offsets"], words),
        ],
        fields=struct_fields,
    )
    return [
        _enum_array(d["op"], _ACK_OPS, valid),
        _enum_array(d["ack_type"], _ACK_TYPES, valid),
        fixed_array(d["txnid_most_bits"], i64, i64t, valid),
        fixed_array(d["txnid_least_bits"], i64, i64t, valid),
        list_array(pos_type, d["position_offsets"], positions, valid),
    ]
