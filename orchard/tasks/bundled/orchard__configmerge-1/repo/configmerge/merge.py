"""Recursive merging of configuration mappings."""

from __future__ import annotations

import copy
from typing import Any, Hashable, Mapping, Optional

from .keys import APPEND, DELETE, REPLACE, join_path, parse_key
from .lists import STRATEGIES, merge_lists


def _strip_directives(value: Any) -> Any:
    """A deep copy of ``value`` with directive suffixes removed from dict keys."""
    if isinstance(value, Mapping):
        result = {}
        for raw_key, item in value.items():
            key, directive = parse_key(raw_key)
            if directive == DELETE:
                continue
            result[key] = _strip_directives(item)
        return result
    if isinstance(value, list):
        return [_strip_directives(item) for item in value]
    return copy.deepcopy(value)


class Merger:
    """Deep-merges configuration mappings.

    :param list_strategy: default strategy for lists (see :data:`STRATEGIES`)
    :param list_strategies: per-path strategies, keyed by dotted path such as
        ``"server.middleware"``; items inside lists do not add a path segment
    :param merge_key: the identifying key used by ``merge_by_key``
    """

    def __init__(
        self,
        list_strategy: str = "replace",
        list_strategies: Optional[Mapping[str, str]] = None,
        merge_key: Hashable = "name",
    ):
        strategies = dict(list_strategies or {})
        for strategy in [list_strategy, *strategies.values()]:
            if strategy not in STRATEGIES:
                raise ValueError(f"unknown list strategy {strategy!r}")
        self.list_strategy = list_strategy
        self.list_strategies = strategies
        self.merge_key = merge_key

    def strategy_for(self, path: str) -> str:
        return self.list_strategies.get(path, self.list_strategy)

    def merge(self, base: Mapping[str, Any], override: Mapping[str, Any]) -> dict:
        """A new dict: ``override`` merged on top of ``base``."""
        if not isinstance(base, Mapping) or not isinstance(override, Mapping):
            raise TypeError("configurations must be mappings")
        return self._merge_dicts(base, override, "")

    def _merge_dicts(self, base: Mapping, override: Mapping, path: str) -> dict:
        result = {key: copy.deepcopy(value) for key, value in base.items()}
        for raw_key, value in override.items():
            key, directive = parse_key(raw_key)
            if directive == DELETE:
                result.pop(key, None)
            elif directive == REPLACE or key not in result:
                result[key] = _strip_directives(value)
            else:
                result[key] = self._merge_values(
                    result[key], value, join_path(path, key), directive
                )
        return result

    def _merge_values(self, base: Any, override: Any, path: str, directive: Optional[str]):
        if isinstance(base, Mapping) and isinstance(override, Mapping):
            return self._merge_dicts(base, override, path)
        if isinstance(base, list) and isinstance(override, list):
            strategy = "append" if directive == APPEND else self.strategy_for(path)
            return merge_lists(
                base,
                _strip_directives(override),
                strategy,
                key=self.merge_key,
            )
        return _strip_directives(override)


def deep_merge(*configs: Mapping[str, Any], **options: Any) -> dict:
    """Merge ``configs`` left to right; ``options`` are passed to :class:`Merger`."""
    merger = Merger(**options)
    result: dict = {}
    for config in configs:
        result = merger.merge(result, config)
    return result
