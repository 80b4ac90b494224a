"""Snapshots, forks and pause on the local backend, through the SDK and the REST API."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from orchard.env.client import (
    AsyncSandboxClient,
    ConflictError,
    NotFoundError,
    Overloaded,
    PayloadTooLarge,
    RetryPolicy,
    SandboxClient,
)
from orchard.rollout.traces.replay import replay
from orchard.rollout.traces.trace import build_trace
from tests.conftest import dedicated_orchestrator, needs_root, wait_until

pytestmark = needs_root

SETUP = ("mkdir -p /workspace/repo/sub && cd /workspace/repo && echo one > a && echo two > b "
         "&& ln -s a link && ln a hard && chmod 750 sub && echo deep > sub/c "
         "&& touch owned")


@pytest.fixture()
def client(orchestrator: str) -> Iterator[SandboxClient]:
    with SandboxClient(orchestrator) as c:
        yield c


def sandboxes_dir(data_dir: Path) -> Path:
    return data_dir / "local" / "sandboxes"


def snapshots_dir(data_dir: Path) -> Path:
    return data_dir / "local" / "snapshots"


def orphan_snapshot(data_dir: Path, name: str) -> Path:
    """Snapshot files with no record, as a crash leaves them: the collector removes them."""
    orphan = snapshots_dir(data_dir) / name
    (orphan / "layer").mkdir(parents=True)
    (orphan / "meta.json").write_text('{"parents": []}')
    return orphan


def whole_collection_pass(data_dir: Path) -> None:
    """Wait until a snapshot-collection pass has run from start to end since this call.

    The pass that removes an orphan listed it, so it began after the orphan was made. A second
    orphan, made once the first is gone, was not in that pass's listing: a later pass removes
    it, so the first pass (begun after this call) has ended by then.
    """
    for n in range(2):
        orphan = orphan_snapshot(data_dir, f"snap-witness-{uuid.uuid4().hex[:8]}-{n}")
        assert wait_until(lambda o=orphan: not o.exists()), f"the orphan {orphan} was kept"


def disk_bytes(top: Path) -> int:
    return sum(p.lstat().st_blocks * 512 for p in top.rglob("*"))


def test_a_sandbox_from_a_snapshot_has_its_files(client: SandboxClient) -> None:
    with client.create_sandbox() as sb:
        assert sb.exec(SETUP).exit_code == 0
        snap = sb.snapshot(labels={"t": "files"})
        assert snap.status.value == "ready" and snap.sandbox_id == sb.id
        assert snap.size_bytes > 0 and snap.parent is None and snap.image == "host"
        # Later changes of the source are not in the snapshot.
        assert sb.exec("echo changed > /workspace/repo/a && rm /workspace/repo/b").ok
        with client.create_sandbox(from_snapshot=snap.snapshot_id) as copy:
            assert copy.info.from_snapshot == snap.snapshot_id
            out = copy.exec("cd /workspace/repo && cat a b sub/c && readlink link "
                            "&& stat -c '%a' sub && stat -c '%u:%g' owned "
                            "&& stat -c '%h' a").stdout.split()
            assert out == ["one", "two", "deep", "a", "750", "0:0", "2"], out
            assert copy.exec("whoami").stdout.strip() == "root"
            assert copy.exec("echo ok > /workspace/repo/new").ok  # writable
        assert client.get_snapshot(snap.snapshot_id).labels == {"t": "files"}
        assert [s.snapshot_id for s in client.list_snapshots({"t": "files"})] == [
            snap.snapshot_id]
        assert client.delete_snapshot(snap.snapshot_id).found
        with pytest.raises(NotFoundError, match=snap.snapshot_id):
            client.get_snapshot(snap.snapshot_id)
        assert not client.delete_snapshot(snap.snapshot_id).found  # idempotent


def test_forks_are_independent_and_share_the_snapshot_on_disk(
        client: SandboxClient, data_dir: Path) -> None:
    with client.create_sandbox(labels={"role": "source"}) as sb:
        sb.exec("head -c 4000000 /dev/urandom > /workspace/big && echo base > /workspace/f")
        forks = sb.fork(3, labels={"branch": "yes"}, keep_snapshot=True)
        try:
            assert len({f.id for f in forks}) == 3
            for i, fork in enumerate(forks):
                assert fork.info.labels["orchard.dev/fork-of"] == sb.id
                assert fork.info.labels["role"] == "source" and fork.info.labels["branch"]
                assert fork.exec("cat /workspace/f").stdout == "base\n"
                fork.exec(f"echo {i} > /workspace/f")
            # Each fork sees only its own write; the source is untouched.
            assert [f.exec("cat /workspace/f").stdout for f in forks] == ["0\n", "1\n", "2\n"]
            assert sb.exec("cat /workspace/f").stdout == "base\n"
            big = sb.exec("md5sum < /workspace/big").stdout
            assert all(f.exec("md5sum < /workspace/big").stdout == big for f in forks)
            # The 4 MB file lives once, in the snapshot; each fork stores only what it wrote.
            snap_id = forks[0].info.from_snapshot
            assert snap_id is not None
            shared = disk_bytes(snapshots_dir(data_dir) / snap_id)
            assert shared > 4_000_000
            for fork in forks:
                own = disk_bytes(sandboxes_dir(data_dir) / fork.id / "upper")
                assert own < 0.05 * shared, (own, shared)
        finally:
            for fork in forks:
                fork.delete()


def test_a_snapshot_of_a_fork_stacks_and_keeps_deletions(client: SandboxClient) -> None:
    with client.create_sandbox() as sb:
        sb.exec("mkdir /workspace/d && echo 1 > /workspace/d/x && echo 2 > /workspace/d/y")
        first = sb.snapshot()
        with client.create_sandbox(from_snapshot=first.snapshot_id) as child:
            child.exec("rm /workspace/d/x && echo 3 > /workspace/d/z")
            second = child.snapshot()
            assert second.parent == first.snapshot_id
            assert second.size_bytes < first.size_bytes + 4096 * 8
            with client.create_sandbox(from_snapshot=second.snapshot_id) as grandchild:
                assert grandchild.exec("ls /workspace/d").stdout.split() == ["y", "z"]
                # A deleted dir replaced by a new one is opaque: nothing of the old shows.
                grandchild.exec("rm -r /workspace/d && mkdir /workspace/d && echo n > "
                                "/workspace/d/n")
                third = grandchild.snapshot()
                with client.create_sandbox(from_snapshot=third.snapshot_id) as last:
                    assert last.exec("ls /workspace/d").stdout.split() == ["n"]
        for snap in (first, second, third):
            client.delete_snapshot(snap.snapshot_id)


def test_snapshot_files_outlive_the_record_while_a_sandbox_uses_them(
        client: SandboxClient, data_dir: Path) -> None:
    with client.create_sandbox() as sb:
        sb.exec("echo kept > /workspace/k")
        snap = sb.snapshot()
    files = snapshots_dir(data_dir) / snap.snapshot_id
    user = client.create_sandbox(from_snapshot=snap.snapshot_id)
    client.delete_snapshot(snap.snapshot_id)
    whole_collection_pass(data_dir)
    assert files.is_dir()  # still mounted by `user`
    assert user.exec("cat /workspace/k").stdout == "kept\n"
    with pytest.raises(NotFoundError):  # but no new sandbox may start from it
        client.create_sandbox(from_snapshot=snap.snapshot_id)
    user.delete()
    assert wait_until(lambda: not files.exists()), "unused files were kept"


def test_expired_and_orphaned_snapshots_are_collected(
        client: SandboxClient, data_dir: Path) -> None:
    with client.create_sandbox() as sb:
        snap = sb.snapshot(ttl=0.5)
    files = snapshots_dir(data_dir) / snap.snapshot_id
    assert wait_until(lambda: not files.exists()), "an expired snapshot's files were kept"
    with pytest.raises(NotFoundError):
        client.get_snapshot(snap.snapshot_id)
    orphan = orphan_snapshot(data_dir, "snap-orphan")
    assert wait_until(lambda: not orphan.exists()), "an orphan was kept"


def test_pause_freezes_and_resume_continues(client: SandboxClient, data_dir: Path) -> None:
    with client.create_sandbox() as sb:
        sb.start_process("while true; do echo x >> /tmp/tick; sleep 0.02; done")
        tick = sandboxes_dir(data_dir) / sb.id / "upper" / "tmp" / "tick"
        assert wait_until(lambda: tick.exists() and tick.stat().st_size > 10)
        assert sb.pause().status.value == "paused"
        assert sb.pause().status.value == "paused"  # idempotent
        assert client.get_sandbox(sb.id).info.paused_at is not None
        frozen = tick.stat().st_size
        time.sleep(0.5)
        assert tick.stat().st_size == frozen, "a paused sandbox kept running"
        with pytest.raises(ConflictError, match="resume"):
            sb.exec("true")
        # A snapshot of a paused sandbox leaves it paused.
        snap = sb.snapshot()
        time.sleep(0.2)
        assert tick.stat().st_size == frozen
        assert client.get_sandbox(sb.id).info.status.value == "paused"
        assert sb.resume().status.value == "running"
        assert wait_until(lambda: tick.stat().st_size > frozen + 20)
        assert sb.exec("echo back").stdout == "back\n"
        assert sb.resume().status.value == "running"  # idempotent
        sb.pause()  # deleted while paused: nothing may survive (the leak check looks too)
    client.delete_snapshot(snap.snapshot_id)


def test_bad_requests_say_what_is_wrong(client: SandboxClient, http: httpx.Client) -> None:
    for method, path in (("GET", "/snapshots/snap-none"),
                         ("POST", "/sandboxes/sb-none/snapshot"),
                         ("POST", "/sandboxes/sb-none/fork"),
                         ("POST", "/sandboxes/sb-none/pause")):
        r = http.request(method, path)
        assert r.status_code == 404 and "none" in r.json()["detail"], (path, r.text)
    r = http.post("/sandboxes", json={"from_snapshot": "snap-none"})
    assert r.status_code == 404 and "snap-none" in r.json()["detail"]
    assert http.post("/sandboxes/x/fork", json={"count": 0}).status_code == 422
    sb = client.create_sandbox()
    snap = sb.snapshot()
    r = http.post("/sandboxes", json={"from_snapshot": snap.snapshot_id, "image": "/nope"})
    assert r.status_code == 409 and "leave 'image' out" in r.json()["detail"]
    r = http.post(f"/sandboxes/{sb.id}/snapshot", json={"snapshot_id": snap.snapshot_id})
    assert r.status_code == 409 and "already exists" in r.json()["detail"]
    assert http.post(f"/sandboxes/{sb.id}/resume").status_code == 200  # running: a no-op
    # Labels a create would refuse are refused before any snapshot is taken (schemathesis
    # found the 500 this was): nothing is left behind.
    before = {s.snapshot_id for s in client.list_snapshots()}
    r = http.post(f"/sandboxes/{sb.id}/fork", json={"labels": {"": "x"}})
    assert r.status_code == 422 and "label '': keys must be 1-128 chars" in str(r.json())
    many = {f"k{i}": "v" for i in range(64)}
    r = http.post(f"/sandboxes/{sb.id}/fork", json={"labels": many})
    assert r.status_code == 400 and "give the forks fewer labels" in r.json()["detail"]
    assert {s.snapshot_id for s in client.list_snapshots()} == before
    sb.delete()
    for verb in ("fork", "snapshot", "pause"):
        r = http.post(f"/sandboxes/{sb.id}/{verb}")
        assert r.status_code == 409 and "deleted" in r.json()["detail"], (verb, r.text)
    client.delete_snapshot(snap.snapshot_id)


def test_limits_refuse_clearly_and_leave_nothing(data_dir: Path) -> None:
    with dedicated_orchestrator(data_dir, max_sandboxes=3,
                                max_snapshot_bytes=1_000_000) as url, \
            SandboxClient(url, retry=RetryPolicy(retries=0)) as client, \
            client.create_sandbox() as sb:
        sb.exec("head -c 2000000 /dev/zero > /workspace/big")
        with pytest.raises(PayloadTooLarge, match="over the snapshot limit of 1000000"):
            sb.snapshot()
        assert client.list_snapshots() == []
        sb.exec("rm /workspace/big")
        with pytest.raises(Overloaded, match="over the limit of 3") as over:
            sb.fork(3)
        assert over.value.retry_after is not None
        assert client.list_snapshots() == [] and len(client.list_sandboxes()) == 1


def test_a_disk_quota_sandbox_can_be_snapshotted(client: SandboxClient) -> None:
    with client.create_sandbox(disk="64Mi") as sb:
        sb.exec("echo quota > /workspace/q")
        (fork,) = sb.fork(1)
        with fork:
            assert fork.exec("cat /workspace/q").stdout == "quota\n"


async def test_the_async_client_branches_too(orchestrator: str) -> None:
    async with AsyncSandboxClient(orchestrator) as client:
        sb = await client.create_sandbox()
        await sb.exec("echo async > /workspace/a")
        snap = await sb.snapshot()
        forks = await sb.fork(2)
        assert [(await f.exec("cat /workspace/a")).stdout for f in forks] == ["async\n"] * 2
        assert (await sb.pause()).status.value == "paused"
        assert (await sb.resume()).status.value == "running"
        assert snap.snapshot_id in {s.snapshot_id for s in await client.list_snapshots()}
        assert (await client.delete_snapshot(snap.snapshot_id)).found
        for s in (sb, *forks):
            await s.delete()


def test_a_trace_with_snapshots_and_pauses_replays(client: SandboxClient) -> None:
    session = f"snap-{uuid.uuid4().hex[:8]}"
    with client.create_sandbox(session=session) as sb:
        sb.exec("echo one > /workspace/a")
        snap = sb.snapshot()
        sb.pause()
        sb.resume()
        with client.create_sandbox(from_snapshot=snap.snapshot_id, session=session) as child:
            assert child.exec("cat /workspace/a && echo two >> /workspace/a").stdout == "one\n"
            trace = build_trace(session, [], client.events(session=session))
            report = replay(trace, client, keep=True)
            try:
                # Snapshot, pause and resume change no file: nothing to redo, nothing skipped.
                assert (report.diverged, report.skipped) == (0, 0), report.steps
                again = client.get_sandbox(report.sandbox_ids[child.id])
                assert again.info.from_snapshot == snap.snapshot_id
                assert again.download_content("/workspace/a") == b"one\ntwo\n"
            finally:
                for sid in report.sandbox_ids.values():
                    client.delete_sandbox(sid)
    client.delete_snapshot(snap.snapshot_id)
