"""The data model: moves of stock between locations."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

EXTERNAL = "(external)"
"""The location standing for everything outside our warehouses (suppliers, customers,
losses). Receipts come from it, shipments go to it."""


class InventoryError(ValueError):
    """An operation that would make the ledger inconsistent."""


class InsufficientStock(InventoryError):
    """A warehouse does not hold enough of a SKU for a move out of it."""


class MoveKind(str, Enum):
    RECEIPT = "receipt"
    SHIPMENT = "shipment"
    TRANSFER = "transfer"
    ADJUSTMENT = "adjustment"


@dataclass(frozen=True)
class Move:
    """``qty`` units of ``sku`` moved from location ``src`` to location ``dst``.

    ``qty`` is always a positive integer: the direction of a move is given by ``src`` and
    ``dst`` alone, one of which may be :data:`EXTERNAL`.
    """

    seq: int
    kind: MoveKind
    sku: str
    qty: int
    src: str
    dst: str
    note: str = ""

    def __post_init__(self) -> None:
        if not self.sku:
            raise InventoryError("a move needs a SKU")
        if not isinstance(self.qty, int) or isinstance(self.qty, bool) or self.qty <= 0:
            raise InventoryError(f"quantity must be a positive integer, got {self.qty!r}")
        if self.src == self.dst:
            raise InventoryError(f"a move cannot go from {self.src!r} to itself")

    def effect(self, location: str) -> int:
        """How this move changes the stock of ``sku`` at ``location``."""
        if location == self.dst:
            return self.qty
        if location == self.src:
            return -self.qty
        return 0
