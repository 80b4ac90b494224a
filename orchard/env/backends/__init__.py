"""Where sandboxes run: the Backend protocol and its implementations."""

from orchard.env.backends.base import (
    Backend,
    BackendError,
    SandboxHandle,
    SandboxSpec,
    SpecRejected,
)

__all__ = ["Backend", "BackendError", "SandboxHandle", "SandboxSpec", "SpecRejected"]
