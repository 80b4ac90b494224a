"""Images by name on the local backend, against real registries the tests start (Debian's
docker-registry on loopback): pulls, auth, mirrors, every error cause, progress, the cache."""

from __future__ import annotations

import base64
import contextlib
import http.server
import os
import re
import subprocess
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from orchard.env.client import ImagePullFailed, SandboxClient
from orchard.env.server import EmbeddedOrchestrator
from tests.conftest import (
    create_ready,
    dedicated_orchestrator,
    needs_root,
    run,
    short_data_dir,
    wait_until,
)
from tests.image_fixtures import make_busybox_rootfs
from tests.registry import Registry, push_rootfs, running_registry

pytestmark = [needs_root, pytest.mark.root]
Fresh = Callable[..., str]


@pytest.fixture(scope="module")
def busybox(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_busybox_rootfs(tmp_path_factory.mktemp("pull-busybox") / "rootfs")


@pytest.fixture()
def fresh(registry: Registry, busybox: Path) -> Fresh:
    """Pushes a new image: busybox and a layer of random bytes (a digest no cache has seen)."""
    def push(name: str, size: int = 64 << 10, to: Registry = registry, **options: object
             ) -> str:
        layer = {"data/blob": os.urandom(size)}
        return push_rootfs(to, busybox, name, "1", extra_layers=[layer], **options)
    return push


def _layers(registry: Registry, ref: str) -> list[str]:
    name, tag = ref.split("/", 1)[1].rsplit(":", 1)
    return [layer["digest"] for layer in registry.manifest(name, tag)["layers"]]


def _store_is_clean(images: Path) -> list[str]:
    """What a failed pull left in the image store besides lock files (nothing, if clean)."""
    left = []
    for path in images.rglob("*"):
        rel = path.relative_to(images).as_posix()
        if path.name.endswith(".lock") or rel in (".pulls", "refs") or rel.startswith("refs/"):
            continue
        if rel.startswith("sha256-") and (images / rel.split("/")[0] / "rootfs").is_dir():
            continue  # a complete image of an earlier test
        left.append(rel)
    return left


def _wait(http: httpx.Client, sid: str) -> dict:
    r = http.get(f"/sandboxes/{sid}/wait", params={"timeout": 60})
    assert r.status_code == 200, r.text
    return r.json()


# --- pulls ---------------------------------------------------------------------------------


def test_pull_by_name_runs_with_the_image_env(http: httpx.Client, busybox_image: str) -> None:
    sid = create_ready(http, {"image": busybox_image, "env": {"MINE": "1"}})
    try:
        r = run(http, sid, command="echo hi from $(cat /etc/group); echo $PATH $MINE")
        assert r["exit_code"] == 0, r
        assert r["stdout"] == "hi from root:x:0:\n/usr/local/bin:/usr/bin:/bin 1\n", r
        # The create's env wins over the image's.
        sid2 = create_ready(http, {"image": busybox_image, "env": {"PATH": "/bin"}})
        assert run(http, sid2, command="echo $PATH")["stdout"] == "/bin\n"
        http.delete(f"/sandboxes/{sid2}")
    finally:
        http.delete(f"/sandboxes/{sid}")


def test_bash_image(http: httpx.Client, bash_image: str) -> None:
    sid = create_ready(http, {"image": bash_image})
    try:
        r = run(http, sid, argv=["bash", "-c", "echo ${BASH_VERSINFO[0]}; ls /bin/bash"])
        assert r["exit_code"] == 0 and int(r["stdout"].split()[0]) >= 4, r
    finally:
        http.delete(f"/sandboxes/{sid}")


def test_a_second_create_reuses_the_store(orchestrator: str, data_dir: Path,
                                          fresh: Fresh) -> None:
    """Pulled once; the next create needs no registry at all (it is stopped)."""
    with running_registry() as registry, dedicated_orchestrator(data_dir) as url, \
            httpx.Client(base_url=url, timeout=60) as http:
        ref = fresh("orchard/reuse", to=registry)
        first = create_ready(http, {"image": ref})
        assert [registry.blob_fetches(d) for d in _layers(registry, ref)] == [1, 1]
        registry.stop()
        second = create_ready(http, {"image": ref})
        assert run(http, second, command="cat /etc/group")["stdout"] == "root:x:0:\n"
        listing = http.get("/images").json()
        [image] = [i for i in listing["images"] if ref in i["refs"]]
        assert sorted(image["sandboxes"]) == sorted([first, second]), image
        assert image["size_bytes"] > 64 << 10 and image["last_used"], image
        assert image["config"]["env"] == {"PATH": "/bin"}, image  # the fixture's config


def test_concurrent_creates_pull_once(http: httpx.Client, registry: Registry,
                                      fresh: Fresh) -> None:
    ref = fresh("orchard/concurrent", size=1 << 20)
    with ThreadPoolExecutor(6) as pool:
        sids = list(pool.map(lambda _: create_ready(http, {"image": ref}), range(6)))
    try:
        assert [registry.blob_fetches(d) for d in _layers(registry, ref)] == [1, 1]
        assert all(run(http, s, command="test -s /data/blob")["exit_code"] == 0 for s in sids)
    finally:
        for sid in sids:
            http.delete(f"/sandboxes/{sid}")


def test_by_digest_and_multi_arch(http: httpx.Client, registry: Registry,
                                  busybox_image: str, fresh: Fresh) -> None:
    ref = fresh("orchard/multi", architectures=["arm64", "amd64"])
    index = registry.manifest("orchard/multi", "1")
    assert "manifests" in index  # a real index: the host's manifest is picked from it
    by_digest = f"{ref.rsplit(':', 1)[0]}@{registry.manifest_digest('orchard/multi', '1')}"
    sid = create_ready(http, {"image": by_digest})
    try:
        assert run(http, sid, command="cat /etc/arch")["stdout"] == "amd64"
    finally:
        http.delete(f"/sandboxes/{sid}")


# --- auth and mirrors -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def private_registry() -> Iterator[Registry]:
    with running_registry(users={"alice": "s3cret"}) as registry:
        yield registry


def test_auth_refused_without_credentials(http: httpx.Client, private_registry: Registry,
                                          fresh: Fresh) -> None:
    ref = fresh("orchard/private", to=private_registry)
    r = http.post("/sandboxes", json={"image": ref})
    assert r.status_code == 401, r.text
    assert ref in r.json()["detail"] and "unauthorized" in r.json()["detail"], r.text
    assert "images.registries" in r.json()["detail"]  # says how to log in


@pytest.mark.parametrize("where", ["docker_config", "orchard_yaml"])
def test_auth_with_credentials(orchestrator: str, data_dir: Path, tmp_path: Path,
                               private_registry: Registry, where: str, fresh: Fresh) -> None:
    ref = fresh(f"orchard/private-{where.replace('_', '-')}", to=private_registry)
    if where == "docker_config":
        config = tmp_path / "config.json"
        auth = base64.b64encode(b"alice:s3cret").decode()
        config.write_text(f'{{"auths": {{"{private_registry.host}": {{"auth": "{auth}"}}}}}}')
        images = {"docker_config": str(config)}
    else:
        images = {"registries": {private_registry.host: {"username": "alice",
                                                          "password": "s3cret"}}}
    with dedicated_orchestrator(data_dir, images=images) as url, \
            httpx.Client(base_url=url, timeout=60) as http:
        sid = create_ready(http, {"image": ref})
        assert run(http, sid, command="test -s /data/blob")["exit_code"] == 0


def test_wrong_password_is_401(orchestrator: str, data_dir: Path, private_registry: Registry,
                               fresh: Fresh) -> None:
    ref = fresh("orchard/private-wrong", to=private_registry)
    images = {"registries": {private_registry.host: {"username": "alice", "password": "no"}}}
    with dedicated_orchestrator(data_dir, images=images) as url:
        r = httpx.post(f"{url}/sandboxes", json={"image": ref}, timeout=60)
        assert r.status_code == 401, r.text


def test_pull_through_mirror(orchestrator: str, data_dir: Path, registry: Registry,
                             fresh: Fresh) -> None:
    """A Docker Hub name served by the mirror: the name is docker.io's, the bytes loopback's.
    (The image is in the mirror, so nothing falls through to docker.io.)"""
    fresh("library/orchard-mirrored")
    with dedicated_orchestrator(data_dir, images={"mirrors": {"docker.io": [registry.host]}}
                                ) as url, httpx.Client(base_url=url, timeout=60) as http:
        sid = create_ready(http, {"image": "orchard-mirrored:1"})
        assert run(http, sid, command="test -s /data/blob")["exit_code"] == 0
        refs = [r for i in http.get("/images").json()["images"] for r in i["refs"]]
        assert "docker.io/library/orchard-mirrored:1" in refs, refs


# --- errors at create -------------------------------------------------------------------------


def test_unknown_name_and_tag_are_404(http: httpx.Client, registry: Registry,
                                      busybox_image: str) -> None:
    r = http.post("/sandboxes", json={"image": registry.ref("orchard/nothing-here", "1")})
    assert r.status_code == 404, r.text
    assert "unknown repository 'orchard/nothing-here'" in r.json()["detail"], r.text
    r = http.post("/sandboxes", json={"image": busybox_image.replace(":1", ":nope")})
    assert r.status_code == 404, r.text
    assert "unknown tag 'nope'" in r.json()["detail"] and "has: 1" in r.json()["detail"]


def test_registry_down_is_502(http: httpx.Client) -> None:
    with running_registry() as registry:
        ref = registry.ref("orchard/gone", "1")
    r = http.post("/sandboxes", json={"image": ref})
    assert r.status_code == 502, r.text
    assert ref in r.json()["detail"] and "registry unavailable" in r.json()["detail"]


def test_no_manifest_for_this_platform_is_422(http: httpx.Client, fresh: Fresh) -> None:
    ref = fresh("orchard/other-arch", architectures=["arm64", "s390x"])
    r = http.post("/sandboxes", json={"image": ref})
    assert r.status_code == 422, r.text
    assert "no manifest for linux/amd64" in r.json()["detail"], r.text
    assert "linux/arm64, linux/s390x" in r.json()["detail"]


def test_malformed_reference_is_400(http: httpx.Client) -> None:
    r = http.post("/sandboxes", json={"image": "Not/A:Valid:Ref"})
    assert r.status_code == 400, r.text


# --- errors while pulling ---------------------------------------------------------------------


def test_digest_mismatch_fails_the_sandbox_and_keeps_nothing(
        orchestrator: str, http: httpx.Client, registry: Registry, data_dir: Path,
        fresh: Fresh) -> None:
    ref = fresh("orchard/tampered", size=256 << 10)
    layer = _layers(registry, ref)[-1]
    blob = registry.blob_data(layer)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other bytes
    blob.write_bytes(bytes(data))
    r = http.post("/sandboxes", json={"image": ref})
    assert r.status_code == 200, r.text  # the manifest is sound; the layer is not
    info = _wait(http, r.json()["sandbox_id"])
    # A failed record stays until deleted; the session orchestrator's later tests expect none.
    http.delete(f"/sandboxes/{info['sandbox_id']}")
    assert info["status"] == "failed" and info["image_error"] == "digest_mismatch", info
    assert ref in info["status_message"], info
    with SandboxClient(orchestrator) as client, pytest.raises(ImagePullFailed) as caught:
        client.create_sandbox(ref)
    http.delete(f"/sandboxes/{caught.value.sandbox_id}")
    assert caught.value.cause == "digest_mismatch" and caught.value.image == ref
    r = http.post("/images/pull", json={"image": ref})
    assert r.status_code == 422 and "digest" in r.json()["detail"], r.text
    assert _store_is_clean(data_dir / "local" / "images") == []


@contextlib.contextmanager
def _tiny_store(session_data: Path, size: str) -> Iterator[Path]:
    """A data dir whose image store is a tmpfs of ``size``."""
    with short_data_dir(session_data) as short:
        images = short / "local" / "images"
        images.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(images)],
                       check=True)
        try:
            yield short
        finally:
            subprocess.run(["umount", "-l", str(images)], check=True)


