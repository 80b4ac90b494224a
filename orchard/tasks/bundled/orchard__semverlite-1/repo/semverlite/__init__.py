"""semverlite: Semantic Versioning 2.0.0 parsing, comparison and ranges."""

from .ranges import InvalidRange, Range, max_satisfying, parse_range, satisfies
from .version import InvalidVersion, Version, compare, parse_version

__all__ = [
    "Version",
    "parse_version",
    "compare",
    "InvalidVersion",
    "Range",
    "parse_range",
    "satisfies",
    "max_satisfying",
    "InvalidRange",
]

__version__ = "0.4.1"
