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

import gzip
import hashlib
import io
import json
import os
import platform
import posixpath
import re
import shutil
import tarfile
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal, Protocol

from orchard.env.filelock import exclusive_lock

__all__ = ["ImageError", "ImageStore", "ResolvedImage"]

# Directories the sandbox mounts over; overlayfs cannot create mount points in a lower layer.
_MOUNT_POINTS = ("proc", "dev", "tmp", "workspace", "home")

_DIGEST_RE = re.compile(r"^(sha256|sha512):([0-9a-f]{64}|[0-9a-f]{128})$")
_HEX_LEN = {"sha256": 64, "sha512": 128}

_INDEX_TYPES = {
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
}
_MANIFEST_TYPES = {
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
}

_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_WHITEOUT = ".wh."
_OPAQUE = ".wh..wh..opq"
# Same bound as the kernel's MAXSYMLINKS; stops symlink loops planted by a layer.
_MAX_SYMLINK_HOPS = 40
_COPY_CHUNK = 1 << 20


class ImageError(ValueError):
    """An image reference could not be resolved; the message says why and what to do."""


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
                return self._resolve_archive(ref, _DirSource(path))
            return ResolvedImage(ref=ref, kind="rootfs", rootfs=path, digest=None)
        if not path.is_file():
            raise ImageError(f"image path {ref} is neither a directory nor a regular file")
        with _TarSource(path) as source:
            return self._resolve_archive(ref, source)

    def cached(self) -> list[Path]:
        if not self.cache_dir.is_dir():
            return []
        return sorted(p for p in self.cache_dir.glob("*/rootfs") if p.is_dir())

    def _resolve_archive(self, ref: str, source: _Source) -> ResolvedImage:
        plan = _plan(source)
        algo, hexdigest = plan.digest.split(":", 1)
        entry = self.cache_dir / f"{algo}-{hexdigest}"
        rootfs = entry / "rootfs"
        # The rename below is atomic, so an existing rootfs is always complete: skip the lock.
        if not rootfs.is_dir():
            entry.mkdir(parents=True, exist_ok=True)
            with exclusive_lock(self.cache_dir / f"{algo}-{hexdigest}.lock"):
                if not rootfs.is_dir():
                    _unpack(source, plan, entry, rootfs)
        return ResolvedImage(ref=ref, kind="oci", rootfs=rootfs, digest=plan.digest)


# --------------------------------------------------------------------------- sources


class _Source(Protocol):
    label: str

    def has(self, name: str) -> bool: ...

    def open(self, name: str) -> IO[bytes]: ...


class _DirSource:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.label = str(root)

    def _path(self, name: str) -> Path:
        return self.root / _archive_name(name, self.label)

    def has(self, name: str) -> bool:
        return self._path(name).is_file()

    def open(self, name: str) -> IO[bytes]:
        try:
            return self._path(name).open("rb")
        except OSError as e:
            raise ImageError(
                f"{self.label}: cannot read {name} ({e.strerror}); the image layout is "
                "incomplete, re-export the image"
            ) from e


class _TarSource:
    """Reads members of an outer archive, scanning headers only as far as needed."""

    def __init__(self, path: Path) -> None:
        self.label = str(path)
        try:
            # Kept open for the life of the source; closed by __exit__.
            self._tar = tarfile.open(path, "r:*")  # noqa: SIM115
        except (tarfile.TarError, EOFError, OSError, gzip.BadGzipFile) as e:
            raise ImageError(
                f"{path} is not a tar archive ({e}); pass a `docker save` tar, an OCI archive, "
                "an OCI layout directory or a rootfs directory"
            ) from e
        self._members: dict[str, tarfile.TarInfo] = {}
        self._exhausted = False

    def __enter__(self) -> _TarSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self._tar.close()

    def _find(self, name: str) -> tarfile.TarInfo | None:
        name = _archive_name(name, self.label)
        while name not in self._members and not self._exhausted:
            try:
                info = self._tar.next()
            except (tarfile.TarError, EOFError, OSError) as e:
                raise ImageError(f"{self.label}: corrupt archive ({e}); re-export it") from e
            if info is None:
                self._exhausted = True
            else:
                self._members.setdefault(posixpath.normpath(info.name.lstrip("/")), info)
        return self._members.get(name)

    def has(self, name: str) -> bool:
        info = self._find(name)
        return info is not None and (info.isfile() or info.issym() or info.islnk())

    def open(self, name: str) -> IO[bytes]:
        info = self._find(name)
        try:
            fileobj = self._tar.extractfile(info) if info is not None else None
        except (tarfile.TarError, KeyError) as e:
            raise ImageError(f"{self.label}: cannot read {name} ({e}); re-export it") from e
        if fileobj is None:
            raise ImageError(
                f"{self.label}: {name} is missing from the archive; the image is incomplete, "
                "re-export it (e.g. `docker save IMAGE -o FILE.tar`)"
            )
        return fileobj


