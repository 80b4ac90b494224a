"""Requests to a sandbox's own services (POST /sandboxes/{id}/http): through the agent, on the
sandbox's loopback, recorded as events and replayed."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import httpx
import pytest

from orchard.env.client import (
    AsyncSandboxClient,
    AsyncSandboxServiceTransport,
    OrchardError,
    Sandbox,
    SandboxClient,
    SandboxServiceTransport,
)
from orchard.rollout.traces.replay import replay
from orchard.rollout.traces.trace import build_trace
from tests.conftest import needs_root

pytestmark = needs_root

# A counter service: GET /count reads it, POST /add adds the JSON body's n, 404 otherwise.
SERVICE = """
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
count = 0
class H(BaseHTTPRequestHandler):
    def _send(self, status, payload, kind="application/json"):
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        if self.path == "/count":
            self._send(200, {"count": count})
        elif self.path == "/bytes":
            self._send(200, bytes(range(256)), "application/octet-stream")
        else:
            self._send(404, {"error": "no " + self.path})
    def do_POST(self):
        global count
        n = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["n"]
        count += n
        self._send(200, {"count": count, "seen": self.headers.get("X-Seen")})
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


@pytest.fixture(scope="module")
def client(orchestrator: str) -> Iterator[SandboxClient]:
    with SandboxClient(orchestrator) as c:
        yield c


def serve(sb: Sandbox, port: int = 8300) -> None:
    sb.upload_content(SERVICE.encode(), "/workspace/service.py")
    sb.start_process(f"python3 /workspace/service.py {port}")
    # One exec that waits inside: a replay sees it succeed once.
    waited = sb.exec("python3 -c \"import time, urllib.request as u\n"
                     "for _ in range(200):\n"
                     f"    try: u.urlopen('http://127.0.0.1:{port}/count'); break\n"
                     "    except OSError: time.sleep(0.05)\"")
    assert waited.ok, waited.stderr


def test_requests_reach_the_service_and_are_events_that_replay(client: SandboxClient) -> None:
    session = f"svc-{uuid.uuid4().hex[:8]}"
    with client.create_sandbox(session=session) as sb:
        serve(sb)
        assert sb.http(8300, "/count").json() == {"count": 0}
        added = sb.http(8300, "/add", "POST", json={"n": 5}, headers={"X-Seen": "yes"})
        assert added.status == 200 and added.json() == {"count": 5, "seen": "yes"}
        missing = sb.http(8300, "/nope")
        assert missing.status == 404 and missing.json() == {"error": "no /nope"}
        raw = sb.http(8300, "/bytes")
        assert raw.encoding == "base64" and len(raw.body) == 344
        events = client.events(session=session)
    calls = [e for e in events if e.kind.value == "http"]
    assert [(e.data["method"], e.data["path"], e.data["status"]) for e in calls] == [
        ("GET", "/count", 200), ("POST", "/add", 200), ("GET", "/nope", 404),
        ("GET", "/bytes", 200)]
    report = replay(build_trace(session, [], events), client)
    assert report.diverged == 0 and report.skipped == 0, [
        (s.kind.value, s.detail) for s in report.steps if s.status != "matched"]
    assert sum(s.kind.value == "http" for s in report.steps) == 4


def test_bad_requests_say_what_is_wrong(client: SandboxClient) -> None:
    with client.create_sandbox() as sb:
        with pytest.raises(OrchardError, match="nothing listens on port 8399"):
            sb.http(8399, "/")
        # The SDK checks what the server would refuse before sending it.
        with pytest.raises(ValueError, match="port"):
            sb.http(0, "/")
        with pytest.raises(ValueError, match="path"):
            sb.http(8300, "no-slash")
        r = httpx.post(f"{client.base_url}/sandboxes/{sb.id}/http",
                       json={"port": 8300, "method": "BREW"},
                       headers={"Authorization": f"Bearer {client.api_key}"}
                       if client.api_key else {})
        assert r.status_code == 422 and "method" in r.text
        sb.start_process("python3 -c \"import socket, time; s = socket.socket(); "
                         "s.bind(('127.0.0.1', 8301)); s.listen(); time.sleep(60)\"")
        sb.exec("sleep 0.5")
        with pytest.raises(OrchardError, match="did not answer within 1"):
            sb.http(8301, "/", timeout=1)
    with pytest.raises(OrchardError):
        client.get_sandbox(sb.id).http(8300, "/")  # a deleted sandbox


def test_httpx_clients_reach_the_service_through_the_transports(
        client: SandboxClient, orchestrator: str) -> None:
    with client.create_sandbox() as sb:
        serve(sb, 8302)
        with httpx.Client(transport=SandboxServiceTransport(sb),
                          base_url="http://sandbox:8302") as http:
            assert http.post("/add", json={"n": 2}).json()["count"] == 2
            assert http.get("/bytes").content == bytes(range(256))
            assert http.get("/nope").status_code == 404
            with pytest.raises(httpx.UnsupportedProtocol, match="names no port"):
                http.get("http://sandbox/count")

        async def twice() -> list[int]:
            async with AsyncSandboxClient(orchestrator, api_key=client.api_key) as aclient:
                asb = await aclient.get_sandbox(sb.id)
                async with httpx.AsyncClient(transport=AsyncSandboxServiceTransport(asb),
                                             base_url="http://sandbox:8302") as http:
                    first = await http.post("/add", json={"n": 3})
                    second = await http.get("/count")
                    return [first.json()["count"], second.json()["count"]]

        assert asyncio.run(twice()) == [5, 5]
