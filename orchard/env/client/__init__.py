"""Python SDK of the Orchard sandbox service: a blocking and an asyncio client."""

from orchard.env.client.async_client import AsyncSandbox, AsyncSandboxClient
from orchard.env.client.async_pty import AsyncPtySession
from orchard.env.client.base import RetryPolicy
from orchard.env.client.calls import ExecOptions
from orchard.env.client.errors import (
    APIError,
    AuthenticationError,
    ConflictError,
    ConnectError,
    ImagePullFailed,
    IncompleteDownload,
    InvalidRequest,
    NotFoundError,
    OrchardError,
    Overloaded,
    PayloadTooLarge,
    SandboxNotReady,
    ServerError,
    TransportError,
    WaitTimeout,
)
from orchard.env.client.results import ExecEvent, ExecResult, ProcessOutputResult
from orchard.env.client.service_transport import (
    AsyncSandboxServiceTransport,
    SandboxServiceTransport,
)
from orchard.env.client.sync_client import Sandbox, SandboxClient
from orchard.env.client.sync_pty import PtySession

__all__ = [
    "APIError",
    "AsyncPtySession",
    "AsyncSandbox",
    "AsyncSandboxClient",
    "AsyncSandboxServiceTransport",
    "AuthenticationError",
    "ConflictError",
    "ConnectError",
    "ExecEvent",
    "ExecOptions",
    "ExecResult",
    "ImagePullFailed",
    "IncompleteDownload",
    "InvalidRequest",
    "NotFoundError",
    "OrchardError",
    "Overloaded",
    "PayloadTooLarge",
    "ProcessOutputResult",
    "PtySession",
    "RetryPolicy",
    "Sandbox",
    "SandboxClient",
    "SandboxServiceTransport",
    "SandboxNotReady",
    "ServerError",
    "TransportError",
    "WaitTimeout",
]
