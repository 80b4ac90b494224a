"""Attacks on the model proxy (issue 29, finding 2): from inside a model_proxy sandbox through its
relay, and as a network peer of the recording proxy and the policy server (as a sandbox on
Kubernetes is: it reaches the proxy's Service directly).

The upstream is a stand-in model server on a real socket that answers the OpenAI routes, takes
any other path as a control route (as a policy server's /v1/load_weights), and records every
request it is sent, so each test can say what got through."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shlex
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from orchard.rollout.proxy.app import ProxySettings, create_proxy_app
from orchard.serving import ThreadedServer
from tests.conftest import create_ready, dedicated_orchestrator, needs_root, run

ADMIN_KEY = "proxy-admin-key-known-only-to-the-host"
SECRET = f"SECRET-TRANSCRIPT-{uuid.uuid4().hex}"  # in another rollout's recorded call
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


class StandIn:
    """The model server: its requests as (method, path), and a stream that waits for a
    release (GET /v1/models/release) between its two chunks."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.released = threading.Event()
        self.app = Starlette(routes=[Route("/{path:path}", self.handle,
                                           methods=["GET", "POST", "PUT", "DELETE"])])

    async def handle(self, request: Request) -> Response:
        self.seen.append((request.method, request.url.path))
        if request.url.path == "/v1/models/release":
            self.released.set()
        if request.url.path.startswith("/v1/models"):
            return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})
        if request.url.path != "/v1/chat/completions":
            return JSONResponse({"control route": request.url.path, "done": True})
        body = await request.json()
        if body.get("stream"):
            return StreamingResponse(self.stream(), media_type="text/event-stream")
        text = next((m["content"] for m in body["messages"] if "SECRET" in m["content"]), "hello")
        return JSONResponse({"id": "c", "object": "chat.completion", "model": "m", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text},
             "finish_reason": "stop"}]})

    async def stream(self) -> AsyncIterator[bytes]:
        yield _chunk("first")
        # Bounded, so that a relay that buffers ends the test instead of hanging it: the second
        # chunk then says so and the test's assertion on it fails.
        released = await asyncio.to_thread(self.released.wait, 60)
        yield _chunk("after-release" if released else "never-released")
        yield b"data: [DONE]\n\n"


def _chunk(text: str) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": text}}]}
                                  ).encode() + b"\n\n"


@dataclass
class Stack:
    upstream: StandIn
    proxy: str
    other: str  # a session that holds another rollout's transcript, with SECRET in it


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    upstream = StandIn()
    model = ThreadedServer(upstream.app, "stand-in-model")
    model.start()
    proxy = ThreadedServer(create_proxy_app(ProxySettings(
        upstreams=[model.url or ""], store=tmp_path_factory.mktemp("store"),
        admin_key=ADMIN_KEY)), "proxy")
    proxy.start()
    other = f"other-{uuid.uuid4().hex[:8]}"
    try:
        r = httpx.post(f"{proxy.url}/s/{other}/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": SECRET}]})
        assert r.status_code == 200 and SECRET in r.text
        yield Stack(upstream, proxy.url or "", other)
    finally:
        proxy.stop()
        model.stop()


def recorded(stack: Stack, session: str) -> list[dict]:
    r = httpx.get(f"{stack.proxy}/sessions/{session}", headers={"X-API-Key": ADMIN_KEY})
    return r.json()["calls"] if r.status_code == 200 else []


# --- from inside a model_proxy sandbox, through the relay -----------------------------------------

