"""Background processes: list, inspect, read output from an offset, kill."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from orchard.env.routes.common import ERRORS
from orchard.env.schema import ProcessInfo, ProcessList, ProcessOutput
from orchard.env.service import SandboxOps


def router(ops: SandboxOps, secured: list[Any]) -> APIRouter:
    api = APIRouter(dependencies=secured, responses=ERRORS)

    @api.get("/sandboxes/{sid}/processes", response_model=ProcessList)
    async def list_processes(sid: str) -> ProcessList:
        return ProcessList(processes=[ProcessInfo.model_validate(p)
                                      for p in await ops.processes(sid)])

    @api.get("/sandboxes/{sid}/processes/{pid}", response_model=ProcessInfo)
    async def get_process(sid: str, pid: str) -> ProcessInfo:
        return ProcessInfo.model_validate(await ops.process(sid, pid))

    @api.get("/sandboxes/{sid}/processes/{pid}/output", response_model=ProcessOutput)
    async def process_output(sid: str, pid: str, stdout_offset: Annotated[int, Query(ge=0)] = 0,
                             stderr_offset: Annotated[int, Query(ge=0)] = 0) -> ProcessOutput:
        return ProcessOutput(**await ops.process_output(sid, pid, stdout_offset, stderr_offset))

    @api.delete("/sandboxes/{sid}/processes/{pid}", response_model=ProcessInfo)
    async def kill_process(sid: str, pid: str) -> ProcessInfo:
        return ProcessInfo.model_validate(await ops.process(sid, pid, "DELETE"))

    return api
