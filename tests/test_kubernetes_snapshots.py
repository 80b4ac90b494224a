"""Snapshots, forks and pause on the Kubernetes backend, on the fake cluster of tests/fakekube.

The backend talks to the fake API server with the real client, and the fake kubelet runs each
pod as a real local sandbox, so the agents that archive, restore and signal are the real ones.
Driven at the backend level: what is checked is what the backend promises the service.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from orchard.env.agent.client import AgentClient
from orchard.env.backends.base import (
    Backend,
    BackendError,
    SandboxHandle,
    SandboxSpec,
    SnapshotMissing,
    SnapshotTooLarge,
    SpecRejected,
)
from orchard.env.backends.kubernetes import KubernetesBackend, KubernetesConfig
from tests.conftest import needs_root, wait_until, wait_until_async
from tests.fakekube.apiserver import FakeApiServer
from tests.fakekube.cluster import NAMESPACE as NS
from tests.fakekube.cluster import FakeCluster
from tests.test_kubernetes_backend import (
    create,
    create_ready,
    kube_orchestrator,
    paused_kubelet,
    reconcile,
)

pytestmark = needs_root

IMAGE = "python:3.12"  # the fake kubelet runs it as the "host" image
MANAGED = "app.kubernetes.io/managed-by=orchard"


def pods(api: FakeApiServer) -> set[str]:
    found = api.run_in_loop(api.list_objects("pods", NS, MANAGED)).result(timeout=30)
    return {p["metadata"]["name"] for p in found}


@pytest.fixture(scope="module")
def cluster(fake_cluster: FakeCluster) -> Iterator[FakeCluster]:
    """The session's fake cluster; after this module no pod or sandbox of it may be left."""
    yield fake_cluster
    kubelet = fake_cluster.kubelet
    assert kubelet is not None
    assert wait_until(lambda: not pods(fake_cluster.api), 60), pods(fake_cluster.api)
    assert wait_until(lambda: not kubelet.sandboxes(), 60), kubelet.sandboxes()


@pytest.fixture()
def snapshot_dir(tmp_path: Path) -> Path:
    """The volume the orchestrator keeps snapshots on (created on first use)."""
    return tmp_path / "snapshots"


@contextlib.asynccontextmanager
async def started(cluster: FakeCluster, **config: object) -> AsyncIterator[KubernetesBackend]:
    backend = KubernetesBackend(KubernetesConfig(
        kubeconfig=str(cluster.kubeconfig), agent_secret="test-secret", **config))
    await backend.start()
    try:
        yield backend
    finally:
        await backend.close()


@pytest.fixture()
async def backend(cluster: FakeCluster,
                  snapshot_dir: Path) -> AsyncIterator[KubernetesBackend]:
    async with started(cluster, snapshot_dir=str(snapshot_dir)) as b:
        yield b


_count = [0]


@contextlib.asynccontextmanager
async def sandbox(backend: KubernetesBackend,
                  snapshot: str | None = None) -> AsyncIterator[tuple[str, AgentClient]]:
    """A pod sandbox and a client of its agent; the pod is deleted afterwards."""
    _count[0] += 1
    sid = f"snap-{int(time.time() * 1000) % 10**8}-{_count[0]}"
    handle: SandboxHandle = await backend.create(
        SandboxSpec(sandbox_id=sid, image=IMAGE, snapshot=snapshot))
    agent = AgentClient(handle.address, token=handle.token)
    try:
        yield sid, agent
    finally:
        await agent.close()
        await backend.delete(sid)


async def sh(agent: AgentClient, command: str) -> str:
    result = await agent.exec({"command": command, "cwd": "/", "timeout": 30})
    assert result["exit_code"] == 0, result
    return result["stdout"]


async def read(agent: AgentClient, path: str) -> bytes:
    r = await agent.open_file(path)
    return await r.aread()


