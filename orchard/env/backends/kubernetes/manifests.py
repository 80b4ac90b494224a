"""What the Kubernetes backend asks the API server for: sandbox pods and network policies.

Pure functions of the spec and the config, so they can be read, diffed and validated offline.
"""

from __future__ import annotations

import ipaddress
import json
import re
from typing import Any

from orchard.env.agent.bundle import BUNDLE_MOUNT, agent_command
from orchard.env.backends.base import SandboxSpec
from orchard.env.backends.kubernetes.config import KubernetesConfig

MANAGED_BY = {"app.kubernetes.io/managed-by": "orchard"}
SANDBOX_ID = "orchard.dev/sandbox-id"
NETWORK = "orchard.dev/network"
NONCE = "orchard.dev/create-nonce"
USER_LABELS = "orchard.dev/labels"
TOKEN_ENV = "ORCHARD_AGENT_TOKEN"
DENY_EGRESS = "orchard-deny-egress"
MODEL_PROXY = "orchard.dev/model-proxy"
MODEL_EGRESS = "orchard-allow-model-proxy"
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_INJECTOR_MOUNT = "/target"
# Runs on the bundle's own interpreter: the injector image has nothing else, not even a shell.
_COPY_BUNDLE = (
    "import shutil,sys;"
    f"shutil.copytree('{BUNDLE_MOUNT}','{_INJECTOR_MOUNT}',symlinks=True,dirs_exist_ok=True)"
)


# Not reachable from a networked pod by default (RFC 1918, RFC 6598, link-local).
PRIVATE_RANGES = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10",
                  "169.254.0.0/16")


def allow_egress_name(sandbox_id: str) -> str:
    return f"orchard-allow-egress-{sandbox_id}"


def _user_labels(labels: dict[str, str]) -> dict[str, str]:
    """Sandbox labels that are also valid Kubernetes labels, so kubectl can select on them;
    every label is kept in an annotation as well."""
    return {f"label.orchard.dev/{k}": v for k, v in labels.items()
            if _LABEL_NAME.match(k) and _LABEL_VALUE.match(v)}


def _restricted(add: list[str] | None = None) -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"], **({"add": add} if add else {})}}


def pod_manifest(spec: SandboxSpec, config: KubernetesConfig, token: str,
                 nonce: str) -> dict[str, Any]:
    sid = spec.sandbox_id
    resources: dict[str, str] = {}
    if spec.cpu is not None:
        resources["cpu"] = spec.cpu
    if spec.memory is not None:
        resources["memory"] = spec.memory
    probe = {"httpGet": {"path": "/health", "port": config.agent_port}}
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": sid,
            "namespace": config.namespace,
            "labels": {**config.labels, **_user_labels(spec.labels), **MANAGED_BY,
                       SANDBOX_ID: sid, NETWORK: "blocked" if spec.block_network else "open",
                       **({MODEL_PROXY: "true"} if spec.model_proxy else {})},
            "annotations": {**config.annotations, NONCE: nonce,
                            USER_LABELS: json.dumps(spec.labels, sort_keys=True)},
        },
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            # Sandboxes are disposable; the agent (PID 1) exits on SIGTERM anyway.
            "terminationGracePeriodSeconds": 1,
            "hostname": sid,
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            "initContainers": [{
                "name": "agent-injector",
                "image": config.agent_image,
                "imagePullPolicy": config.image_pull_policy,
                "command": [f"{BUNDLE_MOUNT}/bin/python3", "-I", "-S", "-c", _COPY_BUNDLE],
                "volumeMounts": [{"name": "orchard-bundle", "mountPath": _INJECTOR_MOUNT}],
                "resources": {"requests": {"cpu": "50m", "memory": "32Mi"},
                              "limits": {"cpu": "1", "memory": "128Mi"}},
                "securityContext": {**_restricted(), "readOnlyRootFilesystem": True},
            }],
            "containers": [{
                "name": "sandbox",
                "image": spec.image,
                # The agent is the container's main process: it keeps the pod alive and runs
                # on the bundle's loader and libc, so the image needs neither Python nor libc.
                "command": [*agent_command(), "--tcp", f"0.0.0.0:{config.agent_port}",
                            "--token-env", TOKEN_ENV],
                "env": [{"name": TOKEN_ENV, "value": token},
                        *({"name": k, "value": v} for k, v in spec.env.items())],
                "ports": [{"name": "agent", "containerPort": config.agent_port}],
                "startupProbe": {**probe, "periodSeconds": 1, "failureThreshold": 300},
                "readinessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 3},
                "resources": {"requests": resources, "limits": resources},
                "securityContext": _restricted(config.add_capabilities),
                "volumeMounts": [{"name": "orchard-bundle", "mountPath": BUNDLE_MOUNT,
                                  "readOnly": True}],
            }],
            "volumes": [{"name": "orchard-bundle", "emptyDir": {"sizeLimit": "512Mi"}}],
        },
    }
    extra = pod["spec"]
    if config.node_selector:
        extra["nodeSelector"] = dict(config.node_selector)
    if config.tolerations:
        extra["tolerations"] = list(config.tolerations)
    if config.runtime_class:
        extra["runtimeClassName"] = config.runtime_class
    if config.image_pull_secrets:
        extra["imagePullSecrets"] = [{"name": n} for n in config.image_pull_secrets]
    return pod


