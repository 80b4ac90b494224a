"""npm-style version ranges.

A range is a ``||``-separated list of comparator sets; a comparator set is a
space-separated list of comparators that must all hold.  Supported comparators:

* ``1.2.3``, ``=1.2.3``    exactly that version
* ``>``, ``>=``, ``<``, ``<=`` followed by a (possibly partial) version
* ``1.2``, ``1.x``, ``1.2.*``  x-ranges: any version with that prefix
* ``^1.2.3``  changes that do not modify the left-most non-zero component
* ``~1.2.3``  patch-level changes if a minor version is given, minor-level otherwise
* ``*`` or an empty string: any version

Pre-release versions are ordered by plain SemVer precedence; unlike npm they are not
excluded from ranges that do not mention a pre-release.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .version import InvalidVersion, Version, parse_version


class InvalidRange(ValueError):
    """Raised when a range expression cannot be parsed."""


_OPS: dict[str, Callable[[Version, Version], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
    "=": operator.eq,
}

_COMPARATOR_RE = re.compile(r"^(?P<op>\^|~|>=|<=|>|<|=)?\s*v?(?P<ver>.*)$")
_WILDCARDS = {"x", "X", "*"}


@dataclass(frozen=True)
class Comparator:
    op: str
    version: Version

    def test(self, version: Version) -> bool:
        return _OPS[self.op](version, self.version)

    def __str__(self) -> str:
        return f"{self.op}{self.version}"


def _split_partial(text: str) -> tuple[list[int], Version | None]:
    """Split ``1.2`` / ``1.x.x`` into its given numeric parts.

    A complete version (with a pre-release or build tag) is returned as a Version.
    """
    if text in _WILDCARDS or text == "":
        return [], None
    try:
        return [], Version.parse(text)
    except InvalidVersion:
        pass
    parts: list[int] = []
    pieces = text.split(".")
    if len(pieces) > 3:
        raise InvalidRange(f"invalid version in range: {text!r}")
    for piece in pieces:
        if piece in _WILDCARDS:
            break
        if not piece.isdigit():
            raise InvalidRange(f"invalid version in range: {text!r}")
        parts.append(int(piece))
    return parts, None


def _floor(parts: list[int]) -> Version:
    padded = parts + [0] * (3 - len(parts))
    return Version(*padded)


def _bump(parts: list[int], index: int) -> Version:
    """The smallest version above everything that shares ``parts[:index + 1]``."""
    bumped = parts[:index] + [parts[index] + 1]
    return _floor(bumped)


def _expand(op: str, text: str) -> list[Comparator]:
    """Translate one comparator into plain ``op version`` comparators."""
    parts, full = _split_partial(text)
    if full is not None:
        if op == "^":
            parts = [full.major, full.minor, full.patch]
            index = next((i for i, p in enumerate(parts) if p), 2)
            return [Comparator(">=", full), Comparator("<", _bump(parts, index))]
        if op == "~":
            return [Comparator(">=", full), Comparator("<", _bump([full.major, full.minor], 1))]
        return [Comparator(op or "=", full)]
    if not parts:
        if op in ("<", ">"):
            return [Comparator("<", Version(0, 0, 0))]  # matches nothing
        return []  # matches everything
    if op == "^":
        index = next((i for i, p in enumerate(parts) if p), len(parts) - 1)
        return [Comparator(">=", _floor(parts)), Comparator("<", _bump(parts, index))]
    if op == "~":
        index = max(len(parts) - 2, 0)
        return [Comparator(">=", _floor(parts)), Comparator("<", _bump(parts, index))]
    if len(parts) == 3:
        return [Comparator(op or "=", _floor(parts))]
    # Partial versions: ">1.2" means ">=1.3.0", "<=1.2" means "<1.3.0".
    last = len(parts) - 1
    if op in ("", "="):
        return [Comparator(">=", _floor(parts)), Comparator("<", _bump(parts, last))]
    if op == ">":
        return [Comparator(">=", _bump(parts, last))]
    if op == "<=":
        return [Comparator("<", _bump(parts, last))]
    return [Comparator(op, _floor(parts))]


class Range:
    """A parsed range expression; use :meth:`test` or ``version in range``."""

    def __init__(self, expression: str):
        self.expression = expression
        self.sets: list[list[Comparator]] = []
        for alternative in expression.split("||"):
            comparators: list[Comparator] = []
            for token in _tokenize(alternative):
                m = _COMPARATOR_RE.match(token)
                if not m:
                    raise InvalidRange(f"invalid comparator {token!r} in {expression!r}")
                comparators.extend(_expand(m["op"] or "", m["ver"].strip()))
            self.sets.append(comparators)

    def test(self, version: str | Version) -> bool:
        v = parse_version(version)
        return any(all(c.test(v) for c in cs) for cs in self.sets)

    __contains__ = test

    def __str__(self) -> str:
        return " || ".join(" ".join(map(str, cs)) or "*" for cs in self.sets)

    def __repr__(self) -> str:
        return f"Range({self.expression!r})"


def _tokenize(alternative: str) -> list[str]:
    """Split a comparator set on spaces, re-attaching operators written apart
    from their version (``>= 1.2.3``)."""
    tokens: list[str] = []
    pending = ""
    for word in alternative.split():
        if word in _OPS or word in ("^", "~"):
            pending = word
            continue
        tokens.append(pending + word)
        pending = ""
    if pending:
        raise InvalidRange(f"dangling operator {pending!r} in {alternative!r}")
    return tokens


def parse_range(expression: str) -> Range:
    return Range(expression)


def satisfies(version: str | Version, expression: str | Range) -> bool:
    """True if ``version`` is inside the range ``expression``."""
    rng = expression if isinstance(expression, Range) else Range(expression)
    return rng.test(version)


def max_satisfying(versions: Iterable[str | Version], expression: str | Range) -> Version | None:
    """The highest of ``versions`` inside the range, or None if none is."""
    rng = expression if isinstance(expression, Range) else Range(expression)
    matching = [parse_version(v) for v in versions if rng.test(v)]
    return max(matching, default=None)
