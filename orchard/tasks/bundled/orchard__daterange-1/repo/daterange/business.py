"""Business-day helpers (Monday to Friday, minus optional holidays)."""

from __future__ import annotations

from datetime import date, timedelta
from typing import Collection

from .range import DateRange

WEEKEND = (5, 6)  # date.weekday(): Saturday, Sunday


def is_business_day(d: date, holidays: Collection[date] = ()) -> bool:
    """True for Monday-Friday dates that are not in ``holidays``."""
    return d.weekday() not in WEEKEND and d not in holidays


def business_days(r: DateRange, holidays: Collection[date] = ()) -> list[date]:
    """The business days inside the (inclusive) range ``r``."""
    return [d for d in r if is_business_day(d, holidays)]


def add_business_days(d: date, n: int, holidays: Collection[date] = ()) -> date:
    """The date ``n`` business days after ``d`` (before it if ``n`` is negative).

    ``d`` itself does not need to be a business day; with ``n == 0`` it is
    returned unchanged.
    """
    step = timedelta(days=1 if n >= 0 else -1)
    remaining = abs(n)
    current = d
    while remaining:
        current += step
        if is_business_day(current, holidays):
            remaining -= 1
    return current
