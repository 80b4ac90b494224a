"""Orchard Env: isolated sandboxes behind one REST API, embedded or on a cluster.

The SDK and the wire schema import cheaply; the server side (FastAPI, backends) loads on
first use of one of its names, so a client never pays for it.
"""

from __future__ import annotations

import importlib
from typing import Any

from orchard.env.client import AsyncSandbox, AsyncSandboxClient, Sandbox, SandboxClient

_LAZY = {
    "Settings": "orchard.env.config",
    "OrchestratorError": "orchard.env.errors",
    "SandboxService": "orchard.env.service",
    "EmbeddedOrchestrator": "orchard.env.server",
    "build_app": "orchard.env.server",
    "serve": "orchard.env.server",
    "Backend": "orchard.env.backends.base",
    "SandboxSpec": "orchard.env.backends.base",
    "SandboxHandle": "orchard.env.backends.base",
    "KubernetesBackend": "orchard.env.backends.kubernetes",
    "KubernetesConfig": "orchard.env.backends.kubernetes",
    "StateStore": "orchard.env.state.base",
    "SqliteStore": "orchard.env.state.sqlite",
    "RedisStore": "orchard.env.state.redis",
    "open_store": "orchard.env.state",
}

__all__ = ["AsyncSandbox", "AsyncSandboxClient", "Sandbox", "SandboxClient", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'orchard.env' has no attribute {name!r}")
