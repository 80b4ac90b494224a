"""Deleting a sandbox, or stopping its orchestrator, leaves nothing of it on the host.

The whole session is checked too (tests/leakcheck.py); these tests check each step on its own,
and that the session check itself catches a leak.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from orchard.env.backends.local.host_state import cgroup_group
from orchard.env.server import EmbeddedOrchestrator
from tests.conftest import create_ready, needs_root, short_data_dir, wait_until
from tests.leakcheck import HostState, leaks_since

pytestmark = [needs_root, pytest.mark.root]
REPO = Path(__file__).resolve().parents[1]


def test_deleted_sandboxes_leave_nothing_while_the_orchestrator_runs(
        data_dir: Path, orchestrator: str) -> None:
    del orchestrator  # needed only for the bundle it built
    with short_data_dir(data_dir) as short, EmbeddedOrchestrator(data_dir=short) as url, \
            httpx.Client(base_url=url, timeout=120) as http:
        before = HostState.now()
        sids = [create_ready(http, body) for body in (
            {"image": "host"}, {"image": "host", "disk": "32Mi"},
            {"image": "host", "block_network": False})]
        group = cgroup_group(short / "local")
        during = HostState.now()
        # The check can fail: each kind of thing a sandbox holds is there while it lives.
        assert all(glob.glob(f"/sys/fs/cgroup/*/{group}/{sid}") for sid in sids)
        assert during.uid_claims - before.uid_claims
        assert during.loop_files - before.loop_files
        for sid in sids:
            assert http.delete(f"/sandboxes/{sid}").status_code == 200
        assert wait_until(lambda: http.get("/health").json()["sandboxes"] == 0, 20)
        sandboxes = short / "local" / "sandboxes"
        assert wait_until(lambda: not any(sandboxes.iterdir()), 20)
        # The orchestrator's own group, dir and zygote are still there: they are its.
        # Only what is this orchestrator's: other sessions may share the host.
        left = {kind: [i for i in items if str(short) in i]
                for kind, items in leaks_since(before).items() if kind != "cgroup groups"}
        assert not any(left.values()), left
        assert [p for g in glob.glob(f"/sys/fs/cgroup/*/{group}")
                for p in os.scandir(g) if p.is_dir()] == []


def test_a_stopped_orchestrator_leaves_no_cgroup_group(data_dir: Path, orchestrator: str) -> None:
    del orchestrator  # needed only for the bundle it built
    with short_data_dir(data_dir) as short:
        group = cgroup_group(short / "local")
        with EmbeddedOrchestrator(data_dir=short) as url, \
                httpx.Client(base_url=url, timeout=60) as http:
            sid = http.post("/sandboxes", json={"image": "host"}).json()["sandbox_id"]
            assert http.get(f"/sandboxes/{sid}/wait").status_code == 200
            assert glob.glob(f"/sys/fs/cgroup/*/{group}/{sid}")  # the check can fail
        assert glob.glob(f"/sys/fs/cgroup/*/{group}") == []


def test_the_session_check_fails_a_session_that_leaks(tmp_path: Path) -> None:
    leaked = tmp_path / "leaked-name"
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["tests.leakcheck"]\n')
    (tmp_path / "test_leaky.py").write_text(textwrap.dedent(f"""
        import tempfile
        from pathlib import Path

        def test_forgets_its_dir():
            made = tempfile.mkdtemp(prefix="/tmp/orc-leaky-")
            Path({str(leaked)!r}).write_text(made)
        """))
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
         str(tmp_path / "test_leaky.py")], capture_output=True, text=True, timeout=120,
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})
    made = leaked.read_text()
    try:
        assert r.returncode != 0, r.stdout
        assert "the test session left these behind" in r.stdout
        assert f"temp dirs: {made}" in r.stdout
    finally:
        os.rmdir(made)
