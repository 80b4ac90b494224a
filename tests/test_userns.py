"""Sandbox root is an unprivileged host uid: a user namespace per sandbox, its own uid range."""

from __future__ import annotations

import base64
import os
import shutil
from pathlib import Path

import httpx
import pytest

from orchard.env.backends.local.userns import FIRST_UID, RANGE_SIZE, REGISTRY
from tests.conftest import create_ready, needs_root, run, wait_until
from tests.image_fixtures import make_busybox_rootfs

pytestmark = [needs_root, pytest.mark.root]


@pytest.fixture(scope="module")
def busybox(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_busybox_rootfs(tmp_path_factory.mktemp("busybox-userns") / "rootfs")


def _sdir(data_dir: Path, sid: str) -> Path:
    return data_dir / "local" / "sandboxes" / sid


def _host_uids(pid: int | str) -> list[int]:
    """Real, effective, saved and fs uid of a host pid, as the host sees them."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return [int(u) for u in line.split()[1:]]
    raise AssertionError(f"no Uid line for {pid}")


def _host_uid_of(sid: str, data_dir: Path) -> int:
    uid = int((_sdir(data_dir, sid) / "uid").read_text())
    assert uid >= FIRST_UID and (uid - FIRST_UID) % RANGE_SIZE == 0, uid
    return uid


def test_root_inside_is_an_unprivileged_uid_on_the_host(http: httpx.Client, data_dir: Path
                                                       ) -> None:
    sid = create_ready(http, {"image": "host"})
    try:
        uid = _host_uid_of(sid, data_dir)
        r = run(http, sid, command="id -u; id -g; cat /proc/self/uid_map")
        assert r["exit_code"] == 0, r
        inside_uid, inside_gid, *mapping = r["stdout"].split()
        assert (inside_uid, inside_gid) == ("0", "0")
        assert [int(x) for x in mapping] == [0, uid, RANGE_SIZE]

        agent = (_sdir(data_dir, sid) / "agent.pid").read_text()
        assert _host_uids(agent) == [uid] * 4
        # A command, found on the host by its unique argv.
        marker = "4242.5"
        r = http.post(f"/sandboxes/{sid}/exec", json={"command": f"sleep {marker}",
                                                      "wait": False})
        assert r.status_code == 200, r.text

        def sleeper() -> list[str]:
            return [p.name for p in Path("/proc").iterdir() if p.name.isdigit()
                    and _cmdline(p) == f"sleep {marker}"]

        assert wait_until(lambda: len(sleeper()) == 1), sleeper()
        assert _host_uids(sleeper()[0]) == [uid] * 4
        # Host root's files are nobody's inside, and stay read-only to sandbox root.
        r = run(http, sid, command="stat -c %u:%g /usr/bin; touch /usr/bin/x")
        assert r["stdout"].split()[0] == "65534:65534" and r["exit_code"] != 0, r
    finally:
        http.delete(f"/sandboxes/{sid}")


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def test_files_land_in_upper_owned_by_the_sandbox_uid(http: httpx.Client, data_dir: Path
                                                      ) -> None:
    sid = create_ready(http, {"image": "host"})
    try:
        uid = _host_uid_of(sid, data_dir)
        upper = _sdir(data_dir, sid) / "upper"
        assert run(http, sid, command="echo made > /workspace/made; mkdir -p /root/d; "
                                      "touch /root/d/f /tmp/t /home/h")["exit_code"] == 0
        r = http.post(f"/sandboxes/{sid}/files", json={
            "path": "/workspace/sent/up.txt", "content": base64.b64encode(b"up").decode()})
        assert r.status_code == 200, r.text
        for rel in ("workspace/made", "root/d", "root/d/f", "tmp/t", "home/h",
                    "workspace/sent", "workspace/sent/up.txt", "."):
            st = os.lstat(upper / rel)
            assert (st.st_uid, st.st_gid) == (uid, uid), rel
        # Inside, all of it belongs to root.
        r = run(http, sid, command="stat -c %u:%g / /workspace/made /workspace/sent/up.txt")
        assert r["stdout"].split() == ["0:0"] * 3, r
    finally:
        http.delete(f"/sandboxes/{sid}")


def test_rootfs_image_files_are_writable_and_the_image_is_untouched(
        http: httpx.Client, busybox: Path, data_dir: Path) -> None:
    hosts = busybox / "etc" / "hosts"
    hosts.write_text("127.0.0.1 localhost\n")
    sid = create_ready(http, {"image": str(busybox)})
    try:
        uid = _host_uid_of(sid, data_dir)
        r = run(http, sid, command="stat -c %u /etc/hosts /bin; echo '10.0.0.1 x' >> /etc/hosts"
                                   " && echo new > /bin/tool && mkdir /opt && cat /etc/hosts")
        assert r["exit_code"] == 0, r
        assert r["stdout"].split()[:2] == ["0", "0"]  # image files are root's inside
        assert r["stdout"].endswith("127.0.0.1 localhost\n10.0.0.1 x\n"), r
        copied = _sdir(data_dir, sid) / "upper" / "etc" / "hosts"
        assert os.stat(copied).st_uid == uid
        assert hosts.read_text() == "127.0.0.1 localhost\n"
        assert not (busybox / "bin" / "tool").exists()
        assert os.stat(busybox / "etc").st_uid == 0  # the image is never re-owned
    finally:
        http.delete(f"/sandboxes/{sid}")


def test_each_sandbox_has_its_own_range_and_delete_releases_it(http: httpx.Client,
                                                              data_dir: Path) -> None:
    a = create_ready(http, {"image": "host"})
    b = create_ready(http, {"image": "host"})
    ua, ub = _host_uid_of(a, data_dir), _host_uid_of(b, data_dir)
    assert abs(ua - ub) >= RANGE_SIZE
    claims = {os.readlink(p) for p in REGISTRY.iterdir()}
    assert {str(_sdir(data_dir, s).resolve()) for s in (a, b)} <= claims
    # A sandbox cannot touch another's files: b's root is not a's root.
    r = run(http, a, command="id -u")
    assert r["stdout"] == "0\n"
    for sid in (a, b):
        assert http.delete(f"/sandboxes/{sid}").status_code == 200
    ours = {str(_sdir(data_dir, s).resolve()) for s in (a, b)}
    # Delete answers before the teardown finishes.
    assert wait_until(lambda: not ours & {os.readlink(p) for p in REGISTRY.iterdir()})


def test_stale_claims_are_reused_only_when_no_slot_is_free(tmp_path: Path) -> None:
    from orchard.env.backends.local import userns

    registry = tmp_path / "registry"
    ranges = userns.UidRanges(registry)
    gone, live = tmp_path / "gone", tmp_path / "live"
    for d in (gone, live):
        d.mkdir()
    assert ranges.claim(gone) == FIRST_UID
    assert ranges.claim(live) == FIRST_UID + RANGE_SIZE
    shutil.rmtree(gone)  # its owner vanished without releasing the claim
    newer = tmp_path / "newer"
    newer.mkdir()
    assert ranges.claim(newer) == FIRST_UID + 2 * RANGE_SIZE  # a free slot comes first
    ranges.release(newer, FIRST_UID + 2 * RANGE_SIZE)
    assert sorted(os.listdir(registry)) == ["0", "1"]
    old_slots = userns.SLOTS
    userns.SLOTS = 2
    try:
        again = tmp_path / "again"
        again.mkdir()
        assert ranges.claim(again) == FIRST_UID  # the stale one
        full = tmp_path / "full"
        full.mkdir()
        with pytest.raises(userns.UidRangeError, match="delete sandboxes"):
            ranges.claim(full)
    finally:
        userns.SLOTS = old_slots
