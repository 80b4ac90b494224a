"""Cell helpers: stringification, display width, padding and alignment specs."""

from __future__ import annotations

import unicodedata
from numbers import Number
from typing import Any, Sequence

ALIGNMENTS = {"l": "left", "c": "center", "r": "right"}

_ZERO_WIDTH = {"\u200b", "\u200c", "\u200d", "\u2060", "\ufeff"}


def display_width(text: str) -> int:
    """The number of terminal columns ``text`` occupies.

    East Asian wide and full-width characters take two columns; combining marks and
    zero-width characters take none.
    """
    width = 0
    for ch in text:
        if ch in _ZERO_WIDTH or unicodedata.combining(ch):
            continue
        width += 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1
    return width


def pad(text: str, width: int, align: str = "left") -> str:
    """Pad ``text`` with spaces to ``width`` display columns."""
    fill = width - display_width(text)
    if fill <= 0:
        return text
    if align == "right":
        return " " * fill + text
    if align == "center":
        left = fill // 2
        return " " * left + text + " " * (fill - left)
    return text + " " * fill


def _is_number(value: Any) -> bool:
    return isinstance(value, Number) and not isinstance(value, bool)


def to_text(value: Any, floatfmt: str = "g", missing: str = "") -> str:
    if value is None:
        return missing
    if isinstance(value, float):
        return format(value, floatfmt)
    return str(value).replace("\n", " ")


def parse_align(spec: str | Sequence[str] | None, rows: list[list[Any]], ncols: int) -> list[str]:
    """Resolve an alignment spec to ``"left"``/``"center"``/``"right"`` per column."""
    if spec is None:
        aligns = []
        for col in range(ncols):
            values = [r[col] for r in rows if r[col] is not None]
            numeric = bool(values) and all(_is_number(v) for v in values)
            aligns.append("right" if numeric else "left")
        return aligns
    letters = list(spec)
    if len(letters) != ncols:
        raise ValueError(f"alignment {spec!r} has {len(letters)} entries for {ncols} columns")
    try:
        return [ALIGNMENTS[a.lower()[:1]] for a in letters]
    except KeyError:
        raise ValueError(f"alignment must use l, c or r: {spec!r}") from None
