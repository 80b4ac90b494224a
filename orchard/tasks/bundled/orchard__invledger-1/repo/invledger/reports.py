"""Reports derived from a ledger's moves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

from invledger.ledger import Ledger
from invledger.models import MoveKind


@dataclass
class Summary:
    """Units that went in and out of one warehouse, by kind of move."""

    received: int = 0
    shipped: int = 0
    transferred_in: int = 0
    transferred_out: int = 0
    adjusted: int = 0  # net: found stock minus written-off stock

    @property
    def net(self) -> int:
        """The change in stock these moves amount to."""
        return (self.received - self.shipped + self.transferred_in - self.transferred_out
                + self.adjusted)


def stock_report(ledger: Ledger) -> list[tuple[str, str, int]]:
    """``(warehouse, sku, on_hand)`` for every non-zero stock level, sorted."""
    rows = []
    for warehouse in ledger.warehouses():
        for sku in ledger.skus():
            qty = ledger.on_hand(sku, warehouse)
            if qty:
                rows.append((warehouse, sku, qty))
    return rows


def movement_summary(ledger: Ledger, sku: Optional[str] = None) -> dict[str, Summary]:
    """A :class:`Summary` per warehouse of all moves (of ``sku`` only, if given).

    For every warehouse, ``summary.net`` equals the change in its stock.
    """
    rows: dict[str, Summary] = {name: Summary() for name in ledger.warehouses()}
    for move in ledger.moves:
        if sku is not None and move.sku != sku:
            continue
        if move.kind is MoveKind.RECEIPT:
            rows[move.dst].received += move.qty
        elif move.kind is MoveKind.SHIPMENT:
            rows[move.src].shipped += move.qty
        elif move.kind is MoveKind.TRANSFER:
            rows[move.src].transferred_out += move.qty
            rows[move.dst].transferred_in += move.qty
        elif move.kind is MoveKind.ADJUSTMENT:
            rows[move.dst].adjusted += move.qty
    return rows


def low_stock(ledger: Ledger, minimums: Mapping[str, int],
              warehouse: Optional[str] = None) -> list[tuple[str, int, int]]:
    """``(sku, on_hand, minimum)`` for every SKU in ``minimums`` whose stock (in
    ``warehouse``, or overall) is below its minimum, sorted by SKU."""
    return [(sku, ledger.on_hand(sku, warehouse), minimum)
            for sku, minimum in sorted(minimums.items())
            if ledger.on_hand(sku, warehouse) < minimum]
