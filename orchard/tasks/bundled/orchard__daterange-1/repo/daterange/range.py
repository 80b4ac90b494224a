"""The :class:`DateRange` type."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta
from typing import Iterator, Optional

from .months import first_of_next_month, last_day_of_month


@dataclass(frozen=True)
class DateRange:
    """All dates from ``start`` to ``end``, both included.

    >>> r = DateRange(date(2024, 1, 30), date(2024, 2, 2))
    >>> len(r)
    4
    """

    start: date
    end: date

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise ValueError(f"end {self.end} is before start {self.start}")

    @classmethod
    def for_month(cls, year: int, month: int) -> "DateRange":
        """The whole calendar month ``year``-``month``."""
        first = date(year, month, 1)
        return cls(first, last_day_of_month(first))

    @classmethod
    def for_year(cls, year: int) -> "DateRange":
        return cls(date(year, 1, 1), date(year, 12, 31))

    def __len__(self) -> int:
        return (self.end - self.start).days + 1

    def __contains__(self, d: object) -> bool:
        return isinstance(d, date) and self.start <= d <= self.end

    def __iter__(self) -> Iterator[date]:
        return self.days()

    def days(self, step: int = 1) -> Iterator[date]:
        """Every ``step``-th day from ``start`` up to and including ``end``."""
        if step < 1:
            raise ValueError("step must be positive")
        current = self.start
        delta = timedelta(days=step)
        while current <= self.end:
            yield current
            current += delta

    def split_by_month(self) -> list["DateRange"]:
        """Split into consecutive pieces that each lie within one calendar month.

        The first and last pieces may be partial months.
        """
        pieces = []
        current = self.start
        while current <= self.end:
            piece_end = min(last_day_of_month(current), self.end)
            pieces.append(DateRange(current, piece_end))
            current = first_of_next_month(current)
        return pieces

    def intersection(self, other: "DateRange") -> Optional["DateRange"]:
        """The overlap of two ranges, or ``None`` if they are disjoint."""
        start = max(self.start, other.start)
        end = min(self.end, other.end)
        if end < start:
            return None
        return DateRange(start, end)

    def overlaps(self, other: "DateRange") -> bool:
        return self.intersection(other) is not None

    def __str__(self) -> str:
        return f"{self.start.isoformat()}..{self.end.isoformat()}"
