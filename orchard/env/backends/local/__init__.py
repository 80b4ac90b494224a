"""The local backend: namespace sandboxes on this machine (root, overlayfs, cgroups)."""

from orchard.env.backends.local.backend import LocalBackend

__all__ = ["LocalBackend"]
