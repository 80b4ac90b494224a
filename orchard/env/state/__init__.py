"""Where the orchestrator keeps its state: a StateStore protocol and its implementations.

RedisStore loads on first use, so an orchestrator on SQLite runs without the redis package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from orchard.env.state.base import (
    LockLost,
    LockTimeout,
    StateStore,
    StoreUnavailable,
    Subscription,
)
from orchard.env.state.sqlite import SqliteStore, sqlite_path

if TYPE_CHECKING:
    from orchard.env.state.redis import RedisStore

__all__ = [
    "LockLost",
    "LockTimeout",
    "RedisStore",
    "SqliteStore",
    "StateStore",
    "StoreUnavailable",
    "Subscription",
    "open_store",
    "sqlite_path",
]

_REDIS_SCHEMES = ("redis", "rediss", "unix")


def open_store(url: str) -> StateStore:
    """The store a state URL names. Nothing connects yet: a Redis server that cannot be
    reached raises StoreUnavailable on first use."""
    scheme = urlsplit(url).scheme
    if scheme == "sqlite":
        return SqliteStore(sqlite_path(url))
    if scheme in _REDIS_SCHEMES:
        from orchard.env.state.redis import RedisStore

        return RedisStore(url)
    raise ValueError(
        f"unsupported state URL scheme {scheme + '://' if scheme else '(none)'}: use "
        "sqlite:///path/to/state.db (one orchestrator), or for replicas sharing state "
        "redis://[:password@]host:port/db[?prefix=NAME], rediss://... (TLS) or "
        "unix:///path/to/redis.sock[?db=N&prefix=NAME]"
    )


def __getattr__(name: str) -> Any:
    if name == "RedisStore":
        from orchard.env.state.redis import RedisStore

        return RedisStore
    raise AttributeError(f"module 'orchard.env.state' has no attribute {name!r}")