def test_disk_full_is_507_and_keeps_nothing(orchestrator: str, data_dir: Path,
                                            fresh: Fresh) -> None:
    ref = fresh("orchard/too-big", size=6 << 20)
    with _tiny_store(data_dir, "2m") as short, \
            EmbeddedOrchestrator(data_dir=short, reconcile_interval=0.5) as url, \
            httpx.Client(base_url=url, timeout=60) as http:
        r = http.post("/images/pull", json={"image": ref})
        assert r.status_code == 507, r.text
        assert ref in r.json()["detail"] and "disk full" in r.json()["detail"], r.text
        r = http.post("/sandboxes", json={"image": ref})
        assert r.status_code == 200, r.text
        info = _wait(http, r.json()["sandbox_id"])
        assert info["status"] == "failed" and info["image_error"] == "disk_full", info
        assert _store_is_clean(short / "local" / "images") == []


class _GatedRegistry:
    """A loopback proxy to a registry that holds every blob half-sent until released (or
    cut: the connection drops and the proxy goes away, as a registry that dies mid-pull)."""

    def __init__(self, upstream: Registry) -> None:
        self.release, self.cut, self.holding = (threading.Event() for _ in range(3))
        gate = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                # skopeo sends one Accept header per manifest type it reads.
                headers = {"accept": ", ".join(self.headers.get_all("accept") or [])}
                r = httpx.get(f"http://{upstream.host}{self.path}", headers=headers)
                self.send_response(r.status_code)
                for key in ("content-type", "docker-content-digest", "www-authenticate"):
                    if key in r.headers:
                        self.send_header(key, r.headers[key])
                self.send_header("content-length", str(len(r.content)))
                self.end_headers()
                half = len(r.content) // 2 if "/blobs/" in self.path else len(r.content)
                self.wfile.write(r.content[:half])
                self.wfile.flush()
                if half < len(r.content):
                    gate.holding.set()
                    while not gate.release.wait(0.05):
                        if gate.cut.is_set():
                            return  # the connection closes with half a blob sent
                    self.wfile.write(r.content[half:])

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.cut.set()
        self.server.shutdown()
        self.server.server_close()


