"""GitHub-style anchor slugs."""

from __future__ import annotations

import re

_UNWANTED = re.compile(r"[^\w\- ]", re.UNICODE)


def slugify(text: str) -> str:
    """The anchor GitHub generates for a heading.

    Lower-cases, drops punctuation (keeping ``-`` and ``_``) and turns each
    space into a hyphen.

    >>> slugify("Hello, World!")
    'hello-world'
    """
    return _UNWANTED.sub("", text.strip().lower()).replace(" ", "-")


class SlugRegistry:
    """Hands out unique slugs: repeats get ``-1``, ``-2``, ... appended."""

    def __init__(self) -> None:
        self._seen: dict[str, int] = {}

    def unique(self, text: str) -> str:
        base = slugify(text)
        if base not in self._seen:
            self._seen[base] = 0
            return base
        while True:
            self._seen[base] += 1
            candidate = f"{base}-{self._seen[base]}"
            if candidate not in self._seen:
                self._seen[candidate] = 0
                return candidate
