"""Starting transactions: one (``new_transaction``) or many (``new_transactions``).

Both make the same three moves (the single one without any list, it is the
hot path of every client thread):

1. under the table lock: issue sequences and insert OPEN ``TxnMeta``s
   (the sequence mark is reserved durably first, see :mod:`.sequence`);
2. outside it: write the NEW records and wait until durable (one record
   through the writer's batching, or many as one batch); on failure the
   transactions are removed again and the error raised;
3. under the lock: attach the positions, count them and arm their timeouts.
"""

from __future__ import annotations

from collections.abc import Iterable

from txnstream._native import encode_txn_new
from txnstream.coordinator.arguments import client_arg, timeout_arg
from txnstream.coordinator.background import BackgroundEnds
from txnstream.coordinator.config import CoordinatorConfig
from txnstream.coordinator.counters import CoordinatorCounters
from txnstream.coordinator.durable import DurableWriter
from txnstream.coordinator.metadata import TxnMeta
from txnstream.coordinator.status import TxnStatus
from txnstream.coordinator.table import TransactionTable
from txnstream.coordinator.timeouts import Clock
from txnstream.coordinator.txn_id import TxnID
from txnstream.errors import InvalidArgumentError


class TxnStarter:
    """Creates OPEN transactions and answers once their NEW records are durable."""

    def __init__(
        self,
        table: TransactionTable,
        writer: DurableWriter,
        background: BackgroundEnds,
        counters: CoordinatorCounters,
        config: CoordinatorConfig,
        clock: Clock,
    ) -> None:
        self._table = table
        self._writer = writer
        self._background = background
        self._counts = counters.counts
        self._config = config
        self._clock = clock

    def _timeout(self, timeout_ms: int | None) -> int:
        cfg = self._config
        return timeout_arg(
            cfg.default_timeout_ms if timeout_ms is None else timeout_ms, cfg.max_timeout_ms
        )

    def start_one(self, timeout_ms: int | None, client_name: str | None) -> TxnID:
        """Start one transaction (``new_transaction``); the hot path, no lists."""
        timeout = self._timeout(timeout_ms)
        client = client_arg(client_name)
        table = self._table
        now = self._clock()
        with table.lock:
            table.check_open()
            seq = table.issue(1)
            meta = table.txns[seq] = TxnMeta(seq, timeout, now, client)
        record = encode_txn_new(table.tc_id, seq, now, timeout, client)
        try:
            pos = self._writer.write(record)
        except BaseException:
            self._forget((seq,))
            raise
        with table.lock:
            meta.positions.append(pos)
            self._counts["created"] += 1
            if meta.status is TxnStatus.OPEN and not table.closed:
                self._background.arm(meta)
        return table.tid(seq)

    def start_many(
        self, count: int, timeout_ms: int | None, client_name: str | None
    ) -> list[TxnID]:
        """Start ``count`` transactions with one log write (``new_transactions``)."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise InvalidArgumentError(
                f"count must be a non-negative integer, got {count!r}",
                argument="count",
                value=count,
            )
        timeout = self._timeout(timeout_ms)
        client = client_arg(client_name)
        if count == 0:
            return []
        table = self._table
        now = self._clock()
        with table.lock:
            table.check_open()
            first = table.issue(count)
            seqs = range(first, first + count)
            metas = [TxnMeta(seq, timeout, now, client) for seq in seqs]
            table.txns.update(zip(seqs, metas, strict=True))
        tc = table.tc_id
        records = [encode_txn_new(tc, seq, now, timeout, client) for seq in seqs]
        try:
            positions = self._writer.write_many(records)
        except BaseException:
            self._forget(seqs)
            raise
        with table.lock:
            armed: list[TxnMeta] = []
            for meta, pos in zip(metas, positions, strict=True):
                meta.positions.append(pos)
                if meta.status is TxnStatus.OPEN:
                    armed.append(meta)
            self._counts["created"] += count
            if not table.closed:
                self._background.arm_all(armed)
        return [table.tid(seq) for seq in seqs]

    def _forget(self, seqs: Iterable[int]) -> None:
        # Their NEW records are not durable: as if never started.
        with self._table.lock:
            for seq in seqs:
                self._table.txns.pop(seq, None)


__all__ = ["TxnStarter"]
