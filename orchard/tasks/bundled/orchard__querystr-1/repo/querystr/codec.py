"""Percent-encoding of query string components."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, quote_plus, unquote_plus

# Characters left as-is besides the always-safe ``A-Za-z0-9_.-~``.
SAFE = "/"


def encode_component(value: Any, *, plus: bool = False) -> str:
    """Percent-encode one key or value (UTF-8).

    Spaces become ``%20``, or ``+`` with ``plus=True``.  Booleans are written as
    ``true``/``false``; other non-strings go through ``str()``.
    """
    if isinstance(value, bool):
        value = "true" if value else "false"
    text = value if isinstance(value, str) else str(value)
    return quote_plus(text, safe=SAFE) if plus else quote(text, safe=SAFE)


def decode_component(text: str) -> str:
    """Decode one key or value; ``+`` is a space, as in HTML form encoding."""
    return unquote_plus(text)
