"""Shared fixtures: a real embedded orchestrator on loopback, with real sandboxes."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import httpx
import pytest

from orchard.env.server import EmbeddedOrchestrator
from orchard.env.state import StateStore, open_store
from tests.fakekube.cluster import FakeCluster

pytest_plugins = ["tests.redis_server", "tests.registry", "tests.leakcheck",
                  "tests.browser_harness"]

# litellm (under mini-swe-agent and Harbor) fetches its price list from the internet when it is
# imported. Tests send nothing off the machine, whichever test imports it first.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None,
    reason="needs root and bubblewrap (CI runs as root: `make test` installs bubblewrap)",
)
needs_browser = pytest.mark.skipif(
    shutil.which("chromium") is None,
    reason="needs Debian's chromium package (`make test` installs it)",
)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("orchard-data")


@pytest.fixture(scope="session")
def orchestrator(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of one orchestrator shared by the session (the bundle builds once). Tests
    make their images in pytest's temp dirs, so those may hold images, and pull from
    loopback registries only (tests/registry.py)."""
    # Registry images only from loopback (the test registries): a name no test meant as one
    # is refused (403) rather than looked up on Docker Hub.
    images = {"allowed_paths": [tmp_path_factory.getbasetemp()],
              "allowed_registries": ["127.0.0.1", "localhost"]}
    with EmbeddedOrchestrator(data_dir=data_dir, reconcile_interval=0.5, images=images) as url:
        yield url


@pytest.fixture()
def http(orchestrator: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=orchestrator, timeout=120) as client:
        yield client


@pytest.fixture()
def sandbox(http: httpx.Client) -> Iterator[str]:
    """A ready 'host' sandbox id, deleted afterwards."""
    sid = create_ready(http, {"image": "host"})
    yield sid
    http.delete(f"/sandboxes/{sid}")


def create_ready(http: httpx.Client, body: dict, timeout: float = 60) -> str:
    r = http.post("/sandboxes", json=body)
    assert r.status_code == 200, r.text
    sid = r.json()["sandbox_id"]
    r = http.get(f"/sandboxes/{sid}/wait", params={"timeout": timeout})
    assert r.status_code == 200, r.text
    return sid


def run(http: httpx.Client, sid: str, **body: object) -> dict:
    r = http.post(f"/sandboxes/{sid}/exec", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def dies_with_the_tests() -> None:
    """A ``preexec_fn`` for servers a test starts: SIGTERM when pytest ends, even killed.

    A killed pytest runs no teardown, and its servers would outlive it otherwise."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# Long enough for a loaded 2-core CI machine: a wait ends as soon as its condition holds, so
# only a test that is failing anyway ever spends it.
WAIT_S = 30.0


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs: a zombie has ended, it only awaits its reaping."""
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def wait_until(predicate: Callable[[], object], timeout: float = WAIT_S,
               interval: float = 0.05) -> bool:
    """Whether ``predicate()`` came true within ``timeout`` seconds, polled every ``interval``.
    Use it as ``assert wait_until(...), "what never happened"`` instead of a sleep."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


async def wait_until_async(predicate: Callable[[], Awaitable[object]], timeout: float = WAIT_S,
                           interval: float = 0.05) -> bool:
    """wait_until for a coroutine predicate, polling without blocking the event loop."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(interval)
    return bool(await predicate())


def until_exists(path: str) -> str:
    """Shell that blocks until ``path`` exists: a command that ends when the test has seen
    what it needs and creates the file, not after a sleep that must outlast the check."""
    return f"until [ -e {path} ]; do sleep 0.05; done"


@contextlib.contextmanager
def short_data_dir(session_data: Path) -> Iterator[Path]:
    """A data dir short enough for the AF_UNIX socket paths below it (pytest's can be too
    long), reusing the interpreter bundle the session orchestrator already built."""
    short = Path(tempfile.mkdtemp(prefix="/tmp/orc-"))
    (short / "local").mkdir()
    (short / "local" / "bundle").symlink_to(session_data / "local" / "bundle")
    try:
        yield short
    finally:
        shutil.rmtree(short, ignore_errors=True)


@contextlib.contextmanager
def dedicated_orchestrator(session_data: Path, **settings: object) -> Iterator[str]:
    """A private orchestrator on a short data dir, stopped (its sandboxes deleted) on exit."""
    with short_data_dir(session_data) as short, EmbeddedOrchestrator(
            data_dir=short, **{"reconcile_interval": 0.5, **settings}) as url:
        yield url


@pytest.fixture(scope="session")
def fake_cluster(data_dir: Path, orchestrator: str) -> Iterator[FakeCluster]:
    """A fake Kubernetes cluster (API server + kubelet running pods as local sandboxes),
    shared by the session; it reuses the bundle the session orchestrator built."""
    short = Path(tempfile.mkdtemp(prefix="/tmp/orc-k8s-"))
    (short / "kubelet").mkdir()
    (short / "kubelet" / "bundle").symlink_to(data_dir / "local" / "bundle")
    try:
        with FakeCluster(short) as cluster:
            yield cluster
    finally:
        shutil.rmtree(short, ignore_errors=True)


def kube_settings(cluster: FakeCluster, **kubernetes: object) -> dict[str, object]:
    """Orchestrator settings for the kubernetes backend on the fake cluster."""
    return {"backend": "kubernetes", "reconcile_interval": 0.5,
            "kubernetes": {"kubeconfig": str(cluster.kubeconfig), "agent_secret": "test-secret",
                           **kubernetes}}


# --- state stores: every store test runs on SQLite and on a real Redis ----------------------

MakeStore = Callable[[], StateStore]


@pytest.fixture(params=["sqlite", "redis"])
def store_url(request: pytest.FixtureRequest, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/state.db"
    return str(request.getfixturevalue("redis_store_url"))


@pytest.fixture()
async def make_store(store_url: str) -> AsyncIterator[MakeStore]:
    """Opens stores on the same backing: for Redis, separate replicas of one deployment; for
    SQLite, the same file reopened (as after a restart)."""
    stores: list[StateStore] = []

    def make() -> StateStore:
        stores.append(open_store(store_url))
        return stores[-1]

    yield make
    for s in stores:
        await s.close()


@pytest.fixture()
def store(make_store: MakeStore) -> StateStore:
    return make_store()
