"""Exec through the real REST API: shell vs argv, stdin, timeouts, output caps, jobs, streams."""

from __future__ import annotations

import base64
import hashlib
import json
import random
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.conftest import create_ready, needs_root, run, until_exists

pytestmark = needs_root

PRINT_ARGV = "import json, sys; print(json.dumps(sys.argv[1:]))"
# A command a timeout must cut short; ending in under half of it can only be the timeout's doing.
LONG_S = 60


def exec_raw(http: httpx.Client, sid: str, **body: object) -> httpx.Response:
    return http.post(f"/sandboxes/{sid}/exec", json=body)


# --- command vs argv ----------------------------------------------------------------------


def test_command_runs_in_a_shell(http: httpx.Client, sandbox: str) -> None:
    job = run(http, sandbox, command="x=$((6 * 7)); echo $x | tr 4 X; echo $HOME")
    assert job["status"] == "succeeded"
    assert job["exit_code"] == 0
    assert job["stdout"] == "X2\n/root\n"
    assert job["argv"] is None
    assert job["command"].startswith("x=$((6 * 7))")


def test_argv_is_passed_verbatim_without_a_shell(http: httpx.Client, sandbox: str) -> None:
    args = ["it's \"quoted\"", "two  spaces", "$HOME", "a;b", "; rm -rf /workspace",
            "line1\nline2", "*", "`id`", "$(id)", "", "tab\there", "ünïcode"]
    job = run(http, sandbox, argv=["python3", "-c", PRINT_ARGV, *args])
    assert job["exit_code"] == 0, job
    assert json.loads(job["stdout"]) == args
    assert job["argv"] == ["python3", "-c", PRINT_ARGV, *args]
    # The same words in a shell command *are* interpreted: proves the argv path skips it.
    shell = run(http, sandbox, command="printf '%s|' $HOME a;b")
    assert shell["stdout"] == "/root|a|"
    assert shell["exit_code"] == 127  # 'b' is not a command


def test_exit_codes_and_stderr(http: httpx.Client, sandbox: str) -> None:
    job = run(http, sandbox, command="echo out; echo err >&2; exit 7")
    assert (job["exit_code"], job["status"]) == (7, "failed")
    assert job["stdout"] == "out\n"
    assert job["stderr"] == "err\n"
    assert job["completed_at"] is not None
    ok = run(http, sandbox, argv=["true"])
    assert (ok["exit_code"], ok["status"], ok["stdout"], ok["stderr"]) == (0, "succeeded", "", "")
    # Killed by a signal: the shell convention 128 + signal number.
    killed = run(http, sandbox, command="kill -9 $$")
    assert killed["exit_code"] == 137
    missing = run(http, sandbox, command="definitely-not-a-command-xyz")
    assert missing["exit_code"] == 127
    assert "definitely-not-a-command-xyz" in missing["stderr"]


def test_command_and_argv_are_mutually_exclusive(http: httpx.Client, sandbox: str) -> None:
    r = exec_raw(http, sandbox, command="true", argv=["true"])
    assert r.status_code == 422
    assert "exactly one" in r.text
    r = exec_raw(http, sandbox)
    assert r.status_code == 422


def test_argv_command_not_found_is_400(http: httpx.Client, sandbox: str) -> None:
    r = exec_raw(http, sandbox, argv=["no-such-binary-abc", "x"])
    assert r.status_code == 400, r.text
    assert "no-such-binary-abc" in r.json()["detail"]
    assert "not found" in r.json()["detail"]


# --- cwd, env, login shell -----------------------------------------------------------------


def test_cwd_default_explicit_and_missing(http: httpx.Client, sandbox: str) -> None:
    assert run(http, sandbox, command="pwd")["stdout"] == "/workspace\n"
    assert run(http, sandbox, argv=["pwd"], cwd="/tmp")["stdout"] == "/tmp\n"
    run(http, sandbox, command="mkdir -p /workspace/sub/dir")
    assert run(http, sandbox, command="pwd", cwd="/workspace/sub/dir")["stdout"] == (
        "/workspace/sub/dir\n")
    r = exec_raw(http, sandbox, command="pwd", cwd="/does/not/exist")
    assert r.status_code == 400, r.text
    assert "/does/not/exist" in r.json()["detail"]


def test_per_command_env(http: httpx.Client, sandbox: str) -> None:
    env = {"FOO": "a b; $HOME", "EMPTY": "", "PATH": "/opt/none:/usr/bin:/bin"}
    job = run(http, sandbox, argv=["python3", "-c",
                                   "import os, json; print(json.dumps({k: os.environ.get(k) "
                                   "for k in ('FOO', 'EMPTY', 'PATH', 'HOME')}))"], env=env)
    assert json.loads(job["stdout"]) == {**env, "HOME": "/root"}
    # Env is per command: the next exec does not see it.
    assert run(http, sandbox, command='echo "[${FOO-unset}]"')["stdout"] == "[unset]\n"


