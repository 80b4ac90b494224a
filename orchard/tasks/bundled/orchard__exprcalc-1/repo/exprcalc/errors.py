"""Exception types."""

from __future__ import annotations


class CalcError(Exception):
    """Base class for every exprcalc error."""


class ParseError(CalcError):
    """The text is not a valid expression; ``position`` is the 0-based column."""

    def __init__(self, message: str, position: int):
        super().__init__(f"{message} at position {position}")
        self.position = position


class EvalError(CalcError):
    """The expression is valid but cannot be evaluated (unknown name, x/0, ...)."""
