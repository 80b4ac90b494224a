"""What the sync and async clients share: configuration, retry decisions, cleanup.

Each endpoint is described once, without I/O, in ``calls.py``; the twins (``async_client.py``
and ``async_sandbox.py``, and the blocking ones that ``scripts/unasync.py`` generates from
them) only send calls, sleep for as long as :class:`BaseClient` says, and hand the response
to ``call.parse``. The one blocking exception is the cleanup on SIGINT/SIGTERM
(``_signals.py``), which must work from a signal handler.
"""

from __future__ import annotations

import logging
import os
import random
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Self, TypedDict

import httpx

from orchard.env import schema
from orchard.env.client import errors
from orchard.env.client._signals import SignalCleanup, delete_sandboxes
from orchard.env.client.calls import Call, Retry
from orchard.env.client.http_errors import error_from_response, transport_error

log = logging.getLogger("orchard.client")

DEFAULT_URL = "http://127.0.0.1:8000"
CHUNK_SIZE = 1 << 20
# How long create_sandbox waits for readiness unless told otherwise.
DEFAULT_READY_TIMEOUT = 120.0


def resolve_config(base_url: str | None, api_key: str | None) -> tuple[str, str | None]:
    """Arguments win over ``ORCHARD_URL`` / ``ORCHARD_API_KEY``, then the reference SDK's
    ``SANDBOX_BASE_URL`` / ``SANDBOX_API_KEY``, then defaults."""
    env = os.environ.get
    url = base_url or env("ORCHARD_URL") or env("SANDBOX_BASE_URL") or DEFAULT_URL
    key = api_key if api_key is not None else (
        env("ORCHARD_API_KEY") or env("SANDBOX_API_KEY") or None)
    return url.rstrip("/"), key



@dataclass(frozen=True)
class RetryPolicy:
    retries: int = 3
    backoff: float = 0.5
    max_backoff: float = 8.0
    max_retry_after: float = 60.0

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        if retry_after is not None:
            # Clients turned away together were all told the same wait: at least that, spread
            # over as much again, or they all return at once and are all turned away again.
            wait = min(retry_after, self.max_retry_after)
            return wait + random.uniform(0, wait)
        # Full jitter: clients that failed together must not all come back together.
        return random.uniform(0, min(self.max_backoff, self.backoff * 2**attempt))



class ClientOptions(TypedDict, total=False):
    """Keyword options of both clients; :class:`BaseClient` documents them."""

    api_key: str | None
    timeout: float
    retry: RetryPolicy | None
    cleanup_on_close: bool
    auto_cleanup: bool | None
    prefix: str | None


class _Stoppable(Protocol):
    def stop(self) -> None: ...