def test_progress_while_pending_then_ready(http: httpx.Client, registry: Registry,
                                           fresh: Fresh) -> None:
    ref = fresh("orchard/slow", size=3 << 20)
    gate = _GatedRegistry(registry)
    try:
        proxied = ref.replace(registry.host, gate.host)
        r = http.post("/sandboxes", json={"image": proxied})
        assert r.status_code == 200, r.text
        sid = r.json()["sandbox_id"]
        assert gate.holding.wait(30), "the pull never asked for a blob"
        shape = re.compile(rf"^pulling {re.escape(proxied)}: \d+\.\d/\d+\.\d MB, 0/2 layers$")

        def progress() -> bool:
            info = http.get(f"/sandboxes/{sid}").json()
            return info["status"] == "pending" and bool(shape.match(info["status_message"] or ""))

        assert wait_until(progress), http.get(f"/sandboxes/{sid}").json()
        gate.release.set()
        info = _wait(http, sid)
        assert info["status"] == "running" and info["status_message"] is None, info
        http.delete(f"/sandboxes/{sid}")
    finally:
        gate.close()


def test_registry_gone_mid_pull_fails_the_sandbox(http: httpx.Client, registry: Registry,
                                                  data_dir: Path, fresh: Fresh) -> None:
    ref = fresh("orchard/cut", size=1 << 20)
    gate = _GatedRegistry(registry)
    proxied = ref.replace(registry.host, gate.host)
    try:
        r = http.post("/sandboxes", json={"image": proxied})
        assert r.status_code == 200, r.text
        assert gate.holding.wait(30), "the pull never asked for a blob"
    finally:
        gate.close()
    info = _wait(http, r.json()["sandbox_id"])
    http.delete(f"/sandboxes/{info['sandbox_id']}")
    assert info["status"] == "failed" and info["image_error"] == "registry_unavailable", info
    assert proxied in info["status_message"], info
    assert _store_is_clean(data_dir / "local" / "images") == []


