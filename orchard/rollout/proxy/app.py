"""The recording proxy: an OpenAI-compatible front for model servers that records every call.

A harness points its OpenAI base URL at ``http://proxy/s/<session>/v1`` (or sends
``X-Orchard-Session``); the proxy forwards the request body byte for byte to an upstream
(vLLM, SGLang, llama.cpp, a hosted API), streams the answer back as it arrives, and appends
the call (request, response, usage, latency, errors, and token ids with log-probs when the
upstream returns them) to the session's log. Upstream errors reach the harness unchanged.

Only the inference routes are forwarded (``POST /v1/chat/completions``, ``POST
/v1/completions``, ``POST /v1/responses``, ``GET /v1/models`` and ``/v1/models/{id}``):
sandboxes may reach the proxy (directly on Kubernetes), and a model server's control routes (a
policy server's ``/v1/load_weights``, SGLang's and vLLM's admin endpoints) must stay out of
their reach. The recorded sessions (``/sessions...``) are other rollouts' transcripts: reading
them takes the proxy's admin key (``ProxySettings.admin_key``, sent as ``X-API-Key``).

A session sticks to one upstream (by hash), so an upstream's prefix cache sees the whole
conversation.

The proxy's own answers: 400 for a bad session id or a body that is not JSON (refused before it
reaches the upstream: the log could not hold it), 404 for a path that is not an inference route,
405 for a method the route does not take, 502 when the upstream cannot be reached or breaks off,
504 when it stays silent past the timeout; all in OpenAI's error shape, and all but the 4xx
recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
import zlib
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orchard.http_guard import HostOriginGuard
from orchard.inference_routes import method_of, routes
from orchard.rollout.proxy.answers import assemble_stream, token_view
from orchard.rollout.proxy.recorder import BadSession, ModelCall, SessionStore, check_session
from orchard.rollout.proxy.render import ChatRenderer, RenderError, chat_stream
from orchard.rollout.proxy.upstream import (
    Upstream,
    UpstreamError,
    UpstreamResponse,
    UpstreamTimeout,
)
from orchard.rollout.proxy.wire import error_body
from orchard.rollout.traces.samples import samples_json
from orchard.serving import admin_key_refusal, new_admin_key
from orchard.version import __version__

SESSION_HEADER = "x-orchard-session"
DEFAULT_SESSION = "default"
# Headers a client sends that mean something to the upstream; hop-by-hop ones stay here.
_FORWARDED = ("authorization", "content-type", "accept", "openai-organization",
              "openai-project", "x-request-id")
_FORWARDED_RAW = frozenset(h.encode() for h in _FORWARDED)
_SESSION_HEADER_RAW = SESSION_HEADER.encode()
# Where `orchard proxy` and the readers of sessions (`orchard trace`, `orchard eval`)
# find the admin key.
ADMIN_KEY_ENV = "ORCHARD_PROXY_KEY"
INFERENCE_ROUTES = routes()


class ProxySettings(BaseModel):
    upstreams: list[str] = Field(min_length=1, description="Base URLs, e.g. http://vllm:8000")
    store: Path = Field(description="Directory of the session logs (one JSONL per session).")
    api_key: str | None = Field(
        None, description="Sent upstream as the bearer token; else the client's own is passed.")
    timeout: float = Field(
        600, gt=0, description="Seconds the upstream may stay silent: before its answer begins, "
                               "and between two pieces of it.")
    render_with: str | Path | None = Field(
        None, description="A tokenizer (directory or Hugging Face name) whose chat template "
        "renders chat requests here, sent upstream as token-id prompts to /v1/completions "
        "(see orchard/rollout/proxy/render.py); for upstreams whose chat endpoint gives no "
        "token ids.")
    allowed_hosts: list[str] = Field(
        ["*"], description="Host names the proxy answers (see orchard/http_guard.py). Any by "
        "default: sandboxes call it by whatever name reaches it, and what a rebinding page could "
        "read (sessions) takes the admin key.")
    allowed_origins: list[str] = Field(
        default_factory=list, description="Browser origins whose pages may call the proxy; "
        "none by default, so a page in a browser cannot spend the model's tokens.")
    admin_key: str | None = Field(
        default_factory=new_admin_key, description="Needed to read sessions (X-API-Key or "
        "Authorization: Bearer); random by default, so that only the code holding these "
        "settings can read them. None turns session reads off.")


def _error_body(status: int, message: str) -> bytes:
    """OpenAI's error shape, so harnesses report proxy errors like upstream ones."""
    return JSONResponse(error_body(status, message, "orchard_proxy_error")).body


def _error(status: int, message: str) -> Response:
    return Response(_error_body(status, message), status, media_type="application/json")


