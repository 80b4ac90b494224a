"""Cell converters.

A converter takes the text of a cell (already stripped and non-empty) and returns the Python
value, or raises ``ValueError`` with a message meant for the person who wrote the file.
"""

from __future__ import annotations

import math
from datetime import date, datetime
from typing import Any, Callable

Converter = Callable[[str], Any]

TRUE_WORDS = frozenset({"1", "true", "t", "yes", "y", "on"})
FALSE_WORDS = frozenset({"0", "false", "f", "no", "n", "off"})


def to_str(text: str) -> str:
    """The cell as is."""
    return text


def to_int(text: str) -> int:
    """A base-10 integer; ``1_000`` style separators are accepted."""
    try:
        return int(text, 10)
    except ValueError:
        raise ValueError(f"not an integer: {text!r}") from None


def to_float(text: str) -> float:
    """A finite floating point number (``nan`` and ``inf`` are rejected)."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"not a finite number: {text!r}")
    return value


def to_bool(text: str) -> bool:
    """``yes``/``no``, ``true``/``false``, ``1``/``0`` and friends, case-insensitively."""
    word = text.lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(f"not a boolean: {text!r}")


def date_converter(fmt: str = "%Y-%m-%d") -> Converter:
    """A converter for dates written in ``fmt`` (a ``strptime`` format)."""

    def to_date(text: str) -> date:
        try:
            return datetime.strptime(text, fmt).date()
        except ValueError:
            raise ValueError(f"not a date ({fmt}): {text!r}") from None

    to_date.__name__ = f"to_date[{fmt}]"
    return to_date


CONVERTERS: dict[str, Converter] = {
    "str": to_str,
    "int": to_int,
    "float": to_float,
    "bool": to_bool,
    "date": date_converter(),
}


def get_converter(kind: str | Converter) -> Converter:
    """The converter for a type name from :data:`CONVERTERS`, or ``kind`` itself if callable."""
    if callable(kind):
        return kind
    try:
        return CONVERTERS[kind]
    except KeyError:
        known = ", ".join(sorted(CONVERTERS))
        raise ValueError(f"unknown column type {kind!r} (known: {known})") from None