def _archive_name(name: str, label: str) -> str:
    norm = posixpath.normpath(name.lstrip("/"))
    if norm == ".." or norm.startswith("../"):
        raise ImageError(f"{label}: refers to {name!r} outside the image; the image is corrupt")
    return norm


def _read(source: _Source, name: str) -> bytes:
    with source.open(name) as f:
        return f.read()


def _read_json(source: _Source, name: str, data: bytes | None = None) -> Any:
    try:
        return json.loads(data if data is not None else _read(source, name))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ImageError(f"{source.label}: {name} is not valid JSON ({e}); re-export it") from e


# --------------------------------------------------------------------------- manifests


@dataclass(frozen=True)
class _Layer:
    name: str  # member/file name inside the source
    blob_digest: str | None  # digest of the blob as stored (possibly compressed)
    diff_id: str | None  # digest of the uncompressed tar


@dataclass(frozen=True)
class _Plan:
    digest: str  # cache key: manifest digest (OCI) or config digest (docker-archive)
    layers: list[_Layer]


def _plan(source: _Source) -> _Plan:
    # Docker >= 25 writes both formats into one tar; the OCI view carries real blob digests.
    if source.has("oci-layout") and source.has("index.json"):
        return _plan_oci(source)
    if source.has("manifest.json"):
        return _plan_docker(source)
    raise ImageError(
        f"{source.label}: unknown image format (no index.json + oci-layout and no manifest.json); "
        "pass a `docker save` tar, an OCI archive/layout, or a rootfs directory"
    )


def _parse_digest(digest: Any, label: str) -> tuple[str, str]:
    # Digests become file names, so anything but algo:hex could traverse out of blobs/.
    match = _DIGEST_RE.match(digest) if isinstance(digest, str) else None
    if match is None or len(match.group(2)) != _HEX_LEN[match.group(1)]:
        raise ImageError(f"{label}: invalid digest {digest!r}; the image metadata is corrupt")
    return match.group(1), match.group(2)


def _blob_name(digest: Any, label: str) -> str:
    algo, hexdigest = _parse_digest(digest, label)
    return f"blobs/{algo}/{hexdigest}"


def _read_blob(source: _Source, digest: str) -> bytes:
    name = _blob_name(digest, source.label)
    if not source.has(name):
        raise ImageError(
            f"{source.label}: blob {name} is missing; the image is incomplete, re-export it"
        )
    data = _read(source, name)
    _check_digest(source.label, name, digest, hashlib.new(digest.split(":", 1)[0], data))
    return data


def _check_digest(label: str, name: str, expected: str, actual: Any) -> None:
    algo = expected.split(":", 1)[0]
    got = f"{algo}:{actual.hexdigest()}"
    if got != expected:
        raise ImageError(
            f"{label}: {name} has digest {got} but {expected} was expected; the image is "
            "corrupt or was tampered with, re-export it"
        )


def _host_platform() -> str:
    machine = platform.machine().lower()
    return {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)


def _platform(descriptor: dict[str, Any]) -> dict[str, Any]:
    plat = descriptor.get("platform")
    return plat if isinstance(plat, dict) else {}


def _pick_manifest(descriptors: list[Any], label: str) -> dict[str, Any]:
    # BuildKit lists attestation manifests with platform unknown/unknown; they have no rootfs.
    candidates = [
        d for d in descriptors if isinstance(d, dict) and _platform(d).get("os") != "unknown"
    ]
    if not candidates:
        raise ImageError(f"{label}: the image index lists no manifests; re-export the image")
    # Prefer the host's architecture so the rootfs can execute; amd64 is the documented default.
    for arch in (_host_platform(), "amd64"):
        for d in candidates:
            if _platform(d).get("os") == "linux" and _platform(d).get("architecture") == arch:
                return d
    return candidates[0]


def _plan_oci(source: _Source) -> _Plan:
    doc = _read_json(source, "index.json")
    # Indexes may nest (multi-arch images); the depth bound guards against cycles.
    for _ in range(8):
        if not isinstance(doc, dict) or not isinstance(doc.get("manifests"), list):
            raise ImageError(f"{source.label}: image index has no 'manifests' list; re-export it")
        descriptor = _pick_manifest(doc["manifests"], source.label)
        digest = descriptor.get("digest")
        blob = _read_blob(source, digest)
        doc = _read_json(source, _blob_name(digest, source.label), blob)
        media = descriptor.get("mediaType")
        if media is None and isinstance(doc, dict):
            media = doc.get("mediaType")
        is_manifest = media in _MANIFEST_TYPES or (
            media not in _INDEX_TYPES and isinstance(doc, dict) and "layers" in doc
        )
        if is_manifest:
            break
    else:
        raise ImageError(f"{source.label}: image indexes nest too deeply; re-export the image")
    layers = doc.get("layers") if isinstance(doc, dict) else None
    if not isinstance(layers, list) or not all(isinstance(d, dict) for d in layers):
        raise ImageError(f"{source.label}: manifest {digest} has no 'layers'; re-export the image")
    return _Plan(
        digest=digest,
        layers=[
            _Layer(
                name=_blob_name(d.get("digest"), source.label),
                blob_digest=d["digest"],
                diff_id=None,
            )
            for d in layers
        ],
    )


