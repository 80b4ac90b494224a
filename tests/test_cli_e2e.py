"""The real `orchard` console script, run as a user would, against the session orchestrator."""

from __future__ import annotations

import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import needs_root, wait_until

pytestmark = needs_root

ORCHARD = Path(sys.executable).with_name("orchard")
ID = re.compile(r"\b(sb-[0-9a-f]{12})\b")


def cli_env(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("ORCHARD_API_KEY", "ORCHARD_API_KEYS", "COLUMNS", "LINES")}
    return {**env, "ORCHARD_URL": url}


@pytest.fixture(scope="module")
def orchard(orchestrator: str):
    def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(ORCHARD), *args], capture_output=True, text=True,
                              timeout=timeout, env=cli_env(orchestrator))
    return run


@pytest.fixture(scope="module")
def sid(orchard, orchestrator: str) -> Iterator[str]:
    r = orchard("sandbox", "create", "host", "--label", "cli=e2e")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 1 and ID.fullmatch(lines[0]), r.stdout  # the id, alone on its line
    yield lines[0]
    httpx.delete(f"{orchestrator}/sandboxes/{lines[0]}", timeout=30)  # if test_rm did not


def assert_one_line_error(r: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert r.returncode != 0, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), r.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_help(orchard) -> None:
    r = orchard("--help")
    assert r.returncode == 0 and "sandbox" in r.stdout and "serve" in r.stdout, r.stdout
    r = orchard("serve", "--help")
    assert r.returncode == 0, r.stderr
    for option in ("--host", "--port", "--api-key", "--data-dir", "--max-concurrent-creates"):
        assert option in r.stdout, (option, r.stdout)
    r = orchard("sandbox", "--help")
    assert r.returncode == 0
    for command in ("create", "ls", "exec", "shell", "cp", "rm"):
        assert re.search(rf"^\W*{command}\b", r.stdout, re.M), (command, r.stdout)


def test_ls_lists_the_sandbox(orchard, sid: str) -> None:
    r = orchard("sandbox", "ls")
    assert r.returncode == 0, r.stderr
    row = next(line for line in r.stdout.splitlines() if sid in line)  # the id is never cut
    assert "running" in row and "host" in row, row
    r = orchard("sandbox", "ls", "--label", "cli=e2e")
    assert ID.findall(r.stdout) == [sid], r.stdout
    assert ID.findall(orchard("sandbox", "ls", "--label", "cli=other").stdout) == []


def test_exec_streams_output_and_passes_the_exit_code(orchard, sid: str) -> None:
    r = orchard("sandbox", "exec", sid, "--", "echo", "hi")
    assert (r.returncode, r.stdout) == (0, "hi\n"), r.stderr
    r = orchard("sandbox", "exec", sid, "--", "sh", "-c", "exit 3")
    assert r.returncode == 3, (r.stdout, r.stderr)
    r = orchard("sandbox", "exec", sid, "--", "sh", "-c", "echo out; echo err >&2; exit 0")
    assert (r.returncode, r.stdout, r.stderr) == (0, "out\n", "err\n")
    r = orchard("sandbox", "exec", sid, "--shell", "echo $((6*7)) | tr 4 x")
    assert (r.returncode, r.stdout) == (0, "x2\n"), r.stderr
    r = orchard("sandbox", "exec", sid, "--timeout", "0.5", "--", "sleep", "30")
    assert r.returncode == 124, (r.stdout, r.stderr)  # as timeout(1) exits


def test_cp_round_trips(orchard, sid: str, tmp_path: Path) -> None:
    data = os.urandom(300_000) + b"\x00\xff end"
    local = tmp_path / "in.bin"
    local.write_bytes(data)
    r = orchard("sandbox", "cp", str(local), f"{sid}:/workspace/f")
    assert r.returncode == 0, r.stderr
    assert str(len(data)) in r.stderr  # "in.bin -> ID:/workspace/f: N bytes"
    size = orchard("sandbox", "exec", sid, "--shell", "wc -c < /workspace/f")
    assert size.stdout.strip() == str(len(data))
    out = tmp_path / "out.bin"
    r = orchard("sandbox", "cp", f"{sid}:/workspace/f", str(out))
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == data
    into = tmp_path / "dir"
    into.mkdir()
    assert orchard("sandbox", "cp", f"{sid}:/workspace/f", str(into)).returncode == 0
    assert (into / "f").read_bytes() == data
    r = orchard("sandbox", "cp", str(local), str(out))
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr  # neither is remote


def test_unknown_id_is_a_one_line_error(orchard, tmp_path: Path) -> None:
    missing = "no-such-sandbox"
    assert_one_line_error(orchard("sandbox", "exec", missing, "--", "echo", "hi"), missing)
    assert_one_line_error(orchard("sandbox", "rm", missing), missing)
    assert_one_line_error(orchard("sandbox", "cp", f"{missing}:/x", str(tmp_path / "x")), missing)
    assert_one_line_error(orchard("sandbox", "shell", missing), missing)
    assert not (tmp_path / "x").exists()
    # A long message stays on one line too (rich would wrap it at 80 columns in a pipe).
    r = orchard("sandbox", "create", "host", "--memory", "12mb")
    assert_one_line_error(r, "'12mb'", "Mi")


