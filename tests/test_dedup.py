"""Deduplication state on its own: snapshots against a reference, and their cost in counts.

The broker-level behaviour (retries, restarts, transactions) is in
``test_broker.py`` and ``test_tb_snapshots.py``; here random placements,
failures, aborts and re-sends drive one :class:`Deduplication`, and every
snapshot is compared with what the rule says it must hold, computed the
plain way from the windows.
"""

from __future__ import annotations

import random
from concurrent.futures import Future

import pytest

from txnstream._native import Position
from txnstream.broker.dedup import ABORTED, ENDED, OPEN, SNAPSHOT_RECENT, Deduplication, TxnKey
from txnstream.errors import DuplicateSequenceError, TransactionConflictError
from txnstream.proto import TransactionBufferSnapshot


def _expected(
    d: Deduplication, end: Position, keep: set[TxnKey]
) -> dict[str, tuple[int, list[int]]]:
    """The rule, read off every window: highest durable id, and the ids a snapshot holds."""
    out: dict[str, tuple[int, list[int]]] = {}
    for name, p in d._producers.items():
        durable = []
        for seq, sent in p.window.items():
            entry = sent.durable_entry()
            if entry is not None and entry <= end:
                durable.append((seq, sent))
        if not durable:
            continue
        recent = len(durable) - SNAPSHOT_RECENT
        ids = [
            seq
            for i, (seq, sent) in enumerate(durable)
            if i >= recent or sent.aborted or (sent.txn is not None and sent.txn in keep)
        ]
        out[name] = (max(seq for seq, _ in durable), ids)
    return out


def _got(snap: TransactionBufferSnapshot) -> dict[str, tuple[int, list[int]]]:
    return {
        ps.producer_name: (ps.last_sequence_id, list(ps.sequence_ids))
        for ps in snap.producer_sequences
    }


@pytest.mark.parametrize("seed", range(8))
def test_snapshot_holds_what_the_rule_says_under_random_sends(seed: int) -> None:
    rng = random.Random(seed)
    # Odd seeds: no retries, so windows stay in sequence-id order (the fast path).
    retries = 0.05 if seed % 2 == 0 else 0.0
    d = Deduplication(window=rng.choice([40, 300, 1024]), max_producers=3)
    producers = [f"p{i}" for i in range(4)]  # more than max_producers: some are forgotten
    next_seq = dict.fromkeys(producers, 0)
    state: dict[TxnKey, str] = {}
    next_txn = 0
    entry_id = 0
    inflight: list[tuple[Future[Position], Position]] = []
    scans = {"ordered": 0, "aborted": 0}
    for step in range(4000):
        # The fourth producer is rare: when it comes, the least recent one is forgotten.
        name = rng.choices(producers, weights=(33, 33, 31, 3))[0]
        roll = rng.random()
        if roll < retries and next_seq[name] > 0:
            # A retry of an earlier id: an aborted one may be sent again.
            seq = rng.randrange(max(0, next_seq[name] - 50), next_seq[name])
            seqs = [seq]
        else:
            n = 1 if rng.random() < 0.8 else rng.randrange(2, 5)
            seqs = list(range(next_seq[name], next_seq[name] + n))
        txn: TxnKey | None = None
        if rng.random() < 0.6:
            next_txn += 1
            txn = (0, next_txn)
            state[txn] = OPEN
        try:
            dup = d.claim(name, seqs, txn, lambda t: state.get(t, ENDED))
        except (DuplicateSequenceError, TransactionConflictError):
            continue
        if dup is not None:
            continue
        next_seq[name] = max(next_seq[name], seqs[-1] + 1)
        entry_id += 1
        pos = Position(1, entry_id)
        kind = rng.random()
        if kind < 0.03:  # failed to queue
            d.failed(name, seqs)
            continue
        fut: Future[Position] = Future()
        if kind < 0.06:
            fut.set_exception(OSError("write failed"))
        else:
            inflight.append((fut, pos))
        d.placed(name, seqs, txn, fut, batched=len(seqs) > 1)
        # Writes become durable in order, a few at a time; transactions end.
        while inflight and rng.random() < 0.7:
            f, p = inflight.pop(0)
            f.set_result(p)
        # Transactions end (a few stay open long: their messages age past the recent ones).
        open_txns = [t for t, s in state.items() if s == OPEN and t[1] % 10]
        if open_txns and rng.random() < 0.5:
            t = rng.choice(open_txns)
            state[t] = ABORTED if rng.random() < 0.3 else ENDED
        if rng.random() < 0.02:
            # The buffer forgets some aborted transactions (their markers were trimmed).
            gone = [t for t, s in state.items() if s == ABORTED and t in d._by_txn]
            forgotten = rng.sample(gone, min(3, len(gone)))
            d.mark_aborted(forgotten)
            for t in forgotten:
                state[t] = ENDED  # the buffer no longer knows it; the messages say aborted
        if step % 97 == 0:
            end = Position(1, entry_id)
            keep = {t for t, s in state.items() if s in (OPEN, ABORTED)}
            snap = TransactionBufferSnapshot()
            d.snapshot(end, snap, keep)
            assert _got(snap) == _expected(d, end, keep), step
            scans["ordered"] += sum(p.ordered for p in d._producers.values())
            scans["aborted"] += sum(
                s.aborted for p in d._producers.values() for s in p.window.values()
            )
            # And a restore of it holds the same (the window order kept).
            again = Deduplication(window=d.window, max_producers=d.max_producers)
            again.restore(snap)
            snap2 = TransactionBufferSnapshot()
            again.snapshot(end, snap2, keep)
            assert _got(snap2) == _got(snap)
    # Both paths ran: windows in order, and marked-aborted messages.
    assert scans["ordered"] > 0 and scans["aborted"] > 0


