"""A client's transaction, and the commit path with at most three durable waits (SPEC §4.5).

``client.transaction(timeout_ms)`` starts one without waiting: the
coordinator issues the id in memory and queues the NEW record. Sends and
acks inside it queue their writes (topic entries, ADD_PARTITION /
ADD_SUBSCRIPTION records, pending-ack ACK records) and return; the
transaction tracks their durability. ``commit()`` then makes at most three
sequential durable waits, each counted (:attr:`Transaction.durable_waits`):

1. everything the transaction wrote is durable -- its NEW and ADD records,
   its messages, its ACK records (usually already so by then); any failure
   aborts it and raises :class:`~txnstream.errors.TransactionWriteFailed`;
2. the decision, COMMITTING, is durable in the coordinator's log;
3. every participant ended it: the transaction buffers' COMMIT markers and
   the pending-ack stores' COMMIT records, written together, share a sync;
   their state is applied (``max_read_position`` moves, acks reach the
   cursors) before the answer.

``commit()`` returns then: the outcome is durable and visible to
READ_COMMITTED readers -- on a partition where an OLDER transaction is
still open, once that one ends too (``max_read_position`` stops before the
first open transaction's first message, as in Pulsar). The
terminated-store record (idempotent end) and the final COMMITTED record
follow off the caller's path. A send or ack that joined the transaction
before ``commit()`` started is part of it (step 1 waits for it); one that
comes later is refused (:class:`~txnstream.errors.InvalidTxnStatusError`).
Once ``abort()`` was asked, even if it failed, the transaction can only
abort: ``commit()`` is refused the same way, as in Pulsar's client.

**Why this order is safe.** The decision is logged only after everything
the transaction wrote is known durable, so a durable COMMITTING never
names a message or an ack that could be lost. Markers and pending-ack
COMMIT records are written only after the decision is durable, so a crash
can leave a decided transaction unmarked, never a marked transaction
undecided. A crash anywhere is repaired at the next open: before step 2
the transaction is OPEN in the coordinator's log or unknown to it -- its
partitions and subscriptions abort it at recovery (unknown) or its timeout
does (open); after step 2 the coordinator finishes the decided end on
every participant (markers and pending-ack records are idempotent); after
step 3 only its final record and cleanup are redone. ``tests/test_broker_crash.py``
kills the process at every step and checks exactly that.

A transaction is a context manager: it commits when the block ends
normally and aborts when it raises. ``commit``/``abort`` are idempotent
(PIP-255 through the coordinator, on by default for a client): the same
call again returns the same outcome; the opposite one raises
``TransactionAlreadyCommitted`` / ``TransactionAlreadyAborted``.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Final

from txnstream.coordinator import TransactionCoordinator, TxnAction, TxnID, TxnStatus
from txnstream.coordinator.ending import EndTrace
from txnstream.errors import (
    InvalidTxnStatusError,
    TransactionAlreadyAborted,
    TransactionAlreadyCommitted,
    TransactionEndPending,
    TransactionWriteFailed,
    TxnStreamError,
)
from txnstream.timer import timeout_ms_arg

if TYPE_CHECKING:
    from txnstream.client.client import Client

log = logging.getLogger(__name__)

OPEN: Final = "open"
COMMITTING: Final = "committing"
ABORTING: Final = "aborting"
COMMITTED: Final = "committed"
ABORTED: Final = "aborted"


class Transaction:
    """One transaction of a :class:`~txnstream.client.Client`; thread-safe."""

    def __init__(
        self,
        client: Client,
        coordinator: TransactionCoordinator,
        txn_id: TxnID,
        new_record: Future[Any],
        timeout_ms: int,
    ) -> None:
        self.client = client
        self.txn_id = txn_id
        self.timeout_ms = timeout_ms
        self._tc = coordinator
        self._lock = threading.Lock()
        self._state = OPEN
        self._outstanding = 0
        # Made only when a caller must wait for tracked writes (most commits
        # find them done); set and dropped once none is outstanding.
        self._settled: threading.Event | None = None
        self._failed: BaseException | None = None
        self._partitions: set[str] = set()
        self._subscriptions: set[tuple[str, str]] = set()
        self._waiters: list[Any] = []
        #: Sequential durable waits of the last commit/abort (SPEC §4.5: <= 3 for commit).
        self.durable_waits = 0
        #: Which phases waited (``"written"``, ``"decision"``, ``"participants"``, ...).
        self.wait_phases: list[str] = []
        self.track(new_record)

    # ------------------------------------------------------------ tracking

    @property
    def state(self) -> str:
        """``open``, ``committing``, ``aborting``, ``committed`` or ``aborted``."""
        return self._state

    def track(self, fut: Future[Any]) -> None:
        """Count a write of this transaction; commit waits for it first."""
        with self._lock:
            self._outstanding += 1
        fut.add_done_callback(self._write_done)

    def _join(self) -> None:
        """Start a send or ack in this transaction: raise unless it is open.

        The check and the count are one step under the transaction's lock,
        so an end that starts afterwards waits for the operation (its write
        joins the commit's first wait) and one that started before refuses
        it: a send can never slip in between the check and the commit's
        wait. Pair with :meth:`_joined` (in a ``finally``).
        """
        with self._lock:
            self.check_usable()
            self._outstanding += 1

    def _joined(self, fut: Future[Any] | None) -> None:
        """End what :meth:`_join` started: its write (commit waits for it), or None."""
        if fut is not None:
            fut.add_done_callback(self._write_done)
        else:
            self._settle_one(None)

    def _write_done(self, fut: Future[Any]) -> None:
        self._settle_one(fut.exception())

    def _settle_one(self, exc: BaseException | None) -> None:
        with self._lock:
            if exc is not None and self._failed is None:
                self._failed = exc
            self._outstanding -= 1
            if self._outstanding:
                return
            settled, self._settled = self._settled, None
            waiters, self._waiters = self._waiters, []
        if settled is not None:
            settled.set()
        for w in waiters:
            w()

    def _wait_settled(self, timeout_s: float) -> bool:
        # Wait until no tracked write is outstanding; False if the time ran out.
        with self._lock:
            if not self._outstanding:
                return True
            if self._settled is None:
                self._settled = threading.Event()
            settled = self._settled
        return settled.wait(timeout_s)

    def when_written(self, callback: Any) -> bool:
        """Call ``callback()`` once every tracked write finished; False if all already did."""
        with self._lock:
            if not self._outstanding:
                return False
            self._waiters.append(callback)
            return True

    def wait_durable(self, timeout_ms: int | None = None) -> bool:
        """Wait until every write of the transaction so far is durable (or failed).

        Not needed before :meth:`commit` (which does it); useful to know
        that the transaction's messages and acks would survive a crash
        before deciding. Returns False if ``timeout_ms`` passed first
        (None: the client's end timeout).
        """
        timeout_ms_arg(timeout_ms)
        limit = self.client.end_timeout_ms if timeout_ms is None else timeout_ms
        return self._wait_settled(limit / 1000.0)

    def check_usable(self) -> None:
        """Raise unless the transaction is open (a send or ack may join it)."""
        if self._state != OPEN:
            raise InvalidTxnStatusError(
                f"transaction {self.txn_id} is {self._state}; it cannot be used any more",
                txn_id=self.txn_id,
                current=self._state,
            )

    def add_partition(self, partition: str) -> None:
        """Before its first send to ``partition``: tell the coordinator (no wait)."""
        if partition in self._partitions:
            return
        fut = self._tc.add_partition_nowait(self.txn_id, partition)
        with self._lock:
            self._partitions.add(partition)
        if fut is not None:
            self.track(fut)

    def add_subscription(self, topic: str, subscription: str) -> None:
        """Before its first ack on ``(topic, subscription)``: tell the coordinator (no wait)."""
        key = (topic, subscription)
        if key in self._subscriptions:
            return
        fut = self._tc.add_subscription_nowait(self.txn_id, topic, subscription)
        with self._lock:
            self._subscriptions.add(key)
        if fut is not None:
            self.track(fut)

    # ------------------------------------------------------------ ending

    def _begin_end(self, commit: bool) -> bool:
        # True if the end must go to the coordinator; False: already there.
        self.client.broker.check_process()  # a forked child: nothing it waits for would come
        want, final = (COMMITTING, COMMITTED) if commit else (ABORTING, ABORTED)
        other = ABORTED if commit else COMMITTED
        with self._lock:
            state = self._state
            if state == final:
                return False
            if state == other:
                err = TransactionAlreadyAborted if commit else TransactionAlreadyCommitted
                raise err(
                    f"transaction {self.txn_id} already {other}",
                    txn_id=self.txn_id,
                    status=TxnStatus.ABORTED if commit else TxnStatus.COMMITTED,
                )
            if commit and state == ABORTING:
                # An abort was asked (and failed, or is in flight): as in Pulsar's client,
                # the transaction can only abort now. Its retry is abort().
                raise InvalidTxnStatusError(
                    f"transaction {self.txn_id} is aborting; it cannot commit (call abort() "
                    "again to finish the abort)",
                    txn_id=self.txn_id,
                    current=state,
                )
            if commit and state == OPEN:
                # A closed client is fatal (SPEC §5): no new commit through it. Its open
                # transactions time out (or abort); an end already asked may finish.
                self.client.check_open()
            self._state = want if state in (OPEN, want) else state
            return True

    def commit(self) -> None:
        """Commit; return once the outcome is durable and visible (see the module docs).

        Raises :class:`TransactionWriteFailed` (aborted: a write of it
        failed), ``TransactionAlreadyAborted`` (e.g. it timed out; abortable),
        or ``TransactionEndPending`` (retriable: call ``commit()`` again).
        """
        if not self._begin_end(commit=True):
            return
        started = time.monotonic()
        waits, phases = 0, []
        deadline = started + self.client.end_timeout_ms / 1000.0
        if self._outstanding:
            waits += 1
            phases.append("written")
            if not self._wait_settled(max(0.0, deadline - time.monotonic())):
                raise self._writes_pending()
        if self._failed is not None:
            raise self._aborted_after_failure()
        trace = EndTrace()
        try:
            self._tc.end_transaction(self.txn_id, TxnAction.COMMIT, trace=trace)
        except TransactionAlreadyAborted:
            self._commit_refused()
            raise
        except TransactionWriteFailed:
            self._abort_after_failure()
            raise
        finally:
            self.durable_waits = waits + trace.waits
            self.wait_phases = phases + trace.phases
        self._committed(started)

    # The steps of commit() that do not block, shared with the asyncio face
    # (which awaits the writes and the end instead of blocking a thread).

    def _writes_pending(self) -> TransactionEndPending:
        return TransactionEndPending(
            f"transaction {self.txn_id}: its writes did not finish in time; call commit() again",
            txn_id=self.txn_id,
            outcome=None,
        )

    def _aborted_after_failure(self) -> TransactionWriteFailed:
        # Blocks (aborts the transaction, retrying); the error to raise to the caller.
        cause = self._failed
        aborted = self._abort_after_failure()
        outcome = "was aborted" if aborted else "cannot commit (its timeout aborts it)"
        return TransactionWriteFailed(
            f"transaction {self.txn_id} {outcome}: a write of it failed ({cause!r})",
            txn_id=self.txn_id,
            cause=cause,
            aborted=aborted,
        )

    def _commit_refused(self) -> None:
        self._aborted()

    def _aborted(self) -> None:
        with self._lock:
            first = self._state != ABORTED  # a commit and an abort may race to it
            self._state = ABORTED
        if first:
            self.client._ended(False, 0, 0.0)

    def _committed(self, started: float) -> None:
        with self._lock:
            first = self._state != COMMITTED  # two threads may commit one transaction
            self._state = COMMITTED
        if first:
            self.client._ended(True, self.durable_waits, time.monotonic() - started)

    def abort(self) -> None:
        """Abort; return once the outcome is durable (messages invisible, acks released)."""
        if not self._begin_end(commit=False):
            return
        trace = EndTrace()
        try:
            self._tc.end_transaction(self.txn_id, TxnAction.ABORT, trace=trace)
        except TransactionAlreadyCommitted:
            with self._lock:
                self._state = COMMITTED
            raise
        finally:
            self.durable_waits = trace.waits
            self.wait_phases = trace.phases
        self._aborted()

    def _abort_after_failure(self) -> bool:
        """Abort after a failed write; True once the abort is durable.

        The abort is retried while it fails with a retriable error (the
        fault that failed the write often fails the next write too), until
        the client's end deadline. If it still fails, the transaction stays
        ABORTING here and its coordinator aborts it at its timeout: it can
        never commit, but its acks stay held until then.
        """
        with self._lock:
            self._state = ABORTING
        deadline = time.monotonic() + self.client.end_timeout_ms / 1000.0
        delay = 0.005
        while True:
            try:
                self._tc.end_transaction(self.txn_id, TxnAction.ABORT)
                break
            except TransactionAlreadyAborted:
                break
            except TxnStreamError as exc:
                if not exc.retriable or time.monotonic() + delay > deadline:
                    log.warning(
                        "aborting %s after a failed write failed; its timeout aborts it",
                        self.txn_id,
                        exc_info=True,
                    )
                    return False
            time.sleep(delay)
            delay = min(delay * 2, 0.2)
        self._aborted()
        return True

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.commit()
            return
        if self._state in (OPEN, ABORTING):
            try:
                self.abort()
            except Exception:
                log.warning("aborting %s after %r failed", self.txn_id, exc, exc_info=True)

    def __repr__(self) -> str:
        return f"Transaction({self.txn_id}, {self._state})"


__all__ = ["ABORTED", "ABORTING", "COMMITTED", "COMMITTING", "OPEN", "Transaction"]
