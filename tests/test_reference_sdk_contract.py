"""The reference system's SDK (``orchard_env`` in microsoft/Orchard) against our orchestrator.

Each test replays, request by request, what one of its public methods sends (method, path,
query, JSON body, headers; read from its source, nothing of it copied here) and asserts the
fields that method then reads, with the types it reads them as. docs/api.md#reference-sdk
lists the mapping.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.sync.client import connect

from tests.conftest import needs_root, wait_until

pytestmark = [needs_root, pytest.mark.root]

# What its exec sends when cwd/env/timeout are not given: explicit nulls.
EXEC_DEFAULTS = {"timeout_seconds": None, "cwd": None, "env": None, "login_shell": False}


@pytest.fixture()
def ref(orchestrator: str) -> Iterator[httpx.Client]:
    # requests.Session with the SDK's header; no API key on the test orchestrator.
    with httpx.Client(base_url=orchestrator, timeout=120,
                      headers={"User-Agent": "python-requests/2.32"}) as http:
        yield http


def _create(http: httpx.Client, **extra: object) -> dict:
    """create_sandbox(image, block_network=True, ..., wait_ready=True): POST, then /wait."""
    body = {"image": "host", "block_network": True, **extra}
    r = http.post("/sandboxes", json=body)
    assert r.status_code == 200, r.text
    created = r.json()
    sid = created["sandbox_id"]
    server_timeout = created.get("timeout", extra.get("timeout") or 3600)
    w = http.get(f"/sandboxes/{sid}/wait", params={"timeout": server_timeout})
    assert w.status_code == 200, w.text
    info = w.json()
    # It accepts `ready` or status "ready"; ours says ready: true (status stays "running").
    assert info.get("ready") is True or info.get("status") == "ready", info
    # SandboxInstance reads these (absent is allowed: .get).
    for key in ("namespace", "image", "block_network"):
        assert key in info, key
    return info


def _exec(http: httpx.Client, sid: str, command: object, **options: object) -> dict:
    """SandboxInstance.exec: POST with wait=true; a finished job is used as it is."""
    r = http.post(f"/sandboxes/{sid}/exec",
                  json={"command": command, **EXEC_DEFAULTS, **options, "wait": True})
    assert r.status_code == 200, r.text
    job = r.json()
    assert job["status"] in ("succeeded", "failed"), job
    # JobResult(data): required keys, then .get()s.
    for key in ("job_id", "sandbox_id", "command", "status", "created_at"):
        assert key in job, key
    assert isinstance(job["stdout"], str) and isinstance(job["stderr"], str)
    assert job["exit_code"] is None or isinstance(job["exit_code"], int)
    return job


def test_create_wait_get_and_its_prefixed_id(ref: httpx.Client) -> None:
    sid = f"ref-{uuid.uuid4().hex[:8]}"  # its prefix option: "<prefix>-<8 hex>"
    info = _create(ref, sandbox_id=sid, cpu="1", memory="512Mi", timeout=120)
    assert info["sandbox_id"] == sid and info["image"] == "host" and info["block_network"]
    # create_sandbox(timeout=N) is how long it may take to start, not how long it lives.
    r = ref.get(f"/sandboxes/{sid}")
    assert r.status_code == 200 and r.json()["ready"] is True
    assert r.json()["expires_at"] > r.json()["ready_deadline"]
    # Its wait asks for its whole deadline at once: an hour and more is cut, not refused.
    assert ref.get(f"/sandboxes/{sid}/wait", params={"timeout": 7200}).status_code == 200
    assert ref.delete(f"/sandboxes/{sid}").status_code == 200


def test_exec_forms_it_sends(ref: httpx.Client) -> None:
    sid = _create(ref)["sandbox_id"]
    try:
        job = _exec(ref, sid, "echo out; echo err >&2; exit 3")
        assert (job["stdout"], job["stderr"], job["exit_code"], job["status"]) == (
            "out\n", "err\n", 3, "failed")
        # A list goes as `command` too; the reference joins it under the shell.
        job = _exec(ref, sid, ["echo", "a", "b"], cwd="/tmp", env={"X": "1"})
        assert job["stdout"] == "a b\n" and job["status"] == "succeeded"
        job = _exec(ref, sid, "echo $X $PWD", cwd="/tmp", env={"X": "1"}, login_shell=True)
        assert job["stdout"] == "1 /tmp\n"
        job = _exec(ref, sid, "sleep 10", timeout_seconds=1)
        assert job["exit_code"] == 124 and job["status"] == "failed"
        # Its fallback submission leaves `wait` out and reads job_id, then polls GET /jobs.
        r = ref.post(f"/sandboxes/{sid}/exec", json={"command": "echo polled", **EXEC_DEFAULTS})
        assert r.status_code == 200, r.text
        job_id = r.json()["job_id"]
        polled = ref.get(f"/jobs/{job_id}").json()
        assert polled["status"] in ("succeeded", "failed") and polled["stdout"] == "polled\n"
    finally:
        ref.delete(f"/sandboxes/{sid}")


def test_files_patch_heartbeat_health(ref: httpx.Client) -> None:
    sid = _create(ref)["sandbox_id"]
    try:
        content = base64.b64encode(b"hello\n").decode()
        r = ref.post(f"/sandboxes/{sid}/files",
                     json={"path": "/workspace/hello.txt", "content": content})
        assert r.status_code == 200, r.text
        r = ref.get(f"/sandboxes/{sid}/files", params={"path": "/workspace/hello.txt"})
        assert base64.b64decode(r.json()["content"]) == b"hello\n"
        files = ref.get(f"/sandboxes/{sid}/files/list", params={"path": "/workspace"}).json()
        entry = {f["name"]: f for f in files["files"]}["hello.txt"]
        assert entry["type"] == "file" and entry["size"] == 6 and "modified" in entry
        patch = ("--- a/hello.txt\n+++ b/hello.txt\n@@ -1 +1 @@\n-hello\n+patched\n")
        r = ref.post(f"/sandboxes/{sid}/apply_patch", json={"patch": patch,
                                                             "timeout_seconds": 30})
        assert r.status_code == 200 and r.json()["success"] is True, r.text
        r = ref.post(f"/sandboxes/{sid}/heartbeat")
        assert r.status_code == 200
        assert ref.get("/health").json()["status"] in ("ok", "healthy")
    finally:
        ref.delete(f"/sandboxes/{sid}")


def test_delete_is_idempotent_as_its_delete_and_exit_expect(ref: httpx.Client) -> None:
    sid = _create(ref)["sandbox_id"]
    # SandboxInstance.delete() raises on any error status: twice must be fine, as must a
    # sandbox the server already reaped.
    for _ in range(2):
        assert ref.delete(f"/sandboxes/{sid}").status_code == 200
    assert ref.delete(f"/sandboxes/ref-{uuid.uuid4().hex[:8]}").status_code == 200


def test_a_failed_sandbox_is_reported_by_wait(ref: httpx.Client, data_dir: Path) -> None:
    # In the image directory, so it is accepted, and fails only when the launch looks for it.
    missing = data_dir / "images" / "no-such-image"
    r = ref.post("/sandboxes", json={"image": str(missing), "block_network": True})
    assert r.status_code == 200, r.text
    sid = r.json()["sandbox_id"]
    w = ref.get(f"/sandboxes/{sid}/wait", params={"timeout": 60})
    # It raises RuntimeError(f"... failed: {status_message}") on status "failed".
    assert w.status_code == 200, w.text
    assert w.json()["status"] == "failed" and w.json()["ready"] is False
    assert str(missing) in w.json()["status_message"]
    ref.delete(f"/sandboxes/{sid}")


def test_exec_right_after_a_create_that_did_not_wait(ref: httpx.Client) -> None:
    r = ref.post("/sandboxes", json={"image": "host", "block_network": True})
    sid = r.json()["sandbox_id"]
    try:
        assert _exec(ref, sid, "echo early")["stdout"] == "early\n"
    finally:
        ref.delete(f"/sandboxes/{sid}")


def test_pty_with_its_json_framing(orchestrator: str, ref: httpx.Client) -> None:
    sid = _create(ref)["sandbox_id"]
    url = f"{orchestrator.replace('http://', 'ws://')}/sandboxes/{sid}/exec/pty"
    try:
        with connect(url, open_timeout=30) as ws:
            ws.send(json.dumps({"type": "init", "cmd": ["bash", "-c", "read x; echo got-$x; "
                                                                      "exit 4"],
                                "env": {"A": "1"}, "cwd": "/tmp", "rows": 24, "cols": 80,
                                "login_shell": False}))
            ready = json.loads(ws.recv(timeout=20))
            assert ready["type"] == "ready" and isinstance(ready["pid"], int), ready
            ws.send(json.dumps({"type": "stdin", "data": base64.b64encode(b"x1\n").decode()}))
            out, end = b"", None
            while end is None:
                frame = json.loads(ws.recv(timeout=20))
                if frame["type"] == "stdout":
                    out += base64.b64decode(frame["data"])
                else:
                    end = frame
            assert b"got-x1" in out and end == {"type": "exit", "code": 4}, (out, end)
        # Its kill() sends a signal frame; TERM ends the process (exit 128 + 15).
        with connect(url, open_timeout=30) as ws:
            ws.send(json.dumps({"type": "init", "cmd": ["sleep", "100"], "rows": 24,
                                "cols": 80}))
            assert json.loads(ws.recv(timeout=20))["type"] == "ready"
            ws.send(json.dumps({"type": "signal", "sig": "TERM"}))
            frames = [json.loads(ws.recv(timeout=20))]
            while frames[-1]["type"] == "stdout":
                frames.append(json.loads(ws.recv(timeout=20)))
            assert frames[-1] == {"type": "exit", "code": 143}, frames
        # An unknown sandbox answers with an error frame.
        bad = f"{orchestrator.replace('http://', 'ws://')}/sandboxes/nope/exec/pty"
        with connect(bad, open_timeout=30) as ws:
            frame = json.loads(ws.recv(timeout=20))
            assert frame["type"] == "error" and "nope" in frame["message"], frame
    finally:
        ref.delete(f"/sandboxes/{sid}")
        assert wait_until(lambda: ref.get(f"/sandboxes/{sid}").json()["status"] == "deleted")
