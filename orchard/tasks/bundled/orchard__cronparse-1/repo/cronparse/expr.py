"""The :class:`CronExpression` type."""

from __future__ import annotations

from datetime import date, datetime, timedelta
from typing import Iterator

from .fields import DAY_OF_MONTH, DAY_OF_WEEK, HOUR, MINUTE, MONTH, CronError, parse_field

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

#: How far ahead :meth:`CronExpression.next_after` searches before giving up
#: (``0 0 30 2 *`` never fires).
SEARCH_YEARS = 8


def _cron_weekday(d: date) -> int:
    """Weekday number as cron counts it: Sunday is 0."""
    return d.isoweekday() % 7


class CronExpression:
    """A parsed cron expression.

    Times are handled as wall-clock times: an aware ``datetime`` keeps its ``tzinfo``
    and no DST adjustment is made.
    """

    def __init__(self, text: str):
        self.text = text
        expanded = MACROS.get(text.strip().lower(), text)
        parts = expanded.split()
        if len(parts) != 5:
            raise CronError(f"expected 5 fields, got {len(parts)}: {text!r}")
        minute, hour, dom, month, dow = parts
        self.minutes = parse_field(minute, MINUTE)
        self.hours = parse_field(hour, HOUR)
        self.days = parse_field(dom, DAY_OF_MONTH)
        self.months = parse_field(month, MONTH)
        self.weekdays = parse_field(dow, DAY_OF_WEEK)

    def __repr__(self) -> str:
        return f"CronExpression({self.text!r})"

    def _day_matches(self, d: date) -> bool:
        return d.day in self.days and _cron_weekday(d) in self.weekdays

    def matches(self, when: datetime) -> bool:
        """True if the expression fires at ``when`` (seconds are ignored)."""
        return (
            when.minute in self.minutes
            and when.hour in self.hours
            and when.month in self.months
            and self._day_matches(when.date())
        )

    def next_after(self, after: datetime) -> datetime:
        """The first time strictly after ``after`` at which the expression fires."""
        t = after.replace(second=0, microsecond=0) + timedelta(minutes=1)
        last_year = after.year + SEARCH_YEARS
        while t.year <= last_year:
            if t.month not in self.months:
                first_of_month = t.replace(day=1, hour=0, minute=0)
                t = (first_of_month + timedelta(days=32)).replace(day=1)
                continue
            if not self._day_matches(t.date()):
                t = (t + timedelta(days=1)).replace(hour=0, minute=0)
                continue
            if t.hour not in self.hours:
                t = (t + timedelta(hours=1)).replace(minute=0)
                continue
            if t.minute not in self.minutes:
                t += timedelta(minutes=1)
                continue
            return t
        raise CronError(f"{self.text!r} does not fire within {SEARCH_YEARS} years of {after}")

    def iter_after(self, after: datetime) -> Iterator[datetime]:
        """Yield the successive firing times after ``after``, forever."""
        t = after
        while True:
            t = self.next_after(t)
            yield t


def next_run(expression: str, after: datetime) -> datetime:
    """Shortcut for ``CronExpression(expression).next_after(after)``."""
    return CronExpression(expression).next_after(after)
