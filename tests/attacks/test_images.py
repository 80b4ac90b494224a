"""Attacks through the local backend's images (findings 3 and 5 of issue 29).

An API caller names the image of a sandbox, and an image's author writes its layers. Neither
may make the host show its own files to a sandbox, nor make the unpacker change a host file:
an image path must lie in an image directory (symlinks resolved), and an image's layers are
applied without following a link they planted.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from orchard.env.server import EmbeddedOrchestrator
from tests.conftest import needs_root, run, short_data_dir
from tests.image_fixtures import layer_tar, make_busybox_rootfs, make_oci_archive

pytestmark = [needs_root, pytest.mark.root]


@pytest.fixture(scope="module")
def default_orchestrator(data_dir: Path, orchestrator: str) -> Iterator[tuple[httpx.Client, Path]]:
    """An orchestrator with the default image settings, and its data dir."""
    with short_data_dir(data_dir) as short, EmbeddedOrchestrator(
            data_dir=short, reconcile_interval=0.5) as url, \
            httpx.Client(base_url=url, timeout=60) as http:
        yield http, short


def _steal(http: httpx.Client, image: str, path: str) -> httpx.Response:
    """Start a sandbox on ``image`` and read ``path`` in it, as the reviewer did. Returns the
    refusal; fails if the file came back."""
    r = http.post("/sandboxes", json={"image": image})
    if r.status_code != 200:
        return r
    sid = r.json()["sandbox_id"]
    try:
        w = http.get(f"/sandboxes/{sid}/wait", params={"timeout": 60})
        if w.status_code == 200 and w.json()["status"] == "running":
            got = http.get(f"/sandboxes/{sid}/files/raw", params={"path": path})
            pytest.fail(f"image {image} was accepted and {path} read back "
                        f"({got.status_code}): {got.content[:200]!r}")
        pytest.fail(f"image {image} was accepted (the sandbox then {w.text}); it must be "
                    "refused at create")
    finally:
        http.delete(f"/sandboxes/{sid}")


def _assert_refused(r: httpx.Response, rule: str) -> None:
    assert r.status_code == 403, r.text
    detail = r.json()["detail"]
    assert rule in detail and "images.allowed_paths" in detail, detail


def test_a_host_directory_is_not_an_image(
        default_orchestrator: tuple[httpx.Client, Path]) -> None:
    """The reviewer's attack: /etc as the image, then its files read from the sandbox."""
    http, _ = default_orchestrator
    _assert_refused(_steal(http, "/etc", "/passwd"), "outside the image directories")
    # Dots do not get it past the rule either.
    _assert_refused(_steal(http, "/usr/../etc", "/passwd"), "outside the image directories")


def test_a_symlink_in_the_image_dir_does_not_lead_out_of_it(
        default_orchestrator: tuple[httpx.Client, Path], tmp_path: Path) -> None:
    """A link under an allowed image dir that points at a directory outside it."""
    http, data = default_orchestrator
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    (decoy / "secret").write_text("host-secret\n")
    link = data / "images" / f"evil-{tmp_path.name}"
    link.parent.mkdir(exist_ok=True)
    link.symlink_to(decoy)
    try:
        r = _steal(http, str(link), "/secret")
        _assert_refused(r, "outside the image directories")
        assert str(decoy) in r.json()["detail"]  # says where the link really leads
    finally:
        link.unlink()


def test_the_data_dir_is_not_an_image_even_under_an_allowed_path(
        http: httpx.Client, data_dir: Path) -> None:
    """The session's orchestrator allows pytest's whole temp dir, which holds its data dir:
    that still must not let a sandbox read the state db, the agents' key or another
    sandbox's files."""
    local = data_dir / "local"
    for image, path in ((data_dir, "/state.db"), (local, "/agent.secret"),
                        (local / "sandboxes", "/")):
        assert (image / path.lstrip("/")).exists()
        _assert_refused(_steal(http, str(image), path), "orchestrator's own directory")


# --- finding 5: a layer that swaps a directory for a symlink ---------------------------------


def _dir(name: str, mode: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, 0
    return info


def test_a_layer_cannot_chmod_through_a_symlink_it_planted(
        http: httpx.Client, tmp_path: Path) -> None:
    """``x/``, ``x/etc/`` (0777), then ``x`` as a symlink: the unpacker used to set the
    directory modes last, by path, and so chmodded ``<link target>/etc``. The reviewer's
    link pointed at ``/``; here it points at a decoy the test made."""
    decoy = tmp_path / "decoy"
    (decoy / "etc").mkdir(parents=True)
    (decoy / "etc").chmod(0o755)
    before = (decoy / "etc").stat()
    link = tarfile.TarInfo("x")
    link.type, link.linkname = tarfile.SYMTYPE, str(decoy)
    evil = layer_tar([(_dir("x", 0o755), None), (_dir("x/etc", 0o777), None), (link, None)])
    busybox = make_busybox_rootfs(tmp_path / "busybox")
    archive = make_oci_archive(busybox, tmp_path / "evil.tar", [evil])

    r = http.post("/sandboxes", json={"image": str(archive)})
    assert r.status_code == 200, r.text
    sid = r.json()["sandbox_id"]
    try:
        w = http.get(f"/sandboxes/{sid}/wait", params={"timeout": 60})
        after = (decoy / "etc").stat()
        assert oct(after.st_mode & 0o7777) == oct(0o755), "the unpacker chmodded the decoy"
        assert after.st_mtime == before.st_mtime, "the unpacker set the decoy's mtime"
        # The image still works: x is the layer's symlink, inside the sandbox's own root.
        assert w.status_code == 200 and w.json()["status"] == "running", w.text
        assert run(http, sid, command="readlink /x")["stdout"] == f"{decoy}\n"
    finally:
        http.delete(f"/sandboxes/{sid}")
    assert oct(os.stat(decoy / "etc").st_mode & 0o7777) == oct(0o755)
