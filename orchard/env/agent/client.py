"""The orchestrator's side of the agent protocol (see ``agent/server/``), over Unix or TCP.

A deliberately small HTTP/1.1 client over asyncio streams with a keep-alive pool per sandbox:
both ends of this protocol are ours, and on the exec hot path httpx cost ten times the CPU
(1.2 ms against 0.12 ms per call, measured in one run). No retries here: an exec must never
run twice. Errors come back as ``AgentError`` with the agent's own message.

Every wait has a deadline, so an agent that accepts a connection and never answers (stopped,
deadlocked, starved) gives ``AgentTimeout`` instead of a hang: a fixed one (``timeout``) for
most calls, the command's own timeout plus that for an exec.

Nothing the agent sends is read past a limit of ours (see ``wire.py``): a response head, a
JSON answer (``max_response_bytes``; an exec's may be bigger, see ``_exec_cap``), a streamed
file or archive (``max_download_bytes``), a line of a streamed exec, a PTY frame. Over one, the
connection is closed, never pooled, and the caller gets ``AgentTooLarge`` naming the setting.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import struct
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from pathlib import Path
from types import EllipsisType
from typing import Any, TypedDict, TypeVar
from urllib.parse import quote, urlencode

from orchard.env.agent.server.protocol import (
    ArchiveRestored,
    BrowserObservation,
    BrowserRequest,
    DirListing,
    ExecEvent,
    ExecRequest,
    ExecResult,
    FileWritten,
    Health,
    PatchRequest,
    PatchResult,
    PathResult,
    ProcessInfo,
    ProcessList,
    ProcessOutput,
    ProcessRequest,
    ServiceRequest,
    ServiceResponse,
    Signalled,
)
from orchard.env.agent.wire import (
    CHUNK,
    AgentError,
    AgentResponse,
    AgentTimeout,
    AgentTooLarge,
    AgentUnreachable,
    Cap,
    Stream,
    read_headers,
    within_deadline,
)

__all__ = ["AgentClient", "AgentError", "AgentLimits", "AgentResponse", "AgentTimeout",
           "AgentTooLarge", "AgentUnreachable", "PtyChannel"]

_PTY_FRAME = struct.Struct(">BI")
_MAX_IDLE = 8
_FILE_BLOCK = 1 << 20  # archives move to and from disk in blocks this big, off the event loop
_MAX_PTY_FRAME = 1 << 20  # the agent sends PTY output in frames of 64 KiB at most
_EXIT_CODE = re.compile(rb"-?[0-9]{1,10}")
# An exec's answer holds up to max_output_bytes of each of its two streams, and JSON may write
# a byte as six (a control character is \u00XX); the agent keeps 10 MiB when not told.
_JSON_BYTES_PER_BYTE = 6
_AGENT_OUTPUT_DEFAULT = 10 << 20
DEFAULT_MAX_RESPONSE_BYTES = 128 << 20
DEFAULT_MAX_DOWNLOAD_BYTES = 8 << 30
_T = TypeVar("_T")
log = logging.getLogger(__name__)


class AgentLimits(TypedDict):
    """The byte limits of an ``AgentClient`` (the orchestrator's settings of the same name)."""

    max_response_bytes: int
    max_download_bytes: int


class AgentClient:
    def __init__(self, address: str, token: str | None = None, timeout: float = 30.0,
                 max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
                 max_download_bytes: int = DEFAULT_MAX_DOWNLOAD_BYTES) -> None:
        kind, _, rest = address.partition(":")
        if kind not in ("unix", "tcp"):
            raise ValueError(f"agent address must be unix:PATH or tcp:HOST:PORT, got {address!r}")
        self.address = address
        self._kind, self._target = kind, rest
        self._token = token
        self.timeout = timeout
        self.max_response_bytes = max_response_bytes
        self.max_download_bytes = max_download_bytes
        # The cap of a JSON answer, and of an error's body.
        self._answer = Cap(max_response_bytes, "the answer", "agent_max_response_bytes", 502,
                           "ask for less (e.g. list a smaller directory) or raise "
                           "agent_max_response_bytes; an answer that should be small means the "
                           "sandbox's agent is broken or not genuine: delete and recreate it")
        self._idle: list[Stream] = []

    async def close(self) -> None:
        while self._idle:
            self._idle.pop()[1].close()

    async def _connect(self) -> Stream:
        try:
            if self._kind == "unix":
                return await asyncio.open_unix_connection(self._target, limit=CHUNK)
            host, _, port = self._target.rpartition(":")
            return await asyncio.open_connection(host.strip("[]"), int(port), limit=CHUNK)
        except OSError as e:
            raise AgentUnreachable(f"agent at {self.address} unreachable: {e!r}") from None

    def _release(self, conn: Stream, keep: bool) -> None:
        if keep and len(self._idle) < _MAX_IDLE and not conn[1].is_closing():
            self._idle.append(conn)
        else:
            conn[1].close()

    async def request(self, method: str, path: str,
                      params: Mapping[str, Any] | Sequence[tuple[str, Any]] | None = None,
                      json_body: Any = None, content: bytes | AsyncIterator[bytes] | None = None,
                      extra_headers: str = "", deadline: float | None | EllipsisType = ...,
                      cap: Cap | None = None) -> AgentResponse:
        """Send a request and read the response head; the caller reads (or closes) the body.

        ``deadline`` bounds each wait for the agent (``None``: no bound); the default is
        this client's ``timeout``. ``cap`` bounds the body (default: a JSON answer's).
        """
        limit = self.timeout if isinstance(deadline, EllipsisType) else deadline
        cap = cap or self._answer

        async def within(coro: Awaitable[_T]) -> _T:
            return await within_deadline(coro, limit, self.address)

        target = f"{path}?{urlencode(params)}" if params else path
        head = f"{method} {target} HTTP/1.1\r\nHost: agent\r\n{extra_headers}"
        if self._token:
            head += f"X-Agent-Token: {self._token}\r\n"
        if json_body is not None:
            content = json.dumps(json_body, separators=(",", ":")).encode()
            head += "Content-Type: application/json\r\n"
        chunked = content is not None and not isinstance(content, bytes)
        if chunked:
            # A streamed body can be large: let the agent refuse it before it is sent.
            head += "Transfer-Encoding: chunked\r\nExpect: 100-continue\r\n"
        elif content:
            head += f"Content-Length: {len(content)}\r\n"
        conn = self._idle.pop() if self._idle else await self._connect()
        reader, writer = conn
        try:
            try:
                writer.write(head.encode() + b"\r\n")
                if isinstance(content, bytes):
                    writer.write(content)
                elif content is not None:
                    await within(writer.drain())
                    status = await within(self._interim_status(reader))
                    if status != 100:  # refused up front: that was the final answer
                        return await within(self._finish_head(conn, status, limit, cap))
                    async for chunk in content:
                        if chunk:
                            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                            await within(writer.drain())
                    writer.write(b"0\r\n\r\n")
                await within(writer.drain())
            except ConnectionError:
                pass  # the agent may have refused the request early: its answer is readable
            status = await within(self._interim_status(reader))
            return await within(self._finish_head(conn, status, limit, cap))
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ValueError, IndexError) as e:
            writer.close()
            raise AgentUnreachable(f"agent at {self.address} unreachable: {e!r}") from None
        except BaseException:  # e.g. the upload's source failed: the request is half-sent
            writer.close()
            raise

    @staticmethod
    async def _interim_status(reader: asyncio.StreamReader) -> int:
        """The status of the next response head; a 100 Continue's empty head is consumed."""
        status = int((await reader.readuntil(b"\r\n")).split(b" ", 2)[1])
        if status == 100:
            await reader.readuntil(b"\r\n")
        return status

    async def _finish_head(self, conn: Stream, status: int, idle: float | None,
                           cap: Cap) -> AgentResponse:
        headers = await read_headers(conn[0], self.address)
        # An error's body is its message: never more than a JSON answer's.
        return AgentResponse(self.address, conn, self._release, status, headers, idle,
                             self._answer if status >= 400 else cap)

    async def _call(self, method: str, path: str, **kw: Any) -> Any:
        r = await self.request(method, path, **kw)
        body = await r.aread()
        if r.status_code >= 400:
            raise AgentError(r.status_code, _detail(body))
        return json.loads(body)

    async def health(self, timeout: float = 5.0) -> Health:
        return await asyncio.wait_for(self._call("GET", "/health"), timeout)

    def _exec_deadline(self, req: ExecRequest) -> float | None:
        """The agent answers an exec when the command ends, by its timeout at the latest."""
        return None if not req.get("timeout") else float(req["timeout"]) + self.timeout

    def _exec_cap(self, req: ExecRequest) -> int:
        """The most an exec's answer may be: what the caller let the command print, both
        streams escaped at worst, when that is more than ``max_response_bytes``."""
        output = int(req.get("max_output_bytes", _AGENT_OUTPUT_DEFAULT))
        return max(self.max_response_bytes, 2 * _JSON_BYTES_PER_BYTE * output + CHUNK)

    async def exec(self, req: ExecRequest, fence: int | None = None) -> ExecResult:
        """Run a command; fence is an exclusive-exec lock's token, which the agent checks."""
        return await self._call("POST", "/exec", json_body=req, extra_headers=_fence(fence),
                                deadline=self._exec_deadline(req),
                                cap=self._answer._replace(limit=self._exec_cap(req)))

    async def exec_stream(self, req: ExecRequest,
                          fence: int | None = None) -> AsyncIterator[ExecEvent]:
        """The exec's events as the agent sends them: no end to the stream is known, but
        each line (the last holds the whole result) is bounded like an exec's answer."""
        r = await self.request("POST", "/exec", json_body={**req, "stream": True},
                               extra_headers=_fence(fence), deadline=self._exec_deadline(req),
                               cap=self._answer._replace(limit=None))
        if r.status_code >= 400:
            raise AgentError(r.status_code, _detail(await r.aread()))
        try:
            async for line in r.aiter_lines(self._exec_cap(req)):
                if line:
                    yield json.loads(line)
        finally:
            await r.aclose()

    async def start_process(self, req: ProcessRequest) -> ProcessInfo:
        return await self._call("POST", "/processes", json_body=req)

    async def processes(self) -> ProcessList:
        return await self._call("GET", "/processes")

    async def process(self, pid: str, method: str = "GET") -> ProcessInfo:
        return await self._call(method, f"/processes/{_segment(pid)}")

    async def process_output(self, pid: str, stdout_offset: int,
                             stderr_offset: int) -> ProcessOutput:
        params = {"stdout_offset": stdout_offset, "stderr_offset": stderr_offset}
        return await self._call("GET", f"/processes/{_segment(pid)}/output", params=params)

    async def put_file(self, path: str, body: bytes | AsyncIterator[bytes],
                       mode: int | None = None) -> FileWritten:
        params: dict[str, Any] = {"path": path}
        if mode is not None:
            params["mode"] = mode
        return await self._call("PUT", "/files", params=params, content=body)

    async def open_file(self, path: str, max_bytes: int | None = None,
                        setting: str = "max_download_bytes") -> AgentResponse:
        """A streaming response for the file; the caller must ``aclose()`` it.

        A file over ``max_bytes`` (default: ``max_download_bytes``; ``setting`` names it in
        the error) is AgentTooLarge (413): here, when the agent declares its size, else
        while the body is read (the transfer is cut there).
        """
        limit = self.max_download_bytes if max_bytes is None else max_bytes
        r = await self.request("GET", "/files", params={"path": path},
                               cap=Cap(limit, f"file {path}", setting, 413,
                                       "split it in the sandbox (e.g. split -b) and fetch the "
                                       f"parts, or raise {setting}"))
        if r.status_code >= 400:
            raise AgentError(r.status_code, _detail(await r.aread()))
        return r

    async def list_files(self, path: str) -> DirListing:
        return await self._call("GET", "/files/list", params={"path": path})

    async def mkdir(self, path: str) -> PathResult:
        return await self._call("POST", "/files/mkdir", params={"path": path})

    async def remove(self, path: str, recursive: bool) -> PathResult:
        params = {"path": path, "recursive": "true" if recursive else "false"}
        return await self._call("DELETE", "/files", params=params)

    async def patch(self, req: PatchRequest) -> PatchResult:
        return await self._call("POST", "/patch", json_body=req)

    async def get_archive(self, paths: list[str], dest: Path, max_bytes: int | None = None,
                          timeout: float = 300.0, freeze: bool = False) -> int:
        """Write a tar of the sandbox's paths (those that exist) to dest; return its size.
        With freeze, the sandbox's running processes are stopped while the agent archives.

        ``timeout`` bounds each wait, the first included: with max_bytes the agent walks the
        trees before it answers. A 413 (over max_bytes) comes as AgentError before dest is
        created; a stream cut short raises AgentUnreachable and leaves dest partial, for the
        caller to remove. The stream may be ``max_download_bytes`` bigger than max_bytes (tar
        headers and padding, which max_bytes does not count); past that it is cut with
        AgentTooLarge (413), leaving dest partial too.
        """
        params: list[tuple[str, Any]] = [("path", p) for p in paths]
        if max_bytes is not None:
            params.append(("max_bytes", max_bytes))
        if freeze:
            params.append(("freeze", "1"))
        cap = Cap((max_bytes or 0) + self.max_download_bytes,
                  f"the archive of {', '.join(paths)}",
                  "max_download_bytes, beyond the archive's max_bytes", 413,
                  "keep less in the archived paths, or raise max_download_bytes")
        r = await self.request("GET", "/archive", params=params, deadline=timeout, cap=cap)
        if r.status_code >= 400:
            raise AgentError(r.status_code, _detail(await r.aread()))
        size = 0
        with await asyncio.to_thread(open, dest, "wb") as f:
            block: list[bytes] = []
            pending = 0
            async for chunk in r.aiter_raw():
                block.append(chunk)
                pending += len(chunk)
                if pending >= _FILE_BLOCK:
                    await asyncio.to_thread(f.write, b"".join(block))
                    size, block, pending = size + pending, [], 0
            await asyncio.to_thread(f.write, b"".join(block))
            await asyncio.to_thread(f.flush)
            await asyncio.to_thread(os.fsync, f.fileno())
        return size + pending

    async def put_archive(self, src: Path, timeout: float = 300.0) -> ArchiveRestored:
        """Stream the tar at src into the sandbox, each tree in it replacing what is there."""
        f = await asyncio.to_thread(open, src, "rb")

        async def blocks() -> AsyncIterator[bytes]:
            while data := await asyncio.to_thread(f.read, _FILE_BLOCK):
                yield data

        try:
            return await self._call("PUT", "/archive", content=blocks(), deadline=timeout)
        finally:
            f.close()

    async def browser(self, req: BrowserRequest) -> BrowserObservation:
        """One browser action and the page after it. The agent waits for the page up to the
        request's timeout (30 s), and the browser may have to start first."""
        wait = float(req.get("timeout") or 30.0)
        return await self._call("POST", "/browser", json_body=req,
                                deadline=2 * wait + self.timeout)

    async def http(self, req: ServiceRequest) -> ServiceResponse:
        """A request to a service on the sandbox's loopback, and its answer."""
        return await self._call("POST", "/http", json_body=req,
                                deadline=float(req.get("timeout") or 30.0) + self.timeout)

    async def signal_all(self, sig: str) -> Signalled:
        """STOP or CONT every process of the sandbox but the agent (pause and resume)."""
        return await self._call("POST", "/signal", json_body={"signal": sig})

    async def open_pty(self, argv: list[str], cols: int, rows: int,
                       env: dict[str, str] | None = None, cwd: str | None = None) -> PtyChannel:
        params: dict[str, Any] = {"argv": json.dumps(argv), "cols": cols, "rows": rows}
        if env:
            params["env"] = json.dumps(env)
        if cwd:
            params["cwd"] = cwd
        r = await self.request("GET", "/pty", params,
                               extra_headers="Upgrade: orchard-pty\r\nConnection: Upgrade\r\n")
        # A PTY session is interactive: it may rightly stay quiet for any length of time.
        if r.status_code != 101:
            raise AgentError(r.status_code, _detail(await r.aread()))
        # The connection now carries PTY frames: it leaves the pool for good.
        conn, r._conn = r._conn, None
        return PtyChannel(*conn, pid=int(r.headers.get("x-pty-pid", "0")) or None)


