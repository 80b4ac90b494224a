"""What the Kubernetes backend asks the API server for: sandbox pods and network policies.

Pure functions of the spec and the config, so they can be read, diffed and validated offline.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Iterable
from typing import Any

from orchard.env.agent.bundle import BUNDLE_MOUNT, agent_command
from orchard.env.backends.base import SandboxSpec
from orchard.env.backends.kubernetes.config import KubernetesConfig, covering_block
from orchard.env.schema import IPNetwork

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
# The limits a sandbox may ask for, by the resource names of the pod spec.
LIMIT_NAMES = {"cpu": "cpu", "memory": "memory", "disk": "ephemeral-storage"}


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
    asked = {"cpu": spec.cpu, "memory": spec.memory, "disk": spec.disk}
    resources = {LIMIT_NAMES[k]: v for k, v in asked.items() if v is not None}
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
            # Its own user namespace: sandbox root is an unprivileged uid of the node. (This
            # rules out hostNetwork, hostPID and hostIPC, which sandbox pods never set.)
            **({} if config.host_users else {"hostUsers": False}),
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


def _ip_block(network: IPNetwork, excepted: Iterable[IPNetwork]) -> dict[str, Any]:
    """``network`` minus the excepted ranges inside it. The API server takes only strict
    subsets of ``cidr`` in ``except``, of the same family."""
    inside = [e for e in excepted if e.version == network.version and e != network
              and e.subnet_of(network)]
    block: dict[str, Any] = {"cidr": str(network)}
    if inside:
        block["except"] = [str(n) for n in ipaddress.collapse_addresses(inside)]
    return block


def allow_egress_policy(spec: SandboxSpec, config: KubernetesConfig) -> dict[str, Any]:
    """The one extra object a block_network=false sandbox costs; deleted with it.

    Without an allow-list: ``egress_cidr`` minus the private, shared and link-local ranges
    (cluster pods and services, the nodes, cloud metadata) and ``blocked_egress``, plus
    cluster DNS. With one: its addresses and networks minus ``blocked_egress`` (so 0.0.0.0/0
    opens everything but the blocked ranges), plus DNS. Host names cannot be expressed in a
    NetworkPolicy, and an entry inside a blocked range opens nothing: the backend refuses
    both before this is built.
    """
    blocked = config.blocked_networks()
    if spec.egress is None:
        private = [ipaddress.ip_network(r) for r in PRIVATE_RANGES]
        blocks = [_ip_block(ipaddress.ip_network(config.egress_cidr), [*private, *blocked])]
    else:
        wanted = [ipaddress.ip_network(e) for e in spec.egress]
        blocks = [_ip_block(n, blocked) for n in wanted if covering_block(n, blocked) is None]
    peers = [{"ipBlock": block} for block in blocks]
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
