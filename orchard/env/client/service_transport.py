"""httpx transports to a sandbox's own services, through POST /sandboxes/{id}/http.

Any httpx client given one talks to a service the sandbox serves on its loopback as if it were
local, the MCP SDK's client included: the URL's port picks the service, its host is ignored.

    with httpx.Client(transport=SandboxServiceTransport(sb), base_url="http://sandbox:8300") as c:
        c.get("/count").json()
"""

from __future__ import annotations

import base64

import httpx

from orchard.env.client.async_sandbox import AsyncSandbox
from orchard.env.client.sync_sandbox import Sandbox
from orchard.env.http_schema import Method, ServiceResponse

# Set by the agent's own connection, or meaningless once the body is whole.
_HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


def _parts(request: httpx.Request) -> tuple[int, str, Method, str, dict[str, str], float]:
    if request.url.port is None:
        raise httpx.UnsupportedProtocol(f"{request.url} names no port: the port picks the "
                                        "sandbox's service (http://sandbox:8300/...)")
    timeout = (request.extensions.get("timeout") or {}).get("read") or 30.0
    headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
    method: Method = request.method  # type: ignore[assignment]  # the server checks it
    return (request.url.port, request.url.raw_path.decode(), method,
            request.content.decode(), headers, float(timeout))


def _response(answer: ServiceResponse) -> httpx.Response:
    body = (base64.b64decode(answer.body) if answer.encoding == "base64"
            else answer.body.encode())
    headers = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP}
    return httpx.Response(answer.status, headers=headers, content=body)


class SandboxServiceTransport(httpx.BaseTransport):
    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.read()
        port, path, method, body, headers, timeout = _parts(request)
        return _response(self.sandbox.http(port, path, method, body=body, headers=headers,
                                           timeout=timeout))


class AsyncSandboxServiceTransport(httpx.AsyncBaseTransport):
    def __init__(self, sandbox: AsyncSandbox) -> None:
        self.sandbox = sandbox

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await request.aread()
        port, path, method, body, headers, timeout = _parts(request)
        return _response(await self.sandbox.http(port, path, method, body=body,
                                                 headers=headers, timeout=timeout))
