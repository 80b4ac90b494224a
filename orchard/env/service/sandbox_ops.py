"""What the orchestrator asks of a running sandbox's agent besides exec: patches, files,
background processes, the browser and requests to the sandbox's own services.

With the exec jobs (exec_jobs.py), this is the only place that calls the agent. Each
operation finds the sandbox, calls its agent, turns an agent failure into a service error the
one way (``errors.from_agent``), and records the event of a change; routes only validate and
shape.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from orchard.env.agent.client import (
    AgentClient,
    AgentError,
    AgentResponse,
    AgentTooLarge,
    PtyChannel,
)
from orchard.env.backends.base import Backend
from orchard.env.browser_schema import BrowserAction
from orchard.env.errors import TooLarge, from_agent
from orchard.env.events import EventLog
from orchard.env.http_schema import ServiceRequest
from orchard.env.schema import EventKind, PatchRequest
from orchard.env.service.records import RunningSandboxes

T = TypeVar("T")


class SandboxOps:
    """Agent operations on the sandboxes of one service."""

    def __init__(self, sandboxes: RunningSandboxes, events: EventLog, backend: Backend) -> None:
        self.sandboxes = sandboxes
        self.events = events
        self.backend = backend

    async def agent(self, sid: str) -> AgentClient:
        """The agent of a running sandbox, or the service error that says why there is none."""
        return (await self.sandboxes.running(sid))[1]

    async def _call(self, sid: str, awaitable: Awaitable[T]) -> T:
        try:
            return await awaitable
        except AgentError as e:
            raise from_agent(e, sid) from None

    async def _change(self, sid: str, kind: EventKind,
                      act: Callable[[Any], Awaitable[dict[str, Any]]],
                      describe: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
        """A change to a running sandbox, and its event; ``describe`` gives the event's fields
        from the agent's answer. A failed change records nothing: it raised."""
        rec, agent = await self.sandboxes.running(sid)
        started = time.time()
        result = await self._call(sid, act(agent))
        await self.events.record(rec, kind, started, **describe(result))
        return result

    # --- patches and files -------------------------------------------------------------------

    async def patch(self, sid: str, req: PatchRequest) -> dict[str, Any]:
        payload = {"patch": req.patch, "cwd": req.cwd, "timeout": req.timeout_seconds}
        # Failed ones are recorded too: `git apply --reject` may have applied some hunks.
        return await self._change(
            sid, EventKind.patch, lambda agent: agent.patch(payload),
            lambda r: {"patch": req.patch, "cwd": req.cwd, "timeout_seconds": req.timeout_seconds,
                       "success": r.get("success"), "method": r.get("method"),
                       "exit_code": r.get("exit_code")})

    async def write_file(self, sid: str, path: str, data: bytes | AsyncIterator[bytes],
                         mode: int | None,
                         describe: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
        """``describe`` adds what only the caller knows of the content (a streamed body's
        digest) to the event."""
        return await self._change(sid, EventKind.file_write,
                                  lambda agent: agent.put_file(path, data, mode),
                                  lambda r: {"path": path, "mode": mode, **describe(r)})

    async def open_file(self, sid: str, path: str) -> AgentResponse:
        """The agent's streaming answer for a file, the caller's to close: TooLarge up front
        when it says the file is over max_download_bytes; if it does not say, reading the body
        raises AgentTooLarge at that limit."""
        return await self._call(sid, (await self.agent(sid)).open_file(path))

    async def read_file(self, sid: str, path: str, max_size: int) -> bytes:
        """A whole file, for base64 JSON: TooLarge when it is over ``max_size``
        (max_json_body)."""
        agent = await self.agent(sid)
        try:
            r = await agent.open_file(path, max_size, setting="max_json_body")
            return await r.aread()
        except AgentTooLarge as e:
            raise TooLarge(f"{e.detail}; or download it with GET /sandboxes/{sid}/files/raw"
                           "?path=..., which streams it") from None
        except AgentError as e:
            raise from_agent(e, sid) from None

    async def list_files(self, sid: str, path: str) -> dict[str, Any]:
        return await self._call(sid, (await self.agent(sid)).list_files(path))

    async def mkdir(self, sid: str, path: str) -> dict[str, Any]:
        return await self._change(sid, EventKind.mkdir, lambda agent: agent.mkdir(path),
                                  lambda _: {"path": path})

    async def remove(self, sid: str, path: str, recursive: bool) -> dict[str, Any]:
        return await self._change(sid, EventKind.remove,
                                  lambda agent: agent.remove(path, recursive),
                                  lambda _: {"path": path, "recursive": recursive})

    async def open_pty(self, sid: str, argv: list[str], cols: int, rows: int,
                       env: dict[str, str] | None = None, cwd: str | None = None) -> PtyChannel:
        rec, agent = await self.sandboxes.running(sid)
        return await self._call(sid, agent.open_pty(argv, cols, rows, env=env or {},
                                                    cwd=cwd or rec.workdir))

    # --- background processes ----------------------------------------------------------------

    async def processes(self, sid: str) -> list[dict[str, Any]]:
        listing = await self._call(sid, (await self.agent(sid)).processes())
        return [{**p, "sandbox_id": sid} for p in listing["processes"]]

    async def process(self, sid: str, pid: str, method: str = "GET") -> dict[str, Any]:
        agent = await self.agent(sid)
        return {**await self._call(sid, agent.process(pid, method)), "sandbox_id": sid}

    async def process_output(self, sid: str, pid: str, stdout_offset: int,
                             stderr_offset: int) -> dict[str, Any]:
        agent = await self.agent(sid)
        return await self._call(sid, agent.process_output(pid, stdout_offset, stderr_offset))

    # --- the browser -------------------------------------------------------------------------

    async def browser(self, sid: str, action: BrowserAction) -> dict[str, Any]:
        """One action in the sandbox's browser and the page after it. Every action is an event,
        observations too: the element ids of the next action depend on them, so a replay must
        redo them all."""
        def describe(page: dict[str, Any]) -> dict[str, Any]:
            return {**action.model_dump(exclude_none=True, exclude={"screenshot", "marks"}),
                    "page_url": page["url"], "title": page["title"], "error": page["error"],
                    "tree_sha256": hashlib.sha256(page["tree"].encode()).hexdigest()}

        await self.backend.prepare_browser()
        return await self._change(sid, EventKind.browser,
                                  lambda agent: agent.browser(action.agent_request()), describe)

    async def http(self, sid: str, req: ServiceRequest) -> dict[str, Any]:
        """A request to a service on the sandbox's loopback. Each is an event, with the
        request whole (a replay redoes it) and the answer's status and body digest."""
        def describe(answer: dict[str, Any]) -> dict[str, Any]:
            return {**req.model_dump(), "status": answer["status"],
                    "body_sha256": hashlib.sha256(answer["body"].encode()).hexdigest()}

        return await self._change(sid, EventKind.http,
                                  lambda agent: agent.http(req.model_dump()), describe)
