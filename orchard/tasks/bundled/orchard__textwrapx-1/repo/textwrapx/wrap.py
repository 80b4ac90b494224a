"""Greedy line breaking."""

from __future__ import annotations


def split_long_word(word: str, width: int, hyphen: str = "") -> list[str]:
    """Split ``word`` into pieces of at most ``width`` characters.

    Every piece but the last ends with ``hyphen`` (counted in the width), e.g.
    ``split_long_word("abcdefgh", 4, "-") == ["abc-", "def-", "gh"]``.
    """
    if len(word) <= width:
        return [word]
    step = width - len(hyphen)
    if step < 1:
        raise ValueError(f"width {width} leaves no room for text next to {hyphen!r}")
    pieces = [word[i:i + step] for i in range(0, len(word), step)]
    return [p + hyphen for p in pieces[:-1]] + [pieces[-1]]


def wrap(text: str, width: int = 70, *, break_long_words: bool = True,
         hyphen: str = "") -> list[str]:
    """Wrap ``text`` into lines of at most ``width`` characters.

    Runs of whitespace (including newlines) separate words and collapse to one space. Words
    longer than ``width`` are split with :func:`split_long_word` when ``break_long_words`` is
    true; otherwise they are put on a line of their own, which is then longer than ``width``.
    Returns an empty list for blank text.
    """
    if width < 1:
        raise ValueError(f"width must be at least 1, got {width}")
    lines: list[str] = []
    current: list[str] = []
    length = 0
    for word in text.split():
        pieces = split_long_word(word, width, hyphen) if break_long_words else [word]
        for piece in pieces:
            room = width - length - 1  # what is left after the separating space
            if current and len(piece) >= room:
                lines.append(" ".join(current))
                current, length = [], 0
            length += len(piece) + (1 if current else 0)
            current.append(piece)
    if current:
        lines.append(" ".join(current))
    return lines


def fill(text: str, width: int = 70, *, indent: str = "", **options) -> str:
    """:func:`wrap` ``text`` and join the lines with newlines, each prefixed with ``indent``.

    The indent counts toward ``width``.
    """
    lines = wrap(text, width - len(indent), **options)
    return "\n".join(indent + line for line in lines)


def shorten(text: str, width: int, placeholder: str = " [...]") -> str:
    """Collapse whitespace in ``text`` and cut it on a word boundary to fit ``width``.

    When words have to be dropped, ``placeholder`` is appended (and counted in the width).
    """
    words = text.split()
    collapsed = " ".join(words)
    if len(collapsed) <= width:
        return collapsed
    if len(placeholder.lstrip()) > width:
        raise ValueError("placeholder too large for max width")
    kept = ""
    for word in words:
        candidate = f"{kept} {word}" if kept else word
        if len(candidate) + len(placeholder) > width:
            break
        kept = candidate
    return kept + placeholder if kept else placeholder.lstrip()