def _route_refusal(method: str, path: str) -> tuple[int, str] | None:
    """Why a forwarded path (/v1/..., decoded, so escaped dots count too) is refused (status,
    message), or None for an inference route."""
    allowed = method_of(path.removeprefix("/v1/"))
    if allowed is None:
        return 404, (f"{path[:200]} is not forwarded: the proxy forwards only the inference "
                     f"routes ({INFERENCE_ROUTES}), under /v1 or /s/{{session}}/v1")
    if method != allowed:
        return 405, f"{method} {path} is not forwarded; use {allowed}"
    return None


class _KeyRefused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


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

    async def write(self, session: str, call: ModelCall,
                    complete: Callable[[dict[str, Any]], None] | None = None) -> None:
        """Append ``call`` after ``complete`` filled in what is parsed from the answer; both in
        a worker thread, so parsing the answer is not on the harness's clock either."""
        try:
            await asyncio.to_thread(self._append, session, call, complete)
        finally:
            self._writing[session] -= 1
            if not self._writing[session]:
                del self._writing[session]
                self._idle.pop(session).set()

    def _append(self, session: str, call: ModelCall,
                complete: Callable[[dict[str, Any]], None] | None) -> None:
        if complete is not None:
            try:
                complete(call)
            except Exception as e:  # an answer of an unexpected shape: record it all the same
                call["record_error"] = f"could not parse the answer: {e!r}"
        self.store.append(session, call)

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
    upstreams = [Upstream(u, timeout=settings.timeout, connect_timeout=10)
                 for u in settings.upstreams]

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            for u in upstreams:
                await u.aclose()

    app = FastAPI(title="Orchard recording proxy", version=__version__, lifespan=lifespan,
                  description="OpenAI-compatible; records each call under a session id. "
                              f"Forwarding: {INFERENCE_ROUTES} (session from the "
                              "X-Orchard-Session header), the same under /s/{session}/v1. "
                              "Reading sessions takes the admin key (X-API-Key).")
    # The forwarding routes are the hot path: they are answered in front of FastAPI's routing,
    # request and response objects (measured: about half the proxy's time per call went there).
    app.add_middleware(_ForwardingRoutes, forwarder=_Forwarder(settings, upstreams, recorder))
    # Outermost: a refused page's request reaches neither the upstream nor the log.
    app.add_middleware(HostOriginGuard, allowed_hosts=settings.allowed_hosts,
                       allowed_origins=settings.allowed_origins)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "upstreams": settings.upstreams}

    @app.exception_handler(_KeyRefused)
    async def _refused(_: Request, e: _KeyRefused) -> Response:
        return _error(e.status, str(e))

    def admin(request: Request) -> None:
        refusal = admin_key_refusal(
            settings.admin_key, request.headers, "reading sessions",
            f"give `orchard proxy` --admin-key KEY (or {ADMIN_KEY_ENV}) and send that key; "
            "in-process, it is ProxySettings.admin_key")
        if refusal is not None:
            raise _KeyRefused(*refusal)

    @app.get("/sessions", dependencies=[Depends(admin)])
    async def sessions() -> dict[str, list[str]]:
        return {"sessions": await asyncio.to_thread(store.sessions)}

    async def recorded(session: str) -> list[dict[str, Any]] | Response:
        try:
            calls = await recorder.read(check_session(session))
        except BadSession as e:
            return _error(400, str(e))
        if calls is None:
            return _error(404, f"no calls recorded for session {session!r}; list them with "
                               "GET /sessions")
        return calls

    @app.get("/sessions/{session}", dependencies=[Depends(admin)])
    async def session_calls(session: str) -> Response:
        calls = await recorded(session)
        return calls if isinstance(calls, Response) else JSONResponse(
            {"session": session, "calls": calls})

    @app.get("/sessions/{session}/samples", dependencies=[Depends(admin)])
    async def session_samples(session: str) -> Response:
        calls = await recorded(session)
        return calls if isinstance(calls, Response) else JSONResponse(
            samples_json(session, calls))

    return app


class _ForwardingRoutes:
    """ASGI middleware: ``/v1/...`` and ``/s/{session}/v1/...`` go to the forwarder, the
    rest (health, sessions, docs) to the FastAPI app."""

    def __init__(self, app: ASGIApp, forwarder: _Forwarder) -> None:
        self.app = app
        self.forwarder = forwarder

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path: str = scope["path"]
            root = scope.get("root_path", "")
            if root and path.startswith(root):
                path = path[len(root):]
            if path.startswith("/v1/"):
                session = DEFAULT_SESSION
                for name, value in scope["headers"]:
                    if name == _SESSION_HEADER_RAW:
                        session = value.decode("latin-1")
                        break
                return await self.forwarder(scope, receive, send, session, path)
            if path.startswith("/s/"):
                session, _, rest = path[3:].partition("/")
                if rest.startswith("v1/"):
                    return await self.forwarder(scope, receive, send, session, "/" + rest)
        await self.app(scope, receive, send)


