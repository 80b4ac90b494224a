"""A local delete returns once the sandbox is unreachable; the reaper (backends/local/reaper.py)
removes the rest without ever holding up a create, and a restart finishes a reap that a
SIGKILL cut short.

A reap is held in flight honestly: the sandbox has a disk quota, and the test keeps that
disk's loop device open (as a udev probe or a backup tool might), so the device cannot
detach and the reaper waits for it before it removes the files. While the test holds it,
the reap is under way for certain; the tests assert on what is on the host, never on time.
(Many files in the upper dir would slow the reap too, but on a busy host writing them took
~40 times longer than removing them, so they made a slow test and only a short window.)
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import signal
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from orchard.env.backends.base import SandboxSpec
from orchard.env.backends.local.backend import LocalBackend
from orchard.env.backends.local.host_state import cgroup_group
from orchard.env.backends.local.reaper import FILES, SEP
from tests.conftest import (
    WAIT_S,
    alive,
    create_ready,
    free_port,
    needs_root,
    short_data_dir,
    wait_until,
)
from tests.leakcheck import loop_backing_files
from tests.test_lifecycle import _start_server
from tests.test_orchestrator_ownership import claims_under

pytestmark = [needs_root, pytest.mark.root]
DISK = "32Mi"


@pytest.fixture()
def short(data_dir: Path, orchestrator: str) -> Iterator[Path]:
    del orchestrator  # only for the bundle it built
    with short_data_dir(data_dir) as d:
        yield d


@pytest.fixture()
async def backend(short: Path) -> AsyncIterator[LocalBackend]:
    b = LocalBackend(short / "local", die_with_orchestrator=True)
    # The test decides when a held loop device is let go, not the reaper's patience.
    b.reaper.detach_timeout = 600
    await b.start()
    try:
        yield b
    finally:
        for sid in await b.list():
            await b.delete(sid)
        await b.close()


@contextlib.contextmanager
def holding_disk(sandbox_dir: Path) -> Iterator[None]:
    """Keeps the loop device of the sandbox's disk open while the block runs."""
    image = str(sandbox_dir / "disk.img")
    [device] = [path.split("/")[3] for path in glob.glob("/sys/block/loop*/loop/backing_file")
                if Path(path).read_text().strip() == image]
    fd = os.open(f"/dev/{device}", os.O_RDONLY)
    try:
        yield
    finally:
        os.close(fd)


def entries(data_dir: Path, sid: str) -> list[Path]:
    """The reaper's entries of sandbox ``sid`` (see reaper.py for the names)."""
    return sorted((data_dir / "reaping").glob(f"{sid}{SEP}*"))


def cgroup_dirs(data_dir: Path, sid: str | None = None) -> list[str]:
    return glob.glob(f"/sys/fs/cgroup/*/{cgroup_group(data_dir)}/{sid or '*'}/")


def left_of(data_dir: Path, sid: str, agent: int) -> dict[str, object]:
    """What is left on the host of deleted sandbox ``sid``: empty once its reap is done."""
    found = {"reaping": entries(data_dir, sid), "cgroups": cgroup_dirs(data_dir, sid),
             "uid claims": claims_under(str(data_dir / "reaping")),
             "loop devices": [f for f in loop_backing_files() if str(data_dir) in f],
             "agent": [agent] if alive(agent) else []}
    return {kind: items for kind, items in found.items() if items}


async def test_delete_returns_before_the_reap_which_then_leaves_nothing(
        backend: LocalBackend) -> None:
    data = backend.data_dir
    handle = await backend.create(SandboxSpec(sandbox_id="slow", image="host", disk=DISK))
    sdir = data / "sandboxes" / "slow"
    agent = int((sdir / "agent.pid").read_text())
    assert claims_under(str(sdir)) and cgroup_dirs(data, "slow")  # these checks can fail

    with holding_disk(sdir):
        await backend.delete("slow")
        # Unreachable at once: not listed, its dir and agent socket gone from where they were.
        assert "slow" not in await backend.list()
        assert not sdir.exists()
        assert not Path(handle.address.removeprefix("unix:")).exists()
        assert await backend.adopt("slow") is None
        # ... while its reap is under way: its files are still on the host, and its uid
        # range stays claimed by them until they are gone.
        [entry] = entries(data, "slow")
        assert claims_under(str(data / "reaping"))
        # The processes go first; then only the disk we hold keeps the reap from its end.
        assert wait_until(lambda: not alive(agent) and not cgroup_dirs(data, "slow"))
        [entry] = entries(data, "slow")
        assert entry.name.endswith(SEP + FILES) and (entry / "disk.img").exists()
    assert wait_until(lambda: not left_of(data, "slow", agent)), left_of(data, "slow", agent)
    assert not claims_under(str(data))


async def test_creates_never_wait_for_another_ids_reap(backend: LocalBackend) -> None:
    data = backend.data_dir
    await backend.create(SandboxSpec(sandbox_id="old", image="host", disk=DISK))
    with holding_disk(data / "sandboxes" / "old"):
        await backend.delete("old")
        async with asyncio.timeout(WAIT_S):  # waiting for the held reap would hang it
            await backend.create(SandboxSpec(sandbox_id="other", image="host"))
        assert await backend.adopt("other") is not None  # its agent is up
        # ... made while the reap of "old" was still under way.
        assert entries(data, "old")
    assert wait_until(lambda: not entries(data, "old"))


