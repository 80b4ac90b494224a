"""Attacks through the places the launch mounts on (issue 32's one-step launch).

The launcher is host root and mounts the bundle, the control dir, ``resolv.conf`` and ``/dev``
inside an image's root, making the mount points an image lacks. An image's author decides what
those places are: a symlink there must resolve inside the sandbox's root, as it would for the
sandbox itself, never on the host.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest

from tests.conftest import create_ready, needs_root, run
from tests.image_fixtures import make_busybox_rootfs

pytestmark = [needs_root, pytest.mark.root]


def test_an_images_symlinks_keep_the_launch_inside_its_root(http: httpx.Client,
                                                            tmp_path: Path) -> None:
    """``/.orchard`` and ``/workspace`` as absolute links to host paths, ``/etc/resolv.conf``
    as a link to a host file: the mount points are made, and the mounts land, in the root."""
    outside = tmp_path / "host"
    outside.mkdir()
    (outside / "resolv").write_text("# the host's file\n")
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    shutil.rmtree(rootfs / "workspace")
    (rootfs / "workspace").symlink_to(outside / "ws")
    (rootfs / ".orchard").symlink_to(outside / "orchard")
    (rootfs / "etc" / "resolv.conf").symlink_to(outside / "resolv")
    sid = create_ready(http, {"image": str(rootfs), "block_network": False})
    try:
        # The agent answers through the control dir it was given, at the link's target.
        r = run(http, sid, command="echo hi > /workspace/x && ls /.orchard && "
                                   "cat /etc/resolv.conf")
        assert r["exit_code"] == 0, r
        assert r["stdout"].splitlines()[:3] == ["browser", "bundle", "ctl"], r
        assert "the host's file" not in r["stdout"], r  # the sandbox's own resolver config
        # Nothing was made or mounted on the host's side of the links.
        assert sorted(p.name for p in outside.iterdir()) == ["resolv"]
        assert (outside / "resolv").read_text() == "# the host's file\n"
        assert str(outside) not in Path("/proc/self/mountinfo").read_text()
    finally:
        http.delete(f"/sandboxes/{sid}")


@pytest.mark.parametrize("name", ["dev", "proc"])
def test_an_image_whose_dev_or_proc_is_a_symlink_is_refused_clearly(
        http: httpx.Client, tmp_path: Path, name: str) -> None:
    """The launch mounts its own ``/dev`` and ``/proc``: a link there is refused, by name."""
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    (rootfs / name).rmdir()
    (rootfs / name).symlink_to("/tmp")
    r = http.post("/sandboxes", json={"image": str(rootfs)})
    assert r.status_code == 200, r.text
    sid = r.json()["sandbox_id"]
    try:
        w = http.get(f"/sandboxes/{sid}/wait", params={"timeout": 60}).json()
        assert w["status"] == "failed", w
        assert f"the image's /{name} is a symbolic link" in w["status_message"], w
        assert "remove it from the image" in w["status_message"], w
    finally:
        http.delete(f"/sandboxes/{sid}")