# --- the cache ------------------------------------------------------------------------------


def test_cache_ls_rm_prune_and_lru_cap(orchestrator: str, data_dir: Path,
                                       fresh: Fresh) -> None:
    refs = [fresh(f"orchard/lru-{n}", size=3 << 20) for n in "abc"]
    with dedicated_orchestrator(data_dir, images={"max_cache_bytes": 12 << 20}) as url, \
            httpx.Client(base_url=url, timeout=60) as http:
        def names() -> set[str]:
            return {r for i in http.get("/images").json()["images"] for r in i["refs"]}

        sid = create_ready(http, {"image": refs[0]})
        assert http.post("/images/pull", json={"image": refs[1]}).status_code == 200
        r = http.delete(f"/images/{refs[0]}")
        assert r.status_code == 409 and sid in r.json()["detail"], r.text
        http.delete(f"/sandboxes/{sid}")
        assert wait_until(lambda: http.get(f"/sandboxes/{sid}").json()["status"] == "deleted")
        # Each is 5 MB (busybox and 3 MB): three pass the 12 MiB cap, and the least
        # recently used one that no sandbox runs on goes.
        assert http.post("/images/pull", json={"image": refs[2]}).status_code == 200
        assert names() == {refs[1], refs[2]}
        listing = http.get("/images").json()
        assert listing["max_bytes"] == 12 << 20 and listing["total_bytes"] <= 12 << 20
        r = http.delete(f"/images/{refs[1]}")
        assert r.status_code == 200 and r.json()["freed_bytes"] > 3 << 20, r.text
        assert http.delete(f"/images/{refs[1]}").status_code == 404
        assert http.post("/images/prune").json()["removed"]
        assert names() == set()


