"""`disk` in the create request: a loop-mounted ext4 under the sandbox's writable layer."""

from __future__ import annotations

import glob
from pathlib import Path

import httpx
import pytest

from tests.conftest import create_ready, dedicated_orchestrator, needs_root, run, wait_until
from tests.leakcheck import loop_backing_files

pytestmark = [needs_root, pytest.mark.root]


def loop_files(under: Path) -> list[str]:
    """Backing files of this host's loop devices that lie under a directory."""
    return [f for f in loop_backing_files() if f.startswith(str(under))]


def test_writes_past_the_quota_fail_with_enospc(http: httpx.Client, data_dir: Path) -> None:
    sid = create_ready(http, {"image": "host", "disk": "48Mi"})
    sdir = data_dir / "local" / "sandboxes" / sid
    try:
        disk = http.get(f"/sandboxes/{sid}").json()["limits"]["disk"]
        assert disk["requested"] == "48Mi" and disk["enforced"] is True, disk
        assert loop_files(sdir) == [str(sdir / "disk.img")]
        r = run(http, sid, command="cat /dev/zero > /tmp/fill")
        assert r["exit_code"] != 0 and "No space left on device" in r["stderr"], r
        # Everything the sandbox writes counts, /workspace too, and freeing space works.
        r = run(http, sid, command="rm /tmp/fill && head -c 64M /dev/zero > /workspace/fill")
        assert r["exit_code"] != 0 and "No space left on device" in r["stderr"], r
        r = run(http, sid, command="rm /workspace/fill && echo more > /workspace/more && "
                                   "cat /workspace/more && stat -c %u /workspace/more")
        assert r["exit_code"] == 0 and r["stdout"] == "more\n0\n", r
        # The host's disk held only the sparse file's written blocks, not a copy per write.
        assert (sdir / "disk.img").stat().st_size == 48 << 20
    finally:
        http.delete(f"/sandboxes/{sid}")
    assert wait_until(lambda: not loop_files(sdir) and not sdir.exists()), loop_files(sdir)


def test_without_disk_nothing_changes(http: httpx.Client, data_dir: Path) -> None:
    sid = create_ready(http, {"image": "host"})
    sdir = data_dir / "local" / "sandboxes" / sid
    try:
        disk = http.get(f"/sandboxes/{sid}").json()["limits"]["disk"]
        assert disk["requested"] is None and disk["enforced"] is False, disk
        assert "no disk limit requested" in disk["detail"]
        assert run(http, sid, command="echo x > /workspace/x")["exit_code"] == 0
        assert (sdir / "upper" / "workspace" / "x").read_text() == "x\n"
        assert not (sdir / "disk.img").exists() and not loop_files(sdir)
    finally:
        http.delete(f"/sandboxes/{sid}")


@pytest.mark.parametrize(("disk", "message"), [
    ("1Mi", "below the minimum of 16Mi"),
    ("lots", "lots"),
])
def test_bad_disk_is_refused_with_a_reason(http: httpx.Client, disk: str, message: str) -> None:
    r = http.post("/sandboxes", json={"image": "host", "disk": disk})
    assert r.status_code == 400, r.text
    assert message in r.text


def test_a_stopped_orchestrator_leaves_no_loop_device(data_dir: Path, orchestrator: str
                                                      ) -> None:
    del orchestrator  # needed only for the bundle it built
    with dedicated_orchestrator(data_dir) as url, httpx.Client(base_url=url, timeout=60) as h:
        sid = create_ready(h, {"image": "host", "disk": "32Mi"})
        [sdir] = [Path(p) for p in glob.glob(f"/tmp/orc-*/local/sandboxes/{sid}")]
        assert loop_files(sdir)
    assert wait_until(lambda: not loop_files(sdir)), loop_files(sdir)
    assert not sdir.exists()
