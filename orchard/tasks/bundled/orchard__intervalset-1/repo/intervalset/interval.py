"""A single half-open interval ``[start, end)``."""

from __future__ import annotations

from typing import NamedTuple, Union

Number = Union[int, float]


class Interval(NamedTuple):
    """The half-open interval ``[start, end)``; ``start == end`` is the empty interval."""

    start: Number
    end: Number

    @classmethod
    def of(cls, value: "Interval | tuple[Number, Number]") -> "Interval":
        """Coerce a ``(start, end)`` pair, checking that ``start <= end``."""
        start, end = value
        if start > end:
            raise ValueError(f"interval start {start!r} is after its end {end!r}")
        return cls(start, end)

    @property
    def length(self) -> Number:
        return self.end - self.start

    @property
    def is_empty(self) -> bool:
        return self.start == self.end

    def contains_point(self, x: Number) -> bool:
        return self.start <= x < self.end

    def contains(self, other: "Interval") -> bool:
        """True if ``other`` lies entirely inside this interval."""
        if other.is_empty:
            return True
        return self.start <= other.start and other.end <= self.end

    def overlaps(self, other: "Interval") -> bool:
        """True if the two intervals share at least one point."""
        return self.start < other.end and other.start < self.end

    def intersection(self, other: "Interval") -> "Interval | None":
        start, end = max(self.start, other.start), min(self.end, other.end)
        if start >= end:
            return None
        return Interval(start, end)

    def __repr__(self) -> str:
        return f"Interval({self.start!r}, {self.end!r})"
