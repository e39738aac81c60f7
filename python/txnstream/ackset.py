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
    return _native.ackset_and_many(_rows(a), _rows(b))


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
    sizes = np.ascontiguousarray(batch_sizes, dtype=np.int64)
    return _native.ackset_overlaps_many(_rows(a), _rows(b), sizes)


def _rows(words: npt.ArrayLike) -> npt.NDArray[np.int64]:
    arr = np.ascontiguousarray(words, dtype=np.int64)
    if arr.ndim != 2:
        raise InvalidArgumentError(f"expected a 2-D (n, words) array, got shape {arr.shape}")
    return arr


__all__ = ["AckSet", "and_many", "cardinality_many", "is_empty_many", "overlaps_many"]
