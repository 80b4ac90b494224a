"""Serving an ASGI app on 127.0.0.1 in a background thread: the embedded orchestrator, the
teacher model server and the proxy in tests all run this way. And the admin-key check that the
recording proxy and the policy server put on their control routes."""

from __future__ import annotations

import asyncio
import hmac
import secrets
import threading
import time
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

import uvicorn

T = TypeVar("T")


class ThreadedServer:
    """An ASGI app served by uvicorn on 127.0.0.1 (a free port) in a background thread."""

    def __init__(self, app: Any, name: str) -> None:
        self.app = app
        self.name = name
        self.url: str | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, timeout: float = 60.0) -> str:
        config = uvicorn.Config(self.app, host="127.0.0.1", port=0, log_level="warning",
                                access_log=False, lifespan="on")
        self._server = server = uvicorn.Server(config)
        server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve(server)),
                                        name=self.name, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"{self.name} failed to start; see the log above")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not up after {timeout}s")
            time.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def _serve(self, server: uvicorn.Server) -> None:
        self._loop = asyncio.get_running_loop()
        await server.serve()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        """Runs ``coro`` on the server's event loop, where its app's objects live, and waits
        for its result; for callers in other threads."""
        if self._loop is None or self._server is None:
            coro.close()
            raise RuntimeError(f"{self.name} is not running; start it first")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(60)
        self._server = self._thread = self._loop = None
        self.url = None


def new_admin_key() -> str:
    """A fresh random admin key, for a server whose only reader is the process that made it."""
    return secrets.token_urlsafe(32)


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The key a request carries, in ``X-API-Key`` or ``Authorization: Bearer``."""
    value = headers.get("authorization", "")
    bearer = value[7:].strip() if value.lower().startswith("bearer ") else None
    return headers.get("x-api-key") or bearer


def admin_key_refusal(expected: str | None, headers: Mapping[str, str], what: str,
                      configure: str) -> tuple[int, str] | None:
    """Why a request for the admin-only ``what`` is refused, as (status, message), or None
    when it carries ``expected`` in ``X-API-Key`` or ``Authorization: Bearer``. A server with
    no key has ``what`` turned off; ``configure`` says how to give it one."""
    if expected is None:
        return 403, f"{what} is turned off on this server: {configure}"
    given = presented_key(headers)
    if not given:
        return 401, f"{what} needs this server's admin key: send it as X-API-Key ({configure})"
    if not hmac.compare_digest(given.encode(), expected.encode()):
        return 403, f"wrong admin key for {what}"
    return None
