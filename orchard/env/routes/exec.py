"""Commands: exec (blocking, streamed or in the background), jobs, and the PTY."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, WebSocket
from fastapi.responses import Response, StreamingResponse

from orchard.env.pty_bridge import serve_pty
from orchard.env.routes.common import ERRORS, MAX_WAIT
from orchard.env.schema import ExecRequest, Job, JobAccepted, ProcessInfo
from orchard.env.service import SandboxService


def router(service: SandboxService, secured: list[Any]) -> APIRouter:
    api = APIRouter()

    @api.post("/sandboxes/{sid}/exec", response_model=Job | JobAccepted | ProcessInfo,
              dependencies=secured, responses=ERRORS)
    async def exec_command(sid: str, req: ExecRequest) -> Any:
        if req.stream:
            events = await service.jobs.exec_stream(sid, req)
            return StreamingResponse(events, media_type="application/x-ndjson")
        # The hot path: serialise once, skipping FastAPI's re-validation of the return value.
        result = await service.jobs.exec(sid, req)
        return Response(result.model_dump_json(), media_type="application/json")

    @api.get("/jobs/{job_id}", response_model=Job, dependencies=secured, responses=ERRORS)
    async def get_job(job_id: str) -> Job:
        return await service.jobs.get_job(job_id)

    @api.get("/jobs/{job_id}/wait", response_model=Job, dependencies=secured, responses=ERRORS)
    async def wait_job(job_id: str, timeout: Annotated[float, Query(gt=0)] = 60) -> Job:
        return await service.jobs.wait_job(job_id, min(timeout, MAX_WAIT))

    # Authenticated inside: a WebSocket carries its key in the query or a subprotocol.
    @api.websocket("/sandboxes/{sid}/exec/pty")
    async def pty(ws: WebSocket, sid: str) -> None:
        """Two framings: ours (``?command=``, binary frames) and the reference system's
        (JSON frames, an ``init`` frame first); see docs/api.md#pty."""
        await serve_pty(ws, service.ops, sid, service.settings.api_keys)

    return api
