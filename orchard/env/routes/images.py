"""The image cache: list, pull, remove, prune (a backend that keeps images: the local one)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from orchard.env.image_schema import ImageInfo, ImageList, ImagesRemoved, PullImageRequest
from orchard.env.routes.common import ERRORS, IMAGE_ERRORS
from orchard.env.service import SandboxService


def router(service: SandboxService, secured: list[Any]) -> APIRouter:
    api = APIRouter(dependencies=secured, responses=ERRORS)
    images = service.images

    @api.get("/images", response_model=ImageList)
    async def list_images() -> ImageList:
        """Every unpacked image: names, digest, size, last use, the sandboxes on it."""
        return await images.list()

    @api.post("/images/pull", response_model=ImageInfo, responses=IMAGE_ERRORS)
    async def pull_image(req: PullImageRequest) -> ImageInfo:
        """Pull a registry image now (asking the registry again if a tag is cached) and
        answer once it is unpacked. 404 unknown, 401 refused, 422 digest mismatch or no
        manifest for this platform, 502 registry unavailable, 507 disk full."""
        return await images.pull(req.image)

    @api.delete("/images/{name:path}", response_model=ImagesRemoved)
    async def remove_image(name: str) -> ImagesRemoved:
        """Remove an image by name (as pulled) or digest; 409 while a sandbox runs on it."""
        return await images.remove(name)

    @api.post("/images/prune", response_model=ImagesRemoved)
    async def prune_images() -> ImagesRemoved:
        """Remove every image no sandbox runs on."""
        return await images.prune()

    return api
