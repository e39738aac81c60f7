"""Ack sets (SPEC §3.3): Java BitSet word layout, deletion merge, bulk ops."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import txnstream as ts
from txnstream import _native, ackset

MASK64 = (1 << 64) - 1


def java_words(batch_size: int, deleted: set[int]) -> list[int]:
    """Reference model: java.util.BitSet.toLongArray() of {0..n-1} minus deleted."""
    bits = 0
    for i in range(batch_size):
        if i not in deleted:
            bits |= 1 << i
    words = []
    while bits:
        w = bits & MASK64
        words.append(w - (1 << 64) if w >= 1 << 63 else w)
        bits >>= 64
    return words


@pytest.mark.parametrize(
    ("size", "index", "expected"),
    [
        (10, 5, [0b1111011111]),
        (64, 0, [-2]),
        (64, 63, [0x7FFFFFFFFFFFFFFF]),
        (230, 120, [-1, ~(1 << 56), -1, (1 << 38) - 1]),
        (256, 255, [-1, -1, -1, 0x7FFFFFFFFFFFFFFF]),
        (1, 0, []),
    ],
)
def test_java_bitset_words(size: int, index: int, expected: list[int]) -> None:
    s = ts.AckSet(size)
    s.clear(index)
    assert s.to_words() == expected == java_words(size, {index})
    assert ts.AckSet.single_deleted(size, index) == s
    assert ts.AckSet.from_words(expected, size) == s


@given(st.integers(1, 700), st.sets(st.integers(0, 699), max_size=40))
def test_matches_python_model(size: int, deleted: set[int]) -> None:
    deleted = {d % size for d in deleted}
    s = ts.AckSet(size)
    for d in deleted:
        s.clear(d)
    assert s.to_words() == java_words(size, deleted)
    assert s.cardinality() == size - len(deleted)
    assert s.is_empty() == (len(deleted) == size)
    assert s.present() == [i for i in range(size) if i not in deleted]
    assert ts.AckSet.from_words(s.to_words(), size) == s


@given(st.integers(1, 200), st.sets(st.integers(0, 199)), st.sets(st.integers(0, 199)))
def test_and_and_overlap(size: int, a: set[int], b: set[int]) -> None:
    a, b = {x % size for x in a}, {x % size for x in b}
    x, y = ts.AckSet(size), ts.AckSet(size)
    for i in a:
        x.clear(i)
    for i in b:
        y.clear(i)
    assert x.overlaps(y) == bool(a & b)
    merged = x & y
    assert merged.to_words() == java_words(size, a | b)
    x.and_(y)
    assert x == merged


def test_entry_freed_when_all_deleted() -> None:
    s = ts.AckSet(3)
    for i in range(3):
        assert not s.is_empty()
        s.and_(ts.AckSet.single_deleted(3, i))
    assert s.is_empty() and s.to_words() == []


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: ts.AckSet(0), "batch_size must be in"),
        (lambda: ts.AckSet(-3), "got -3"),
        (lambda: ts.AckSet(10).clear(10), "batch index 10 out of range"),
        (lambda: ts.AckSet(10).clear(-1), "batch index -1"),
        (lambda: ts.AckSet.from_words([1 << 12], 10), "beyond batch_size 10"),
        (lambda: ts.AckSet(3).overlaps(ts.AckSet(4)), "different batch sizes: 3 and 4"),
    ],
)
def test_bad_input(call: object, match: str) -> None:
    with pytest.raises(ts.InvalidArgumentError, match=match):
        call()  # type: ignore[operator]


def rows(sets: list[ts.AckSet], width: int) -> np.ndarray:
    out = np.zeros((len(sets), width), dtype=np.int64)
    for i, s in enumerate(sets):
        w = s.to_words()
        out[i, : len(w)] = w
    return out


@given(st.lists(st.tuples(st.sets(st.integers(0, 129)), st.sets(st.integers(0, 129))), max_size=30))
def test_bulk_ops_match_single(pairs: list[tuple[set[int], set[int]]]) -> None:
    size, width = 130, 3
    xs, ys = [], []
    for a, b in pairs:
        x, y = ts.AckSet(size), ts.AckSet(size)
        for i in a:
            x.clear(i)
        for i in b:
            y.clear(i)
        xs.append(x)
        ys.append(y)
    ra, rb = rows(xs, width), rows(ys, width)
    assert ackset.cardinality_many(ra).tolist() == [x.cardinality() for x in xs]
    assert ackset.is_empty_many(ra).tolist() == [x.is_empty() for x in xs]
    assert (
        ackset.and_many(ra, rb).tolist()
        == rows([x & y for x, y in zip(xs, ys, strict=True)], width).tolist()
    )
    sizes = np.full(len(xs), size)
    assert ackset.overlaps_many(ra, rb, sizes).tolist() == [
        x.overlaps(y) for x, y in zip(xs, ys, strict=True)
    ]


def test_bulk_bad_shapes() -> None:
    with pytest.raises(ts.InvalidArgumentError, match="2-D"):
        ackset.cardinality_many(np.zeros(3, dtype=np.int64))
    with pytest.raises(ts.InvalidArgumentError, match="shapes differ"):
        ackset.and_many(np.zeros((2, 2)), np.zeros((2, 3)))
    with pytest.raises(ts.InvalidArgumentError, match="batch size 200 of row 0"):
        ackset.overlaps_many(np.zeros((1, 2)), np.zeros((1, 2)), [200])


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: ts.AckSet(2**70), "batch_size"),
        (lambda: ts.AckSet(-1), "batch_size"),
        (lambda: ts.AckSet.from_words([2**64], 3), "words"),
        (lambda: ts.AckSet.from_words([1], 2**40), "batch_size"),
        (lambda: ts.AckSet(3).clear(2**64), "index"),
        (lambda: ts.AckSet(3).get(-(2**70)), "index"),
        (lambda: ts.AckSet.single_deleted(3, 2**63), "index"),
    ],
)
def test_out_of_range_ints_name_the_argument(call: object, name: str) -> None:
    with pytest.raises(ts.InvalidArgumentError, match=name):
        call()  # type: ignore[operator]


@pytest.mark.parametrize(
    "call",
    [
        lambda: ackset.cardinality_many(None),  # type: ignore[arg-type]
        lambda: ackset.cardinality_many([[1, 2], [3]]),  # ragged
        lambda: ackset.cardinality_many([[2**64]]),
        lambda: ackset.cardinality_many(np.array([[2**63]], dtype=np.uint64)),
        lambda: ackset.cardinality_many([[1.5]]),  # not silently truncated
        lambda: ackset.cardinality_many([[1e19]]),  # whole, but beyond int64: not wrapped
        lambda: ackset.overlaps_many([[1]], [[1]], [1e20]),
        lambda: ackset.overlaps_many([[1]], [[1]], "x"),
        lambda: ackset.overlaps_many([[1]], [[1]], [[8]]),
    ],
)
def test_bulk_bad_input_is_typed(call: object) -> None:
    with pytest.raises(ts.InvalidArgumentError):
        call()  # type: ignore[operator]


def test_bulk_rows_without_words_give_one_result_each() -> None:
    empty = np.zeros((3, 0), dtype=np.int64)
    assert ackset.cardinality_many(empty).tolist() == [0, 0, 0]
    assert ackset.is_empty_many(empty).tolist() == [True, True, True]
    # The native functions too (they returned no rows for zero words).
    assert _native.ackset_cardinality_many(empty).tolist() == [0, 0, 0]
    assert _native.ackset_is_empty_many(empty).tolist() == [True, True, True]


def test_native_bulk_ops_read_fortran_ordered_rows_in_row_order() -> None:
    # as_slice() accepts Fortran-contiguous memory too, which was then cut
    # into rows as if it were C order: a transpose gave wrong answers.
    c = np.array([[-1, -1], [0, 0], [-1, 0]], dtype=np.int64)
    f = np.asfortranarray(c)
    t = np.ascontiguousarray(c.T).T  # a transposed view: F-contiguous too
    b = np.array([[-1, 0], [-1, 0], [0, -1]], dtype=np.int64)
    sizes = np.array([128, 128, 128], dtype=np.int64)
    assert f.flags.f_contiguous and not f.flags.c_contiguous and t.flags.f_contiguous
    for x in (f, t):
        assert _native.ackset_cardinality_many(x).tolist() == [128, 0, 64]
        assert _native.ackset_is_empty_many(x).tolist() == [False, True, False]
        assert _native.ackset_and_many(x, b).tolist() == (c & b).tolist()
        assert _native.ackset_and_many(b, x).tolist() == (c & b).tolist()
        assert _native.ackset_overlaps_many(x, np.asfortranarray(b), sizes).tolist() == [
            False,
            True,
            False,
        ]


def test_ackset_and_with_itself_copy_pickle_and_no_hash() -> None:
    import copy
    import pickle

    a = ts.AckSet.single_deleted(70, 3)
    a.and_(a)  # was RuntimeError "Already mutably borrowed"
    assert a == ts.AckSet.single_deleted(70, 3)
    with pytest.raises(ts.InvalidArgumentError, match="other must be an AckSet, got None"):
        a.and_(None)  # type: ignore[arg-type]
    with pytest.raises(ts.InvalidArgumentError, match="other must be an AckSet, got 5"):
        a.overlaps(5)  # type: ignore[arg-type]
    # Mutable, so not hashable: a set or dict key would be lost by clear().
    with pytest.raises(TypeError, match="unhashable"):
        hash(a)
    for b in (copy.copy(a), copy.deepcopy(a), a.copy(), pickle.loads(pickle.dumps(a))):
        assert type(b) is ts.AckSet and b == a and b is not a
        b.clear(0)
        assert a.get(0) and not b.get(0)
    for proto in range(pickle.HIGHEST_PROTOCOL + 1):
        assert pickle.loads(pickle.dumps(a, protocol=proto)) == a
    # The state of a pickle is checked like from_words' input.
    b = ts.AckSet(3)
    with pytest.raises(ts.InvalidArgumentError, match="beyond batch_size 3"):
        b.__setstate__([1 << 12])
    assert b == ts.AckSet(3)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (
            lambda: _native.ackset_cardinality_many(np.zeros((2, 2), np.int32)),
            "words must be a numpy 2-D int64 array, not a 2-D int32 array",
        ),
        (
            lambda: _native.ackset_is_empty_many([[1]]),  # type: ignore[arg-type]
            "words must be a numpy 2-D int64 array, not list",
        ),
        (
            lambda: _native.ackset_and_many(np.zeros((1, 1), np.int64), np.zeros(1, np.int64)),
            "b must be a numpy 2-D int64 array, not a 1-D int64 array",
        ),
        (
            lambda: _native.ackset_overlaps_many(
                np.zeros((1, 1), np.int64), np.zeros((1, 1), np.int64), np.ones(1, np.int32)
            ),
            "batch_sizes must be a numpy 1-D int64 array, not a 1-D int32 array",
        ),
        (
            lambda: _native.ackset_list_cardinality(np.array([0, 1]), np.array([1])),
            "offsets must be a numpy 1-D int32 array, not a 1-D int64 array",
        ),
        (
            lambda: _native.ackset_list_and(
                np.zeros(1, np.int32),
                np.zeros(0, np.int64),
                np.zeros(1, np.int32),
                None,  # type: ignore[arg-type]
            ),
            "b_values must be a numpy 1-D int64 array, not NoneType",
        ),
    ],
)
def test_native_bulk_ops_name_an_array_of_the_wrong_dtype(call: object, match: str) -> None:
    # PyO3 raised "TypeError: argument 'words': 'ndarray' object cannot be
    # cast as 'ndarray'", which names neither dtype.
    with pytest.raises(ts.InvalidArgumentError, match=match):
        call()  # type: ignore[operator]


def test_numpy_integers_are_ints_and_bools_are_not() -> None:
    # Every decoded column holds numpy integers: AckSet and its words took
    # only Python ints ("batch_size must be an int, not int64").
    from txnstream import proto

    m = proto.PendingAckMetadataEntry(pending_ack_op=proto.ACK)
    p = m.pending_ack_metadata.add(ledgerId=1, entryId=2, batch_size=70)
    p.ack_set.extend([-2, 63])
    c = ts.frame.decode_pending_ack_columns([m.SerializeToString()])
    a, b = int(c["ack_set_offsets"][0]), int(c["ack_set_offsets"][1])
    words, size = c["ack_set_words"][a:b], c["position_batch_size"][0]
    s = ts.AckSet.from_words(words, size)
    assert s == ts.AckSet.from_words([-2, 63], 70)
    assert ts.AckSet(np.int64(3)) == ts.AckSet(3)
    assert ts.AckSet.single_deleted(np.uint8(5), np.int32(2)) == ts.AckSet.single_deleted(5, 2)
    assert not s.get(np.uint64(0)) and s.get(np.int16(1))
    for bad in (True, np.True_, 3.0, np.float64(3.0)):
        with pytest.raises(ts.InvalidArgumentError, match="batch_size must be an int, not"):
            ts.AckSet(bad)  # type: ignore[arg-type]
    with pytest.raises(ts.InvalidArgumentError, match=r"index must be an int in.*got 18446"):
        s.get(np.uint64(2**64 - 1))


def test_overlaps_many_answers_rows_without_words_like_the_others() -> None:
    # (n, 0) rows: cardinality/is_empty answered per row, overlaps_many gave
    # [] without sizes and raised once n sizes were given.
    empty = np.zeros((3, 0), dtype=np.int64)
    ones = np.ones(3, dtype=np.int64)
    assert _native.ackset_overlaps_many(empty, empty, ones).tolist() == [True, True, True]
    assert ackset.overlaps_many(empty, empty, ones).tolist() == [True, True, True]
    with pytest.raises(ts.InvalidArgumentError, match="0 batch sizes for 3 rows"):
        _native.ackset_overlaps_many(empty, empty, np.zeros(0, np.int64))
    none = np.zeros((0, 0), dtype=np.int64)
    assert _native.ackset_overlaps_many(none, none, np.zeros(0, np.int64)).tolist() == []
    assert _native.ackset_and_many(empty, empty).shape == (3, 0)
