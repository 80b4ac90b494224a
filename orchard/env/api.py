"""FastAPI routes only: validate, call the service, map errors to status codes."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import Depends, FastAPI, Query, Request, WebSocket
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orchard.env.agent.client import AgentError
from orchard.env.auth import check_key, given_key
from orchard.env.errors import BadRequest, ServiceError, TooLarge, from_agent
from orchard.env.events import payload
from orchard.env.pty_bridge import serve_pty
from orchard.env.schema import (
    CreateSandboxRequest,
    DeleteResponse,
    ErrorBody,
    EventKind,
    EventList,
    ExecRequest,
    FileDownload,
    FileList,
    FileUpload,
    FileWriteResult,
    Health,
    Job,
    JobAccepted,
    PatchRequest,
    PatchResponse,
    PathRequest,
    ProcessInfo,
    ProcessList,
    ProcessOutput,
    Resources,
    SandboxInfo,
    SandboxList,
)
from orchard.env.service import SandboxService
from orchard.env.state.base import LockTimeout, StoreUnavailable
from orchard.version import __version__

MAX_SEQ = 2**63 - 1  # event seqs are SQLite/Redis 64-bit integers
MAX_WAIT = 3600.0  # the longest server-side wait; longer ones are cut to it

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 401, 403, 404, 408, 409, 413, 503)
}
RAW_UPLOAD = "/files/raw"


class BodyLimit:
    """413 for JSON bodies over the limit, counted as they arrive (chunked bodies too)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].endswith(RAW_UPLOAD):
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await self._reject(send)
        seen, exceeded, started = 0, False, False

        async def counted() -> Message:
            nonlocal seen, exceeded
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                exceeded = True
                raise TooLarge(self._detail())
            return message

        async def guarded(message: Message) -> None:
            nonlocal started
            # FastAPI turns any error while reading a body into "400 error parsing the body":
            # once the limit is crossed, the app's own answer is dropped for our 413.
            if exceeded and not started:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        with contextlib.suppress(TooLarge):
            await self.app(scope, counted, guarded)
        if exceeded and not started:
            await self._reject(send)

    def _detail(self) -> str:
        return (f"request body is over {self.limit} bytes; send files with PUT "
                f"/sandboxes/{{id}}{RAW_UPLOAD} (raw bytes, streamed) instead")

    async def _reject(self, send: Send) -> None:
        await JSONResponse({"detail": self._detail()}, 413)({"type": "http"}, _nothing, send)


async def _nothing() -> Message:
    return {"type": "http.disconnect"}