class _Forwarder:
    """One forwarded call: the body byte for byte to the session's upstream, its answer back as
    it arrives, and the call to the session's log once the answer went out."""

    def __init__(self, settings: ProxySettings, upstreams: list[Upstream],
                 recorder: _Recorder) -> None:
        self.upstreams = upstreams
        self.recorder = recorder
        self.auth = f"Bearer {settings.api_key}".encode() if settings.api_key else None
        self.renderer = ChatRenderer(settings.render_with) if settings.render_with else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send, session: str,
                       path: str) -> None:
        refusal = _route_refusal(scope["method"], path)
        if refusal is not None:
            return await _send_error(send, *refusal)
        method = scope["method"]
        try:
            check_session(session)
        except BadSession as e:
            return await _send_error(send, 400, str(e))
        body = await _read_body(receive)
        # Parsed here, not in the recorder's thread: a body the log could not hold is refused
        # before it reaches the upstream. It is cheap next to the upstream's own work (7 us for
        # 1.4 kB, 0.11 ms for 120 kB).
        try:
            request = json.loads(body) if body else {}
        except ValueError as e:
            return await _send_error(send, 400, f"request body is not JSON: {e}")
        upstream = self.upstreams[zlib.crc32(session.encode()) % len(self.upstreams)]
        headers = [(k, v) for k, v in scope["headers"] if k in _FORWARDED_RAW
                   and not (self.auth and k == b"authorization")]
        if self.auth:
            headers.append((b"authorization", self.auth))
        target = _raw_target(scope, path)
        call = ModelCall(endpoint=path, upstream=upstream.url, request=request,
                         started_at=time.time())
        t0 = time.perf_counter()
        if self.renderer is not None and method == "POST" and path == "/v1/chat/completions":
            return await self._rendered(send, upstream, headers, request, call, session, t0)
        try:
            response = await upstream.request(method, target, headers, body)
        except UpstreamError as e:
            status = 504 if isinstance(e, UpstreamTimeout) else 502
            call.update(status=status, error=str(e), latency_ms=(time.perf_counter() - t0) * 1000)
            self.recorder.expect(session)
            await self.recorder.write(session, call)
            return await _send_error(send, status, f"{e}; check that the model server is up")
        self.recorder.expect(session)
        content_type = response.headers.get("content-type", "application/json")
        if response.status_code < 400 and content_type.startswith("text/event-stream"):
            return await self._relay(receive, send, response, content_type, call, session, t0)
        try:
            data = await response.aread()
        except UpstreamError as e:
            status = 504 if isinstance(e, UpstreamTimeout) else 502
            call.update(status=status, error=str(e), latency_ms=(time.perf_counter() - t0) * 1000)
            await self.recorder.write(session, call)
            return await _send_error(send, status, str(e))
        call.update(status=response.status_code, latency_ms=(time.perf_counter() - t0) * 1000)
        try:
            await send({"type": "http.response.start", "status": response.status_code,
                        "headers": [(b"content-type", content_type.encode("latin-1")),
                                    (b"content-length", b"%d" % len(data))]})
            await send({"type": "http.response.body", "body": data})
        finally:
            self.recorder.spawn(self.recorder.write(
                session, call, functools.partial(_complete_plain, data)))

    async def _rendered(self, send: Send, upstream: Upstream, headers: list[tuple[bytes, bytes]],
                        chat: dict[str, Any], call: ModelCall, session: str,
                        t0: float) -> None:
        """A chat call answered through /v1/completions with a prompt rendered here."""
        assert self.renderer is not None
        try:
            body, prompt = await asyncio.to_thread(self.renderer.completion_request, chat)
        except Exception as e:  # noqa: BLE001 - a template may raise anything on odd input
            return await _send_error(send, 400, f"cannot render this chat request with the "
                                                f"proxy's chat template: {e}")
        call["rendered"] = {"endpoint": "/v1/completions", "prompt_tokens": len(prompt)}
        headers = [(k, v) for k, v in headers if k != b"content-type"]
        headers.append((b"content-type", b"application/json"))
        self.recorder.expect(session)
        try:
            status, content_type, answer = await self._complete_rendered(
                upstream, headers, body, chat, prompt, call)
            call.update(status=status, latency_ms=(time.perf_counter() - t0) * 1000)
            await send({"type": "http.response.start", "status": status,
                        "headers": [(b"content-type", content_type.encode("latin-1")),
                                    (b"content-length", b"%d" % len(answer))]})
            await send({"type": "http.response.body", "body": answer})
        finally:
            self.recorder.spawn(self.recorder.write(session, call))

    async def _complete_rendered(self, upstream: Upstream, headers: list[tuple[bytes, bytes]],
                                 body: dict[str, Any], chat: dict[str, Any], prompt: list[int],
                                 call: ModelCall) -> tuple[int, str, bytes]:
        """(status, content type, body) for the harness; fills in the call's record."""
        assert self.renderer is not None
        try:
            response = await upstream.request("POST", "/v1/completions", headers,
                                              json.dumps(body).encode())
            data = await response.aread()
        except UpstreamError as e:
            status = 504 if isinstance(e, UpstreamTimeout) else 502
            call["error"] = str(e)
            return status, "application/json", _error_body(
                status, f"{e}; check that the model server is up")
        if response.status_code >= 400:  # the upstream's own error, passed on as it came
            call.update(_parse_body(data, response.status_code))
            return (response.status_code,
                    response.headers.get("content-type", "application/json"), data)
        try:
            answer, tokens = self.renderer.chat_response(chat, json.loads(data), prompt)
        except (ValueError, RenderError) as e:
            call["error"] = f"upstream answer unusable: {e}"
            return 502, "application/json", _error_body(502, call["error"])
        call.update(response=answer, tokens=tokens)
        if chat.get("stream"):
            return 200, "text/event-stream", chat_stream(answer)
        return 200, "application/json", json.dumps(answer).encode()

    async def _relay(self, receive: Receive, send: Send, response: UpstreamResponse,
                     content_type: str, call: ModelCall, session: str, t0: float) -> None:
        """Pass each chunk on as it arrives (no buffering added), keeping a copy to record; a
        client that hangs up ends the upstream stream too (the model stops generating)."""
        seen: list[bytes] = []
        gone = False

        async def watch() -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            gone = True
            response.close()  # the pending read ends: the relay stops

        watcher = asyncio.get_running_loop().create_task(watch())
        try:
            await send({"type": "http.response.start", "status": response.status_code,
                        "headers": [(b"content-type", content_type.encode("latin-1"))]})
            try:
                async for chunk in response.aiter_raw():
                    seen.append(chunk)
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except UpstreamError as e:
                if not gone:
                    call["error"] = f"upstream stream broke: {e}"
                elif not b"".join(seen[-2:]).rstrip().endswith(b"data: [DONE]"):
                    # a harness may hang up once it has [DONE]; before it, the answer is cut
                    call["error"] = "the client hung up mid-stream; recorded what had arrived"
            watcher.cancel()
            await send({"type": "http.response.body", "body": b""})
        finally:
            watcher.cancel()
            response.close()
            # The record must not go down with a cancelled request: a task of its own writes it.
            call.update(status=response.status_code,
                        latency_ms=(time.perf_counter() - t0) * 1000)
            self.recorder.spawn(self.recorder.write(
                session, call, functools.partial(_complete_stream, b"".join(seen))))


