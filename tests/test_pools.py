"""Warm pools (orchestrator's `pools:`): take, refill, mismatches go cold, a sandbox is never
handed out twice, GET /pools and /metrics, shutdown and restart leave nothing behind."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from orchard.cli import app as cli_app
from orchard.env.client import AsyncSandboxClient, OrchardError, SandboxClient
from orchard.env.config import PoolEntry
from orchard.env.schema import CreateSandboxRequest, PoolInfo
from orchard.env.server import EmbeddedOrchestrator
from orchard.env.service.pools import matches
from tests.conftest import (
    free_port,
    kube_settings,
    needs_root,
    run,
    short_data_dir,
    wait_until,
)
from tests.fakekube.cluster import FakeCluster
from tests.test_kubernetes_backend import IMAGE, namespace, orchard_pods, short_dir
from tests.test_lifecycle import _start_server, force_remove, gone

SMALL = {"name": "small", "image": "host", "size": 2, "memory": "256Mi"}
# A pool of size 0 keeps none ready: every create that matches it is a miss.
EMPTY = {"name": "empty", "image": "host", "size": 0, "cpu": "1"}


def test_a_create_matches_a_pool_only_when_a_ready_sandbox_can_serve_it() -> None:
    entry = PoolEntry(image="host", size=2, cpu="1", memory="256Mi", block_network=False,
                      egress=["10.0.0.0/8"])
    req = {"image": "host", "block_network": False, "cpu": "1000m", "memory": "0.25Gi",
           "egress": ["10.0.0.0/8"], "labels": {"who": "me"}, "ttl": 60, "session": "s-1",
           "exclusive_exec": True}
    assert matches(entry, CreateSandboxRequest(**req))
    for other in ({"image": "busybox"}, {"cpu": "2"}, {"memory": "512Mi"}, {"pids": 64},
                  {"disk": "1Gi"}, {"block_network": True, "egress": None}, {"egress": None},
                  {"sandbox_id": "mine"}, {"env": {"A": "1"}}, {"workdir": "/tmp"},
                  {"from_snapshot": "snap-1"}):
        assert not matches(entry, CreateSandboxRequest(**{**req, **other})), other


def pools(http: httpx.Client) -> dict[str, dict]:
    r = http.get("/pools")
    assert r.status_code == 200, r.text
    return {p["name"]: p for p in r.json()}


def ready(http: httpx.Client, name: str = "small") -> int:
    return pools(http)[name]["ready"]


def sandbox_dirs(data: Path) -> set[str]:
    root = data / "local" / "sandboxes"
    return {p.name for p in root.iterdir()} if root.exists() else set()


def take(http: httpx.Client, **extra: object) -> dict:
    r = http.post("/sandboxes", json={"image": "host", "memory": "256Mi", **extra})
    assert r.status_code == 200, r.text
    return r.json()


@needs_root
def test_pool_take_refill_mismatch_and_no_reuse(data_dir: Path, orchestrator: str) -> None:
    with short_data_dir(data_dir) as d:
        with EmbeddedOrchestrator(data_dir=d, reconcile_interval=0.5,
                                  pools=[SMALL, EMPTY]) as url, \
                httpx.Client(base_url=url, timeout=60) as http:
            assert wait_until(lambda: ready(http) == 2, 60)
            # Nobody sees or reaches the pool's sandboxes before a take.
            assert http.get("/sandboxes").json()["sandboxes"] == []
            launched = sandbox_dirs(d)
            assert len(launched) == 2
            for sid in launched:
                for method, path, body in (("POST", "exec", {"command": "true"}),
                                           ("GET", "", None), ("POST", "pause", None),
                                           ("POST", "snapshot", {}), ("POST", "fork", {})):
                    r = http.request(method, f"/sandboxes/{sid}/{path}".rstrip("/"),
                                     json=body)
                    assert r.status_code == 404, (path, r.text)

            # Nobody can make a sandbox that would join a pool.
            r = http.post("/sandboxes", json={"image": "host", "memory": "256Mi",
                                              "labels": {"orchard.pool": "small"}})
            assert r.status_code == 400 and "reserved" in r.text, r.text
            first = take(http, labels={"who": "a"}, ttl=600)
            # Ready at once, one of the pool's, now the caller's.
            assert first["status"] == "running" and first["pool"] == "small"
            assert first["sandbox_id"] in launched and first["labels"] == {"who": "a"}
            listed = http.get("/sandboxes").json()["sandboxes"]
            assert [s["sandbox_id"] for s in listed] == [first["sandbox_id"]]
            a = first["sandbox_id"]
            # The take is logged as a create, with its shape (what a replay starts from).
            events = http.get(f"/sandboxes/{a}/events").json()["events"]
            taken_event = [e for e in events if e["kind"] == "created"][-1]
            assert taken_event["data"]["pool"] == "small"
            assert taken_event["data"]["memory"] == "256Mi"
            assert run(http, a, command="echo secret > /workspace/mine; echo hi > /tmp/t")[
                "exit_code"] == 0
            # The pool refills in the background.
            assert wait_until(lambda: ready(http) == 2, 60)

            # Creates a pool sandbox cannot serve launch cold.
            for body in ({"image": "host"}, {"image": "host", "memory": "512Mi"},
                         {"image": "host", "memory": "256Mi", "block_network": False},
                         {"image": "host", "memory": "256Mi", "env": {"A": "1"}}):
                cold = http.post("/sandboxes", json=body).json()
                assert cold["pool"] is None and cold["sandbox_id"] not in launched, cold
                assert http.delete(f"/sandboxes/{cold['sandbox_id']}").status_code == 200
            miss = http.post("/sandboxes", json={"image": "host", "cpu": "1"}).json()
            assert miss["pool"] is None
            assert http.delete(f"/sandboxes/{miss['sandbox_id']}").status_code == 200

            # A taken sandbox never returns to the pool: after its delete, takes get others,
            # and none shows what the first user wrote.
            assert http.delete(f"/sandboxes/{a}").status_code == 200
            seen = {a}
            for _ in range(3):
                assert wait_until(lambda: ready(http) >= 1, 60)
                nxt = take(http)
                assert nxt["pool"] == "small" and nxt["sandbox_id"] not in seen
                seen.add(nxt["sandbox_id"])
                out = run(http, nxt["sandbox_id"], command="ls -A /workspace; cat /tmp/t")
                assert "mine" not in out["stdout"] and "hi" not in out["stdout"], out
            info = pools(http)
            assert info["small"]["hits"] == 4 and info["small"]["misses"] == 0
            assert info["empty"]["hits"] == 0 and info["empty"]["misses"] == 1
            assert info["small"]["size"] == 2
            metrics = {(s.name, s.labels.get("pool")): s.value
                       for f in text_string_to_metric_families(http.get("/metrics").text)
                       for s in f.samples if f.name.startswith("orchard_pool")}
            assert metrics[("orchard_pool_hits_total", "small")] == 4
            assert metrics[("orchard_pool_misses_total", "empty")] == 1
            assert metrics[("orchard_pool_size", "small")] == 2
            assert wait_until(lambda: ready(http) == 2, 60)
            everything = sandbox_dirs(d) | seen
        # Stopping deletes the pool with the rest: nothing is left behind.
        assert wait_until(lambda: all(gone(sid, d) for sid in everything))


def pool_ls(url: str) -> list[str]:
    """`orchard pool ls`'s rows, split into columns."""
    result = CliRunner().invoke(cli_app, ["--url", url, "pool", "ls"],
                                env={"ORCHARD_API_KEY": None, "COLUMNS": "200"})
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    return [line.split() for line in result.output.splitlines()]