def _plan_docker(source: _Source) -> _Plan:
    manifest = _read_json(source, "manifest.json")
    if not isinstance(manifest, list) or not manifest or not isinstance(manifest[0], dict):
        raise ImageError(f"{source.label}: manifest.json lists no images; re-export it")
    entry = manifest[0]
    config_name, layer_names = entry.get("Config"), entry.get("Layers")
    if not isinstance(config_name, str) or not isinstance(layer_names, list):
        raise ImageError(
            f"{source.label}: manifest.json lacks 'Config'/'Layers'; this is not `docker save` "
            "output, re-export it"
        )
    if not source.has(config_name):
        raise ImageError(f"{source.label}: config {config_name} is missing; re-export the image")
    config_bytes = _read(source, config_name)
    config = _read_json(source, config_name, config_bytes)
    digest = "sha256:" + hashlib.sha256(config_bytes).hexdigest()
    # Docker names the config after its own digest; a different name means corruption.
    stem = posixpath.basename(config_name).removesuffix(".json")
    if re.fullmatch(r"[0-9a-f]{64}", stem) and digest != f"sha256:{stem}":
        raise ImageError(
            f"{source.label}: config {config_name} has digest {digest}; the image is corrupt, "
            "re-export it"
        )
    rootfs_config = config.get("rootfs") if isinstance(config, dict) else None
    diff_ids = rootfs_config.get("diff_ids") if isinstance(rootfs_config, dict) else None
    if not isinstance(diff_ids, list) or len(diff_ids) != len(layer_names):
        diff_ids = [None] * len(layer_names)
    layers = []
    for name, diff_id in zip(layer_names, diff_ids, strict=True):
        if not isinstance(name, str):
            raise ImageError(f"{source.label}: bad layer entry {name!r} in manifest.json")
        if diff_id is not None:
            _parse_digest(diff_id, source.label)
        # Docker >= 25 stores layers as blobs/sha256/<hex>, so the name is a digest too.
        parts = name.split("/")
        named = f"{parts[1]}:{parts[2]}" if len(parts) == 3 and parts[0] == "blobs" else ""
        blob_digest = named if _DIGEST_RE.match(named) else None
        layers.append(_Layer(name=name, blob_digest=blob_digest, diff_id=diff_id))
    return _Plan(digest=digest, layers=layers)


# --------------------------------------------------------------------------- unpacking


def _unpack(source: _Source, plan: _Plan, entry: Path, rootfs: Path) -> None:
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


def _apply_layer(source: _Source, layer: _Layer, root: Path) -> None:
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
        _check_digest(source.label, layer.name, layer.blob_digest, blob.hash)
    if layer.diff_id:
        name = f"{layer.name} (uncompressed)"
        _check_digest(source.label, name, layer.diff_id, uncompressed.hash)


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
    dirs: list[tuple[Path, tarfile.TarInfo]] = []
    chown = os.geteuid() == 0
    for member in tar:
        try:
            parts = _member_parts(member.name, label)
            if not parts:
                if member.isdir():
                    dirs.append((root, member))
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
                dirs.append((target, member))
        except OSError as e:
            raise ImageError(f"{label}: cannot extract {member.name!r} ({e})") from e
    # Directory modes and mtimes go last: a read-only or timestamped dir must still accept
    # its children first.
    for path, member in reversed(dirs):
        if path.is_dir() and not path.is_symlink():
            os.chmod(path, member.mode & 0o7777)
            os.utime(path, (member.mtime, member.mtime))


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
        os.mkfifo(target)
    else:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(target, flags, 0o600)
        with os.fdopen(fd, "wb") as out:
            data = tar.extractfile(member)
            if data is not None:
                shutil.copyfileobj(data, out, _COPY_CHUNK)
    if chown:
        os.lchown(target, member.uid, member.gid)
    if member.issym():
        os.utime(target, (member.mtime, member.mtime), follow_symlinks=False)
    elif not member.isdir():  # directories are finished once the whole layer is in
        # chmod after chown, since chown clears setuid/setgid bits.
        os.chmod(target, member.mode & 0o7777)
        os.utime(target, (member.mtime, member.mtime))
    return True
