"""Turn expression text into a list of tokens."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Union

from .errors import ParseError

Number = Union[int, float]

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<number>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)
  | (?P<name>[A-Za-z_][A-Za-z_0-9]*)
  | (?P<op>//|[-+*/%^(),])
    """,
    re.VERBOSE,
)


@dataclass(frozen=True)
class Token:
    """``kind`` is ``"number"``, ``"name"`` or ``"op"``; ``pos`` is the 0-based column."""

    kind: str
    value: Union[str, Number]
    pos: int


def _number(text: str) -> Number:
    if any(c in text for c in ".eE"):
        return float(text)
    return int(text)


def tokenize(text: str) -> list[Token]:
    """Split ``text`` into tokens, raising :class:`ParseError` on stray characters."""
    tokens = []
    pos = 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            raise ParseError(f"unexpected character {text[pos]!r}", pos)
        kind = match.lastgroup
        lexeme = match.group()
        if kind == "number":
            tokens.append(Token("number", _number(lexeme), pos))
        elif kind != "ws":
            tokens.append(Token(kind, lexeme, pos))
        pos = match.end()
    return tokens
