"""A task's image built from a Dockerfile: ``image: {build: DIR}`` in a task file.

The build context is relative to the task's file. It is built (cached: a second build of
unchanged files runs no step) right before each sandbox of the task is created, so every
sandbox gets the image as its Dockerfile says now. Concurrent rollouts of one task wait for
one build rather than each running the same steps.
"""

from __future__ import annotations

import threading
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from orchard.env.build import build_image
from orchard.env.client import SandboxClient


class ImageBuild(BaseModel):
    """A Dockerfile build to make a task's image from (see docs/guides/dockerfiles.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    build: Path = Field(description="The build context, relative to the task's file.")
    dockerfile: str = Field("Dockerfile", description="Relative to the build context.")
    args: dict[str, str] = Field(default_factory=dict, description="Build args (ARG values).")
    network: bool = Field(False, description="Let RUN reach the public internet.")
    egress: list[str] | None = Field(None, description="Let RUN reach only these.")
    tag: str | None = Field(None, description="Name the image (default: named by its key).")

    def resolved(self, base: Path) -> ImageBuild:
        return self if self.build.is_absolute() else self.model_copy(
            update={"build": (base / self.build).resolve()})

    def __str__(self) -> str:
        return f"build:{self.build}"


TaskImage = str | ImageBuild
_locks: dict[tuple[str, ...], threading.Lock] = {}
_locks_guard = threading.Lock()


def sandbox_image(client: SandboxClient, image: TaskImage) -> str:
    """What a sandbox's ``image`` takes for a task's image: the name itself, or the name of
    the image built (or found in the build cache) from its Dockerfile."""
    if isinstance(image, str):
        return image
    key = (client.base_url, str(image.build), image.dockerfile, repr(sorted(image.args.items())))
    with _locks_guard:
        lock = _locks.setdefault(key, threading.Lock())
    with lock:
        return build_image(client, image.build, dockerfile=image.dockerfile, tag=image.tag,
                           build_args=image.args, network=image.network,
                           egress=image.egress).name
