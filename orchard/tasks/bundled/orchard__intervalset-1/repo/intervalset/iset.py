"""The :class:`IntervalSet` container."""

from __future__ import annotations

from bisect import bisect_right
from typing import Iterable, Iterator

from .interval import Interval, Number

IntervalLike = "Interval | tuple[Number, Number]"


def _normalize(intervals: Iterable[Interval]) -> list[Interval]:
    """Sort ``intervals`` and coalesce those that overlap or touch.

    Empty intervals are dropped.  The result is the canonical form used by
    :class:`IntervalSet`: sorted, pairwise disjoint, and never adjacent.
    """
    merged: list[Interval] = []
    for iv in sorted(intervals):
        if iv.is_empty:
            continue
        if merged and iv.start < merged[-1].end:
            last = merged[-1]
            merged[-1] = Interval(last.start, max(last.end, iv.end))
        else:
            merged.append(iv)
    return merged


class IntervalSet:
    """An immutable set of numbers described as a union of half-open intervals."""

    __slots__ = ("_intervals", "_starts")

    def __init__(self, intervals: Iterable = ()):
        self._intervals = _normalize(Interval.of(iv) for iv in intervals)
        self._starts = [iv.start for iv in self._intervals]

    @classmethod
    def _from_normalized(cls, intervals: list[Interval]) -> "IntervalSet":
        obj = cls.__new__(cls)
        obj._intervals = intervals
        obj._starts = [iv.start for iv in intervals]
        return obj

    # -- container protocol ----------------------------------------------------
    def __iter__(self) -> Iterator[Interval]:
        return iter(self._intervals)

    def __len__(self) -> int:
        """The number of disjoint intervals."""
        return len(self._intervals)

    def __bool__(self) -> bool:
        return bool(self._intervals)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, IntervalSet):
            return NotImplemented
        return self._intervals == other._intervals

    def __hash__(self) -> int:
        return hash(tuple(self._intervals))

    def __repr__(self) -> str:
        inner = ", ".join(f"({iv.start!r}, {iv.end!r})" for iv in self._intervals)
        return f"IntervalSet([{inner}])"

    def __contains__(self, item) -> bool:
        """Membership of a point, or containment of a whole interval."""
        if isinstance(item, tuple):
            target = Interval.of(item)
            if target.is_empty:
                return True
            i = bisect_right(self._starts, target.start) - 1
            return i >= 0 and self._intervals[i].contains(target)
        i = bisect_right(self._starts, item) - 1
        return i >= 0 and self._intervals[i].contains_point(item)

    # -- measures ----------------------------------------------------------------
    @property
    def total_length(self) -> Number:
        return sum(iv.length for iv in self._intervals)

    @property
    def bounds(self) -> Interval | None:
        """The smallest interval covering the whole set, or None if it is empty."""
        if not self._intervals:
            return None
        return Interval(self._intervals[0].start, self._intervals[-1].end)

    # -- set algebra ---------------------------------------------------------------
    def add(self, interval) -> "IntervalSet":
        return self.union(IntervalSet([interval]))

    def remove(self, interval) -> "IntervalSet":
        return self.difference(IntervalSet([interval]))

    def union(self, other: "IntervalSet") -> "IntervalSet":
        return self._from_normalized(_normalize([*self._intervals, *other._intervals]))

    def intersection(self, other: "IntervalSet") -> "IntervalSet":
        out: list[Interval] = []
        a, b = self._intervals, other._intervals
        i = j = 0
        while i < len(a) and j < len(b):
            common = a[i].intersection(b[j])
            if common is not None:
                out.append(common)
            if a[i].end < b[j].end:
                i += 1
            else:
                j += 1
        return self._from_normalized(out)

    def difference(self, other: "IntervalSet") -> "IntervalSet":
        out: list[Interval] = []
        cuts = other._intervals
        for iv in self._intervals:
            start = iv.start
            for cut in cuts:
                if cut.end <= start or cut.start >= iv.end:
                    continue
                if cut.start > start:
                    out.append(Interval(start, cut.start))
                start = max(start, cut.end)
                if start >= iv.end:
                    break
            if start < iv.end:
                out.append(Interval(start, iv.end))
        return self._from_normalized(out)

    __or__ = union
    __and__ = intersection
    __sub__ = difference

    def gaps(self, within=None) -> Iterator[Interval]:
        """Yield the uncovered intervals between the members of the set.

        With ``within=(lo, hi)`` the gaps before the first and after the last member,
        clipped to ``[lo, hi)``, are included too (and gaps are clipped to it).
        """
        ivs = self._intervals
        if within is None:
            for left, right in zip(ivs, ivs[1:]):
                yield Interval(left.end, right.start)
            return
        window = IntervalSet([within])
        yield from window.difference(self)
