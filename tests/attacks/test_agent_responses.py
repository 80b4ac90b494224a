"""Attacks on what the orchestrator reads from a sandbox's agent (finding 7 of issue 29).

The agent runs in the sandbox, so every size it sends is the sandbox's word. The attacker is
sandbox code that makes the genuine agent's answers huge (a file that claims a terabyte, a
directory too big to list), or an agent that is not genuine: a fake one that declares a
terabyte, sends an endless body, endless header lines, a chunk of 2**40 bytes, a PTY frame of
4 GiB. The fake agent (``FakeAgent``) is a real Unix-socket server with a byte budget: a client
that does not stop reads the whole budget and fails the test, instead of eating the machine.
What it managed to send is what the client read, give or take the socket's buffers (``SLACK``).

Putting a fake agent in a local sandbox's place takes a compromise that the control dir's
fixes (findings 1 and 11) close from inside; the end-to-end test stands in for it from the host
(as would a compromised agent, or sandbox code listening on a Kubernetes pod's agent port).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import socketserver
import struct
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from itertools import count
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchard.env.agent.client import AgentClient, AgentError
from orchard.env.client import AsyncSandboxClient, SandboxClient, TransportError
from orchard.env.client.errors import PayloadTooLarge
from orchard.env.server import EmbeddedOrchestrator
from tests.conftest import create_ready, needs_root, run, short_data_dir, wait_until

pytestmark = pytest.mark.timeout(120)

BUDGET = 64 << 20  # the most the fake agent sends on one connection
SLACK = 2 << 20  # the socket's and the client's buffers: sent but not (yet) read
LIMIT = 1 << 20  # the limits a test sets, where it sets one
PIECE = 1 << 16
HEAD = b"HTTP/1.1 200 OK\r\n"

Answer = Callable[[str, str], Iterable[bytes]]


class FakeAgent:
    """A Unix-socket server that answers each request with what ``answer(method, path)``
    yields, up to ``BUDGET`` bytes per connection; ``sent[path]`` counts what went out."""

    def __init__(self, path: Path, answer: Answer) -> None:
        self.path = path
        self.sent: Counter[str] = Counter()
        self.connections = 0
        fake = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                fake.connections += 1
                self.connection.settimeout(30)  # a client that stops reading frees the thread
                while (line := self.rfile.readline()) not in (b"", b"\r\n"):
                    method, target, _ = line.decode().split(" ", 2)
                    length = 0
                    while (header := self.rfile.readline()) not in (b"", b"\r\n"):
                        name, _, value = header.decode().partition(":")
                        if name.lower() == "content-length":
                            length = int(value)
                    self.rfile.read(length)
                    path = target.partition("?")[0]
                    if not fake._send(self.connection, path, answer(method, path)):
                        return

        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True
            block_on_close = False

        self._server = Server(str(path), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _send(self, conn: socket.socket, path: str, pieces: Iterable[bytes]) -> bool:
        """Send the answer; False once the connection is done for (budget spent, or the
        client hung up)."""
        spent = 0
        try:
            for piece in pieces:
                conn.sendall(piece)
                self.sent[path] += len(piece)
                spent += len(piece)
                if spent >= BUDGET:
                    return False
        except OSError:
            return False
        return True

    def __enter__(self) -> FakeAgent:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self.path.unlink(missing_ok=True)


def ok(obj: object) -> Iterator[bytes]:
    body = json.dumps(obj).encode()
    yield HEAD + b"Content-Length: %d\r\n\r\n" % len(body) + body


def endless_chunks() -> Iterator[bytes]:
    yield HEAD + b"Transfer-Encoding: chunked\r\n\r\n"
    piece = b"%x\r\n%s\r\n" % (PIECE, b"x" * PIECE)
    while True:
        yield piece


def endless_head() -> Iterator[bytes]:
    yield HEAD
    for i in count():
        yield b"X-Pad-%d: %s\r\n" % (i, b"a" * 100)


def declared(length: bytes) -> Iterator[bytes]:
    """A Content-Length of the attacker's choosing, then a body without end."""
    yield HEAD + b"Content-Length: " + length + b"\r\n\r\n"
    while True:
        yield bytes(PIECE)


