"""Validation of coordinator call arguments (shared by single and bulk calls).

Bad input is an :class:`~txnstream.errors.InvalidArgumentError` naming the
argument and the bad value, raised before anything is changed or logged.
"""

from __future__ import annotations

from collections.abc import Iterable

from txnstream.coordinator.txn_id import TxnID
from txnstream.errors import InvalidArgumentError
from txnstream.proto import Subscription


def txn_id_arg(txn_id: object) -> TxnID:
    """Return ``txn_id`` if it is a :class:`TxnID`."""
    if not isinstance(txn_id, TxnID):
        raise InvalidArgumentError(
            f"expected a TxnID, got {txn_id!r}", argument="txn_id", value=txn_id
        )
    return txn_id


def timeout_arg(timeout_ms: object, max_timeout_ms: int) -> int:
    """Return ``timeout_ms`` if it is an int in ``1..max_timeout_ms``."""
    if (
        isinstance(timeout_ms, bool)
        or not isinstance(timeout_ms, int)
        or not 0 < timeout_ms <= max_timeout_ms
    ):
        raise InvalidArgumentError(
            f"timeout_ms must be an integer in 1..{max_timeout_ms}, got {timeout_ms!r}",
            argument="timeout_ms",
            value=timeout_ms,
        )
    return timeout_ms


def client_arg(client_name: object) -> str | None:
    """Return the client name (``None`` for none or empty)."""
    if client_name is not None and not isinstance(client_name, str):
        raise InvalidArgumentError(
            f"client_name must be a string or None, got {client_name!r}",
            argument="client_name",
            value=client_name,
        )
    return client_name or None


def partition_names(partitions: Iterable[str] | str) -> list[str]:
    """Return the partition names as a list of non-empty strings."""
    names = list(partitions) if not isinstance(partitions, str) else [partitions]
    for p in names:
        if not isinstance(p, str) or not p:
            raise InvalidArgumentError(
                f"partition names must be non-empty strings, got {p!r}",
                argument="partitions",
                value=p,
            )
    return names


def subscription_pairs(
    subscriptions: Iterable[tuple[str, str] | Subscription],
) -> list[tuple[str, str]]:
    """Return ``(topic, subscription)`` pairs of non-empty strings."""
    subs: list[tuple[str, str]] = []
    for s in subscriptions:
        pair = (s.topic, s.subscription) if isinstance(s, Subscription) else s
        if (
            not isinstance(pair, tuple)
            or len(pair) != 2
            or not all(isinstance(x, str) and x for x in pair)
        ):
            raise InvalidArgumentError(
                f"subscriptions must be (topic, subscription) pairs of non-empty strings, "
                f"got {s!r}",
                argument="subscriptions",
                value=s,
            )
        subs.append(pair)
    return subs


__all__ = ["client_arg", "partition_names", "subscription_pairs", "timeout_arg", "txn_id_arg"]
