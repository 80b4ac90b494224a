"""Runs last (by name): once every sandbox is deleted, nothing of them may be left on the host.

Other orchestrators may run on this host at the same time (other checkouts, other sessions),
so processes, cgroups and mounts are attributed to this session by its data dir and its cgroup
group, never by a host-wide "anything named orchard".
"""

from __future__ import annotations

import glob
import hashlib
import os
from pathlib import Path

import httpx
import pytest

from tests.conftest import needs_root, wait_until

pytestmark = [needs_root, pytest.mark.root]


def _group_dirs(data_dir: Path) -> list[Path]:
    """This session's cgroup group in every hierarchy (one group per orchestrator data dir)."""
    key = hashlib.sha256(str((data_dir / "local").resolve()).encode()).hexdigest()[:12]
    found = glob.glob(f"/sys/fs/cgroup/*/orchard/{key}") + glob.glob(
        f"/sys/fs/cgroup/orchard/{key}")
    # A layout without per-data-dir groups puts sandboxes straight under orchard/.
    found = found or glob.glob("/sys/fs/cgroup/*/orchard") + glob.glob("/sys/fs/cgroup/orchard")
    return [Path(p) for p in found]


def _ours(pid: Path, data_dir: Path, groups: list[Path]) -> bool:
    """Whether a live process belongs to this session's sandboxes."""
    try:
        status = (pid / "status").read_text()
        cmdline = (pid / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        cgroup = (pid / "cgroup").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    if "State:\tZ" in status:  # a zombie runs nothing
        return False
    if "bwrap" not in cmdline and "orchard_agent" not in cmdline:
        return False
    if str(data_dir) in cmdline:
        return True
    rel = {"/" + "/".join(g.parts[g.parts.index("orchard"):]) for g in groups}
    return any(f":{r}/" in cgroup for r in rel)


def test_nothing_leaks_after_all_sandboxes_are_deleted(orchestrator: str,
                                                       data_dir: Path) -> None:
    with httpx.Client(base_url=orchestrator, timeout=60) as http:
        live = http.get("/sandboxes").json()["sandboxes"]
        for sb in live:
            r = http.delete(f"/sandboxes/{sb['sandbox_id']}")
            assert r.status_code == 200, r.text
        assert wait_until(lambda: http.get("/health").json()["sandboxes"] == 0, 20)
        assert http.get("/sandboxes").json()["sandboxes"] == []

    groups = _group_dirs(data_dir)
    assert groups, "this session never created a cgroup group"

    def leftover_processes() -> list[str]:
        return [p.name for p in Path("/proc").iterdir()
                if p.name.isdigit() and _ours(p, data_dir, groups)]

    def leftover_cgroups() -> list[str]:
        return [str(child) for g in groups if g.is_dir()
                for child in g.iterdir() if child.is_dir()]

    def leftover_mounts() -> list[str]:
        lines = Path("/proc/self/mounts").read_text().splitlines()
        return [m for m in lines if "orchard" in m and str(data_dir) in m]

    sandboxes_dir = data_dir / "local" / "sandboxes"

    def leftover_dirs() -> list[str]:
        return [p.name for p in sandboxes_dir.iterdir()] if sandboxes_dir.is_dir() else []

    assert wait_until(lambda: not leftover_processes(), 20, 0.2), leftover_processes()
    assert wait_until(lambda: not leftover_cgroups(), 20, 0.2), leftover_cgroups()
    assert not leftover_mounts(), leftover_mounts()
    assert wait_until(lambda: not leftover_dirs(), 20, 0.2), leftover_dirs()

    def leftover_uid_claims() -> list[str]:
        from orchard.env.backends.local.userns import REGISTRY
        claims = [os.readlink(p) for p in REGISTRY.iterdir()] if REGISTRY.is_dir() else []
        return [c for c in claims if c.startswith(str(data_dir.resolve()))]

    assert not leftover_uid_claims(), leftover_uid_claims()
    # Disk quotas: loop devices whose backing file was in a sandbox dir.
    from tests.test_disk_quota import loop_files
    assert wait_until(lambda: not loop_files(data_dir), 20, 0.2), loop_files(data_dir)
    # The group directories themselves stay, empty: no process was left in them.
    for g in groups:
        procs = (g / "cgroup.procs").read_text().split() if g.is_dir() else []
        assert procs == [], (g, procs)



def test_a_stopped_orchestrator_leaves_no_cgroup_group(data_dir: Path, orchestrator: str) -> None:
    from orchard.env.server import EmbeddedOrchestrator
    from tests.conftest import short_data_dir

    del orchestrator  # needed only for the bundle it built
    with short_data_dir(data_dir) as short:
        key = hashlib.sha256(str((short / "local").resolve()).encode()).hexdigest()[:12]
        with EmbeddedOrchestrator(data_dir=short) as url, \
                httpx.Client(base_url=url, timeout=60) as http:
            sid = http.post("/sandboxes", json={"image": "host"}).json()["sandbox_id"]
            assert http.get(f"/sandboxes/{sid}/wait").status_code == 200
            assert glob.glob(f"/sys/fs/cgroup/*/orchard/{key}/{sid}")  # the check can fail
        assert glob.glob(f"/sys/fs/cgroup/*/orchard/{key}") == []
