"""The recording proxy: an OpenAI-compatible front for model servers that records every call.

A harness points its OpenAI base URL at ``http://proxy/s/<session>/v1`` (or sends
``X-Orchard-Session``); the proxy forwards the request body byte for byte to an upstream
(vLLM, SGLang, llama.cpp, a hosted API), streams the answer back as it arrives, and appends
the call (request, response, usage, latency, errors, and token ids with log-probs when the
upstream returns them) to the session's log. Upstream errors reach the harness unchanged.

A session sticks to one upstream (by hash), so an upstream's prefix cache sees the whole
conversation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import zlib
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, Field
from starlette.background import BackgroundTask

from orchard.rollout.recorder import BadSession, SessionStore, check_session
from orchard.rollout.samples import samples_json
from orchard.version import __version__

SESSION_HEADER = "x-orchard-session"
DEFAULT_SESSION = "default"
# Headers a client sends that mean something to the upstream; hop-by-hop ones stay here.
_FORWARDED = ("authorization", "content-type", "accept", "openai-organization",
              "openai-project", "x-request-id")


class ProxySettings(BaseModel):
    upstreams: list[str] = Field(min_length=1, description="Base URLs, e.g. http://vllm:8000")
    store: Path = Field(description="Directory of the session logs (one JSONL per session).")
    api_key: str | None = Field(
        None, description="Sent upstream as the bearer token; else the client's own is passed.")
    timeout: float = Field(600, gt=0, description="Seconds an upstream call may take.")


def _error(status: int, message: str) -> JSONResponse:
    """OpenAI's error shape, so harnesses report proxy errors like upstream ones."""
    return JSONResponse({"error": {"message": message, "type": "orchard_proxy_error",
                                   "code": status}}, status)


class _Recorder:
    """Appends calls off the event loop, after their answers went out (the fsync is not on the
    harness's clock), while readers of a session still see every call that was answered."""

    def __init__(self, store: SessionStore) -> None:
        self.store = store
        self._writing: dict[str, int] = {}
        self._idle: dict[str, asyncio.Event] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def expect(self, session: str) -> None:
        self._writing[session] = self._writing.get(session, 0) + 1
        self._idle.setdefault(session, asyncio.Event()).clear()

    async def write(self, session: str, call: dict[str, Any]) -> None:
        try:
            await asyncio.to_thread(self.store.append, session, call)
        finally:
            self._writing[session] -= 1
            if not self._writing[session]:
                del self._writing[session]
                self._idle.pop(session).set()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def read(self, session: str) -> list[dict[str, Any]] | None:
        if session in self._idle:
            # Bounded: a stream whose client vanished before it began never reaches its write.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle[session].wait(), 10)
        return await asyncio.to_thread(self.store.read, session)


def create_proxy_app(settings: ProxySettings) -> FastAPI:
    store = SessionStore(settings.store)
    recorder = _Recorder(store)
    clients: list[httpx.AsyncClient] = []

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
        timeout = httpx.Timeout(settings.timeout, connect=10)
        clients.extend(httpx.AsyncClient(base_url=u.rstrip("/"), limits=limits, timeout=timeout)
                       for u in settings.upstreams)
        try:
            yield
        finally:
            for c in clients:
                await c.aclose()

    app = FastAPI(title="Orchard recording proxy", version=__version__, lifespan=lifespan,
                  description="OpenAI-compatible; records each call under a session id.")

    def upstream(session: str) -> httpx.AsyncClient:
        return clients[zlib.crc32(session.encode()) % len(clients)]

    def headers_for(request: Request) -> dict[str, str]:
        out = {k: v for k, v in request.headers.items() if k in _FORWARDED}
        if settings.api_key:
            out["authorization"] = f"Bearer {settings.api_key}"
        return out

    async def forward(request: Request, session: str, path: str) -> Response:
        try:
            check_session(session)
        except BadSession as e:
            return _error(400, str(e))
        body = await request.body()
        try:
            payload = json.loads(body) if body else {}
        except ValueError as e:
            return _error(400, f"request body is not JSON: {e}")
        client = upstream(session)
        call = {"endpoint": f"/v1/{path}", "upstream": str(client.base_url),
                "request": payload, "started_at": time.time()}
        t0 = time.perf_counter()
        upstream_request = client.build_request(request.method, f"/v1/{path}", content=body,
                                                headers=headers_for(request),
                                                params=request.query_params)
        try:
            response = await client.send(upstream_request, stream=True)
        except httpx.HTTPError as e:
            call.update(status=502, error=f"upstream {client.base_url} unreachable: {e!r}",
                        latency_ms=(time.perf_counter() - t0) * 1000)
            recorder.expect(session)
            await recorder.write(session, call)
            return _error(502, f"{call['error']}; check that the model server is up")
        recorder.expect(session)
        content_type = response.headers.get("content-type", "application/json")
        if response.status_code < 400 and content_type.startswith("text/event-stream"):
            return StreamingResponse(_relay_stream(response, call, recorder, session, t0),
                                     status_code=response.status_code, media_type=content_type)
        data = await response.aread()
        await response.aclose()
        call.update(status=response.status_code, latency_ms=(time.perf_counter() - t0) * 1000,
                    **_parse_body(data, response.status_code))
        call["tokens"] = token_view(call)
        return Response(data, response.status_code, media_type=content_type,
                        background=BackgroundTask(recorder.write, session, call))

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "upstreams": settings.upstreams}

    @app.api_route("/v1/{path:path}", methods=["GET", "POST"])
    async def plain(request: Request, path: str) -> Response:
        return await forward(request, request.headers.get(SESSION_HEADER, DEFAULT_SESSION), path)

    @app.api_route("/s/{session}/v1/{path:path}", methods=["GET", "POST"])
    async def in_session(request: Request, session: str, path: str) -> Response:
        return await forward(request, session, path)

    @app.get("/sessions")
    async def sessions() -> dict[str, list[str]]:
        return {"sessions": await asyncio.to_thread(store.sessions)}

    async def recorded(session: str) -> list[dict[str, Any]] | JSONResponse:
        try:
            calls = await recorder.read(check_session(session))
        except BadSession as e:
            return _error(400, str(e))
        if calls is None:
            return _error(404, f"no calls recorded for session {session!r}; list them with "
                               "GET /sessions")
        return calls

    @app.get("/sessions/{session}")
    async def session_calls(session: str) -> Response:
        calls = await recorded(session)
        return calls if isinstance(calls, Response) else JSONResponse(
            {"session": session, "calls": calls})

    @app.get("/sessions/{session}/samples")
    async def session_samples(session: str) -> Response:
        calls = await recorded(session)
        return calls if isinstance(calls, Response) else JSONResponse(
            samples_json(session, calls))

    return app


