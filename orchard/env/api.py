"""The FastAPI app: the routers of orchard/env/routes, the Host/Origin guard, auth, body limits,
error answers."""

from __future__ import annotations

import contextlib
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orchard.env.auth import check_key, given_key
from orchard.env.errors import ServiceError, TooLarge
from orchard.env.routes import (
    browser,
    files,
    images,
    processes,
    sandboxes,
    services,
    snapshots,
    system,
)
from orchard.env.routes import exec as exec_routes
from orchard.env.routes.files import RAW_UPLOAD
from orchard.env.service import SandboxService
from orchard.env.state.base import LockTimeout, StoreUnavailable
from orchard.http_guard import HostOriginGuard
from orchard.version import __version__


class BodyLimit:
    """413 for JSON bodies over the limit, counted as they arrive (chunked bodies too)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].endswith(RAW_UPLOAD):
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await self._reject(send)
        seen, exceeded, started = 0, False, False

        async def counted() -> Message:
            nonlocal seen, exceeded
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                exceeded = True
                raise TooLarge(self._detail())
            return message

        async def guarded(message: Message) -> None:
            nonlocal started
            # FastAPI turns any error while reading a body into "400 error parsing the body":
            # once the limit is crossed, the app's own answer is dropped for our 413.
            if exceeded and not started:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        with contextlib.suppress(TooLarge):
            await self.app(scope, counted, guarded)
        if exceeded and not started:
            await self._reject(send)

    def _detail(self) -> str:
        return (f"request body is over {self.limit} bytes; send files with PUT "
                f"/sandboxes/{{id}}{RAW_UPLOAD} (raw bytes, streamed) instead")

    async def _reject(self, send: Send) -> None:
        await JSONResponse({"detail": self._detail()}, 413)({"type": "http"}, _nothing, send)


async def _nothing() -> Message:
    return {"type": "http.disconnect"}


def create_app(service: SandboxService, lifespan: Any = None) -> FastAPI:
    settings = service.settings
    app = FastAPI(title="Orchard Env", version=__version__, lifespan=lifespan,
                  description="Isolated sandboxes for agents: create, exec, files, patches, PTY.")
    app.add_middleware(BodyLimit, limit=settings.max_json_body)
    # Outermost, so that a refused request is not even read: a browser page that was sent
    # here (DNS rebinding, a cross-site WebSocket) gets nothing, key or no key.
    app.add_middleware(HostOriginGuard, allowed_hosts=settings.hosts(),
                       allowed_origins=settings.allowed_origins)

    async def auth(request: Request) -> None:  # async: a sync one costs a thread hop
        check_key(settings.api_keys, given_key(request))

    @app.exception_handler(ServiceError)
    async def _service_error(_: Request, exc: ServiceError) -> JSONResponse:
        return JSONResponse({"detail": exc.detail}, exc.status, headers=exc.headers)

    @app.exception_handler(StoreUnavailable)
    @app.exception_handler(LockTimeout)
    async def _store_trouble(_: Request, exc: Exception) -> JSONResponse:
        # Transient by nature (a Redis failover, a record busy with another replica's change):
        # nothing was half-done that a retry would repeat wrongly.
        return JSONResponse({"detail": f"state store: {exc}; retry shortly"}, 503,
                            headers={"Retry-After": "2"})

    secured = [Depends(auth)]
    ops = service.ops
    app.include_router(system.router(service, secured))
    app.include_router(sandboxes.router(service, secured))
    app.include_router(exec_routes.router(service, secured))
    app.include_router(files.router(ops, settings, secured))
    app.include_router(processes.router(ops, secured))
    app.include_router(snapshots.router(service, secured))
    app.include_router(browser.router(ops, secured))
    app.include_router(services.router(ops, secured))
    app.include_router(images.router(service, secured))
    return app