def huge_chunk() -> Iterator[bytes]:
    yield HEAD + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n" % (1 << 40)
    while True:
        yield bytes(PIECE)


def endless_line() -> Iterator[bytes]:
    """A streamed exec's event that never ends its line."""
    yield HEAD + b"Content-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n"
    yield b"%x\r\n%s\r\n" % (30, b'{"type":"stdout","data_b64":"A')
    piece = b"%x\r\n%s\r\n" % (PIECE, b"A" * PIECE)
    while True:
        yield piece


def huge_pty_frame() -> Iterator[bytes]:
    yield (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: orchard-pty\r\n"
           b"Connection: Upgrade\r\n\r\n" + struct.pack(">BI", 0, (1 << 32) - 1))
    while True:
        yield bytes(PIECE)


@pytest.fixture()
def sock_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="/tmp/orc-fake-") as d:
        yield Path(d)


def serve(sock_dir: Path, answer: Answer) -> FakeAgent:
    return FakeAgent(sock_dir / "agent.sock", answer)


def at(fake: FakeAgent, **limits: int) -> AgentClient:
    return AgentClient(f"unix:{fake.path}", timeout=20, **limits)


# --- a fake agent against the orchestrator's client ----------------------------------------


async def test_an_endless_answer_is_cut_at_its_limit_and_its_connection_dropped(
        sock_dir: Path) -> None:
    def answer(method: str, path: str) -> Iterable[bytes]:
        return endless_chunks() if path == "/files/list" else ok({"status": "ok"})

    with serve(sock_dir, answer) as fake:
        client = at(fake, max_response_bytes=LIMIT)
        with pytest.raises(AgentError) as e:
            await client.list_files("/")
        assert e.value.status == 502
        assert f"limit of {LIMIT} bytes (agent_max_response_bytes)" in e.value.detail
        assert fake.sent["/files/list"] < LIMIT + SLACK
        # The cut connection is not reused: the next call opens its own and is answered.
        assert (await client.health())["status"] == "ok"
        assert fake.connections == 2
        await client.close()


@pytest.mark.parametrize(("answer", "said"), [
    (endless_head, "response head over"),
    (lambda: declared(b"1099511627776"), "is declared as 1099511627776 bytes"),
    # read(-1) would read to the end of the stream.
    (lambda: declared(b"-1"), "malformed Content-Length"),
    (huge_chunk, "(agent_max_response_bytes)"),
], ids=["endless head", "a terabyte declared", "a negative length", "a 2**40 chunk"])
async def test_a_size_the_agent_sends_is_not_trusted(sock_dir: Path, answer: Callable[[], Any],
                                                     said: str) -> None:
    """Refused before the body is read: the fake sent little more than its head."""
    with serve(sock_dir, lambda method, path: answer()) as fake:
        client = at(fake)
        with pytest.raises(AgentError) as e:
            await client.processes()
        assert e.value.status == 502 and said in e.value.detail, e.value.detail
        assert fake.sent["/processes"] < SLACK


async def test_an_endless_download_is_cut_at_max_download_bytes(sock_dir: Path) -> None:
    with serve(sock_dir, lambda method, path: endless_chunks()) as fake:
        r = await at(fake, max_download_bytes=LIMIT).open_file("/dev/zero")
        received = 0
        with pytest.raises(AgentError) as e:
            async for data in r.aiter_raw():
                received += len(data)
        assert e.value.status == 413
        assert "file /dev/zero" in e.value.detail and "(max_download_bytes)" in e.value.detail
        assert received <= LIMIT
        assert fake.sent["/files"] < LIMIT + SLACK


