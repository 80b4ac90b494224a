"""A real OCI registry for tests and benches: Debian's ``docker-registry`` (the CNCF
distribution server) on a free loopback port, and images pushed into it with ``skopeo``.

Tests get it through the fixtures below (conftest lists this module as a plugin):

* ``registry``: an anonymous registry shared by the session;
* ``busybox_image`` / ``bash_image``: references (``127.0.0.1:PORT/orchard/busybox:1``,
  ``.../orchard/bash:1``) of two ready-made images in it: busybox's applets with ``sh``, and
  the host's ``bash`` with its libraries over busybox's coreutils.

Anything else (benches, other tests) uses :func:`running_registry`, :meth:`Registry.push`,
:func:`push_rootfs`, :func:`push_files`, :func:`make_bash_rootfs` directly. A loopback
registry needs no setting: the local backend speaks plain HTTP to loopback registries, as
Docker does.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import dies_with_the_tests, free_port, wait_until
from tests.image_fixtures import Layer, make_busybox_rootfs, make_oci_layout

__all__ = [
    "Registry",
    "make_bash_rootfs",
    "push_files",
    "push_rootfs",
    "running_registry",
]

REGISTRY_BIN = "/usr/bin/docker-registry"
_START_TIMEOUT_S = 30.0


@dataclass
class Registry:
    """A running registry: ``host`` is ``127.0.0.1:PORT``; ``storage`` its blobs on disk."""

    host: str
    storage: Path
    users: dict[str, str]
    config: Path
    proc: subprocess.Popen[bytes] | None = None

    def ref(self, name: str, tag: str = "latest") -> str:
        return f"{self.host}/{name}:{tag}"

    def push(self, layout: Path, name: str, tag: str = "latest") -> str:
        """Copy an OCI layout (its only image) to ``name:tag``; returns the reference."""
        ref = self.ref(name, tag)
        creds: list[str] = []
        if self.users:
            user, password = next(iter(self.users.items()))
            creds = [f"--dest-creds={user}:{password}"]
        subprocess.run(
            ["skopeo", "--insecure-policy", "copy", "--quiet", "--dest-tls-verify=false",
             *creds, "--all", f"oci:{layout}", f"docker://{ref}"],
            check=True, capture_output=True, timeout=300)
        return ref

    def _raw_manifest(self, name: str, tag: str) -> bytes:
        creds = [f"--creds={u}:{p}" for u, p in list(self.users.items())[:1]]
        return subprocess.run(
            ["skopeo", "inspect", "--raw", "--tls-verify=false", *creds,
             f"docker://{self.ref(name, tag)}"], check=True, capture_output=True,
            timeout=60).stdout

    def manifest(self, name: str, tag: str = "latest") -> dict[str, Any]:
        """The manifest (or index) ``name:tag`` names."""
        return json.loads(self._raw_manifest(name, tag))

    def manifest_digest(self, name: str, tag: str = "latest") -> str:
        return "sha256:" + hashlib.sha256(self._raw_manifest(name, tag)).hexdigest()

    def blob_data(self, digest: str) -> Path:
        """Where the registry keeps a blob's bytes (to tamper with it)."""
        algo, hexdigest = digest.split(":", 1)
        return (self.storage / "docker/registry/v2/blobs" / algo / hexdigest[:2] / hexdigest
                / "data")

    def blob_fetches(self, digest: str) -> int:
        """How many times the blob was served (from the access log): a pull's count."""
        log = (self.storage.parent / "registry.log").read_text(errors="replace")
        return sum(1 for line in log.splitlines()
                   if f"/blobs/{digest} " in line and '"GET ' in line and '" 200 ' in line)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def start(self) -> None:
        """(Re)start the server on the same port and storage."""
        self.stop()
        log = open(self.storage.parent / "registry.log", "ab")  # noqa: SIM115 - child keeps it
        with log:
            self.proc = subprocess.Popen(
                [REGISTRY_BIN, "serve", str(self.config)], stdin=subprocess.DEVNULL,
                stdout=log, stderr=log, preexec_fn=dies_with_the_tests)
        if not wait_until(self._answers, _START_TIMEOUT_S):
            self.stop()
            text = (self.storage.parent / "registry.log").read_text(errors="replace")
            raise RuntimeError(f"docker-registry did not answer on {self.host}:\n{text[-2000:]}")

    def _answers(self) -> bool:
        try:
            return httpx.get(f"http://{self.host}/v2/", timeout=1).status_code in (200, 401)
        except httpx.TransportError:
            return False


