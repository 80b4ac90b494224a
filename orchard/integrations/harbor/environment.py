"""Harbor's environment provider for Orchard: Harbor's own CLI runs each trial in an Orchard
sandbox, on whichever backend the orchestrator runs (local namespaces or Kubernetes).

    harbor run --path DATASET --agent oracle \\
        --env orchard.integrations.harbor.environment:OrchardEnvironment \\
        [--ek orchard_url=http://127.0.0.1:8000] [--ek orchard_api_key=...]

The orchestrator is ``orchard_url`` (else ``ORCHARD_URL``), its key ``orchard_api_key`` (else
``ORCHARD_API_KEY``). A task's environment/Dockerfile is built by Orchard's Dockerfile builder
as ``harbor/<task>`` (its step cache makes a rebuild of unchanged files run nothing; RUN steps
reach the network only with ``--ek build_network=true``); a task's ``docker_image`` is used by
name (a registry reference, pulled once). The
task's cpus, memory_mb and storage_mb become the sandbox's limits; its network policy becomes
no network, the public internet, or an egress allow-list. Needs orchard's ``harbor`` extra.
"""

from __future__ import annotations

from orchard.extras import require

require("harbor")  # before anything of Python >= 3.12, which Harbor needs too

import shlex
import tempfile
import uuid
from pathlib import Path
from typing import Any, override

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import (
    EnvironmentCapabilities,
    EnvironmentResourceCapabilities,
)
from harbor.environments.definition import should_use_prebuilt_docker_image
from harbor.environments.tar_transfer import pack_dir_to_file, remote_unpack_command
from harbor.models.task.config import NetworkMode, NetworkPolicy

from orchard.env.client import AsyncSandbox, AsyncSandboxClient
from orchard.env.client.base import resolve_config
from orchard.integrations.harbor.images import (
    COMPOSE_FILE,
    build_environment,
    has_dockerfile,
    image_name,
)

# Orchard's longest exec; Harbor bounds its phases itself (it cancels the await).
MAX_EXEC_SECONDS = 24 * 3600
ROOT_USERS = (None, "root", 0, "0")