def deny_egress_policy(config: KubernetesConfig) -> dict[str, Any]:
    """Created once per namespace: sandbox pods reach nothing unless a policy allows it."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": DENY_EGRESS, "namespace": config.namespace,
                     "labels": dict(MANAGED_BY)},
        "spec": {"podSelector": {"matchLabels": dict(MANAGED_BY)},
                 "policyTypes": ["Egress"], "egress": []},
    }


def allow_egress_policy(spec: SandboxSpec, config: KubernetesConfig) -> dict[str, Any]:
    """The one extra object a block_network=false sandbox costs; deleted with it.

    Without an allow-list: ``egress_cidr`` minus the private, shared and link-local ranges
    (cluster pods and services, the nodes, cloud metadata), plus cluster DNS. With one: its
    addresses and networks only, plus DNS. Host names cannot be expressed in a NetworkPolicy
    (the backend refuses them before this is built).
    """
    if spec.egress is None:
        cidr = ipaddress.ip_network(config.egress_cidr)
        private = [ipaddress.IPv4Network(r) for r in PRIVATE_RANGES]
        excepted = [str(n) for n in private if isinstance(cidr, ipaddress.IPv4Network)
                    and n != cidr and n.subnet_of(cidr)]
        block: dict[str, Any] = {"cidr": config.egress_cidr}
        if excepted:
            block["except"] = excepted
        peers = [{"ipBlock": block}]
    else:
        peers = [{"ipBlock": {"cidr": str(ipaddress.ip_network(e))}} for e in spec.egress]
    rules: list[dict[str, Any]] = [_dns_rule()]
    if peers:
        rules.insert(0, {"to": peers})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": allow_egress_name(spec.sandbox_id), "namespace": config.namespace,
                     "labels": {**MANAGED_BY, SANDBOX_ID: spec.sandbox_id}},
        "spec": {"podSelector": {"matchLabels": {SANDBOX_ID: spec.sandbox_id}},
                 "policyTypes": ["Egress"], "egress": rules},
    }


def _dns_rule() -> dict[str, Any]:
    return {"to": [{"namespaceSelector": {"matchLabels": {
                        "kubernetes.io/metadata.name": "kube-system"}},
                    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
            "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}


def model_egress_policy(config: KubernetesConfig) -> dict[str, Any]:
    """Created once when the orchestrator has a model proxy: model_proxy sandboxes may reach
    the proxy's pods on its port, and cluster DNS to resolve its Service, and nothing else."""
    def peer(namespace: str, labels: dict[str, str]) -> dict[str, Any]:
        return {"namespaceSelector": {"matchLabels": {
                    "kubernetes.io/metadata.name": namespace}},
                "podSelector": {"matchLabels": labels}}

    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": MODEL_EGRESS, "namespace": config.namespace,
                     "labels": dict(MANAGED_BY)},
        "spec": {"podSelector": {"matchLabels": {MODEL_PROXY: "true"}},
                 "policyTypes": ["Egress"],
                 "egress": [
                     {"to": [peer(config.model_proxy_namespace, config.model_proxy_pod_labels)],
                      "ports": [{"protocol": "TCP", "port": config.model_proxy_port}]},
                     _dns_rule()]},
    }
