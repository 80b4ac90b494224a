"""Orchestrator settings: keyword arguments of `build_app` / `EmbeddedOrchestrator`; the common
ones are also `orchard serve` options (API keys also come from ORCHARD_API_KEYS)."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs
from pydantic import BaseModel, Field, field_validator

from orchard.env.agent.client import (
    DEFAULT_MAX_DOWNLOAD_BYTES,
    DEFAULT_MAX_RESPONSE_BYTES,
    AgentLimits,
)
from orchard.env.backends.kubernetes.config import KubernetesConfig
from orchard.env.images_config import ImagesConfig, RegistryCredentials
from orchard.http_guard import LOOPBACK_HOSTS, host_patterns, origin_patterns

__all__ = ["ImagesConfig", "PoolEntry", "RegistryCredentials", "Settings", "default_data_dir"]


def default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("orchard"))


class PoolEntry(BaseModel):
    """One warm pool: ``size`` sandboxes of this shape kept ready. A create takes one when it
    asks for the same image, resources and network mode and nothing a running sandbox cannot
    take on afterwards (see docs/guides/pools.md)."""

    model_config = {"extra": "forbid"}

    name: str = Field("", pattern=r"^[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?$|^$",
                      description="The pool's name (its metrics' label); default pool-<index>.")
    image: str = "host"
    size: int = Field(1, ge=0)
    cpu: str | None = None
    memory: str | None = None
    pids: int | None = None
    disk: str | None = None
    block_network: bool = True  # a create's default
    egress: list[str] | None = None
    labels: dict[str, str] = Field(
        default_factory=dict, description="Labels its sandboxes carry (a create's own win).")


class Settings(BaseModel):
    data_dir: Path = Field(default_factory=default_data_dir)
    cache_dir: Path | None = Field(
        None, description="Where the local backend keeps its agent bundle and unpacked images "
        "(default <data_dir>/local); several data dirs may share one.")
    state: str | None = Field(
        None, description="sqlite:///PATH (default <data_dir>/state.db) or redis://HOST:PORT/DB "
        "(several replicas sharing state)")
    backend: str = Field("local", description="local or kubernetes")
    kubernetes: KubernetesConfig = Field(default_factory=KubernetesConfig)
    images: ImagesConfig = Field(default_factory=ImagesConfig)
    pools: list[PoolEntry] = Field(
        default_factory=list, description="Warm pools: sandboxes kept ready for the creates "
        "that match them (docs/guides/pools.md).")
    pool_interval: float | None = Field(
        None, gt=0, description="Seconds between passes of the pool refill loop (a take also "
        "starts one). Default: reconcile_interval.")
    api_keys: list[str] = Field(default_factory=list)
    allowed_hosts: list[str] | None = Field(
        None, description="Host names (the Host header, any port) the API answers: a name, an "
        "address, '*.example.com' or '*'. Default: without API keys, the loopback names "
        "127.0.0.1, localhost and ::1 (a DNS-rebinding page gets nothing); with keys, any host "
        "(a page cannot know a key, and a cluster reaches the orchestrator by its Service "
        "name).")
    allowed_origins: list[str] = Field(
        default_factory=list, description="Browser origins (scheme://host[:port], or '*') "
        "whose pages may call the API, WebSocket included. Requests without an Origin header "
        "(SDK, CLI, curl) and the server's own pages (/docs) need none.")
    max_sandboxes: int = Field(2000, ge=1)
    max_concurrent_creates: int = Field(64, ge=1)
    default_ttl: float = Field(7200, gt=0, description="Seconds a sandbox lives by default.")
    snapshot_ttl: float = Field(86400, gt=0, description="Seconds a snapshot is kept by default.")
    max_snapshot_bytes: int = Field(
        10 << 30, ge=0, description="The most a sandbox may have written over its image (and "
        "over the snapshot it started from) to be snapshotted.")
    heartbeat_timeout: float = Field(180, gt=0, description="Only for sandboxes that beat once.")
    pending_timeout: float = Field(120, gt=0)
    reconcile_interval: float = Field(
        5, gt=0, description="Seconds between passes of the sandbox reconcile loop (expiry, "
        "adoption, vanished sandboxes, orphans; the replica's beat); the default period of "
        "the other loops.")
    job_reconcile_interval: float | None = Field(
        None, gt=0, description="Seconds between passes that fail the unfinished jobs of "
        "replicas gone. Default: reconcile_interval.")
    snapshot_reconcile_interval: float | None = Field(
        None, gt=0, description="Seconds between passes of the snapshot collector (expired "
        "snapshots, unused files of deleted ones, orphan files). Default: reconcile_interval.")
    prune_interval: float | None = Field(
        None, gt=0, description="Seconds between prunes of the store (records and jobs past "
        "retention, events past event_retention). Default: reconcile_interval.")
    reconcile_max_backoff: float = Field(
        60, gt=0, description="Longest wait before a reconcile loop retries after failed "
        "passes in a row (each failure doubles its wait from the loop's period).")
    retention: float = Field(3600, gt=0, description="Seconds deleted records and jobs are kept.")
    event_retention: float = Field(
        7 * 24 * 3600, gt=0, description="Seconds sandbox events (the trace) are kept.")
    event_content_bytes: int = Field(
        1 << 20, ge=0, description="Largest file/stdin content an event keeps for replay; "
        "bigger ones keep only size and sha256.")
    model_proxy: str | None = Field(
        None, description="URL of the recording proxy that model_proxy sandboxes may reach: as "
        "the orchestrator's host reaches it (local) or as pods do (kubernetes).")
    agent_timeout: float = Field(
        30, gt=0, description="Seconds the orchestrator waits for a sandbox agent's answer "
        "(an exec waits its own timeout plus this).")
    egress_refresh: float = Field(
        30, gt=0, description="Seconds between re-resolutions of the host names in sandboxes' "
        "egress allow-lists (local backend).")
    exec_wait_margin: float = Field(
        30, gt=0, description="A blocking exec answers by its timeout plus this, finished or "
        "not; an unfinished one answers {job_id, status} for the client to follow.")
    allow_io_uring: bool = Field(
        False, description="Let local sandboxes use io_uring (refused by their seccomp filter "
        "by default: its work runs outside the filter's view).")
    max_json_body: int = Field(64 << 20, description="Largest JSON request body, bytes.")
    max_upload_bytes: int = Field(8 << 30, description="Largest raw upload, bytes.")
    # What an agent sends is read against these, never against the sizes it declares: it runs
    # in the sandbox, so a broken or compromised one could send without end.
    agent_max_response_bytes: int = Field(
        DEFAULT_MAX_RESPONSE_BYTES, ge=4096, description="Largest answer read from a sandbox's "
        "agent (its JSON, an error's message), bytes; an exec's may be up to twelve times its "
        "max_output_bytes when that is more. Over it the call fails with 502.")
    max_download_bytes: int = Field(
        DEFAULT_MAX_DOWNLOAD_BYTES, ge=0, description="Largest file streamed out of a sandbox "
        "(and, beyond its max_bytes, a Kubernetes snapshot archive), bytes: 413 up front when "
        "the agent gives the size, else the transfer is cut there.")

    @field_validator("pools")
    @classmethod
    def _pool_names(cls, value: list[PoolEntry]) -> list[PoolEntry]:
        named = [e.model_copy(update={"name": e.name or f"pool-{i}"}) for i, e in enumerate(value)]
        names = [e.name for e in named]
        if len(set(names)) != len(names):
            raise ValueError(f"pool names must differ: {names}")
        return named

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else host_patterns(value)

    @field_validator("allowed_origins")
    @classmethod
    def _origins(cls, value: list[str]) -> list[str]:
        return origin_patterns(value)

    def hosts(self) -> list[str]:
        """The host names the API answers (``allowed_hosts``, or its default)."""
        if self.allowed_hosts is not None:
            return self.allowed_hosts
        return ["*"] if self.api_keys else list(LOOPBACK_HOSTS)

    def loop_periods(self) -> dict[str, float]:
        """Each reconcile loop's period, by the loop's name (its metrics' label)."""
        default = self.reconcile_interval
        return {"sandboxes": default, "jobs": self.job_reconcile_interval or default,
                "snapshots": self.snapshot_reconcile_interval or default,
                "prune": self.prune_interval or default,
                "pools": self.pool_interval or default}

    def state_url(self) -> str:
        return self.state or f"sqlite:///{self.data_dir / 'state.db'}"

    def docker_config(self) -> Path | None:
        """The docker config.json that logs in to registries, if there is one."""
        if self.images.docker_config is not None:
            return self.images.docker_config
        base = os.environ.get("DOCKER_CONFIG")
        path = Path(base) / "config.json" if base else Path.home() / ".docker" / "config.json"
        return path if path.is_file() else None

    def image_dir(self) -> Path:
        return self.images.dir or self.data_dir / "images"

    def agent_limits(self) -> AgentLimits:
        return AgentLimits(max_response_bytes=self.agent_max_response_bytes,
                           max_download_bytes=self.max_download_bytes)
