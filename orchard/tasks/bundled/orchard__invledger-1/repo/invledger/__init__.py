"""Inventory ledger: stock moves across warehouses, and reports."""

from invledger.ledger import Ledger
from invledger.models import EXTERNAL, InsufficientStock, InventoryError, Move, MoveKind
from invledger.reports import Summary, low_stock, movement_summary, stock_report

__all__ = ["EXTERNAL", "InsufficientStock", "InventoryError", "Ledger", "Move", "MoveKind",
           "Summary", "low_stock", "movement_summary", "stock_report"]
__version__ = "0.8.0"
