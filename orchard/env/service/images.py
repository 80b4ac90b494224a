"""The image cache of a backend that keeps one (the local backend): list, pull, remove,
prune, with its errors as the API's."""

from __future__ import annotations

import asyncio

from orchard.env.backends.base import Backend, ImageCache, ImageInUse, ImageUnavailable
from orchard.env.errors import BadRequest, Conflict, ServiceError, for_status
from orchard.env.image_schema import IMAGE_ERROR_STATUS, ImageInfo, ImageList, ImagesRemoved


def image_error(e: ImageUnavailable) -> ServiceError:
    """The API's answer to an image that cannot be had: 404, 401, 422, 502 or 507."""
    return for_status(IMAGE_ERROR_STATUS.get(e.kind, 502), str(e))


class Images:
    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def _cache(self) -> ImageCache:
        cache = self.backend.image_cache
        if cache is None:
            raise BadRequest(f"the {self.backend.name} backend keeps no image cache: its "
                             "platform pulls images itself (on Kubernetes, the kubelet)")
        return cache

    async def list(self) -> ImageList:
        return await asyncio.to_thread(self._cache().list)

    async def pull(self, image: str) -> ImageInfo:
        """Pull now, asking the registry what the name means even if it is cached."""
        cache = self._cache()
        try:
            await cache.pull(image, refresh=True)
            return await asyncio.to_thread(cache.find, image)
        except ImageUnavailable as e:
            raise image_error(e) from None

    async def remove(self, name: str) -> ImagesRemoved:
        try:
            return await asyncio.to_thread(self._cache().remove, name)
        except ImageUnavailable as e:
            raise image_error(e) from None
        except ImageInUse as e:
            raise Conflict(str(e)) from None

    async def prune(self) -> ImagesRemoved:
        return await asyncio.to_thread(self._cache().prune)
