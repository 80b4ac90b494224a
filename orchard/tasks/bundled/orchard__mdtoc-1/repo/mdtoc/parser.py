"""Extract ATX headings from Markdown source."""

from __future__ import annotations

import re
from dataclasses import dataclass

_ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")
_CODE = re.compile(r"`([^`]*)`")
_EMPHASIS = re.compile(r"(\*\*|__|\*|_)(\S(?:.*?\S)?)\1")


@dataclass(frozen=True)
class Heading:
    """One heading: its level (1-6), plain text and 1-based line number."""

    level: int
    text: str
    line: int


def strip_inline(text: str) -> str:
    """Reduce inline Markdown (links, code spans, emphasis) to plain text."""
    text = _LINK.sub(r"\1", text)
    text = _CODE.sub(r"\1", text)
    text = _EMPHASIS.sub(r"\2", text)
    return text


def _heading_text(raw: str) -> str:
    """The heading content without the optional closing ``#`` sequence."""
    text = raw.rstrip("#").rstrip()
    return strip_inline(text)


def parse_headings(markdown: str) -> list[Heading]:
    """All ATX headings in ``markdown``, in document order.

    Lines inside fenced code blocks (``` or ~~~) are ignored.
    """
    headings = []
    fence: str | None = None
    for number, line in enumerate(markdown.splitlines(), start=1):
        fence_match = _FENCE.match(line)
        if fence_match:
            marker = fence_match.group(1)
            if fence is None:
                fence = marker
            elif marker[0] == fence[0] and len(marker) >= len(fence):
                fence = None
            continue
        if fence is not None:
            continue
        match = _ATX.match(line)
        if match:
            level = len(match.group(1))
            text = _heading_text(match.group(2) or "")
            if text:
                headings.append(Heading(level, text, number))
    return headings
