"""The orchestrator's side of the agent protocol (see ``agent/server.py``), over Unix or TCP.

One keep-alive connection pool per sandbox; no retries here (an exec must never run twice),
errors come back as ``AgentError`` with the agent's own message.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
from collections.abc import AsyncIterator
from typing import Any

import httpx

_PTY_FRAME = struct.Struct(">BI")


class AgentError(Exception):
    """The agent answered with an error (``status`` is its HTTP status)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


class AgentUnreachable(AgentError):
    """The agent could not be reached: the sandbox is dead or still starting."""

    def __init__(self, detail: str) -> None:
        super().__init__(502, detail)


def _transport_for(address: str) -> tuple[httpx.AsyncHTTPTransport, str]:
    # verify=False: the agent speaks plain HTTP, and a default transport would load the CA
    # bundle (~28 ms and ~0.8 MiB) for every sandbox.
    kind, _, rest = address.partition(":")
    if kind == "unix":
        return httpx.AsyncHTTPTransport(uds=rest, verify=False), "http://agent"
    if kind == "tcp":
        return httpx.AsyncHTTPTransport(verify=False), f"http://{rest}"
    raise ValueError(f"agent address must be unix:PATH or tcp:HOST:PORT, got {address!r}")


class AgentClient:
    def __init__(self, address: str, token: str | None = None) -> None:
        self.address = address
        transport, base = _transport_for(address)
        headers = {"X-Agent-Token": token} if token else {}
        self._http = httpx.AsyncClient(
            transport=transport, base_url=base, headers=headers, timeout=None, trust_env=False
        )
        self._token = token

    async def close(self) -> None:
        await self._http.aclose()

    async def _call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            r = await self._http.request(method, path, **kw)
        except httpx.TransportError as e:
            raise AgentUnreachable(f"agent at {self.address} unreachable: {e!r}") from None
        if r.status_code >= 400:
            raise AgentError(r.status_code, _detail(r.content))
        return r.json()

    async def health(self, timeout: float = 5.0) -> dict[str, Any]:
        return await self._call("GET", "/health", timeout=timeout)

    async def exec(self, req: dict[str, Any]) -> dict[str, Any]:
        return await self._call("POST", "/exec", json=req)

    async def exec_stream(self, req: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        try:
            async with self._http.stream("POST", "/exec", json={**req, "stream": True}) as r:
                if r.status_code >= 400:
                    raise AgentError(r.status_code, _detail(await r.aread()))
                async for line in r.aiter_lines():
                    if line:
                        yield json.loads(line)
        except httpx.TransportError as e:
            raise AgentUnreachable(f"agent at {self.address} unreachable: {e!r}") from None

    async def start_process(self, req: dict[str, Any]) -> dict[str, Any]:
        return await self._call("POST", "/processes", json=req)

    async def processes(self) -> dict[str, Any]:
        return await self._call("GET", "/processes")

    async def process(self, pid: str, method: str = "GET") -> dict[str, Any]:
        return await self._call(method, f"/processes/{pid}")

    async def process_output(self, pid: str, stdout_offset: int, stderr_offset: int) -> Any:
        params = {"stdout_offset": stdout_offset, "stderr_offset": stderr_offset}
        return await self._call("GET", f"/processes/{pid}/output", params=params)

    async def put_file(self, path: str, body: Any, mode: int | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"path": path}
        if mode is not None:
            params["mode"] = mode
        return await self._call("PUT", "/files", params=params, content=body)

    async def open_file(self, path: str) -> httpx.Response:
        """A streaming response for the file; the caller must ``aclose()`` it."""
        req = self._http.build_request("GET", "/files", params={"path": path})
        try:
            r = await self._http.send(req, stream=True)
        except httpx.TransportError as e:
            raise AgentUnreachable(f"agent at {self.address} unreachable: {e!r}") from None
        if r.status_code >= 400:
            body = await r.aread()
            await r.aclose()
            raise AgentError(r.status_code, _detail(body))
        return r

    async def list_files(self, path: str) -> dict[str, Any]:
        return await self._call("GET", "/files/list", params={"path": path})

    async def mkdir(self, path: str) -> dict[str, Any]:
        return await self._call("POST", "/files/mkdir", params={"path": path})

    async def remove(self, path: str, recursive: bool) -> dict[str, Any]:
        params = {"path": path, "recursive": "true" if recursive else "false"}
        return await self._call("DELETE", "/files", params=params)

    async def patch(self, req: dict[str, Any]) -> dict[str, Any]:
        return await self._call("POST", "/patch", json=req)

    async def open_pty(self, argv: list[str], cols: int, rows: int) -> PtyChannel:
        kind, _, rest = self.address.partition(":")
        try:
            if kind == "unix":
                reader, writer = await asyncio.open_unix_connection(rest)
            else:
                host, _, port = rest.rpartition(":")
                reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))
        except OSError as e:
            raise AgentUnreachable(f"agent at {self.address} unreachable: {e!r}") from None
        query = httpx.QueryParams({"argv": json.dumps(argv), "cols": cols, "rows": rows})
        token = f"X-Agent-Token: {self._token}\r\n" if self._token else ""
        writer.write(f"GET /pty?{query} HTTP/1.1\r\nHost: agent\r\nUpgrade: orchard-pty\r\n"
                     f"Connection: Upgrade\r\n{token}\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if status != 101:
            body = await reader.read()
            writer.close()
            raise AgentError(status, _detail(body.split(b"\r\n\r\n", 1)[-1] if body else head))
        return PtyChannel(reader, writer)


class PtyChannel:
    """A framed byte channel to a PTY session in the sandbox."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer

    async def send(self, data: bytes) -> None:
        self._writer.write(_PTY_FRAME.pack(0, len(data)) + data)
        await self._writer.drain()

    async def resize(self, cols: int, rows: int) -> None:
        payload = f"{cols},{rows}".encode()
        self._writer.write(_PTY_FRAME.pack(1, len(payload)) + payload)
        await self._writer.drain()

    async def recv(self) -> tuple[str, bytes]:
        """("data", bytes) or ("exit", b"<code>"); ("closed", b"") when the agent hung up."""
        try:
            kind, n = _PTY_FRAME.unpack(await self._reader.readexactly(_PTY_FRAME.size))
            payload = await self._reader.readexactly(n)
        except (asyncio.IncompleteReadError, ConnectionError):
            return "closed", b""
        return ("data" if kind == 0 else "exit"), payload

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.wait_closed()


def _detail(body: bytes) -> str:
    try:
        return str(json.loads(body)["detail"])
    except (ValueError, KeyError, TypeError):
        return body.decode(errors="replace")[:2000] or "empty response"
