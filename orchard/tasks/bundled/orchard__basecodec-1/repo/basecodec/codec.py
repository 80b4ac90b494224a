"""The :class:`Codec` type."""

from __future__ import annotations


class Codec:
    """Converts between non-negative integers and strings over ``alphabet``.

    The base is ``len(alphabet)``; the first character is the zero digit.
    With ``case_insensitive=True`` decoding folds case (the alphabet itself
    must then not contain two characters that differ only in case).

    >>> Codec("01").encode(5)
    '101'
    """

    def __init__(self, alphabet: str, *, case_insensitive: bool = False):
        if len(alphabet) < 2:
            raise ValueError("an alphabet needs at least two characters")
        folded = alphabet.lower() if case_insensitive else alphabet
        if len(set(folded)) != len(alphabet):
            raise ValueError("alphabet characters must be unique")
        self.alphabet = alphabet
        self.base = len(alphabet)
        self.case_insensitive = case_insensitive
        self._index = {ch: i for i, ch in enumerate(folded)}

    def __repr__(self) -> str:
        return f"Codec({self.alphabet!r})"

    def _digit(self, ch: str, position: int) -> int:
        key = ch.lower() if self.case_insensitive else ch
        try:
            return self._index[key]
        except KeyError:
            raise ValueError(
                f"invalid character {ch!r} at position {position} for base {self.base}"
            ) from None

    def encode(self, number: int, min_length: int = 1) -> str:
        """``number`` in this base, left-padded with the zero digit to ``min_length``."""
        if isinstance(number, bool) or not isinstance(number, int):
            raise TypeError("only integers can be encoded")
        if number < 0:
            raise ValueError("cannot encode a negative number")
        digits = []
        while number:
            number, rem = divmod(number, self.base)
            digits.append(self.alphabet[rem])
        encoded = "".join(reversed(digits))
        return encoded.rjust(max(min_length, 1), self.alphabet[0])

    def decode(self, text: str) -> int:
        """The integer written as ``text`` in this base."""
        if not text:
            raise ValueError("cannot decode an empty string")
        number = 0
        for position, ch in enumerate(text):
            number = number * self.base + self._digit(ch, position)
        return number

    def is_valid(self, text: str) -> bool:
        """True if ``text`` is a non-empty string of alphabet characters."""
        try:
            self.decode(text)
        except ValueError:
            return False
        return True

    def max_value(self, length: int) -> int:
        """The largest number that fits in ``length`` characters."""
        return self.base ** length - 1
