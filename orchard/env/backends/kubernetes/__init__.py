"""The Kubernetes backend: a pod per sandbox, readiness from a watch, the hot path on Pod IPs.

Names load on first use: `Settings` imports the config module, and a local-only orchestrator
should not pay for importing the Kubernetes client.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "KubernetesBackend": "orchard.env.backends.kubernetes.backend",
    "agent_token": "orchard.env.backends.kubernetes.backend",
    "KubernetesConfig": "orchard.env.backends.kubernetes.config",
    "allow_egress_policy": "orchard.env.backends.kubernetes.manifests",
    "deny_egress_policy": "orchard.env.backends.kubernetes.manifests",
    "pod_manifest": "orchard.env.backends.kubernetes.manifests",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
