"""A Harbor task's sandbox image: the image its ``task.toml`` names (``docker_image``), or its
``environment/Dockerfile`` built by Orchard's Dockerfile builder (``orchard.env.build``) and
tagged ``harbor/<task>``. The builder's step cache makes a second build of an unchanged
environment run no step, so every trial may ask for the build."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from orchard.env.build import build_image_async
from orchard.env.client import AsyncSandboxClient

DOCKERFILE = "Dockerfile"
# Where Harbor looks for a multi-container environment; Orchard runs one container per sandbox.
COMPOSE_FILE = "docker-compose.yaml"

# Concurrent trials of one task in one process wait for one build instead of racing to tag.
_building: dict[tuple[str, Path], asyncio.Lock] = {}


def image_name(task_name: str) -> str:
    """``harbor/<task>``: the name a task's Dockerfile is built under (Docker-style: lower case,
    ``-`` for anything else)."""
    slug = re.sub(r"[^a-z0-9]+", "-", task_name.lower()).strip("-") or "task"
    return f"harbor/{slug}"


def has_dockerfile(environment_dir: Path) -> bool:
    return (environment_dir / DOCKERFILE).is_file()


async def build_environment(client: AsyncSandboxClient, environment_dir: Path, name: str, *,
                            force: bool = False, network: bool = False,
                            step_timeout: float = 3600.0) -> str:
    """Build ``environment_dir``'s Dockerfile as ``name`` (every step again with ``force``);
    returns the name. RUN steps get the public network only with ``network``."""
    key = (client.base_url, environment_dir.resolve())
    lock = _building.setdefault(key, asyncio.Lock())
    async with lock:
        built = await build_image_async(client, environment_dir, tag=name, no_cache=force,
                                        network=network, step_timeout=step_timeout)
    return built.name