def test_snapshot_work_is_bounded_by_recent_messages_not_by_the_window() -> None:
    """64 producers with full 1024-message windows: a snapshot reads about 128 each."""
    d = Deduplication(window=1024)
    entry = 0
    for seq in range(1024):
        for p in range(64):
            entry += 1
            txn = (0, entry)
            d.placed(f"p{p}", [seq], txn, None, Position(1, entry))
    open_txns = {(0, 5), (0, 6)}  # two old messages of open transactions are kept too
    snap = TransactionBufferSnapshot()
    d.snapshot(Position(1, entry), snap, open_txns)
    assert d.snapshot_scanned <= 64 * SNAPSHOT_RECENT + len(open_txns)
    assert sum(len(ps.sequence_ids) for ps in snap.producer_sequences) == 64 * 128 + 2
    assert all(ps.last_sequence_id == 1023 for ps in snap.producer_sequences)


def test_mark_aborted_finds_a_transactions_messages_through_the_index() -> None:
    d = Deduplication()
    d.placed("p", [0, 1], (0, 7), None, Position(1, 1), batched=True)
    d.placed("q", [0], (0, 8), None, Position(1, 2))
    d.mark_aborted([(0, 7), (0, 99)])
    assert [s.aborted for s in d._producers["p"].window.values()] == [True, True]
    assert not d._producers["q"].window[0].aborted
    # An aborted message may be sent again (here by a non-transactional send).
    assert d.claim("p", [0, 1], None, lambda _t: ENDED) is None


@pytest.mark.parametrize("refused_resend", [False, True])
def test_a_refused_resend_of_a_forgotten_abort_keeps_it_sendable_after_a_restart(
    refused_resend: bool,
) -> None:
    # Re-sending id 0 (its transaction aborted, its markers trimmed) is claimed,
    # then refused before it is queued: failed() put the message back but not
    # its "aborted and forgotten" mark, so snapshots past the newest 128 left
    # it out, and after a restart every re-send of id 0 was a duplicate.
    t1, t2 = (1, 1), (1, 2)

    def ended(_t: TxnKey) -> str:
        return ENDED  # the buffer forgot t1 (mark_aborted remembers it)

    d = Deduplication()
    d.placed("p", [0], t1, None, Position(3, 0))
    for i in range(1, 200):  # more than SNAPSHOT_RECENT later messages
        d.placed("p", [i], None, None, Position(3, i))
    d.mark_aborted([t1])
    if refused_resend:
        assert d.claim("p", [0], t2, ended) is None
        d.failed("p", [0])  # refused before it was queued (t2 had ended, say)
    for i in range(200, 400):
        d.placed("p", [i], None, None, Position(3, i))
    snap = TransactionBufferSnapshot()
    d.snapshot(Position(3, 1000), snap, keep=())
    again = Deduplication()
    again.restore(snap)
    assert again.claim("p", [0], t2, ended) is None  # sendable, not a duplicate
