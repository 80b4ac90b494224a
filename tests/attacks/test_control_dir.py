"""Attacks on what the host keeps for a local sandbox: its control dir, its agent's socket,
its snapshots and the data dir (findings 1, 4, 6 and 11 of issue 29).

Each test does, from inside a sandbox, what the reviewer did by hand, then checks that the
host did not follow: a redirected agent socket must not make the orchestrator act on another
sandbox, and what a snapshot keeps must not become a set-id file of the host's.
"""

from __future__ import annotations

import ctypes
import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from orchard.env.server import EmbeddedOrchestrator
from tests.conftest import create_ready, needs_root, run, short_data_dir, wait_until

pytestmark = [needs_root, pytest.mark.root]

# Finds the agent (the zygote's forked child: its command line is the zygote's) and kills it.
# The agent is the sandbox's pid 1, which the kernel shields from its own sandbox's SIGKILL,
# so the test also kills it from the host: the dead agent is what the attack needs.
KILL_AGENT = ("for p in /proc/[0-9]*; do grep -qa zygote.py $p/cmdline 2>/dev/null "
              "&& kill -9 ${p#/proc/}; done")


def _sdir(data_dir: Path, sid: str) -> Path:
    return data_dir / "local" / "sandboxes" / sid


def test_a_replaced_agent_socket_does_not_redirect_the_orchestrator(
        orchestrator: str, data_dir: Path) -> None:
    """Sandbox A points its agent socket at B's and kills its own agent: the next exec on A
    must not run in B (it did: it printed B's hostname and files). The reconcile pass would
    notice the dead agent and fail A; a long interval keeps the window open, as it is
    between two passes of any orchestrator."""
    with short_data_dir(data_dir) as short, EmbeddedOrchestrator(
            data_dir=short, reconcile_interval=60) as url, \
            httpx.Client(base_url=url, timeout=60) as http:
        _redirect_attack(http, short)


def _redirect_attack(http: httpx.Client, data_dir: Path) -> None:
    a = create_ready(http, {"image": "host"})
    b = create_ready(http, {"image": "host"})
    try:
        assert run(http, b, command="echo b-secret > /tmp/mine")["exit_code"] == 0
        target = _sdir(data_dir, b) / "ctl" / "agent.sock"
        # Detached, so that the exec that plants the link still gets its answer.
        attack = (f"rm -f /.orchard/ctl/agent.sock; ln -s {target} /.orchard/ctl/agent.sock; "
                  f"setsid sh -c 'sleep 0.5; {KILL_AGENT}' >/dev/null 2>&1 &")
        run(http, a, command=attack)
        time.sleep(1)
        os.kill(int((_sdir(data_dir, a) / "agent.pid").read_text()), signal.SIGKILL)
        # The first call after the kill may fail on a pooled connection; a fresh connection
        # is where a followed link would lead to B, so keep asking for a while.
        answers = []

        def unreachable_for_good() -> bool:
            r = http.post(f"/sandboxes/{a}/exec", json={"command": "hostname; cat /tmp/mine"})
            assert "b-secret" not in r.text and b not in r.text, f"ran in B: {r.text}"
            assert r.status_code == 409 or a in r.text, r.text  # A's own answer, or unreachable
            answers.append(r.status_code)
            return answers.count(409) >= 5

        assert wait_until(unreachable_for_good, 20, 0.2), answers
        # B was never touched.
        assert run(http, b, command="cat /tmp/mine")["stdout"] == "b-secret\n"
    finally:
        http.delete(f"/sandboxes/{a}")
        http.delete(f"/sandboxes/{b}")


def test_the_control_dir_is_read_only_inside_and_root_owned_outside(
        http: httpx.Client, data_dir: Path, sandbox: str) -> None:
    """Nothing under ctl can be replaced from inside: not the agent's socket, not the model
    relay's, and no new entry can be planted there."""
    for attempt in ("rm /.orchard/ctl/agent.sock", "touch /.orchard/ctl/planted",
                    "ln -s / /.orchard/ctl/model.sock", "mv /.orchard/ctl /.orchard/x"):
        out = run(http, sandbox, command=attempt)
        assert out["exit_code"] != 0, (attempt, out)
    ctl = _sdir(data_dir, sandbox) / "ctl"
    assert sorted(p.name for p in ctl.iterdir()) == ["agent.sock"]
    st = ctl.stat()
    assert (st.st_uid, st.st_gid) == (0, 0) and not st.st_mode & 0o022, oct(st.st_mode)
    sock = (ctl / "agent.sock").lstat()
    assert stat.S_ISSOCK(sock.st_mode) and sock.st_uid == 0
    # Only host root may connect to the agent: sandbox code cannot talk to it directly.
    assert stat.S_IMODE(sock.st_mode) & 0o077 == 0, oct(sock.st_mode)


