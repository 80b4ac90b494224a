"""The OpenEnv server of a task set: OpenEnv's own FastAPI app (``/ws`` sessions, ``/reset``,
``/step``, ``/state``, ``/schema``, ``/metadata``, ``/health``, ``/mcp``) over a
``TaskEnvironment``, or a ``ToolsEnvironment`` when the domain serves tools.

Each WebSocket session is one environment and holds at most one sandbox. The HTTP
``/reset`` and ``/step`` make a throwaway environment per request (OpenEnv's design), so an
episode that spans steps needs a session: OpenEnv's clients open one.
"""

from __future__ import annotations

import functools

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocketDisconnect

from orchard.env.errors import ServiceError
from orchard.openenv.environment import ServedTasks, TaskEnvironment
from orchard.openenv.models import TaskAction, TaskObservation
from orchard.openenv.tools import ToolsEnvironment


def create_app(served: ServedTasks, *, max_sessions: int = 8,
               tools: bool | None = None) -> FastAPI:
    """The app serving ``served``: at most ``max_sessions`` episodes (sandboxes) at once;
    tool calls (MCP) when ``tools`` (by default: when the domain serves tools), else shell
    commands."""
    if tools is None:
        tools = served.hooks.mcp is not None
    elif tools and served.hooks.mcp is None:
        raise ValueError(f"the tasks of {served.name} serve no tools; serve them with commands")
    if tools:
        app = create_fastapi_app(functools.partial(ToolsEnvironment, served), CallToolAction,
                                 CallToolObservation, max_concurrent_envs=max_sessions)
    else:
        app = create_fastapi_app(functools.partial(TaskEnvironment, served), TaskAction,
                                 TaskObservation, max_concurrent_envs=max_sessions)

    app.add_middleware(_QuietClose)

    @app.exception_handler(ServiceError)
    async def _service_error(_: Request, exc: ServiceError) -> JSONResponse:
        return JSONResponse({"detail": exc.detail}, status_code=exc.status,
                            headers=exc.headers)

    return app


class _QuietClose:
    """OpenEnv's session closes the socket after a client that already closed it, which
    raises WebSocketDisconnect: the session ended normally, so no traceback is logged."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.app(scope, receive, send)
        except WebSocketDisconnect:
            if scope["type"] != "websocket":
                raise


def serve(served: ServedTasks, *, host: str = "127.0.0.1", port: int = 8000,
          max_sessions: int = 8, tools: bool | None = None) -> None:
    """Serve until interrupted; the sessions' sandboxes are deleted as they close."""
    uvicorn.run(create_app(served, max_sessions=max_sessions, tools=tools), host=host, port=port,
                log_level="warning", ws_max_size=16 << 20)
