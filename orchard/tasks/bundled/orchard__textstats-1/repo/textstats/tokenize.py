"""Splitting text into words and sentences, and counting syllables."""

from __future__ import annotations

import re

# Letters (any script), optionally joined by apostrophes: "don't", "l'été".
_WORD = re.compile(r"[^\W\d_]+(?:['\u2019][^\W\d_]+)*")
# A sentence runs up to and including its terminal punctuation (and closing quotes).
_SENTENCE = re.compile(r"[^.!?]*[.!?]+[\"'\u201d\u2019)]*")
_VOWEL_GROUP = re.compile(r"[aeiouy]+")


def words(text: str) -> list[str]:
    """The words of ``text``; numbers and punctuation are skipped."""
    return _WORD.findall(text)


def sentences(text: str) -> list[str]:
    """The sentences of ``text``, stripped of surrounding whitespace.

    A sentence ends at ``.``, ``!`` or ``?`` (runs such as ``?!`` or ``...``
    count once).  Pieces without any word in them are dropped.
    """
    found = (piece.strip() for piece in _SENTENCE.findall(text))
    return [s for s in found if words(s)]


def count_syllables(word: str) -> int:
    """Estimate the syllables in an English ``word`` (at least 1).

    Counts groups of vowels, ignoring a silent final ``e`` ("make") but not
    a final ``-le`` after a consonant ("table").
    """
    w = word.lower().replace("\u2019", "'").split("'")[0]
    if not w:
        return 1
    count = len(_VOWEL_GROUP.findall(w))
    if w.endswith("e") and not w.endswith(("le", "ee", "ye")) and count > 1:
        count -= 1
    elif w.endswith("le") and len(w) > 2 and w[-3] in "aeiouy" and count > 1:
        count -= 1
    return max(1, count)