async def async_pools(url: str) -> list[PoolInfo]:
    async with AsyncSandboxClient(url) as client:
        return await client.pools()


@needs_root
def test_the_sdks_and_the_cli_list_the_pools(data_dir: Path, orchestrator: str) -> None:
    # A server without `pools:` has none to list.
    with SandboxClient(orchestrator) as client:
        assert client.pools() == []
    assert asyncio.run(async_pools(orchestrator)) == []
    assert pool_ls(orchestrator) == [["no", "warm", "pools:", "the", "server's", "settings",
                                      "have", "no", "`pools:`", "(docs/guides/pools.md)"]]
    with short_data_dir(data_dir) as d, EmbeddedOrchestrator(
            data_dir=d, reconcile_interval=0.5, pools=[SMALL, EMPTY]) as url, \
            SandboxClient(url) as client:
        assert wait_until(lambda: client.pools()[0].ready == 2, 60)
        small, empty = client.pools()
        # Typed: the route's own model, the entry as configured.
        assert isinstance(small, PoolInfo)
        assert (small.name, small.size, small.ready, small.starting) == ("small", 2, 2, 0)
        assert small.entry["image"] == "host" and small.entry["memory"] == "256Mi"
        assert (empty.name, empty.size, empty.ready, empty.entry["cpu"]) == ("empty", 0, 0, "1")
        # A create of the small shape is a hit, one of the empty shape a miss; both SDKs and
        # the CLI see the counts once the pool is full again.
        assert client.create_sandbox("host", memory="256Mi").info.pool == "small"
        assert client.create_sandbox("host", cpu="1").info.pool is None
        assert wait_until(lambda: client.pools()[0].ready == 2, 60)
        listed = client.pools()
        assert [(p.hits, p.misses) for p in listed] == [(1, 0), (0, 1)]
        assert asyncio.run(async_pools(url)) == listed
        assert pool_ls(url) == [["POOL", "IMAGE", "SIZE", "READY", "STARTING", "HITS", "MISSES"],
                                ["small", "host", "2", "2", "0", "1", "0"],
                                ["empty", "host", "0", "0", "0", "0", "1"]]


