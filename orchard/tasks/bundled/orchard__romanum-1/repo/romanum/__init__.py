"""romanum: Roman numeral conversion and validation."""

from .convert import (
    MAX_VALUE,
    MIN_VALUE,
    InvalidRomanNumeralError,
    OutOfRangeError,
    RomanError,
    from_roman,
    is_roman,
    to_roman,
)
from .numeral import Roman

__all__ = [
    "MAX_VALUE",
    "MIN_VALUE",
    "InvalidRomanNumeralError",
    "OutOfRangeError",
    "Roman",
    "RomanError",
    "from_roman",
    "is_roman",
    "to_roman",
]
