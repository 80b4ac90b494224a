"""Unpacking an image's layers into a rootfs safely: whiteouts, opaque dirs, and no member
that escapes the root (absolute paths, .., symlinked parents, devices)."""

from __future__ import annotations

import errno
import gzip
import hashlib
import io
import os
import shutil
import tarfile
import tempfile
import zlib
from pathlib import Path
from typing import IO, Any

from orchard.env.backends.local.image_sources import (
    ImageError,
    Layer,
    Plan,
    Source,
    check_digest,
)

# Directories the sandbox mounts over; overlayfs cannot create mount points in a lower layer.
_MOUNT_POINTS = ("proc", "dev", "tmp", "workspace", "home")
_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_WHITEOUT = ".wh."
_OPAQUE = ".wh..wh..opq"
# Same bound as the kernel's MAXSYMLINKS; stops symlink loops planted by a layer.
_MAX_SYMLINK_HOPS = 40
_COPY_CHUNK = 1 << 20
# O_NOFOLLOW: a symlink where a directory was is refused (ELOOP), not followed.
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def unpack(source: Source, plan: Plan, entry: Path, rootfs: Path) -> None:
    # Only the lock holder unpacks, so any leftover temp dir is from a crashed unpack.
    for stale in entry.glob(".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=entry))
    try:
        tmp.chmod(0o755)
        for layer in plan.layers:
            _apply_layer(source, layer, tmp)
        for name in _MOUNT_POINTS:
            path = tmp / name
            if not os.path.lexists(path):
                path.mkdir()
                path.chmod(0o1777 if name == "tmp" else 0o755)
        os.rename(tmp, rootfs)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


class _HashingReader(io.RawIOBase):
    def __init__(self, inner: IO[bytes], algo: str) -> None:
        self._inner = inner
        self.hash = hashlib.new(algo)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._inner.read(len(buffer))
        self.hash.update(data)
        buffer[: len(data)] = data
        return len(data)

    def drain(self) -> None:
        while self.read(_COPY_CHUNK):
            pass


def _algo(digest: str | None) -> str:
    return digest.split(":", 1)[0] if digest else "sha256"


def _apply_layer(source: Source, layer: Layer, root: Path) -> None:
    label = f"{source.label}: layer {layer.name}"
    if not source.has(layer.name):
        raise ImageError(f"{label} is missing; the image is incomplete, re-export it")
    with source.open(layer.name) as raw:
        blob = _HashingReader(raw, _algo(layer.blob_digest))
        buffered = io.BufferedReader(blob, _COPY_CHUNK)
        # Media types are unreliable (docker-archive has none, some tools mislabel), so the
        # compression is detected from the bytes.
        magic = buffered.peek(4)[:4]
        if magic.startswith(_ZSTD_MAGIC):
            raise ImageError(f"{label} is zstd-compressed, which is unsupported; use gzip layers")
        stream: IO[bytes] = (
            gzip.GzipFile(fileobj=buffered) if magic.startswith(_GZIP_MAGIC) else buffered
        )
        uncompressed = _HashingReader(stream, _algo(layer.diff_id))
        try:
            if magic:
                with tarfile.open(fileobj=uncompressed, mode="r|") as tar:
                    _extract(tar, root, label)
            # Hash the whole blob, including tar padding after the end-of-archive marker.
            uncompressed.drain()
            buffered.read()
        except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as e:
            raise ImageError(f"{label} is not a valid tar layer ({e}); re-export the image") from e
    if layer.blob_digest:
        check_digest(source.label, layer.name, layer.blob_digest, blob.hash)
    if layer.diff_id:
        name = f"{layer.name} (uncompressed)"
        check_digest(source.label, name, layer.diff_id, uncompressed.hash)


def _member_parts(name: str, label: str) -> list[str]:
    # Leading "/" is stripped like tarfile's "tar" filter does; ".." is refused outright since
    # no legitimate layer needs it.
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ImageError(f"{label}: entry {name!r} escapes the image root; refusing the archive")
    return parts


def _resolve(root: Path, parts: list[str], label: str) -> Path:
    """Follow symlinks in ``parts`` as if ``root`` were ``/``, so they cannot leave it.

    Layers may legitimately contain absolute symlinks (``/lib -> /usr/lib``); resolving them
    against the host, as realpath-based checks do, would escape or spuriously fail.
    """
    pending, resolved, hops = list(parts), [], 0
    while pending:
        part = pending.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        candidate = root.joinpath(*resolved, part)
        if candidate.is_symlink():
            hops += 1
            if hops > _MAX_SYMLINK_HOPS:
                raise ImageError(f"{label}: too many symlinks resolving {'/'.join(parts)!r}")
            link = os.readlink(candidate)
            if link.startswith("/"):
                resolved = []
            pending[:0] = link.split("/")
            continue
        resolved.append(part)
    return root.joinpath(*resolved)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


def _make_opaque(root: Path, directory: Path, written: set[str]) -> None:
    """Drop everything in ``directory`` that lower layers put there; keep this layer's entries."""
    for child in list(directory.iterdir()):
        if str(child.relative_to(root)) not in written:
            _remove(child)
        elif child.is_dir() and not child.is_symlink():
            _make_opaque(root, child, written)


def _extract(tar: tarfile.TarFile, root: Path, label: str) -> None:
    written: set[str] = set()  # root-relative paths this layer created (and their parents)
    dirs: list[tuple[tuple[str, ...], tarfile.TarInfo]] = []
    chown = os.geteuid() == 0
    for member in tar:
        try:
            parts = _member_parts(member.name, label)
            if not parts:
                if member.isdir():
                    dirs.append(((), member))
                continue
            parent = _resolve(root, parts[:-1], label)
            base = parts[-1]
            if base == _OPAQUE:
                parent.mkdir(parents=True, exist_ok=True)
                _make_opaque(root, parent, written)
                continue
            if base.startswith(_WHITEOUT):
                victim = base[len(_WHITEOUT) :]
                if victim in ("", ".", ".."):
                    raise ImageError(f"{label}: malformed whiteout {member.name!r}")
                if str((parent / victim).relative_to(root)) not in written:
                    _remove(parent / victim)
                continue
            parent.mkdir(parents=True, exist_ok=True)
            target = parent / base
            if not _place(tar, member, root, target, label, chown):
                continue
            rel = target.relative_to(root)
            written.update(str(p) for p in (rel, *rel.parents) if str(p) != ".")
            if member.isdir():
                dirs.append((rel.parts, member))
        except OSError as e:
            raise ImageError(f"{label}: cannot extract {member.name!r} ({e})") from e
    # Directory modes and mtimes go last: a read-only or timestamped dir must still accept
    # its children first. A later entry may have replaced a directory on the way with a
    # symlink (even to the host's /), so each is reached through fds, never followed.
    root_fd = os.open(root, _DIR_FLAGS)
    try:
        for rel_parts, member in reversed(dirs):
            try:
                fd = _open_beneath(root_fd, rel_parts)
                if fd is None:
                    continue
                try:
                    os.fchmod(fd, member.mode & 0o7777)
                    os.utime(fd, (member.mtime, member.mtime))
                finally:
                    os.close(fd)
            except OSError as e:
                raise ImageError(f"{label}: cannot set the mode of {member.name!r} ({e})") from e
    finally:
        os.close(root_fd)


def _open_beneath(root_fd: int, parts: tuple[str, ...]) -> int | None:
    """An fd of the directory at ``parts`` below ``root_fd``, opened one component at a time
    without following symlinks; None if some component is no longer a directory."""
    fd = os.dup(root_fd)
    try:
        for part in parts:
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            return None
        raise
    return fd


def _place(
    tar: tarfile.TarFile,
    member: tarfile.TarInfo,
    root: Path,
    target: Path,
    label: str,
    chown: bool,
) -> bool:
    """Create one entry at ``target``; returns False for entry types that are skipped."""
    if (
        member.ischr()
        or member.isblk()
        or not (
            member.isreg() or member.isdir() or member.issym() or member.islnk() or member.isfifo()
        )
    ):
        # Device nodes are useless in a lower layer (the sandbox mounts its own /dev).
        return False
    # An upper-layer entry replaces the lower one, except that directories merge.
    merge = member.isdir() and target.is_dir() and not target.is_symlink()
    if os.path.lexists(target) and not merge:
        _remove(target)
    if member.isdir():
        target.mkdir(mode=0o700, exist_ok=True)
    elif member.issym():
        os.symlink(member.linkname, target)
    elif member.islnk():
        link_parts = _member_parts(member.linkname, label)
        if not link_parts:
            raise ImageError(f"{label}: hardlink {member.name!r} has no target")
        source = _resolve(root, link_parts[:-1], label) / link_parts[-1]
        if not os.path.lexists(source):
            raise ImageError(
                f"{label}: hardlink {member.name!r} -> {member.linkname!r} has no target"
            )
        os.link(source, target, follow_symlinks=False)
        return True
    elif member.isfifo():
        os.mkfifo(target, 0o600)
        # Non-blocking: opening a FIFO to read waits for a writer otherwise.
        fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            _set_meta(fd, member, chown)
        finally:
            os.close(fd)
        return True
    else:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(target, flags, 0o600)
        with os.fdopen(fd, "wb") as out:
            data = tar.extractfile(member)
            if data is not None:
                shutil.copyfileobj(data, out, _COPY_CHUNK)
            out.flush()
            _set_meta(fd, member, chown)
        return True
    if chown:
        os.lchown(target, member.uid, member.gid)
    if member.issym():
        os.utime(target, (member.mtime, member.mtime), follow_symlinks=False)
    return True  # a directory gets its mode and mtime once the whole layer is in


def _set_meta(fd: int, member: tarfile.TarInfo, chown: bool) -> None:
    """Owner, mode and mtime through the fd the entry was made with, not by its path."""
    if chown:
        os.fchown(fd, member.uid, member.gid)
    # chmod after chown, since chown clears setuid/setgid bits.
    os.fchmod(fd, member.mode & 0o7777)
    os.utime(fd, (member.mtime, member.mtime))