def _htpasswd(users: Mapping[str, str], path: Path) -> None:
    lines = [subprocess.run(["htpasswd", "-nbB", user, password], check=True,
                            capture_output=True, text=True).stdout.strip()
             for user, password in users.items()]
    path.write_text("\n".join(lines) + "\n")


@contextlib.contextmanager
def running_registry(workdir: Path | None = None,
                     users: Mapping[str, str] | None = None) -> Iterator[Registry]:
    """A registry on a free loopback port, storing under ``workdir`` (a temp dir if None);
    with ``users`` (name -> password) it asks for basic auth. Stopped on exit."""
    owned = workdir is None
    root = Path(tempfile.mkdtemp(prefix="orchard-registry-")) if workdir is None else workdir
    try:
        storage = root / "storage"
        storage.mkdir(parents=True, exist_ok=True)
        host = f"127.0.0.1:{free_port()}"
        auth = ""
        if users:
            _htpasswd(users, root / "htpasswd")
            auth = f"auth:\n  htpasswd:\n    realm: orchard-test\n    path: {root / 'htpasswd'}\n"
        config = root / "config.yml"
        # No blob-descriptor cache: a test that tampers with a blob on disk sees it served.
        config.write_text(
            "version: 0.1\n"
            "log:\n  level: warn\n  accesslog:\n    disabled: false\n"
            f"storage:\n  filesystem:\n    rootdirectory: {storage}\n"
            "  delete:\n    enabled: true\n"
            "  maintenance:\n    uploadpurging:\n      enabled: false\n"
            f"http:\n  addr: {host}\n{auth}")
        registry = Registry(host=host, storage=storage, users=dict(users or {}), config=config)
        registry.start()
        try:
            yield registry
        finally:
            registry.stop()
    finally:
        if owned:
            shutil.rmtree(root, ignore_errors=True)


def make_bash_rootfs(dest: Path) -> Path:
    """A busybox rootfs plus the host's bash and the shared libraries it loads."""
    make_busybox_rootfs(dest)
    bash = Path(shutil.which("bash") or "/bin/bash").resolve()
    (dest / "bin/bash").unlink(missing_ok=True)
    shutil.copy2(bash, dest / "bin/bash")
    out = subprocess.run(["ldd", str(bash)], check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        # "libtinfo.so.6 => /lib/x86_64-linux-gnu/libtinfo.so.6 (0x...)" or
        # "/lib64/ld-linux-x86-64.so.2 (0x...)"; the vdso has no file.
        parts = line.split()
        path = parts[2] if "=>" in parts and len(parts) > 2 else parts[0]
        if path.startswith("/"):
            target = dest / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(Path(path).resolve(), target)
    return dest


def push_rootfs(registry: Registry, rootfs: Path, name: str, tag: str = "latest", *,
                extra_layers: list[Layer] | None = None,
                config: Mapping[str, Any] | None = None,
                architectures: Sequence[str] | None = None) -> str:
    """Push a rootfs dir (one layer, plus ``extra_layers``) as ``name:tag``; its reference.
    ``architectures`` makes it a multi-arch index of those (each gets an etc/arch layer)."""
    with tempfile.TemporaryDirectory(prefix="orchard-layout-") as tmp:
        layout = make_oci_layout(rootfs, Path(tmp) / "layout", extra_layers,
                                 architectures=architectures, config=config)
        return registry.push(layout, name, tag)


def push_files(registry: Registry, files: Mapping[str, bytes], name: str,
               tag: str = "latest", **options: Any) -> str:
    """Push an image of one layer holding ``files`` (path -> content); its reference."""
    with tempfile.TemporaryDirectory(prefix="orchard-files-") as tmp:
        root = Path(tmp) / "root"
        for path, content in files.items():
            target = root / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
            os.chmod(target, 0o755 if content.startswith(b"#!") else 0o644)
        return push_rootfs(registry, root, name, tag, **options)


# Env of the ready-made images: PATH as images set it (the sandbox takes it from there).
IMAGE_CONFIG = {"Env": ["PATH=/usr/local/bin:/usr/bin:/bin"], "Cmd": ["/bin/sh"]}


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with running_registry(tmp_path_factory.mktemp("registry")) as reg:
        yield reg


@pytest.fixture(scope="session")
def busybox_image(registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> str:
    rootfs = make_busybox_rootfs(tmp_path_factory.mktemp("reg-busybox") / "rootfs")
    return push_rootfs(registry, rootfs, "orchard/busybox", "1", config=IMAGE_CONFIG)


@pytest.fixture(scope="session")
def bash_image(registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> str:
    rootfs = make_bash_rootfs(tmp_path_factory.mktemp("reg-bash") / "rootfs")
    return push_rootfs(registry, rootfs, "orchard/bash", "1", config=IMAGE_CONFIG)
