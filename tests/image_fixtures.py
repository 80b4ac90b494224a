"""Build real container images for tests: a busybox rootfs and genuine archive formats.

Everything is produced with the stdlib in the formats ``docker load``, ``skopeo`` and
``umoci`` accept, so tests exercise the same bytes the image store sees in production.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "Layer",
    "layer_tar",
    "make_busybox_rootfs",
    "make_docker_archive",
    "make_oci_archive",
    "make_oci_layout",
]

BUSYBOX = Path("/usr/bin/busybox")

# An extra layer is either a mapping of path -> content (None = whiteout; a path ending in
# "/.wh..wh..opq" marks the directory opaque) or a ready-made uncompressed layer tar.
Layer = Mapping[str, bytes | None] | bytes

_OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
_OCI_INDEX = "application/vnd.oci.image.index.v1+json"
_OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
_OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
_OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
_WHITEOUT = ".wh."
_OPAQUE = ".wh..wh..opq"


def make_busybox_rootfs(dest: Path) -> Path:
    """A libc-less rootfs: static busybox, one symlink per applet, and a root passwd entry."""
    bin_dir = dest / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(BUSYBOX, bin_dir / "busybox")
    applets = subprocess.run(
        [str(BUSYBOX), "--list"], check=True, capture_output=True, text=True
    ).stdout.split()
    for applet in applets:
        link = bin_dir / applet
        if applet != "busybox" and not os.path.lexists(link):
            link.symlink_to("busybox")
    etc = dest / "etc"
    etc.mkdir(exist_ok=True)
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (etc / "group").write_text("root:x:0:\n")
    for name in ("proc", "dev", "tmp", "workspace", "home", "usr", "root"):
        (dest / name).mkdir(exist_ok=True)
    (dest / "tmp").chmod(0o1777)
    return dest


def layer_tar(entries: Sequence[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    """An uncompressed layer tar from raw entries (for hand-crafted, e.g. malicious, layers)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in entries:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _dir_layer(rootfs: Path) -> bytes:
    def normalize(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(rootfs.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(rootfs)), recursive=False, filter=normalize)
    return buf.getvalue()


def _files_layer(files: Mapping[str, bytes | None]) -> bytes:
    entries: list[tuple[tarfile.TarInfo, bytes | None]] = []
    for path, content in files.items():
        parent, _, name = path.strip("/").rpartition("/")
        if name == _OPAQUE:
            arcname, data = path.strip("/"), b""
        elif content is None:
            arcname, data = f"{parent}/{_WHITEOUT}{name}".lstrip("/"), b""
        else:
            arcname, data = path.strip("/"), content
        info = tarfile.TarInfo(arcname)
        info.mode = 0o644
        entries.append((info, data))
    # Whiteouts must precede the entries they sit beside (OCI image-spec, layer.md).
    entries.sort(key=lambda e: (os.path.basename(e[0].name) != _OPAQUE, e[0].name))
    return layer_tar(entries)


def _layer_tars(rootfs: Path, extra_layers: Sequence[Layer] | None) -> list[bytes]:
    layers = [_dir_layer(rootfs)]
    for layer in extra_layers or []:
        layers.append(layer if isinstance(layer, bytes) else _files_layer(layer))
    return layers


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _json(doc: Any) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


_DEFAULT_CONFIG = {"Env": ["PATH=/bin"], "Cmd": ["/bin/sh"], "WorkingDir": "/workspace"}


def _image_config(diff_ids: list[str], architecture: str = "amd64",
                  config: Mapping[str, Any] | None = None) -> bytes:
    return _json(
        {
            "architecture": architecture,
            "os": "linux",
            "config": dict(_DEFAULT_CONFIG if config is None else config),
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
            "history": [{"created_by": "orchard test fixture"} for _ in diff_ids],
        }
    )


def _write_tar(dest_tar: Path, files: Mapping[str, bytes], compress: bool) -> Path:
    dest_tar.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        dirs = sorted({str(Path(n).parent) for n in files} - {"."})
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            tar.addfile(info)
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    data = buf.getvalue()
    dest_tar.write_bytes(gzip.compress(data, mtime=0) if compress else data)
    return dest_tar


