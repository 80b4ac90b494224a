"""Full justification: pad the gaps between words so lines are exactly ``width`` wide."""

from __future__ import annotations

from textwrapx.wrap import wrap


def justify_line(line: str, width: int) -> str:
    """Spread the words of ``line`` over exactly ``width`` characters.

    Extra spaces go to the leftmost gaps first. A single word (or a line already at least
    ``width`` long) is returned unchanged.
    """
    words = line.split()
    if len(words) < 2 or len(line) >= width:
        return line
    gaps = len(words) - 1
    spaces = width - sum(len(w) for w in words)
    base, extra = divmod(spaces, gaps)
    out = []
    for i, word in enumerate(words[:-1]):
        out.append(word + " " * (base + (1 if i < extra else 0)))
    out.append(words[-1])
    return "".join(out)


def justify(text: str, width: int = 70, **options) -> list[str]:
    """Wrap ``text`` and justify every line except the last, which stays ragged."""
    lines = wrap(text, width, **options)
    return [justify_line(line, width) for line in lines[:-1]] + lines[-1:]
