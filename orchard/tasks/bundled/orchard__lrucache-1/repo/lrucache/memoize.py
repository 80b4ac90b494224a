"""The :func:`memoize` decorator."""

from __future__ import annotations

import functools
from typing import Any, Callable, Hashable

from .cache import LRUCache
from .clock import Clock

_KWARGS_MARK = object()


def make_key(args: tuple, kwargs: dict) -> Hashable:
    """A hashable key for a call; keyword order does not matter."""
    if not kwargs:
        return args if len(args) != 1 else (args[0],)
    return args + (_KWARGS_MARK,) + tuple(sorted(kwargs.items()))


def memoize(
    maxsize: int = 128,
    ttl: float | None = None,
    *,
    clock: Clock | None = None,
    key: Callable[..., Hashable] | None = None,
):
    """Cache a function's results in an :class:`LRUCache`.

    ``key``, if given, computes the cache key from the call's arguments (by default all
    arguments must be hashable).  The wrapper exposes ``.cache`` and ``.cache_clear()``.
    """

    def decorator(func: Callable[..., Any]) -> Callable[..., Any]:
        cache = LRUCache(maxsize=maxsize, ttl=ttl, clock=clock)

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            k = key(*args, **kwargs) if key is not None else make_key(args, kwargs)
            result = cache.get(k)
            if result is None:
                result = func(*args, **kwargs)
                cache.put(k, result)
            return result

        wrapper.cache = cache
        wrapper.cache_clear = cache.clear
        return wrapper

    return decorator
