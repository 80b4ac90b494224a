"""The orchestrator's errors: one root, and the service errors that map to an HTTP status.

:class:`OrchestratorError` is the root of every exception the orchestrator side of
``orchard.env`` raises: these service errors, the agent client's ``AgentError``, the backends'
``BackendError`` and ``SpecRejected``, the state stores' ``LockTimeout`` and its kin. Each
keeps the builtin base it had (``RuntimeError``, ``ValueError``, ...), so handlers written for
those still catch it. The SDK's errors are another tree (``orchard.env.client.errors``): a
client sees a server's error as an ``APIError`` carrying its status.

This module imports nothing of orchard at load time, so that every module can derive from the
root.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchard.env.agent.client import AgentError


class OrchestratorError(Exception):
    """Raised on purpose by the orchestrator; the message says what went wrong and what to do."""


class ServiceError(OrchestratorError):
    status = 500

    def __init__(self, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.headers = headers or {}


class BadRequest(ServiceError):
    status = 400


class Unauthorized(ServiceError):
    """A registry refused our credentials for an image (not the API key: see auth.py)."""

    status = 401


class Forbidden(ServiceError):
    """Refused by the orchestrator's configuration (not by the API key: see auth.py)."""

    status = 403


class NotFound(ServiceError):
    status = 404


class WaitTimedOut(ServiceError):
    status = 408


class Conflict(ServiceError):
    status = 409


class TooLarge(ServiceError):
    status = 413


class Unprocessable(ServiceError):
    """The request names something that cannot be used as it is (an image with no manifest
    for this platform, or whose content does not match its digest)."""

    status = 422


class BadGateway(ServiceError):
    """A server we depend on (an image registry) failed or could not be reached."""

    status = 502


class InsufficientStorage(ServiceError):
    status = 507


class Overloaded(ServiceError):
    status = 503

    def __init__(self, detail: str, retry_after: float = 1.0) -> None:
        super().__init__(detail, {"Retry-After": str(max(1, round(retry_after)))})


class BadAgentAnswer(ServiceError):
    """The sandbox's agent sent an answer over agent_max_response_bytes, or a head no genuine
    agent sends."""

    status = 502


class AgentTimedOut(ServiceError):
    status = 504


_BY_STATUS: dict[int, type[ServiceError]] = {
    400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict,
    422: Unprocessable, 502: BadGateway, 507: InsufficientStorage}


def for_status(status: int, detail: str) -> ServiceError:
    """The service error that answers with ``status`` (502 for one we have none for)."""
    return _BY_STATUS.get(status, BadGateway)(detail)


_AGENT_STATUS: dict[int, type[ServiceError]] = {
    404: NotFound, 409: Conflict, 413: TooLarge, 503: Overloaded, 504: AgentTimedOut}


def from_agent(e: AgentError, sid: str) -> ServiceError:
    """The one mapping of an agent's error to ours, for every sandbox route.

    The agent's own status is kept where it means the same to our clients (a 503 at the pids
    limit stays a retryable 503); anything else it refuses is the request's fault (400).
    """
    # Here, not at the top: the agent client's errors derive from OrchestratorError above.
    from orchard.env.agent.client import AgentTooLarge, AgentUnreachable

    if isinstance(e, AgentTooLarge):
        return TooLarge(e.detail) if e.status == 413 else BadAgentAnswer(e.detail)
    if isinstance(e, AgentUnreachable):
        return Conflict(f"sandbox {sid} is not reachable ({e.detail}); it may have crashed: "
                        f"check GET /sandboxes/{sid} and recreate it")
    return _AGENT_STATUS.get(e.status, BadRequest)(e.detail)