async def test_the_same_id_is_created_again_right_after_its_delete(
        backend: LocalBackend) -> None:
    data = backend.data_dir
    sdir = data / "sandboxes" / "again"
    first = await backend.create(SandboxSpec(sandbox_id="again", image="host", disk=DISK))
    old_uid = (sdir / "uid").read_text()
    with holding_disk(sdir):
        await backend.delete("again")
        async with asyncio.timeout(WAIT_S):  # waiting for all of the held reap would hang it
            second = await backend.create(SandboxSpec(sandbox_id="again", image="host"))
        assert second.address == first.address and await backend.adopt("again") is not None
        assert not (sdir / "disk.img").exists()
        # The create waited for the old sandbox's cgroups to go (the new ones carry the same
        # name), not for the rest of its reap: its files are still there, and so is the uid
        # range they are owned by, which the new sandbox did not get.
        [entry] = entries(data, "again")
        assert entry.name.endswith(SEP + FILES) and (entry / "uid").read_text() == old_uid
        assert (sdir / "uid").read_text() != old_uid
    assert wait_until(lambda: not entries(data, "again"))
    await backend.delete("again")
    assert wait_until(lambda: not entries(data, "again") and not cgroup_dirs(data, "again"))
    assert not claims_under(str(data))


async def test_a_create_cancelled_mid_step_leaves_nothing_once_deleted(
        backend: LocalBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    """A delete of a pending sandbox cancels its create (Lifecycle._teardown), then deletes.
    The cancel lands while the create's cgroup is being made on a thread; that thread must
    finish before the create undoes its work, or it makes the cgroup after the delete."""
    data = backend.data_dir
    entered, release, made = threading.Event(), threading.Event(), threading.Event()
    real = backend.cgroups.create

    def held(*args: object) -> object:
        entered.set()
        release.wait(WAIT_S)  # the test holds the step under way, as a busy host would
        try:
            return real(*args)
        finally:
            made.set()

    monkeypatch.setattr(backend.cgroups, "create", held)
    create = asyncio.create_task(backend.create(SandboxSpec(sandbox_id="cut", image="host")))
    assert await asyncio.to_thread(entered.wait, WAIT_S)
    create.cancel()
    asyncio.get_running_loop().call_later(0.2, release.set)
    with contextlib.suppress(asyncio.CancelledError):
        await create
    assert create.cancelled()
    await backend.delete("cut")
    assert await asyncio.to_thread(made.wait, WAIT_S)  # the cgroup was made ...
    # ... and nothing of the sandbox stays: no dir, no cgroup, no reap, no uid claim.
    assert wait_until(lambda: not cgroup_dirs(data, "cut") and not entries(data, "cut")
                      and not (data / "sandboxes" / "cut").exists()), cgroup_dirs(data, "cut")
    assert not claims_under(str(data))


def test_a_restart_finishes_a_reap_cut_short_by_sigkill(short: Path, tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "serve.log"
    data = short / "local"
    proc = _start_server(short, port, log)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            sid = create_ready(http, {"image": "host", "disk": DISK})
            agent = int((data / "sandboxes" / sid / "agent.pid").read_text())
            with holding_disk(data / "sandboxes" / sid):
                assert http.delete(f"/sandboxes/{sid}").status_code == 200
                assert wait_until(lambda: entries(data, sid), interval=0.01)
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
        # Killed mid-reap: its files and its uid range's claim are left.
        [entry] = entries(data, sid)
        assert (entry / "disk.img").exists() and claims_under(str(data / "reaping"))

        proc = _start_server(short, port, log)
        assert wait_until(lambda: not left_of(data, sid, agent)), left_of(data, sid, agent)
        assert not cgroup_dirs(data) and not claims_under(str(short))
    finally:
        proc.terminate()
        proc.wait(30)
    assert not glob.glob(f"/sys/fs/cgroup/*/{cgroup_group(data)}")


async def test_a_start_reaps_what_a_killed_orchestrator_left(short: Path) -> None:
    data = short / "local"
    first = LocalBackend(data)  # a standalone one's: its sandboxes outlive it
    await first.start()
    try:
        await first.create(SandboxSpec(sandbox_id="cut", image="host"))
        await first.create(SandboxSpec(sandbox_id="freed", image="host"))
        # Killed mid-delete, as SIGKILL could leave it: "cut" signalled and moved out of
        # sandboxes/, nothing reaped; "freed" reaped but for its uid range's claim.
        agent = int((data / "sandboxes" / "cut" / "agent.pid").read_text())
        first.cgroups.send_kill("cut")
        first.uid_ranges.move(data / "sandboxes" / "cut", data / "reaping" / f"cut{SEP}0")
        first.cgroups.kill("freed")
        first.uid_ranges.move(data / "sandboxes" / "freed", data / "reaping" / f"freed{SEP}0")
        os.rename(data / "reaping" / f"freed{SEP}0", short / "elsewhere")
        assert claims_under(str(data / "reaping")) and cgroup_dirs(data, "cut")
    finally:
        await first.close()

    second = LocalBackend(data)
    try:
        assert wait_until(lambda: not left_of(data, "cut", agent)), left_of(data, "cut", agent)
        assert not claims_under(str(data)) and not cgroup_dirs(data)
    finally:
        await second.close()
