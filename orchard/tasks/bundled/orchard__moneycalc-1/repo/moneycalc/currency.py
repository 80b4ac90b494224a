"""Currency metadata (ISO 4217 subset)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Currency:
    code: str
    minor_units: int
    symbol: str

    @property
    def exponent(self) -> int:
        """The power of ten of the smallest unit (``-2`` for cents)."""
        return -self.minor_units


CURRENCIES: dict[str, Currency] = {
    c.code: c
    for c in (
        Currency("USD", 2, "$"),
        Currency("EUR", 2, "€"),
        Currency("GBP", 2, "£"),
        Currency("CHF", 2, "CHF "),
        Currency("JPY", 0, "¥"),
        Currency("KRW", 0, "₩"),
        Currency("KWD", 3, "KD "),
    )
}


def get_currency(code: str | Currency) -> Currency:
    if isinstance(code, Currency):
        return code
    try:
        return CURRENCIES[code.upper()]
    except KeyError:
        raise ValueError(f"unknown currency {code!r}") from None