async def test_a_download_declared_over_max_download_bytes_is_refused_up_front(
        sock_dir: Path) -> None:
    with serve(sock_dir, lambda method, path: declared(b"%d" % (2 * LIMIT))) as fake:
        with pytest.raises(AgentError) as e:
            await at(fake, max_download_bytes=LIMIT).open_file("/big")
        assert e.value.status == 413
        assert f"is declared as {2 * LIMIT} bytes" in e.value.detail
        assert fake.sent["/files"] < SLACK


async def test_an_endless_archive_is_cut_past_max_bytes_and_max_download_bytes(
        sock_dir: Path) -> None:
    """A Kubernetes snapshot: the agent checked max_bytes of files, tar headers come on top."""
    with serve(sock_dir, lambda method, path: endless_chunks()) as fake:
        with pytest.raises(AgentError) as e:
            await at(fake, max_download_bytes=LIMIT).get_archive(
                ["/workspace"], sock_dir / "snap.tar", max_bytes=LIMIT)
        assert e.value.status == 413 and "max_download_bytes" in e.value.detail
        assert (sock_dir / "snap.tar").stat().st_size <= 2 * LIMIT
        assert fake.sent["/archive"] < 2 * LIMIT + SLACK


async def test_an_endless_line_of_a_streamed_exec_is_cut(sock_dir: Path) -> None:
    with serve(sock_dir, lambda method, path: endless_line()) as fake:
        client = at(fake, max_response_bytes=LIMIT)
        with pytest.raises(AgentError) as e:
            async for _ in client.exec_stream({"command": "yes", "max_output_bytes": 1024}):
                pass
        assert e.value.status == 502 and "(agent_max_response_bytes)" in e.value.detail
        assert fake.sent["/exec"] < LIMIT + SLACK


async def test_a_pty_frame_of_4_gib_closes_the_terminal(sock_dir: Path) -> None:
    with serve(sock_dir, lambda method, path: huge_pty_frame()) as fake:
        channel = await at(fake).open_pty(["sh"], 80, 24)
        assert await channel.recv() == ("closed", b"")
        assert fake.sent["/pty"] < SLACK
        await channel.close()


# --- through a real orchestrator -----------------------------------------------------------


@pytest.fixture(scope="module")
def capped(data_dir: Path, orchestrator: str) -> Iterator[tuple[str, Path]]:
    """An orchestrator with small limits: 64 KiB per agent answer, 1 MiB per download. No
    reconcile pass: it would fail the sandbox whose agent the fake replaces."""
    del orchestrator  # only for the bundle
    with short_data_dir(data_dir) as short, EmbeddedOrchestrator(
            data_dir=short, reconcile_interval=600, agent_max_response_bytes=64 << 10,
            max_download_bytes=LIMIT) as url:
        yield url, short


@pytest.fixture()
def http(capped: tuple[str, Path]) -> Iterator[httpx.Client]:
    """The capped orchestrator's client (conftest's ``sandbox`` is then one of its sandboxes)."""
    with httpx.Client(base_url=capped[0], timeout=60) as client:
        yield client


@needs_root
def test_a_file_that_claims_a_terabyte_is_refused_before_it_streams(
        capped: tuple[str, Path], http: httpx.Client, sandbox: str, tmp_path: Path) -> None:
    """Sandbox code makes a sparse file of 1 TiB: the agent would send all of it."""
    sid = sandbox
    assert run(http, sid, command="truncate -s 1T /workspace/tera")["exit_code"] == 0
    with http.stream("GET", f"/sandboxes/{sid}/files/raw",
                     params={"path": "/workspace/tera"}) as r:
        assert r.status_code == 413, r.status_code
        detail = json.loads(r.read())["detail"]
    assert "is declared as 1099511627776 bytes" in detail and "max_download_bytes" in detail
    with SandboxClient(capped[0]) as client, pytest.raises(PayloadTooLarge):
        client.get_sandbox(sid).download_file("/workspace/tera", tmp_path / "tera")
    assert list(tmp_path.iterdir()) == []
    assert run(http, sid, command="echo alive")["stdout"] == "alive\n"