def test_cli_image_commands(orchestrator: str, registry: Registry, fresh: Fresh) -> None:
    from tests.test_cli_e2e import ORCHARD, cli_env

    ref = fresh("orchard/cli")

    def orchard(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(ORCHARD), *args], capture_output=True, text=True,
                              timeout=120, env=cli_env(orchestrator))

    r = orchard("sandbox", "create", ref)
    assert r.returncode == 0, r.stderr
    sid = r.stdout.strip()
    r = orchard("image", "ls")
    assert r.returncode == 0 and ref in r.stdout and sid in r.stdout, r.stdout
    r = orchard("image", "rm", ref)
    assert r.returncode == 1 and "in use by sandbox" in r.stderr, r.stderr
    assert orchard("sandbox", "rm", sid).returncode == 0
    r = orchard("image", "pull", ref)
    assert r.returncode == 0 and r.stdout.startswith(f"{ref} sha256:"), r.stdout
    r = orchard("image", "rm", ref)
    assert r.returncode == 0 and r.stdout.startswith("sha256:"), (r.stdout, r.stderr)
    r = orchard("image", "pull", registry.ref("orchard/nothing-here", "1"))
    assert r.returncode == 1 and "unknown repository" in r.stderr, r.stderr
    assert orchard("image", "prune").returncode == 0


def test_allowed_registries(orchestrator: str, data_dir: Path, busybox_image: str) -> None:
    with dedicated_orchestrator(data_dir, images={"allowed_registries": ["ghcr.io"]}) as url:
        r = httpx.post(f"{url}/sandboxes", json={"image": busybox_image}, timeout=60)
        assert r.status_code == 403 and "images.allowed_registries" in r.json()["detail"], r.text
        r = httpx.post(f"{url}/images/pull", json={"image": "python:3"}, timeout=60)
        assert r.status_code == 403 and "docker.io" in r.json()["detail"], r.text
