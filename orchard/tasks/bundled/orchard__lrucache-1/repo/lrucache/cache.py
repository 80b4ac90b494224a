"""The :class:`LRUCache` container."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Hashable, Iterator

from .clock import Clock, monotonic_clock


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    expirations: int = 0

    @property
    def hit_rate(self) -> float:
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else 0.0


class LRUCache:
    """A mapping that holds at most ``maxsize`` entries, evicting the least recently
    used one when full.  With ``ttl`` (seconds) entries also expire that long after
    they were stored; ``put(..., ttl=...)`` overrides it per entry.
    """

    def __init__(self, maxsize: int = 128, ttl: float | None = None, clock: Clock | None = None):
        if maxsize < 1:
            raise ValueError("maxsize must be at least 1")
        if ttl is not None and ttl <= 0:
            raise ValueError("ttl must be positive")
        self.maxsize = maxsize
        self.ttl = ttl
        self._clock = clock or monotonic_clock
        self._data: OrderedDict[Hashable, tuple[Any, float | None]] = OrderedDict()
        self.stats = CacheStats()

    def _expired(self, expires_at: float | None) -> bool:
        return expires_at is not None and self._clock() >= expires_at

    def _lookup(self, key: Hashable) -> tuple[bool, Any]:
        entry = self._data.get(key)
        if entry is None:
            return False, None
        value, expires_at = entry
        if self._expired(expires_at):
            del self._data[key]
            self.stats.expirations += 1
            return False, None
        return True, value

    def get(self, key: Hashable, default: Any = None) -> Any:
        """Return the value for ``key`` (marking it most recently used) or ``default``."""
        found, value = self._lookup(key)
        if not found:
            self.stats.misses += 1
            return default
        self._data.move_to_end(key)
        self.stats.hits += 1
        return value

    def peek(self, key: Hashable, default: Any = None) -> Any:
        """Like :meth:`get`, but without touching recency or statistics."""
        entry = self._data.get(key)
        if entry is None or self._expired(entry[1]):
            return default
        return entry[0]

    def put(self, key: Hashable, value: Any, *, ttl: float | None = None) -> None:
        """Store ``value`` under ``key`` as the most recently used entry."""
        ttl = self.ttl if ttl is None else ttl
        expires_at = None if ttl is None else self._clock() + ttl
        if key in self._data:
            self._data.move_to_end(key)
        self._data[key] = (value, expires_at)
        while len(self._data) > self.maxsize:
            self._evict_one()

    def _evict_one(self) -> None:
        # Prefer dropping an already-expired entry over a live one.
        for key, (_, expires_at) in self._data.items():
            if self._expired(expires_at):
                del self._data[key]
                self.stats.expirations += 1
                return
        self._data.popitem(last=False)
        self.stats.evictions += 1

    def delete(self, key: Hashable) -> bool:
        return self._data.pop(key, None) is not None

    def clear(self) -> None:
        self._data.clear()

    def purge_expired(self) -> int:
        """Drop every expired entry; return how many were dropped."""
        dead = [k for k, (_, exp) in self._data.items() if self._expired(exp)]
        for k in dead:
            del self._data[k]
        self.stats.expirations += len(dead)
        return len(dead)

    def __contains__(self, key: Hashable) -> bool:
        found, _ = self._lookup(key)
        return found

    def __len__(self) -> int:
        self.purge_expired()
        return len(self._data)

    def keys(self) -> Iterator[Hashable]:
        """Live keys, least recently used first."""
        self.purge_expired()
        return iter(list(self._data))

    def __repr__(self) -> str:
        return f"LRUCache(maxsize={self.maxsize}, ttl={self.ttl}, size={len(self._data)})"
