"""The Python SDK, sync and async, against a real orchestrator with real sandboxes."""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchard.env.client import (
    AsyncSandboxClient,
    ConnectError,
    NotFoundError,
    RetryPolicy,
    SandboxClient,
)
from orchard.env.server import EmbeddedOrchestrator
from tests.conftest import needs_root, short_data_dir, until_exists, wait_until, wait_until_async

pytestmark = needs_root

DIFF = """\
--- a/greet.py
+++ b/greet.py
@@ -1,2 +1,2 @@
 def greet():
-    return "hello"
+    return "hello, world"
"""
ORIGINAL = 'def greet():\n    return "hello"\n'


def live_ids(url: str) -> set[str]:
    """What the orchestrator says is live, asked by a client of its own."""
    with httpx.Client(base_url=url, timeout=30) as raw:
        return {sb["sandbox_id"] for sb in raw.get("/sandboxes").json()["sandboxes"]
                if sb["status"] in ("pending", "running")}


def gone(url: str, sid: str) -> bool:
    with httpx.Client(base_url=url, timeout=30) as raw:
        r = raw.get(f"/sandboxes/{sid}")
    return r.status_code == 404 or r.json()["status"] == "deleted"


# --- the README example and its async twin ------------------------------------------------


def test_readme_example(orchestrator: str) -> None:
    with SandboxClient(orchestrator) as client:
        with client.create_sandbox("host") as sb:
            r = sb.exec("python3 -c 'print(6*7)'")
            assert r.stdout == "42\n" and r.exit_code == 0
            assert r.ok and r.status == "succeeded"
            assert sb.upload_content(ORIGINAL, "/workspace/greet.py").size == len(ORIGINAL)
            assert sb.download_content("/workspace/greet.py") == ORIGINAL.encode()
            patched = sb.apply_patch(DIFF)
            assert patched.success, patched
            assert b"hello, world" in sb.download_content("/workspace/greet.py")
            sid = sb.id
            assert sid in live_ids(orchestrator)
        assert gone(orchestrator, sid)  # `with sb` deleted it
    assert sid not in live_ids(orchestrator)


async def test_async_twin_does_the_same(orchestrator: str) -> None:
    async with AsyncSandboxClient(orchestrator) as client:
        async with await client.create_sandbox("host") as sb:
            r = await sb.exec("python3 -c 'print(6*7)'")
            assert r.stdout == "42\n" and r.exit_code == 0
            await sb.upload_content(ORIGINAL, "/workspace/greet.py")
            assert await sb.download_content("/workspace/greet.py") == ORIGINAL.encode()
            assert (await sb.apply_patch(DIFF)).success
            assert b"hello, world" in await sb.download_content("/workspace/greet.py")
            events = [e async for e in sb.stream("echo out; echo err >&2; exit 4")]
            assert events[-1].type == "exit" and events[-1].job.exit_code == 4
            assert b"".join(e.data for e in events if e.type == "stdout") == b"out\n"
            r = await sb.exec(["cat"], stdin=b"\xff\x00bytes")
            assert r.stdout_bytes == b"\xff\x00bytes"
            proc = await sb.start_process("echo started; sleep 600")
            assert proc.running


            async def started() -> bool:
                return (await sb.process_output(proc.process_id)).stdout_bytes == b"started\n"

            assert await wait_until_async(started), "the process never printed 'started'"
            killed = await sb.kill_process(proc.process_id)
            assert killed.process_id == proc.process_id
            sid = sb.id
        assert gone(orchestrator, sid)