def test_login_shell(http: httpx.Client, sandbox: str) -> None:
    probe = "shopt -q login_shell && echo login || echo plain"
    assert run(http, sandbox, command=probe, login_shell=True)["stdout"] == "login\n"
    assert run(http, sandbox, command=probe)["stdout"] == "plain\n"


# --- stdin ---------------------------------------------------------------------------------


def test_stdin_is_closed_by_default(http: httpx.Client, sandbox: str) -> None:
    # With stdin left open, cat would wait for input until the timeout.
    job = run(http, sandbox, command="cat", timeout_seconds=30)
    assert (job["exit_code"], job["stdout"], job["timed_out"]) == (0, "", False)
    assert run(http, sandbox, command="read x; echo rc=$?")["stdout"] == "rc=1\n"


def test_stdin_text_and_bytes(http: httpx.Client, sandbox: str) -> None:
    text = "hello\nwörld\n"
    assert run(http, sandbox, command="cat", stdin=text)["stdout"] == text
    assert run(http, sandbox, argv=["wc", "-l"], stdin=text)["stdout"].strip() == "2"
    # Bytes (not UTF-8) and bigger than a pipe buffer, so the agent must interleave writes
    # with reads of the output.
    data = random.Random(7).randbytes(3 << 20)
    job = run(http, sandbox, command="tee /tmp/in.bin | sha256sum",
              stdin_b64=base64.b64encode(data).decode())
    assert job["stdout"].split()[0] == hashlib.sha256(data).hexdigest()
    echoed = run(http, sandbox, command="cat", stdin_b64=base64.b64encode(b"\x00\xff\xfe").decode())
    assert base64.b64decode(echoed["stdout_b64"]) == b"\x00\xff\xfe"


def test_bad_stdin_b64_is_rejected(http: httpx.Client, sandbox: str) -> None:
    r = exec_raw(http, sandbox, command="cat", stdin_b64="***not base64***")
    assert r.status_code == 422
    assert "base64" in r.text
    r = exec_raw(http, sandbox, command="cat", stdin="a", stdin_b64="YQ==")
    assert r.status_code == 422


# --- timeouts and process trees --------------------------------------------------------------


def test_timeout_keeps_output_and_agent_survives(http: httpx.Client, sandbox: str) -> None:
    t0 = time.monotonic()
    job = run(http, sandbox, command=f"echo before; echo err-before >&2; sleep {LONG_S}; "
              "echo after", timeout_seconds=1)
    elapsed = time.monotonic() - t0
    assert elapsed < LONG_S / 2, elapsed  # the timeout ended it, not the sleep
    assert job["exit_code"] == 124
    assert job["timed_out"] is True
    assert job["status"] == "failed"
    assert job["stdout"] == "before\n"
    assert job["stderr"] == "err-before\n"
    later = run(http, sandbox, command="echo alive")
    assert (later["stdout"], later["timed_out"]) == ("alive\n", False)


def _sleepers(http: httpx.Client, sid: str) -> dict[str, list[str]]:
    """'sleep 100N' processes now alive in the sandbox -> their 'pid ppid sid' rows."""
    listing = run(http, sid, argv=["ps", "-eo", "pid=,ppid=,sid=,stat=,args="])["stdout"]
    found: dict[str, list[str]] = {}
    for line in listing.splitlines():
        parts = line.split(None, 4)
        if len(parts) == 5 and parts[4].startswith("sleep 100") and not parts[3].startswith("Z"):
            found.setdefault(parts[4], []).append(" ".join(parts[:3]))
    return found