async def test_a_new_sandbox_starts_from_the_snapshot(backend: KubernetesBackend,
                                                      snapshot_dir: Path) -> None:
    assert isinstance(backend, Backend)
    assert str(snapshot_dir) in backend.describe()["snapshots"]
    async with sandbox(backend) as (sid, agent):
        await sh(agent, "mkdir -p /workspace/src/empty /home/dev && "
                        "echo kept > /workspace/src/kept.txt && "
                        "printf secret > /home/dev/key && chmod 600 /home/dev/key && "
                        "ln -s src/kept.txt /workspace/link && "
                        "echo scratch > /tmp/scratch && "
                        "echo doomed > /workspace/src/doomed.txt && "
                        "rm /workspace/src/doomed.txt && "
                        "mkdir -p /outside && echo lost > /outside/not-kept.txt")
        made = await backend.snapshot(sid, "snap-one", parent=None, max_bytes=10 << 20)
        tar = snapshot_dir / "snap-one.tar"
        assert made.snapshot_id == "snap-one" and made.size_bytes == tar.stat().st_size > 0
        assert sorted(p.name for p in snapshot_dir.iterdir()) == ["snap-one.tar"]  # no partial
        assert await backend.list_snapshots() == {"snap-one"}
        # Changed after the snapshot: a sandbox made from it must not see this.
        await sh(agent, "echo later > /workspace/src/later.txt && echo v2 > "
                        "/workspace/src/kept.txt")

    async with sandbox(backend, snapshot="snap-one") as (_fork, agent):
        assert await read(agent, "/workspace/src/kept.txt") == b"kept\n"
        assert await read(agent, "/home/dev/key") == b"secret"
        assert await read(agent, "/tmp/scratch") == b"scratch\n"
        listing = await sh(agent, "stat -c '%a %F %N' /home/dev/key /workspace/link "
                                  "/workspace/src/empty")
        assert "600 regular file '/home/dev/key'" in listing
        assert "symbolic link '/workspace/link' -> 'src/kept.txt'" in listing
        assert "directory '/workspace/src/empty'" in listing
        gone = await sh(agent, "for f in /workspace/src/doomed.txt /workspace/src/later.txt "
                               "/outside/not-kept.txt; do test -e $f && echo $f; done; true")
        assert gone == ""  # deleted before, written after, or outside the kept paths

    # Each sandbox got its own copy: the snapshot goes at once, and for good.
    assert await backend.delete_snapshot("snap-one") is True
    assert not tar.exists() and await backend.list_snapshots() == set()
    assert await backend.delete_snapshot("snap-one") is True  # gone already: still True


async def test_pause_stops_every_process_until_resume(backend: KubernetesBackend) -> None:
    async with sandbox(backend) as (sid, agent):
        info = await agent.start_process({
            "command": "(while :; do echo x >> /tmp/ticks; sleep 0.02; done) & wait",
            "cwd": "/"})
        pid = info["pid"]  # as the sandbox sees it: read through the agent, not the host

        async def size() -> int:
            return len(await read(agent, "/tmp/ticks"))

        async def state(p: int) -> str:
            stat = (await read(agent, f"/proc/{p}/stat")).decode()
            return stat[stat.rindex(")") + 2]

        async def ticking() -> bool:
            return bool((await agent.list_files("/tmp"))["files"])

        assert await wait_until_async(ticking), "the loop never wrote /tmp/ticks"
        await backend.pause(sid)
        assert await state(pid) == "T"
        before = await size()
        await asyncio.sleep(0.5)
        assert await size() == before  # the background loop did not run

        await backend.resume(sid)
        assert await state(pid) != "T"
        async def grew() -> bool:
            return await size() > before

        assert await wait_until_async(grew), "the resumed loop never wrote again"


async def test_unknown_snapshot_is_missing_and_makes_no_pod(
        backend: KubernetesBackend, cluster: FakeCluster) -> None:
    spec = SandboxSpec(sandbox_id="snap-missing", image=IMAGE, snapshot="never-taken")
    with pytest.raises(SnapshotMissing) as err:
        await backend.create(spec)
    assert "never-taken" in str(err.value) and "snapshot_dir" in str(err.value)
    assert "snap-missing" not in pods(cluster.api)
    with pytest.raises(BackendError, match="cannot name a file"):
        await backend.snapshot("snap-missing", "../escape", parent=None, max_bytes=1)


