"""Text normalisation helpers used by :func:`slugkit.slugify`."""

from __future__ import annotations

import re
import unicodedata

# Letters that do not decompose into ASCII base letter + combining mark.
_SPECIAL = str.maketrans(
    {
        "ß": "ss",
        "Æ": "AE",
        "æ": "ae",
        "Ø": "O",
        "ø": "o",
        "Œ": "OE",
        "œ": "oe",
        "Ł": "L",
        "ł": "l",
        "Đ": "D",
        "đ": "d",
        "Þ": "Th",
        "þ": "th",
        "ð": "d",
        "\u2018": "'",  # left single quotation mark
        "\u2019": "'",  # right single quotation mark / apostrophe
        "\u2013": "-",  # en dash
        "\u2014": "-",  # em dash
    }
)

_WHITESPACE_RE = re.compile(r"\s+")


def fold(text: str) -> str:
    """Transliterate ``text`` to plain ASCII.

    Accented letters lose their accents (``é`` -> ``e``), compatibility characters are
    expanded (``ﬁ`` -> ``fi``, ``²`` -> ``2``) and a few special letters are spelled out
    (``ß`` -> ``ss``).  Characters with no ASCII equivalent are dropped.
    """
    text = text.translate(_SPECIAL)
    decomposed = unicodedata.normalize("NFKD", text)
    stripped = "".join(ch for ch in decomposed if not unicodedata.combining(ch))
    return stripped.encode("ascii", "ignore").decode("ascii")


def normalize_whitespace(text: str) -> str:
    """Collapse runs of whitespace (including newlines and NBSP) to single spaces."""
    return _WHITESPACE_RE.sub(" ", text).strip()
