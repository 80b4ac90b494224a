"""A small integer type that prints as a Roman numeral."""

from __future__ import annotations

from functools import total_ordering

from .convert import from_roman, to_roman


@total_ordering
class Roman:
    """An integer in 1..3999 displayed as a Roman numeral.

    ``Roman`` values can be built from an int or a numeral string, compared with each
    other and with ints, and added or subtracted; results outside the representable
    range raise :class:`~romanum.OutOfRangeError`.
    """

    __slots__ = ("_value",)

    def __init__(self, value: "int | str | Roman"):
        if isinstance(value, Roman):
            value = value._value
        elif isinstance(value, str):
            value = from_roman(value)
        to_roman(value)  # validates type and range
        self._value = value

    def __int__(self) -> int:
        return self._value

    __index__ = __int__

    def __str__(self) -> str:
        return to_roman(self._value)

    def __repr__(self) -> str:
        return f"Roman({str(self)!r})"

    def __hash__(self) -> int:
        return hash(self._value)

    @staticmethod
    def _coerce(other):
        if isinstance(other, Roman):
            return other._value
        if isinstance(other, int) and not isinstance(other, bool):
            return other
        return NotImplemented

    def __eq__(self, other) -> bool:
        o = self._coerce(other)
        return NotImplemented if o is NotImplemented else self._value == o

    def __lt__(self, other) -> bool:
        o = self._coerce(other)
        return NotImplemented if o is NotImplemented else self._value < o

    def __add__(self, other) -> "Roman":
        o = self._coerce(other)
        return NotImplemented if o is NotImplemented else Roman(self._value + o)

    __radd__ = __add__

    def __sub__(self, other) -> "Roman":
        o = self._coerce(other)
        return NotImplemented if o is NotImplemented else Roman(self._value - o)

    def __rsub__(self, other) -> "Roman":
        o = self._coerce(other)
        return NotImplemented if o is NotImplemented else Roman(o - self._value)
