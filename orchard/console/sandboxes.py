"""Sandbox pages: the live list, one sandbox (its facts, use, events, files and terminal),
and the actions on it."""

from __future__ import annotations

import asyncio
import base64
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from orchard.console.pages import ConsoleError, form_fields, render

PAGE = 100
# Files larger than this are shown cut, with a note to download them with the SDK or CLI.
MAX_VIEW_BYTES = 256 * 1024
LIVE = ("running", "paused")


def router() -> APIRouter:
    ui = APIRouter(prefix="/ui/sandboxes")

    async def listing(request: Request, label: list[str], session: str, offset: int
                      ) -> dict[str, Any]:
        bad = [x for x in label if "=" not in x]
        if bad:
            raise ConsoleError(400, f"label filter {bad[0]!r} has no '=': write key=value")
        console = request.app.state.console
        found = (await console.call(request, "GET", "/sandboxes",
                                    params=[("label", x) for x in label]))["sandboxes"]
        if session:
            found = [s for s in found if s.get("session") == session]
        found.sort(key=lambda s: s["created_at"], reverse=True)
        shown = found[offset:offset + PAGE]

        async def use(s: dict[str, Any]) -> dict[str, Any] | None:
            if s["status"] not in LIVE:
                return None
            try:
                return await console.call(request, "GET", f"/sandboxes/{s['sandbox_id']}/usage")
            except ConsoleError:  # gone between the list and now
                return None

        usages = await asyncio.gather(*(use(s) for s in shown))
        return {"rows": list(zip(shown, usages, strict=True)), "total": len(found),
                "offset": offset, "page": PAGE, "label": label, "session": session}

    @ui.get("")
    async def sandboxes(request: Request, label: Annotated[list[str], Query()] = [],  # noqa: B006
                        session: str = "", offset: Annotated[int, Query(ge=0)] = 0) -> Response:
        return render(request, "sandboxes.html",
                      **await listing(request, label, session, offset))

    @ui.get("/rows")
    async def rows(request: Request, label: Annotated[list[str], Query()] = [],  # noqa: B006
                   session: str = "", offset: Annotated[int, Query(ge=0)] = 0) -> Response:
        return render(request, "sandbox_rows.html",
                      **await listing(request, label, session, offset))

    @ui.get("/{sid}")
    async def sandbox(request: Request, sid: str, after: Annotated[int, Query(ge=0)] = 0
                      ) -> Response:
        console = request.app.state.console
        info = await console.call(request, "GET", f"/sandboxes/{sid}")
        usage = None
        if info["status"] in LIVE:
            try:
                usage = await console.call(request, "GET", f"/sandboxes/{sid}/usage")
            except ConsoleError:
                usage = None
        events = await console.call(request, "GET", f"/sandboxes/{sid}/events",
                                    params={"after": after, "limit": 50})
        return render(request, "sandbox.html", info=info, usage=usage, events=events,
                      after=after)

    @ui.get("/{sid}/files")
    async def files(request: Request, sid: str, path: str = "/workspace") -> Response:
        listing = await request.app.state.console.call(
            request, "GET", f"/sandboxes/{sid}/files/list", params={"path": path})
        parent = path.rstrip("/").rsplit("/", 1)[0] or "/"
        entries = sorted(listing["files"], key=lambda f: (f["type"] != "directory", f["name"]))
        return render(request, "files.html", sid=sid, path=listing["path"], parent=parent,
                      entries=entries)

    @ui.get("/{sid}/file")
    async def file(request: Request, sid: str, path: str) -> Response:
        got = await request.app.state.console.call(
            request, "GET", f"/sandboxes/{sid}/files", params={"path": path})
        data = base64.b64decode(got["content"])
        cut = len(data) > MAX_VIEW_BYTES
        text = data[:MAX_VIEW_BYTES].decode(errors="replace")
        binary = b"\0" in data[:8192]
        return render(request, "file.html", sid=sid, path=path, size=got["size"],
                      text=None if binary else text, cut=cut)

    @ui.post("/{sid}/exec")
    async def run(request: Request, sid: str) -> Response:
        command = (await form_fields(request)).get("command", "").strip()
        if not command:
            raise ConsoleError(400, "type a command to run, e.g. ls -la")
        job = await request.app.state.console.call(
            request, "POST", f"/sandboxes/{sid}/exec",
            json={"command": command, "timeout_seconds": 60})
        return render(request, "exec_result.html", command=command, job=job)

    @ui.post("/{sid}/snapshot")
    async def snapshot(request: Request, sid: str) -> Response:
        memory = (await form_fields(request)).get("memory") == "on"
        shot = await request.app.state.console.call(
            request, "POST", f"/sandboxes/{sid}/snapshot", json={"memory": memory})
        return render(request, "action_done.html", snapshot=shot)

    @ui.post("/{sid}/fork")
    async def fork(request: Request, sid: str) -> Response:
        raw = (await form_fields(request)).get("count", "1")
        if not raw.isdigit() or not 1 <= int(raw) <= 16:
            raise ConsoleError(400, f"fork count {raw!r}: give a whole number from 1 to 16 "
                               "(the API takes up to 1000)")
        forked = await request.app.state.console.call(
            request, "POST", f"/sandboxes/{sid}/fork", json={"count": int(raw)})
        return render(request, "action_done.html", forks=forked["sandboxes"])

    @ui.post("/{sid}/{verb}")
    async def lifecycle(request: Request, sid: str, verb: str) -> Response:
        console = request.app.state.console
        if verb in ("pause", "resume"):
            await console.call(request, "POST", f"/sandboxes/{sid}/{verb}")
            return Response(headers={"HX-Refresh": "true"})
        if verb == "delete":
            await console.call(request, "DELETE", f"/sandboxes/{sid}")
            return Response(headers={"HX-Redirect": "/ui/sandboxes"})
        raise ConsoleError(404, f"no action {verb!r}: pause, resume, delete, snapshot, fork "
                           "or exec")

    return ui
