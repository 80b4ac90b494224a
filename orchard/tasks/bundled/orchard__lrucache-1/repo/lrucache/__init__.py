"""lrucache: LRU caching with optional TTL and an injectable clock."""

from .cache import CacheStats, LRUCache
from .clock import ManualClock, monotonic_clock
from .memoize import make_key, memoize

__all__ = ["CacheStats", "LRUCache", "ManualClock", "make_key", "memoize", "monotonic_clock"]
