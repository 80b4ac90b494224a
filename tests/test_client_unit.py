"""The SDK without a real orchestrator.

What the client decides alone (request shapes, retries, error mapping) is checked against
scripted answers through ``httpx.MockTransport``. What needs sockets (streamed bodies, the
PTY websocket, the signal-time cleanup, the CLI) runs against a fake orchestrator: a FastAPI
app served by uvicorn in a thread, with canned but schema-valid answers.
"""

from __future__ import annotations

import base64
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, HTTPException, Request, WebSocket
from fastapi.responses import Response, StreamingResponse
from typer.testing import CliRunner

from orchard.cli import app as cli_app
from orchard.env import schema
from orchard.env.client import (
    AsyncSandbox,
    AsyncSandboxClient,
    AuthenticationError,
    ConnectError,
    InvalidRequest,
    NotFoundError,
    Overloaded,
    PayloadTooLarge,
    RetryPolicy,
    SandboxClient,
    SandboxNotReady,
    TransportError,
)
from orchard.env.client.sync_sandbox import Sandbox
from tests.conftest import wait_until

KEY = "test-key"
MB = 1 << 20
NOW = datetime(2025, 1, 1, tzinfo=UTC)
FAST = RetryPolicy(backoff=0.01, max_backoff=0.02)
BINARY = b"\x00\xff\xfe not utf-8"


class Fake:
    """State of the fake orchestrator, inspected and steered by the tests."""

    def __init__(self) -> None:
        self.sandboxes: dict[str, schema.SandboxInfo] = {}
        self.deleted: list[str] = []
        self.execs: list[schema.ExecRequest] = []
        self.files: dict[str, bytes] = {}
        self.received = 0  # bytes of the raw upload in progress, updated as they arrive


def _job(sandbox_id: str, command: str, out: bytes, exit_code: int = 0) -> schema.Job:
    try:
        text, b64 = out.decode(), None
    except UnicodeDecodeError:
        text, b64 = out.decode(errors="replace"), base64.b64encode(out).decode()
    return schema.Job(
        job_id="job-1",
        sandbox_id=sandbox_id,
        command=command,
        status=schema.JobStatus.succeeded,
        stdout=text,
        stdout_b64=b64,
        exit_code=exit_code,
        created_at=NOW,
    )


def _output(request: schema.ExecRequest) -> bytes:
    stdin = request.stdin_bytes()
    if stdin is not None:
        return stdin
    if request.argv:
        return " ".join(request.argv).encode() + b"\n"
    return {"binary": BINARY, "python3 -c 'print(6*7)'": b"42\n"}.get(request.command or "", b"")


