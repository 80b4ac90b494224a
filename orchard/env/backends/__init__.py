"""Where sandboxes run: the Backend protocol and its implementations."""

from orchard.env.backends.base import (
    Backend,
    BackendError,
    SandboxHandle,
    SandboxSpec,
    SpecForbidden,
    SpecRejected,
)

__all__ = ["Backend", "BackendError", "SandboxHandle", "SandboxSpec", "SpecForbidden",
           "SpecRejected"]
