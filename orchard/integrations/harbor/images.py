"""A Harbor task's sandbox image: the image its ``task.toml`` names (``docker_image``), or its
``environment/Dockerfile`` built by Orchard's Dockerfile builder under a name made from the
directory's content, so an unchanged environment is built once and an edited one again."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from orchard.env.client import AsyncSandboxClient, SandboxClient

DOCKERFILE = "Dockerfile"
# Where Harbor looks for a multi-container environment; Orchard runs one container per sandbox.
COMPOSE_FILE = "docker-compose.yaml"
# Names of files a content hash leaves out: they change without changing the environment.
_IGNORED = frozenset({".DS_Store", ".git", "__pycache__"})


def content_hash(directory: Path) -> str:
    """sha256 over every file's path, mode and bytes, in path order (links by their target)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if not _IGNORED & set(p.parts)):
        rel = path.relative_to(directory).as_posix().encode()
        if path.is_symlink():
            body = b"link:" + str(path.readlink()).encode()
        elif path.is_file():
            body = b"file:%o:" % (path.stat().st_mode & 0o777) + path.read_bytes()
        else:
            continue
        digest.update(len(rel).to_bytes(4, "big") + rel)
        digest.update(hashlib.sha256(body).digest())
    return digest.hexdigest()


def built_image_name(task_name: str, environment_dir: Path) -> str:
    """``harbor/<task>:<content hash>``: the name a task's Dockerfile is built under."""
    slug = re.sub(r"[^a-z0-9]+", "-", task_name.lower()).strip("-") or "task"
    return f"harbor/{slug}:{content_hash(environment_dir)[:16]}"


def has_dockerfile(environment_dir: Path) -> bool:
    return (environment_dir / DOCKERFILE).is_file()


async def ensure_image(client: AsyncSandboxClient, environment_dir: Path, name: str, *,
                       force: bool = False, timeout: float | None = None) -> None:
    """Build ``environment_dir``'s Dockerfile as ``name`` unless a build made it already."""
    raise NotImplementedError("waiting for the Dockerfile builder (issue 31, section 2)")


def ensure_image_sync(client: SandboxClient, environment_dir: Path, name: str, *,
                      build: bool, force: bool = False, timeout: float | None = None) -> None:
    """``ensure_image`` with the blocking client; nothing to do for a named image."""
    if build:
        raise NotImplementedError("waiting for the Dockerfile builder (issue 31, section 2)")
