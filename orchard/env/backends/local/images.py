"""Resolve image references to root filesystems for the local backend.

The resolved directory is used as the read-only lower layer of an overlayfs mount, so an
unpacked image is written exactly once into a content-addressed cache and never touched again.

Supported references:

* ``"host"`` - run on the host's own filesystem.
* an absolute path to a directory - used as-is as the rootfs (never modified).
* an absolute path to an OCI image layout directory (``oci-layout`` + ``index.json``).
* an absolute path to a tar file (optionally gzip): ``docker save`` output or an OCI layout
  tarred up (``oci-archive``).

A path must lie, once its symlinks are resolved, in an image directory: the unpacked-image
cache, the image dir (``images.dir``) or one of ``images.allowed_paths``. Otherwise an API
caller could start a sandbox on ``/etc`` and read the host's secrets through it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from orchard.env.backends.local.image_sources import (
    DirSource,
    ImageError,
    Source,
    TarSource,
    read_plan,
)
from orchard.env.backends.local.image_unpack import unpack
from orchard.env.filelock import exclusive_lock

__all__ = ["ImageError", "ImageForbidden", "ImageStore", "ResolvedImage"]


class ImageForbidden(ImageError):
    """The path lies outside every image directory; the message names the setting to change."""


@dataclass(frozen=True)
class ResolvedImage:
    ref: str
    kind: Literal["host", "rootfs", "oci"]
    rootfs: Path | None
    digest: str | None


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))


def _depth_within(path: Path, dirs: Sequence[Path]) -> int:
    """How many parts the deepest of ``dirs`` holding ``path`` has; -1 if none holds it."""
    return max((len(d.parts) for d in dirs if path.is_relative_to(d)), default=-1)


class ImageStore:
    """Resolves references, unpacking archives once into ``cache_dir/<algo>-<hex>/rootfs``.

    Image paths may lie in ``cache_dir``, ``image_dir`` or ``allowed_paths``, but never in a
    ``private`` directory (the orchestrator's state, its sandboxes' writable layers) unless an
    image directory inside it is nearer: the most specific directory decides.
    """

    def __init__(self, cache_dir: Path, image_dir: Path | None = None,
                 allowed_paths: Sequence[Path] = (), private: Sequence[Path] = ()) -> None:
        self.cache_dir = Path(cache_dir)
        self.image_dir = image_dir
        self.private = tuple(_real(p) for p in private)
        for path in allowed_paths:
            inside = next((p for p in self.private if _real(path).is_relative_to(p)), None)
            if inside is not None:
                raise ImageError(
                    f"images.allowed_paths entry {path} lies in {inside}, the orchestrator's "
                    f"own directory (its state and sandboxes' files), which never holds images; "
                    f"put images in {image_dir or self.cache_dir} or in a directory of their own")
        self.roots = tuple(_real(p) for p in (
            self.cache_dir, *([image_dir] if image_dir else []), *allowed_paths))

    def confine(self, ref: str) -> Path:
        """The real path of ``ref``, if it is absolute and lies in an image directory."""
        if not ref.startswith("/"):
            raise ImageError(
                f"image reference {ref!r} is neither 'host' nor an absolute path; pass the "
                "absolute path of a rootfs directory, an OCI layout directory, or a "
                "`docker save` / OCI archive tar on the server (registry images need the "
                "kubernetes backend)")
        real = _real(Path(ref))
        if _depth_within(real, self.roots) > _depth_within(real, self.private):
            return real
        where = f"{ref}" if str(real) == ref else f"{ref} (really {real})"
        if _depth_within(real, self.private) >= 0:
            rule = "lies in the orchestrator's own directory, which never holds images"
        else:
            rule = "lies outside the image directories"
        raise ImageForbidden(
            f"image {where} {rule}; an image path must lie, symlinks resolved, in one of "
            f"{', '.join(map(str, self.roots))}: put the image in "
            f"{self.image_dir or self.cache_dir}, or add its directory to the orchestrator's "
            "images.allowed_paths setting")

    def resolve(self, ref: str) -> ResolvedImage:
        if ref == "host":
            return ResolvedImage(ref=ref, kind="host", rootfs=None, digest=None)
        # From here on only the real path is used: a symlink swapped after the check
        # cannot send us elsewhere.
        path = self.confine(ref)
        if not path.exists():
            raise ImageError(f"image path {ref} does not exist; check the path or build the image")
        if path.is_dir():
            if (path / "oci-layout").is_file() and (path / "index.json").is_file():
                return self._resolve_archive(ref, DirSource(path))
            return ResolvedImage(ref=ref, kind="rootfs", rootfs=path, digest=None)
        if not path.is_file():
            raise ImageError(f"image path {ref} is neither a directory nor a regular file")
        with TarSource(path) as source:
            return self._resolve_archive(ref, source)

    def cached(self) -> list[Path]:
        if not self.cache_dir.is_dir():
            return []
        return sorted(p for p in self.cache_dir.glob("*/rootfs") if p.is_dir())

    def _resolve_archive(self, ref: str, source: Source) -> ResolvedImage:
        plan = read_plan(source)
        algo, hexdigest = plan.digest.split(":", 1)
        entry = self.cache_dir / f"{algo}-{hexdigest}"
        rootfs = entry / "rootfs"
        # The rename below is atomic, so an existing rootfs is always complete: skip the lock.
        if not rootfs.is_dir():
            entry.mkdir(parents=True, exist_ok=True)
            with exclusive_lock(self.cache_dir / f"{algo}-{hexdigest}.lock"):
                if not rootfs.is_dir():
                    unpack(source, plan, entry, rootfs)
        return ResolvedImage(ref=ref, kind="oci", rootfs=rootfs, digest=plan.digest)
