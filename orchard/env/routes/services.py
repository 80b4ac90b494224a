"""The sandbox's own services: an HTTP request on its loopback, and the answer."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from orchard.env.http_schema import ServiceRequest, ServiceResponse
from orchard.env.routes.common import ERRORS
from orchard.env.service import SandboxOps


def router(ops: SandboxOps, secured: list[Any]) -> APIRouter:
    api = APIRouter(dependencies=secured, responses=ERRORS)

    @api.post("/sandboxes/{sid}/http", response_model=ServiceResponse)
    async def http(sid: str, request: ServiceRequest) -> ServiceResponse:
        """Send an HTTP request to a service the sandbox serves on its own 127.0.0.1 (a site,
        a tool server) and return its answer, whatever its status: the service's 404 is a
        200 here. Nothing listening on the port is a 502, no answer in time a 504. Each
        request is a `http` event, so a replay redoes it."""
        return ServiceResponse.model_validate(await ops.http(sid, request))

    return api
