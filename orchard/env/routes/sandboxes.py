"""Sandbox lifecycle and the event log: create, list, get, wait, heartbeat, delete, events."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from orchard.env.errors import Conflict, ServiceError
from orchard.env.routes.common import ERRORS, IMAGE_ERRORS, MAX_SEQ, MAX_WAIT, label_filter
from orchard.env.schema import (
    CreateSandboxRequest,
    DeleteResponse,
    EventList,
    SandboxInfo,
    SandboxList,
    SandboxStatus,
    SandboxUsage,
)
from orchard.env.service import SandboxService


def router(service: SandboxService, secured: list[Any]) -> APIRouter:
    api = APIRouter(dependencies=secured, responses=ERRORS)

    @api.post("/sandboxes", response_model=SandboxInfo, responses=IMAGE_ERRORS)
    async def create_sandbox(req: CreateSandboxRequest) -> SandboxInfo:
        """Record the sandbox and start it; answers at once, pending (wait with
        GET /sandboxes/{id}/wait). A registry image is checked first: 404, 401, 422 (no
        manifest for this platform) and 502 come from here; a pull that fails later fails
        the sandbox (its image_error says why)."""
        try:
            return await service.lifecycle.create(req)
        except ServiceError as e:
            if e.status == 503:
                service.metrics.rejected.inc()
            raise

    @api.get("/sandboxes", response_model=SandboxList)
    async def list_sandboxes(
        label: Annotated[list[str], Query(description="key=value; repeat to AND")] = [],  # noqa: B006
    ) -> SandboxList:
        return SandboxList(sandboxes=await service.records.list(label_filter(label)))

    @api.get("/events", response_model=EventList)
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
        return await service.events.list(sandbox_id=sandbox_id, session=session,
                                         labels=label_filter(label), after=after, limit=limit)

    @api.get("/sandboxes/{sid}/events", response_model=EventList)
    async def sandbox_events(sid: str, after: Annotated[int, Query(ge=0, le=MAX_SEQ)] = 0,
                             limit: Annotated[int, Query(ge=1, le=10_000)] = 1000) -> EventList:
        return await service.events.list(sandbox_id=sid, after=after, limit=limit)

    @api.get("/sandboxes/{sid}", response_model=SandboxInfo)
    async def get_sandbox(sid: str) -> SandboxInfo:
        return await service.records.get(sid)

    @api.get("/sandboxes/{sid}/usage", response_model=SandboxUsage)
    async def sandbox_usage(sid: str) -> SandboxUsage:
        """CPU time, memory, processes and disk a running or paused sandbox uses now (null:
        the backend cannot measure it; Kubernetes measures none)."""
        rec = await service.records.get(sid)
        if rec.status not in (SandboxStatus.running, SandboxStatus.paused):
            raise Conflict(f"sandbox {sid} is {rec.status.value}: only a running or paused "
                           "sandbox uses anything")
        return await service.backend.usage(sid)

    @api.get("/sandboxes/{sid}/wait", response_model=SandboxInfo)
    async def wait_sandbox(sid: str, timeout: Annotated[float, Query(gt=0)] = 60
                           ) -> SandboxInfo:
        # Longer waits are cut to an hour, not refused: the reference SDK asks for its whole
        # readiness deadline at once.
        return await service.records.wait(sid, min(timeout, MAX_WAIT))

    @api.delete("/sandboxes/{sid}", response_model=DeleteResponse)
    async def delete_sandbox(sid: str) -> DeleteResponse:
        return DeleteResponse(sandbox_id=sid, found=await service.lifecycle.delete(sid))

    @api.post("/sandboxes/{sid}/heartbeat", response_model=SandboxInfo)
    async def heartbeat(sid: str) -> SandboxInfo:
        return await service.lifecycle.heartbeat(sid)

    return api