def make_docker_archive(
    rootfs: Path,
    dest_tar: Path,
    extra_layers: list[Layer] | None = None,
    *,
    compress: bool = False,
) -> Path:
    """``docker save`` format: manifest.json + config + <id>/layer.tar per layer.

    The first layer is gzipped (``docker load`` accepts that); extra layers are plain tars,
    as ``docker save`` writes them.
    """
    tars = _layer_tars(rootfs, extra_layers)
    diff_ids = [_sha256(t) for t in tars]
    blobs = [gzip.compress(tars[0], mtime=0), *tars[1:]]
    config = _image_config(diff_ids)
    config_hex = hashlib.sha256(config).hexdigest()
    files: dict[str, bytes] = {f"{config_hex}.json": config}
    layer_names, parent = [], ""
    for diff_id, blob in zip(diff_ids, blobs, strict=True):
        # Legacy v1 layer ids chain the parent id, like docker does.
        layer_id = hashlib.sha256(f"{parent}\n{diff_id}".encode()).hexdigest()
        files[f"{layer_id}/VERSION"] = b"1.0"
        files[f"{layer_id}/json"] = _json(
            {"id": layer_id, **({"parent": parent} if parent else {})}
        )
        files[f"{layer_id}/layer.tar"] = blob
        layer_names.append(f"{layer_id}/layer.tar")
        parent = layer_id
    files["manifest.json"] = _json(
        [
            {
                "Config": f"{config_hex}.json",
                "RepoTags": ["orchard/test:latest"],
                "Layers": layer_names,
            }
        ]
    )
    files["repositories"] = _json({"orchard/test": {"latest": parent}})
    return _write_tar(dest_tar, files, compress)


def _oci_files(
    rootfs: Path,
    extra_layers: list[Layer] | None,
    multi_arch: bool,
    gzip_extra: bool,
    architectures: Sequence[str] | None = None,
    config: Mapping[str, Any] | None = None,
) -> dict[str, bytes]:
    files: dict[str, bytes] = {"oci-layout": _json({"imageLayoutVersion": "1.0.0"})}

    def add_blob(data: bytes, media_type: str, **extra: Any) -> dict[str, Any]:
        digest = _sha256(data)
        files["blobs/sha256/" + digest.split(":", 1)[1]] = data
        return {"mediaType": media_type, "digest": digest, "size": len(data), **extra}

    def add_manifest(tars: list[bytes], architecture: str) -> dict[str, Any]:
        layers = []
        for i, tar in enumerate(tars):
            compressed = i == 0 or gzip_extra
            blob = gzip.compress(tar, mtime=0) if compressed else tar
            layers.append(add_blob(blob, _OCI_LAYER_GZIP if compressed else _OCI_LAYER))
        config_blob = _image_config([_sha256(t) for t in tars], architecture, config)
        config_desc = add_blob(config_blob, _OCI_CONFIG)
        manifest = {
            "schemaVersion": 2,
            "mediaType": _OCI_MANIFEST,
            "config": config_desc,
            "layers": layers,
        }
        platform = {"os": "linux", "architecture": architecture}
        return add_blob(_json(manifest), _OCI_MANIFEST, platform=platform)

    tars = _layer_tars(rootfs, extra_layers)
    ref = {"org.opencontainers.image.ref.name": "latest"}
    if multi_arch or architectures:
        # arm64 first, so picking "the first" manifest would be detectably wrong on amd64.
        manifests = [
            add_manifest([*tars, _files_layer({"etc/arch": arch.encode()})], arch)
            for arch in architectures or ("arm64", "amd64")
        ]
        nested = {"schemaVersion": 2, "mediaType": _OCI_INDEX, "manifests": manifests}
        top = [add_blob(_json(nested), _OCI_INDEX, annotations=ref)]
    else:
        top = [{**add_manifest(tars, "amd64"), "annotations": ref}]
    files["index.json"] = _json({"schemaVersion": 2, "mediaType": _OCI_INDEX, "manifests": top})
    return files


def make_oci_layout(
    rootfs: Path,
    dest_dir: Path,
    extra_layers: list[Layer] | None = None,
    *,
    multi_arch: bool = False,
    gzip_extra: bool = True,
    architectures: Sequence[str] | None = None,
    config: Mapping[str, Any] | None = None,
) -> Path:
    """An OCI image layout directory (oci-layout, index.json, blobs/sha256/...).

    ``multi_arch`` puts a nested index with arm64 and amd64 manifests behind index.json, each
    with a final layer writing its architecture to ``etc/arch``; ``architectures`` names
    other ones for that index. ``gzip_extra=False`` stores extra layers as plain tars.
    ``config`` is the image config's ``config`` (Env, Cmd, WorkingDir, ...).
    """
    files = _oci_files(rootfs, extra_layers, multi_arch, gzip_extra, architectures, config)
    for name, data in files.items():
        path = dest_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return dest_dir


def make_oci_archive(
    rootfs: Path,
    dest_tar: Path,
    extra_layers: list[Layer] | None = None,
    *,
    multi_arch: bool = False,
    gzip_extra: bool = True,
    compress: bool = False,
) -> Path:
    """An OCI layout in a tar (``oci-archive:`` in skopeo/podman); ``compress`` gzips it."""
    files = _oci_files(rootfs, extra_layers, multi_arch, gzip_extra)
    return _write_tar(dest_tar, files, compress)
