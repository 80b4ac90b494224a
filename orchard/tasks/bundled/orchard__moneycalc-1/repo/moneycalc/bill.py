"""Splitting a restaurant bill between people."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal

from .currency import Currency, get_currency
from .money import Money, Number


@dataclass
class _Item:
    name: str
    price: Money
    shared_by: tuple[str, ...]


@dataclass
class Bill:
    """A bill with items that are either personal or shared by several people.

    ``tax_percent`` is applied to the subtotal and ``tip_percent`` to the subtotal
    before tax; both are charged to each person in proportion to what they ordered.
    """

    people: list[str]
    currency: str | Currency = "USD"
    tax_percent: Number = 0
    tip_percent: Number = 0
    items: list[_Item] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.currency = get_currency(self.currency)
        if len(set(self.people)) != len(self.people) or not self.people:
            raise ValueError("people must be a non-empty list of distinct names")

    def add(self, name: str, price: Number, *shared_by: str) -> None:
        """Add an item; without ``shared_by`` it is shared by everybody."""
        who = tuple(shared_by) or tuple(self.people)
        unknown = [p for p in who if p not in self.people]
        if unknown:
            raise ValueError(f"unknown people: {', '.join(unknown)}")
        self.items.append(_Item(name, Money(price, self.currency), who))

    @property
    def subtotal(self) -> Money:
        return sum((i.price for i in self.items), Money(0, self.currency))

    @property
    def tax(self) -> Money:
        return self.subtotal.percent(self.tax_percent)

    @property
    def tip(self) -> Money:
        return self.subtotal.percent(self.tip_percent)

    @property
    def total(self) -> Money:
        return self.subtotal + self.tax + self.tip

    def shares(self) -> dict[str, Money]:
        """What each person owes; the shares always add up to :attr:`total`."""
        ordered = {p: Money(0, self.currency) for p in self.people}
        for item in self.items:
            for person, part in zip(item.shared_by, item.price.split(len(item.shared_by))):
                ordered[person] += part
        weights = [ordered[p].amount for p in self.people]
        if not any(weights):
            return dict(ordered)
        extras = (self.tax + self.tip).allocate([w if w > 0 else Decimal(0) for w in weights])
        return {p: ordered[p] + extra for p, extra in zip(self.people, extras)}
