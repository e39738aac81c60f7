"""The coordinator facade wires its parts: settable collaborators reach the end driver."""

from __future__ import annotations

from txnstream import testing
from txnstream.coordinator import NullParticipants, TransactionCoordinator, TxnID, TxnStatus
from txnstream.testing import STEPS, InMemoryTransactionLog, RecordingParticipants


def test_participants_and_step_hook_set_after_open_are_used_by_ends() -> None:
    tc = TransactionCoordinator(0, InMemoryTransactionLog())
    try:
        assert isinstance(tc.participants, NullParticipants)
        parts = RecordingParticipants()
        steps: list[tuple[str, TxnID]] = []
        tc.participants = parts
        testing.set_step_hook(tc, lambda step, txn: steps.append((step, txn)))
        assert tc.participants is parts
        single = tc.new_transaction()
        tc.add_produced_partitions(single, ["out-0"])
        assert tc.commit(single) is TxnStatus.COMMITTED
        bulk = tc.new_transactions(2)
        assert tc.add_acked_subscriptions_many([(t, [("in", "sub")]) for t in bulk]) == [None] * 2
        assert tc.end_transactions([(t, "abort") for t in bulk]) == [TxnStatus.ABORTED] * 2
        assert parts.partition("out-0").outcomes == {single: True}
        assert parts.subscription("in", "sub").outcomes == {t: False for t in bulk}
        for txn in (single, *bulk):
            assert [s for s, t in steps if t == txn] == list(STEPS)
        testing.set_step_hook(tc, None)
        other = tc.new_transaction()
        assert tc.abort(other) is TxnStatus.ABORTED
        assert all(t != other for _, t in steps)
    finally:
        tc.close()
