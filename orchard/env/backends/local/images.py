"""Resolve image references to root filesystems for the local backend.

The resolved directory is used as the read-only lower layer of an overlayfs mount, so an
unpacked image is written exactly once into a content-addressed cache and never touched again.

Supported references:

* ``"host"`` - run on the host's own filesystem.
* an absolute path to a directory - used as-is as the rootfs (never modified).
* an absolute path to an OCI image layout directory (``oci-layout`` + ``index.json``).
* an absolute path to a tar file (optionally gzip): ``docker save`` output or an OCI layout
  tarred up (``oci-archive``).
"""

from __future__ import annotations

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

__all__ = ["ImageError", "ImageStore", "ResolvedImage"]


@dataclass(frozen=True)
class ResolvedImage:
    ref: str
    kind: Literal["host", "rootfs", "oci"]
    rootfs: Path | None
    digest: str | None


class ImageStore:
    """Resolves references, unpacking archives once into ``cache_dir/<algo>-<hex>/rootfs``."""

    def __init__(self, cache_dir: Path) -> None:
        self.cache_dir = Path(cache_dir)

    def resolve(self, ref: str) -> ResolvedImage:
        if ref == "host":
            return ResolvedImage(ref=ref, kind="host", rootfs=None, digest=None)
        path = Path(ref)
        if not path.is_absolute():
            raise ImageError(
                f"image reference {ref!r} is neither 'host' nor an absolute path; pass the "
                "absolute path of a rootfs directory, an OCI layout directory, or a "
                "`docker save` / OCI archive tar (registry pulls are not supported)"
            )
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
