"""API keys: the HTTP routes, metrics, the SDK, the PTY websocket and `serve`'s refusal."""

from __future__ import annotations

import hmac
import inspect
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

import orchard.env.auth as auth_module
import orchard.env.server as server_module
from orchard.env.client import AuthenticationError, SandboxClient
from tests.conftest import create_ready, dedicated_orchestrator, needs_root, run

pytestmark = needs_root

KEYS = ["k1", "k2"]
ORCHARD = Path(sys.executable).with_name("orchard")


@pytest.fixture(scope="module")
def secured(orchestrator: str, data_dir: Path) -> Iterator[str]:
    with dedicated_orchestrator(data_dir, api_keys=KEYS) as url:
        yield url


@pytest.fixture(scope="module")
def sid(secured: str) -> Iterator[str]:
    with httpx.Client(base_url=secured, timeout=60, headers={"X-API-Key": "k1"}) as http:
        sid = create_ready(http, {"image": "host"})
        yield sid
        http.delete(f"/sandboxes/{sid}")


def _routes(sid: str) -> list[tuple[str, str, dict]]:
    return [
        ("GET", "/sandboxes", {}),
        ("GET", "/resources", {}),
        ("GET", "/metrics", {}),
        ("GET", f"/sandboxes/{sid}", {}),
        ("POST", f"/sandboxes/{sid}/exec", {"json": {"command": "true"}}),
        ("GET", f"/sandboxes/{sid}/files/list", {}),
        ("GET", f"/sandboxes/{sid}/processes", {}),
    ]


def test_missing_key_is_401_and_wrong_key_is_403(secured: str, sid: str) -> None:
    with httpx.Client(base_url=secured, timeout=30) as http:
        for method, path, kwargs in _routes(sid):
            r = http.request(method, path, **kwargs)
            assert r.status_code == 401, (path, r.text)
            assert "X-API-Key" in r.json()["detail"]
            for headers in ({"X-API-Key": "k3"}, {"X-API-Key": "k"}, {"X-API-Key": "K1"},
                            {"Authorization": "Bearer nope"}, {"X-API-Key": "k1k2"}):
                r = http.request(method, path, headers=headers, **kwargs)
                assert r.status_code == 403, (path, headers, r.text)
                assert r.json()["detail"] == "invalid API key"
        # Nothing ran or was created on the way.
        r = http.post("/sandboxes", json={"image": "host"}, headers={"X-API-Key": "bad"})
        assert r.status_code == 403
        listing = http.get("/sandboxes", headers={"X-API-Key": "k1"}).json()["sandboxes"]
        assert [sb["sandbox_id"] for sb in listing] == [sid]


@pytest.mark.parametrize("headers", [
    {"X-API-Key": "k1"}, {"X-API-Key": "k2"}, {"Authorization": "Bearer k2"},
    {"Authorization": "bearer k1"},
])
def test_either_key_works_in_either_header(secured: str, sid: str, headers: dict) -> None:
    with httpx.Client(base_url=secured, timeout=30, headers=headers) as http:
        for method, path, kwargs in _routes(sid):
            r = http.request(method, path, **kwargs)
            assert r.status_code == 200, (path, r.text)
        assert run(http, sid, command="echo ok")["stdout"] == "ok\n"