def test_a_pools_answer_of_the_wrong_shape_is_a_clear_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"pools": []})  # not the bare list the route answers

    with SandboxClient("http://orchard.test", transport=httpx.MockTransport(handler)) as client, \
            pytest.raises(OrchardError, match="GET /pools: unexpected response from the server"):
        client.pools()


@needs_root
def test_restart_with_a_pool_adopts_it_and_leaks_nothing(data_dir: Path, tmp_path: Path,
                                                         orchestrator: str) -> None:
    with short_data_dir(data_dir) as d:
        _restart_with_a_pool(d, tmp_path)


def _restart_with_a_pool(d: Path, tmp_path: Path) -> None:
    port = free_port()
    url, log = f"http://127.0.0.1:{port}", tmp_path / "serve.log"
    seen: set[str] = set()
    proc = _start_server(d, port, log, reconcile_interval=0.5, pools=[SMALL])
    try:
        with httpx.Client(base_url=url, timeout=60) as http:
            assert wait_until(lambda: ready(http) == 2, 60)
            before = sandbox_dirs(d)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        proc = _start_server(d, port, log, reconcile_interval=0.5, pools=[SMALL])
        with httpx.Client(base_url=url, timeout=60) as http:
            # The pool's sandboxes are adopted, not launched again beside themselves.
            assert wait_until(lambda: ready(http) == 2, 60)
            assert sandbox_dirs(d) == before
            taken = take(http)
            assert taken["pool"] == "small" and taken["sandbox_id"] in before
            assert run(http, taken["sandbox_id"], command="echo ok")["stdout"] == "ok\n"
            assert wait_until(lambda: ready(http) == 2, 60)
            seen = sandbox_dirs(d)
            assert len(seen) == 3
            assert http.delete(f"/sandboxes/{taken['sandbox_id']}").status_code == 200
            assert wait_until(lambda: gone(taken["sandbox_id"], d))
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        # Restarted without the pool: its sandboxes go, nothing else is launched.
        proc = _start_server(d, port, log, reconcile_interval=0.5)
        with httpx.Client(base_url=url, timeout=60) as http:
            assert http.get("/pools").json() == []
            assert wait_until(lambda: all(gone(sid, d) for sid in seen), 60)
            assert sandbox_dirs(d) == set()
    finally:
        seen |= sandbox_dirs(d)
        proc.terminate()
        proc.wait(20)
        for sid in seen:
            force_remove(sid)


@needs_root
def test_a_kubernetes_pool_is_ready_pods(fake_cluster: FakeCluster) -> None:
    api = fake_cluster.api
    with namespace(api, "orchard-pools") as ns, short_dir() as data, EmbeddedOrchestrator(
            data_dir=data, pools=[{"name": "kube", "image": IMAGE, "size": 2}],
            **kube_settings(fake_cluster, namespace=ns)) as url, \
            httpx.Client(base_url=url, timeout=60) as http:
        assert wait_until(lambda: ready(http, "kube") == 2, 120)
        pods = orchard_pods(api, ns)
        assert len(pods) == 2
        taken = http.post("/sandboxes", json={"image": IMAGE, "labels": {"who": "k"}}).json()
        assert taken["pool"] == "kube" and taken["status"] == "running", taken
        assert taken["sandbox_id"] in pods and taken["labels"] == {"who": "k"}
        assert run(http, taken["sandbox_id"], command="echo ok")["stdout"] == "ok\n"
        # Refilled with a new pod; the taken one stays the caller's.
        assert wait_until(lambda: ready(http, "kube") == 2, 120)
        assert wait_until(lambda: len(orchard_pods(api, ns)) == 3, 60)
    # namespace() checks on the way out that the orchestrator's stop left no pod behind.
