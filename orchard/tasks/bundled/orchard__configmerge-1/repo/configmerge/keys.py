"""Override directives encoded as key suffixes.

In an *override* mapping a key may carry one trailing marker:

- ``"key!"`` -- replace the base value wholesale instead of deep-merging
- ``"key+"`` -- append the list to the base list, whatever the list strategy
- ``"key~"`` -- delete ``key`` from the result (the value is ignored)
"""

from __future__ import annotations

from typing import Optional, Tuple

REPLACE = "replace"
APPEND = "append"
DELETE = "delete"

SUFFIXES = {"!": REPLACE, "+": APPEND, "~": DELETE}


def parse_key(key: str) -> Tuple[str, Optional[str]]:
    """Split ``key`` into its name and directive (``None`` if it has none).

    >>> parse_key("servers+")
    ('servers', 'append')
    >>> parse_key("port")
    ('port', None)
    """
    if isinstance(key, str) and len(key) > 1 and key[-1] in SUFFIXES:
        return key[:-1], SUFFIXES[key[-1]]
    return key, None


def join_path(parent: str, key: str) -> str:
    """Dotted path of ``key`` below ``parent`` (``""`` is the root)."""
    return f"{parent}.{key}" if parent else str(key)
