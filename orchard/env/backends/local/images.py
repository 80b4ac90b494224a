"""Resolve image references to root filesystems for the local backend.

The resolved directory is used as the read-only lower layer of an overlayfs mount, so an
unpacked image is written exactly once into a content-addressed cache and never touched again.

Supported references:

* ``"host"`` - run on the host's own filesystem.
* an absolute path to a directory - used as-is as the rootfs (never modified).
* an absolute path to an OCI image layout directory (``oci-layout`` + ``index.json``).
* an absolute path to a tar file (optionally gzip): ``docker save`` output or an OCI layout
  tarred up (``oci-archive``).
* a registry reference (``python:3.12-slim``): pulled by ``image_cache.py`` into an OCI
  layout, then unpacked here like an archive (:meth:`ImageStore.unpack_pulled`).

Each unpacked image is ``<cache>/<algo>-<hex>/`` holding ``rootfs/``, ``image.json`` (its
:class:`ImageInfo`: names, size, config), ``last-used`` (its mtime) and ``users/`` (one
marker per sandbox on it, naming the sandbox's directory: gone with it). ``refs/`` maps
names to digests.

A path must lie, once its symlinks are resolved, in an image directory: the unpacked-image
cache, the image dir (``images.dir``) or one of ``images.allowed_paths``. Otherwise an API
caller could start a sandbox on ``/etc`` and read the host's secrets through it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from orchard.env.backends.base import ImageInUse
from orchard.env.backends.local.image_sources import (
    DirSource,
    ImageError,
    Plan,
    Source,
    TarSource,
    read_plan,
)
from orchard.env.backends.local.image_unpack import unpack
from orchard.env.filelock import exclusive_lock
from orchard.env.image_schema import ImageConfig, ImageInfo, config_from_oci

__all__ = ["ImageError", "ImageForbidden", "ImageInUse", "ImageStore", "ResolvedImage"]


class ImageForbidden(ImageError):
    """The path lies outside every image directory; the message names the setting to change."""


@dataclass(frozen=True)
class ResolvedImage:
    ref: str
    kind: Literal["host", "rootfs", "oci"]
    rootfs: Path | None
    digest: str | None
    config: ImageConfig | None = None


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
        return self._unpacked(ref, plan.digest, source, plan)

    def _unpacked(self, ref: str, digest: str, source: Source, plan: Plan) -> ResolvedImage:
        entry = self.entry(digest)
        rootfs = entry / "rootfs"
        # The rename below is atomic, so an existing rootfs is always complete: skip the lock.
        if not rootfs.is_dir():
            with self.locked(digest):
                if not rootfs.is_dir():
                    try:
                        entry.mkdir(parents=True, exist_ok=True)
                        unpack(source, plan, entry, rootfs)
                        info = ImageInfo(digest=digest, size_bytes=_disk_usage(rootfs),
                                         pulled_at=datetime.now(UTC),
                                         config=config_from_oci(plan.config))
                        _write_atomic(entry / "image.json", info.model_dump_json())
                    except BaseException:
                        # Nothing half-written stays: no rootfs means no image here.
                        shutil.rmtree(entry / "rootfs", ignore_errors=True)
                        (entry / "image.json").unlink(missing_ok=True)
                        with contextlib.suppress(OSError):
                            entry.rmdir()
                        raise
        self.remember(ref, digest)
        info = self.info(digest)
        return ResolvedImage(ref=ref, kind="oci", rootfs=rootfs, digest=digest,
                             config=info.config if info else None)

    def unpack_pulled(self, ref: str, digest: str, layout: Path) -> ResolvedImage:
        """Unpack the OCI layout a pull wrote, keyed by the registry's manifest ``digest``
        (skopeo may convert the manifest it writes, changing its digest)."""
        source = DirSource(layout)
        return self._unpacked(ref, digest, source, read_plan(source))

    # --- the cache's bookkeeping ---------------------------------------------------------

    def entry(self, digest: str) -> Path:
        algo, hexdigest = digest.split(":", 1)
        return self.cache_dir / f"{algo}-{hexdigest}"

    @contextlib.contextmanager
    def locked(self, digest: str) -> Iterator[None]:
        """The per-image lock: one unpack, and no removal while a sandbox claims it."""
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        with exclusive_lock(self.cache_dir / f"{self.entry(digest).name}.lock"):
            yield

    def _ref_file(self, ref: str) -> Path:
        return self.cache_dir / "refs" / hashlib.sha256(ref.encode()).hexdigest()

    def remember(self, ref: str, digest: str) -> None:
        """Name ``digest`` by ``ref``: in refs/ for lookups, in its image.json for listing."""
        path = self._ref_file(ref)
        path.parent.mkdir(exist_ok=True)
        _write_atomic(path, f"{digest}\n{ref}\n")
        with self.locked(digest):
            info = self.info(digest)
            if info is not None and ref not in info.refs:
                info.refs.append(ref)
                _write_atomic(self.entry(digest) / "image.json", info.model_dump_json())

    def lookup(self, ref: str) -> str | None:
        """The digest ``ref`` was last pulled as, if that image is still unpacked here."""
        try:
            digest = self._ref_file(ref).read_text().split("\n", 1)[0]
        except OSError:
            return None
        return digest if (self.entry(digest) / "rootfs").is_dir() else None

    def info(self, digest: str) -> ImageInfo | None:
        entry = self.entry(digest)
        try:
            info = ImageInfo.model_validate_json((entry / "image.json").read_text())
        except (OSError, ValueError):
            if not (entry / "rootfs").is_dir():
                return None
            # Unpacked before images kept their facts: what the files say.
            info = ImageInfo(digest=digest, size_bytes=_disk_usage(entry / "rootfs"))
        with contextlib.suppress(OSError):
            info.last_used = datetime.fromtimestamp((entry / "last-used").stat().st_mtime, UTC)
        info.sandboxes = self.users(digest)
        return info

    def digests(self) -> list[str]:
        return [p.parent.name.replace("-", ":", 1) for p in self.cached()]

    def claim(self, digest: str, sandbox_dir: Path) -> Path | None:
        """Mark the image used by the sandbox in ``sandbox_dir``: its rootfs, or None if it
        was removed meanwhile (pull it again)."""
        entry = self.entry(digest)
        with self.locked(digest):
            if not (entry / "rootfs").is_dir():
                return None
            users = entry / "users"
            users.mkdir(exist_ok=True)
            marker = hashlib.sha256(str(sandbox_dir).encode()).hexdigest()[:24]
            _write_atomic(users / marker, f"{sandbox_dir.name}\n{sandbox_dir}\n")
            (entry / "last-used").touch()
        return entry / "rootfs"

    def users(self, digest: str) -> list[str]:
        """Ids of the sandboxes on the image; markers of sandboxes gone are dropped."""
        out = []
        for marker in sorted((self.entry(digest) / "users").glob("*")):
            with contextlib.suppress(OSError, ValueError):
                sid, sdir = marker.read_text().split("\n")[:2]
                if Path(sdir).is_dir():
                    out.append(sid)
                else:
                    marker.unlink()
        return out

    def remove(self, digest: str) -> int:
        """Remove an unused image; the bytes freed. ImageInUse while a sandbox runs on it."""
        entry = self.entry(digest)
        with self.locked(digest):
            users = self.users(digest)
            if users:
                raise ImageInUse(f"image {digest} is in use by sandbox(es) "
                                 f"{', '.join(users)}; delete them first")
            info = self.info(digest)
            if info is None:
                return 0
            # One rename takes it out of the store at once; the files go after.
            trash = Path(tempfile.mkdtemp(prefix=".trash-", dir=self.cache_dir))
            os.rename(entry, trash / "entry")
        shutil.rmtree(trash, ignore_errors=True)
        for ref in info.refs:
            if self.lookup(ref) is None:
                with contextlib.suppress(OSError):
                    self._ref_file(ref).unlink()
        return info.size_bytes


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _disk_usage(root: Path) -> int:
    """Bytes of the files under ``root`` (hard links once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(dirpath, name))
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_blocks * 512
    return total

