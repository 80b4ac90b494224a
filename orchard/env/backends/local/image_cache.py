"""Registry images on the local backend: resolve before a sandbox is recorded, pull once (per
image, across concurrent creates and processes sharing the cache), unpack into the image
store, and keep the store under its size cap by evicting the least recently used images
that no sandbox runs on.

A name pulled once is used from the store without asking the registry again (Docker's
"if not present"); ``orchard image pull`` asks again and moves the name if its tag moved.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import re
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

from orchard.env.backends.base import ImageInUse, ImageUnavailable
from orchard.env.backends.local.image_pull import RemoteImage, Skopeo, failure
from orchard.env.backends.local.image_refs import ImageRef, is_registry_ref, parse_ref
from orchard.env.backends.local.images import ImageError, ImageStore, ResolvedImage
from orchard.env.image_schema import ImageInfo, ImageList, ImagesRemoved

__all__ = ["ImageInUse", "RegistryImages"]

Report = Callable[[str], Awaitable[None]]
_DIGEST = re.compile(r"^(sha256|sha512):[0-9a-f]+$")
_MB = 1e6
# Resolutions made at create, kept for the launch's pull; a create that never launches
# (refused after its check) leaves one behind, so the oldest go past this many.
_MAX_RESOLVED = 1024


class RegistryImages:
    def __init__(self, store: ImageStore, skopeo: Skopeo, max_bytes: int | None = None,
                 allowed_registries: list[str] | None = None) -> None:
        self.store = store
        self.skopeo = skopeo
        self.max_bytes = max_bytes
        self.allowed = allowed_registries
        self._resolved: dict[str, RemoteImage] = {}
        self._pulls: dict[str, asyncio.Task[None]] = {}
        self._listeners: dict[str, list[Report]] = {}

    # --- what a create needs ----------------------------------------------------------------

    async def check(self, image: str) -> None:
        """Before the sandbox is recorded: the name parses, and unless it is in the store,
        the registry has it for this platform and lets us in. ImageUnavailable otherwise."""
        if not is_registry_ref(image):
            return
        ref = self._ref(image)
        if self.store.lookup(ref.name) is None:
            remote = await self.skopeo.resolve(ref)
            self._resolved[ref.name] = remote
            while len(self._resolved) > _MAX_RESOLVED:
                self._resolved.pop(next(iter(self._resolved)))

    async def pull(self, image: str, report: Report | None = None,
                   refresh: bool = False) -> ResolvedImage | None:
        """The unpacked image, pulled first unless the store has it (``refresh``: ask the
        registry what the name means now). ``report`` hears the pull's progress. None for
        an image that is not a registry reference (nothing to pull)."""
        if not is_registry_ref(image):
            return None
        ref = self._ref(image)
        digest = None if refresh else self.store.lookup(ref.name)
        if digest is None:
            remote = self._resolved.pop(ref.name, None)
            if remote is None or refresh:
                remote = await self.skopeo.resolve(ref)
            digest = remote.digest
            if not self._unpacked(digest):
                await self._join(remote, report)
            await asyncio.to_thread(self.store.remember, ref.name, digest)
        info = self.store.info(digest)
        if info is None:
            raise failure(image, "not_found", "it was removed from the image cache while "
                          "starting; create again")
        rootfs = self.store.entry(digest) / "rootfs"
        return ResolvedImage(ref=image, kind="oci", rootfs=rootfs, digest=digest,
                             config=info.config)

    def _ref(self, image: str) -> ImageRef:
        ref = _parse(image)
        if self.allowed is not None and not {ref.registry, ref.host} & set(self.allowed):
            raise failure(image, "forbidden", f"registry {ref.registry} is not in this "
                          "orchestrator's images.allowed_registries "
                          f"({', '.join(self.allowed) or 'none'})")
        return ref

    def _unpacked(self, digest: str) -> bool:
        return (self.store.entry(digest) / "rootfs").is_dir()

    async def _join(self, remote: RemoteImage, report: Report | None) -> None:
        """Wait for the pull of ``remote``, starting it unless one is under way."""
        digest = remote.digest
        listeners = self._listeners.setdefault(digest, [])
        if report is not None:
            listeners.append(report)
        task = self._pulls.get(digest)
        if task is None:
            task = self._pulls[digest] = asyncio.create_task(self._pull(remote))
            task.add_done_callback(lambda _: self._pulls.pop(digest, None))
        try:
            # Shielded: one waiter's timeout must not stop the pull the others wait for.
            await asyncio.shield(task)
        finally:
            if report is not None:
                listeners.remove(report)
            if not listeners:
                self._listeners.pop(digest, None)

    async def _tell(self, digest: str, message: str) -> None:
        for report in list(self._listeners.get(digest, ())):
            with contextlib.suppress(Exception):
                await report(message)

    async def _pull(self, remote: RemoteImage) -> None:
        name, digest = remote.ref.name, remote.digest
        pulls = self.store.cache_dir / ".pulls"
        entry = self.store.entry(digest).name
        try:
            pulls.mkdir(parents=True, exist_ok=True)
            # Another process sharing the cache may pull the same image: one at a time.
            lock = await asyncio.to_thread(_lock, pulls / f"{entry}.lock")
        except OSError as e:
            raise _os_failure(name, e) from None
        try:
            if self._unpacked(digest):
                return
            for stale in pulls.glob(f"{entry}-*"):  # left by a process that died pulling
                shutil.rmtree(stale, ignore_errors=True)
            tmp = Path(tempfile.mkdtemp(prefix=f"{entry}-", dir=pulls))
            try:
                await self._fetch(remote, tmp)
            finally:
                await asyncio.to_thread(shutil.rmtree, tmp, True)
        except OSError as e:
            raise _os_failure(name, e) from None
        finally:
            os.close(lock)
        await asyncio.to_thread(self.evict, keep=digest)

    async def _fetch(self, remote: RemoteImage, tmp: Path) -> None:
        name, digest, layers = remote.ref.name, remote.digest, len(remote.layers)

        async def progress(done: int, layers_done: int) -> None:
            await self._tell(digest, f"pulling {name}: {done / _MB:.1f}/"
                             f"{remote.total_bytes / _MB:.1f} MB, {layers_done}/{layers} "
                             "layers")

        await progress(0, 0)
        await self.skopeo.copy(remote, tmp / "layout", progress)
        await self._tell(digest, f"unpacking {name}: {layers} layers, "
                         f"{remote.total_bytes / _MB:.1f} MB")
        try:
            await asyncio.to_thread(self.store.unpack_pulled, name, digest, tmp / "layout")
        except ImageError as e:
            raise _unpack_failure(name, e) from None

    # --- the cache ----------------------------------------------------------------------

    def list(self) -> ImageList:
        infos = [i for d in self.store.digests() if (i := self.store.info(d)) is not None]
        infos.sort(key=lambda i: (i.refs[:1], i.digest))
        return ImageList(images=infos, total_bytes=sum(i.size_bytes for i in infos),
                         max_bytes=self.max_bytes)

    def find(self, name: str) -> ImageInfo:
        """The cached image named ``name`` (a reference, an archive path or a digest)."""
        digest = name if _DIGEST.match(name) else self.store.lookup(name)
        if digest is None and is_registry_ref(name):
            digest = self.store.lookup(_parse(name).name)
        info = self.store.info(digest) if digest else None
        if info is None:
            raise failure(name, "not_found", "not in the image cache (see `orchard image ls`)")
        return info

    def remove(self, name: str) -> ImagesRemoved:
        info = self.find(name)
        freed = self.store.remove(info.digest)
        return ImagesRemoved(removed=[info.digest], freed_bytes=freed)

    def prune(self) -> ImagesRemoved:
        """Remove every image no sandbox runs on."""
        return self._remove_unused(self.list().images, limit=None)

    def evict(self, keep: str | None = None) -> ImagesRemoved:
        """Past the cap, remove the least recently used unused images (never ``keep``)."""
        listing = self.list()
        if self.max_bytes is None or listing.total_bytes <= self.max_bytes:
            return ImagesRemoved(removed=[], freed_bytes=0)
        oldest = sorted((i for i in listing.images if i.digest != keep),
                        key=lambda i: (i.last_used or i.pulled_at or 0, i.digest))
        return self._remove_unused(oldest, limit=listing.total_bytes - self.max_bytes)

    def _remove_unused(self, infos: list[ImageInfo], limit: int | None) -> ImagesRemoved:
        out = ImagesRemoved(removed=[], freed_bytes=0)
        for info in infos:
            if limit is not None and out.freed_bytes >= limit:
                break
            with contextlib.suppress(ImageInUse):
                out.freed_bytes += self.store.remove(info.digest)
                out.removed.append(info.digest)
        return out

    async def close(self) -> None:
        """Stop the pulls under way (their temp files go)."""
        for task in list(self._pulls.values()):
            task.cancel()
        await asyncio.gather(*self._pulls.values(), return_exceptions=True)


def _parse(image: str) -> ImageRef:
    try:
        return parse_ref(image)
    except ImageError as e:
        raise ImageUnavailable(str(e), "invalid_reference") from None


def _lock(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _os_failure(name: str, e: OSError) -> ImageUnavailable:
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return failure(name, "disk_full", f"disk full in the image cache ({e.strerror})")
    return failure(name, "bad_image", f"cannot write to the image cache ({e})")


def _unpack_failure(name: str, e: ImageError) -> ImageUnavailable:
    text = str(e)
    if "No space left" in text or "Disk quota" in text:
        return failure(name, "disk_full", f"disk full in the image cache while unpacking "
                       f"({text})")
    if "digest" in text and "expected" in text:
        return failure(name, "digest_mismatch", f"digest mismatch: {text}")
    return failure(name, "bad_image", f"cannot unpack it: {text}")
