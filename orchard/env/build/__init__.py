"""Dockerfile builds on an orchestrator: ``build_image`` (blocking) and ``build_image_async``.

Each step that writes files runs in a sandbox and is kept as a snapshot (the step's layer and
its cache entry); the built image is a name any sandbox's ``image`` takes. See
docs/guides/dockerfiles.md.
"""

from orchard.env.build.async_builder import AsyncImageBuilder
from orchard.env.build.async_builder import build_image as build_image_async
from orchard.env.build.dockerfile import BuildError, DockerfileError, parse_dockerfile
from orchard.env.build.results import BuiltImage, StepFailed, StepReport
from orchard.env.build.sync_builder import (
    ImageBuilder,
    build_image,
    list_built_images,
    prune_build_cache,
    remove_built_image,
)

__all__ = [
    "AsyncImageBuilder",
    "BuildError",
    "BuiltImage",
    "DockerfileError",
    "ImageBuilder",
    "StepFailed",
    "StepReport",
    "build_image",
    "build_image_async",
    "list_built_images",
    "parse_dockerfile",
    "prune_build_cache",
    "remove_built_image",
]
