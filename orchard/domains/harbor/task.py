"""The Harbor task model: one task directory of Harbor's format, read with the stdlib.

    my-task/
      task.toml          [environment] (docker_image, network_mode, cpus, memory_mb, storage_mb,
                         workdir, env), [agent] timeout_sec, [verifier] timeout_sec and env,
                         [solution] env, [metadata]
      instruction.md     what the agent is asked
      environment/       Dockerfile (built by Orchard's builder), or files for a named image
      tests/test.sh      writes /logs/verifier/reward.txt (a number) or reward.json
      solution/solve.sh  the oracle solution

A dataset is a directory of task directories. Harbor's own CLI runs the same directories on
Orchard through ``orchard.integrations.harbor`` (docs/guides/harbor.md).
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from orchard.integrations.harbor.images import COMPOSE_FILE, has_dockerfile, image_name
from orchard.tasks.images import ImageBuild
from orchard.tasks.protocol import INSTANCE_ID_PATTERN, SandboxSpec, Submission, TaskLoadError

if TYPE_CHECKING:
    from orchard.domains.harbor.grading import HarborGrade
    from orchard.env.client import Sandbox, SandboxClient

TASK_FILE = "task.toml"
NetworkMode = Literal["no-network", "public", "allowlist"]
# Harbor's env templates: "${VAR}" or "${VAR:-default}", resolved from the host's env.
_TEMPLATE = re.compile(r"\$\{([^}:]+)(?::-(.*))?\}")


class HarborBudget(BaseModel):
    model_config = ConfigDict(extra="forbid")

    steps: int = 100
    wall_time: float = Field(600.0, gt=0, description="The agent's timeout_sec.")


class HarborTask(BaseModel):
    """A Harbor task: an instruction, a sandbox image, tests that write a reward, an oracle
    solution. Judged in the rollout's own sandbox, by its tests."""

    model_config = ConfigDict(extra="forbid")
    graded_in_rollout: ClassVar[bool] = True

    instance_id: str = Field(pattern=INSTANCE_ID_PATTERN)
    domain: Literal["harbor"] = "harbor"
    path: str = Field(description="The task directory, absolute.")
    instruction: str = Field(min_length=1)
    image: str = Field(description="[environment] docker_image, or the name its Dockerfile "
                       "is built under (harbor/<task>).")
    build: bool = Field(description="The image is built from environment/Dockerfile (when the "
                        "task names no docker_image).")
    network_mode: NetworkMode = "public"
    allowed_hosts: list[str] = Field(default_factory=list)
    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    workdir: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    solution_env: dict[str, str] = Field(default_factory=dict)
    verifier_env: dict[str, str] = Field(default_factory=dict)
    verifier_timeout: float = 600.0
    budget: HarborBudget = Field(default_factory=HarborBudget)
    metadata: dict[str, Any] = Field(default_factory=dict)
    split: str | None = None

    @property
    def prompt(self) -> str:
        return self.instruction

    @property
    def environment_dir(self) -> Path:
        return Path(self.path) / "environment"

    @property
    def tests_dir(self) -> Path:
        return Path(self.path) / "tests"

    @property
    def solution_dir(self) -> Path:
        return Path(self.path) / "solution"

    def sandbox_spec(self) -> SandboxSpec:
        # An allow-list is Harbor's provider's to enforce (docs/guides/harbor.md); a sandbox
        # from this spec has the public network, as the task's sandbox spec has no egress.
        # A Dockerfile is built (or found in the build cache) before each sandbox; its RUN steps
        # have no network, as for any build that does not ask for it.
        image = (ImageBuild(build=self.environment_dir, tag=self.image) if self.build
                 else self.image)
        return SandboxSpec(image=image, block_network=self.network_mode == "no-network",
                           env=resolve_env(self.env) or None, served=True)

    def set_up(self, sandbox: Sandbox) -> None:
        from orchard.domains.harbor.grading import set_up

        set_up(sandbox, self)

    def grade(self, client: SandboxClient, submission: Submission, *,
              labels: dict[str, str] | None = None) -> HarborGrade:
        from orchard.domains.harbor.grading import run_tests

        return run_tests(submission.live_sandbox(self), self)


def resolve_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with Harbor's ``${VAR}`` / ``${VAR:-default}`` values read from this process's
    environment; a ValueError names a variable that is unset and has no default."""
    out = {}
    for key, value in env.items():
        match = _TEMPLATE.fullmatch(value)
        if match is None:
            out[key] = value
        elif match[1] in os.environ or match[2] is not None:
            out[key] = os.environ.get(match[1], match[2] or "")
        else:
            raise ValueError(f"{key}={value}: set {match[1]} in the environment")
    return out


def is_task_dir(path: Path) -> bool:
    return (path / TASK_FILE).is_file()


def task_dirs(path: Path) -> list[Path]:
    """The task directory ``path``, or the task directories in a dataset directory ``path``."""
    if is_task_dir(path):
        return [path]
    return sorted(p for p in path.iterdir() if p.is_dir() and is_task_dir(p))


def read_task(path: Path) -> HarborTask:
    """One task directory as a HarborTask; TaskLoadError says which file is wrong and why."""
    try:
        config = tomllib.loads((path / TASK_FILE).read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise TaskLoadError(f"{path / TASK_FILE}: {e}") from None
    missing = [name for name in ("instruction.md", "tests/test.sh") if not (path / name).is_file()]
    if missing:
        raise TaskLoadError(f"Harbor task {path} has no {' or '.join(missing)}")
    if config.get("steps"):
        raise TaskLoadError(f"{path / TASK_FILE}: multi-step tasks ([[steps]]) run with "
                            "Harbor's CLI on Orchard (docs/guides/harbor.md), not as a task set")
    environment = config.get("environment", {})
    env_dir = path / "environment"
    docker_image = environment.get("docker_image")
    if (env_dir / COMPOSE_FILE).exists() and not has_dockerfile(env_dir):
        raise TaskLoadError(f"{env_dir / COMPOSE_FILE}: Orchard runs one container per "
                            "sandbox; give the task an environment/Dockerfile or docker_image")
    if not docker_image and not has_dockerfile(env_dir):
        raise TaskLoadError(f"Harbor task {path} has neither environment/Dockerfile nor "
                            "[environment] docker_image")
    network = environment.get("network_mode")
    if network is None and environment.get("allow_internet") is not None:  # Harbor's old key
        network = "public" if environment["allow_internet"] else "no-network"
    agent, verifier = config.get("agent", {}), config.get("verifier", {})
    try:
        return HarborTask(
            instance_id=path.name, path=str(path.resolve()),
            instruction=(path / "instruction.md").read_text(),
            # Harbor too prefers a named image to building the Dockerfile beside it.
            image=docker_image or image_name(path.name),
            build=not docker_image, network_mode=network or "public",
            allowed_hosts=environment.get("allowed_hosts") or [],
            cpus=environment.get("cpus"), memory_mb=environment.get("memory_mb"),
            storage_mb=environment.get("storage_mb"), workdir=environment.get("workdir"),
            env=environment.get("env", {}), solution_env=config.get("solution", {}).get("env", {}),
            verifier_env=verifier.get("env", {}),
            verifier_timeout=verifier.get("timeout_sec", 600.0),
            budget=HarborBudget(wall_time=agent.get("timeout_sec") or 600.0),
            metadata=config.get("metadata", {}))
    except ValueError as e:  # pydantic's, with the field that is wrong
        raise TaskLoadError(f"{path / TASK_FILE}: {e}") from None