def build_app(fake: Fake) -> Any:
    api = FastAPI()

    def sandbox(sandbox_id: str) -> schema.SandboxInfo:
        if sandbox_id not in fake.sandboxes:
            raise HTTPException(404, f"sandbox {sandbox_id} not found")
        return fake.sandboxes[sandbox_id]

    @api.get("/health")
    def health() -> schema.Health:
        return schema.Health(backend="fake", sandboxes=len(fake.sandboxes), version="0")

    @api.post("/sandboxes")
    def create(body: schema.CreateSandboxRequest) -> schema.SandboxInfo:
        sandbox_id = body.sandbox_id or f"sb-{len(fake.sandboxes) + len(fake.deleted)}"
        info = fake.sandboxes.get(sandbox_id) or schema.SandboxInfo(
            sandbox_id=sandbox_id,
            status=schema.SandboxStatus.pending,
            image=body.image or "host",  # as the server defaults it
            block_network=body.block_network,
            labels=body.labels,
            created_at=NOW,
        )
        fake.sandboxes[sandbox_id] = info
        return info

    @api.get("/sandboxes")
    def list_(request: Request) -> schema.SandboxList:
        wanted = dict(label.split("=", 1) for label in request.query_params.getlist("label"))
        found = [s for s in fake.sandboxes.values() if wanted.items() <= s.labels.items()]
        return schema.SandboxList(sandboxes=found)

    @api.get("/sandboxes/{sandbox_id}")
    def get(sandbox_id: str) -> schema.SandboxInfo:
        return sandbox(sandbox_id)

    @api.get("/sandboxes/{sandbox_id}/wait")
    def wait(sandbox_id: str, timeout: float) -> schema.SandboxInfo:
        info = sandbox(sandbox_id)
        if info.image == "broken":
            raise HTTPException(409, "image broken: no such file")
        info.status = schema.SandboxStatus.running
        return info

    @api.delete("/sandboxes/{sandbox_id}")
    def delete(sandbox_id: str) -> schema.DeleteResponse:
        sandbox(sandbox_id)
        del fake.sandboxes[sandbox_id]
        fake.deleted.append(sandbox_id)
        return schema.DeleteResponse(sandbox_id=sandbox_id)

    @api.post("/sandboxes/{sandbox_id}/exec", response_model=None)
    def exec_(sandbox_id: str, body: schema.ExecRequest) -> Any:
        sandbox(sandbox_id)
        fake.execs.append(body)
        job = _job(sandbox_id, body.command or " ".join(body.argv or []), _output(body))
        if body.stream:
            events = [
                schema.StreamEvent(type="stdout", data_b64=base64.b64encode(b"hello ").decode()),
                schema.StreamEvent(type="stderr", data_b64=base64.b64encode(BINARY).decode()),
                schema.StreamEvent(type="exit", job=job),
            ]
            lines = (e.model_dump_json() + "\n" for e in events)
            return StreamingResponse(lines, media_type="application/x-ndjson")
        if body.background:
            return schema.ProcessInfo(process_id="p1", command=job.command, pid=42, running=True)
        if not body.wait:
            return schema.JobAccepted(job_id="job-1", status=schema.JobStatus.queued)
        return job

    @api.get("/jobs/{job_id}/wait")
    def wait_job(job_id: str, timeout: float) -> schema.Job:
        job = _job("sb", "sleep 100", b"")
        return job.model_copy(update={"status": schema.JobStatus.running, "exit_code": None})

    @api.get("/sandboxes/{sandbox_id}/processes/{process_id}/output")
    def process_output(sandbox_id: str, process_id: str, stdout_offset: int = 0
                       ) -> schema.ProcessOutput:  # fmt: skip
        return schema.ProcessOutput(
            process_id=process_id,
            running=True,
            exit_code=None,
            stdout_b64=base64.b64encode(BINARY[stdout_offset:]).decode(),
            stderr_b64="",
            stdout_offset=len(BINARY),
            stderr_offset=0,
        )

    @api.post("/sandboxes/{sandbox_id}/files")
    def upload(sandbox_id: str, body: schema.FileUpload) -> schema.FileWriteResult:
        data = base64.b64decode(body.content)
        fake.files[body.path] = data
        return schema.FileWriteResult(path=body.path, size=len(data))

    @api.put("/sandboxes/{sandbox_id}/files/raw")
    async def upload_raw(sandbox_id: str, path: str, request: Request) -> schema.FileWriteResult:
        fake.received = 0
        kept = bytearray()
        async for chunk in request.stream():
            fake.received += len(chunk)
            if fake.received <= 10 * MB:  # remember small files only; count the rest
                kept += chunk
        fake.files[path] = bytes(kept)
        return schema.FileWriteResult(path=path, size=fake.received)

    @api.get("/sandboxes/{sandbox_id}/files/raw")
    def download_raw(sandbox_id: str, path: str) -> Response:
        if path not in fake.files:
            raise HTTPException(404, f"no such file: {path}")
        data = fake.files[path]
        chunks = (data[i : i + 65536] for i in range(0, len(data), 65536))
        return StreamingResponse(chunks, media_type="application/octet-stream")

    @api.websocket("/sandboxes/{sandbox_id}/exec/pty")
    async def pty(ws: WebSocket, sandbox_id: str, command: str, cols: int, rows: int) -> None:
        await ws.accept()
        await ws.send_bytes(f"{command} {cols}x{rows}\r\n".encode())
        while True:
            message = await ws.receive()
            if message.get("text"):
                await ws.send_bytes(f"resized {message['text']}".encode())
            elif message.get("bytes") == b"exit\r":
                await ws.send_text('{"exit_code": 7}')
                await ws.close()
                return
            elif message.get("bytes"):
                await ws.send_bytes(message["bytes"].upper())

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await api(scope, receive, send)
        key = dict(scope["headers"]).get(b"x-api-key")
        if key is None or key != KEY.encode():
            status, detail = (401, "missing API key") if key is None else (403, "bad API key")
            await _reply(send, status, detail)
        else:
            await api(scope, receive, send)

    return guarded


