"""Harbor on Orchard: the environment provider Harbor's CLI loads
(``orchard.integrations.harbor.environment:OrchardEnvironment``, which needs the ``harbor``
extra and is not imported here), and a Harbor task's image: a name, or its Dockerfile built
by Orchard's builder."""

from orchard.integrations.harbor.images import build_environment, has_dockerfile, image_name

__all__ = ["build_environment", "has_dockerfile", "image_name"]
