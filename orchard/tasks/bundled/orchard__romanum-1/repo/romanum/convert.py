"""Conversion between integers and Roman numerals.

Only the standard subtractive form is accepted when parsing: ``IV`` not ``IIII``,
``XC`` not ``LXXXX``, at most three repetitions of ``I``, ``X``, ``C`` and ``M``, and
no repetition of ``V``, ``L`` and ``D``.  Parsing is case-insensitive and ignores
surrounding whitespace.
"""

from __future__ import annotations

import re

MIN_VALUE = 1
MAX_VALUE = 3999

_NUMERALS = (
    (1000, "M"),
    (900, "CM"),
    (500, "D"),
    (400, "CD"),
    (100, "C"),
    (90, "XC"),
    (50, "L"),
    (40, "XL"),
    (10, "X"),
    (9, "IX"),
    (5, "V"),
    (4, "IV"),
    (1, "I"),
)

_SYMBOL_VALUES = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}

_ROMAN_RE = re.compile(
    r"""
    M{0,3}              # thousands: 0-3000
    (CM|CD|D?C{0,3})    # hundreds:  900, 400, 0-300 or 500-800
    (XC|XL|L?X{0,3})    # tens:      90, 40, 0-30 or 50-80
    (IX|IV|V?I{0,3})    # units:     9, 4, 0-3 or 5-8
    """,
    re.VERBOSE,
)


class RomanError(ValueError):
    """Base class for romanum errors."""


class OutOfRangeError(RomanError):
    """The integer cannot be written as a standard Roman numeral."""


class InvalidRomanNumeralError(RomanError):
    """The string is not a well-formed Roman numeral."""


def to_roman(n: int) -> str:
    """Return the Roman numeral for ``n`` (1 <= n <= 3999)."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"expected an int, got {type(n).__name__}")
    if not MIN_VALUE <= n <= MAX_VALUE:
        raise OutOfRangeError(f"{n} is outside {MIN_VALUE}..{MAX_VALUE}")
    parts = []
    for value, symbol in _NUMERALS:
        count, n = divmod(n, value)
        parts.append(symbol * count)
    return "".join(parts)


def _normalize(s: str) -> str:
    if not isinstance(s, str):
        raise TypeError(f"expected a str, got {type(s).__name__}")
    return s.strip().upper()


def is_roman(s: str) -> bool:
    """True if ``s`` is a well-formed Roman numeral."""
    try:
        from_roman(s)
    except RomanError:
        return False
    return True


def from_roman(s: str) -> int:
    """Return the integer value of the Roman numeral ``s``.

    Raises :class:`InvalidRomanNumeralError` for anything that is not a well-formed
    numeral in standard form.
    """
    numeral = _normalize(s)
    if not _ROMAN_RE.fullmatch(numeral):
        raise InvalidRomanNumeralError(f"invalid Roman numeral: {s!r}")
    total = 0
    prev = 0
    for symbol in reversed(numeral):
        value = _SYMBOL_VALUES[symbol]
        if value < prev:
            total -= value
        else:
            total += value
            prev = value
    return total
