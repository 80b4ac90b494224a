"""The ledger: the append-only list of moves, and current stock levels."""

from __future__ import annotations

from collections import defaultdict
from typing import Optional

from invledger.models import EXTERNAL, InsufficientStock, InventoryError, Move, MoveKind


class Ledger:
    """Records stock moves and keeps the resulting stock per (warehouse, SKU).

    Every method that records a move returns the :class:`Move`; moves out of a warehouse
    that would make its stock negative raise :class:`InsufficientStock` and record nothing.
    """

    def __init__(self) -> None:
        self._moves: list[Move] = []
        self._stock: defaultdict[tuple[str, str], int] = defaultdict(int)

    @property
    def moves(self) -> tuple[Move, ...]:
        """All moves, oldest first."""
        return tuple(self._moves)

    def _record(self, kind: MoveKind, sku: str, qty: int, src: str, dst: str,
                note: str) -> Move:
        move = Move(len(self._moves) + 1, kind, sku, qty, src, dst, note)
        if src != EXTERNAL:
            available = self._stock[(src, sku)]
            if available < qty:
                raise InsufficientStock(f"{src} holds {available} of {sku}, cannot move {qty}")
            self._stock[(src, sku)] -= qty
        if dst != EXTERNAL:
            self._stock[(dst, sku)] += qty
        self._moves.append(move)
        return move

    def receive(self, sku: str, warehouse: str, qty: int, note: str = "") -> Move:
        """Stock arriving at ``warehouse`` from outside."""
        return self._record(MoveKind.RECEIPT, sku, qty, EXTERNAL, warehouse, note)

    def ship(self, sku: str, warehouse: str, qty: int, note: str = "") -> Move:
        """Stock leaving ``warehouse`` to a customer."""
        return self._record(MoveKind.SHIPMENT, sku, qty, warehouse, EXTERNAL, note)

    def transfer(self, sku: str, src: str, dst: str, qty: int, note: str = "") -> Move:
        """Stock moving from warehouse ``src`` to warehouse ``dst``."""
        if EXTERNAL in (src, dst):
            raise InventoryError("use receive() or ship() for moves from or to outside")
        return self._record(MoveKind.TRANSFER, sku, qty, src, dst, note)

    def adjust(self, sku: str, warehouse: str, delta: int, note: str = "") -> Move:
        """Correct the stock of ``warehouse`` after a count.

        A positive ``delta`` adds found stock; a negative one writes stock off (damage,
        theft) and is recorded as a move from the warehouse to :data:`EXTERNAL`.
        """
        if delta == 0:
            raise InventoryError("an adjustment must change the stock")
        return self._record(MoveKind.ADJUSTMENT, sku, delta, EXTERNAL, warehouse, note)

    def on_hand(self, sku: str, warehouse: Optional[str] = None) -> int:
        """Units of ``sku`` in ``warehouse``, or in all warehouses together."""
        if warehouse is not None:
            return self._stock.get((warehouse, sku), 0)
        return sum(qty for (_, s), qty in self._stock.items() if s == sku)

    def warehouses(self) -> list[str]:
        """Every warehouse that appears in a move, sorted."""
        names = {loc for m in self._moves for loc in (m.src, m.dst)}
        names.discard(EXTERNAL)
        return sorted(names)

    def skus(self) -> list[str]:
        return sorted({m.sku for m in self._moves})
