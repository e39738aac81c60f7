"""What a data directory holds (``txnstream admin logs``), read from its files.

Everything here opens the directory read-only, from its files alone, so it
works on a closed directory and on a live one whose writer keeps running.
"""

from __future__ import annotations

import os
from typing import Any

from txnstream._native import ManagedLedger, Position

__all__ = ["describe_logs", "log_kind"]

_COORDINATOR_PREFIX = "__transaction_log_"
_PENDING_ACK_SUFFIX = "__transaction_pending_ack"


def log_kind(name: str) -> str:
    """Return what the managed ledger ``name`` is: ``txn``, ``pending_ack`` or ``other``."""
    if name.startswith(_COORDINATOR_PREFIX):
        return "txn"
    if name.endswith(_PENDING_ACK_SUFFIX):
        return "pending_ack"
    return "other"


def _pos(p: Position | None) -> str | None:
    return None if p is None else f"{p.ledger_id}:{p.entry_id}"


def describe_logs(directory: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Return one description per managed ledger of ``directory``, sorted by name.

    Each is a dict: ``name``, ``kind``, ``ledgers`` (count), ``entries``
    (stored now), ``first`` / ``last`` (``"ledger:entry"`` or None),
    ``cursors`` (name -> mark-delete position or None).
    """
    out: list[dict[str, Any]] = []
    for name in sorted(ManagedLedger.names(directory)):
        ml = ManagedLedger.open(directory, name, read_only=True)
        try:
            ledgers = ml.ledgers()
            cursors = {c: _pos(ml.open_cursor(c).mark_delete_position) for c in ml.cursor_names()}
            out.append(
                {
                    "name": name,
                    "kind": log_kind(name),
                    "ledgers": len(ledgers),
                    "entries": sum(n for _, n, _ in ledgers),
                    "first": _pos(ml.first_position),
                    "last": _pos(ml.last_position),
                    "cursors": cursors,
                }
            )
        finally:
            ml.close()
    return out
