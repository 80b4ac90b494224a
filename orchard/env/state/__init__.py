"""Where the orchestrator keeps its state: a StateStore protocol and its implementations."""

from orchard.env.state.base import StateStore
from orchard.env.state.sqlite import SqliteStore, sqlite_path

__all__ = ["SqliteStore", "StateStore", "sqlite_path"]
