"""The :class:`Version` type and the precedence rules of SemVer 2.0.0."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import total_ordering

_NUM = r"0|[1-9]\d*"
_IDENT = r"[0-9A-Za-z-]+"
_VERSION_RE = re.compile(
    rf"^(?P<major>{_NUM})\.(?P<minor>{_NUM})\.(?P<patch>{_NUM})"
    rf"(?:-(?P<pre>{_IDENT}(?:\.{_IDENT})*))?"
    rf"(?:\+(?P<build>{_IDENT}(?:\.{_IDENT})*))?$"
)


class InvalidVersion(ValueError):
    """Raised when a string is not a valid semantic version."""


def _coerce_identifier(ident: str) -> int | str:
    """Numeric pre-release identifiers compare as integers, others as strings."""
    if ident.isdigit():
        if len(ident) > 1 and ident.startswith("0"):
            raise InvalidVersion(f"numeric identifier {ident!r} has a leading zero")
        return int(ident)
    return ident


def _compare_identifiers(a: int | str, b: int | str) -> int:
    if isinstance(a, int) and isinstance(b, int):
        return (a > b) - (a < b)
    if isinstance(a, int):
        return -1  # numeric identifiers have lower precedence than alphanumeric
    if isinstance(b, int):
        return 1
    return (a > b) - (a < b)


def _compare_prerelease(a: tuple, b: tuple) -> int:
    # A version without a pre-release has higher precedence than one with it.
    if not a and not b:
        return 0
    if not a:
        return 1
    if not b:
        return -1
    for x, y in zip(a, b):
        c = _compare_identifiers(x, y)
        if c:
            return c
    return (len(a) > len(b)) - (len(a) < len(b))


@total_ordering
@dataclass(frozen=True)
class Version:
    """An immutable semantic version.

    Build metadata is kept for display but ignored for precedence and equality,
    as the specification requires.
    """

    major: int
    minor: int
    patch: int
    prerelease: tuple = ()
    build: tuple = field(default=(), compare=False)

    @classmethod
    def parse(cls, text: str) -> Version:
        """Parse ``text``; a leading ``v`` or ``=`` and surrounding spaces are allowed."""
        s = text.strip()
        if s[:1] in ("v", "V", "="):
            s = s[1:]
        m = _VERSION_RE.match(s)
        if not m:
            raise InvalidVersion(f"invalid version: {text!r}")
        pre = tuple(_coerce_identifier(p) for p in m["pre"].split(".")) if m["pre"] else ()
        build = tuple(m["build"].split(".")) if m["build"] else ()
        return cls(int(m["major"]), int(m["minor"]), int(m["patch"]), pre, build)

    def __str__(self) -> str:
        s = f"{self.major}.{self.minor}.{self.patch}"
        if self.prerelease:
            s += "-" + ".".join(str(p) for p in self.prerelease)
        if self.build:
            s += "+" + ".".join(self.build)
        return s

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return compare(self, other) == 0

    def __hash__(self) -> int:
        return hash((self.major, self.minor, self.patch, self.prerelease))

    def __lt__(self, other: Version) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return compare(self, other) < 0

    @property
    def is_prerelease(self) -> bool:
        return bool(self.prerelease)

    def bump(self, part: str) -> Version:
        """Return the next ``"major"``, ``"minor"`` or ``"patch"`` release.

        Bumping a pre-release to its own release level drops the pre-release tag
        (``1.2.0-rc.1`` bumped by ``"minor"`` is ``1.2.0``), as npm does.
        """
        if part == "major":
            if self.prerelease and self.minor == 0 and self.patch == 0:
                return Version(self.major, 0, 0)
            return Version(self.major + 1, 0, 0)
        if part == "minor":
            if self.prerelease and self.patch == 0:
                return Version(self.major, self.minor, 0)
            return Version(self.major, self.minor + 1, 0)
        if part == "patch":
            if self.prerelease:
                return Version(self.major, self.minor, self.patch)
            return Version(self.major, self.minor, self.patch + 1)
        raise ValueError(f"unknown version part: {part!r}")


def parse_version(text: str | Version) -> Version:
    """Return ``text`` as a :class:`Version` (a Version is returned unchanged)."""
    if isinstance(text, Version):
        return text
    return Version.parse(text)


def compare(a: str | Version, b: str | Version) -> int:
    """Return -1, 0 or 1 as ``a`` has lower, equal or higher precedence than ``b``."""
    a, b = parse_version(a), parse_version(b)
    ka, kb = (a.major, a.minor, a.patch), (b.major, b.minor, b.patch)
    if ka != kb:
        return (ka > kb) - (ka < kb)
    return _compare_prerelease(a.prerelease, b.prerelease)
