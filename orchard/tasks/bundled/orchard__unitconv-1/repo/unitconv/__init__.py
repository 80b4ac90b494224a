"""Physical unit conversion with compound units."""

from unitconv.convert import Quantity, convert, describe
from unitconv.parse import parse_unit, tokenize
from unitconv.units import DimensionError, Unit, UnitError, lookup

__all__ = ["DimensionError", "Quantity", "Unit", "UnitError", "convert", "describe",
           "lookup", "parse_unit", "tokenize"]
__version__ = "0.5.0"