# Raw HTTP from inside the sandbox to the relay's port: each attack on its own connection, all
# bytes read back until the relay closes it. Prints {name: [statuses, text]}.
RAW = r"""
import json, re, socket, sys
own, other = sys.argv[1], sys.argv[2]
H = "Host: 127.0.0.1:18080\r\n"
def req(line, headers="", body=b"", close=True):
    return (line + "\r\n" + H + headers + ("Connection: close\r\n" if close else "")
            + "\r\n").encode() + body
chat = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
cl = "Content-Type: application/json\r\nContent-Length: %d\r\n" % len(chat)
smuggled = b"GET /sessions/" + other.encode() + b" HTTP/1.1\r\n" + H.encode() + b"\r\n"
attacks = {
    "sessions": req("GET /sessions HTTP/1.1"),
    "other_transcript": req(f"GET /sessions/{other} HTTP/1.1"),
    "other_samples": req(f"GET /s/{own}/v1/../../../sessions/{other}/samples HTTP/1.1"),
    "other_session_chat": req(f"POST /s/{other}/v1/chat/completions HTTP/1.1", cl, chat),
    "header_session": req("POST /v1/chat/completions HTTP/1.1",
                          cl + f"X-Orchard-Session: {other}\r\n", chat),
    "load_weights": req("POST /v1/load_weights HTTP/1.1", cl, chat),
    "own_load_weights": req(f"POST /s/{own}/v1/load_weights HTTP/1.1", cl, chat),
    "escaped_route": req(f"GET /s/{own}/v1/models/..%2F..%2F..%2Fsessions HTTP/1.1"),
    "absolute_form": req("GET http://127.0.0.1:8100/sessions HTTP/1.1"),
    "other_method": req(f"DELETE /s/{own}/v1/models HTTP/1.1"),
    "cl_te": req(f"POST /s/{own}/v1/chat/completions HTTP/1.1",
                 "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n", b"0\r\n\r\n" + smuggled),
    "two_lengths": req(f"POST /s/{own}/v1/chat/completions HTTP/1.1",
                       "Content-Length: 2\r\nContent-Length: %d\r\n" % (2 + len(smuggled)),
                       b"{}" + smuggled),
    "pipelined": req(f"POST /s/{own}/v1/chat/completions HTTP/1.1", cl, chat, close=False)
                 + smuggled.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"),
    "huge_head": req(f"GET /s/{own}/v1/models HTTP/1.1", "X-Pad: " + "a" * 70000 + "\r\n"),
    "huge_body": req(f"POST /s/{own}/v1/chat/completions HTTP/1.1",
                     "Content-Length: 100000000\r\n"),
}
out = {}
for name, data in attacks.items():
    s = socket.create_connection(("127.0.0.1", 18080), timeout=30)
    got = b""
    try:
        s.sendall(data)
        while chunk := s.recv(65536):
            got += chunk
    except OSError as e:
        got += repr(e).encode()
    s.close()
    text = got.decode(errors="replace")
    out[name] = [[int(c) for c in re.findall(r"HTTP/1\.[01] (\d{3}) ", text)], text[-3000:]]
print(json.dumps(out))
"""

REFUSED = {  # attack -> the one status the relay answers it with
    "sessions": 403, "other_transcript": 403, "other_samples": 403, "other_session_chat": 403,
    "header_session": 403, "load_weights": 403, "own_load_weights": 403, "escaped_route": 403,
    "absolute_form": 400, "other_method": 403, "cl_te": 400, "two_lengths": 400,
    "huge_head": 431, "huge_body": 413,
}

# A harness's own call: the first SSE chunk read, then a second call that releases the rest of
# the stream upstream; only a relay that passes chunks on as they arrive lets this finish.
STREAM = r"""
import http.client, json, os, socket
base = "/s/" + os.environ["ORCHARD_SESSION"] + "/v1"
body = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
s = socket.create_connection(("127.0.0.1", 18080), timeout=90)
s.sendall(f"POST {base}/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
          f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode())
first = b""
while b'"first"' not in first and (chunk := s.recv(65536)):
    first += chunk
side = http.client.HTTPConnection("127.0.0.1", 18080, timeout=30)
side.request("GET", base + "/models/release")
released = side.getresponse().status
rest = b""
while chunk := s.recv(65536):
    rest += chunk
print(json.dumps({"first": first.decode(), "released": released, "rest": rest.decode()}))
"""


