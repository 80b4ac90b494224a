"""The orchestrator's other holdings as pages: snapshots, warm pools, images, and /metrics
as small charts."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from orchard.console.pages import ConsoleError, render


def router() -> APIRouter:
    ui = APIRouter(prefix="/ui")

    @ui.get("/snapshots")
    async def snapshots(request: Request) -> Response:
        found = (await request.app.state.console.call(request, "GET", "/snapshots"))["snapshots"]
        found.sort(key=lambda s: s["created_at"], reverse=True)
        return render(request, "snapshots.html", snapshots=found)

    @ui.post("/snapshots/{snapshot_id}/delete")
    async def delete_snapshot(request: Request, snapshot_id: str) -> Response:
        await request.app.state.console.call(request, "DELETE", f"/snapshots/{snapshot_id}")
        return Response(headers={"HX-Refresh": "true"})

    @ui.get("/pools")
    async def pools(request: Request) -> Response:
        return render(request, "pools.html",
                      pools=await request.app.state.console.call(request, "GET", "/pools"))

    @ui.get("/images")
    async def images(request: Request) -> Response:
        try:
            found = await request.app.state.console.call(request, "GET", "/images")
        except ConsoleError as e:
            if e.status not in (404, 501):
                raise
            found, note = None, e.detail  # a backend without an image cache
        else:
            note = None
        return render(request, "images.html", images=found, note=note)

    @ui.get("/metrics")
    async def metrics(request: Request) -> Response:
        request.app.state.console.check(request)
        return render(request, "metrics.html")

    return ui
