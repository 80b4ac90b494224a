"""Snapshots, forks and pause: branch a sandbox, or stop it where it stands."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Query

from orchard.env.errors import ServiceError
from orchard.env.routes.common import ERRORS, label_filter
from orchard.env.schema import SandboxInfo
from orchard.env.service import SandboxService
from orchard.env.snapshot_schema import (
    ForkRequest,
    ForkResponse,
    SnapshotDeleted,
    SnapshotInfo,
    SnapshotList,
    SnapshotRequest,
    SnapshotUpdate,
)


def router(service: SandboxService, secured: list[Any]) -> APIRouter:
    api = APIRouter(dependencies=secured, responses=ERRORS)

    @api.post("/sandboxes/{sid}/snapshot", response_model=SnapshotInfo)
    async def snapshot(sid: str, req: Annotated[SnapshotRequest | None, Body()] = None
                       ) -> SnapshotInfo:
        """Keep the sandbox's files (not its processes) as a snapshot. Its processes are
        frozen while the files are copied."""
        return await service.snapshots.snapshot(sid, req or SnapshotRequest())

    @api.get("/snapshots", response_model=SnapshotList)
    async def list_snapshots(
        label: Annotated[list[str], Query(description="key=value; repeat to AND")] = [],  # noqa: B006
    ) -> SnapshotList:
        return SnapshotList(snapshots=await service.snapshots.list_snapshots(label_filter(label)))

    @api.get("/snapshots/{snapshot_id}", response_model=SnapshotInfo)
    async def get_snapshot(snapshot_id: str) -> SnapshotInfo:
        return await service.snapshots.get_snapshot(snapshot_id)

    @api.patch("/snapshots/{snapshot_id}", response_model=SnapshotInfo)
    async def update_snapshot(snapshot_id: str, req: SnapshotUpdate) -> SnapshotInfo:
        """Set labels (a null value removes one). A build tags the snapshot it ended on so."""
        return await service.snapshots.update_snapshot(snapshot_id, req)

    @api.delete("/snapshots/{snapshot_id}", response_model=SnapshotDeleted)
    async def delete_snapshot(snapshot_id: str) -> SnapshotDeleted:
        """Forget the snapshot. Sandboxes started from it keep running: its files go once
        the last of them is deleted."""
        found = await service.snapshots.delete_snapshot(snapshot_id)
        return SnapshotDeleted(snapshot_id=snapshot_id, found=found)

    @api.post("/sandboxes/{sid}/fork", response_model=ForkResponse)
    async def fork(sid: str, req: Annotated[ForkRequest | None, Body()] = None
                   ) -> ForkResponse:
        """``count`` new sandboxes, each starting from the sandbox's files as they are now.
        They start pending, like any create: wait for each."""
        try:
            return await service.branching.fork(sid, req or ForkRequest())
        except ServiceError as e:
            if e.status == 503:
                service.metrics.rejected.inc()
            raise

    @api.post("/sandboxes/{sid}/pause", response_model=SandboxInfo)
    async def pause(sid: str) -> SandboxInfo:
        """Freeze every process of the sandbox (memory is kept; execs are refused until
        resume). Idempotent."""
        return await service.branching.pause(sid)

    @api.post("/sandboxes/{sid}/resume", response_model=SandboxInfo)
    async def resume(sid: str) -> SandboxInfo:
        return await service.branching.resume(sid)

    return api
