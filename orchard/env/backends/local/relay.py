"""The host end of model_proxy sandboxes' only way out: a byte relay to the recording proxy.

A model_proxy sandbox's network namespace holds only loopback. Its agent listens on
127.0.0.1:MODEL_PORT inside and relays each connection through a Unix socket in the sandbox's
control dir; this end connects that socket to the configured proxy and nowhere else, so what
the sandbox may reach is fixed here, not by anything inside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from pathlib import Path
from urllib.parse import urlsplit

from orchard.env.backends.base import BackendError, SpecRejected

MODEL_SOCKET = "model.sock"
# Where a model_proxy sandbox finds the recording proxy, on its own loopback.
MODEL_PORT = 18080


class ModelRelays:
    """One Unix-socket server per model_proxy sandbox, all leading to one proxy address."""

    def __init__(self, proxy_url: str | None) -> None:
        self.proxy = _proxy_address(proxy_url) if proxy_url else None
        self._servers: dict[str, asyncio.Server] = {}

    def base_url(self, session: str) -> str:
        """The proxy's OpenAI base URL as a sandbox sees it."""
        if self.proxy is None:
            raise SpecRejected("this orchestrator has no recording proxy: start it with "
                               "--model-proxy http://HOST:PORT")
        return f"http://127.0.0.1:{MODEL_PORT}/s/{session}/v1"

    def __contains__(self, sandbox_id: str) -> bool:
        return sandbox_id in self._servers

    async def open(self, sandbox_id: str, ctl_dir: Path, uid: int | None) -> None:
        path = ctl_dir / MODEL_SOCKET
        path.unlink(missing_ok=True)
        self._servers[sandbox_id] = await asyncio.start_unix_server(self._relay, path=str(path))
        if uid is not None:  # the agent, as sandbox root, connects to it
            os.chown(path, uid, uid)

    def close(self, sandbox_id: str) -> None:
        server = self._servers.pop(sandbox_id, None)
        if server is not None:
            server.close()

    def close_all(self) -> None:
        for sandbox_id in list(self._servers):
            self.close(sandbox_id)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self.proxy is not None
        host, port = self.proxy
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError as e:
            body = json.dumps({"error": {
                "message": f"the recording proxy at {host}:{port} is unreachable ({e}); start "
                           "`orchard proxy` there or fix the orchestrator's --model-proxy",
                "type": "orchard_proxy_unreachable", "code": 502}}).encode()
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: application/json\r\n"
                         b"Connection: close\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(body), body))
            await _close(writer)
            return
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            await _close(up_writer)
            await _close(writer)


def _proxy_address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or parts.path.strip("/"):
        raise BackendError(f"--model-proxy {url!r} must be http://HOST:PORT with no path: "
                           "sandboxes reach it through a byte relay, so TLS and path "
                           "prefixes cannot be added on the way")
    return parts.hostname, parts.port or 80


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        writer.close()  # the other side of a broken pair: end the whole connection


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
