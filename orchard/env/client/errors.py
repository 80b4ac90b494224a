"""Exceptions raised by the Orchard SDK.

Everything derives from :class:`OrchardError`, so ``except OrchardError`` catches any failure
of the service. :class:`TransportError` means the request may not have reached the server (or
its answer was lost); :class:`APIError` means the server answered with an error status.
"""

from __future__ import annotations


class OrchardError(Exception):
    """Base class of every error the SDK raises on purpose."""


class TransportError(OrchardError):
    """The request or its response was lost on the wire (reset, timeout, protocol error)."""


class ConnectError(TransportError):
    """No connection could be made: the server is down, unreachable or refusing."""


class IncompleteDownload(TransportError):
    """A download broke off before its end: the server cut it (a file that ran past its
    ``max_download_bytes``, or a sandbox agent that failed mid-transfer) or the connection
    dropped. Nothing of it is kept."""


class APIError(OrchardError):
    """The server answered with an error status; ``detail`` is its explanation."""

    def __init__(self, status_code: int, detail: str) -> None:
        super().__init__(f"{status_code}: {detail}")
        self.status_code = status_code
        self.detail = detail


class InvalidRequest(APIError):
    """400 or 422: the server rejected the request's content."""


class AuthenticationError(APIError):
    """401 (no API key) or 403 (a key the server does not accept, or a request its settings
    forbid, such as an image path outside its image directories)."""


class NotFoundError(APIError):
    """404: no such sandbox, job, process or file."""


class WaitTimeout(APIError):
    """408: what was waited for did not happen within the timeout."""


class ConflictError(APIError):
    """409: the request does not fit the resource's state (e.g. the sandbox failed)."""


class SandboxNotReady(ConflictError):
    """The sandbox will never become ready (it failed, or is being deleted)."""

    def __init__(self, sandbox_id: str, detail: str, status_code: int = 409) -> None:
        super().__init__(status_code, detail)
        self.sandbox_id = sandbox_id

    def __str__(self) -> str:
        return f"sandbox {self.sandbox_id} is not ready: {self.detail}"


class ImagePullFailed(SandboxNotReady):
    """The sandbox failed because its image could not be pulled; ``cause`` says why
    (digest_mismatch, disk_full, registry_unavailable, ...) and ``image`` names it."""

    def __init__(self, sandbox_id: str, detail: str, *, image: str, cause: str) -> None:
        super().__init__(sandbox_id, detail)
        self.image = image
        self.cause = cause


class PayloadTooLarge(APIError):
    """413: over a size limit of the server: a body (an upload, a patch, stdin), or what a
    sandbox wrote, for a snapshot."""


class ServerError(APIError):
    """5xx: the server failed."""


class Overloaded(ServerError):
    """503: the server is at capacity; ``retry_after`` is its hint in seconds, if it gave one."""

    def __init__(self, status_code: int, detail: str, retry_after: float | None = None) -> None:
        super().__init__(status_code, detail)
        self.retry_after = retry_after


__all__ = [
    "APIError",
    "AuthenticationError",
    "ConflictError",
    "ConnectError",
    "ImagePullFailed",
    "IncompleteDownload",
    "InvalidRequest",
    "NotFoundError",
    "OrchardError",
    "Overloaded",
    "PayloadTooLarge",
    "SandboxNotReady",
    "ServerError",
    "TransportError",
    "WaitTimeout",
]