# What a sandbox can make the host hold, I: connections. 32 kept-alive ones, each shown to be
# open at the relay by an answered call, then one more, and one again once one of the 32 closed.
CONNECTIONS = r"""
import http.client, json, os, time
base = "/s/" + os.environ["ORCHARD_SESSION"] + "/v1"
def models(c):
    c.request("GET", base + "/models")
    r = c.getresponse()
    return [r.status, r.read().decode(errors="replace")]
held = [http.client.HTTPConnection("127.0.0.1", 18080, timeout=60) for _ in range(32)]
first = [models(c)[0] for c in held]
over = models(http.client.HTTPConnection("127.0.0.1", 18080, timeout=60))
held.pop().close()
for _ in range(300):  # the relay counts the closed one out once it has seen it end
    after_one_closed = models(http.client.HTTPConnection("127.0.0.1", 18080, timeout=60))[0]
    if after_one_closed != 429:
        break
    time.sleep(0.1)
print(json.dumps({"first": first, "over": over, "after_one_closed": after_one_closed}))
"""

# II: request bodies. Three unfinished chunked uploads of 32 MiB, 32 MiB and 1 byte; whichever
# the relay reads past 64 MiB in all is refused, and only that one (the others wait for more).
BODIES = r"""
import json, os, select, socket
base = "/s/" + os.environ["ORCHARD_SESSION"] + "/v1"
uploads = []
for size in (32 << 20, 32 << 20, 1):
    s = socket.create_connection(("127.0.0.1", 18080), timeout=60)
    s.sendall(f"POST {base}/chat/completions HTTP/1.1\r\nHost: x\r\n"
              "Transfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n".encode()
              + b"%x\r\n" % size + b"x" * size + b"\r\n")
    uploads.append(s)
ready, _, _ = select.select(uploads, [], [], 60)
print(json.dumps([b"".join(iter(lambda: s.recv(65536), b"")).decode(errors="replace")
                  for s in ready]))
"""


@pytest.fixture(scope="module")
def egress(data_dir: Path, orchestrator: str, stack: Stack) -> Iterator[httpx.Client]:
    # `orchestrator` first: it builds the interpreter bundle the dedicated one links to.
    with dedicated_orchestrator(data_dir, model_proxy=stack.proxy) as url, \
            httpx.Client(base_url=url, timeout=120) as client:
        yield client


@contextlib.contextmanager
def sandbox(egress: httpx.Client, session: str) -> Iterator[str]:
    sid = create_ready(egress, {"image": "host", "session": session, "model_proxy": True})
    try:
        yield sid
    finally:
        egress.delete(f"/sandboxes/{sid}")


def python(egress: httpx.Client, sid: str, code: str, *args: str) -> Any:
    result = run(egress, sid, command=f"python3 -c {shlex.quote(code)} "
                 + " ".join(shlex.quote(a) for a in args), timeout_seconds=120)
    assert result["exit_code"] == 0, (result["stdout"][-2000:], result["stderr"][-2000:])
    return json.loads(result["stdout"])


@needs_root
def test_the_relay_carries_only_the_sandboxs_own_inference_calls(egress: httpx.Client,
                                                                 stack: Stack) -> None:
    own = f"own-{uuid.uuid4().hex[:8]}"
    before = list(stack.upstream.seen)
    with sandbox(egress, own) as sid:
        out = python(egress, sid, RAW, own, stack.other)
    for name, status in REFUSED.items():
        statuses, text = out[name]
        assert statuses == [status], (name, text)
        assert SECRET not in text and '"sessions"' not in text, name
    assert "its own session" in out["sessions"][1] and own in out["sessions"][1]
    assert "Content-Length and Transfer-Encoding" in out["cl_te"][1]
    # The pipelined request after a good one is parsed and checked on its own.
    assert out["pipelined"][0] == [200, 403], out["pipelined"][1]
    # The model server saw exactly the one good call; the proxy logged it under the sandbox's
    # session, and nothing was added to the other rollout's.
    assert stack.upstream.seen[len(before):] == [("POST", "/v1/chat/completions")]
    assert len(recorded(stack, own)) == 1 and len(recorded(stack, stack.other)) == 1


