"""The Kubernetes backend: a pod per sandbox, readiness from a watch, the hot path on Pod IPs."""

from orchard.env.backends.kubernetes.backend import KubernetesBackend, agent_token
from orchard.env.backends.kubernetes.config import KubernetesConfig
from orchard.env.backends.kubernetes.manifests import (
    allow_egress_policy,
    deny_egress_policy,
    pod_manifest,
)

__all__ = ["KubernetesBackend", "KubernetesConfig", "agent_token", "allow_egress_policy",
           "deny_egress_policy", "pod_manifest"]
