"""The wire contract of the image cache (GET /images and its kin), and :class:`ImageConfig`,
what an image says about how to run it: pulled images and built ones record the same
(``config_from_oci`` reads it from a pulled image's config blob)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from orchard.env.schema import StrictModel

# Why an image could not be had; the HTTP status a create answers with for each.
ImageErrorKind = Literal["invalid_reference", "forbidden", "not_found", "unauthorized",
                         "digest_mismatch", "no_platform", "registry_unavailable", "disk_full",
                         "bad_image"]
IMAGE_ERROR_STATUS: dict[str, int] = {
    "invalid_reference": 400, "forbidden": 403, "not_found": 404, "unauthorized": 401,
    "digest_mismatch": 422,
    "no_platform": 422, "bad_image": 422, "registry_unavailable": 502, "disk_full": 507}


def _str_list(value: Any) -> list[str] | None:
    return [str(v) for v in value] if isinstance(value, list) else None


class ImageConfig(StrictModel):
    """What a Dockerfile recorded besides files: applied to every sandbox of the image (env,
    workdir) or kept for whoever runs it (user, entrypoint, cmd, the rest)."""

    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None
    user: str | None = None
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    shell: list[str] | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    exposed_ports: list[str] = Field(default_factory=list)
    volumes: list[str] = Field(default_factory=list)
    stop_signal: str | None = None


def config_from_oci(blob: Any) -> ImageConfig:
    """An image config blob's run settings (its ``config`` object, as Docker and OCI write
    it); anything malformed is left out."""
    inner = blob.get("config") if isinstance(blob, dict) else None
    if not isinstance(inner, dict):
        return ImageConfig()
    env = [e for e in _str_list(inner.get("Env")) or [] if "=" in e]
    labels = inner.get("Labels")
    ports, volumes = inner.get("ExposedPorts"), inner.get("Volumes")
    return ImageConfig(
        env=dict(e.split("=", 1) for e in env), workdir=inner.get("WorkingDir") or None,
        user=inner.get("User") or None, entrypoint=_str_list(inner.get("Entrypoint")),
        cmd=_str_list(inner.get("Cmd")), shell=_str_list(inner.get("Shell")),
        labels={str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {},
        exposed_ports=sorted(map(str, ports)) if isinstance(ports, dict) else [],
        volumes=sorted(map(str, volumes)) if isinstance(volumes, dict) else [],
        stop_signal=inner.get("StopSignal") or None)


class ImageInfo(BaseModel):
    digest: str = Field(description="The manifest digest it was unpacked from (its id).")
    refs: list[str] = Field(default_factory=list, description="Names it was pulled or "
                            "created by (canonical registry references, or archive paths).")
    size_bytes: int = Field(0, description="Bytes of its unpacked files on disk.")
    pulled_at: datetime | None = None
    last_used: datetime | None = Field(None, description="When a sandbox last started on it.")
    config: ImageConfig = Field(default_factory=ImageConfig)
    sandboxes: list[str] = Field(default_factory=list, description="Live sandboxes on it.")


class ImageList(BaseModel):
    images: list[ImageInfo]
    total_bytes: int
    max_bytes: int | None = Field(None, description="The cache's cap (images.max_cache_bytes).")


class PullImageRequest(StrictModel):
    image: str = Field(min_length=1, max_length=4096, description="A registry reference "
                       "(python:3.12-slim, ghcr.io/org/img:tag, name@sha256:...).")


class ImagesRemoved(BaseModel):
    removed: list[str] = Field(description="Digests of the images removed.")
    freed_bytes: int
