"""Registry image references, parsed and normalised as Docker does: ``python:3.12-slim`` is
``docker.io/library/python:3.12-slim``, a name without a tag or digest means ``:latest``.

The grammar is the distribution project's (reference/regexp.go), kept to what a pull needs.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from orchard.env.backends.local.image_sources import ImageError

DEFAULT_REGISTRY = "docker.io"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_PATH = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
_TAG = re.compile(r"^[\w][\w.-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$|^sha512:[0-9a-f]{128}$")
_HOST = re.compile(r"^(?:[a-zA-Z0-9-]+(?:\.[a-zA-Z0-9-]+)*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?$")


@dataclass(frozen=True)
class ImageRef:
    registry: str  # host[:port]; docker.io for Docker Hub
    repository: str  # library/python
    tag: str | None
    digest: str | None

    @property
    def name(self) -> str:
        """The canonical reference: registry/repository[:tag][@digest]."""
        out = f"{self.registry}/{self.repository}"
        if self.tag:
            out += f":{self.tag}"
        if self.digest:
            out += f"@{self.digest}"
        return out

    def pinned(self, digest: str) -> str:
        """The reference of one manifest by digest, for skopeo (``docker://`` omitted)."""
        return f"{self.registry}/{self.repository}@{digest}"

    @property
    def host(self) -> str:
        """The registry's host without its port."""
        if self.registry.startswith("["):
            return self.registry[1:].split("]", 1)[0]
        return self.registry.rsplit(":", 1)[0] if ":" in self.registry else self.registry

    @property
    def loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


def is_registry_ref(image: str) -> bool:
    """Whether ``image`` names a registry image (not 'host', not a path)."""
    return image != "host" and not image.startswith("/")


def parse_ref(image: str) -> ImageRef:
    """The normalised reference, or ImageError saying what is malformed."""
    text = image.strip()
    if text.startswith("docker://"):
        text = text[len("docker://"):]
    rest, _, digest = text.partition("@")
    if digest and not _DIGEST.match(digest):
        raise ImageError(f"image {image!r}: {digest!r} is not a digest (sha256:<64 hex>)")
    first, sep, remainder = rest.partition("/")
    # As in Docker: the first component is a registry if it has a dot or a port, or is
    # localhost; otherwise the name is on Docker Hub.
    if sep and ("." in first or ":" in first or first == "localhost" or first.startswith("[")):
        registry, path = first, remainder
    else:
        registry, path = DEFAULT_REGISTRY, rest
    tag = None
    name, colon, maybe_tag = path.rpartition(":")
    if colon and "/" not in maybe_tag:
        path, tag = name, maybe_tag
    if registry == "index.docker.io":
        registry = DEFAULT_REGISTRY
    if registry == DEFAULT_REGISTRY and "/" not in path:
        path = f"library/{path}"
    if not _HOST.match(registry) or not _PATH.match(path):
        raise ImageError(
            f"image {image!r} is not 'host', an absolute path or a registry reference such as "
            "python:3.12-slim, ghcr.io/org/img:tag or name@sha256:<digest> (names are "
            "lower-case)")
    if tag is not None and not _TAG.match(tag):
        raise ImageError(f"image {image!r}: {tag!r} is not a valid tag")
    if tag is None and not digest:
        tag = "latest"
    return ImageRef(registry=registry, repository=path, tag=tag, digest=digest or None)
