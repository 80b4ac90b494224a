"""The `images:` section of the orchestrator's settings: where the local backend takes images
from, how it reaches registries, and how much it keeps. Apart from config.py so that the
local backend reads it without importing the other backends' settings."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, ValidationInfo, field_validator


class RegistryCredentials(BaseModel):
    """How to log in to one registry: a username and password, or a bearer token."""

    username: str | None = None
    password: str | None = None
    token: str | None = Field(None, description="A registry bearer token (instead of a "
                              "username and password).")

    @field_validator("token")
    @classmethod
    def _one_kind(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and info.data.get("username") is not None:
            raise ValueError("give either a username and password or a token, not both")
        return value


class ImagesConfig(BaseModel):
    """Where the local backend takes images from: the `images:` section of the config."""

    dir: Path | None = Field(
        None, description="Where to put rootfs dirs, OCI layouts and archives; always "
        "allowed. Default <data_dir>/images (for an embedded orchestrator on a private data "
        "dir, the default data dir's).")
    allowed_paths: list[Path] = Field(
        default_factory=list, description="More directories whose contents may be images "
        "(after symlinks are resolved); never inside the data dir or cache dir.")

    docker_config: Path | None = Field(
        None, description="A docker config.json whose `auths` (and credential helpers) log "
        "in to registries. Default: $DOCKER_CONFIG/config.json, else "
        "~/.docker/config.json, where it exists.")
    registries: dict[str, RegistryCredentials] = Field(
        default_factory=dict, description="Credentials per registry host (docker.io, "
        "ghcr.io, host:port); they win over the docker config's.")
    insecure_registries: list[str] = Field(
        default_factory=list, description="Registries (host or host:port) spoken to over "
        "plain HTTP or unverified TLS. Loopback registries (127.0.0.1, localhost, ::1) "
        "always are, as in Docker.")
    mirrors: dict[str, list[str]] = Field(
        default_factory=dict, description="Pull-through mirrors per registry, tried in order "
        "before it: {'docker.io': ['mirror.internal:5000']}.")
    allowed_registries: list[str] | None = Field(
        None, description="The only registries (host, or host:port) images may be pulled "
        "from; others are refused with 403. Default: any.")
    max_cache_bytes: int | None = Field(
        None, ge=0, description="Cap on the unpacked images the local backend keeps; past it, "
        "the least recently used images no sandbox uses are removed after each pull.")

    @field_validator("dir", "allowed_paths")
    @classmethod
    def _absolute(cls, value: Path | list[Path] | None) -> Path | list[Path] | None:
        for path in value if isinstance(value, list) else [value]:
            if path is not None and not path.is_absolute():
                raise ValueError(f"{path} is not an absolute path; image directories are "
                                 "paths on the orchestrator's machine, give them in full")
        return value