async def _reply(send: Any, status: int, detail: str) -> None:
    body = schema.ErrorBody(detail=detail).model_dump_json().encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[Fake, str]]:
    fake = Fake()
    config = uvicorn.Config(build_app(fake), host="127.0.0.1", port=0, log_level="critical")
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    assert wait_until(lambda: uv.started, interval=0.01), "the fake server never started"
    port = uv.servers[0].sockets[0].getsockname()[1]
    yield fake, f"http://127.0.0.1:{port}"
    uv.should_exit = True
    thread.join()


@pytest.fixture
def fake(server: tuple[Fake, str]) -> Fake:
    server[0].__init__()  # type: ignore[misc]  # a clean slate for each test
    return server[0]


@pytest.fixture
def url(server: tuple[Fake, str]) -> str:
    return server[1]


@pytest.fixture
def client(fake: Fake, url: str) -> Iterator[SandboxClient]:
    with SandboxClient(url, api_key=KEY, retry=FAST) as c:
        yield c


@pytest.fixture
async def aclient(fake: Fake, url: str) -> AsyncIterator[AsyncSandboxClient]:
    async with AsyncSandboxClient(url, api_key=KEY, retry=FAST) as c:
        yield c


# --- client-side decisions, against scripted answers --------------------------------------------

INFO = schema.SandboxInfo(sandbox_id="sb-1", status=schema.SandboxStatus.running, image="host",
                          block_network=True, created_at=NOW)
JOB = _job("sb-1", "true", b"")
Reply = int | str | tuple[int, str] | Any  # a status, "drop", (503, retry-after) or a model


class Script:
    """A MockTransport handler: answers the requests in turn with ``replies``, recording each.

    An int is that status with an error body, ``(status, retry_after)`` adds Retry-After,
    ``"drop"`` a connection lost mid-answer (what httpx raises then), a model its JSON.
    """

    def __init__(self, *replies: Reply) -> None:
        self.replies = list(replies)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        reply = self.replies.pop(0)
        if reply == "drop":
            raise httpx.RemoteProtocolError("peer closed connection without sending complete "
                                            "message body", request=request)
        status, retry_after = reply if isinstance(reply, tuple) else (reply, None)
        if isinstance(status, int):
            detail: Any = "too busy" if status == 503 else f"status {status}"
            if status == 422:  # FastAPI's shape: a list of located messages
                detail = [{"loc": ["body", "cpu"], "msg": "not a CPU quantity"}]
            headers = {"retry-after": retry_after} if retry_after is not None else {}
            return httpx.Response(status, json={"detail": detail}, headers=headers)
        return httpx.Response(200, content=status.model_dump_json(),
                              headers={"content-type": "application/json"})

    @property
    def sent(self) -> list[str]:
        return [f"{r.method} {r.url.path}" for r in self.requests]


def scripted(script: Callable[[httpx.Request], httpx.Response], **options: Any
             ) -> SandboxClient:  # fmt: skip
    return SandboxClient("http://orchard.test", api_key=KEY, retry=FAST,
                         transport=httpx.MockTransport(script), **options)


def test_exec_request_shapes() -> None:
    script = Script(JOB, JOB, JOB)
    with scripted(script) as client:
        sb = Sandbox(client, INFO)
        sb.exec(["echo", "a b"])
        sb.exec("cat", stdin=BINARY, timeout=5, env={"A": "1"})
        sb.exec("cat", stdin="text")
    argv, binary, text = (schema.ExecRequest.model_validate_json(r.content)
                          for r in script.requests)
    assert argv.argv == ["echo", "a b"] and argv.command is None
    assert binary.stdin_b64 == base64.b64encode(BINARY).decode() and binary.stdin is None
    assert binary.timeout_seconds == 5 and binary.env == {"A": "1"}
    assert text.stdin == "text"
    assert {r.headers["x-api-key"] for r in script.requests} == {KEY}


def test_list_sandboxes_sends_labels() -> None:
    script = Script(schema.SandboxList(sandboxes=[]))
    with scripted(script) as client:
        client.list_sandboxes({"team": "b", "tier": "x=y"})
    assert script.requests[0].url.params.multi_items() == [("label", "team=b"),
                                                          ("label", "tier=x=y")]


