"""Batch-index ack sets (SPEC §3.3), implemented in Rust.

An :class:`AckSet` holds one bit per record of a batched entry: 1 = still
present, 0 = deleted. ``to_words()`` equals Java ``BitSet.toLongArray()``
(signed 64-bit words, trailing zero words dropped), the ``ack_set`` wire
field. ``a.and_(b)`` merges deletions in place; an entry whose set
``is_empty()`` is deleted whole. ``a.overlaps(b)`` is true when both sets
delete a common index — two transactional acks claiming the same record.

The ``*_many`` functions apply one operation to many sets stored as rows of
a 2-D int64 numpy array, in one call.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

import txnstream._native as _native
from txnstream.errors import InvalidArgumentError

AckSet = _native.AckSet


def and_many(a: npt.ArrayLike, b: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """Row-wise AND of two ``(n, words)`` int64 arrays."""
    return _native.ackset_and_many(_rows(a, "a"), _rows(b, "b"))


def cardinality_many(words: npt.ArrayLike) -> npt.NDArray[np.uint32]:
    """Count the records still present in each row."""
    return _native.ackset_cardinality_many(_rows(words))


def is_empty_many(words: npt.ArrayLike) -> npt.NDArray[np.bool_]:
    """Tell, per row, whether every record is deleted."""
    return _native.ackset_is_empty_many(_rows(words))


def overlaps_many(
    a: npt.ArrayLike, b: npt.ArrayLike, batch_sizes: npt.ArrayLike
) -> npt.NDArray[np.bool_]:
    """Tell, per row, whether ``a[i]`` and ``b[i]`` delete a common index.

    Only indexes below ``batch_sizes[i]`` count.
    """
    sizes = _ints(batch_sizes, "batch_sizes", 1)
    return _native.ackset_overlaps_many(_rows(a, "a"), _rows(b, "b"), sizes)


def _ints(values: npt.ArrayLike, argument: str, ndim: int) -> npt.NDArray[np.int64]:
    # An int64 array of ``ndim`` dimensions from integer input (whole floats
    # too; 1.5 is refused, not truncated).
    try:
        arr = np.asarray(values)
    except (TypeError, ValueError, OverflowError) as e:  # ragged rows, say
        raise InvalidArgumentError(
            f"{argument} must be a {ndim}-D array of int64, got {values!r:.80}: {e}",
            argument=argument,
            value=repr(values)[:80],
        ) from e
    whole = arr.dtype.kind in "iu" or (
        arr.dtype.kind == "f"
        and bool(
            np.all(
                np.isfinite(arr) & (arr == np.trunc(arr)) & (arr >= -(2.0**63)) & (arr < 2.0**63)
            )
        )
    )
    if arr.ndim != ndim or (arr.size and not whole):
        raise InvalidArgumentError(
            f"{argument} must be a {ndim}-D array of int64, got shape {arr.shape} of {arr.dtype}",
            argument=argument,
            value=f"{arr.shape} {arr.dtype}",
        )
    if arr.dtype.kind == "u" and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
        raise InvalidArgumentError(
            f"{argument} must fit int64 (Java's signed words), got {int(arr.max())}",
            argument=argument,
            value=int(arr.max()),
        )
    return np.ascontiguousarray(arr, dtype=np.int64)


def _rows(words: npt.ArrayLike, argument: str = "words") -> npt.NDArray[np.int64]:
    arr = _ints(words, argument, 2)
    if arr.shape[1] == 0:  # no words: every index deleted, one result per row still
        arr = np.zeros((arr.shape[0], 1), dtype=np.int64)
    return arr


__all__ = ["AckSet", "and_many", "cardinality_many", "is_empty_many", "overlaps_many"]
