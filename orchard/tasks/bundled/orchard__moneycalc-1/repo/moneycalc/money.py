"""The :class:`Money` value type."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from functools import total_ordering
from typing import Sequence, Union

from .currency import Currency, get_currency

Number = Union[int, str, Decimal]


class CurrencyMismatchError(ValueError):
    """Arithmetic between amounts in different currencies."""


def _to_decimal(value: Number | float) -> Decimal:
    if isinstance(value, Decimal):
        return value
    if isinstance(value, bool):
        raise TypeError("booleans are not amounts")
    if isinstance(value, float):
        value = repr(value)  # 0.1 -> "0.1", not 0.1000000000000000055...
    try:
        return Decimal(value)
    except (InvalidOperation, TypeError):
        raise ValueError(f"not a number: {value!r}") from None


def _quantize(amount: Decimal, currency: Currency) -> Decimal:
    """Round ``amount`` half-up to the minor unit of ``currency``."""
    return round(amount, currency.minor_units)


@total_ordering
class Money:
    """An immutable amount of money in one currency.

    The amount is rounded half-up to the currency's minor unit on construction, so every
    arithmetic result is itself rounded: ``Money("10.00") / 3 == Money("3.33")``.
    """

    __slots__ = ("amount", "currency")

    def __init__(self, amount: Number | float, currency: str | Currency = "USD"):
        cur = get_currency(currency)
        object.__setattr__(self, "currency", cur)
        object.__setattr__(self, "amount", _quantize(_to_decimal(amount), cur))

    def __setattr__(self, name, value):
        raise AttributeError("Money is immutable")

    @classmethod
    def from_minor(cls, units: int, currency: str | Currency = "USD") -> "Money":
        """Build from an integer number of minor units (cents)."""
        cur = get_currency(currency)
        return cls(Decimal(units).scaleb(cur.exponent), cur)

    @property
    def minor_units(self) -> int:
        return int(self.amount.scaleb(self.currency.minor_units))

    # -- display ---------------------------------------------------------------
    def __repr__(self) -> str:
        return f"Money('{self.amount}', '{self.currency.code}')"

    def __str__(self) -> str:
        return f"{self.currency.code} {self.amount:,}"

    def format(self) -> str:
        sign = "-" if self.amount < 0 else ""
        return f"{sign}{self.currency.symbol}{abs(self.amount):,}"

    # -- comparison --------------------------------------------------------------
    def _check(self, other: "Money") -> None:
        if other.currency != self.currency:
            raise CurrencyMismatchError(
                f"cannot combine {self.currency.code} and {other.currency.code}"
            )

    def __eq__(self, other) -> bool:
        if not isinstance(other, Money):
            return NotImplemented
        return self.currency == other.currency and self.amount == other.amount

    def __hash__(self) -> int:
        return hash((self.amount, self.currency.code))

    def __lt__(self, other: "Money") -> bool:
        if not isinstance(other, Money):
            return NotImplemented
        self._check(other)
        return self.amount < other.amount

    def __bool__(self) -> bool:
        return bool(self.amount)

    # -- arithmetic ----------------------------------------------------------------
    def __add__(self, other: "Money") -> "Money":
        if not isinstance(other, Money):
            return NotImplemented
        self._check(other)
        return Money(self.amount + other.amount, self.currency)

    def __radd__(self, other):
        if other == 0:  # lets sum() work without a start value
            return self
        return NotImplemented

    def __sub__(self, other: "Money") -> "Money":
        if not isinstance(other, Money):
            return NotImplemented
        self._check(other)
        return Money(self.amount - other.amount, self.currency)

    def __neg__(self) -> "Money":
        return Money(-self.amount, self.currency)

    def __abs__(self) -> "Money":
        return Money(abs(self.amount), self.currency)

    def __mul__(self, factor: Number | float) -> "Money":
        if isinstance(factor, Money):
            return NotImplemented
        return Money(self.amount * _to_decimal(factor), self.currency)

    __rmul__ = __mul__

    def __truediv__(self, divisor: Number | float) -> "Money":
        if isinstance(divisor, Money):
            return NotImplemented
        return Money(self.amount / _to_decimal(divisor), self.currency)

    def percent(self, rate: Number | float) -> "Money":
        """``rate`` percent of this amount, e.g. ``Money("80").percent(12.5)``."""
        return Money(self.amount * _to_decimal(rate) / 100, self.currency)

    # -- division without loss -------------------------------------------------------
    def allocate(self, ratios: Sequence[Number | float]) -> list["Money"]:
        """Split into parts proportional to ``ratios`` that add up exactly to ``self``.

        Leftover minor units go one each to the first parts.
        """
        weights = [_to_decimal(r) for r in ratios]
        if not weights or any(w < 0 for w in weights) or sum(weights) == 0:
            raise ValueError("ratios must be non-negative and not all zero")
        total = self.minor_units
        sign = -1 if total < 0 else 1
        total = abs(total)
        whole = sum(weights)
        shares = [int(total * w // whole) for w in weights]
        for i in range(total - sum(shares)):
            shares[i % len(shares)] += 1
        return [Money.from_minor(sign * s, self.currency) for s in shares]

    def split(self, parts: int) -> list["Money"]:
        """Split into ``parts`` nearly equal amounts that add up exactly to ``self``."""
        if parts < 1:
            raise ValueError("parts must be at least 1")
        return self.allocate([1] * parts)