class PtyChannel:
    """A framed byte channel to a PTY session in the sandbox."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 pid: int | None = None) -> None:
        self._reader, self._writer = reader, writer
        self.pid = pid  # the PTY's process, as the sandbox sees it

    async def send(self, data: bytes) -> None:
        self._writer.write(_PTY_FRAME.pack(0, len(data)) + data)
        await self._writer.drain()

    async def resize(self, cols: int, rows: int) -> None:
        payload = f"{cols},{rows}".encode()
        self._writer.write(_PTY_FRAME.pack(1, len(payload)) + payload)
        await self._writer.drain()

    async def signal(self, name: str) -> None:
        """Send a signal (TERM, INT, KILL, ... or a number) to the PTY's process group."""
        payload = name.encode()
        self._writer.write(_PTY_FRAME.pack(2, len(payload)) + payload)
        await self._writer.drain()

    async def recv(self) -> tuple[str, bytes]:
        """("data", bytes) or ("exit", b"<code>"); ("closed", b"") when the agent hung up,
        or sent a frame no genuine agent sends (then the channel is closed too)."""
        try:
            kind, n = _PTY_FRAME.unpack(await self._reader.readexactly(_PTY_FRAME.size))
            if n > _MAX_PTY_FRAME:
                log.warning("the agent sent a PTY frame of %d bytes, over the limit of %d: "
                            "closing the terminal", n, _MAX_PTY_FRAME)
                await self.close()
                return "closed", b""
            payload = await self._reader.readexactly(n)
        except (asyncio.IncompleteReadError, ConnectionError):
            return "closed", b""
        if kind != 0 and not _EXIT_CODE.fullmatch(payload):
            await self.close()  # an exit frame carries the exit code
            return "closed", b""
        return ("data" if kind == 0 else "exit"), payload

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.wait_closed()


def _fence(token: int | None) -> str:
    return "" if token is None else f"X-Orchard-Fence: {token}\r\n"


def _detail(body: bytes) -> str:
    try:
        return str(json.loads(body)["detail"])
    except (ValueError, KeyError, TypeError):
        return body.decode(errors="replace")[:2000] or "empty response"


def _segment(value: str) -> str:
    """A caller's id as one path segment. Paths go into the request line as they are: a raw
    space, '?' or CR/LF would smuggle in a query, headers or a second request and leave the
    pooled connection out of step (seen by fuzzing)."""
    return quote(value, safe="")
