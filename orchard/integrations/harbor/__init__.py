"""Harbor on Orchard: the environment provider Harbor's CLI loads
(``orchard.integrations.harbor.environment:OrchardEnvironment``, which needs the ``harbor``
extra and is not imported here), and what Harbor tasks need from the SDK: their sandbox image,
a Dockerfile built once per content."""

from orchard.integrations.harbor.images import (
    built_image_name,
    content_hash,
    ensure_image,
    ensure_image_sync,
    has_dockerfile,
)

__all__ = ["built_image_name", "content_hash", "ensure_image", "ensure_image_sync",
           "has_dockerfile"]