@needs_root
def test_a_directory_too_big_to_list_is_a_clear_error(http: httpx.Client,
                                                      sandbox: str) -> None:
    """Sandbox code fills a directory: listing it is an answer over the limit (64 KiB here,
    128 MiB by default, some million entries), refused rather than held in memory."""
    sid = sandbox
    make = "mkdir -p /workspace/many && cd /workspace/many && seq 3000 | xargs touch"
    assert run(http, sid, command=make)["exit_code"] == 0
    r = http.get(f"/sandboxes/{sid}/files/list", params={"path": "/workspace/many"})
    assert r.status_code == 502, r.text[:300]
    assert "agent_max_response_bytes" in r.json()["detail"]
    # The sandbox and the orchestrator carry on.
    assert http.get(f"/sandboxes/{sid}/files/list", params={"path": "/workspace"}
                    ).status_code == 200
    assert run(http, sid, command="ls /workspace/many | wc -l")["stdout"] == "3000\n"


@needs_root
def test_a_fake_agent_cannot_flood_the_orchestrator(
        capped: tuple[str, Path], http: httpx.Client, sandbox: str, tmp_path: Path) -> None:
    url, data_dir = capped
    sid = sandbox
    other = create_ready(http, {"image": "host"})
    home = data_dir / "local" / "sandboxes" / sid

    def answer(method: str, path: str) -> Iterable[bytes]:
        return {"/files": endless_chunks(), "/files/list": endless_chunks(),
                "/exec": endless_head()}.get(path) or ok({"processes": []})

    # The compromise: a fake agent's socket where the genuine one's was, and that one killed.
    with FakeAgent(home / "ctl" / "fake.sock", answer) as fake:
        os.replace(fake.path, home / "ctl" / "agent.sock")
        fake.path = home / "ctl" / "agent.sock"
        os.kill(int((home / "agent.pid").read_text()), signal.SIGKILL)
        # Pooled connections to the dead agent fail first; then the fake answers.
        assert wait_until(lambda: http.get(f"/sandboxes/{sid}/processes").status_code == 200,
                          20, 0.1)
        try:
            with SandboxClient(url) as client, pytest.raises(TransportError) as e:
                client.get_sandbox(sid).download_file("/dev/zero", tmp_path / "zero")
            assert type(e.value).__name__ == "IncompleteDownload"
            assert "broke off before its end" in str(e.value), e.value
            assert "max_download_bytes" in str(e.value), e.value
            assert list(tmp_path.iterdir()) == []  # no short file, no .part
            assert fake.sent["/files"] < LIMIT + SLACK
            with pytest.raises(TransportError) as e:
                asyncio.run(_download_async(url, sid))
            assert type(e.value).__name__ == "IncompleteDownload"
            assert fake.sent["/files"] < 2 * (LIMIT + SLACK)

            r = http.get(f"/sandboxes/{sid}/files/list", params={"path": "/"})
            assert r.status_code == 502 and "agent_max_response_bytes" in r.json()["detail"]
            assert fake.sent["/files/list"] < (64 << 10) + SLACK

            r = http.post(f"/sandboxes/{sid}/exec", json={"command": "true"})
            assert r.status_code == 502 and "response head over" in r.json()["detail"]
            assert fake.sent["/exec"] < SLACK

            # The orchestrator, and every other sandbox, carry on.
            assert http.get("/health").status_code == 200
            assert run(http, other, command="echo fine")["stdout"] == "fine\n"
        finally:
            http.delete(f"/sandboxes/{other}")


async def _download_async(url: str, sid: str) -> bytes:
    async with AsyncSandboxClient(url) as client:
        return await (await client.get_sandbox(sid)).download_content("/dev/zero")