def test_health_and_banner_need_no_key(secured: str) -> None:
    with httpx.Client(base_url=secured, timeout=30) as http:
        health = http.get("/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"
        banner = http.get("/")
        assert banner.status_code == 200 and banner.json()["name"] == "orchard-env"


def test_with_keys_any_host_name_is_answered_and_the_key_still_decides(secured: str) -> None:
    """In a cluster the orchestrator is reached by its Service's DNS name (and probed by its
    pod IP): with keys the Host is not checked, since a rebinding page cannot know a key."""
    service = "orchard-orchestrator.orchard-system.svc.cluster.local:8000"
    with httpx.Client(base_url=secured, timeout=30, headers={"Host": service}) as http:
        assert http.get("/sandboxes", headers={"X-API-Key": "k1"}).status_code == 200
        r = http.get("/sandboxes")
        assert r.status_code == 401 and "X-API-Key" in r.json()["detail"], r.text
        # A browser origin is refused even with the key (none are allowed by default).
        r = http.get("/sandboxes", headers={"X-API-Key": "k1", "Origin": "http://evil.test"})
        assert r.status_code == 403 and "allowed_origins" in r.json()["detail"], r.text


def _exec_count(http: httpx.Client) -> float:
    r = http.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    total = 0.0
    names = set()
    for family in text_string_to_metric_families(r.text):
        names.add(family.name)
        for sample in family.samples:
            if sample.name == "orchard_execs_total" and sample.labels.get("outcome") == "ok":
                total += sample.value
    assert {"orchard_execs", "orchard_sandbox_creates", "orchard_admission_rejections",
            "orchard_sandboxes_live"} <= names, names
    return total


def test_metrics_need_a_key_and_count_execs(secured: str, sid: str) -> None:
    assert httpx.get(f"{secured}/metrics").status_code == 401
    assert httpx.get(f"{secured}/metrics", headers={"X-API-Key": "no"}).status_code == 403
    with httpx.Client(base_url=secured, timeout=30, headers={"X-API-Key": "k2"}) as http:
        before = _exec_count(http)
        run(http, sid, command="true")
        run(http, sid, argv=["true"])
        assert _exec_count(http) == before + 2
        text = http.get("/metrics").text
        assert "orchard_sandboxes_live 1.0" in text, text


def test_sdk_sends_the_key(secured: str) -> None:
    with (SandboxClient(secured, api_key="k2") as client,
          client.create_sandbox("host", labels={"who": "sdk"}) as sb):
        assert sb.exec("echo $((6*7))").stdout == "42\n"
        assert [s.sandbox_id for s in client.list_sandboxes({"who": "sdk"})] == [sb.id]
        with sb.pty("/bin/sh") as term:  # the websocket carries the key too
            term.send(b"echo pty-$((40+2)); exit 5\n")
            out = b""
            while chunk := term.recv(timeout=20):
                out += chunk
            assert b"pty-42" in out and term.exit_code == 5


@pytest.mark.parametrize(("key", "status"), [("wrong", 403), ("", 401)])
def test_sdk_with_a_bad_key_raises_authentication_error(secured: str, key: str,
                                                        status: int,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORCHARD_API_KEY", raising=False)
    with SandboxClient(secured, api_key=key) as client:
        for call in (client.list_sandboxes, client.resources,
                     lambda: client.create_sandbox("host")):
            with pytest.raises(AuthenticationError) as info:
                call()
            assert info.value.status_code == status
        assert client.health().status == "ok"  # no key needed there
    with httpx.Client(base_url=secured, headers={"X-API-Key": "k1"}) as http:
        assert http.get("/health").json()["sandboxes"] <= 1  # only the module's sandbox


def test_environment_configures_a_bare_client(secured: str, monkeypatch: pytest.MonkeyPatch,
                                              sid: str) -> None:
    monkeypatch.setenv("ORCHARD_URL", secured + "/")
    monkeypatch.setenv("ORCHARD_API_KEY", "k1")
    with SandboxClient() as client:
        assert client.base_url == secured
        assert sid in [s.sandbox_id for s in client.list_sandboxes()]
        assert client.get_sandbox(sid).exec(["echo", "env"]).stdout == "env\n"
    monkeypatch.setenv("ORCHARD_API_KEY", "k9")
    with SandboxClient() as client, pytest.raises(AuthenticationError):
        client.list_sandboxes()
    # An explicit argument beats the environment.
    with SandboxClient(api_key="k2") as client:
        assert sid in [s.sandbox_id for s in client.list_sandboxes()]


@pytest.mark.parametrize(("headers", "reason"), [
    ({"X-API-Key": "wrong"}, "invalid API key"),
    ({"Authorization": "Bearer wrong"}, "invalid API key"),
    ({}, "missing API key"),
])
def test_pty_websocket_refuses_a_bad_key(secured: str, sid: str, headers: dict,
                                         reason: str) -> None:
    url = f"{secured.replace('http://', 'ws://')}/sandboxes/{sid}/exec/pty?command=/bin/sh"
    with pytest.raises(ConnectionClosed) as info, connect(url, open_timeout=30,
                                                          additional_headers=headers) as ws:
        ws.send(b"echo leaked\n")
        ws.recv(timeout=10)  # no terminal output may come; the server closes
    assert info.value.rcvd is not None and info.value.rcvd.code == 1008, info.value
    assert reason in info.value.rcvd.reason
    # With a good key the same socket opens a shell.
    with connect(url, open_timeout=30, additional_headers={"X-API-Key": "k2"}) as ws:
        ws.send(b"echo ok-$((1+1))\n")
        out, deadline = b"", time.monotonic() + 20
        while b"ok-2" not in out and time.monotonic() < deadline:
            msg = ws.recv(timeout=20)
            out += msg if isinstance(msg, bytes) else b""
        assert b"ok-2" in out, out


def test_keys_are_compared_in_constant_time(secured: str, sid: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    source = inspect.getsource(auth_module.check_key)
    assert "hmac.compare_digest" in source, source
    assert not re.search(r"(given|key)\s*[!=]=|[!=]=\s*(given|key)\b", source), source
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth_module.hmac, "compare_digest", spy)
    with httpx.Client(base_url=secured, timeout=30) as http:
        for given, status in (("k1", 200), ("k2", 200), ("kx", 403)):
            calls.clear()
            r = http.get(f"/sandboxes/{sid}", headers={"X-API-Key": given})
            assert r.status_code == status
            # Every key is compared, even after a match: the time says nothing about which.
            assert sorted(b for _, b in calls) == [b"k1", b"k2"], calls
            assert {a for a, _ in calls} == {given.encode()}


def test_serve_refuses_a_public_host_without_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORCHARD_API_KEYS", raising=False)

    def must_not_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("serve() went on to build or bind the server")

    monkeypatch.setattr(server_module, "build_app", must_not_run)
    monkeypatch.setattr(server_module.uvicorn, "run", must_not_run)
    for host in ("0.0.0.0", "::", "192.0.2.7", "example.com"):
        with pytest.raises(SystemExit) as info:
            server_module.serve(host=host, port=0)
        message = str(info.value.code)
        assert "--api-key" in message and host in message, message
    # Loopback needs no key, and a key (argument or environment) lifts the refusal.
    for host, keys, env in (("127.0.0.1", None, ""), ("localhost", None, ""), ("::1", None, ""),
                            ("0.0.0.0", ["k"], ""), ("0.0.0.0", None, "k1,k2")):
        monkeypatch.setenv("ORCHARD_API_KEYS", env)
        with pytest.raises(AssertionError, match="went on"):
            server_module.serve(host=host, port=0, api_keys=keys)


def test_cli_serve_refuses_a_public_host_without_keys() -> None:
    env = {k: v for k, v in os.environ.items() if k != "ORCHARD_API_KEYS"}
    r = subprocess.run([str(ORCHARD), "serve", "--host", "0.0.0.0", "--port", "1"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "--api-key" in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("how", ["query", "subprotocol", "none", "wrong"])
def test_the_reference_pty_client_authenticates_by_query_or_subprotocol(
        secured: str, sid: str, how: str) -> None:
    """Its WebSocket client cannot set headers: the key comes as ?api_key= (what its SDK
    sends) or as an `api_key.<key>` subprotocol, which the server echoes back."""
    import base64
    import json

    url = f"{secured.replace('http://', 'ws://')}/sandboxes/{sid}/exec/pty"
    options: dict = {}
    if how == "query":
        url += "?api_key=k2"
    elif how == "subprotocol":
        options["subprotocols"] = ["api_key.k1"]
    elif how == "wrong":
        url += "?api_key=kx"
    with connect(url, open_timeout=30, **options) as ws:
        if how in ("none", "wrong"):  # refused before any frame of the client's is read
            first = json.loads(ws.recv(timeout=20))
            assert first["type"] == "error", first
            assert ("missing API key" if how == "none" else "invalid API key") in first["message"]
            return
        if how == "subprotocol":
            assert ws.subprotocol == "api_key.k1"
        ws.send(json.dumps({"type": "init", "cmd": ["echo", "in"], "rows": 24, "cols": 80}))
        first = json.loads(ws.recv(timeout=20))
        assert first["type"] == "ready", first
        out = b""
        while (frame := json.loads(ws.recv(timeout=20)))["type"] == "stdout":
            out += base64.b64decode(frame["data"])
        assert b"in" in out and frame == {"type": "exit", "code": 0}, (out, frame)