def test_the_agent_refuses_a_request_without_its_sandbox_token(
        http: httpx.Client, data_dir: Path, sandbox: str) -> None:
    """Each local agent wants its own sandbox's token, so a connection that lands at another
    sandbox's agent is refused rather than obeyed."""
    sock = _sdir(data_dir, sandbox) / "ctl" / "agent.sock"
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), timeout=10) as agent:
        r = agent.post("http://agent/exec", json={"command": "true"})
        assert r.status_code == 401, r.text
        r = agent.post("http://agent/exec", json={"command": "true"},
                       headers={"X-Agent-Token": "not-its-token"})
        assert r.status_code == 401, r.text
    assert run(http, sandbox, command="true")["exit_code"] == 0  # the orchestrator's works


def test_a_snapshot_keeps_no_set_id_file_and_the_data_dir_is_private(
        http: httpx.Client, data_dir: Path, sandbox: str) -> None:
    """A set-uid file made as sandbox root must not become a set-uid root file on the host,
    and a local user must not reach what the orchestrator keeps."""
    made = run(http, sandbox, command="cp /bin/sh /tmp/rootsh && chmod 6755 /tmp/rootsh "
                                      "&& stat -c %a /tmp/rootsh")
    assert made["stdout"].strip() == "6755", made
    r = http.post(f"/sandboxes/{sandbox}/snapshot", json={})
    assert r.status_code == 200, r.text
    snap = r.json()["snapshot_id"]
    try:
        layer_file = data_dir / "local" / "snapshots" / snap / "layer" / "tmp" / "rootsh"
        st = layer_file.lstat()
        assert st.st_uid == 0  # in-sandbox root, as in an image
        assert not st.st_mode & (stat.S_ISUID | stat.S_ISGID), oct(st.st_mode)
        for private in (data_dir, data_dir / "local", data_dir / "local" / "snapshots",
                        data_dir / "local" / "sandboxes"):
            mode = stat.S_IMODE(private.stat().st_mode)
            assert mode & 0o077 == 0, (private, oct(mode))
        state = data_dir / "state.db"
        assert stat.S_IMODE(state.stat().st_mode) & 0o077 == 0, oct(state.stat().st_mode)
        # An unprivileged local user cannot even reach the layer.
        probe = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534",
                                "--clear-groups", "stat", str(layer_file)],
                               capture_output=True, text=True)
        assert probe.returncode != 0 and "Permission denied" in probe.stderr, probe
        # Inside a fork the file is there, just without the set-id bits.
        r = http.post("/sandboxes", json={"from_snapshot": snap})
        assert r.status_code == 200, r.text
        fork = r.json()["sandbox_id"]
        assert http.get(f"/sandboxes/{fork}/wait", params={"timeout": 60}).status_code == 200
        out = run(http, fork, command="stat -c %a /tmp/rootsh")
        assert out["stdout"].strip() == "755", out
        http.delete(f"/sandboxes/{fork}")
    finally:
        http.delete(f"/snapshots/{snap}")


def test_io_uring_is_refused_by_default(http: httpx.Client, sandbox: str) -> None:
    """io_uring bypasses seccomp's view of each operation; the filter refuses its set-up."""
    probe = ("python3 -c \"import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
             "p = ctypes.create_string_buffer(120); "
             "r = libc.syscall(425, 4, p); print(r, ctypes.get_errno())\"")
    out = run(http, sandbox, command=probe)
    assert out["exit_code"] == 0, out
    result, errno = out["stdout"].split()
    assert (int(result), int(errno)) == (-1, 1), out  # EPERM, not a ring
    # The control: outside a sandbox this kernel gives a ring, so EPERM is the filter's.
    libc = ctypes.CDLL(None, use_errno=True)
    ring = libc.syscall(425, 4, ctypes.create_string_buffer(120))
    assert ring >= 0, f"io_uring is off on this host (errno {ctypes.get_errno()})"
    os.close(ring)