def create_app(service: SandboxService, lifespan: Any = None) -> FastAPI:
    settings = service.settings
    app = FastAPI(title="Orchard Env", version=__version__, lifespan=lifespan,
                  description="Isolated sandboxes for agents: create, exec, files, patches, PTY.")
    app.add_middleware(BodyLimit, limit=settings.max_json_body)

    async def auth(request: Request) -> None:  # async: a sync one costs a thread hop
        check_key(settings.api_keys, given_key(request))

    @app.exception_handler(ServiceError)
    async def _service_error(_: Request, exc: ServiceError) -> JSONResponse:
        return JSONResponse({"detail": exc.detail}, exc.status, headers=exc.headers)

    @app.exception_handler(StoreUnavailable)
    @app.exception_handler(LockTimeout)
    async def _store_trouble(_: Request, exc: Exception) -> JSONResponse:
        # Transient by nature (a Redis failover, a record busy with another replica's change):
        # nothing was half-done that a retry would repeat wrongly.
        return JSONResponse({"detail": f"state store: {exc}; retry shortly"}, 503,
                            headers={"Retry-After": "2"})

    def agent_call(sid: str) -> Callable[[Awaitable[Any]], Awaitable[Any]]:
        async def call(awaitable: Awaitable[Any]) -> Any:
            try:
                return await awaitable
            except AgentError as e:
                raise from_agent(e, sid) from None
        return call

    secured = [Depends(auth)]

    @app.get("/")
    async def banner() -> dict[str, str]:
        return {"name": "orchard-env", "version": __version__, "docs": "/docs"}

    @app.get("/health", response_model=Health)
    async def health() -> Health:
        return Health(backend=service.backend.name, sandboxes=service.active_count(),
                      version=__version__)

    @app.get("/resources", response_model=Resources, dependencies=secured, responses=ERRORS)
    async def resources() -> Resources:
        return Resources(
            backend=service.backend.name, sandboxes=service.active_count(),
            max_sandboxes=settings.max_sandboxes, creates_in_flight=service.creates_in_flight,
            max_concurrent_creates=settings.max_concurrent_creates, cpus=os.cpu_count() or 1,
            memory_bytes=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
            cgroup=service.backend.describe(),
        )

    @app.get("/metrics", dependencies=secured)
    async def metrics() -> Response:
        service.metrics.live.set(service.active_count())
        service.metrics.in_flight.set(service.creates_in_flight)
        return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/sandboxes", response_model=SandboxInfo, dependencies=secured, responses=ERRORS)
    async def create_sandbox(req: CreateSandboxRequest) -> SandboxInfo:
        try:
            return await service.create(req)
        except ServiceError as e:
            if e.status == 503:
                service.metrics.rejected.inc()
            raise

    @app.get("/sandboxes", response_model=SandboxList, dependencies=secured, responses=ERRORS)
    async def list_sandboxes(
        label: Annotated[list[str], Query(description="key=value; repeat to AND")] = [],  # noqa: B006
    ) -> SandboxList:
        return SandboxList(sandboxes=await service.list(_label_filter(label)))

    @app.get("/events", response_model=EventList, dependencies=secured, responses=ERRORS)
    async def list_events(
        session: Annotated[str | None, Query(description="Events of one rollout")] = None,
        sandbox_id: str | None = None,
        label: Annotated[list[str], Query(description="key=value; repeat to AND")] = [],  # noqa: B006
        after: Annotated[int, Query(ge=0, le=MAX_SEQ,
                                    description="Only events with seq > after")] = 0,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    ) -> EventList:
        """The event log, oldest first; page with `after=next_after`. Events outlive their
        sandbox (for --event-retention, default 7 days)."""
        return await service.list_events(sandbox_id=sandbox_id, session=session,
                                         labels=_label_filter(label), after=after, limit=limit)

    @app.get("/sandboxes/{sid}/events", response_model=EventList, dependencies=secured,
             responses=ERRORS)
    async def sandbox_events(sid: str, after: Annotated[int, Query(ge=0, le=MAX_SEQ)] = 0,
                             limit: Annotated[int, Query(ge=1, le=10_000)] = 1000) -> EventList:
        return await service.list_events(sandbox_id=sid, after=after, limit=limit)

    @app.get("/sandboxes/{sid}", response_model=SandboxInfo, dependencies=secured,
             responses=ERRORS)
    async def get_sandbox(sid: str) -> SandboxInfo:
        return await service.get(sid)

    @app.get("/sandboxes/{sid}/wait", response_model=SandboxInfo, dependencies=secured,
             responses=ERRORS)
    async def wait_sandbox(sid: str, timeout: Annotated[float, Query(gt=0)] = 60
                           ) -> SandboxInfo:
        # Longer waits are cut to an hour, not refused: the reference SDK asks for its whole
        # readiness deadline at once.
        return await service.wait(sid, min(timeout, MAX_WAIT))

    @app.delete("/sandboxes/{sid}", response_model=DeleteResponse, dependencies=secured,
                responses=ERRORS)
    async def delete_sandbox(sid: str) -> DeleteResponse:
        return DeleteResponse(sandbox_id=sid, found=await service.delete(sid))

    @app.post("/sandboxes/{sid}/heartbeat", response_model=SandboxInfo, dependencies=secured,
              responses=ERRORS)
    async def heartbeat(sid: str) -> SandboxInfo:
        return await service.heartbeat(sid)

    @app.post("/sandboxes/{sid}/exec", response_model=Job | JobAccepted | ProcessInfo,
              dependencies=secured, responses=ERRORS)
    async def exec_command(sid: str, req: ExecRequest) -> Any:
        if req.stream:
            events = await service.exec_stream(sid, req)
            return StreamingResponse(events, media_type="application/x-ndjson")
        # The hot path: serialise once, skipping FastAPI's re-validation of the return value.
        result = await service.exec(sid, req)
        return Response(result.model_dump_json(), media_type="application/json")

    @app.get("/jobs/{job_id}", response_model=Job, dependencies=secured, responses=ERRORS)
    async def get_job(job_id: str) -> Job:
        return await service.get_job(job_id)

    @app.get("/jobs/{job_id}/wait", response_model=Job, dependencies=secured, responses=ERRORS)
    async def wait_job(job_id: str, timeout: Annotated[float, Query(gt=0)] = 60) -> Job:
        return await service.wait_job(job_id, min(timeout, MAX_WAIT))

    @app.post("/sandboxes/{sid}/apply_patch", response_model=PatchResponse, dependencies=secured,
              responses=ERRORS)
    async def apply_patch(sid: str, req: PatchRequest) -> PatchResponse:
        payload = {"patch": req.patch, "cwd": req.cwd, "timeout": req.timeout_seconds}
        rec, agent = await service.running(sid)
        started = time.time()
        result = PatchResponse(**await agent_call(sid)(agent.patch(payload)))
        # Failed ones too: `git apply --reject` may have applied some hunks before failing.
        await service.events.record(rec, EventKind.patch, started, patch=req.patch, cwd=req.cwd,
                                    timeout_seconds=req.timeout_seconds, success=result.success,
                                    method=result.method, exit_code=result.exit_code)
        return result

    # --- files ---------------------------------------------------------------------------

    @app.post("/sandboxes/{sid}/files", response_model=FileWriteResult, dependencies=secured,
              responses=ERRORS)
    async def upload_b64(sid: str, req: FileUpload) -> FileWriteResult:
        try:
            data = base64.b64decode(req.content, validate=True)
        except ValueError as e:
            raise BadRequest(f"'content' is not valid base64: {e}") from None
        rec, agent = await service.running(sid)
        started = time.time()
        result = FileWriteResult(**await agent_call(sid)(agent.put_file(req.path, data, req.mode)))
        await service.events.record(rec, EventKind.file_write, started, path=req.path,
                                    mode=req.mode, **payload(data, settings.event_content_bytes))
        return result

    @app.get("/sandboxes/{sid}/files", response_model=FileDownload, dependencies=secured,
             responses=ERRORS)
    async def download_b64(sid: str, path: str) -> FileDownload:
        r = await agent_call(sid)((await service.agent(sid)).open_file(path))
        try:
            size = int(r.headers.get("content-length", 0))
            if size > settings.max_json_body:
                raise TooLarge(f"{path} is {size} bytes, too big for base64 JSON; download it "
                               f"with GET /sandboxes/{sid}/files/raw?path=...")
            data = await r.aread()
        finally:
            await r.aclose()
        return FileDownload(path=path, content=base64.b64encode(data).decode(), size=len(data))

    @app.put("/sandboxes/{sid}/files/raw", response_model=FileWriteResult, dependencies=secured,
             responses=ERRORS)
    async def upload_raw(sid: str, path: str, request: Request,
                         mode: Annotated[int | None, Query(ge=0, le=0o7777)] = None
                         ) -> FileWriteResult:
        rec, agent = await service.running(sid)
        started, limit, keep = time.time(), settings.max_upload_bytes, settings.event_content_bytes
        digest, kept = hashlib.sha256(), bytearray()

        async def body() -> AsyncIterator[bytes]:
            seen = 0
            try:
                async for chunk in request.stream():
                    seen += len(chunk)
                    if seen > limit:
                        raise TooLarge(f"upload is over the server's limit of {limit} bytes")
                    digest.update(chunk)
                    if len(kept) <= keep:
                        kept.extend(chunk)
                    yield chunk
            except ClientDisconnect:  # an aborted upload: the agent keeps the old file
                raise BadRequest(f"client disconnected after {seen} bytes") from None

        result = FileWriteResult(**await agent_call(sid)(agent.put_file(path, body(), mode)))
        await service.events.record(
            rec, EventKind.file_write, started, path=path, mode=mode, size=result.size,
            sha256=digest.hexdigest(),
            content_b64=base64.b64encode(kept).decode() if result.size <= keep else None)
        return result

    @app.get("/sandboxes/{sid}/files/raw", dependencies=secured, responses=ERRORS,
             response_class=StreamingResponse)
    async def download_raw(sid: str, path: str) -> StreamingResponse:
        r = await agent_call(sid)((await service.agent(sid)).open_file(path))
        headers = {"Content-Length": r.headers["content-length"]}
        return StreamingResponse(r.aiter_raw(), media_type="application/octet-stream",
                                 headers=headers, background=BackgroundTask(r.aclose))

    @app.get("/sandboxes/{sid}/files/list", response_model=FileList, dependencies=secured,
             responses=ERRORS)
    async def list_files(sid: str, path: str = "/workspace") -> FileList:
        return FileList(**await agent_call(sid)((await service.agent(sid)).list_files(path)))

    @app.post("/sandboxes/{sid}/files/mkdir", dependencies=secured, responses=ERRORS)
    async def mkdir(sid: str, req: PathRequest) -> dict[str, str]:
        rec, agent = await service.running(sid)
        started = time.time()
        result = await agent_call(sid)(agent.mkdir(req.path))
        await service.events.record(rec, EventKind.mkdir, started, path=req.path)
        return result

    @app.delete("/sandboxes/{sid}/files", dependencies=secured, responses=ERRORS)
    async def remove(sid: str, path: str, recursive: bool = False) -> dict[str, str]:
        rec, agent = await service.running(sid)
        started = time.time()
        result = await agent_call(sid)(agent.remove(path, recursive))
        await service.events.record(rec, EventKind.remove, started, path=path,
                                    recursive=recursive)
        return result

    # --- background processes -------------------------------------------------------------

    @app.get("/sandboxes/{sid}/processes", response_model=ProcessList, dependencies=secured,
             responses=ERRORS)
    async def list_processes(sid: str) -> ProcessList:
        listing = await agent_call(sid)((await service.agent(sid)).processes())
        return ProcessList(processes=[_process(sid, p) for p in listing["processes"]])

    @app.get("/sandboxes/{sid}/processes/{pid}", response_model=ProcessInfo,
             dependencies=secured, responses=ERRORS)
    async def get_process(sid: str, pid: str) -> ProcessInfo:
        return _process(sid, await agent_call(sid)((await service.agent(sid)).process(_seg(pid))))

    @app.get("/sandboxes/{sid}/processes/{pid}/output", response_model=ProcessOutput,
             dependencies=secured, responses=ERRORS)
    async def process_output(sid: str, pid: str, stdout_offset: Annotated[int, Query(ge=0)] = 0,
                             stderr_offset: Annotated[int, Query(ge=0)] = 0) -> ProcessOutput:
        out = (await service.agent(sid)).process_output(_seg(pid), stdout_offset, stderr_offset)
        return ProcessOutput(**await agent_call(sid)(out))

    @app.delete("/sandboxes/{sid}/processes/{pid}", response_model=ProcessInfo,
                dependencies=secured, responses=ERRORS)
    async def kill_process(sid: str, pid: str) -> ProcessInfo:
        agent = (await service.agent(sid))
        return _process(sid, await agent_call(sid)(agent.process(_seg(pid), "DELETE")))

    # --- PTY ------------------------------------------------------------------------------

    @app.websocket("/sandboxes/{sid}/exec/pty")
    async def pty(ws: WebSocket, sid: str) -> None:
        """Two framings: ours (``?command=``, binary frames) and the reference system's
        (JSON frames, an ``init`` frame first); see docs/api.md#pty."""
        await serve_pty(ws, service, sid)

    return app


def _process(sid: str, info: dict[str, Any]) -> ProcessInfo:
    return ProcessInfo.model_validate({**info, "sandbox_id": sid})


def _seg(value: str) -> str:
    """A client's id as one path segment of an agent request. The agent client puts paths into
    its request line as they are: a raw space, '?' or CR/LF would smuggle in a query, headers
    or a second request and leave the pooled connection out of step (seen by fuzzing)."""
    return quote(value, safe="")


def _label_filter(items: list[str]) -> dict[str, str]:
    wanted = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise BadRequest(f"label filter {item!r} must look like key=value")
        wanted[key] = value
    return wanted
