"""Arrow-batched UDFs over raw log entries and ack sets, run by the Rust core.

Each UDF receives a whole Arrow column (thousands of rows) and hands its
buffers — offsets and data of a binary column, offsets and words of a
``list<bigint>`` column — to one Rust call; no record is parsed in Python.
A null input gives a null output; a malformed entry gives null
(:func:`decode_entry`) or rows carrying an ``error`` (the decoding UDFs), never
a failed task.

================================  ==========================================================
``decode_entry(entry)``           ``array<binary>``: the records of a (batched) entry
``is_batched(entry)``             ``boolean``: the entry starts with magic 0x0E01
``decode_txn_log_entry(entry)``   ``array<struct>``: decoded coordinator-log records
``decode_pending_ack_entry(e)``   ``array<struct>``: decoded pending-ack records
``ack_set_cardinality(words)``    ``int``: records still present
``ack_set_is_empty(words)``       ``boolean``: every record deleted
``ack_set_and(a, b)``             ``array<bigint>``: deletions merged
``ack_set_overlaps(a, b, n)``     ``boolean``: both delete an index below batch size ``n``
================================  ==========================================================

:func:`register_udfs` makes them SQL functions named ``txnstream_<name>``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from pyspark.sql import Column, SparkSession
from pyspark.sql.pandas.functions import arrow_udf
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    IntegerType,
    LongType,
    StructField,
    StructType,
)

from txnstream import _native
from txnstream.spark.columns import (
    PENDING_ACK_FIELDS,
    TXN_LOG_FIELDS,
    arrow_type,
    bool_array,
    fixed_array,
    list_array,
    pending_ack_arrays,
    string_array,
    txn_log_arrays,
)

__all__ = [
    "PENDING_ACK_RECORD",
    "TXN_LOG_RECORD",
    "UDFS",
    "ack_set_and",
    "ack_set_cardinality",
    "ack_set_is_empty",
    "ack_set_overlaps",
    "decode_entry",
    "decode_pending_ack_entry",
    "decode_txn_log_entry",
    "is_batched",
    "register_udfs",
]

_BATCH_FIELDS = [
    StructField("batch_size", IntegerType()),
    StructField("batch_index", IntegerType()),
]
#: Element type of :func:`decode_txn_log_entry`'s result.
TXN_LOG_RECORD = StructType([*_BATCH_FIELDS, *TXN_LOG_FIELDS])
#: Element type of :func:`decode_pending_ack_entry`'s result.
PENDING_ACK_RECORD = StructType([*_BATCH_FIELDS, *PENDING_ACK_FIELDS])

Mask = npt.NDArray[np.bool_]


def _array(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


# ------------------------------------------------------------ binary columns


def _binary_call(fn: Callable[..., Any], col: pa.Array) -> Any:
    """Call a Rust ``arrow_*`` function on the buffers of binary array ``col``."""
    if pa.types.is_large_binary(col.type):
        width = 8
    elif pa.types.is_binary(col.type):
        width = 4
    else:
        raise TypeError(f"expected a binary column, got Arrow type {col.type}")
    _, offsets, data = col.buffers()
    return fn(offsets, data if data is not None else b"", width, col.offset, len(col))


def _non_null(col: pa.Array) -> tuple[pa.Array, Mask]:
    """``col`` without its nulls, and the validity of the original rows."""
    if col.null_count == 0:
        return col, np.ones(len(col), dtype=np.bool_)
    valid = np.asarray(col.is_valid().to_numpy(zero_copy_only=False), dtype=np.bool_)
    return col.drop_null(), valid


def _spread(counts: npt.NDArray[np.int64], valid: Mask) -> npt.NDArray[np.int32]:
    """List offsets over all rows, given element counts of the valid rows only."""
    full = np.zeros(len(valid), dtype=np.int64)
    full[valid] = counts
    offsets = np.zeros(len(valid) + 1, dtype=np.int64)
    np.cumsum(full, out=offsets[1:])
    if offsets[-1] > np.iinfo(np.int32).max:
        raise ValueError("more than 2**31 records in one Arrow batch; lower the batch size")
    return offsets.astype(np.int32)


def _decode_entry(entries: pa.Array) -> pa.Array:
    col, valid = _non_null(_array(entries))
    d = _binary_call(_native.arrow_decode_entries, col)
    rec_offsets = d["offsets"]
    out_type = arrow_type(ArrayType(BinaryType()))
    value_type = out_type.value_type
    if pa.types.is_binary(value_type):
        if rec_offsets[-1] > np.iinfo(np.int32).max:
            raise ValueError("records of one Arrow batch exceed 2 GiB; lower the batch size")
        rec_offsets = rec_offsets.astype(np.int32)
    records = pa.Array.from_buffers(
        value_type,
        len(rec_offsets) - 1,
        [None, pa.py_buffer(rec_offsets), pa.py_buffer(d["data"])],
    )
    ok = valid.copy()
    ok[valid] = ~d["failed"]
    counts = np.diff(d["entry_offsets"]).astype(np.int64)
    return list_array(out_type, _spread(counts, valid), records, ok)


def _is_batched(entries: pa.Array) -> pa.Array:
    col = _array(entries)
    flags = _binary_call(_native.arrow_is_batched, col)
    valid = np.asarray(col.is_valid().to_numpy(zero_copy_only=False), dtype=np.bool_)
    return bool_array(flags, valid)


def _decoded_records(entries: pa.Array, kind: str) -> pa.Array:
    col, valid = _non_null(_array(entries))
    if kind == "txn":
        d = _binary_call(_native.arrow_txn_log_columns, col)
        fields, record = txn_log_arrays, TXN_LOG_RECORD
    else:
        d = _binary_call(_native.arrow_pending_ack_columns, col)
        fields, record = pending_ack_arrays, PENDING_ACK_RECORD
    status = d["status"]
    whole = status != 2
    err = d["error_offsets"]
    struct_type = arrow_type(record)
    values = pa.StructArray.from_arrays(
        [
            fixed_array(d["batch_size"], np.int32, pa.int32(), whole),
            fixed_array(d["batch_index"], np.int32, pa.int32(), whole),
            *fields(d, status == 0),
            string_array(d["error_data"], err, np.diff(err) > 0),
        ],
        fields=list(struct_type),
    )
    counts = np.bincount(d["entry_index"], minlength=len(col)).astype(np.int64)
    return list_array(arrow_type(ArrayType(record)), _spread(counts, valid), values, valid)


def _decode_txn_log_entry(entries: pa.Array) -> pa.Array:
    return _decoded_records(entries, "txn")


def _decode_pending_ack_entry(entries: pa.Array) -> pa.Array:
    return _decoded_records(entries, "pending_ack")


# ------------------------------------------------------------ ack-set columns


def _words(col: pa.Array) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int64], Mask]:
    """Offsets, words and validity of a ``list<bigint>`` column."""
    col = _array(col)
    if pa.types.is_large_list(col.type):
        col = col.cast(pa.list_(col.type.value_type))
    if not pa.types.is_list(col.type) or not pa.types.is_integer(col.type.value_type):
        raise TypeError(f"expected an array<bigint> column of ack-set words, got {col.type}")
    offsets = np.asarray(col.offsets.to_numpy(zero_copy_only=False), dtype=np.int32)
    values = col.values.cast(pa.int64()).fill_null(0)
    words = np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.int64)
    valid = np.asarray(col.is_valid().to_numpy(zero_copy_only=False), dtype=np.bool_)
    return offsets, words, valid


def _ack_set_cardinality(words: pa.Array) -> pa.Array:
    o, v, valid = _words(words)
    return fixed_array(_native.ackset_list_cardinality(o, v), np.int32, pa.int32(), valid)


def _ack_set_is_empty(words: pa.Array) -> pa.Array:
    o, v, valid = _words(words)
    return bool_array(_native.ackset_list_is_empty(o, v), valid)


def _ack_set_and(a: pa.Array, b: pa.Array) -> pa.Array:
    ao, av, a_valid = _words(a)
    bo, bv, b_valid = _words(b)
    offsets, values = _native.ackset_list_and(ao, av, bo, bv)
    typ = arrow_type(ArrayType(LongType()))
    return list_array(typ, offsets, fixed_array(values, np.int64, pa.int64()), a_valid & b_valid)


def _ack_set_overlaps(a: pa.Array, b: pa.Array, batch_size: pa.Array) -> pa.Array:
    ao, av, a_valid = _words(a)
    bo, bv, b_valid = _words(b)
    sizes_col = _array(batch_size)
    sizes = np.asarray(
        sizes_col.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64
    )
    valid = a_valid & b_valid & (sizes >= 1) & (sizes <= _native.MAX_BATCH_SIZE)
    hits = _native.ackset_list_overlaps(ao, av, bo, bv, np.where(valid, sizes, 1))
    return bool_array(hits, valid)


def _udf(fn: Callable[..., pa.Array], return_type: DataType) -> Callable[..., Column]:
    # The function's ``pa.Array`` hints make it a scalar Arrow UDF (what PySpark
    # prefers at run time; its stubs only know the form naming ArrowUDFType).
    make: Callable[[Callable[..., pa.Array], DataType], Callable[..., Column]] = cast(
        Any, arrow_udf
    )
    return make(fn, return_type)


decode_entry = _udf(_decode_entry, ArrayType(BinaryType()))
is_batched = _udf(_is_batched, BooleanType())
decode_txn_log_entry = _udf(_decode_txn_log_entry, ArrayType(TXN_LOG_RECORD))
decode_pending_ack_entry = _udf(_decode_pending_ack_entry, ArrayType(PENDING_ACK_RECORD))
ack_set_cardinality = _udf(_ack_set_cardinality, IntegerType())
ack_set_is_empty = _udf(_ack_set_is_empty, BooleanType())
ack_set_and = _udf(_ack_set_and, ArrayType(LongType()))
ack_set_overlaps = _udf(_ack_set_overlaps, BooleanType())

#: Every UDF by its name.
UDFS: dict[str, Callable[..., Column]] = {
    "decode_entry": decode_entry,
    "is_batched": is_batched,
    "decode_txn_log_entry": decode_txn_log_entry,
    "decode_pending_ack_entry": decode_pending_ack_entry,
    "ack_set_cardinality": ack_set_cardinality,
    "ack_set_is_empty": ack_set_is_empty,
    "ack_set_and": ack_set_and,
    "ack_set_overlaps": ack_set_overlaps,
}


def register_udfs(spark: SparkSession) -> None:
    """Register every UDF as SQL function ``txnstream_<name>`` in ``spark``."""
    for name, fn in UDFS.items():
        spark.udf.register(f"txnstream_{name}", fn)