async def test_a_failed_restore_deletes_the_pod(backend: KubernetesBackend,
                                                cluster: FakeCluster,
                                                snapshot_dir: Path) -> None:
    snapshot_dir.mkdir()
    (snapshot_dir / "broken.tar").write_bytes(b"this is not a tar archive" * 100)
    spec = SandboxSpec(sandbox_id="snap-broken", image=IMAGE, snapshot="broken")
    with pytest.raises(BackendError) as err:
        await backend.create(spec)
    assert "restoring snapshot broken into sandbox snap-broken" in str(err.value)
    assert "snap-broken" not in pods(cluster.api)  # not handed out, and not left behind


async def test_snapshot_over_max_bytes_is_refused(backend: KubernetesBackend,
                                                  snapshot_dir: Path) -> None:
    async with sandbox(backend) as (sid, agent):
        await sh(agent, "head -c 200000 /dev/zero > /workspace/big")
        with pytest.raises(SnapshotTooLarge) as err:
            await backend.snapshot(sid, "too-big", parent=None, max_bytes=100_000)
        assert "100000" in str(err.value) and sid in str(err.value)
        assert list(snapshot_dir.iterdir()) == []  # neither the archive nor a partial one
        assert await backend.list_snapshots() == set()


async def test_without_a_snapshot_dir_it_says_what_to_set(cluster: FakeCluster) -> None:
    async with started(cluster) as backend:
        with pytest.raises(SpecRejected, match="kubernetes.snapshot_dir"):
            backend.check(SandboxSpec(sandbox_id="x", image=IMAGE, snapshot="s"))
        with pytest.raises(BackendError, match="kubernetes.snapshot_dir"):
            await backend.snapshot("any-sandbox", "s", parent=None, max_bytes=1)
        assert await backend.list_snapshots() == set()
        assert "off: set kubernetes.snapshot_dir" in backend.describe()["snapshots"]


async def test_pause_of_a_sandbox_without_a_pod_says_so(backend: KubernetesBackend) -> None:
    with pytest.raises(BackendError, match="snap-nowhere cannot be reached"):
        await backend.pause("snap-nowhere")


# --- the same API as locally, through the orchestrator's REST routes --------------------------


def test_rest_snapshot_fork_pause_on_kubernetes(cluster: FakeCluster,
                                                snapshot_dir: Path) -> None:
    with kube_orchestrator(cluster, snapshot_dir=str(snapshot_dir)) as http:
        sid = create_ready(http, cluster.api)
        r = http.post(f"/sandboxes/{sid}/exec", json={"command": "echo k8s > /workspace/f"})
        assert r.json()["exit_code"] == 0, r.text
        # Live (memory) forks are the local backend's: a 422 that says why, and no fork.
        r = http.post(f"/sandboxes/{sid}/fork", json={"count": 2, "memory": True})
        assert r.status_code == 422 and "kubelet" in r.json()["detail"], r.text
        assert "memory: false" in r.json()["detail"]
        r = http.post(f"/sandboxes/{sid}/fork", json={"count": 2})
        assert r.status_code == 200, r.text
        forks = [s["sandbox_id"] for s in r.json()["sandboxes"]]
        for fork in forks:
            assert http.get(f"/sandboxes/{fork}/wait",
                            params={"timeout": 60}).json()["status"] == "running"
            r = http.post(f"/sandboxes/{fork}/exec", json={"command": "cat /workspace/f"})
            assert r.json()["stdout"] == "k8s\n", r.text
        assert http.post(f"/sandboxes/{sid}/pause").json()["status"] == "paused"
        r = http.post(f"/sandboxes/{sid}/exec", json={"command": "true"})
        assert r.status_code == 409 and "resume" in r.json()["detail"]
        assert http.post(f"/sandboxes/{sid}/resume").json()["status"] == "running"
        # The fork's snapshot goes once its forks started; its archive with it.
        reconcile(http)
        assert wait_until(lambda: not list(snapshot_dir.glob("*.tar")), 30), \
            list(snapshot_dir.iterdir())
        # A pending sandbox cannot be branched yet.
        with paused_kubelet(cluster):
            pending = create(http)
            r = http.post(f"/sandboxes/{pending}/fork", json={"count": 1})
            assert r.status_code == 409 and "pending" in r.json()["detail"], r.text
            r = http.post(f"/sandboxes/{pending}/snapshot")
            assert r.status_code == 409 and "pending" in r.json()["detail"], r.text
        for made in (sid, pending, *forks):
            http.delete(f"/sandboxes/{made}")

