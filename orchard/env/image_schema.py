"""The wire contract of the image cache (GET /images and its kin), and :class:`ImageConfig`,
what an image says about how to run it: pulled images and built ones record the same."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# Why an image could not be had; the HTTP status a create answers with for each.
ImageErrorKind = Literal["invalid_reference", "not_found", "unauthorized", "digest_mismatch",
                         "no_platform", "registry_unavailable", "disk_full", "bad_image"]
IMAGE_ERROR_STATUS: dict[str, int] = {
    "invalid_reference": 400, "not_found": 404, "unauthorized": 401, "digest_mismatch": 422,
    "no_platform": 422, "bad_image": 422, "registry_unavailable": 502, "disk_full": 507}


def _str_list(value: Any) -> list[str] | None:
    return [str(v) for v in value] if isinstance(value, list) else None


class ImageConfig(BaseModel):
    """The run settings of an image (the OCI image config's ``config``): Env becomes the
    sandbox's default env (a create's own env wins); the rest is recorded."""

    env: list[str] = Field(default_factory=list, description="KEY=VALUE, in order.")
    working_dir: str | None = None
    user: str | None = None
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None

    @classmethod
    def from_oci(cls, config: Any) -> ImageConfig:
        """From an image config blob (its ``config`` object); anything malformed is left out."""
        inner = config.get("config") if isinstance(config, dict) else None
        if not isinstance(inner, dict):
            return cls()
        return cls(env=[e for e in _str_list(inner.get("Env")) or [] if "=" in e],
                   working_dir=inner.get("WorkingDir") or None, user=inner.get("User") or None,
                   entrypoint=_str_list(inner.get("Entrypoint")), cmd=_str_list(inner.get("Cmd")))

    def env_dict(self) -> dict[str, str]:
        return dict(e.split("=", 1) for e in self.env)


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


class PullImageRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    image: str = Field(min_length=1, max_length=4096, description="A registry reference "
                       "(python:3.12-slim, ghcr.io/org/img:tag, name@sha256:...).")


class ImagesRemoved(BaseModel):
    removed: list[str] = Field(description="Digests of the images removed.")
    freed_bytes: int
