"""The host end of model_proxy sandboxes' only way out: an HTTP relay to the recording proxy.

A model_proxy sandbox's network namespace holds only loopback. Its agent listens on
127.0.0.1:MODEL_PORT inside and relays each connection through a Unix socket in the sandbox's
control dir; this end reads each HTTP request there and sends on only the inference calls of the
sandbox's own session (``POST /s/<session>/v1/chat/completions``, ``.../v1/completions``,
``.../v1/responses``, ``GET .../v1/models`` and ``.../v1/models/<id>``), each as a fresh request
of its own on a new connection to the configured proxy and nowhere else. Everything else (other
sessions, the proxy's ``/sessions`` reads, a model server's control routes such as
``/v1/load_weights``, other methods, absolute-form targets, ambiguous framing) gets a 4xx in
OpenAI's error shape and never reaches the proxy. The request is parsed by h11 and written anew,
so what the proxy receives is exactly the one request that was checked: bytes smuggled after it
are parsed as the next request on the sandbox's side, and checked in turn.

What a sandbox can make the host hold is bounded: a request head (64 KiB) and body (32 MiB),
the bodies of all its requests in flight together (64 MiB), and its open connections (32).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import h11

from orchard.env.backends.base import BackendError, SpecRejected
from orchard.env.errors import OrchestratorError
from orchard.env.schema import SESSION_PATTERN
from orchard.inference_routes import method_of, routes

MODEL_SOCKET = "model.sock"
# Where a model_proxy sandbox finds the recording proxy, on its own loopback.
MODEL_PORT = 18080
# The relay marker in a sandbox dir: it holds the sandbox's session, so that an adopting
# orchestrator re-opens the relay for the same one.
MARKER = "model-proxy"
MAX_HEAD = 64 << 10  # request line and headers
MAX_BODY = 32 << 20  # a long agent conversation is a few MB of JSON
MAX_HELD = 64 << 20  # request bodies of one sandbox held at once, over all its connections
MAX_CONNECTIONS = 32  # per sandbox: each holds an fd and buffers here
LINGER_S = 10  # how long a connection we end is read on (see _linger)
_CHUNK = 65536
# Request headers that mean something to the proxy or the model; the rest stay here.
_PASSED = frozenset({b"content-type", b"accept", b"authorization", b"user-agent",
                     b"openai-organization", b"openai-project", b"x-request-id"})
# Response headers about the proxy's connection, not the answer: h11 frames its own.
_HOP = frozenset({b"connection", b"keep-alive", b"transfer-encoding"})


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

    async def open(self, sandbox_id: str, ctl_dir: Path, uid: int | None,
                   session: str) -> None:
        """Serve ``ctl_dir/model.sock`` for the sandbox, carrying calls of ``session`` only."""
        if not re.fullmatch(SESSION_PATTERN, session):
            raise BackendError(f"sandbox {sandbox_id}: model relay session {session!r} is not "
                               "a session id")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            _bind_in(sock, ctl_dir, uid)
            self._servers[sandbox_id] = await asyncio.start_unix_server(
                functools.partial(self._serve, _Sandbox(session)), sock=sock)
        except BaseException:
            sock.close()
            raise

    def close(self, sandbox_id: str) -> None:
        server = self._servers.pop(sandbox_id, None)
        if server is not None:
            server.close()

    def close_all(self) -> None:
        for sandbox_id in list(self._servers):
            self.close(sandbox_id)

    async def _serve(self, sandbox: _Sandbox, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        """Requests of one sandbox connection, in turn, until either side ends it."""
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        sandbox.connections += 1
        try:
            if sandbox.connections > MAX_CONNECTIONS:
                # Answered before any request is read (h11 has no response to send yet).
                writer.write(_raw_answer(429, f"this sandbox already has {MAX_CONNECTIONS} "
                                              "connections to the model relay open, the most "
                                              "it may; close idle ones"))
                return
            while True:
                request = await _next(conn, reader)
                if not isinstance(request, h11.Request):
                    return
                try:
                    _check(request, sandbox.session)
                    if conn.they_are_waiting_for_100_continue:
                        _send(conn, writer, h11.InformationalResponse(status_code=100, headers=[]))
                    body = await _body(conn, reader, sandbox)
                except _Refused as e:
                    return await _refuse(conn, writer, e.status, e.message)
                try:
                    if not await self._forward(conn, writer, request, body):
                        return
                finally:
                    sandbox.held -= len(body)
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        except h11.RemoteProtocolError as e:
            if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                await _refuse(conn, writer, e.error_status_hint,
                              f"malformed HTTP request ({e}); the model relay takes plain "
                              "HTTP/1.1 requests with one Content-Length or chunked body")
        except OSError:
            pass  # the sandbox side hung up
        finally:
            await _linger(reader, writer)
            sandbox.connections -= 1

    async def _forward(self, conn: h11.Connection, writer: asyncio.StreamWriter,
                       request: h11.Request, body: bytes) -> bool:
        """Send the checked request to the proxy and its answer back as it arrives (an SSE
        stream chunk by chunk); False when the sandbox connection cannot go on."""
        assert self.proxy is not None
        host, port = self.proxy
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError as e:
            await _refuse(conn, writer, 502,
                          f"the recording proxy at {host}:{port} is unreachable ({e}); start "
                          "`orchard proxy` there or fix the orchestrator's --model-proxy",
                          "orchard_proxy_unreachable")
            return False
        up = h11.Connection(h11.CLIENT)
        headers = [(b"host", f"{host}:{port}".encode()), (b"connection", b"close"),
                   (b"content-length", b"%d" % len(body)),
                   *((n, v) for n, v in request.headers if n in _PASSED)]
        started = False
        try:
            for event in (h11.Request(method=request.method, target=request.target,
                                      headers=headers), h11.Data(data=body), h11.EndOfMessage()):
                _send(up, up_writer, event)
            await up_writer.drain()
            while True:
                event = await _next(up, up_reader)
                if isinstance(event, h11.Response):
                    started = True
                    _send(conn, writer, h11.Response(
                        status_code=event.status_code, reason=event.reason,
                        headers=[(n, v) for n, v in event.headers if n not in _HOP]))
                elif isinstance(event, h11.Data):
                    _send(conn, writer, h11.Data(data=event.data))
                elif isinstance(event, h11.EndOfMessage):
                    _send(conn, writer, h11.EndOfMessage())
                    await writer.drain()
                    return True
                elif not isinstance(event, h11.InformationalResponse):
                    raise h11.RemoteProtocolError("the proxy closed the connection mid-answer")
                await writer.drain()
        except (OSError, h11.ProtocolError) as e:
            if not started:  # else the answer is cut: closing tells the sandbox so
                await _refuse(conn, writer, 502, f"the recording proxy at {host}:{port} broke "
                                                 f"off ({e}); check that it is up")
            return False
        finally:
            await _close(up_writer)


@dataclass
class _Sandbox:
    """One sandbox's end of the relay: its session, and what it has the host hold."""

    session: str
    connections: int = 0
    held: int = 0  # bytes of request bodies read and not yet sent on


