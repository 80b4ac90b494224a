"""Settings of the Kubernetes backend: the `kubernetes:` section of the orchestrator's config."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from orchard.version import __version__

AGENT_PORT = 9090
# The writable state a snapshot keeps by default: work, home directories and scratch space.
SNAPSHOT_PATHS = ["/workspace", "/root", "/home", "/tmp", "/testbed"]


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

    @field_validator("snapshot_paths")
    @classmethod
    def _absolute_paths(cls, paths: list[str]) -> list[str]:
        bad = [p for p in paths if not p.startswith("/") or p.rstrip("/") == ""]
        if bad or not paths:
            raise ValueError(f"snapshot_paths must be absolute paths other than '/', got "
                             f"{bad or paths}; e.g. [/workspace, /root]")
        return paths