def test_503_retried_for_get_honouring_retry_after() -> None:
    health = schema.Health(backend="fake", sandboxes=0, version="0")
    script = Script((503, "1"), health)
    started = time.monotonic()
    with scripted(script) as client:
        assert client.health().backend == "fake"
    assert time.monotonic() - started >= 0.9  # waited as told, not the tiny test backoff
    assert script.sent == ["GET /health"] * 2


def test_503_retried_for_exec() -> None:
    script = Script(503, 503, JOB)
    with scripted(script) as client:
        assert Sandbox(client, INFO).exec("true").ok
    assert script.sent == ["POST /sandboxes/sb-1/exec"] * 3


def test_503_gives_up_after_three_retries() -> None:
    script = Script(*[(503, "0")] * 10)
    with scripted(script) as client, pytest.raises(Overloaded) as caught:
        client.health()
    assert caught.value.retry_after == 0 and "too busy" in str(caught.value)
    assert len(script.requests) == 4


def test_exec_not_resent_after_connection_drop() -> None:
    script = Script("drop", JOB)
    with scripted(script) as client, pytest.raises(TransportError) as caught:
        Sandbox(client, INFO).exec("touch /once")
    assert not isinstance(caught.value, ConnectError)
    assert len(script.requests) == 1


def test_create_with_id_retried_after_connection_drop() -> None:
    script = Script("drop", INFO.model_copy(update={"sandbox_id": "fixed"}),
                    INFO.model_copy(update={"sandbox_id": "fixed"}))
    with scripted(script, cleanup_on_close=False) as client:
        assert client.create_sandbox(sandbox_id="fixed").id == "fixed"
    assert script.sent == ["POST /sandboxes", "POST /sandboxes", "GET /sandboxes/fixed/wait"]


def test_create_without_id_not_retried_after_drop() -> None:
    script = Script("drop", INFO)
    with scripted(script) as client, pytest.raises(TransportError):
        client.create_sandbox()
    assert script.sent == ["POST /sandboxes"]


def test_get_retried_after_connection_drop() -> None:
    script = Script("drop", "drop", INFO)
    with scripted(script) as client:
        assert Sandbox(client, INFO).refresh().sandbox_id == "sb-1"
    assert script.sent == ["GET /sandboxes/sb-1"] * 3


def test_status_errors_carry_the_detail() -> None:
    with scripted(Script(404, 401, 403, 413, 422)) as client:
        for kind, status in [(NotFoundError, 404), (AuthenticationError, 401),
                             (AuthenticationError, 403), (PayloadTooLarge, 413)]:
            with pytest.raises(kind) as caught:
                client.health()
            assert caught.value.status_code == status
            assert caught.value.detail == f"status {status}" and "status" in str(caught.value)
        with pytest.raises(InvalidRequest, match="cpu: not a CPU quantity"):
            client.health()


def test_failed_sandbox_is_not_ready_and_deleted() -> None:
    script = Script(INFO, 409, schema.DeleteResponse(sandbox_id="sb-1"))
    with scripted(script) as client, pytest.raises(SandboxNotReady) as caught:
        client.create_sandbox("broken")
    assert caught.value.status_code == 409 and caught.value.sandbox_id == "sb-1"
    assert script.sent == ["POST /sandboxes", "GET /sandboxes/sb-1/wait", "DELETE /sandboxes/sb-1"]


async def test_async_retries_a_503_and_never_resends_a_dropped_exec() -> None:
    script = Script((503, "0"), JOB, "drop")
    client = AsyncSandboxClient("http://orchard.test", api_key=KEY, retry=FAST,
                                transport=httpx.MockTransport(script))
    async with client:
        sb = AsyncSandbox(client, INFO)
        assert (await sb.exec(["true"])).ok
        with pytest.raises(TransportError):
            await sb.exec("touch /once")
    assert script.sent == ["POST /sandboxes/sb-1/exec"] * 3


