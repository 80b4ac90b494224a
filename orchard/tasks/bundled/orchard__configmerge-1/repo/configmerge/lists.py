"""Strategies for combining a base list with an override list."""

from __future__ import annotations

import copy
from typing import Any, Hashable, List

STRATEGIES = ("replace", "append", "prepend", "unique", "merge_by_key")


def merge_lists(
    base: List[Any],
    override: List[Any],
    strategy: str = "replace",
    *,
    key: Hashable = "name",
) -> List[Any]:
    """Combine two lists according to ``strategy``.

    - ``replace``: the override list
    - ``append`` / ``prepend``: both lists, override after / before base
    - ``unique``: base followed by the override items not already present
    - ``merge_by_key``: dict items whose ``key`` matches an item of ``base``
      are merged into it; all other items are appended

    The result is a new list; neither input is modified.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown list strategy {strategy!r}; expected one of {STRATEGIES}")
    base = copy.deepcopy(base)
    override = copy.deepcopy(override)
    if strategy == "replace":
        return override
    if strategy == "append":
        return base + override
    if strategy == "prepend":
        return override + base
    if strategy == "unique":
        result = list(base)
        for item in override:
            if item not in result:
                result.append(item)
        return result

    # merge_by_key
    result = list(base)
    index = {
        item[key]: i for i, item in enumerate(result) if isinstance(item, dict) and key in item
    }
    for item in override:
        if isinstance(item, dict) and key in item and item[key] in index:
            position = index[item[key]]
            merged = dict(result[position])
            merged.update(item)
            result[position] = merged
        else:
            if isinstance(item, dict) and key in item:
                index[item[key]] = len(result)
            result.append(item)
    return result
