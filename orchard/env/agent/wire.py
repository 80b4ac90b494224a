"""Reading the agent's answers: the errors, and response bodies bounded by the caller's cap.

Every size in an answer is the agent's word, and the agent runs in the sandbox: a broken or
compromised one could declare a terabyte, or send an endless body, head or chunk. So a body is
read against a ``Cap`` of ours, never past it: a declared Content-Length or chunk size over the
cap fails before any of it is read, a body that runs past it fails at the cap, and sizes are
parsed strictly (``int()`` would take "-1", and a negative length reads to the end of the
stream). The connection of a body not read to its end is closed, never pooled.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import NamedTuple, TypeVar

from orchard.env.errors import OrchestratorError

CHUNK = 1 << 16  # the most read from the agent's socket at once (and its longest line)
# The genuine agent's heads are a status line and a few short headers.
MAX_HEAD_BYTES = 64 << 10
MAX_HEADER_LINES = 100
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,16})(;[^\r\n]*)?\r?\n")
_T = TypeVar("_T")
Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class AgentError(OrchestratorError):
    """The agent answered with an error (``status`` is its HTTP status)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


class AgentTimeout(AgentError):
    """The agent accepted the request but did not answer in time (a 504 to our clients)."""

    def __init__(self, detail: str) -> None:
        super().__init__(504, detail)


class AgentUnreachable(AgentError):
    """The agent could not be reached: the sandbox is dead or still starting."""

    def __init__(self, detail: str) -> None:
        super().__init__(502, detail)


class AgentTooLarge(AgentError):
    """The agent sent (or declared) more than the orchestrator reads from it. ``status`` is 413
    for a file or archive over its limit, 502 for an answer no genuine agent gives."""


class Cap(NamedTuple):
    """How much of a response body is read at most (None: a stream with no end, read in
    bounded lines), and what an error over it says."""

    limit: int | None
    what: str  # "the answer", "file /x", ...
    setting: str
    status: int
    advice: str

    def exceeded(self, address: str, declared: int | None = None) -> AgentTooLarge:
        limit = f"the orchestrator's limit of {self.limit} bytes ({self.setting})"
        said = (f"is declared as {declared} bytes, over {limit}" if declared is not None
                else f"ran past {limit}: the transfer was cut")
        return AgentTooLarge(self.status, f"{self.what} from the agent at {address} {said}; "
                             f"{self.advice}")


class AgentResponse:
    """A response whose body is read on demand; the connection returns to the pool (or is
    closed) once the body has been read to its end. ``cap`` bounds the body."""

    def __init__(self, address: str, conn: Stream, release: Callable[[Stream, bool], None],
                 status: int, headers: dict[str, str], idle: float | None, cap: Cap) -> None:
        self._address, self._conn, self._release = address, conn, release
        self.status_code, self.headers = status, headers
        self._idle = idle  # the longest wait for the next piece of the body
        self._cap = cap
        self._seen = 0  # chunked body bytes so far, counted as the agent announces them
        self._done = False
        self._chunked = headers.get("transfer-encoding", "").lower() == "chunked"
        self._length = 0 if self._chunked else parse_size(headers.get("content-length", "0"))
        if cap.limit is not None and self._length > cap.limit:
            raise cap.exceeded(address, self._length)

    async def _within(self, coro: Awaitable[_T]) -> _T:
        return await within_deadline(coro, self._idle, self._address)

    async def _next_chunk(self, reader: asyncio.StreamReader, first: bool = False) -> int:
        """The next chunk's size, counted against the cap before any of it is read."""
        if not first and await self._within(reader.readline()) != b"\r\n":
            raise ValueError("a chunk longer than its size")
        size = parse_chunk_size(await self._within(reader.readline()))
        self._seen += size
        if self._cap.limit is not None and self._seen > self._cap.limit:
            raise self._cap.exceeded(self._address)
        return size

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        reader = self._conn[0]
        try:
            # A Content-Length was checked against the cap already.
            remaining = await self._next_chunk(reader, True) if self._chunked else self._length
            while remaining:
                data = await self._within(reader.read(min(remaining, CHUNK)))
                if not data:
                    raise asyncio.IncompleteReadError(b"", remaining)
                remaining -= len(data)
                yield data
                if not remaining and self._chunked:
                    remaining = await self._next_chunk(reader)
            if self._chunked:
                await self._within(reader.readline())  # the end of the body (no trailers)
            self._done = True
        except (OSError, asyncio.IncompleteReadError, ValueError) as e:
            raise AgentUnreachable(f"agent at {self._address} hung up: {e!r}") from None
        finally:  # a body not read to its end leaves the connection unusable: close it
            await self.aclose()

    async def aread(self) -> bytes:
        return b"".join([chunk async for chunk in self.aiter_raw()])

    async def aiter_lines(self, max_line: int) -> AsyncIterator[bytes]:
        """The body's lines; a line longer than ``max_line`` ends the stream with
        AgentTooLarge (named as this response's cap)."""
        pending = b""
        async with contextlib.aclosing(self.aiter_raw()) as chunks:
            async for chunk in chunks:
                pending += chunk
                *lines, pending = pending.split(b"\n")
                if len(pending) > max_line or any(len(line) > max_line for line in lines):
                    raise self._cap._replace(limit=max_line, what="a line of the stream"
                                             ).exceeded(self._address)
                for line in lines:
                    yield line
        if pending:
            yield pending

    async def aclose(self) -> None:
        if self._conn is None:
            return
        conn, self._conn = self._conn, None
        keep = self._done and self.headers.get("connection", "").lower() != "close"
        self._release(conn, keep)


async def read_headers(reader: asyncio.StreamReader, address: str) -> dict[str, str]:
    """The header lines after a status line, within ``MAX_HEAD_BYTES`` and
    ``MAX_HEADER_LINES``."""
    headers: dict[str, str] = {}
    size = lines = 0
    try:
        while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
            size, lines = size + len(line), lines + 1
            if size > MAX_HEAD_BYTES or lines > MAX_HEADER_LINES:
                break
            key, _, value = line.decode("latin-1").partition(":")
            headers[key.strip().lower()] = value.strip()
        else:
            return headers
    except asyncio.LimitOverrunError:
        pass  # one line longer than the reader's buffer
    raise AgentTooLarge(502, f"the agent at {address} sent a response head over "
                        f"{MAX_HEAD_BYTES} bytes or {MAX_HEADER_LINES} lines; the genuine "
                        "agent sends a few short headers, so the sandbox's agent is broken or "
                        "not genuine: delete and recreate the sandbox")


async def within_deadline(coro: Awaitable[_T], seconds: float | None, address: str) -> _T:
    if seconds is None:
        return await coro
    try:
        # asyncio.timeout arms one timer; wait_for would wrap each wait in a task of its own.
        async with asyncio.timeout(seconds):
            return await coro
    except TimeoutError:
        raise AgentTimeout(
            f"the agent at {address} accepted the request but did not answer within "
            f"{seconds:g}s; the sandbox may be hung or overloaded: retry, or delete and "
            "recreate it") from None


def parse_size(value: str) -> int:
    """A Content-Length as the agent wrote it: digits only (int() would take "-1", "+5" or
    "1_0", and a negative length would read to the end of the stream)."""
    if not (value.isascii() and value.isdigit() and len(value) <= 20):
        raise ValueError(f"a malformed Content-Length: {value[:40]!r}")
    return int(value)


def parse_chunk_size(line: bytes) -> int:
    if not (m := _CHUNK_SIZE.fullmatch(line)):
        raise ValueError(f"a malformed chunk size line: {line[:40]!r}")
    return int(m[1], 16)
