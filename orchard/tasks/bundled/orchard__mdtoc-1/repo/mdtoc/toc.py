"""Render a table of contents and splice it into a document."""

from __future__ import annotations

from .parser import parse_headings
from .slug import SlugRegistry

DEFAULT_MARKER = "<!-- toc -->"
END_MARKER = "<!-- tocstop -->"


def build_toc(markdown: str, min_level: int = 1, max_level: int = 3, indent: int = 2) -> str:
    """A nested Markdown bullet list linking to every heading in range.

    Slugs are computed for *all* headings so that anchors match what GitHub
    renders even when some levels are left out of the list.
    """
    if not 1 <= min_level <= max_level <= 6:
        raise ValueError("levels must satisfy 1 <= min_level <= max_level <= 6")
    registry = SlugRegistry()
    lines = []
    for heading in parse_headings(markdown):
        slug = registry.unique(heading.text)
        if not min_level <= heading.level <= max_level:
            continue
        pad = " " * (indent * (heading.level - min_level))
        lines.append(f"{pad}- [{heading.text}](#{slug})")
    return "\n".join(lines)


def insert_toc(markdown: str, marker: str = DEFAULT_MARKER, **options) -> str:
    """Replace the block after ``marker`` (up to ``<!-- tocstop -->``) with a fresh TOC.

    If there is no end marker yet, one is added.  Documents without
    ``marker`` are returned unchanged.
    """
    lines = markdown.split("\n")
    try:
        start = lines.index(marker)
    except ValueError:
        return markdown
    try:
        end = lines.index(END_MARKER, start + 1)
    except ValueError:
        end = start
    toc = build_toc(markdown, **options)
    new_block = [marker, "", toc, "", END_MARKER]
    return "\n".join(lines[:start] + new_block + lines[end + 1:])
