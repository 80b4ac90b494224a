"""Sandbox lifecycle through the REST API: TTL, heartbeats, pending timeout, delete, admission,
and re-adoption after the orchestrator is SIGKILLed."""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from orchard.env.backends.local import image_sources
from orchard.env.backends.local.cgroupfs import read_file
from orchard.env.backends.local.cgroups import CgroupManager
from orchard.env.server import EmbeddedOrchestrator
from tests.conftest import create_ready, free_port, needs_root, run, short_data_dir, wait_until
from tests.image_fixtures import make_busybox_rootfs, make_docker_archive

pytestmark = [needs_root, pytest.mark.root]


def cgroup_dirs(sid: str) -> list[str]:
    """Every cgroup directory of a sandbox (v1, hybrid or pure v2; any group below 'orchard')."""
    return [d for pattern in ("*/orchard", "*/orchard/*", "orchard", "orchard/*")
            for d in glob.glob(f"/sys/fs/cgroup/{pattern}/{sid}")]


def cgroup_pids(sid: str) -> set[int]:
    pids: set[int] = set()
    for d in cgroup_dirs(sid):
        # The sandbox's removal may take its cgroup away while we read it.
        pids.update(int(p) for p in (read_file(Path(d, "cgroup.procs")) or "").split())
    return pids


def force_remove(sid: str) -> None:
    """Last-resort cleanup, bypassing the orchestrator: kill the sandbox's cgroups."""
    for d in cgroup_dirs(sid):
        parts = Path(d).parts
        CgroupManager("/".join(parts[parts.index("orchard"):-1])).kill(sid)


def gone(sid: str, data_dir: Path) -> bool:
    return not cgroup_dirs(sid) and not (data_dir / "local" / "sandboxes" / sid).exists()


def status_of(http: httpx.Client, sid: str) -> str | None:
    r = http.get(f"/sandboxes/{sid}")
    return r.json()["status"] if r.status_code == 200 else None


@pytest.fixture()
def short_tmp(data_dir: Path) -> Iterator[Path]:
    with short_data_dir(data_dir) as d:
        yield d


