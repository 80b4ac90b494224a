"""Attacks on the orchestrator's API from a web page (issue 29, finding 8).

An orchestrator with no API key listens on loopback, where any page open in a browser on the
same machine can send it requests. Two ways a page gets further than sending: DNS rebinding
(the page's own host name, attacker.example, is re-pointed at 127.0.0.1, so the browser lets
it read the answers: it calls the API as its own origin, with ``Host: attacker.example``), and
a WebSocket, which browsers open to any address whatever the page's origin (the handshake
carries ``Origin: http://evil.test``). Each test sends exactly what the browser would send,
over real HTTP to a real orchestrator; the last checks that the SDK on this machine, which
sends no Origin, is unaffected.
"""

from __future__ import annotations

import json
import uuid
from urllib.parse import urlsplit

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from orchard.env.client import SandboxClient
from tests.conftest import needs_root, run

pytestmark = [needs_root, pytest.mark.root]


def _port(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None
    return port


def test_a_dns_rebinding_page_cannot_create_or_list_sandboxes(http: httpx.Client,
                                                              orchestrator: str) -> None:
    page = f"attacker.example:{_port(orchestrator)}"
    tag = uuid.uuid4().hex
    # The page's fetch("/sandboxes", {method: "POST", ...}) after the rebinding: same-origin
    # to the browser, so it may read the answer.
    r = http.post("/sandboxes", json={"image": "host", "labels": {"attack": tag}},
                  headers={"Host": page, "Origin": f"http://{page}"})
    assert r.status_code == 403, r.text
    assert "allowed_hosts" in r.json()["detail"], r.text
    # A plain GET carries no Origin at all: the Host alone must stop it.
    r = http.get("/sandboxes", headers={"Host": page})
    assert r.status_code == 403, r.text
    assert "sandboxes" not in r.text
    # Nothing was created on the way.
    listed = http.get("/sandboxes", params={"label": f"attack={tag}"})
    assert listed.status_code == 200, listed.text
    assert listed.json()["sandboxes"] == [], listed.text


def test_a_cross_site_websocket_cannot_open_a_terminal(http: httpx.Client, orchestrator: str,
                                                       sandbox: str) -> None:
    """The page at evil.test opens ws://127.0.0.1:PORT/.../exec/pty: refused at the handshake,
    before any PTY starts (its command would leave a mark in the sandbox)."""
    marker = f"/tmp/pty-ran-{uuid.uuid4().hex}"
    url = (f"{orchestrator.replace('http://', 'ws://')}/sandboxes/{sandbox}/exec/pty"
           f"?command=touch%20{marker}")
    with pytest.raises(InvalidStatus) as refused, connect(url, origin="http://evil.test",
                                                          open_timeout=30) as ws:
        ws.send(b"touch " + marker.encode() + b"\n")
    response = refused.value.response
    assert response.status_code == 403, response
    assert "allowed_origins" in json.loads(response.body)["detail"], response.body
    # The reference framing (no command: an init frame names it) is refused the same way.
    reference = f"{orchestrator.replace('http://', 'ws://')}/sandboxes/{sandbox}/exec/pty"
    with pytest.raises(InvalidStatus) as refused, connect(reference, origin="http://evil.test",
                                                          open_timeout=30) as ws:
        ws.send(json.dumps({"type": "init", "cmd": ["touch", marker]}))
    assert refused.value.response.status_code == 403
    assert run(http, sandbox, command=f"test -e {marker}")["exit_code"] == 1


def test_the_sdk_on_this_machine_still_works(orchestrator: str) -> None:
    with (SandboxClient(orchestrator) as client,
          client.create_sandbox("host") as sb):
        assert sb.exec("echo $((6*7))").stdout == "42\n"
        with sb.pty("/bin/sh") as term:
            term.send(b"echo pty-$((40+2)); exit 3\n")
            out = b""
            while chunk := term.recv(timeout=20):
                out += chunk
            assert b"pty-42" in out and term.exit_code == 3
    # Every loopback name a local client may use, on any port.
    for host in (f"localhost:{_port(orchestrator)}", f"[::1]:{_port(orchestrator)}",
                 "127.0.0.1"):
        r = httpx.get(f"{orchestrator}/sandboxes", headers={"Host": host}, timeout=30)
        assert r.status_code == 200, (host, r.text)