async def _relay_stream(response: httpx.Response, call: dict[str, Any], recorder: _Recorder,
                        session: str, t0: float) -> AsyncIterator[bytes]:
    """Pass each chunk on as it arrives (no buffering added), keeping a copy to record."""
    seen: list[bytes] = []

    async def finish() -> None:
        await response.aclose()
        call.update(status=response.status_code, latency_ms=(time.perf_counter() - t0) * 1000,
                    response=assemble_stream(b"".join(seen)))
        call["tokens"] = token_view(call)
        await recorder.write(session, call)

    try:
        async for chunk in response.aiter_raw():
            seen.append(chunk)
            yield chunk
    except httpx.HTTPError as e:
        call["error"] = f"upstream stream broke: {e!r}"
    finally:
        # A client that hangs up after [DONE] cancels this generator: the record must not
        # go down with it, so it is written by a task of its own.
        recorder.spawn(finish())


def _parse_body(data: bytes, status: int) -> dict[str, Any]:
    try:
        body = json.loads(data)
    except ValueError:
        body = data.decode(errors="replace")
    if status >= 400:
        return {"error": body}
    return {"response": body}


def assemble_stream(raw: bytes) -> dict[str, Any]:
    """One response object from an SSE stream of chunks (chat or completions), as the
    non-streaming endpoint would have answered: deltas joined, tool-call arguments joined by
    index, token ids and log-probs concatenated."""
    out: dict[str, Any] = {"choices": []}
    choices: dict[int, dict[str, Any]] = {}
    for line in raw.decode(errors="replace").splitlines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]" or not data:
            continue
        try:
            chunk = json.loads(data)
        except ValueError:
            continue
        for key in ("id", "model", "created", "usage", "prompt_token_ids"):
            if chunk.get(key) is not None:
                out[key] = chunk[key]
        for c in chunk.get("choices") or []:
            _merge_choice(choices.setdefault(c.get("index", 0), {"index": c.get("index", 0)}),
                          c)
    out["choices"] = [choices[i] for i in sorted(choices)]
    return out


def _merge_choice(acc: dict[str, Any], c: dict[str, Any]) -> None:
    if c.get("finish_reason") is not None:
        acc["finish_reason"] = c["finish_reason"]
    if c.get("token_ids"):
        acc.setdefault("token_ids", []).extend(c["token_ids"])
    if "text" in c:  # /v1/completions
        acc["text"] = acc.get("text", "") + (c["text"] or "")
    logprobs = c.get("logprobs")
    if logprobs:
        merged = acc.setdefault("logprobs", {})
        for key, value in logprobs.items():
            if isinstance(value, list):
                merged.setdefault(key, []).extend(value)
    delta = c.get("delta")
    if delta is None:
        return
    message = acc.setdefault("message", {"role": "assistant", "content": None})
    if delta.get("content"):
        message["content"] = (message["content"] or "") + delta["content"]
    for tc in delta.get("tool_calls") or []:
        calls = message.setdefault("tool_calls", [])
        while len(calls) <= tc.get("index", 0):
            calls.append({"id": None, "type": "function",
                          "function": {"name": "", "arguments": ""}})
        slot = calls[tc.get("index", 0)]
        if tc.get("id"):
            slot["id"] = tc["id"]
        fn = tc.get("function") or {}
        slot["function"]["name"] += fn.get("name") or ""
        slot["function"]["arguments"] += fn.get("arguments") or ""


def token_view(call: dict[str, Any]) -> dict[str, Any] | None:
    """The exact tokens of a call, when the upstream returned them (vLLM's
    ``return_token_ids`` and log-probs): prompt ids, completion ids, completion log-probs."""
    response = call.get("response")
    if not isinstance(response, dict) or not response.get("choices"):
        return None
    choice = response["choices"][0]
    prompt = response.get("prompt_token_ids") or choice.get("prompt_token_ids")
    completion = choice.get("token_ids")
    if not prompt or completion is None:
        return None
    logprobs = choice.get("logprobs") or {}
    if "content" in logprobs:  # chat format: one entry per token
        values = [t.get("logprob") for t in logprobs["content"] or []]
    else:  # completions format
        values = logprobs.get("token_logprobs") or []
    return {"prompt_ids": prompt, "completion_ids": completion,
            "completion_logprobs": values if len(values) == len(completion) else None}