async def test_sandbox_id_is_the_reference_sdks_name_for_id_on_both_twins() -> None:
    moved = INFO.model_copy(update={"sandbox_id": "sb-2"})
    async with AsyncSandboxClient("http://orchard.test",
                                  transport=httpx.MockTransport(Script())) as aclient:
        with scripted(Script(moved)) as client:
            for sb in (Sandbox(client, INFO), AsyncSandbox(aclient, INFO)):
                assert sb.sandbox_id == sb.id == "sb-1"
                with pytest.raises(AttributeError):
                    sb.sandbox_id = "sb-other"  # type: ignore[misc]  # read-only, as id
            sync_sb = Sandbox(client, INFO)
            sync_sb.refresh()  # it follows the handle's info, as id does
            assert sync_sb.sandbox_id == sync_sb.id == "sb-2"


# --- commands and results ---------------------------------------------------------------------


def test_readme_example(client: SandboxClient, fake: Fake) -> None:
    sb = client.create_sandbox()
    assert sb.info.status == "running"
    r = sb.exec("python3 -c 'print(6*7)'")
    assert r.stdout == "42\n" and r.exit_code == 0 and r.ok


def test_non_utf8_output_is_decoded_exactly(client: SandboxClient, fake: Fake) -> None:
    sb = client.create_sandbox()
    r = sb.exec("binary")
    assert r.stdout_bytes == BINARY and "\ufffd" in r.stdout
    events = list(sb.stream("binary"))
    assert [e.type for e in events] == ["stdout", "stderr", "exit"]
    assert events[0].data == b"hello " and events[1].data == BINARY
    assert events[2].job is not None and events[2].job.stdout_bytes == BINARY
    assert fake.execs[-1].stream
    out = sb.process_output("p1")
    assert out.stdout_bytes == BINARY and out.stdout_offset == len(BINARY)


def test_job_modes(client: SandboxClient, fake: Fake) -> None:
    sb = client.create_sandbox()
    assert sb.submit("sleep 100").job_id == "job-1" and not fake.execs[-1].wait
    assert sb.start_process("server").pid == 42 and fake.execs[-1].background
    job = client.wait_job("job-1", timeout=0.1)
    assert job.status == "running" and not job.finished and not job.ok


def test_unreachable_server_is_connect_error(fake: Fake) -> None:
    client = SandboxClient("http://127.0.0.1:9", api_key=KEY, retry=FAST)
    with client, pytest.raises(ConnectError, match="127.0.0.1:9"):
        client.health()


# --- files --------------------------------------------------------------------------------------


def test_upload_streams_a_generator(client: SandboxClient, fake: Fake) -> None:
    sb = client.create_sandbox()
    seen_by_server: list[int] = []

    def fifty_megabytes() -> Iterator[bytes]:
        for _ in range(50):
            seen_by_server.append(fake.received)
            yield b"\0" * MB

    result = sb.upload_file(fifty_megabytes(), "/data.bin")
    assert result.size == fake.received == 50 * MB
    # The server was reading while the generator was still producing: nothing buffered it all.
    assert seen_by_server[-1] >= 25 * MB


def test_file_roundtrip(client: SandboxClient, tmp_path: Path) -> None:
    sb = client.create_sandbox()
    data = os.urandom(3 * MB + 17)
    (tmp_path / "in.bin").write_bytes(data)
    assert sb.upload_file(tmp_path / "in.bin", "/in.bin", mode=0o600).size == len(data)
    assert sb.download_file("/in.bin", tmp_path / "out.bin") == len(data)
    assert (tmp_path / "out.bin").read_bytes() == data
    assert sb.download_content("/in.bin") == data
    assert sb.upload_content("hi", "/small").size == 2 and sb.download_content("/small") == b"hi"
    with pytest.raises(NotFoundError):
        sb.download_file("/missing", tmp_path / "missing")
    assert not list(tmp_path.glob("missing*"))


# --- configuration and cleanup ------------------------------------------------------------


