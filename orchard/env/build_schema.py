"""Built images on the wire: how a Dockerfile build's snapshots are labelled, and image names.

A build keeps each step's files as a snapshot (see docs/guides/dockerfiles.md). Every such
snapshot carries ``BUILD_LABEL`` and its step's cache key under ``STEP_LABEL``; the snapshot a
build ends on also carries one ``TAG_PREFIX + name`` label per name it was tagged with, whose
value is that image's config (``ImageConfig``) as JSON: two tags of one set of files may differ
in ENV or CMD. The orchestrator resolves a sandbox's ``image`` by these labels before anything
else, so the builder (a client) and the service agree only on what is here.
"""

from __future__ import annotations

import re

BUILD_LABEL = "orchard.dev/build"  # on every snapshot a build made: "step"
STEP_LABEL = "orchard.dev/build-step"  # the step's cache key (sha256 hex)
TAG_PREFIX = "orchard.dev/image:"  # + the normalised name; the value is an ImageConfig's JSON
# Docker's reference grammar, loosely: lower-case path components, an optional tag.
_NAME = re.compile(r"^[a-z0-9]+([._/-][a-z0-9]+)*(:\d+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*"
                   r"(:[A-Za-z0-9_][A-Za-z0-9._-]{0,127})?$")


def normalize_name(name: str) -> str:
    """``name`` with ``:latest`` when it has no tag, as Docker reads it; ValueError when it
    is no image name."""
    if not _NAME.match(name):
        raise ValueError(f"{name!r} is not an image name: use lower-case letters, digits and "
                         "separators (. _ - /), optionally ':tag', e.g. 'myapp:1.0'")
    last = name.rsplit("/", 1)[-1]
    return name if ":" in last else f"{name}:latest"


def names_an_image(image: str) -> bool:
    """Whether ``image`` could be a built image's name (not ``host`` or a path)."""
    return image != "host" and not image.startswith(("/", ".", "~")) and bool(_NAME.match(image))


def tag_label(name: str) -> str:
    return TAG_PREFIX + normalize_name(name)