@needs_root
def test_the_sandboxs_own_calls_still_work_and_stream(egress: httpx.Client,
                                                      stack: Stack) -> None:
    own = f"own-{uuid.uuid4().hex[:8]}"
    with sandbox(egress, own) as sid:
        chat = run(egress, sid, command=(
            "python3 -c \"import json, os, urllib.request as u; print(u.urlopen(u.Request("
            "os.environ['OPENAI_BASE_URL'] + '/chat/completions', data=json.dumps("
            f"{CHAT!r}).encode(), headers={{'Content-Type': 'application/json'}})).read()"
            ".decode())\""), timeout_seconds=60)
        assert chat["exit_code"] == 0, chat
        assert json.loads(chat["stdout"])["choices"][0]["message"]["content"] == "hello"
        streamed = python(egress, sid, STREAM)
    assert streamed["first"].startswith("HTTP/1.1 200 ")
    assert "text/event-stream" in streamed["first"] and streamed["released"] == 200
    assert '"after-release"' in streamed["rest"] and "data: [DONE]" in streamed["rest"]
    calls = recorded(stack, own)
    assert sorted(c["endpoint"] for c in calls) == [
        "/v1/chat/completions", "/v1/chat/completions", "/v1/models/release"]
    assert {c["status"] for c in calls} == {200}


@needs_root
def test_a_sandbox_cannot_hold_more_than_32_relay_connections(egress: httpx.Client) -> None:
    with sandbox(egress, f"own-{uuid.uuid4().hex[:8]}") as sid:
        out = python(egress, sid, CONNECTIONS)
    assert out["first"] == [200] * 32
    assert out["over"][0] == 429 and "32 connections" in out["over"][1], out["over"]
    assert out["after_one_closed"] == 200


@needs_root
def test_a_sandbox_cannot_have_the_host_hold_over_64_mib_of_bodies(egress: httpx.Client) -> None:
    with sandbox(egress, f"own-{uuid.uuid4().hex[:8]}") as sid:
        (answer,) = python(egress, sid, BODIES)
    assert answer.startswith("HTTP/1.1 429 ") and "64 MiB" in answer, answer


# --- as a network peer of the proxy and the policy server (no relay) ------------------------------

def test_a_peer_cannot_read_sessions_without_the_admin_key(stack: Stack) -> None:
    for path in ("/sessions", f"/sessions/{stack.other}", f"/sessions/{stack.other}/samples"):
        for headers, status in [({}, 401), ({"X-API-Key": "guess"}, 403),
                                ({"Authorization": "Bearer orchard-proxy"}, 403)]:
            r = httpx.get(stack.proxy + path, headers=headers)
            assert r.status_code == status, (path, headers, r.text)
            assert SECRET not in r.text and stack.other not in r.text
        assert r.json()["error"]["type"] == "orchard_proxy_error"
    r = httpx.get(f"{stack.proxy}/sessions", headers={})
    assert "X-API-Key" in r.json()["error"]["message"]


def test_a_peer_cannot_reach_control_routes_through_the_proxy(stack: Stack) -> None:
    before = list(stack.upstream.seen)
    for path in ("/v1/load_weights", f"/s/{stack.other}/v1/load_weights", "/v1/weights",
                 "/s/x/v1/update_weights_from_disk", "/v1/models/..%2F..%2Fload_weights"):
        r = httpx.post(stack.proxy + path, json={"path": "/tmp/decoy"})
        assert r.status_code in (404, 405), (path, r.text)
        assert "inference routes" in r.text or "not forwarded" in r.text
    assert stack.upstream.seen == before
    assert not any("load_weights" in p for _, p in stack.upstream.seen)


def test_a_peer_cannot_load_weights_into_the_policy_server(tmp_path: Path) -> None:
    from orchard.recipes.models import save_policy, tiny_llama
    from orchard.recipes.policy_server.server import PolicyServer
    from orchard.rollout.tokenizer import TEST_TOKENIZER, load_tokenizer

    tok = load_tokenizer(TEST_TOKENIZER)
    decoy = save_policy(tiny_llama(tok, seed=7), tok, tmp_path / "attacker-weights")
    with PolicyServer(tiny_llama(tok), tok) as server:
        for headers in ({}, {"X-API-Key": "guess"}, {"Authorization": "Bearer orchard-proxy"}):
            r = httpx.post(f"{server.url}/v1/load_weights", json={"path": str(decoy)},
                           headers=headers, timeout=120)
            assert r.status_code in (401, 403), r.text
            assert re.search(r"admin key", r.json()["error"]["message"])
        assert server.weights_version == 0