@pytest.fixture(scope="module")
def busybox(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_busybox_rootfs(tmp_path_factory.mktemp("busybox-lc") / "rootfs")


# --- session orchestrator ------------------------------------------------------------------


def test_ttl_expiry_removes_sandbox(http: httpx.Client, data_dir: Path) -> None:
    sid = create_ready(http, {"image": "host", "ttl": 2})
    assert run(http, sid, command="echo up")["stdout"] == "up\n"
    assert cgroup_dirs(sid) and (data_dir / "local" / "sandboxes" / sid).is_dir()
    assert wait_until(lambda: status_of(http, sid) in ("deleted", None), 30, 0.1)
    info = http.get(f"/sandboxes/{sid}")
    if info.status_code == 200:
        assert info.json()["error"] == "ttl expired"
    assert http.post(f"/sandboxes/{sid}/exec", json={"command": "true"}).status_code == 404
    assert wait_until(lambda: gone(sid, data_dir))
    listed = [s["sandbox_id"] for s in http.get("/sandboxes").json()["sandboxes"]]
    assert sid not in listed


def test_delete_is_idempotent_and_complete(http: httpx.Client, data_dir: Path) -> None:
    sid = create_ready(http, {"image": "host"})
    sock = data_dir / "local" / "sandboxes" / sid / "ctl" / "agent.sock"
    assert sock.exists()
    r = http.post(f"/sandboxes/{sid}/exec", json={"command": "sleep 999", "background": True})
    assert r.status_code == 200, r.text
    pids = cgroup_pids(sid)
    assert len(pids) >= 2, pids  # the agent (pid 1) + sleep
    assert http.delete(f"/sandboxes/{sid}").status_code == 200
    assert http.delete(f"/sandboxes/{sid}").status_code == 200

    def complete() -> bool:
        alive = [p for p in pids if Path(f"/proc/{p}").exists()
                 and "State:\tZ" not in Path(f"/proc/{p}/status").read_text()]
        mounts = Path("/proc/mounts").read_text()
        return not alive and gone(sid, data_dir) and sid not in mounts and not sock.exists()

    assert wait_until(complete)
    assert status_of(http, sid) in ("deleted", None)
    assert http.post(f"/sandboxes/{sid}/exec", json={"command": "true"}).status_code == 404


def test_long_sandbox_id_works_or_fails_clearly(http: httpx.Client) -> None:
    sid = ("long-" + uuid.uuid4().hex * 2)[:63]
    r = http.post("/sandboxes", json={"image": "host", "sandbox_id": sid})
    assert r.status_code == 200, r.text
    try:
        w = http.get(f"/sandboxes/{sid}/wait", params={"timeout": 60})
        assert w.status_code == 200, w.text
        if w.json()["ready"]:
            assert run(http, sid, command="echo ok")["stdout"] == "ok\n"
        else:  # never "running" with an agent nobody can reach
            assert w.json()["status"] == "failed" and "AF_UNIX" in w.json()["status_message"]
    finally:
        http.delete(f"/sandboxes/{sid}")


def test_delete_is_idempotent(http: httpx.Client) -> None:
    """As in the reference system: its SDK's delete() must not fail on a reaped sandbox."""
    sid = f"nope-{uuid.uuid4().hex[:8]}"
    r = http.delete(f"/sandboxes/{sid}")
    assert r.status_code == 200 and r.json() == {"sandbox_id": sid, "status": "deleted",
                                                 "found": False}
    sid = create_ready(http, {"image": "host"})
    for found in (True, True):  # a second delete finds the record, already deleted
        r = http.delete(f"/sandboxes/{sid}")
        assert r.status_code == 200 and r.json()["found"] is found, r.text


def test_wait_timeout_is_408(http: httpx.Client) -> None:
    r = http.post("/sandboxes", json={"image": "host"})
    sid = r.json()["sandbox_id"]
    try:
        w = http.get(f"/sandboxes/{sid}/wait", params={"timeout": 0.001})
        assert w.status_code == 408, w.text
        assert "wait again" in w.json()["detail"]
        assert http.get(f"/sandboxes/{sid}/wait", params={"timeout": 60}).status_code == 200
    finally:
        http.delete(f"/sandboxes/{sid}")


def test_duplicate_sandbox_id_is_409(http: httpx.Client) -> None:
    sid = f"dup-{uuid.uuid4().hex[:8]}"
    create_ready(http, {"image": "host", "sandbox_id": sid})
    try:
        r = http.post("/sandboxes", json={"image": "host", "sandbox_id": sid})
        assert r.status_code == 409 and sid in r.json()["detail"], r.text
        assert run(http, sid, command="echo still")["stdout"] == "still\n"
    finally:
        http.delete(f"/sandboxes/{sid}")


def test_labels_filter(http: httpx.Client) -> None:
    tag = uuid.uuid4().hex[:8]
    a = create_ready(http, {"image": "host", "labels": {"suite": tag, "role": "a"}})
    b = create_ready(http, {"image": "host", "labels": {"suite": tag, "role": "b"}})
    try:
        def ids(*labels: str) -> set[str]:
            r = http.get("/sandboxes", params=[("label", lbl) for lbl in labels])
            assert r.status_code == 200, r.text
            return {s["sandbox_id"] for s in r.json()["sandboxes"]}

        assert ids(f"suite={tag}") == {a, b}
        assert ids(f"suite={tag}", "role=a") == {a}
        assert ids(f"suite={tag}", "role=c") == set()
        assert http.get("/sandboxes", params={"label": "novalue"}).status_code == 400
        assert http.get(f"/sandboxes/{a}").json()["labels"] == {"suite": tag, "role": "a"}
    finally:
        http.delete(f"/sandboxes/{a}")
        http.delete(f"/sandboxes/{b}")


# --- heartbeat and pending timeout: a separate, fast-reaping orchestrator -------------------


@pytest.fixture(scope="module")
def reaper(data_dir: Path, orchestrator: str) -> Iterator[tuple[httpx.Client, Path]]:
    with short_data_dir(data_dir) as d, EmbeddedOrchestrator(
            data_dir=d, heartbeat_timeout=2, reconcile_interval=0.3, pending_timeout=1.5
    ) as url, httpx.Client(base_url=url, timeout=60) as client:
        yield client, d


def test_heartbeat_timeout(reaper: tuple[httpx.Client, Path]) -> None:
    http, d = reaper
    once = create_ready(http, {"image": "host"})
    never = create_ready(http, {"image": "host"})
    keep = create_ready(http, {"image": "host"})
    try:
        assert http.post(f"/sandboxes/{once}/heartbeat").status_code == 200

        def once_reaped() -> bool:
            assert http.post(f"/sandboxes/{keep}/heartbeat").status_code == 200  # keep beats on
            return status_of(http, once) != "running"

        assert wait_until(once_reaped, interval=0.4), "a sandbox that stopped beating lived on"
        info = http.get(f"/sandboxes/{once}").json()
        assert info["status"] == "deleted" and info["error"] == "heartbeat timed out", info
        for _ in range(4):  # keep beating past another full timeout
            assert http.post(f"/sandboxes/{keep}/heartbeat").status_code == 200
            time.sleep(0.6)
        assert status_of(http, keep) == "running"
        assert status_of(http, never) == "running"
        assert run(http, never, command="echo never")["stdout"] == "never\n"
        assert run(http, keep, command="echo keep")["stdout"] == "keep\n"
        assert wait_until(lambda: gone(once, d))
        assert http.post(f"/sandboxes/{once}/heartbeat").status_code == 404
    finally:
        for sid in (once, never, keep):
            http.delete(f"/sandboxes/{sid}")


def test_pending_timeout(reaper: tuple[httpx.Client, Path], busybox: Path) -> None:
    """An image that never finishes unpacking (its cache lock is held) is reaped as pending."""
    http, d = reaper
    # In the orchestrator's image dir, where images may be by default.
    archive = make_docker_archive(busybox, d / "images" / "slow.tar", [{"etc/slow": b"1"}])
    with image_sources.TarSource(archive) as source:
        algo, hexdigest = image_sources.read_plan(source).digest.split(":", 1)
    cache = d / "local" / "images"
    cache.mkdir(parents=True, exist_ok=True)
    fd = os.open(cache / f"{algo}-{hexdigest}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        r = http.post("/sandboxes", json={"image": str(archive)})
        assert r.status_code == 200, r.text
        sid = r.json()["sandbox_id"]
        w = http.get(f"/sandboxes/{sid}/wait", params={"timeout": 0.5})
        assert w.status_code == 408, w.text
        assert wait_until(lambda: status_of(http, sid) == "deleted", interval=0.1)
        info = http.get(f"/sandboxes/{sid}").json()
        assert "pending timeout" in info["error"], info
        w = http.get(f"/sandboxes/{sid}/wait", params={"timeout": 1})
        assert w.status_code in (200, 404), w.text
        if w.status_code == 200:
            assert w.json()["ready"] is False and w.json()["status"] == "deleted", w.text
    finally:
        os.close(fd)  # releases the lock; the abandoned unpack finishes harmlessly
    assert wait_until(lambda: gone(sid, d))
    assert http.get("/resources").json()["creates_in_flight"] == 0


# --- admission ------------------------------------------------------------------------------


def test_admission_limits(short_tmp: Path, data_dir: Path, orchestrator: str) -> None:
    with EmbeddedOrchestrator(data_dir=short_tmp, max_sandboxes=2,
                              max_concurrent_creates=1) as url, \
            httpx.Client(base_url=url, timeout=60) as http:
        # A burst of concurrent creates: one is admitted, the rest get 503, nothing crashes.
        results: list[httpx.Response] = []
        barrier = threading.Barrier(4)

        def create() -> None:
            with httpx.Client(base_url=url, timeout=60) as c:
                barrier.wait()
                results.append(c.post("/sandboxes", json={"image": "host"}))

        threads = [threading.Thread(target=create) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        codes = sorted(r.status_code for r in results)
        assert set(codes) <= {200, 503} and codes.count(200) == 1, codes
        for r in results:
            if r.status_code == 503:
                assert int(r.headers["retry-after"]) >= 1
                assert "in flight" in r.json()["detail"]
        first = next(r.json()["sandbox_id"] for r in results if r.status_code == 200)
        assert http.get(f"/sandboxes/{first}/wait").status_code == 200
        second = create_ready(http, {"image": "host"})
        r = http.post("/sandboxes", json={"image": "host"})
        assert r.status_code == 503, r.text
        assert int(r.headers["retry-after"]) >= 1 and "capacity" in r.json()["detail"]
        assert http.get("/health").json()["sandboxes"] == 2
        # Capacity frees up on delete.
        assert http.delete(f"/sandboxes/{second}").status_code == 200
        third = create_ready(http, {"image": "host"})
        assert run(http, third, command="echo ok")["stdout"] == "ok\n"
        assert run(http, first, command="echo ok")["stdout"] == "ok\n"
    # The embedded orchestrator deletes its sandboxes when it stops.
    assert wait_until(lambda: gone(first, short_tmp) and gone(third, short_tmp))


# --- restart: SIGKILL the orchestrator, re-adopt recorded sandboxes, remove orphans ---------



def _start_server(d: Path, port: int, log: Path, **settings: object) -> subprocess.Popen:
    """A standalone orchestrator (`serve`): unlike an embedded one, its sandboxes outlive it."""
    extra = "".join(f", {k}={v!r}" for k, v in settings.items())
    code = ("from pathlib import Path; from orchard.env.server import serve; "
            f"serve(port={port}, data_dir=Path({str(d)!r}), log_level='warning'{extra})")
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=out, stderr=out)

    def up() -> bool:
        assert proc.poll() is None, log.read_text()
        try:
            return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    assert wait_until(up, 60, 0.1), log.read_text()
    return proc


def test_restart_readopts_and_removes_orphans(short_tmp: Path, tmp_path: Path, data_dir: Path,
                                              orchestrator: str) -> None:
    d = short_tmp
    log = tmp_path / "serve.log"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    keep, orphan = f"keep-{uuid.uuid4().hex[:8]}", f"orphan-{uuid.uuid4().hex[:8]}"
    proc = _start_server(d, port, log)
    try:
        with httpx.Client(base_url=url, timeout=60) as http:
            create_ready(http, {"image": "host", "sandbox_id": keep})
            create_ready(http, {"image": "host", "sandbox_id": orphan})
            assert run(http, keep, command="echo persisted > /workspace/f")["exit_code"] == 0
            job_id = run(http, keep, command="sleep 30", wait=False)["job_id"]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        # Sandboxes outlive the orchestrator.
        assert cgroup_pids(keep) and cgroup_pids(orphan)
        with sqlite3.connect(d / "state.db") as db:
            n = db.execute("DELETE FROM sandboxes WHERE sandbox_id = ?", (orphan,)).rowcount
        assert n == 1
        proc = _start_server(d, port, log)
        with httpx.Client(base_url=url, timeout=60) as http:
            assert status_of(http, keep) == "running"
            assert run(http, keep, command="cat /workspace/f")["stdout"] == "persisted\n"
            # The job that was running when the orchestrator died is not left "running".
            job = http.get(f"/jobs/{job_id}").json()
            assert job["status"] == "failed" and "stopped" in job["error"], job
            assert wait_until(lambda: gone(orphan, d) and not cgroup_pids(orphan))
            assert http.get(f"/sandboxes/{orphan}").status_code == 404
            assert cgroup_pids(keep)
            assert http.delete(f"/sandboxes/{keep}").status_code == 200
            assert wait_until(lambda: gone(keep, d))
    finally:
        if proc.poll() is None:
            with httpx.Client(base_url=url, timeout=30) as http:
                for sid in (keep, orphan):
                    with contextlib.suppress(httpx.HTTPError):
                        http.delete(f"/sandboxes/{sid}")
            wait_until(lambda: gone(keep, d) and gone(orphan, d))
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        for sid in (keep, orphan):
            force_remove(sid)
