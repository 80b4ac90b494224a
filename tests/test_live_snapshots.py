"""Live snapshots and forks (CRIU): processes continue in each fork, in its own namespaces."""

from __future__ import annotations

import json
import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchard.env.backends.base import MemoryUnsupported
from orchard.env.backends.local import checkpoint
from orchard.env.backends.local.criu_images import (
    IDS_USER_NS,
    INVENTORY_ROOT_IDS,
    _fields,
    _join,
    adopt_user_namespace,
)
from orchard.env.client import InvalidRequest, Sandbox, SandboxClient
from tests.conftest import needs_browser, needs_root, wait_until

pytestmark = needs_root

# Keeps its variables in memory and serves them; each GET counts.
SERVER = r'''
import http.server, json, os
state = {"hits": 0, "secret": os.urandom(8).hex()}
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        state["hits"] += 1
        body = json.dumps(state).encode()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        print("served", flush=True)
http.server.HTTPServer(("127.0.0.1", 8123), Handler).serve_forever()
'''
# Counts in memory and writes each value out: a restored copy goes on from its own memory.
COUNTER = ("import os, time\nheap = bytearray(os.urandom(1 << 20)) * 32\ni = 0\n"
           "while True:\n    i += 1\n    open('/tmp/count.new', 'w').write(str(i))\n"
           "    os.replace('/tmp/count.new', '/tmp/count')\n    time.sleep(0.05)\n")
GET = ("python3 -c \"import urllib.request; "
       "print(urllib.request.urlopen('http://127.0.0.1:8123').read().decode())\"")


@pytest.fixture()
def client(orchestrator: str) -> Iterator[SandboxClient]:
    with SandboxClient(orchestrator) as c:
        yield c


def count(sb: Sandbox) -> int:
    return int(sb.exec("cat /tmp/count 2>/dev/null || echo 0").stdout)


def status(sb: Sandbox, pid: int) -> dict[str, str]:
    lines = sb.exec(f"cat /proc/{pid}/status").stdout.splitlines()
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


def host_pids(data_dir: Path, sid: str) -> list[int]:
    """The host pids of the agent's children in sandbox sid."""
    agent = (data_dir / "local" / "sandboxes" / sid / "agent.pid").read_text().strip()
    return [int(p) for t in os.listdir(f"/proc/{agent}/task")
            for p in Path(f"/proc/{agent}/task/{t}/children").read_text().split()]


def ns(pid: int, kind: str) -> str:
    return os.readlink(f"/proc/{pid}/ns/{kind}")


def uid(pid: int) -> str:
    return Path(f"/proc/{pid}/status").read_text().split("Uid:\t")[1].split()[0]


def test_processes_continue_in_every_fork(client: SandboxClient, data_dir: Path) -> None:
    with client.create_sandbox() as sb:
        sb.upload_content(SERVER.encode(), "/workspace/server.py")
        sb.upload_content(COUNTER.encode(), "/workspace/counter.py")
        server = sb.start_process("python3 /workspace/server.py")
        counter = sb.start_process("python3 /workspace/counter.py")
        wait_until(lambda: sb.exec(GET).exit_code == 0 and count(sb) > 5)
        before = json.loads(sb.exec(GET).stdout)
        snap = sb.snapshot(memory=True)
        assert snap.memory_bytes and snap.memory_bytes > 32 << 20  # the counter's heap
        assert {p.pid for p in snap.processes} == {server.pid, counter.pid}
        forks = sb.fork(2, memory=True)
        try:
            for fork in forks:
                # The server kept its variables and its listening socket.
                state = json.loads(fork.exec(GET).stdout)
                assert state["secret"] == before["secret"]
                assert state["hits"] >= before["hits"] + 1
                # The counter goes on from where its memory was, not from zero.
                first = count(fork)
                assert first >= 5
                wait_until(lambda f=fork, n=first: count(f) > n)
                # Same pids, still confined: no capabilities, no_new_privs, seccomp.
                for pid in (server.pid, counter.pid):
                    st = status(fork, pid)
                    assert st["CapEff"] == "0000000000000000" and st["NoNewPrivs"] == "1"
                    assert st["Seccomp"] == "2"
            # Each fork's processes live in its own pid and network namespaces and run as
            # its own uid range, never the source's.
            source = host_pids(data_dir, sb.id)
            namespaces, uids = {ns(p, "net") for p in source}, {uid(p) for p in source}
            for fork in forks:
                pids = host_pids(data_dir, fork.id)
                assert len(pids) == 2
                for pid in pids:
                    assert ns(pid, "net") not in namespaces and ns(pid, "pid") not in namespaces
                    assert uid(pid) not in uids
                namespaces |= {ns(p, k) for p in pids for k in ("net", "pid")}
                uids |= {uid(p) for p in pids}
            # The source went on untouched.
            assert json.loads(sb.exec(GET).stdout)["secret"] == before["secret"]
            assert count(sb) > first
        finally:
            for fork in forks:
                fork.delete()


def test_a_snapshot_keeps_files_only_unless_asked(client: SandboxClient) -> None:
    with client.create_sandbox() as sb:
        sb.upload_content(COUNTER.encode(), "/workspace/counter.py")
        sb.start_process("python3 /workspace/counter.py")
        wait_until(lambda: sb.exec("test -s /tmp/count").exit_code == 0)
        snap = sb.snapshot()
        assert snap.memory_bytes is None and snap.processes == []
        (fork,) = sb.fork(1)
        with fork:
            assert "counter.py" not in fork.exec("ps -eo args").stdout
            frozen = count(fork)
            time.sleep(0.3)
            assert count(fork) == frozen  # the file, with nobody writing it