def test_env_configuration(fake: Fake, url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCHARD_URL", url)
    monkeypatch.setenv("ORCHARD_API_KEY", KEY)
    with SandboxClient() as c:
        assert c.base_url == url and c.health().backend == "fake"
    with SandboxClient(api_key="other") as c, pytest.raises(AuthenticationError):
        c.health()


def test_close_deletes_created_sandboxes(fake: Fake, url: str) -> None:
    with SandboxClient(url, api_key=KEY) as c:
        kept, gone = c.create_sandbox(), c.create_sandbox()
        with c.create_sandbox() as scoped:
            pass
        assert fake.deleted == [scoped.id]
        gone.delete()
        c.get_sandbox(kept.id)  # looked up, not created: no effect on cleanup
    assert fake.deleted == [scoped.id, gone.id, kept.id]


def test_sigterm_deletes_sandboxes_then_chains(fake: Fake, url: str) -> None:
    calls: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))
    try:
        with SandboxClient(url, api_key=KEY) as c:
            sb = c.create_sandbox()
            signal.raise_signal(signal.SIGTERM)
            assert fake.deleted == [sb.id] and calls == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGTERM) is not None
        signal.raise_signal(signal.SIGTERM)  # our handler is gone; theirs is back
        assert calls == [signal.SIGTERM, signal.SIGTERM] and fake.deleted == [sb.id]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_pty(client: SandboxClient) -> None:
    sb = client.create_sandbox()
    with sb.pty("bash", cols=100, rows=30) as term:
        assert term.recv(timeout=5) == b"bash 100x30\r\n"
        term.send(b"ls\r")
        assert term.recv(timeout=5) == b"LS\r"
        term.resize(120, 40)
        assert term.recv(timeout=5) == b'resized {"resize": [120, 40]}'
        term.send(b"exit\r")
        assert term.recv(timeout=5) == b"" and term.exit_code == 7


# --- the async twin -------------------------------------------------------------------------


async def test_async_parity(aclient: AsyncSandboxClient, fake: Fake, tmp_path: Path) -> None:
    sb = await aclient.create_sandbox(labels={"a": "1"})
    r = await sb.exec("python3 -c 'print(6*7)'")
    assert r.stdout == "42\n" and r.exit_code == 0
    assert (await sb.exec("binary")).stdout_bytes == BINARY
    events = [e async for e in sb.stream("binary")]
    assert [e.data for e in events[:2]] == [b"hello ", BINARY] and events[2].job is not None
    assert [s.sandbox_id for s in await aclient.list_sandboxes({"a": "1"})] == [sb.id]

    with pytest.raises(NotFoundError, match="nope"):
        await aclient.get_sandbox("nope")
    with pytest.raises(SandboxNotReady):
        await aclient.create_sandbox("broken")

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(20):
            yield b"\1" * MB

    assert (await sb.upload_file(chunks(), "/a.bin")).size == 20 * MB
    data = os.urandom(MB + 3)
    (tmp_path / "in").write_bytes(data)
    await sb.upload_file(tmp_path / "in", "/in")
    assert await sb.download_file("/in", tmp_path / "out") == len(data)
    assert (tmp_path / "out").read_bytes() == data == await sb.download_content("/in")

    async with await sb.pty() as term:
        assert await term.recv(timeout=5) == b"bash 80x24\r\n"
        await term.send(b"exit\r")
        assert await term.recv(timeout=5) == b"" and term.exit_code == 7


async def test_async_close_deletes_created(fake: Fake, url: str) -> None:
    async with AsyncSandboxClient(url, api_key=KEY) as c:
        ids = {(await c.create_sandbox()).id for _ in range(3)}
    assert set(fake.deleted) == ids


# --- command line -------------------------------------------------------------------------


def test_cli(client: SandboxClient, fake: Fake, url: str) -> None:
    runner = CliRunner()
    base = ["--url", url, "--api-key", KEY, "sandbox"]
    created = runner.invoke(cli_app, [*base, "create", "--label", "x=y"])
    assert created.exit_code == 0, created.output
    sandbox_id = created.output.strip()
    assert sandbox_id in fake.sandboxes  # the CLI's sandboxes outlive the command

    listed = runner.invoke(cli_app, [*base, "ls", "--label", "x=y"])
    assert sandbox_id in listed.output

    ran = runner.invoke(cli_app, [*base, "exec", sandbox_id, "--", "echo", "hi"])
    assert ran.exit_code == 0 and "hello " in ran.output
    assert fake.execs[-1].argv == ["echo", "hi"]

    missing = runner.invoke(cli_app, [*base, "exec", "nope", "--", "true"])
    assert missing.exit_code == 1 and "sandbox nope not found" in missing.output
    assert "Traceback" not in missing.output

    removed = runner.invoke(cli_app, [*base, "rm", sandbox_id])
    assert removed.exit_code == 0 and fake.deleted == [sandbox_id]