def test_timeout_kills_the_whole_tree(http: httpx.Client, sandbox: str) -> None:
    script = (
        "sleep 1001 &\n"                                            # a child
        "bash -c 'setsid sleep 1002 & wait' &\n"                    # a grandchild, new session
        "setsid sh -c 'sleep 1003 </dev/null >/dev/null 2>&1 &'\n"  # a double-forked daemon
        "sleep 0.5\n"
        "ps -eo pid=,ppid=,sid=,args= | awk '$4 == \"sleep\" && $5 ~ /^100/'\n"
        "echo started\n"
        "sleep 30\n"
    )
    job = run(http, sandbox, command=script, timeout_seconds=2)
    assert job["timed_out"] is True and job["exit_code"] == 124
    before = job["stdout"]
    assert before.endswith("started\n"), before
    rows = {line.split(None, 3)[3]: line.split()[:3] for line in before.splitlines()[:-1]}
    assert set(rows) == {"sleep 1001", "sleep 1002", "sleep 1003"}, before
    _daemon_pid, daemon_ppid, daemon_sid = rows["sleep 1003"]
    grandchild_sid = rows["sleep 1002"][2]
    agent_pid = run(http, sandbox, command="echo $PPID")["stdout"].strip()
    # Its parent exited, so it was re-parented to the agent (the sandbox's child subreaper).
    assert daemon_ppid == agent_pid, "the daemon should have been reparented to the agent"
    assert daemon_sid != rows["sleep 1001"][2], "the daemon should be in its own session"
    assert grandchild_sid != rows["sleep 1001"][2], "setsid grandchild shares the session"
    # Everything is gone, seen from a second exec in the same sandbox; the agent is alive.
    assert _sleepers(http, sandbox) == {}
    alive = run(http, sandbox, command="echo alive; ls /proc | grep -c '^[0-9]'")
    assert alive["stdout"].startswith("alive\n")


def test_timeout_in_argv_mode(http: httpx.Client, sandbox: str) -> None:
    t0 = time.monotonic()
    job = run(http, sandbox, argv=["sleep", str(LONG_S)], timeout_seconds=0.5)
    assert time.monotonic() - t0 < LONG_S / 2  # the timeout ended it, not the sleep
    assert (job["exit_code"], job["timed_out"]) == (124, True)


# --- output ----------------------------------------------------------------------------------


