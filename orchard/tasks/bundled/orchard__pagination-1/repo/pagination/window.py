"""Which page numbers to show in a pager widget."""

from __future__ import annotations

from typing import Optional


def page_window(current: int, total: int, size: int = 5) -> list[int]:
    """A run of ``size`` consecutive page numbers (fewer if there are fewer pages) that
    contains ``current``, centred on it where the edges allow."""
    if size < 1:
        raise ValueError("size must be at least 1")
    if total < 1:
        return []
    if not 1 <= current <= total:
        raise ValueError(f"page {current} is not between 1 and {total}")
    size = min(size, total)
    start = current - (size - 1) // 2
    start = max(1, min(start, total - size + 1))
    return list(range(start, start + size))


def page_links(current: int, total: int, size: int = 5, edges: int = 1
               ) -> list[Optional[int]]:
    """:func:`page_window` plus the first and last ``edges`` pages, with ``None`` where
    pages are skipped. A gap of a single page shows that page instead of ``None``."""
    shown = set(page_window(current, total, size))
    shown.update(range(1, min(edges, total) + 1))
    shown.update(range(max(1, total - edges + 1), total + 1))
    links: list[Optional[int]] = []
    previous = 0
    for number in sorted(shown):
        if number - previous == 2:
            links.append(number - 1)
        elif number - previous > 2:
            links.append(None)
        links.append(number)
        previous = number
    return links


def render_links(current: int, total: int, **options) -> str:
    """:func:`page_links` as text: ``1 … 4 [5] 6 … 10``."""
    parts = []
    for number in page_links(current, total, **options):
        if number is None:
            parts.append("\u2026")
        elif number == current:
            parts.append(f"[{number}]")
        else:
            parts.append(str(number))
    return " ".join(parts)
