"""Commands that leave processes running: the exec ends when the command itself exits.

`sb.exec("python3 -m http.server 8000 & echo started")` used to wait for its timeout (exit 124),
because the server kept the exec's stdout open.
"""

from __future__ import annotations

import base64
import json
import sys
import time

import httpx
import pytest

from tests.conftest import create_ready, needs_root, run, wait_until
from tests.test_lifecycle import cgroup_pids

pytestmark = [needs_root, pytest.mark.root]

SERVER = "python3 -m http.server {port} --bind 127.0.0.1"
FETCH = ("python3 -c \"import urllib.request as u; "
         "print(u.urlopen('http://127.0.0.1:{port}/', timeout=5).status)\"")


@pytest.mark.parametrize("launch", [
    "{server} & echo started",
    "nohup {server} & echo started",
    "setsid {server} & echo started",
    "( {server} & ) ; echo started",
    "{server} > /tmp/server.log 2>&1 & echo started",
])
def test_a_server_started_in_the_background_keeps_running(http: httpx.Client, sandbox: str,
                                                          launch: str) -> None:
    port = 8000
    r = run(http, sandbox, command=launch.format(server=SERVER.format(port=port)),
            timeout_seconds=30)
    assert r["exit_code"] == 0 and not r["timed_out"], r
    assert r["stdout"] == "started\n", r
    # The server outlived the exec and answers a later one.
    assert wait_until(lambda: run(http, sandbox, command=FETCH.format(port=port),
                                  timeout_seconds=10)["stdout"] == "200\n", 15, 0.2)
    # Its access log goes on being written to the first exec's (drained) stderr: it lives on.
    assert run(http, sandbox, command=FETCH.format(port=port))["stdout"] == "200\n"


def test_the_commands_own_exit_code_and_output_are_kept(http: httpx.Client,
                                                        sandbox: str) -> None:
    r = run(http, sandbox, command="sleep 300 & echo out; echo err >&2; exit 7",
            timeout_seconds=30)
    assert (r["exit_code"], r["stdout"], r["stderr"], r["timed_out"]) == (7, "out\n", "err\n",
                                                                          False), r


def test_a_plain_command_loses_no_output(http: httpx.Client, sandbox: str) -> None:
    r = run(http, sandbox, command="yes | head -c 5000000", timeout_seconds=60,
            max_output_bytes=8 << 20)
    assert r["exit_code"] == 0 and r["stdout_dropped"] == 0
    assert len(r["stdout"]) == 5_000_000


def test_a_command_that_does_not_exit_still_times_out(http: httpx.Client, sandbox: str) -> None:
    r = run(http, sandbox, command="sleep 250 & sleep 300", timeout_seconds=1)
    assert r["exit_code"] == 124 and r["timed_out"], r
    # The timeout killed the whole tree, the background sleep too.
    assert run(http, sandbox, command="pgrep -x sleep || true")["stdout"] == ""


def test_streamed_exec_ends_when_the_command_exits(http: httpx.Client, sandbox: str) -> None:
    body = {"command": "sleep 300 & echo streamed", "timeout_seconds": 30, "stream": True}
    with http.stream("POST", f"/sandboxes/{sandbox}/exec", json=body) as r:
        assert r.status_code == 200, r.read()
        events = [json.loads(line) for line in r.iter_lines() if line]
    assert [e["type"] for e in events][-1] == "exit", events
    job = events[-1]["job"]
    assert job["exit_code"] == 0 and not job["timed_out"], job
    out = b"".join(base64.b64decode(e["data_b64"]) for e in events if e["type"] == "stdout")
    assert out == b"streamed\n"


def test_a_background_process_is_done_when_its_command_exits(http: httpx.Client,
                                                             sandbox: str) -> None:
    info = run(http, sandbox, command="sleep 300 & echo bg; exit 3", background=True)
    pid = info["process_id"]

    def done() -> bool:
        return http.get(f"/sandboxes/{sandbox}/processes/{pid}").json()["running"] is False

    assert wait_until(done, 15, 0.1)
    assert http.get(f"/sandboxes/{sandbox}/processes/{pid}").json()["exit_code"] == 3


def test_left_behind_processes_die_with_the_sandbox(http: httpx.Client) -> None:
    sid = create_ready(http, {"image": "host"})
    run(http, sid, command="setsid sleep 600 & echo ok", timeout_seconds=30)
    assert "sleep" in run(http, sid, command="ps -eo comm")["stdout"]
    assert cgroup_pids(sid)
    assert http.delete(f"/sandboxes/{sid}").status_code == 200
    assert wait_until(lambda: not cgroup_pids(sid), 20, 0.2), cgroup_pids(sid)


def test_a_command_that_closed_its_output_still_times_out(http: httpx.Client,
                                                          sandbox: str) -> None:
    """Its pipes close at once; the exec must wait for the process, under its timeout."""
    r = run(http, sandbox, command="exec >/dev/null 2>&1; sleep 30", timeout_seconds=1)
    assert r["exit_code"] == 124 and r["timed_out"], r


def test_a_slow_stream_gets_everything_written_before_the_exit() -> None:
    """The agent's exec, in this process: a consumer slower than the command, with a process
    left holding the pipe. What sits in the pipe at the exit is read to the end."""
    from orchard.env.agent.server import execution as agent

    got = bytearray()

    def slow(kind: str, data: bytes) -> None:
        if kind == "stdout":
            got.extend(data)
            time.sleep(0.05)

    # The writer grows its pipe to 1 MiB (F_SETPIPE_SZ), so it can exit with all of it unread.
    write = ("import fcntl, os; fcntl.fcntl(1, 1031, 1 << 20); "
             "os.write(1, b'x' * 1000000)")
    result = agent.run_exec({"command": f"sleep 2 & {sys.executable} -c \"{write}\"",
                             "timeout": 30}, emit=slow)
    assert result["exit_code"] == 0 and not result["timed_out"]
    assert len(got) == 1_000_000