def test_huge_output_is_capped_keeping_head_and_tail(http: httpx.Client, sandbox: str) -> None:
    expected = "".join(f"{i:06d}\n" for i in range(1, 300001)).encode()  # 2.1 MB
    limit = 10_000
    job = run(http, sandbox, command="seq -f %06g 1 300000", max_output_bytes=limit)
    assert job["exit_code"] == 0
    out = job["stdout"].encode()
    assert len(out) == limit
    assert out == expected[: limit // 2] + expected[-(limit // 2):]
    assert job["stdout_dropped"] == len(expected) - limit
    assert job["stderr_dropped"] == 0
    # Under the limit nothing is dropped.
    small = run(http, sandbox, command="seq -f %06g 1 1000", max_output_bytes=limit)
    assert small["stdout_dropped"] == 0
    assert small["stdout"].encode() == expected[: 7 * 1000]


def test_stderr_is_capped_separately(http: httpx.Client, sandbox: str) -> None:
    job = run(http, sandbox, command="head -c 100000 /dev/zero | tr '\\0' e >&2; echo ok",
              max_output_bytes=1000)
    assert job["stdout"] == "ok\n"
    assert job["stderr"] == "e" * 1000
    assert job["stderr_dropped"] == 99_000


def test_binary_output_is_lossless(http: httpx.Client, sandbox: str) -> None:
    payload = bytes(range(256)) * 3
    job = run(http, sandbox, argv=["python3", "-c",
                                   "import sys; sys.stdout.buffer.write(bytes(range(256)) * 3); "
                                   "sys.stderr.buffer.write(b'\\xff\\xfeerr')"])
    assert job["exit_code"] == 0
    assert job["stdout_b64"] is not None and job["stdout"] == ""
    assert base64.b64decode(job["stdout_b64"]) == payload
    assert base64.b64decode(job["stderr_b64"]) == b"\xff\xfeerr"
    text = run(http, sandbox, command="printf 'caf\\xc3\\xa9'")
    assert (text["stdout"], text["stdout_b64"]) == ("café", None)


# --- concurrency and jobs --------------------------------------------------------------------


def test_concurrent_execs_in_one_sandbox(http: httpx.Client, sandbox: str) -> None:
    def one(i: int) -> dict:
        return run(http, sandbox, command=f"date +%s.%N; sleep 3; date +%s.%N; echo {i}")

    with ThreadPoolExecutor(5) as pool:
        jobs = list(pool.map(one, range(5)))
    spans = [[float(x) for x in j["stdout"].split()[:2]] for j in jobs]
    # All five were running at one moment: serial execs could not overlap, however fast.
    assert max(start for start, _ in spans) < min(end for _, end in spans), spans
    assert [j["stdout"].split()[2] for j in jobs] == [str(i) for i in range(5)]
    assert len({j["job_id"] for j in jobs}) == 5


def test_wait_false_returns_a_job_id(http: httpx.Client, sandbox: str) -> None:
    # The command cannot end before the test creates /workspace/go, so an answer that comes
    # first did not wait for it (its timeout ends it, should wait=false wait after all).
    command = f"{until_exists('/workspace/go')}; echo done; exit 3"
    accepted = run(http, sandbox, command=command, timeout_seconds=LONG_S, wait=False)
    assert set(accepted) == {"job_id", "status"}, accepted
    assert accepted["status"] == "running", "wait=false must not wait for the command"
    job_id = accepted["job_id"]
    r = http.get(f"/jobs/{job_id}")
    assert r.status_code == 200
    assert r.json()["status"] == "running"
    assert run(http, sandbox, command="touch /workspace/go")["exit_code"] == 0
    r = http.get(f"/jobs/{job_id}/wait", params={"timeout": 30})
    assert r.status_code == 200, r.text
    job = r.json()
    assert (job["status"], job["exit_code"], job["stdout"]) == ("failed", 3, "done\n")
    assert job["sandbox_id"] == sandbox
    again = http.get(f"/jobs/{job_id}").json()
    assert again["stdout"] == "done\n" and again["completed_at"] == job["completed_at"]


def test_finished_jobs_can_be_fetched(http: httpx.Client, sandbox: str) -> None:
    job = run(http, sandbox, command="echo kept")
    r = http.get(f"/jobs/{job['job_id']}")
    assert r.status_code == 200
    assert r.json()["stdout"] == "kept\n"


def test_unknown_job_is_404(http: httpx.Client, orchestrator: str) -> None:
    r = http.get("/jobs/job-doesnotexist")
    assert r.status_code == 404
    assert "job-doesnotexist" in r.json()["detail"]
    r = http.get("/jobs/job-doesnotexist/wait", params={"timeout": 1})
    assert r.status_code == 404


# --- streaming -------------------------------------------------------------------------------


def test_stream_yields_events_while_running(http: httpx.Client, sandbox: str) -> None:
    # The command waits for /workspace/go after its first output, and only this test creates
    # it, once that output has arrived: so the output arrived while the command ran.
    events: list[dict] = []
    body = {"command": f"echo a; echo e >&2; {until_exists('/workspace/go')}; echo b",
            "stream": True, "timeout_seconds": LONG_S}

    def seen(kind: str) -> bytes:
        return b"".join(base64.b64decode(e["data_b64"]) for e in events if e["type"] == kind)

    with http.stream("POST", f"/sandboxes/{sandbox}/exec", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("application/x-ndjson")
        lines = (json.loads(line) for line in r.iter_lines() if line)
        while seen("stdout") != b"a\n" or seen("stderr") != b"e\n":
            events.append(next(lines))
        assert run(http, sandbox, command="touch /workspace/go")["exit_code"] == 0
        events.extend(lines)
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "exit" and kinds.count("exit") == 1, kinds
    assert {k: seen(k) for k in ("stdout", "stderr")} == {"stdout": b"a\nb\n", "stderr": b"e\n"}
    job = events[-1]["job"]
    assert (job["exit_code"], job["status"], job["stdout"]) == (0, "succeeded", "a\nb\n")
    assert http.get(f"/jobs/{job['job_id']}").json()["stdout"] == "a\nb\n"


def test_stream_with_failure_and_timeout(http: httpx.Client, sandbox: str) -> None:
    body = {"command": "echo x; sleep 30", "stream": True, "timeout_seconds": 1}
    with http.stream("POST", f"/sandboxes/{sandbox}/exec", json=body) as r:
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert lines[0] == {"type": "stdout", "data_b64": base64.b64encode(b"x\n").decode()}
    final = lines[-1]
    assert final["type"] == "exit"
    assert (final["job"]["exit_code"], final["job"]["timed_out"]) == (124, True)


# --- unknown and deleted sandboxes ------------------------------------------------------------


def test_exec_in_unknown_sandbox_is_404(http: httpx.Client) -> None:
    r = exec_raw(http, "no-such-sandbox", command="true")
    assert r.status_code == 404
    assert "no-such-sandbox" in r.json()["detail"]


def test_exec_in_deleted_sandbox(http: httpx.Client) -> None:
    sid = create_ready(http, {"image": "host"})
    assert run(http, sid, command="echo hi")["stdout"] == "hi\n"
    assert http.delete(f"/sandboxes/{sid}").status_code == 200
    r = exec_raw(http, sid, command="echo hi")
    assert r.status_code in (404, 409), r.text
    assert sid in r.json()["detail"]


@pytest.mark.parametrize("stream", [False, True])
def test_exec_validation_errors(http: httpx.Client, sandbox: str, stream: bool) -> None:
    r = exec_raw(http, sandbox, command="true", timeout_seconds=-1, stream=stream)
    assert r.status_code == 422
    r = exec_raw(http, sandbox, command="true", bogus=1, stream=stream)
    assert r.status_code == 422