def test_shell_in_a_terminal(orchestrator: str, sid: str) -> None:
    pid, fd = pty.fork()
    if pid == 0:  # the child: the CLI on a real terminal
        try:
            os.execve(str(ORCHARD), [str(ORCHARD), "sandbox", "shell", sid],
                      cli_env(orchestrator))
        finally:
            os._exit(127)
    out = b""

    def read_until(needle: bytes, timeout: float) -> None:
        nonlocal out
        deadline = time.monotonic() + timeout
        while needle not in out and time.monotonic() < deadline:
            if not select.select([fd], [], [], 0.5)[0]:
                continue
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # EIO: the child closed the terminal
                return
            if not chunk:
                return
            out += chunk

    done, status = 0, 0
    try:
        # Typed before the remote terminal is up: it must reach the remote shell, not vanish.
        os.write(fd, b"echo early-$((2*3))\n")
        read_until(b"early-6", 30)
        os.write(fd, b"echo hi-$((6*7)); exit\n")
        read_until(b"\x00never", 30)  # to the end of the output

        def exited() -> bool:
            nonlocal done, status
            done, status = os.waitpid(pid, os.WNOHANG)
            return bool(done)

        wait_until(exited)  # the assert below says what is wrong if it did not
    finally:
        if not done:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)
    assert b"early-6" in out, out
    assert b"hi-42" in out, out  # computed by the remote shell, not the local echo
    assert done == pid and os.waitstatus_to_exitcode(status) == 0, (status, out)


def test_snapshot_fork_pause_resume(orchard, sid: str) -> None:
    assert orchard("sandbox", "exec", sid, "--shell", "echo cli > /workspace/s").returncode == 0
    r = orchard("sandbox", "snapshot", sid, "--label", "cli=snap")
    assert r.returncode == 0 and re.fullmatch(r"snap-[0-9a-f]{12}\n", r.stdout), r
    snap = r.stdout.strip()
    assert snap in orchard("snapshot", "ls", "--label", "cli=snap").stdout
    r = orchard("sandbox", "create", "--from-snapshot", snap)
    assert r.returncode == 0, r.stderr
    copy = r.stdout.strip()
    r = orchard("sandbox", "fork", copy, "-n", "2")
    assert r.returncode == 0 and len(ID.findall(r.stdout)) == 2, r
    for made in (copy, *ID.findall(r.stdout)):
        assert orchard("sandbox", "exec", made, "--", "cat", "/workspace/s").stdout == "cli\n"
    assert orchard("sandbox", "pause", copy).stdout == "paused\n"
    assert_one_line_error(orchard("sandbox", "exec", copy, "--", "true"), "paused", "resume")
    assert orchard("sandbox", "resume", copy).stdout == "running\n"
    assert orchard("sandbox", "rm", copy, *ID.findall(r.stdout)).returncode == 0
    assert orchard("snapshot", "rm", snap).stdout == f"{snap}\n"
    assert_one_line_error(orchard("snapshot", "rm", snap), snap, "no such snapshot")
    assert_one_line_error(orchard("sandbox", "create", "--from-snapshot", "snap-none"),
                          "snap-none")


def test_rm_removes_it(orchard, orchestrator: str, sid: str) -> None:
    r = orchard("sandbox", "rm", sid)
    assert (r.returncode, r.stdout) == (0, f"{sid}\n"), r.stderr
    assert sid not in orchard("sandbox", "ls").stdout
    listing = httpx.get(f"{orchestrator}/sandboxes", timeout=30).json()["sandboxes"]
    assert sid not in [sb["sandbox_id"] for sb in listing]
    assert_one_line_error(orchard("sandbox", "exec", sid, "--", "true"), sid)



def test_a_term_unwinds_the_embedded_orchestrator() -> None:
    """Killed with TERM mid-run (a CI timeout), a command that embedded an orchestrator still
    deletes its sandboxes and its data dir."""
    # Short: the data dir holds unix sockets, whose paths may not pass 107 bytes.
    tmp = Path(tempfile.mkdtemp(prefix="term-", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if k not in ("ORCHARD_URL", "ORCHARD_API_KEY")}
    env["TMPDIR"] = str(tmp)  # where the embedded orchestrator's data dir is made
    proc = subprocess.Popen([str(ORCHARD), "tasks", "validate", "web"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not list(tmp.glob("orchard-embedded-*/local/sandboxes/*")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM, proc.stderr
        assert not list(tmp.iterdir()), list(tmp.iterdir())
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        assert str(tmp) not in ps  # no sandbox process of it is left
    finally:
        proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)
