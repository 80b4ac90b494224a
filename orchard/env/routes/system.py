"""The service itself: banner, health, resources, metrics."""

from __future__ import annotations

import os
from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from orchard.env.routes.common import ERRORS
from orchard.env.schema import Health, PoolInfo, Resources
from orchard.env.service import SandboxService
from orchard.version import __version__


def router(service: SandboxService, secured: list[Any]) -> APIRouter:
    api = APIRouter()
    settings = service.settings

    @api.get("/")
    async def banner() -> dict[str, str]:
        return {"name": "orchard-env", "version": __version__, "docs": "/docs"}

    @api.get("/health", response_model=Health)
    async def health() -> Health:
        return Health(backend=service.backend.name, sandboxes=service.records.active_count(),
                      version=__version__)

    @api.get("/resources", response_model=Resources, dependencies=secured, responses=ERRORS)
    async def resources() -> Resources:
        return Resources(
            backend=service.backend.name, sandboxes=service.records.active_count(),
            max_sandboxes=settings.max_sandboxes,
            creates_in_flight=service.lifecycle.creates_in_flight,
            max_concurrent_creates=settings.max_concurrent_creates, cpus=os.cpu_count() or 1,
            memory_bytes=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
            cgroup=service.backend.describe(),
        )

    @api.get("/pools", response_model=list[PoolInfo], dependencies=secured, responses=ERRORS)
    async def pools() -> list[PoolInfo]:
        """The warm pools of orchard.yaml's ``pools:``, their ready count and their hits."""
        return service.pools.info()

    @api.get("/metrics", dependencies=secured)
    async def metrics() -> Response:
        service.pools.info()  # refreshes the pools' ready gauges
        service.metrics.live.set(service.records.active_count())
        service.metrics.in_flight.set(service.lifecycle.creates_in_flight)
        return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return api
