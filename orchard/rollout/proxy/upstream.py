"""The recording proxy's upstream hop: a small HTTP/1.1 client with a keep-alive pool.

httpx's async client cost the proxy about 1.4 ms more event-loop CPU per call than this client
(bench/results/proxy-ablation.json), which reads a response head with one ``readuntil`` and
passes the body on chunk by chunk as it arrives. It speaks to model servers and hosted APIs:
plain HTTP or HTTPS (one default TLS context per process), ``Content-Length``, chunked and
read-to-close bodies, a connect timeout and an idle timeout while waiting for the upstream.

It does not ask for compressed bodies (no ``Accept-Encoding``), so what it relays is what the
proxy records. The orchestrator's agent client (``orchard/env/agent/client.py``) is a sibling
for our own agent (Unix sockets, 100-continue uploads, PTY upgrades, no TLS or timeouts).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Iterable
from urllib.parse import urlsplit

_CHUNK = 1 << 16
_HEAD_LIMIT = 1 << 16
_MAX_IDLE = 256
# A response to HEAD and these statuses has no body, whatever its headers say (RFC 9112 6.3).
_NO_BODY = frozenset({204, 304})
# What can go wrong on a socket while talking HTTP to it; all of it means "the upstream broke".
_WIRE_ERRORS = (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError,
                IndexError)

_Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]
_default_tls: ssl.SSLContext | None = None


class UpstreamError(Exception):
    """The upstream could not be reached or broke off; the message names it."""


class UpstreamTimeout(UpstreamError):
    """The upstream went silent for longer than the timeout."""


def default_tls_context() -> ssl.SSLContext:
    """The system's CA bundle, loaded once per process: loading it costs milliseconds and
    about a megabyte, too much to pay per connection."""
    global _default_tls
    if _default_tls is None:
        _default_tls = ssl.create_default_context()
    return _default_tls


class UpstreamResponse:
    """A response whose head has been read; the body is read on demand. The connection goes
    back to the pool once the body was read to its end, and is closed otherwise."""

    def __init__(self, upstream: Upstream, conn: _Conn, status: int, headers: dict[str, str],
                 keep_alive: bool, has_body: bool) -> None:
        self._upstream = upstream
        self._conn: _Conn | None = conn
        self.status_code = status
        self.headers = headers
        self._keep_alive = keep_alive
        self._has_body = has_body
        self._done = False

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        """The body as it arrives (chunked framing removed), without buffering."""
        if self._conn is None:
            raise RuntimeError("the response body was already read or closed")
        reader = self._conn[0]
        timeout = self._upstream.timeout
        headers = self.headers
        try:
            if not self._has_body:
                pass
            elif headers.get("transfer-encoding", "").lower().endswith("chunked"):
                while True:
                    async with asyncio.timeout(timeout):
                        line = await reader.readuntil(b"\r\n")
                    size = int(line.split(b";", 1)[0], 16)
                    if not size:
                        break
                    async for data in _pieces(reader, size, timeout):
                        yield data
                    async with asyncio.timeout(timeout):
                        if await reader.readexactly(2) != b"\r\n":
                            raise ValueError("chunk not followed by CRLF")
                async with asyncio.timeout(timeout):
                    while await reader.readuntil(b"\r\n") != b"\r\n":
                        pass  # trailers: nothing the proxy passes on
            elif "content-length" in headers:
                async for data in _pieces(reader, int(headers["content-length"]), timeout):
                    yield data
            else:  # framed by the end of the connection
                self._keep_alive = False
                while True:
                    async with asyncio.timeout(timeout):
                        data = await reader.read(_CHUNK)
                    if not data:
                        break
                    yield data
            self._done = True
        except TimeoutError:
            raise UpstreamTimeout(f"upstream {self._upstream.url} sent nothing for "
                                  f"{timeout:g} s in the middle of a response") from None
        except _WIRE_ERRORS as e:
            raise UpstreamError(f"upstream {self._upstream.url} broke off a response: "
                                f"{e!r}") from None
        finally:
            self.close()

    async def aread(self) -> bytes:
        chunks = [chunk async for chunk in self.aiter_raw()]
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def close(self) -> None:
        """Give the connection back, or close it when its body was not read to the end (its
        remaining bytes would be taken for the next response)."""
        if self._conn is None:
            return
        conn, self._conn = self._conn, None
        self._upstream._release(conn, self._done and self._keep_alive)


class Upstream:
    """Keep-alive HTTP/1.1 connections to one base URL (``http://`` or ``https://``, with an
    optional path prefix). Bound to the event loop of its first request."""

    def __init__(self, base_url: str, timeout: float = 600.0, connect_timeout: float = 10.0,
                 tls: ssl.SSLContext | None = None, max_idle: int = _MAX_IDLE) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"upstream must be an http:// or https:// URL, got {base_url!r}")
        secure = parts.scheme == "https"
        self.url = f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}/"
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._host = parts.hostname
        self._port = parts.port or (443 if secure else 80)
        self._tls = (tls or default_tls_context()) if secure else None
        self._prefix = parts.path.rstrip("/")
        host = parts.netloc.rpartition("@")[2]
        self._host_header = host.encode("idna") if not host.isascii() else host.encode()
        self._max_idle = max_idle
        self._idle: list[_Conn] = []

    async def aclose(self) -> None:
        while self._idle:
            self._idle.pop()[1].close()

    async def request(self, method: str, target: str, headers: Iterable[tuple[bytes, bytes]] = (),
                      body: bytes = b"") -> UpstreamResponse:
        """Send a request (``target``: path and query, appended to the base URL's path) and
        read the response head; the caller reads the body or closes the response.

        A request on a kept-alive connection that the upstream closed without a byte of an
        answer is sent once more, on a fresh connection: the upstream most likely timed the
        idle connection out as the request went out. (Should it have read the request, a
        model call runs twice, which costs only time; a fresh connection closed unanswered is
        an error.)"""
        head = [b"%s %s%s HTTP/1.1\r\nHost: %s\r\n" % (
            method.encode(), self._prefix.encode(), target.encode(), self._host_header)]
        head.extend(b"%s: %s\r\n" % kv for kv in headers)
        if body or method not in ("GET", "HEAD"):
            head.append(b"Content-Length: %d\r\n" % len(body))
        head.append(b"\r\n")
        message = b"".join(head) + body
        while True:
            conn = self._checkout()
            reused = conn is not None
            if conn is None:
                conn = await self._connect()
            reader, writer = conn
            received = False
            try:
                writer.write(message)
                async with asyncio.timeout(self.timeout):
                    await writer.drain()
                    while True:  # an interim 1xx head (103 Early Hints) is skipped
                        head_bytes = await reader.readuntil(b"\r\n\r\n")
                        received = True
                        status, response_headers, keep_alive = _parse_head(head_bytes)
                        if status >= 200 or status == 101:
                            break
            except TimeoutError:
                writer.close()
                raise UpstreamTimeout(f"upstream {self.url} did not answer within "
                                      f"{self.timeout:g} s") from None
            except _WIRE_ERRORS as e:
                writer.close()
                if reused and not received and _closed_before_answer(e):
                    continue
                raise UpstreamError(f"upstream {self.url} broke off before answering: "
                                    f"{e!r}") from None
            except BaseException:  # cancelled mid-exchange: the connection is unusable
                writer.close()
                raise
            has_body = method != "HEAD" and status not in _NO_BODY
            return UpstreamResponse(self, conn, status, response_headers, keep_alive, has_body)

    def _checkout(self) -> _Conn | None:
        while self._idle:
            conn = self._idle.pop()
            # the upstream may have closed it while it sat idle: the EOF is already read
            if not conn[0].at_eof() and not conn[1].is_closing():
                return conn
            conn[1].close()
        return None

    async def _connect(self) -> _Conn:
        try:
            async with asyncio.timeout(self.connect_timeout):
                return await asyncio.open_connection(
                    self._host, self._port, ssl=self._tls, limit=_HEAD_LIMIT,
                    server_hostname=self._host if self._tls else None)
        except TimeoutError:
            raise UpstreamError(f"upstream {self.url} unreachable: no connection within "
                                f"{self.connect_timeout:g} s") from None
        except (OSError, ssl.SSLError) as e:
            raise UpstreamError(f"upstream {self.url} unreachable: {e!r}") from None

    def _release(self, conn: _Conn, keep: bool) -> None:
        if keep and len(self._idle) < self._max_idle and not conn[1].is_closing():
            self._idle.append(conn)
        else:
            conn[1].close()


def _parse_head(head: bytes) -> tuple[int, dict[str, str], bool]:
    """(status, headers with lower-case names, whether the connection may be kept)."""
    lines = head.decode("latin-1").split("\r\n")
    version, status, _ = (lines[0] + " ").split(" ", 2)
    if not version.startswith("HTTP/1."):
        raise ValueError(f"not an HTTP/1.x response: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise ValueError(f"malformed header line {line[:80]!r}")
        name = name.strip().lower()
        value = value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    connection = headers.get("connection", "").lower()
    keep = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
    return int(status), headers, keep


def _closed_before_answer(e: BaseException) -> bool:
    """Whether the upstream closed the connection without a byte of an answer."""
    if isinstance(e, asyncio.IncompleteReadError):
        return not e.partial
    return isinstance(e, (ConnectionResetError, BrokenPipeError, ConnectionAbortedError))


async def _pieces(reader: asyncio.StreamReader, size: int,
                  timeout: float) -> AsyncIterator[bytes]:
    """Exactly size bytes, passed on piece by piece as they arrive (no buffering)."""
    while size > 0:
        async with asyncio.timeout(timeout):
            data = await reader.read(min(size, _CHUNK))
        if not data:
            raise asyncio.IncompleteReadError(b"", size)
        size -= len(data)
        yield data
