"""Reading an image: a directory or tar archive as a source of blobs, and the plan of layers
that its OCI index or ``docker save`` manifest describes (digests checked, platform picked)."""

from __future__ import annotations

import gzip
import hashlib
import json
import platform
import posixpath
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from orchard.env.errors import OrchestratorError

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


class ImageError(OrchestratorError, ValueError):
    """An image reference could not be resolved; the message says why and what to do."""



class Source(Protocol):
    label: str

    def has(self, name: str) -> bool: ...

    def open(self, name: str) -> IO[bytes]: ...


class DirSource:
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


class TarSource:
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

    def __enter__(self) -> TarSource:
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


def _read(source: Source, name: str) -> bytes:
    with source.open(name) as f:
        return f.read()


def _read_json(source: Source, name: str, data: bytes | None = None) -> Any:
    try:
        return json.loads(data if data is not None else _read(source, name))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ImageError(f"{source.label}: {name} is not valid JSON ({e}); re-export it") from e


# --------------------------------------------------------------------------- manifests


@dataclass(frozen=True)
class Layer:
    name: str  # member/file name inside the source
    blob_digest: str | None  # digest of the blob as stored (possibly compressed)
    diff_id: str | None  # digest of the uncompressed tar


@dataclass(frozen=True)
class Plan:
    digest: str  # cache key: manifest digest (OCI) or config digest (docker-archive)
    layers: list[Layer]
    config: Any = None  # the image config blob, parsed (architecture, config.Env, ...)


def read_plan(source: Source) -> Plan:
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


def _read_blob(source: Source, digest: str) -> bytes:
    name = _blob_name(digest, source.label)
    if not source.has(name):
        raise ImageError(
            f"{source.label}: blob {name} is missing; the image is incomplete, re-export it"
        )
    data = _read(source, name)
    check_digest(source.label, name, digest, hashlib.new(digest.split(":", 1)[0], data))
    return data


def check_digest(label: str, name: str, expected: str, actual: Any) -> None:
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


def _plan_oci(source: Source) -> Plan:
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
    config_desc = doc.get("config")
    config = None
    if isinstance(config_desc, dict) and config_desc.get("digest"):
        name = _blob_name(config_desc["digest"], source.label)
        config = _read_json(source, name, _read_blob(source, config_desc["digest"]))
    return Plan(
        digest=digest,
        config=config,
        layers=[
            Layer(
                name=_blob_name(d.get("digest"), source.label),
                blob_digest=d["digest"],
                diff_id=None,
            )
            for d in layers
        ],
    )


def _plan_docker(source: Source) -> Plan:
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
        layers.append(Layer(name=name, blob_digest=blob_digest, diff_id=diff_id))
    return Plan(digest=digest, layers=layers, config=config)