class _Refused(OrchestratorError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


_TOO_BIG = _Refused(413, f"the request body is over {MAX_BODY >> 20} MiB, the model relay's "
                         "limit; send a shorter conversation")


def _check(request: h11.Request, session: str) -> None:
    """Raise _Refused unless the request is one the sandbox may send to the proxy."""
    method, target = request.method.decode(), request.target.decode("ascii", "replace")
    # h11 bounds a head that arrives in pieces; one that arrived whole is measured here.
    if len(target) + sum(len(n) + len(v) + 4 for n, v in request.headers) > MAX_HEAD:
        raise _Refused(431, f"the request head is over {MAX_HEAD >> 10} KiB, the model "
                            "relay's limit; send fewer or shorter headers")
    names = [n for n, _ in request.headers]
    if b"transfer-encoding" in names and b"content-length" in names:
        raise _Refused(400, "the request has both Content-Length and Transfer-Encoding, which "
                            "servers may frame differently; send one of them")
    for name, value in request.headers:
        if name == b"content-length" and int(value) > MAX_BODY:
            raise _TOO_BIG
    prefix = f"/s/{session}/v1/"
    allowed = (f"this sandbox may call only {routes(prefix)} (its own session, {session}) "
               "through the model relay")
    if not target.startswith("/"):
        raise _Refused(400, f"request target {target[:200]!r} is not a path; {allowed}")
    path = target.partition("?")[0]
    if not path.startswith(prefix) or method_of(path[len(prefix):]) != method:
        raise _Refused(403, f"{method} {path[:200]} is refused: {allowed}")


async def _next(conn: h11.Connection, reader: asyncio.StreamReader) -> object:
    """The connection's next h11 event, reading as much as it needs."""
    while (event := conn.next_event()) is h11.NEED_DATA:
        conn.receive_data(await reader.read(_CHUNK))
    return event


async def _body(conn: h11.Connection, reader: asyncio.StreamReader,
                sandbox: _Sandbox) -> bytes:
    """The whole request body, counted in ``sandbox.held`` (the caller releases it); a chunked
    one is refused once past MAX_BODY (a declared length over it was refused by _check, before
    any of it was read)."""
    parts, size = [], 0
    try:
        while not isinstance(event := await _next(conn, reader), h11.EndOfMessage):
            if not isinstance(event, h11.Data):
                raise h11.RemoteProtocolError("the request ended before its body")
            size += len(event.data)
            sandbox.held += len(event.data)
            if size > MAX_BODY:
                raise _TOO_BIG
            if sandbox.held > MAX_HELD:
                raise _Refused(429, f"this sandbox's requests in flight hold over "
                                    f"{MAX_HELD >> 20} MiB; send fewer at once")
            parts.append(event.data)
    except BaseException:
        sandbox.held -= size
        raise
    return b"".join(parts)


async def _refuse(conn: h11.Connection, writer: asyncio.StreamWriter, status: int,
                  message: str, kind: str = "orchard_relay_refused") -> None:
    """An error answer in OpenAI's shape, then the connection ends (its framing may be
    unknown: nothing more is read from it)."""
    body = _error_body(status, message, kind)
    with contextlib.suppress(OSError, h11.ProtocolError):
        for event in (h11.Response(status_code=status, headers=[
                (b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
                (b"connection", b"close")]), h11.Data(data=body), h11.EndOfMessage()):
            _send(conn, writer, event)
        await writer.drain()


def _send(conn: h11.Connection, writer: asyncio.StreamWriter, event: h11.Event) -> None:
    writer.write(conn.send(event) or b"")


def _error_body(status: int, message: str, kind: str = "orchard_relay_refused") -> bytes:
    """OpenAI's error shape, so that harnesses report the relay's refusals like a model's."""
    return json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()


def _raw_answer(status: int, message: str) -> bytes:
    """An error answer written without h11, for a connection refused before its request."""
    body = _error_body(status, message)
    return (b"HTTP/1.1 %d Refused\r\nContent-Type: application/json\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (status, len(body), body))


def _bind_in(sock: socket.socket, ctl_dir: Path, uid: int | None) -> None:
    """Bind ``sock`` as ctl_dir/model.sock and hand it to the sandbox's uid, without following
    any path the sandbox could change: the directory is pinned by an fd opened with
    O_NOFOLLOW (its parent, the sandbox dir, is host root's), the bind goes through that fd,
    and the unlink and chown act on the name in it and never follow a symlink. The ctl dir is
    host root's and read-only inside the sandbox, so nothing can even swap the name between
    the bind and the chown; and if it could, it would only re-own its own entry."""
    dir_fd = os.open(ctl_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(MODEL_SOCKET, dir_fd=dir_fd)
        sock.bind(f"/proc/self/fd/{dir_fd}/{MODEL_SOCKET}")
        if uid is not None:  # the agent, as sandbox root, connects to it (that needs write)
            os.chown(MODEL_SOCKET, uid, uid, dir_fd=dir_fd, follow_symlinks=False)
    finally:
        os.close(dir_fd)


def _proxy_address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or parts.path.strip("/"):
        raise BackendError(f"--model-proxy {url!r} must be http://HOST:PORT with no path: "
                           "sandboxes reach it through a plain HTTP relay, so TLS and path "
                           "prefixes cannot be added on the way")
    return parts.hostname, parts.port or 80


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """End a sandbox connection: our side first (the client reads our last answer, then EOF),
    then discard what it still sends for a while before closing. Closed at once, the agent's
    end could drop unread bytes and reset the client's TCP connection, and a client still
    sending (a body we refused) would see that reset instead of our answer."""
    async def discard() -> None:
        left = MAX_BODY
        while left > 0 and (data := await reader.read(_CHUNK)):
            left -= len(data)

    with contextlib.suppress(OSError, TimeoutError):
        if writer.can_write_eof():
            writer.write_eof()
        await asyncio.wait_for(discard(), LINGER_S)
    await _close(writer)


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
