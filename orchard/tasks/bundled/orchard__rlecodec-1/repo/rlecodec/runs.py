"""Runs of equal items in any sequence."""

from __future__ import annotations

from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")


def iter_runs(items: Iterable[T]) -> Iterator[tuple[T, int]]:
    """Yield ``(item, count)`` for each run of equal consecutive items.

    >>> list(iter_runs("aaab"))
    [('a', 3), ('b', 1)]
    """
    iterator = iter(items)
    try:
        current = next(iterator)
    except StopIteration:
        return
    count = 1
    for item in iterator:
        if item == current:
            count += 1
        else:
            yield current, count
            current, count = item, 1
    yield current, count


def expand(runs: Iterable[tuple[T, int]]) -> Iterator[T]:
    """The items of ``runs`` one by one; the inverse of :func:`iter_runs`."""
    for item, count in runs:
        if count < 0:
            raise ValueError(f"negative run length {count}")
        for _ in range(count):
            yield item
