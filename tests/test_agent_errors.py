"""Every sandbox route answers an agent's failure the same way: one translation, one owner.

Exec goes through the service and files, patches and processes through SandboxOps; both hand
agent errors to errors.from_agent, so a client sees the same status and message shape from
either kind of route.
"""

from __future__ import annotations

import base64
import glob
import os
import signal
from pathlib import Path

import httpx
import pytest

from tests.conftest import create_ready, dedicated_orchestrator, needs_root, run, wait_until

pytestmark = [needs_root, pytest.mark.root]


def test_a_missing_path_is_404_on_every_file_route(http: httpx.Client, sandbox: str) -> None:
    answers = [http.get(f"/sandboxes/{sandbox}/files", params={"path": "/nope"}),
               http.get(f"/sandboxes/{sandbox}/files/raw", params={"path": "/nope"}),
               http.get(f"/sandboxes/{sandbox}/files/list", params={"path": "/nope"}),
               http.delete(f"/sandboxes/{sandbox}/files", params={"path": "/nope"})]
    assert [r.status_code for r in answers] == [404] * 4, [r.text for r in answers]
    assert all("/nope" in r.json()["detail"] for r in answers)


def test_a_dead_agent_reads_alike_on_exec_files_and_processes(data_dir: Path,
                                                              orchestrator: str) -> None:
    del orchestrator  # needed only for the bundle it built
    # No reconcile pass during the test: one would mark the sandbox failed between requests.
    with dedicated_orchestrator(data_dir, reconcile_interval=3600) as url, \
            httpx.Client(base_url=url, timeout=60) as http:
        sid = create_ready(http, {"image": "host"})
        home = Path(glob.glob(f"/tmp/orc-*/local/sandboxes/{sid}")[0])
        pid = int((home / "agent.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda: not Path(f"/proc/{pid}").exists(), 10)
        answers = {
            "exec": http.post(f"/sandboxes/{sid}/exec", json={"command": "true"}),
            "files": http.get(f"/sandboxes/{sid}/files/list"),
            "write": http.post(f"/sandboxes/{sid}/files", json={"path": "/tmp/x",
                                                                "content": ""}),
            "processes": http.get(f"/sandboxes/{sid}/processes"),
        }
        statuses = {name: r.status_code for name, r in answers.items()}
        assert set(statuses.values()) == {409}, {n: r.text for n, r in answers.items()}
        details = {r.json()["detail"] for r in answers.values()}
        assert len(details) == 1 and "not reachable" in details.pop()
        assert http.delete(f"/sandboxes/{sid}").status_code == 200


def test_file_changes_are_events(http: httpx.Client, sandbox: str) -> None:
    data = base64.b64encode(b"hello").decode()
    assert http.post(f"/sandboxes/{sandbox}/files",
                     json={"path": "/tmp/a.txt", "content": data}).status_code == 200
    assert http.put(f"/sandboxes/{sandbox}/files/raw", params={"path": "/tmp/b.bin"},
                    content=b"\0" * 10).status_code == 200
    assert http.post(f"/sandboxes/{sandbox}/files/mkdir",
                     json={"path": "/tmp/d"}).status_code == 200
    assert run(http, sandbox, command="cat /tmp/a.txt")["stdout"] == "hello"
    events = http.get(f"/sandboxes/{sandbox}/events").json()["events"]
    kinds = [(e["kind"], e["data"].get("path")) for e in events]
    assert ("file_write", "/tmp/a.txt") in kinds and ("file_write", "/tmp/b.bin") in kinds
    assert ("mkdir", "/tmp/d") in kinds
    write = next(e for e in events if e["data"].get("path") == "/tmp/b.bin")
    assert write["data"]["size"] == 10 and write["data"]["content_b64"] == base64.b64encode(
        b"\0" * 10).decode()