class BaseClient:
    """Configuration, retry decisions and the set of sandboxes to delete on close."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        cleanup_on_close: bool = True,
        auto_cleanup: bool | None = None,
        prefix: str | None = None,
    ) -> None:
        """``auto_cleanup`` is the reference SDK's name for ``cleanup_on_close``; ``prefix``
        (or ``SANDBOX_PREFIX``) starts every sandbox id this client makes up or is given."""
        self.base_url, self.api_key = resolve_config(base_url, api_key)
        self.retry_policy = retry or RetryPolicy()
        self.cleanup_on_close = cleanup_on_close if auto_cleanup is None else auto_cleanup
        self.prefix = prefix or os.environ.get("SANDBOX_PREFIX") or None
        self._timeout = httpx.Timeout(timeout, connect=min(timeout, 10.0))
        self._created: dict[str, None] = {}  # an ordered set: delete in creation order
        self._signal_cleanup: SignalCleanup | None = None
        self._orchestrator: _Stoppable | None = None

    @classmethod
    def local(cls, data_dir: Path | None = None, **settings: Any) -> Self:
        """A client of a private orchestrator started in this process, stopped on close."""
        # The server drags in FastAPI and the backends; only this constructor needs them.
        # It is the one import of the server in the SDK, named in the import-linter contract.
        from orchard.env.server import EmbeddedOrchestrator

        orchestrator = EmbeddedOrchestrator(data_dir, **settings)
        url = orchestrator.start()
        try:
            # An orchestrator that made up its own key exposes it; otherwise it needs none.
            client = cls(url, api_key=getattr(orchestrator, "api_key", None))
        except BaseException:
            orchestrator.stop()
            raise
        client._orchestrator = orchestrator
        return client

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_url!r})"

    def create_request(self, image: str, sandbox_id: str | None, **fields: Any
                       ) -> schema.CreateSandboxRequest:
        if self.prefix and not (sandbox_id or "").startswith(f"{self.prefix}-"):
            sandbox_id = f"{self.prefix}-{sandbox_id or uuid.uuid4().hex[:8]}"
        return schema.CreateSandboxRequest(image=image, sandbox_id=sandbox_id, **fields)

    @property
    def headers(self) -> dict[str, str]:
        headers = {"User-Agent": "orchard-sdk"}
        if self.api_key:
            headers["X-API-Key"] = self.api_key
        return headers

    def _http_options(self) -> dict[str, Any]:
        return {"base_url": self.base_url, "headers": self.headers, "timeout": self._timeout}

    def _request(
        self, http: httpx.Client | httpx.AsyncClient, call: Call[Any], content: Any = None
    ) -> httpx.Request:
        return http.build_request(
            call.method,
            call.path,
            params=tuple(call.params),
            json=call.json,
            content=content,
            headers=call.headers,
            timeout=call.timeout or self._timeout,
        )

    def _delay_after_error(self, call: Call[Any], attempt: int, exc: httpx.TransportError) -> float:
        """Seconds to wait before sending ``call`` again; raises when it must not be."""
        if call.retry is not Retry.IDEMPOTENT or attempt >= self.retry_policy.retries:
            raise transport_error(exc, f"{call.method} {self.base_url}{call.path}") from exc
        return self.retry_policy.delay(attempt)

    def _delay_after_response(
        self, call: Call[Any], attempt: int, response: httpx.Response
    ) -> float:
        """Seconds to wait before retrying an error status (a 503); raises otherwise."""
        error = error_from_response(response, call.not_ready)
        if (
            isinstance(error, errors.Overloaded)
            and call.retry is not Retry.NEVER
            and attempt < self.retry_policy.retries
        ):
            return self.retry_policy.delay(attempt, error.retry_after)
        raise error

    def _remember(self, sandbox_id: str) -> None:
        if not self.cleanup_on_close:
            return
        self._created[sandbox_id] = None
        if self._signal_cleanup is None and SignalCleanup.can_install():
            self._signal_cleanup = SignalCleanup(self._cleanup_on_signal)

    def _forget(self, sandbox_id: str) -> None:
        self._created.pop(sandbox_id, None)

    def _cleanup_on_signal(self) -> None:
        ids = list(self._created)
        self._created.clear()
        delete_sandboxes(self.base_url, self.headers, ids)

    def _release(self) -> None:
        """The I/O-free part of closing, after the twin deleted its sandboxes."""
        if self._signal_cleanup is not None:
            self._signal_cleanup.uninstall()
            self._signal_cleanup = None
        orchestrator, self._orchestrator = self._orchestrator, None
        if orchestrator is not None:
            orchestrator.stop()


class SandboxBase:
    """What both sandbox handles hold: the last known :class:`SandboxInfo`."""

    def __init__(self, info: schema.SandboxInfo) -> None:
        self.info = info

    @property
    def id(self) -> str:
        return self.info.sandbox_id

    @property
    def sandbox_id(self) -> str:
        """The same as :attr:`id`: the reference SDK's name for it, for code written to it."""
        return self.info.sandbox_id

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.id!r}, status={self.info.status.value!r})"
