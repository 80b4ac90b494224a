"""Validating and converting ISBNs."""

from __future__ import annotations

import re

from isbnlib.checksum import isbn10_check_digit, isbn13_check_digit

_SEPARATORS = re.compile(r"[\s-]+")


class InvalidISBN(ValueError):
    """Not a valid ISBN."""


def clean(isbn: str) -> str:
    """``isbn`` without separators (hyphens, spaces), with a lower-case ``x`` upper-cased.

    An ``ISBN`` / ``ISBN-13:`` style label in front is removed too.
    """
    text = isbn.strip()
    label = re.match(r"ISBN(?:-1[03])?:?\s*", text, re.IGNORECASE)
    if label:
        text = text[label.end():]
    return _SEPARATORS.sub("", text).upper()


def is_isbn10(isbn: str) -> bool:
    """Whether ``isbn`` is a valid ISBN-10 (separators allowed)."""
    code = clean(isbn)
    if len(code) != 10 or not code[:9].isdigit() or not code[:9].isascii():
        return False
    return isbn10_check_digit(code[:9]) == code[9]


def is_isbn13(isbn: str) -> bool:
    """Whether ``isbn`` is a valid ISBN-13 (prefix 978 or 979, separators allowed)."""
    code = clean(isbn)
    if len(code) != 13 or not code.isdigit() or not code.isascii():
        return False
    if code[:3] not in ("978", "979"):
        return False
    return isbn13_check_digit(code[:12]) == code[12]


def is_valid(isbn: str) -> bool:
    """Whether ``isbn`` is a valid ISBN-10 or ISBN-13."""
    return is_isbn10(isbn) or is_isbn13(isbn)


def to_isbn13(isbn: str) -> str:
    """The ISBN-13 for a valid ISBN-10 or ISBN-13 (returned cleaned)."""
    code = clean(isbn)
    if is_isbn13(code):
        return code
    if not is_isbn10(code):
        raise InvalidISBN(f"not a valid ISBN: {isbn!r}")
    body = "978" + code[:9]
    return body + isbn13_check_digit(body)


def to_isbn10(isbn: str) -> str:
    """The ISBN-10 for a valid ISBN-10 or a ``978`` ISBN-13.

    ``979`` ISBN-13s have no ISBN-10 and raise :class:`InvalidISBN`.
    """
    code = clean(isbn)
    if is_isbn10(code):
        return code
    if not is_isbn13(code):
        raise InvalidISBN(f"not a valid ISBN: {isbn!r}")
    if not code.startswith("978"):
        raise InvalidISBN(f"{isbn!r} has no ISBN-10 form (prefix {code[:3]})")
    body = code[3:12]
    return body + isbn10_check_digit(body)


def canonical(isbn: str) -> str:
    """The cleaned ISBN-13 form of any valid ISBN, for use as a lookup key."""
    return to_isbn13(isbn)
