"""Images end to end: libc-less busybox rootfs, docker/oci archives, whiteouts, bad paths."""

from __future__ import annotations

import base64
from pathlib import Path

import httpx
import pytest

from tests.conftest import create_ready, needs_root, run
from tests.image_fixtures import make_busybox_rootfs, make_docker_archive, make_oci_archive

pytestmark = [needs_root, pytest.mark.root]


@pytest.fixture(scope="module")
def busybox(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_busybox_rootfs(tmp_path_factory.mktemp("busybox-e2e") / "rootfs")


def _basic_checks(http: httpx.Client, sid: str) -> None:
    r = run(http, sid, command="echo hi")
    assert r["exit_code"] == 0 and r["stdout"] == "hi\n", r
    listing = run(http, sid, command="ls /")["stdout"].split()
    assert {"bin", "etc", "workspace", "tmp", "proc"} <= set(listing), listing
    # No libc inside: the agent answering at all means it runs from the injected bundle.
    r = run(http, sid, command="ls /lib /lib64 /usr/lib 2>&1; echo; ls /bin/busybox")
    assert "libc.so" not in r["stdout"] and "/bin/busybox" in r["stdout"], r


def test_busybox_rootfs_without_libc(http: httpx.Client, busybox: Path) -> None:
    assert not [p for p in busybox.rglob("*") if p.name.startswith(("libc.so", "ld-linux"))]
    assert not (busybox / "lib").exists() and not (busybox / "usr/bin/python3").exists()
    sid = create_ready(http, {"image": str(busybox)})
    try:
        _basic_checks(http, sid)
        payload = bytes(range(256)) * 4
        r = http.post(f"/sandboxes/{sid}/files", json={
            "path": "/workspace/data.bin", "content": base64.b64encode(payload).decode()})
        assert r.status_code == 200 and r.json()["size"] == len(payload), r.text
        r = http.get(f"/sandboxes/{sid}/files", params={"path": "/workspace/data.bin"})
        assert r.status_code == 200 and base64.b64decode(r.json()["content"]) == payload
        r = http.put(f"/sandboxes/{sid}/files/raw", params={"path": "/workspace/raw.txt"},
                     content=b"raw upload\n")
        assert r.status_code == 200, r.text
        assert run(http, sid, command="cat /workspace/raw.txt")["stdout"] == "raw upload\n"
        r = http.get(f"/sandboxes/{sid}/files/raw", params={"path": "/workspace/raw.txt"})
        assert r.status_code == 200 and r.content == b"raw upload\n"
        r = http.get(f"/sandboxes/{sid}/files/list", params={"path": "/workspace"})
        assert {f["name"] for f in r.json()["files"]} == {"data.bin", "raw.txt"}
    finally:
        http.delete(f"/sandboxes/{sid}")


def test_an_image_in_the_image_dir(http: httpx.Client, data_dir: Path) -> None:
    """<data_dir>/images holds images with no setting. (The session's orchestrator also
    allows pytest's temp dir, but not the data dir inside it: only its image dir there.)"""
    rootfs = make_busybox_rootfs(data_dir / "images" / "busybox")
    sid = create_ready(http, {"image": str(rootfs)})
    try:
        assert run(http, sid, command="cat /etc/group")["stdout"] == "root:x:0:\n"
    finally:
        http.delete(f"/sandboxes/{sid}")


@pytest.mark.parametrize("kind", ["docker", "oci"])
def test_archive_images(http: httpx.Client, busybox: Path, tmp_path: Path, kind: str) -> None:
    make = make_docker_archive if kind == "docker" else make_oci_archive
    archive = make(busybox, tmp_path / f"busybox-{kind}.tar",
                   [{"etc/visible": b"v\n", "etc/hidden": b"h\n"}, {"etc/hidden": None}])
    sid = create_ready(http, {"image": str(archive)})
    try:
        _basic_checks(http, sid)
        assert run(http, sid, command="cat /etc/visible")["stdout"] == "v\n"
        r = run(http, sid, command="cat /etc/hidden; ls -a /etc")
        assert "h\n" not in r["stdout"] and "hidden" not in r["stdout"], r
        assert ".wh." not in r["stdout"]
    finally:
        http.delete(f"/sandboxes/{sid}")


def test_bad_image_path_fails_with_clear_error(http: httpx.Client, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-image.tar"
    r = http.post("/sandboxes", json={"image": str(missing)})
    if r.status_code == 400:
        assert str(missing) in r.json()["detail"]
        return
    assert r.status_code == 200, r.text
    sid = r.json()["sandbox_id"]
    try:
        w = http.get(f"/sandboxes/{sid}/wait", params={"timeout": 30})
        assert w.status_code == 200 and w.json()["status"] == "failed", w.text
        assert str(missing) in w.json()["status_message"]
        info = http.get(f"/sandboxes/{sid}").json()
        assert info["status"] == "failed" and str(missing) in info["error"], info
        e = http.post(f"/sandboxes/{sid}/exec", json={"command": "true"})
        assert e.status_code == 409 and "failed" in e.json()["detail"]
    finally:
        http.delete(f"/sandboxes/{sid}")


def test_garbage_archive_fails(http: httpx.Client, tmp_path: Path) -> None:
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"this is not a tar file at all" * 100)
    r = http.post("/sandboxes", json={"image": str(junk)})
    assert r.status_code in (200, 400), r.text
    if r.status_code == 200:
        sid = r.json()["sandbox_id"]
        try:
            w = http.get(f"/sandboxes/{sid}/wait", params={"timeout": 30})
            assert w.status_code == 200 and w.json()["status"] == "failed", w.text
            assert str(junk) in w.json()["status_message"], w.text
        finally:
            http.delete(f"/sandboxes/{sid}")


# Relative names that are no registry reference either ("relative/rootfs" is one: Docker
# Hub's relative/rootfs).
@pytest.mark.parametrize("image", ["./rootfs", "../img.tar", "Relative/Rootfs"])
def test_relative_image_path_rejected(http: httpx.Client, image: str) -> None:
    r = http.post("/sandboxes", json={"image": image})
    assert r.status_code == 400, r.text
    assert "absolute path" in r.json()["detail"]