async def _read_body(receive: Receive) -> bytes:
    message = await receive()
    body: bytes = message.get("body", b"")
    if not message.get("more_body"):
        return body
    parts = [body]
    while message.get("more_body"):
        message = await receive()
        parts.append(message.get("body", b""))
    return b"".join(parts)


def _raw_target(scope: Scope, path: str) -> str:
    """The upstream's path and query as the client wrote them (percent-escapes kept)."""
    raw: bytes | None = scope.get("raw_path")
    if raw is not None:
        root = scope.get("root_path", "").encode("latin-1")
        if root and raw.startswith(root):
            raw = raw[len(root):]
        if raw.startswith(b"/s/"):
            raw = b"/" + raw[3:].partition(b"/")[2]
        target = raw.decode("latin-1")
    else:
        target = path
    if query := scope.get("query_string"):
        target += "?" + query.decode("latin-1")
    return target


async def _send_error(send: Send, status: int, message: str) -> None:
    body = _error_body(status, message)
    start: Message = {"type": "http.response.start", "status": status,
                      "headers": [(b"content-type", b"application/json"),
                                  (b"content-length", b"%d" % len(body))]}
    await send(start)
    await send({"type": "http.response.body", "body": body})


def _complete_plain(data: bytes, call: ModelCall) -> None:
    call.update(_parse_body(data, call["status"]))
    call["tokens"] = token_view(call)


def _complete_stream(raw: bytes, call: ModelCall) -> None:
    call["response"] = assemble_stream(raw)
    call["tokens"] = token_view(call)


def _parse_body(data: bytes, status: int) -> dict[str, Any]:
    try:
        body = json.loads(data)
    except ValueError:
        body = data.decode(errors="replace")
    if status >= 400:
        return {"error": body}
    return {"response": body}
