"""Parsing unit expressions such as ``kg*m/s^2`` or ``W/(m^2*K)``.

Grammar (``*`` and ``/`` associate to the left, ``^`` binds tightest)::

    expression := term (("*" | "/") term)*
    term       := atom ("^" integer)?
    atom       := symbol | "1" | "(" expression ")"
"""

from __future__ import annotations

import re

from unitconv.units import DIMENSIONLESS, Unit, UnitError, lookup

_TOKEN = re.compile(r"\s*(?:(?P<number>-?\d+)|(?P<symbol>[A-Za-z]+)|(?P<op>[*/^()]))")


def tokenize(text: str) -> list[tuple[str, str]]:
    """Split a unit expression into ``(kind, text)`` tokens; kind is number/symbol/op."""
    tokens = []
    text = text.strip()
    pos = 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            raise UnitError(f"unexpected character {text[pos]!r} at position {pos} in {text!r}")
        kind = match.lastgroup
        tokens.append((kind, match.group(kind)))
        pos = match.end()
    return tokens


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.tokens = tokenize(text)
        self.pos = 0
        self.atoms = 0
        self.affine: Unit | None = None

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> tuple[str, str]:
        token = self.peek()
        if token is None:
            raise UnitError(f"unexpected end of unit expression {self.text!r}")
        self.pos += 1
        return token

    def expression(self) -> Unit:
        unit = self.term()
        while self.peek() in (("op", "*"), ("op", "/")):
            _, op = self.take()
            right = self.term()
            unit = unit * right if op == "*" else unit / right
        return unit

    def term(self) -> Unit:
        unit = self.atom()
        if self.peek() == ("op", "^"):
            self.take()
            kind, value = self.take()
            if kind != "number":
                raise UnitError(f"expected an integer exponent after '^' in {self.text!r}")
            unit = unit ** int(value)
        return unit

    def atom(self) -> Unit:
        kind, value = self.take()
        if kind == "symbol":
            unit = lookup(value)
            self.atoms += 1
            if unit.is_affine:
                self.affine = unit
            return unit
        if kind == "number" and value == "1":
            return DIMENSIONLESS
        if (kind, value) == ("op", "("):
            unit = self.expression()
            if self.peek() != ("op", ")"):
                raise UnitError(f"missing ')' in {self.text!r}")
            self.take()
            return unit
        raise UnitError(f"unexpected {value!r} in {self.text!r}")


def parse_unit(text: str) -> Unit:
    """The :class:`Unit` a unit expression denotes.

    A temperature with an offset (``degC``) may only appear on its own: ``degC/s`` is
    ambiguous and rejected.
    """
    parser = _Parser(text)
    if not parser.tokens:
        raise UnitError("empty unit expression")
    unit = parser.expression()
    if parser.peek() is not None:
        raise UnitError(f"unexpected {parser.peek()[1]!r} in {text!r}")
    if parser.affine is not None:
        if parser.atoms > 1 or unit.dims != parser.affine.dims:
            raise UnitError(f"a temperature with an offset cannot be combined: {text!r}")
        return parser.affine
    return unit
