"""Transaction ids: ``(most_bits, least_bits)`` = (coordinator id, sequence)."""

from __future__ import annotations

from typing import Any

from txnstream.errors import InvalidArgumentError

_U64 = (1 << 64) - 1


class TxnID:
    """Identifier of one transaction; frozen, ordered, hashable.

    ``most_bits`` is the id of the coordinator that owns the transaction,
    ``least_bits`` the sequence that coordinator issued (it only grows).
    Ordering is by ``(most_bits, least_bits)``; ``str()`` gives ``"(most,least)"``.
    """

    __slots__ = ("least_bits", "most_bits")

    most_bits: int
    least_bits: int

    def __init__(self, most_bits: int, least_bits: int) -> None:
        for name, value in (("most_bits", most_bits), ("least_bits", least_bits)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _U64:
                raise InvalidArgumentError(
                    f"TxnID {name} must be an unsigned 64-bit integer, got {value!r}",
                    argument=name,
                    value=value,
                )
        object.__setattr__(self, "most_bits", most_bits)
        object.__setattr__(self, "least_bits", least_bits)

    @classmethod
    def _trusted(cls, most_bits: int, least_bits: int) -> TxnID:
        """Build without validation (the coordinator's own, already checked ids)."""
        obj = object.__new__(cls)
        object.__setattr__(obj, "most_bits", most_bits)
        object.__setattr__(obj, "least_bits", least_bits)
        return obj

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"TxnID is immutable (cannot set {name})")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"TxnID is immutable (cannot delete {name})")

    def _key(self) -> tuple[int, int]:
        return (self.most_bits, self.least_bits)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TxnID):
            return NotImplemented
        return self.most_bits == other.most_bits and self.least_bits == other.least_bits

    def __lt__(self, other: TxnID) -> bool:
        if not isinstance(other, TxnID):
            return NotImplemented
        return self._key() < other._key()

    def __le__(self, other: TxnID) -> bool:
        if not isinstance(other, TxnID):
            return NotImplemented
        return self._key() <= other._key()

    def __gt__(self, other: TxnID) -> bool:
        if not isinstance(other, TxnID):
            return NotImplemented
        return self._key() > other._key()

    def __ge__(self, other: TxnID) -> bool:
        if not isinstance(other, TxnID):
            return NotImplemented
        return self._key() >= other._key()

    def __hash__(self) -> int:
        return hash((self.most_bits, self.least_bits))

    def __str__(self) -> str:
        return f"({self.most_bits},{self.least_bits})"

    def __repr__(self) -> str:
        return f"TxnID(most_bits={self.most_bits}, least_bits={self.least_bits})"

    def __reduce__(self) -> tuple[type[TxnID], tuple[int, int]]:
        return (TxnID, (self.most_bits, self.least_bits))

    @classmethod
    def parse(cls, text: str) -> TxnID:
        """Parse the ``"(most,least)"`` form produced by ``str()``."""
        body = text.strip()
        if body.startswith("(") and body.endswith(")"):
            body = body[1:-1]
        parts = body.split(",")
        try:
            if len(parts) != 2:
                raise ValueError
            return cls(int(parts[0]), int(parts[1]))
        except ValueError:
            raise InvalidArgumentError(
                f"not a transaction id: {text!r} (expected '(most,least)')", value=text
            ) from None


__all__ = ["TxnID"]
