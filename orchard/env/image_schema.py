"""The wire contract of the image cache (GET /images and its kin), and :class:`ImageConfig`,
what an image says about how to run it: pulled images and built ones record the same
(``config_from_oci`` reads it from a pulled image's config blob)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ImageConfig(BaseModel):
    """What a Dockerfile recorded besides files: applied to every sandbox of the image (env,
    workdir) or kept for whoever runs it (user, entrypoint, cmd, the rest)."""

    model_config = ConfigDict(extra="forbid")

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
