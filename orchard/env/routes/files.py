"""Patches and files: base64 JSON for small ones, raw streamed bodies for any size."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect

from orchard.env.config import Settings
from orchard.env.errors import BadRequest, TooLarge
from orchard.env.events import payload
from orchard.env.routes.common import ERRORS
from orchard.env.schema import (
    FileDownload,
    FileList,
    FileUpload,
    FileWriteResult,
    PatchRequest,
    PatchResponse,
    PathRequest,
)
from orchard.env.service import SandboxOps

RAW_UPLOAD = "/files/raw"


def router(ops: SandboxOps, settings: Settings, secured: list[Any]) -> APIRouter:
    api = APIRouter(dependencies=secured, responses=ERRORS)

    @api.post("/sandboxes/{sid}/apply_patch", response_model=PatchResponse)
    async def apply_patch(sid: str, req: PatchRequest) -> PatchResponse:
        return PatchResponse(**await ops.patch(sid, req))

    @api.post("/sandboxes/{sid}/files", response_model=FileWriteResult)
    async def upload_b64(sid: str, req: FileUpload) -> FileWriteResult:
        try:
            data = base64.b64decode(req.content, validate=True)
        except ValueError as e:
            raise BadRequest(f"'content' is not valid base64: {e}") from None
        kept = payload(data, settings.event_content_bytes)
        return FileWriteResult(**await ops.write_file(sid, req.path, data, req.mode,
                                                      lambda _: kept))

    @api.get("/sandboxes/{sid}/files", response_model=FileDownload)
    async def download_b64(sid: str, path: str) -> FileDownload:
        data = await ops.read_file(sid, path, settings.max_json_body)
        return FileDownload(path=path, content=base64.b64encode(data).decode(), size=len(data))

    @api.put(f"/sandboxes/{{sid}}{RAW_UPLOAD}", response_model=FileWriteResult)
    async def upload_raw(sid: str, path: str, request: Request,
                         mode: Annotated[int | None, Query(ge=0, le=0o7777)] = None
                         ) -> FileWriteResult:
        limit, keep = settings.max_upload_bytes, settings.event_content_bytes
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

        def described(result: dict[str, Any]) -> dict[str, Any]:
            size = result["size"]
            return {"size": size, "sha256": digest.hexdigest(),
                    "content_b64": base64.b64encode(kept).decode() if size <= keep else None}

        return FileWriteResult(**await ops.write_file(sid, path, body(), mode, described))

    @api.get(f"/sandboxes/{{sid}}{RAW_UPLOAD}", response_class=StreamingResponse)
    async def download_raw(sid: str, path: str) -> StreamingResponse:
        r = await ops.open_file(sid, path)
        # The genuine agent gives the size; without it the body goes out chunked. One that runs
        # past max_download_bytes is cut: the client sees a broken transfer, not a short file.
        length = r.headers.get("content-length")
        headers = {"Content-Length": length} if length is not None else {}
        return StreamingResponse(r.aiter_raw(), media_type="application/octet-stream",
                                 headers=headers, background=BackgroundTask(r.aclose))

    @api.get("/sandboxes/{sid}/files/list", response_model=FileList)
    async def list_files(sid: str, path: str = "/workspace") -> FileList:
        return FileList(**await ops.list_files(sid, path))

    @api.post("/sandboxes/{sid}/files/mkdir")
    async def mkdir(sid: str, req: PathRequest) -> dict[str, str]:
        return await ops.mkdir(sid, req.path)

    @api.delete("/sandboxes/{sid}/files")
    async def remove(sid: str, path: str, recursive: bool = False) -> dict[str, str]:
        return await ops.remove(sid, path, recursive)

    return api
