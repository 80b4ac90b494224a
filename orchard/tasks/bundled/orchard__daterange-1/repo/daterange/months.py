"""Calendar-month arithmetic on :class:`datetime.date`."""

from __future__ import annotations

import calendar
from datetime import date, timedelta


def first_of_month(d: date) -> date:
    """The first day of ``d``'s month."""
    return d.replace(day=1)


def first_of_next_month(d: date) -> date:
    """The first day of the month after ``d``'s month.

    >>> first_of_next_month(date(2023, 12, 15))
    datetime.date(2024, 1, 1)
    """
    year = d.year + (d.month + 1) // 12
    month = d.month % 12 + 1
    return date(year, month, 1)


def last_day_of_month(d: date) -> date:
    """The last day of ``d``'s month."""
    return first_of_next_month(d) - timedelta(days=1)


def add_months(d: date, months: int) -> date:
    """``d`` shifted by ``months`` calendar months (may be negative).

    The day is clamped to the length of the target month, so
    ``add_months(date(2024, 1, 31), 1)`` is 29 February 2024.
    """
    index = d.year * 12 + (d.month - 1) + months
    year, month0 = divmod(index, 12)
    month = month0 + 1
    day = min(d.day, calendar.monthrange(year, month)[1])
    return date(year, month, day)
