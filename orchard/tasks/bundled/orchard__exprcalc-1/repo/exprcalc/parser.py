"""Recursive-descent parser producing a small tuple-based syntax tree.

Grammar (lowest precedence first)::

    expression := term (("+" | "-") term)*
    term       := unary (("*" | "/" | "//" | "%") unary)*
    unary      := ("+" | "-") unary | power
    power      := atom ("^" unary)?
    atom       := NUMBER | NAME | NAME "(" [expression ("," expression)*] ")"
                | "(" expression ")"

Tree nodes: ``("num", value)``, ``("var", name)``, ``("neg", node)``,
``("bin", op, left, right)`` and ``("call", name, [args])``.
"""

from __future__ import annotations

from typing import Optional

from .errors import ParseError
from .tokens import Token, tokenize


class Parser:
    def __init__(self, text: str):
        self.text = text
        self.tokens = tokenize(text)
        self.pos = 0

    # -- token helpers ------------------------------------------------------
    def peek(self) -> Optional[Token]:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def at_op(self, *ops: str) -> bool:
        tok = self.peek()
        return tok is not None and tok.kind == "op" and tok.value in ops

    def advance(self) -> Token:
        tok = self.peek()
        if tok is None:
            raise ParseError("unexpected end of expression", len(self.text))
        self.pos += 1
        return tok

    def expect(self, op: str) -> Token:
        tok = self.peek()
        if tok is None:
            raise ParseError(f"expected {op!r} but the expression ended", len(self.text))
        if tok.kind != "op" or tok.value != op:
            raise ParseError(f"expected {op!r}, found {tok.value!r}", tok.pos)
        self.pos += 1
        return tok

    # -- grammar rules ------------------------------------------------------
    def parse(self):
        if not self.tokens:
            raise ParseError("empty expression", 0)
        node = self.expression()
        if self.pos < len(self.tokens) - 1:
            tok = self.tokens[self.pos]
            raise ParseError(f"unexpected {tok.value!r}", tok.pos)
        return node

    def expression(self):
        node = self.term()
        while self.at_op("+", "-"):
            op = self.advance().value
            node = ("bin", op, node, self.term())
        return node

    def term(self):
        node = self.unary()
        while self.at_op("*", "/", "//", "%"):
            op = self.advance().value
            node = ("bin", op, node, self.unary())
        return node

    def unary(self):
        if self.at_op("-"):
            self.advance()
            return ("neg", self.unary())
        if self.at_op("+"):
            self.advance()
            return self.unary()
        return self.power()

    def power(self):
        base = self.atom()
        if self.at_op("^"):
            self.advance()
            return ("bin", "^", base, self.unary())
        return base

    def atom(self):
        tok = self.advance()
        if tok.kind == "number":
            return ("num", tok.value)
        if tok.kind == "name":
            if self.at_op("("):
                self.advance()
                args = []
                if not self.at_op(")"):
                    args.append(self.expression())
                    while self.at_op(","):
                        self.advance()
                        args.append(self.expression())
                self.expect(")")
                return ("call", tok.value, args)
            return ("var", tok.value)
        if tok.value == "(":
            node = self.expression()
            self.expect(")")
            return node
        raise ParseError(f"unexpected {tok.value!r}", tok.pos)


def parse(text: str):
    """Parse ``text`` into a syntax tree (see the module docstring)."""
    return Parser(text).parse()
