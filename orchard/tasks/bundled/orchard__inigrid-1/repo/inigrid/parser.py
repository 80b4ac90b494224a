"""Turn INI text into ``{section: {option: value}}`` dictionaries.

Syntax accepted:

* ``[section]`` headers; options before the first header are an error
* ``key = value`` or ``key: value``; option names are case-insensitive (lower-cased)
* full-line comments starting with ``#`` or ``;``
* inline comments: ``#`` or ``;`` preceded by whitespace
* continuation lines: a line indented deeper than its option continues the value
"""

from __future__ import annotations

import re
from typing import Iterable

from .errors import ParseError

DEFAULT_SECTION = "DEFAULT"

_SECTION_RE = re.compile(r"^\[(?P<name>[^\]]+)\]\s*$")
_OPTION_RE = re.compile(r"^(?P<key>[^=:\s][^=:]*?)\s*[=:]\s*(?P<value>.*)$")
_INLINE_COMMENT_RE = re.compile(r"\s[#;]")


def strip_inline_comment(value: str) -> str:
    m = _INLINE_COMMENT_RE.search(value)
    if m:
        value = value[: m.start()]
    return value.strip()


def parse(lines: Iterable[str]) -> dict[str, dict[str, str]]:
    """Parse INI ``lines`` into an ordered mapping of sections to options.

    Repeated sections are merged and a repeated option keeps its last value.
    The ``[DEFAULT]`` section, if present, is returned under ``DEFAULT_SECTION``.
    """
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    last_key: str | None = None
    last_indent = 0

    for lineno, raw in enumerate(lines, 1):
        line = raw.rstrip("\r\n")
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())

        if not stripped or stripped[0] in "#;":
            continue

        if last_key is not None and current is not None and indent > last_indent:
            extra = strip_inline_comment(stripped)
            current[last_key] = f"{current[last_key]}\n{extra}" if current[last_key] else extra
            continue

        m = _SECTION_RE.match(stripped)
        if m:
            name = m["name"].strip()
            current = sections.setdefault(name, {})
            last_key = None
            continue

        m = _OPTION_RE.match(stripped)
        if not m:
            raise ParseError(lineno, line, "expected '[section]' or 'key = value'")
        if current is None:
            raise ParseError(lineno, line, "option outside of any section")
        last_key = m["key"].strip().lower()
        last_indent = indent
        current[last_key] = strip_inline_comment(m["value"])

    return sections
