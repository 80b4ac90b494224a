"""Settings of the Kubernetes backend: the `kubernetes:` section of the orchestrator's config."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from orchard.env.schema import IPNetwork
from orchard.version import __version__

AGENT_PORT = 9090
# The writable state a snapshot keeps by default: work, home directories and scratch space.
SNAPSHOT_PATHS = ["/workspace", "/root", "/home", "/tmp", "/testbed"]
# Link-local: the cloud metadata service (169.254.169.254) hands out the node's credentials.
BLOCKED_EGRESS = ["169.254.0.0/16"]


def covering_block(network: IPNetwork, blocked: Iterable[IPNetwork]) -> IPNetwork | None:
    """The blocked range that holds all of ``network``, if one does. CIDR blocks are nested or
    disjoint, so any other blocked range that overlaps it lies strictly inside it."""
    return next((b for b in blocked
                 if b.version == network.version and network.subnet_of(b)), None)


class KubernetesConfig(BaseModel):
    namespace: str = Field("orchard-sandboxes", description="Where every sandbox pod goes.")
    kubeconfig: str | None = Field(
        None, description="Path of a kubeconfig; default: in-cluster service account when "
        "running in a pod, else the usual ~/.kube/config.")
    context: str | None = None
    agent_image: str = Field(
        f"ghcr.io/orchard-project/orchard-agent-injector:{__version__}",
        description="Image holding the agent bundle at /.orchard/bundle (see deploy/docker).")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    agent_port: int = Field(AGENT_PORT, ge=1, le=65535)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    runtime_class: str | None = Field(None, description="e.g. gvisor or kata.")
    image_pull_secrets: list[str] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict, description="Extra pod labels.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Extra annotations.")
    add_capabilities: list[str] = Field(
        default_factory=list, description="Added back after dropping ALL (e.g. CHOWN).")
    egress_cidr: str = Field("0.0.0.0/0", description="Where block_network=false pods may go.")
    blocked_egress: list[str] = Field(
        default_factory=lambda: list(BLOCKED_EGRESS),
        description="Addresses and CIDR networks no sandbox may reach, whatever its egress "
        "allow-list says: the nodes, load balancers, the API server, cloud metadata. Cut out "
        "of every egress policy; an allow-list entry inside one is refused (400).")
    host_users: bool = Field(
        False, description="False: each sandbox pod gets its own user namespace "
        "(hostUsers: false), so its root is an unprivileged uid of the node. Needs Kubernetes "
        ">= 1.33 (or the UserNamespacesSupport feature gate), Linux >= 6.3, containerd >= 2.0 "
        "or CRI-O >= 1.25. True: pods share the node's user namespace (clusters without it).")
    model_proxy_namespace: str = Field(
        "orchard-system", description="Namespace of the recording proxy's pods, which "
        "model_proxy sandboxes may reach (the orchestrator's model_proxy URL names its Service).")
    model_proxy_pod_labels: dict[str, str] = Field(
        default_factory=lambda: {"app.kubernetes.io/name": "orchard-proxy"},
        description="Labels selecting the recording proxy's pods.")
    model_proxy_port: int = Field(8080, ge=1, le=65535,
                                  description="The proxy pods' container port.")
    agent_secret: str | None = Field(
        None, description="HMAC key deriving each sandbox's agent token; every replica needs "
        "the same one. Prefer the ORCHARD_AGENT_SECRET environment variable.")
    max_api_concurrency: int = Field(32, ge=1, description="API calls in flight per replica.")
    api_retries: int = Field(5, ge=0, description="Retries on 429, 5xx and timeouts.")
    api_timeout: float = Field(30, gt=0, description="Seconds per API call.")
    watch_timeout: int = Field(300, ge=1, description="Seconds before a watch is renewed.")
    ready_timeout: float = Field(600, gt=0, description="Seconds a pod may take to be ready.")
    snapshot_dir: str | None = Field(
        None, description="Directory where snapshots are kept, one tar per snapshot: a volume "
        "mounted into the orchestrator's pod (ReadWriteMany when there are several replicas, "
        "since any replica may restore what another took). Unset: no snapshots or forks.")
    snapshot_paths: list[str] = Field(
        default_factory=lambda: list(SNAPSHOT_PATHS),
        description="The absolute paths a snapshot keeps. Unlike the local backend, which keeps "
        "every file a sandbox wrote, files outside these paths are not kept on Kubernetes.")
    snapshot_timeout: float = Field(
        300, gt=0, description="Seconds the agent may stay silent while it archives or "
        "restores a snapshot (it walks the paths before it answers).")

    @field_validator("blocked_egress")
    @classmethod
    def _networks(cls, entries: list[str]) -> list[str]:
        networks = []
        for entry in entries:
            try:
                networks.append(str(ipaddress.ip_network(entry.strip(), strict=False)))
            except ValueError:
                raise ValueError(f"blocked_egress entry {entry!r} is not an IP address or CIDR "
                                 "network, e.g. 10.128.0.0/20 or 203.0.113.7") from None
        return networks

    @model_validator(mode="after")
    def _egress_cidr_is_open(self) -> KubernetesConfig:
        try:
            cidr = ipaddress.ip_network(self.egress_cidr)
        except ValueError:
            raise ValueError(f"egress_cidr {self.egress_cidr!r} is not a CIDR network with no "
                             "host bits set, e.g. 0.0.0.0/0") from None
        blocked = covering_block(cidr, self.blocked_networks())
        if blocked is not None:
            raise ValueError(f"egress_cidr {cidr} lies inside blocked_egress {blocked}: "
                             "networked sandboxes would reach nothing; widen egress_cidr or "
                             "narrow the blocked range")
        return self

    def blocked_networks(self) -> list[IPNetwork]:
        return [ipaddress.ip_network(b) for b in self.blocked_egress]

    @field_validator("snapshot_paths")
    @classmethod
    def _absolute_paths(cls, paths: list[str]) -> list[str]:
        bad = [p for p in paths if not p.startswith("/") or p.rstrip("/") == ""]
        if bad or not paths:
            raise ValueError(f"snapshot_paths must be absolute paths other than '/', got "
                             f"{bad or paths}; e.g. [/workspace, /root]")
        return paths
