"""Running the orchestrator: `orchard serve`, and an embedded one for notebooks and tests."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import resource
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI

from orchard.env.api import create_app
from orchard.env.backends.base import Backend
from orchard.env.config import Settings
from orchard.env.service import SandboxService
from orchard.env.state.sqlite import SqliteStore, sqlite_path


def make_backend(settings: Settings, embedded: bool = False) -> Backend:
    if settings.backend == "local":
        from orchard.env.backends.local.backend import LocalBackend

        return LocalBackend(settings.data_dir / "local", die_with_orchestrator=embedded)
    raise ValueError(f"unknown backend {settings.backend!r}; this build supports: local")


def build_app(settings: Settings, delete_on_shutdown: bool = False) -> FastAPI:
    """The ASGI app; the service starts (re-adopting sandboxes) with the app's lifespan."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    # Every live sandbox holds a keep-alive connection to its agent: a thousand sandboxes
    # would exhaust the usual soft limit of 1024 descriptors.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    backend = make_backend(settings, embedded=delete_on_shutdown)
    store = SqliteStore(sqlite_path(settings.state_url()))
    service = SandboxService(backend, store, settings)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await service.start()
        try:
            yield
        finally:
            await service.stop(delete_all=delete_on_shutdown)
            await backend.close()
            await store.close()

    app = create_app(service, lifespan=lifespan)
    app.state.service = service
    return app


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(host: str = "127.0.0.1", port: int = 8000, backend: str = "local",
          state: str | None = None, api_keys: list[str] | None = None,
          data_dir: Path | None = None, max_sandboxes: int | None = None,
          max_concurrent_creates: int | None = None, log_level: str = "info") -> None:
    """Run the orchestrator until interrupted. Sandboxes outlive it and are re-adopted."""
    keys = [*(api_keys or []), *filter(None, os.environ.get("ORCHARD_API_KEYS", "").split(","))]
    if not _is_loopback(host) and not keys:
        raise SystemExit(f"refusing to listen on {host} without API keys: pass --api-key KEY "
                         "(or set ORCHARD_API_KEYS), or listen on 127.0.0.1")
    options: dict[str, Any] = {"backend": backend, "state": state, "api_keys": keys}
    if data_dir is not None:
        options["data_dir"] = data_dir
    if max_sandboxes is not None:
        options["max_sandboxes"] = max_sandboxes
    if max_concurrent_creates is not None:
        options["max_concurrent_creates"] = max_concurrent_creates
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per agent call otherwise
    app = build_app(Settings(**options))
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False,
                timeout_graceful_shutdown=10)


class EmbeddedOrchestrator:
    """An orchestrator on 127.0.0.1 in a background thread, for the life of a client.

    It deletes every sandbox it made when stopped, so a notebook or a test needs no set-up
    and leaves nothing behind.
    """

    def __init__(self, data_dir: Path | None = None, **settings: Any) -> None:
        if data_dir is not None:
            settings["data_dir"] = data_dir
        self.settings = Settings(**settings)
        self.url: str | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def start(self, timeout: float = 60.0) -> str:
        app = build_app(self.settings, delete_on_shutdown=True)
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                access_log=False, lifespan="on")
        self._server = server = uvicorn.Server(config)
        server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        self._thread = threading.Thread(target=lambda: asyncio.run(server.serve()),
                                        name="orchard-embedded", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not server.started:
            if not self._thread.is_alive():
                raise RuntimeError("embedded orchestrator failed to start; see the log above")
            if time.monotonic() > deadline:
                raise RuntimeError(f"embedded orchestrator not up after {timeout}s")
            time.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(60)
        self._server = self._thread = None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