# --- SandboxClient.local() -------------------------------------------------------------------


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for pid in Path("/proc").iterdir():
        if not pid.name.isdigit():
            continue
        try:
            cmdline = (pid / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            zombie = "State:\tZ" in (pid / "status").read_text()
        except OSError:
            continue
        if text in cmdline and not zombie:
            found.append(f"{pid.name}: {cmdline}")
    return found


def test_local_client_needs_nothing_running_and_leaves_nothing(
        orchestrator: str, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORCHARD_URL", raising=False)
    monkeypatch.delenv("ORCHARD_API_KEY", raising=False)
    threads_before = set(threading.enumerate())
    with short_data_dir(data_dir) as short:
        client = SandboxClient.local(data_dir=short)
        url = client.base_url
        assert url != orchestrator and url.startswith("http://127.0.0.1:")
        with client:
            kept = client.create_sandbox("host")  # never deleted by hand
            with client.create_sandbox("host") as sb:
                assert sb.exec("echo local").stdout == "local\n"
            assert kept.exec(["true"]).ok
            assert live_ids(url) == {kept.id}
            assert _processes_mentioning(str(short))  # its sandboxes really run
        # Closed: the orchestrator is stopped and its sandboxes and processes are gone.
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/health", timeout=5)
        with pytest.raises(ConnectError), SandboxClient(url) as late:
            late.health()
        assert wait_until(lambda: not _processes_mentioning(str(short)), 20, 0.2), (
            _processes_mentioning(str(short)))
        sandboxes = short / "local" / "sandboxes"
        assert not sandboxes.is_dir() or not any(sandboxes.iterdir())
        assert set(threading.enumerate()) <= threads_before  # its server thread ended


# --- sync client features --------------------------------------------------------------------


@pytest.fixture(scope="module")
def client(orchestrator: str) -> Iterator[SandboxClient]:
    with SandboxClient(orchestrator) as c:
        yield c


@pytest.fixture(scope="module")
def sb(client: SandboxClient) -> Iterator[object]:
    with client.create_sandbox("host", labels={"suite": "sdk-e2e"}) as sandbox:
        yield sandbox


def test_stream_yields_output_then_exit(sb: object) -> None:
    # The command goes on only once the test has seen its first output and creates the gate
    # file: so that output was streamed, not sent at the end.
    gate = f"/tmp/gate-{time.monotonic_ns()}"
    stream = iter(sb.stream(f"echo first; {until_exists(gate)}; echo second; echo oops >&2; "
                            "exit 3", timeout=60))
    events = [next(stream)]
    assert (events[0].type, events[0].data) == ("stdout", b"first\n"), events
    assert sb.exec(["touch", gate]).ok
    events.extend(stream)
    assert [e.type for e in events][-1] == "exit"
    assert sum(e.type == "exit" for e in events) == 1
    job = events[-1].job
    assert job.exit_code == 3 and job.status == "failed" and job.finished
    assert b"".join(e.data for e in events if e.type == "stdout") == b"first\nsecond\n"
    assert b"".join(e.data for e in events if e.type == "stderr") == b"oops\n"


def test_background_process_output_and_kill(sb: object) -> None:
    proc = sb.start_process("for i in 1 2 3; do echo $i; done; echo e >&2; sleep 600")
    assert proc.running and proc.sandbox_id == sb.id
    assert proc.process_id in [p.process_id for p in sb.list_processes()]
    assert wait_until(lambda: sb.process_output(proc.process_id).stdout_bytes == b"1\n2\n3\n")
    out = sb.process_output(proc.process_id)
    assert out.running and out.stderr_bytes == b"e\n"
    more = sb.process_output(proc.process_id, out.stdout_offset, out.stderr_offset)
    assert more.stdout_bytes == b"" and more.stderr_bytes == b""  # nothing new past the offsets
    killed = sb.kill_process(proc.process_id)
    assert killed.process_id == proc.process_id
    assert wait_until(lambda: not sb.get_process(proc.process_id).running)
    info = sb.get_process(proc.process_id)
    assert info.exit_code is not None and info.exit_code != 0
    with pytest.raises(NotFoundError):
        sb.process_output("proc-does-not-exist")


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def test_upload_and_download_20_mb_streamed(sb: object, tmp_path: Path) -> None:
    size = 20 * 1024 * 1024
    source = tmp_path / "big.bin"
    with source.open("wb") as f:
        for _ in range(20):
            f.write(os.urandom(1 << 20))
    digest = _sha256_file(source)
    assert sb.upload_file(source, "/workspace/big.bin").size == size
    remote = sb.exec(["sha256sum", "/workspace/big.bin"])
    assert remote.stdout.split()[0] == digest
    target = tmp_path / "back.bin"
    assert sb.download_file("/workspace/big.bin", target) == size
    assert _sha256_file(target) == digest
    assert not (tmp_path / "back.bin.part").exists()
    # An iterable of chunks streams too (it cannot be replayed, so it is sent once).
    chunks = (bytes([i]) * (1 << 20) for i in range(3))
    assert sb.upload_file(chunks, "/workspace/chunks.bin").size == 3 << 20
    assert sb.exec("wc -c < /workspace/chunks.bin").stdout.strip() == str(3 << 20)
    # A failed download leaves no file under either name.
    with pytest.raises(NotFoundError):
        sb.download_file("/workspace/nope", tmp_path / "nope")
    assert not (tmp_path / "nope").exists() and not (tmp_path / "nope.part").exists()


def test_exec_with_bytes_stdin(sb: object) -> None:
    data = bytes(range(256)) * 4
    r = sb.exec(["cat"], stdin=data)
    assert r.ok and r.stdout_bytes == data and r.stdout_b64 is not None
    assert sb.exec("wc -c", stdin=b"\0" * 1000).stdout.strip() == "1000"
    assert sb.exec("cat", stdin="text ünïcode").stdout == "text ünïcode"
    assert sb.exec("cat").stdout == ""  # no stdin: closed, so cat ends


def test_list_sandboxes_by_labels(client: SandboxClient, sb: object) -> None:
    run = f"r{time.monotonic_ns()}"
    a = client.create_sandbox("host", labels={"team": "a", "run": run})
    b = client.create_sandbox("host", labels={"team": "b", "run": run})
    try:
        assert {s.sandbox_id for s in client.list_sandboxes({"run": run})} == {a.id, b.id}
        assert [s.sandbox_id for s in client.list_sandboxes({"run": run, "team": "a"})] == [a.id]
        assert client.list_sandboxes({"run": run, "team": "c"}) == []
        assert client.list_sandboxes({"run": "other"}) == []
        assert sb.id in {s.sandbox_id for s in client.list_sandboxes({"suite": "sdk-e2e"})}
    finally:
        a.delete()
        b.delete()
    assert client.list_sandboxes({"run": run}) == []


def test_close_deletes_every_sandbox_the_client_created(orchestrator: str) -> None:
    # All ready first: deleting a pending one at the wrong moment can kill the session's
    # fork-server (see test_fork_server_survives_a_client_that_hangs_up).
    client = SandboxClient(orchestrator)
    with client:
        made = [client.create_sandbox("host"), client.create_sandbox("host", pids=64),
                client.create_sandbox("host", sandbox_id=f"sdk-cleanup-{os.getpid()}")]
        deleted_early = client.create_sandbox("host")
        deleted_early.delete()
        assert {s.id for s in made} <= live_ids(orchestrator)
    live = live_ids(orchestrator)
    for s in [*made, deleted_early]:
        assert s.id not in live and gone(orchestrator, s.id), s.id
    # A client told to keep its sandboxes keeps them.
    with SandboxClient(orchestrator, cleanup_on_close=False) as keeper:
        kept = keeper.create_sandbox("host")
    try:
        assert kept.id in live_ids(orchestrator)
    finally:
        with httpx.Client(base_url=orchestrator) as raw:
            assert raw.delete(f"/sandboxes/{kept.id}").status_code == 200


# --- admission control --------------------------------------------------------------------------


def _rejections(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "orchard_admission_rejections_total")


async def test_concurrent_creates_back_off_and_all_succeed(orchestrator: str,
                                                           data_dir: Path) -> None:
    with short_data_dir(data_dir) as short, EmbeddedOrchestrator(
            data_dir=short, max_concurrent_creates=1, reconcile_interval=0.5) as url:
        assert _rejections(url) == 0
        # More tries than the default: on a loaded host each create holds the only slot
        # longer, and six of them must all get through. The back-off itself is the SDK's.
        async with AsyncSandboxClient(url, retry=RetryPolicy(retries=10)) as aclient:
            sandboxes = await asyncio.gather(*(aclient.create_sandbox("host") for _ in range(6)))
            assert len({s.id for s in sandboxes}) == 6
            results = await asyncio.gather(*(s.exec(["echo", s.id]) for s in sandboxes))
            assert [r.stdout for r in results] == [f"{s.id}\n" for s in sandboxes]
            assert _rejections(url) > 0  # they really were turned away, and came back
        assert live_ids(url) == set()
