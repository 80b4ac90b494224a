"""Resolving and editing documents with pointers (RFC 6901, sections 4 and 7)."""

from __future__ import annotations

import re
from typing import Any

from jsonpointer.pointer import JsonPointerError, parse, to_pointer

_INDEX = re.compile(r"0|[1-9][0-9]*")


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


def _index(token: str, array: list, *, allow_end: bool = False) -> int:
    """The list index a token denotes; ``-`` (one past the end) only if ``allow_end``."""
    if token == "-" and allow_end:
        return len(array)
    if not _INDEX.fullmatch(token):
        raise JsonPointerError(f"invalid array index {token!r}")
    index = int(token)
    if index >= len(array) + (1 if allow_end else 0):
        raise JsonPointerError(f"array index {index} out of range (length {len(array)})")
    return index


def _step(node: Any, token: str, where: list[str]) -> Any:
    if isinstance(node, dict):
        if token not in node:
            raise JsonPointerError(f"no member {token!r} at {to_pointer(where) or '(root)'}")
        return node[token]
    if isinstance(node, list):
        return node[_index(token, node)]
    raise JsonPointerError(f"cannot descend into {type(node).__name__} at "
                           f"{to_pointer(where) or '(root)'}")


def resolve(doc: Any, pointer: str, default: Any = MISSING) -> Any:
    """The value ``pointer`` refers to in ``doc``.

    If it refers to nothing, return ``default`` when given, else raise
    :class:`JsonPointerError`.
    """
    node = doc
    tokens = parse(pointer)
    try:
        for i, token in enumerate(tokens):
            node = _step(node, token, tokens[:i])
    except JsonPointerError:
        if default is MISSING:
            raise
        return default
    return node


def _parent(doc: Any, pointer: str) -> tuple[Any, str]:
    tokens = parse(pointer)
    if not tokens:
        raise JsonPointerError("the root cannot be set or removed in place")
    parent = resolve(doc, to_pointer(tokens[:-1]))
    return parent, tokens[-1]


def set_value(doc: Any, pointer: str, value: Any) -> Any:
    """Set the value at ``pointer`` (its parent must exist) and return ``doc``.

    In an object the member is added or replaced; in an array the element is replaced, and
    ``-`` appends.
    """
    parent, token = _parent(doc, pointer)
    if isinstance(parent, dict):
        parent[token] = value
    elif isinstance(parent, list):
        index = _index(token, parent, allow_end=True)
        if index == len(parent):
            parent.append(value)
        else:
            parent[index] = value
    else:
        raise JsonPointerError(f"cannot set a member of {type(parent).__name__}")
    return doc


def remove(doc: Any, pointer: str) -> Any:
    """Remove the value at ``pointer`` and return it."""
    parent, token = _parent(doc, pointer)
    if isinstance(parent, dict):
        if token not in parent:
            raise JsonPointerError(f"no member {token!r} to remove")
        return parent.pop(token)
    if isinstance(parent, list):
        return parent.pop(_index(token, parent))
    raise JsonPointerError(f"cannot remove a member of {type(parent).__name__}")
