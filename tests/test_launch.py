"""The one-step launch (issue 32): a sandbox is made by syscalls from the zygote, with no
program exec'd on the way, and it is one process until it runs something."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from orchard.env.server import EmbeddedOrchestrator
from tests.conftest import create_ready, needs_root, run, short_data_dir, wait_until

pytestmark = [needs_root, pytest.mark.root]


def _zygote(data_dir: Path) -> int:
    """The pid of the zygote serving ``data_dir``."""
    sock = str(data_dir / "local" / "zygote.sock").encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(arg.endswith(b"zygote.py") for arg in cmdline) and sock in cmdline:
                return int(entry.name)
    raise AssertionError(f"no zygote for {data_dir}")


def _execs(pid: int, trace: Path, action) -> list[str]:
    """The execve calls of ``pid`` and all it forks while ``action`` runs (strace -f)."""
    strace = subprocess.Popen(
        ["strace", "-f", "-qq", "-e", "trace=execve,execveat", "-o", str(trace), "-p",
         str(pid)], stderr=subprocess.PIPE)
    try:
        # strace makes its output file once it has attached.
        assert wait_until(trace.exists, 10), strace.stderr
        result = action()
    finally:
        strace.send_signal(signal.SIGINT)  # detaches, and flushes what it wrote
        strace.wait(10)
    return result, [line for line in trace.read_text().splitlines() if "execve" in line]


def test_a_launch_execs_nothing_and_leaves_one_process(data_dir: Path, orchestrator: str,
                                                       tmp_path: Path) -> None:
    """strace follows the zygote and all it forks while a sandbox is created: no execve. The
    same trace of the agent while it runs a command sees that command's exec."""
    with short_data_dir(data_dir) as short, EmbeddedOrchestrator(
            data_dir=short, reconcile_interval=60) as url, \
            httpx.Client(base_url=url, timeout=60) as http:
        sid, launched = _execs(_zygote(short), tmp_path / "launch",
                               lambda: create_ready(http, {"image": "host"}))
        assert launched == [], launched
        agent = int((short / "local" / "sandboxes" / sid / "agent.pid").read_text())
        # One process in the sandbox's cgroup when idle: the agent, its pid 1.
        status = Path(f"/proc/{agent}/status").read_text()
        assert status.split("NSpid:")[1].split("\n")[0].split()[-1] == "1", status
        unified = Path("/sys/fs/cgroup/unified")
        v2 = next(line[3:] for line in Path(f"/proc/{agent}/cgroup").read_text().splitlines()
                  if line.startswith("0::"))
        procs = (unified if unified.is_dir() else Path("/sys/fs/cgroup")) / v2.lstrip("/")
        assert (procs / "cgroup.procs").read_text().split() == [str(agent)]
        # The control: the trace sees an exec where there is one.
        r, ran = _execs(agent, tmp_path / "exec", lambda: run(http, sid, command="true"))
        assert r["exit_code"] == 0, r
        assert ran, "strace saw no exec of the command: the check above proves nothing"
        http.delete(f"/sandboxes/{sid}")
        assert wait_until(lambda: not os.path.exists(f"/proc/{agent}"))