def test_what_cannot_be_checkpointed_is_named(client: SandboxClient) -> None:
    """A Unix socket between two process trees: CRIU cannot carry one end alone. The 422
    names the process and CRIU's reason, and the sandbox runs on as before."""
    pair = ("import socket, time\ns = socket.socket(socket.AF_UNIX)\n"
            "s.bind('/tmp/sock'); s.listen()\nc, _ = s.accept()\ntime.sleep(600)\n")
    peer = ("import socket, time\ns = socket.socket(socket.AF_UNIX)\n"
            "s.connect('/tmp/sock')\ntime.sleep(600)\n")
    with client.create_sandbox() as sb:
        sb.upload_content(pair.encode(), "/workspace/a.py")
        sb.upload_content(peer.encode(), "/workspace/b.py")
        a = sb.start_process("python3 /workspace/a.py")
        wait_until(lambda: sb.exec("test -S /tmp/sock").exit_code == 0)
        sb.start_process("python3 /workspace/b.py")
        time.sleep(0.5)
        with pytest.raises(InvalidRequest) as err:
            sb.snapshot(memory=True)
        message = str(err.value)
        assert err.value.status_code == 422
        assert f"process {a.pid} (python3 /workspace/a.py)" in message
        assert "External socket" in message and "memory: false" in message
        assert all(s.sandbox_id != sb.id for s in client.list_snapshots())
        # Asking again fails the same way, and a files-only snapshot still works.
        with pytest.raises(InvalidRequest, match="External socket"):
            sb.snapshot(memory=True)
        assert sb.snapshot().memory_bytes is None
        # Nothing was left stopped.
        assert all(p.running for p in sb.list_processes())
        assert sb.exec("echo alive").stdout.strip() == "alive"
        with pytest.raises(InvalidRequest, match="paused"):
            sb.pause()
            sb.snapshot(memory=True)
        sb.resume()


def test_no_criu_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checkpoint, "find_criu", lambda: None)
    with pytest.raises(MemoryUnsupported, match="make setup"):
        checkpoint.Checkpoints(tmp_path).bundle()


def test_the_user_namespace_edit_keeps_every_other_byte(tmp_path: Path) -> None:
    """The inventory's root user namespace becomes the tree's; nothing else changes."""
    ids = _join([(1, 0, b"\x02"), (IDS_USER_NS, 0, b"\x09"), (11, 0, b"\x0a")])
    root = _join([(1, 0, b"\x01"), (IDS_USER_NS, 0, b"\x07"), (12, 0, b"\x05")])
    inventory = _join([(1, 0, b"\x02"), (INVENTORY_ROOT_IDS, 2, root), (9, 2, b"run-id")])
    (tmp_path / "ids-5.img").write_bytes(b"\1\2\3\4" * 2 + struct.pack("<I", len(ids)) + ids)
    (tmp_path / "inventory.img").write_bytes(b"INV!" + struct.pack("<I", len(inventory))
                                             + inventory)
    (tmp_path / "userns-9.img").write_bytes(b"saved")
    adopt_user_namespace(tmp_path, 5)
    data = (tmp_path / "inventory.img").read_bytes()
    assert data[:4] == b"INV!"
    fields = _fields(data[8:])
    assert [(n, r) for n, _, r in fields if n != INVENTORY_ROOT_IDS] == [(1, b"\x02"),
                                                                         (9, b"run-id")]
    (root_ids,) = [r for n, _, r in fields if n == INVENTORY_ROOT_IDS]
    assert [(n, r) for n, _, r in _fields(root_ids)] == [(1, b"\x01"), (IDS_USER_NS, b"\x09"),
                                                         (12, b"\x05")]
    assert not (tmp_path / "userns-9.img").exists()


PAGE = (b"<html><title>start</title><body><h1>Form</h1><input id=x aria-label=name>"
        b"<button onclick=\"document.title='sent '+document.getElementById('x').value\">"
        b"send</button></body></html>")


@needs_browser
def test_a_live_fork_carries_the_browser_and_its_page(client: SandboxClient) -> None:
    """Chromium is checkpointed with the page as it stands (text typed, not sent); each fork's
    agent takes over the restored browser, and acting there leaves the source as it was."""
    with client.create_sandbox() as sb:
        sb.upload_content(PAGE, "/workspace/site/index.html")
        sb.start_process("python3 -m http.server 8000 --bind 127.0.0.1", cwd="/workspace/site")
        wait_until(lambda: sb.exec(GET.replace("8123", "8000")).exit_code == 0)
        page = sb.browser("goto", url="http://127.0.0.1:8000/")
        (box,) = [line for line in page.tree.splitlines() if "textbox" in line]
        typed = sb.browser("type", id=int(box.split("]")[0].strip("[ ")), text="from the source")
        forks = sb.fork(2, memory=True)
        try:
            for n, fork in enumerate(forks):
                seen = fork.browser("observe")
                assert (seen.url, seen.title, seen.tree) == (typed.url, typed.title, typed.tree)
                # The same browser, not a fresh one: the typed text is still in the field.
                (button,) = [line for line in seen.tree.splitlines() if "button" in line]
                fork.browser("type", id=int(box.split("]")[0].strip("[ ")), text=f"fork {n}")
                sent = fork.browser("click", id=int(button.split("]")[0].strip("[ ")))
                assert sent.title == f"sent fork {n}"
            assert sb.browser("observe").title == "start"
        finally:
            for fork in forks:
                fork.delete()
