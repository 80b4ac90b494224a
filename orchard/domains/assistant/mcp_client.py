"""An MCP client session (the ``mcp`` SDK's) on a sandbox's assistant services.

The services' MCP endpoint listens on the sandbox's loopback; the session reaches it through
the orchestrator's service requests, so a harness anywhere can use the tools over MCP and
every call is an ``http`` event in the sandbox's log.

    async with mcp_session(async_sandbox) as session:
        tools = await session.list_tools()
        result = await session.call_tool("contacts_search", {"query": "dana"})
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import httpx
import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from orchard.domains.assistant.model import SERVICES_PORT
from orchard.env.client import AsyncSandbox, AsyncSandboxServiceTransport


class _Bridge(httpx2.AsyncBaseTransport):
    """The MCP SDK's HTTP client (httpx2) on the SDK's sandbox transport (httpx)."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self.inner = AsyncSandboxServiceTransport(sandbox)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        sent = httpx.Request(request.method, str(request.url), headers=list(request.headers.raw),
                             content=await request.aread(), extensions=request.extensions)
        answer = await self.inner.handle_async_request(sent)
        return httpx2.Response(answer.status_code, headers=list(answer.headers.raw),
                               content=answer.content)


@contextlib.asynccontextmanager
async def mcp_session(sandbox: AsyncSandbox, port: int = SERVICES_PORT
                      ) -> AsyncIterator[ClientSession]:
    """An initialized MCP session on the services at ``port`` in ``sandbox``."""
    async with httpx2.AsyncClient(transport=_Bridge(sandbox)) as http, \
            streamable_http_client(f"http://sandbox:{port}/mcp", http_client=http) as streams, \
            ClientSession(streams[0], streams[1]) as session:
        await session.initialize()
        yield session
