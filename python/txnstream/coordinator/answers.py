"""What a client request is answered: a status, or a definite refusal (SPEC §4.3, §4.4).

Pure functions over a transaction's state (and the PIP-255 store for one
that left memory), shared by the single and bulk calls so both refuse with
the same error classes and messages:

- changes (adding partitions/subscriptions) need a live OPEN transaction;
- an end is answered with the final status when it is the one asked for,
  else :class:`TransactionAlreadyCommitted` / :class:`TransactionAlreadyAborted`
  (``timed_out`` when the timeout won);
- only a transaction unknown to memory and store is :class:`TransactionNotFound`.
"""

from __future__ import annotations

from txnstream.coordinator.metadata import TxnMeta
from txnstream.coordinator.status import TxnAction, TxnStatus
from txnstream.coordinator.terminated import TerminatedTxnStore
from txnstream.coordinator.txn_id import TxnID
from txnstream.errors import (
    InvalidTxnStatusError,
    TransactionAlreadyAborted,
    TransactionAlreadyCommitted,
    TransactionError,
    TransactionNotFound,
    TransactionTimedOut,
)


def live_meta(
    txns: dict[int, TxnMeta], store: TerminatedTxnStore, txn_id: TxnID, seq: int, want: str
) -> TxnMeta:
    """Return the live transaction ``seq``, or refuse ``want`` (under the table lock)."""
    meta = txns.get(seq)
    if meta is not None:
        return meta
    rec = store.lookup(txn_id)
    if rec is not None:
        raise InvalidTxnStatusError(
            f"cannot {want} transaction {txn_id}: it already ended {rec.status.name}",
            txn_id=txn_id,
            current=rec.status,
            requested=TxnStatus.OPEN,
        )
    raise TransactionNotFound(f"transaction {txn_id} not found", txn_id=txn_id)


def require_open(txn_id: TxnID, meta: TxnMeta, want: str) -> None:
    """Refuse ``want`` unless the transaction is OPEN."""
    if meta.status is TxnStatus.OPEN:
        return
    if meta.timed_out:
        raise TransactionTimedOut(
            f"cannot {want} transaction {txn_id}: it timed out and is {meta.status.name}",
            txn_id=txn_id,
            status=meta.status,
        )
    raise InvalidTxnStatusError(
        f"cannot {want} transaction {txn_id}: it is {meta.status.name}, not OPEN",
        txn_id=txn_id,
        current=meta.status,
        requested=TxnStatus.OPEN,
    )


def end_answer(txn_id: TxnID, act: TxnAction, final: TxnStatus, timed_out: bool) -> TxnStatus:
    """Answer ``act`` on a transaction that ended ``final``: the status, or raise."""
    if final is act.final_status:
        return final
    if final is TxnStatus.COMMITTED:
        raise TransactionAlreadyCommitted(
            f"cannot abort transaction {txn_id}: it already committed",
            txn_id=txn_id,
            status=final,
        )
    why = " (timed out)" if timed_out else ""
    raise TransactionAlreadyAborted(
        f"cannot commit transaction {txn_id}: it already aborted{why}",
        txn_id=txn_id,
        status=final,
        timed_out=timed_out,
    )


def end_answer_or_error(
    txn_id: TxnID, act: TxnAction, meta: TxnMeta
) -> TxnStatus | TransactionError:
    """:func:`end_answer` for ``meta``, with the refusal returned instead of raised."""
    try:
        return end_answer(txn_id, act, meta.status, meta.timed_out)
    except TransactionError as exc:
        return exc


def remembered_answer(store: TerminatedTxnStore, txn_id: TxnID, act: TxnAction) -> TxnStatus:
    """Answer ``act`` on a transaction no longer in memory, from the store."""
    rec = store.lookup(txn_id)
    if rec is None:
        raise TransactionNotFound(
            f"transaction {txn_id} not found (unknown, or ended and not remembered)",
            txn_id=txn_id,
        )
    return end_answer(txn_id, act, rec.status, rec.timed_out)


__all__ = [
    "end_answer",
    "end_answer_or_error",
    "live_meta",
    "remembered_answer",
    "require_open",
]
