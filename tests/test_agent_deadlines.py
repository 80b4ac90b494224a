"""An agent that accepts requests and never answers gives a clear 504, not a hang.

The agent is stopped with SIGSTOP: the kernel still accepts connections on its socket (the
listen backlog), so every request is delivered and none is answered.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import create_ready, dedicated_orchestrator, needs_root, run

pytestmark = [needs_root, pytest.mark.root]

AGENT_TIMEOUT = 2.0


@pytest.fixture()
def stopped_agent(data_dir: Path, orchestrator: str) -> Iterator[tuple[httpx.Client, str, int]]:
    del orchestrator  # only for the bundle
    # No reconcile pass during the test: it would see a hung agent and is not under test here.
    with dedicated_orchestrator(data_dir, agent_timeout=AGENT_TIMEOUT,
                                reconcile_interval=600) as url, \
            httpx.Client(base_url=url, timeout=60) as http:
        sid = create_ready(http, {"image": "host"})
        assert run(http, sid, command="true")["exit_code"] == 0  # a pooled connection, too
        pid = _agent_pid(url, sid)
        os.kill(pid, signal.SIGSTOP)
        try:
            yield http, sid, pid
        finally:
            os.kill(pid, signal.SIGCONT)


def _agent_pid(url: str, sid: str) -> int:
    """The agent's host pid, from the process list of its sandbox's cgroup."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            cgroup = (proc / "cgroup").read_text()
        except OSError:
            continue
        if b"zygote.py" in cmdline and f"/{sid}\n" in cgroup:
            return int(proc.name)
    raise AssertionError(f"no agent process found for {sid} ({url})")


def test_a_hung_agent_gives_504_on_every_kind_of_call(
        stopped_agent: tuple[httpx.Client, str, int]) -> None:
    http, sid, _ = stopped_agent
    calls = [
        ("GET", f"/sandboxes/{sid}/files/list", {"params": {"path": "/"}}, AGENT_TIMEOUT),
        ("GET", f"/sandboxes/{sid}/files", {"params": {"path": "/etc/hostname"}},
         AGENT_TIMEOUT),
        ("GET", f"/sandboxes/{sid}/processes", {}, AGENT_TIMEOUT),
        # An exec may take its own timeout; only past that plus the slack is it hung.
        ("POST", f"/sandboxes/{sid}/exec", {"json": {"command": "true", "timeout_seconds": 1}},
         1 + AGENT_TIMEOUT),
    ]
    for method, path, kw, expected in calls:
        t0 = time.monotonic()
        r = http.request(method, path, **kw)
        took = time.monotonic() - t0
        assert r.status_code == 504, (path, r.status_code, r.text)
        detail = r.json()["detail"]
        assert f"did not answer within {expected:g}s" in detail, detail
        assert "retry, or delete and recreate it" in detail, detail
        assert expected - 0.1 <= took < expected + 10, (path, took)


def test_the_sandbox_answers_again_once_its_agent_runs(
        stopped_agent: tuple[httpx.Client, str, int]) -> None:
    http, sid, pid = stopped_agent
    r = http.post(f"/sandboxes/{sid}/exec", json={"command": "echo late", "timeout_seconds": 1})
    assert r.status_code == 504, r.text
    os.kill(pid, signal.SIGCONT)
    assert run(http, sid, command="echo back", timeout_seconds=5)["stdout"] == "back\n"


def test_a_blocking_exec_past_its_wait_margin_answers_with_the_job_to_follow(
        data_dir: Path, orchestrator: str) -> None:
    """The reference system's contract: a blocking exec answers by its timeout plus a margin;
    a job still running then comes back as {job_id, status} and is followed with GET /jobs."""
    del orchestrator
    with dedicated_orchestrator(data_dir, agent_timeout=30, exec_wait_margin=1,
                                reconcile_interval=600) as url, \
            httpx.Client(base_url=url, timeout=60) as http:
        sid = create_ready(http, {"image": "host"})
        pid = _agent_pid(url, sid)
        os.kill(pid, signal.SIGSTOP)
        try:
            r = http.post(f"/sandboxes/{sid}/exec",
                          json={"command": "echo done", "timeout_seconds": 1})
        finally:
            os.kill(pid, signal.SIGCONT)
        assert r.status_code == 200, r.text
        accepted = r.json()
        assert set(accepted) == {"job_id", "status"} and accepted["status"] == "running"
        job = http.get(f"/jobs/{accepted['job_id']}/wait", params={"timeout": 30}).json()
        assert (job["status"], job["stdout"]) == ("succeeded", "done\n"), job
