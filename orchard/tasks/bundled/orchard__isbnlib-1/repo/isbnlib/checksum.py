"""Check digits.

ISBN-10: the digits are weighted 10, 9, ..., 2 (and the check digit 1); the weighted sum is
a multiple of 11. A check value of 10 is written ``X``.

ISBN-13 (EAN-13): the digits are weighted 1, 3, 1, 3, ...; the weighted sum including the
check digit is a multiple of 10.
"""

from __future__ import annotations


def _digits(body: str, length: int) -> list[int]:
    if len(body) != length or not body.isascii() or not body.isdigit():
        raise ValueError(f"expected {length} digits, got {body!r}")
    return [int(c) for c in body]


def isbn10_check_digit(body: str) -> str:
    """The check character (``0``-``9`` or ``X``) for the first 9 digits of an ISBN-10."""
    digits = _digits(body, 9)
    total = sum(weight * d for weight, d in zip(range(10, 1, -1), digits))
    check = (11 - total % 11) % 11
    return "X" if check == 10 else str(check)


def isbn13_check_digit(body: str) -> str:
    """The check digit for the first 12 digits of an ISBN-13."""
    digits = _digits(body, 12)
    total = sum(d * (3 if i % 2 else 1) for i, d in enumerate(digits))
    return str(10 - total % 10)
