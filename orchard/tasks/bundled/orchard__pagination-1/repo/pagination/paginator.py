"""Splitting a sequence into numbered pages (numbers start at 1)."""

from __future__ import annotations

from typing import Any, Sequence


class InvalidPage(ValueError):
    """The requested page does not exist."""


class PageNotAnInteger(InvalidPage):
    """The page number is not an integer."""


class EmptyPage(InvalidPage):
    """The page number is out of range."""


class Paginator:
    """Pages of ``per_page`` items over a sequence.

    If the last page would hold ``orphans`` items or fewer, they are added to the previous
    page instead, so ``Paginator(range(23), 10, orphans=3)`` has two pages of 10 and 13.
    With ``allow_empty_first_page`` (the default) an empty sequence has one empty page;
    otherwise it has none.
    """

    def __init__(self, items: Sequence[Any], per_page: int, orphans: int = 0,
                 allow_empty_first_page: bool = True):
        if per_page < 1:
            raise ValueError("per_page must be at least 1")
        if orphans < 0:
            raise ValueError("orphans cannot be negative")
        self.items = items
        self.per_page = per_page
        self.orphans = orphans
        self.allow_empty_first_page = allow_empty_first_page

    @property
    def count(self) -> int:
        return len(self.items)

    @property
    def num_pages(self) -> int:
        """The number of pages."""
        if self.count == 0:
            return 1 if self.allow_empty_first_page else 0
        pages = -(-self.count // self.per_page)
        remainder = self.count % self.per_page
        if self.orphans and pages > 1 and remainder <= self.orphans:
            pages -= 1  # the short last page is folded into the previous one
        return pages

    @property
    def page_range(self) -> range:
        return range(1, self.num_pages + 1)

    def validate_number(self, number: Any) -> int:
        """``number`` as an int, or :class:`PageNotAnInteger` / :class:`EmptyPage`."""
        if isinstance(number, float) and not number.is_integer():
            raise PageNotAnInteger(f"page number {number!r} is not an integer")
        try:
            number = int(number)
        except (TypeError, ValueError):
            raise PageNotAnInteger(f"page number {number!r} is not an integer") from None
        if number < 1:
            raise EmptyPage(f"page {number} is less than 1")
        if number > self.num_pages:
            if number == 1 and self.allow_empty_first_page:
                return number
            raise EmptyPage(f"page {number} is past the last page ({self.num_pages})")
        return number

    def page(self, number: Any) -> Page:
        """The page ``number``; raises :class:`InvalidPage` if there is none."""
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        top = bottom + self.per_page
        if number == self.num_pages:
            top = self.count  # the last page takes the orphans, if any
        return Page(self.items[bottom:top], number, self)

    def get_page(self, number: Any) -> Page:
        """Like :meth:`page`, but forgiving: a bad number gives the first page, one past
        the end the last page."""
        try:
            return self.page(number)
        except PageNotAnInteger:
            return self.page(1)
        except EmptyPage:
            return self.page(max(1, self.num_pages))


class Page:
    """One page: its ``items``, ``number`` and the :class:`Paginator` it belongs to."""

    def __init__(self, items: Sequence[Any], number: int, paginator: Paginator):
        self.items = items
        self.number = number
        self.paginator = paginator

    def __repr__(self) -> str:
        return f"<Page {self.number} of {self.paginator.num_pages}>"

    def __len__(self) -> int:
        return len(self.items)

    def has_next(self) -> bool:
        return self.number < self.paginator.num_pages

    def has_previous(self) -> bool:
        return self.number > 1

    def next_page_number(self) -> int:
        return self.paginator.validate_number(self.number + 1)

    def previous_page_number(self) -> int:
        return self.paginator.validate_number(self.number - 1)

    def start_index(self) -> int:
        """1-based index of the first item on this page (0 for an empty page)."""
        if self.paginator.count == 0:
            return 0
        return (self.number - 1) * self.paginator.per_page + 1

    def end_index(self) -> int:
        """1-based index of the last item on this page."""
        if self.number == self.paginator.num_pages:
            return self.paginator.count
        return self.number * self.paginator.per_page
