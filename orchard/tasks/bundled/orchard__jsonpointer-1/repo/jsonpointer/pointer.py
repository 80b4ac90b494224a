"""Pointer strings and reference tokens (RFC 6901, sections 3 and 4)."""

from __future__ import annotations

import re
from typing import Iterable

_BAD_ESCAPE = re.compile(r"~(?![01])")


class JsonPointerError(ValueError):
    """A malformed pointer, or one that does not resolve in a document."""


def escape(token: str) -> str:
    """Escape a reference token: ``~`` becomes ``~0`` and ``/`` becomes ``~1``."""
    return token.replace("~", "~0").replace("/", "~1")


def unescape(token: str) -> str:
    """Undo :func:`escape`. ``~1`` is replaced before ``~0``, so ``~01`` is ``~1``."""
    if _BAD_ESCAPE.search(token):
        raise JsonPointerError(f"invalid escape in reference token {token!r}")
    return token.replace("~1", "/").replace("~0", "~")


def parse(pointer: str) -> list[str]:
    """The unescaped reference tokens of ``pointer``.

    ``""`` (the whole document) has no tokens; every other pointer starts with ``/`` and
    each ``/`` starts a token, which may be empty: ``"/"`` is ``[""]``.
    """
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise JsonPointerError(f"a JSON pointer must start with '/': {pointer!r}")
    return [unescape(token) for token in pointer.lstrip("/").split("/")]


def to_pointer(tokens: Iterable[str]) -> str:
    """The pointer string for a sequence of (unescaped) tokens; inverse of :func:`parse`."""
    return "".join("/" + escape(str(token)) for token in tokens)