class OrchardEnvironment(BaseEnvironment):
    """One Orchard sandbox per Harbor environment: started from the task's image, deleted on
    stop (unless Harbor runs with ``--no-delete``, when it lives until its ttl)."""

    def __init__(self, environment_dir: Path, environment_name: str, session_id: str,
                 trial_paths: Any, task_env_config: Any, *args: Any,
                 orchard_url: str | None = None, orchard_api_key: str | None = None,
                 ttl: float | None = None, ready_timeout: float = 120.0,
                 build_network: bool | str = False, **kwargs: Any) -> None:
        super().__init__(environment_dir, environment_name, session_id, trial_paths,
                         task_env_config, *args, **kwargs)
        self._url, self._api_key = resolve_config(orchard_url, orchard_api_key)
        self._ttl = float(ttl) if ttl is not None else None
        self._ready_timeout = float(ready_timeout)
        # --ek values arrive as text. Docker builds with the network on; Orchard's RUN steps
        # have none unless asked, as for any sandbox.
        self._build_network = str(build_network).lower() in ("true", "1", "yes")
        self._client: AsyncSandboxClient | None = None
        self._sandbox: AsyncSandbox | None = None

    @staticmethod
    @override
    def type() -> str:
        return "orchard"

    @property
    @override
    def capabilities(self) -> EnvironmentCapabilities:
        # An allow-list takes addresses, networks and exact host names (re-resolved while the
        # sandbox lives); the policy is fixed when the sandbox starts.
        return EnvironmentCapabilities(
            disable_internet=True, network_allowlist=True, network_allowlist_hostnames=True,
            network_allowlist_ipv4_addresses=True, network_allowlist_ipv6_addresses=True,
            network_allowlist_ipv4_cidrs=True, network_allowlist_ipv6_cidrs=True)

    @classmethod
    @override
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities:
        # cgroup limits on the local backend, pod limits on Kubernetes.
        return EnvironmentResourceCapabilities(cpu_limit=True, memory_limit=True,
                                               fractional_cpus=True)

    @override
    def _validate_definition(self) -> None:
        docker_image = self.task_env_config.docker_image
        if docker_image or has_dockerfile(self.environment_dir):
            return
        compose = self.environment_dir / COMPOSE_FILE
        raise FileNotFoundError(
            f"{compose} is a multi-container environment; Orchard runs one container per "
            "sandbox: give the task an environment/Dockerfile or [environment] docker_image"
            if compose.exists() else
            f"{self.environment_dir} has no Dockerfile and the task names no docker_image")

    # --- lifecycle ---

    @override
    async def start(self, force_build: bool) -> None:
        self._client = AsyncSandboxClient(self._url, api_key=self._api_key)
        image = self.task_env_config.docker_image
        if not should_use_prebuilt_docker_image(self.environment_dir, docker_image=image,
                                                force_build=force_build):
            image = await build_environment(
                self._client, self.environment_dir, image_name(self.environment_name),
                force=force_build, network=self._build_network,
                step_timeout=self.task_env_config.build_timeout_sec)
        self._sandbox = await self._client.create_sandbox(
            image, **self._sandbox_options(self.network_policy), env=self._startup_env(),
            labels={"harbor.session": self.session_id[:63]}, ttl=self._ttl,
            timeout=self._ready_timeout)
        self.logger.debug(f"sandbox {self._sandbox.id} of {image} on {self._url}")
        await self.ensure_dirs(self._mount_targets(writable_only=True))
        await self._upload_environment_dir_after_start()

    def _sandbox_options(self, policy: NetworkPolicy) -> dict[str, Any]:
        """The task's limits and network policy as create_sandbox's arguments."""
        options: dict[str, Any] = {"block_network": policy.network_mode == NetworkMode.NO_NETWORK}
        if policy.network_mode == NetworkMode.ALLOWLIST:
            options["egress"] = list(policy.allowed_hosts)
        if (cpus := self._effective_cpus) is not None:
            options["cpu"] = f"{round(cpus * 1000)}m"
        if (memory := self._effective_memory_mb) is not None:
            options["memory"] = f"{memory}Mi"
        if (storage := self._effective_storage_mb) is not None:
            options["disk"] = f"{max(storage, 16)}Mi"  # Orchard's smallest disk quota
        return options

    @override
    async def stop(self, delete: bool) -> None:
        client, sandbox = self._client, self._sandbox
        self._client = self._sandbox = None
        if client is None:
            return
        if sandbox is not None and not delete:
            # Kept for a look (harbor run --no-delete); the orchestrator ends it at its ttl.
            self.logger.info(f"keeping sandbox {sandbox.id} on {self._url}")
            client._forget(sandbox.id)
        await client.close()  # deletes the sandbox it created, unless kept

    # --- commands ---

    def _live(self) -> AsyncSandbox:
        if self._sandbox is None:
            raise RuntimeError(f"environment {self.session_id} has no sandbox: start it first")
        return self._sandbox

    @override
    async def exec(self, command: str, cwd: str | None = None,
                   env: dict[str, str] | None = None, timeout_sec: int | None = None,
                   user: str | int | None = None) -> ExecResult:
        user = self._resolve_user(user)
        if user not in ROOT_USERS:
            # Sandbox commands run as the sandbox's root, without capabilities: no su.
            raise ValueError(f"Orchard runs commands as the sandbox's root user; the task asks "
                             f"for user {user!r}: leave [agent]/[verifier] user unset")
        result = await self._live().exec(
            command, cwd=cwd or self.task_env_config.workdir, env=self._merge_env(env),
            timeout=min(timeout_sec or MAX_EXEC_SECONDS, MAX_EXEC_SECONDS))
        if result.timed_out:
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds")
        return ExecResult(stdout=result.stdout, stderr=result.stderr,
                          return_code=result.exit_code if result.exit_code is not None else -1)

    # --- files ---

    @override
    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        await self._live().upload_file(source_path, target_path)

    @override
    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        # One archive keeps modes, links and empty directories (Harbor's tar_transfer).
        staged = f"/tmp/.harbor-upload-{uuid.uuid4().hex}.tar.gz"
        with tempfile.TemporaryDirectory() as tmp:
            archive = Path(tmp) / "upload.tar.gz"
            pack_dir_to_file(source_dir, archive)
            await self._live().upload_file(archive, staged)
        result = await self.exec(f"{remote_unpack_command(staged, target_dir)} --no-same-owner; "
                                 f"status=$?; rm -f {shlex.quote(staged)}; exit $status",
                                 user="root")
        if result.return_code != 0:
            raise RuntimeError(f"could not unpack {source_dir} into {target_dir}: "
                               f"{result.stderr or result.stdout}")

    @override
    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        Path(target_path).parent.mkdir(parents=True, exist_ok=True)
        await self._live().download_file(source_path, target_path)

    @override
    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        # Harbor's tar-through-the-sandbox transfer, with nothing excluded.
        await self.download_dir_with_exclusions(source_dir=source_dir, target_dir=target_dir,
                                                exclude=[])

