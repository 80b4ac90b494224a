"""Two orchestrator PROCESSES sharing one real Redis and one (fake) Kubernetes cluster.

Each test starts its own pair of `orchard serve` processes (replicas A and B) on a fresh Redis
key prefix, drives them over HTTP, and on the way out deletes every sandbox, checks that no pod
is left in the cluster and stops both processes. Replicas on different prefixes must never
run at the same time against the shared cluster: each would take the other's pods for orphans.
The replica tests need root and bubblewrap: the fake kubelet runs pods as local sandboxes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from orchard.env.state.redis import RedisStore
from tests.conftest import (
    create_ready,
    dies_with_the_tests,
    free_port,
    kube_settings,
    needs_root,
    run,
    wait_until,
)
from tests.fakekube.cluster import NAMESPACE, FakeCluster

ORCHARD = Path(sys.executable).with_name("orchard")
IMAGE = "python:3.12-slim"  # the fake kubelet runs any image as a 'host' sandbox
RECONCILE_S = 0.5
BEAT_TTL_S = 3 * RECONCILE_S + 2  # SandboxService.beat_ttl
# Generous bounds for correctness waits (never asserted as performance).
READY_S = 60.0
FAILOVER_S = 60.0



class Replica:
    """One `orchard serve` process and an HTTP client for it."""

    def __init__(self, name: str, workdir: Path, config: Path, state: str) -> None:
        self.name, self.workdir, self.config, self.state = name, workdir, config, state
        self.log_path = workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.http = httpx.Client(timeout=120)

    def start(self, timeout: float = 60.0) -> Replica:
        env = {k: v for k, v in os.environ.items()
               if k not in ("ORCHARD_STATE", "ORCHARD_API_KEYS", "ORCHARD_AGENT_SECRET")}
        for _ in range(3):  # the port may be taken between our probe and the server's bind
            port = free_port()
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    [str(ORCHARD), "serve", "--config", str(self.config), "--port", str(port),
                     "--state", self.state, "--reconcile-interval", str(RECONCILE_S)],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                    start_new_session=True, preexec_fn=dies_with_the_tests)
            self.url = f"http://127.0.0.1:{port}"
            self.http.base_url = httpx.URL(self.url)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.proc.poll() is None:
                with contextlib.suppress(httpx.HTTPError):
                    if self.http.get("/health", timeout=2).status_code == 200:
                        return self
                time.sleep(0.1)
            if self.proc.poll() is None or "address already in use" not in self.log().lower():
                break
        self.stop()
        pytest.fail(f"replica {self.name} did not answer /health at {self.url}; its log:\n"
                    f"{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:] if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def sigkill(self) -> None:
        assert self.proc is not None and self.alive(), f"replica {self.name} is not running"
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        assert self.proc.returncode == -signal.SIGKILL, self.proc.returncode

    def stop(self) -> bool:
        """SIGTERM, then SIGKILL after 30s; False if it took the SIGKILL."""
        self.http.close()  # no idle keep-alive connection for the server to wait on
        if self.proc is None or self.proc.poll() is not None:
            return True
        self.proc.terminate()
        try:
            self.proc.wait(30)
            return True
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            return False

    # --- API shorthands --------------------------------------------------------------------

    def create(self, **body: Any) -> str:
        r = self.http.post("/sandboxes", json={"image": IMAGE, **body})
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "pending", r.text
        return str(r.json()["sandbox_id"])

    def sandbox(self, sid: str) -> dict[str, Any]:
        r = self.http.get(f"/sandboxes/{sid}")
        assert r.status_code == 200, r.text
        return dict(r.json())

    def submit(self, sid: str, command: str) -> str:
        r = self.http.post(f"/sandboxes/{sid}/exec", json={"command": command, "wait": False})
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "running", r.text
        return str(r.json()["job_id"])

    def job(self, job_id: str) -> dict[str, Any]:
        r = self.http.get(f"/jobs/{job_id}")
        assert r.status_code == 200, r.text
        return dict(r.json())

    def wait_job(self, job_id: str, timeout: float = 60) -> dict[str, Any]:
        r = self.http.get(f"/jobs/{job_id}/wait", params={"timeout": timeout})
        assert r.status_code == 200, r.text
        return dict(r.json())

    def ids(self, *labels: str) -> set[str]:
        r = self.http.get("/sandboxes", params=[("label", label) for label in labels])
        assert r.status_code == 200, r.text
        return {s["sandbox_id"] for s in r.json()["sandboxes"]}


def cluster_pods(cluster: FakeCluster) -> set[str]:
    objs = cluster.api.run_in_loop(cluster.api.list_objects("pods", NAMESPACE)).result(30)
    return {o["metadata"]["name"] for o in objs}


def pod_count(cluster: FakeCluster) -> int:
    return cluster.api.count(method="POST", resource="pods")


def _cleanup(cluster: FakeCluster, replicas: list[Replica]) -> list[str]:
    """Delete every sandbox through a live replica, check that no pod and no orchestrator
    process is left; returns what went wrong (after cleaning up regardless)."""
    problems: list[str] = []
    live = [r for r in replicas if r.alive()]
    if live:
        for sid in live[0].ids():
            r = live[0].http.delete(f"/sandboxes/{sid}")
            if r.status_code not in (200, 404):
                problems.append(f"DELETE {sid}: {r.status_code} {r.text}")
    if not wait_until(lambda: not cluster_pods(cluster) and not cluster.kubelet.sandboxes(),
                      timeout=60, interval=0.2):
        problems.append(f"pods left in the cluster: {sorted(cluster_pods(cluster))}, kubelet "
                        f"sandboxes: {sorted(cluster.kubelet.sandboxes())}")
        for name in cluster_pods(cluster):  # keep the shared cluster clean for other tests
            with contextlib.suppress(Exception):
                cluster.api.run_in_loop(
                    cluster.api.delete_object("pods", NAMESPACE, name)).result(30)
    for replica in replicas:
        if not replica.stop():
            problems.append(f"replica {replica.name} ignored SIGTERM for 30s (a shutdown that "
                            "hangs, e.g. on a task whose cancellation was swallowed)")
        if replica.alive():
            problems.append(f"replica {replica.name} (pid {replica.proc.pid}) still runs")
    return problems


@pytest.fixture()
def start_pair(fake_cluster: FakeCluster,
               redis_store_url: str) -> Iterator[Callable[..., tuple[Replica, Replica]]]:
    """start_pair(**settings) -> (A, B): two replicas on one Redis prefix and one cluster,
    with the same agent secret; extra settings go into their shared config file."""
    workdir = Path(tempfile.mkdtemp(prefix="/tmp/orc-mr-"))
    replicas: list[Replica] = []

    def start(**settings: Any) -> tuple[Replica, Replica]:
        assert not replicas, "one pair per test"
        base = kube_settings(fake_cluster)
        for name in ("a", "b"):
            config = {"backend": base["backend"], "kubernetes": base["kubernetes"],
                      "data_dir": str(workdir / name), **settings}
            path = workdir / f"{name}.yaml"
            path.write_text(yaml.safe_dump(config))
            replicas.append(Replica(name.upper(), workdir, path, redis_store_url))
        for replica in replicas:
            replica.start()
        return replicas[0], replicas[1]

    try:
        yield start
    finally:
        problems = _cleanup(fake_cluster, replicas)
        logs = "\n".join(f"--- replica {r.name} log ---\n{r.log()}" for r in replicas)
        shutil.rmtree(workdir, ignore_errors=True)
        assert not problems, "\n".join(problems) + "\n" + logs


# --- sandboxes ---------------------------------------------------------------------------------

@needs_root
def test_sandbox_made_by_a_is_waited_used_and_deleted_through_b(
        start_pair, fake_cluster: FakeCluster) -> None:
    a, b = start_pair()
    sid = a.create(labels={"made-by": "a"})
    # B's server-side wait returns once A's launch (a task in another process) finishes.
    r = b.http.get(f"/sandboxes/{sid}/wait", params={"timeout": READY_S})
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "running" and r.json()["ready_at"], r.text
    assert a.sandbox(sid)["status"] == "running"
    assert sid in cluster_pods(fake_cluster)

    # Exec through both: B reaches the agent of a pod A made (same derived agent token).
    out = run(a.http, sid, command="echo from-a > shared.txt")
    assert out["exit_code"] == 0, out
    out = run(b.http, sid, command="cat shared.txt; echo from-b")
    assert out["exit_code"] == 0 and out["stdout"] == "from-a\nfrom-b\n", out

    r = b.http.delete(f"/sandboxes/{sid}")
    assert r.status_code == 200 and r.json()["status"] == "deleted", r.text
    assert b.sandbox(sid)["status"] == "deleted"
    assert a.sandbox(sid)["status"] == "deleted"  # A reads the shared record, no cache
    for replica in (a, b):
        r = replica.http.post(f"/sandboxes/{sid}/exec", json={"command": "true"})
        assert r.status_code == 404, (replica.name, r.text)
    r = a.http.get(f"/sandboxes/{sid}/wait", params={"timeout": 5})
    assert r.status_code == 200 and r.json()["status"] == "deleted", r.text
    assert r.json()["ready"] is False
    assert wait_until(lambda: sid not in cluster_pods(fake_cluster), timeout=30), \
        cluster_pods(fake_cluster)
    assert wait_until(lambda: sid not in fake_cluster.kubelet.sandboxes(), timeout=30)
    assert sid not in a.ids() | b.ids()


@needs_root
def test_list_filters_and_admission_span_replicas(start_pair) -> None:
    a, b = start_pair(max_sandboxes=3)
    tag = uuid.uuid4().hex[:8]
    x1 = a.create(labels={"suite": tag, "team": "x"})
    x2 = a.create(labels={"suite": tag, "team": "x"})
    y = a.create(labels={"suite": tag, "team": "y"})
    for sid in (x1, x2, y):
        r = b.http.get(f"/sandboxes/{sid}/wait", params={"timeout": READY_S})
        assert r.status_code == 200, r.text

    assert b.ids() == {x1, x2, y}
    assert b.ids("team=x") == {x1, x2}
    assert b.ids("team=x", f"suite={tag}") == {x1, x2}
    assert b.ids("team=y") == {y}
    assert b.ids("team=z") == set()
    assert b.ids(f"suite={tag}") == a.ids(f"suite={tag}") == {x1, x2, y}
    r = b.http.get("/sandboxes", params={"label": "no-equals-sign"})
    assert r.status_code == 400, r.text

    # The same id cannot be created twice, whichever replica is asked.
    r = b.http.post("/sandboxes", json={"image": IMAGE, "sandbox_id": x1})
    assert r.status_code == 409 and "already exists" in r.json()["detail"], r.text

    # Admission counts A's sandboxes on B too (as of B's last reconcile pass).
    assert wait_until(lambda: b.http.get("/health").json()["sandboxes"] == 3, timeout=30)
    r = b.http.post("/sandboxes", json={"image": IMAGE})
    assert r.status_code == 503 and "at capacity" in r.json()["detail"], r.text
    assert r.headers.get("retry-after"), r.headers
    assert b.ids() == {x1, x2, y}  # the refused create left no record

    r = b.http.delete(f"/sandboxes/{x1}")
    assert r.status_code == 200, r.text
    assert a.ids("team=x") == {x2}
    z = b.create(labels={"suite": tag, "team": "z"})  # room again
    assert a.ids(f"suite={tag}") == {x2, y, z}
    r = a.http.get(f"/sandboxes/{z}/wait", params={"timeout": READY_S})
    assert r.status_code == 200, r.text


# --- jobs ------------------------------------------------------------------------------------

@needs_root
def test_jobs_are_read_and_waited_on_through_either_replica(start_pair) -> None:
    a, b = start_pair()
    sid = create_ready(a.http, {"image": IMAGE}, timeout=READY_S)
    for runner, waiter in ((a, b), (b, a)):
        job_id = runner.submit(sid, f"sleep 2; echo from-{runner.name}")
        assert waiter.job(job_id)["status"] == "running"
        job = waiter.wait_job(job_id)
        assert job["status"] == "succeeded", job
        assert job["exit_code"] == 0 and job["stdout"] == f"from-{runner.name}\n", job
        assert runner.job(job_id) == job

    failing = b.submit(sid, "echo oops >&2; exit 3")
    job = a.wait_job(failing)
    assert job["status"] == "failed" and job["exit_code"] == 3, job
    assert job["stderr"] == "oops\n", job

    r = b.http.get("/jobs/job-does-not-exist/wait", params={"timeout": 1})
    assert r.status_code == 404, r.text


# --- exclusive exec ----------------------------------------------------------------------------

INTERVAL = "date +%s.%N; sleep 2; date +%s.%N"


def _two_execs(a: Replica, b: Replica, sid: str) -> list[tuple[float, float]]:
    """Start one exec through A and one through B at about the same time (wait=false);
    the [start, end] interval each recorded inside the sandbox, earliest first."""
    jobs = [a.submit(sid, INTERVAL), b.submit(sid, INTERVAL)]
    spans = []
    for job_id, waiter in zip(jobs, (b, a), strict=True):
        job = waiter.wait_job(job_id, timeout=120)
        assert job["status"] == "succeeded", job
        start, end = (float(x) for x in job["stdout"].split())
        spans.append((start, end))
    return sorted(spans)


@needs_root
def test_exclusive_exec_serializes_across_replicas(start_pair) -> None:
    a, b = start_pair()
    exclusive = create_ready(a.http, {"image": IMAGE, "exclusive_exec": True}, timeout=READY_S)
    shared = create_ready(b.http, {"image": IMAGE}, timeout=READY_S)

    (s1, e1), (s2, e2) = _two_execs(a, b, exclusive)
    print(f"exclusive_exec: [{s1:.3f}, {e1:.3f}] then [{s2:.3f}, {e2:.3f}]")
    assert e1 <= s2, f"exclusive execs overlapped: [{s1}, {e1}] and [{s2}, {e2}]"

    # The control: without exclusive_exec the same two execs do run at the same time.
    (s1, e1), (s2, e2) = _two_execs(a, b, shared)
    print(f"no exclusive_exec: [{s1:.3f}, {e1:.3f}] and [{s2:.3f}, {e2:.3f}]")
    assert s2 < e1, f"plain execs did not overlap: [{s1}, {e1}] and [{s2}, {e2}]"


# --- a replica dies ------------------------------------------------------------------------------

def _started(replica: Replica, sid: str, marker: str) -> Callable[[], bool]:
    def check() -> bool:
        out = run(replica.http, sid, command=f"test -f {marker} && echo yes || echo no")
        return bool(out["stdout"] == "yes\n")
    return check


@needs_root
def test_sigkill_mid_exec_fails_its_job_and_keeps_its_sandboxes(
        start_pair, fake_cluster: FakeCluster) -> None:
    a, b = start_pair()
    sid = create_ready(a.http, {"image": IMAGE, "labels": {"case": "kill"}}, timeout=READY_S)
    job_id = a.submit(sid, "touch started; sleep 30")
    assert wait_until(_started(b, sid, "started"), timeout=30, interval=0.1)
    assert b.job(job_id)["status"] == "running"
    late = create_ready(a.http, {"image": IMAGE, "labels": {"case": "late"}}, timeout=READY_S)

    a.sigkill()
    killed = time.monotonic()

    # The records A wrote are all still there, and still running.
    assert b.sandbox(sid)["status"] == "running"
    assert b.sandbox(late)["status"] == "running"
    assert b.ids("case=kill") == {sid} and b.ids("case=late") == {late}
    out = run(b.http, sid, command="echo still-here")
    assert out["exit_code"] == 0 and out["stdout"] == "still-here\n", out

    # B's server-side wait returns when B's reconcile fails the job of the dead replica.
    job = b.wait_job(job_id, timeout=FAILOVER_S)
    print(f"job failed {time.monotonic() - killed:.1f}s after the SIGKILL (beat ttl "
          f"{BEAT_TTL_S}s)")
    assert job["status"] == "failed", job
    assert "replica" in job["error"] and "stopped" in job["error"], job
    assert job["completed_at"], job
    assert b.job(job_id) == job

    # Well past A's beat ttl: B took over neither by failing nor by deleting its sandboxes.
    for s in (sid, late):
        rec = b.sandbox(s)
        assert rec["status"] == "running", rec
        out = run(b.http, s, command="echo adopted")
        assert out["exit_code"] == 0 and out["stdout"] == "adopted\n", out
        assert s in cluster_pods(fake_cluster)
    r = b.http.delete(f"/sandboxes/{late}")
    assert r.status_code == 200, r.text
    assert wait_until(lambda: late not in cluster_pods(fake_cluster), timeout=30)


@needs_root
def test_sigkill_while_holding_the_exclusive_exec_lock(start_pair) -> None:
    """The dead holder's lock expires (ttl 30s) and B's exec then runs: no deadlock."""
    a, b = start_pair()
    sid = create_ready(a.http, {"image": IMAGE, "exclusive_exec": True}, timeout=READY_S)
    job_id = a.submit(sid, "touch started; sleep 120")
    # A plain exec would queue behind the lock: look for the marker with the file API.
    assert wait_until(
        lambda: b.http.get(f"/sandboxes/{sid}/files", params={"path": "/workspace/started"}
                           ).status_code == 200, timeout=30, interval=0.1)
    a.sigkill()
    killed = time.monotonic()
    out = run(b.http, sid, command="echo after-the-lock")
    print(f"B's exec ran {time.monotonic() - killed:.1f}s after the SIGKILL")
    assert out["exit_code"] == 0 and out["stdout"] == "after-the-lock\n", out
    job = b.wait_job(job_id, timeout=FAILOVER_S)
    assert job["status"] == "failed" and "replica" in job["error"], job


@needs_root
def test_sigkill_mid_launch_before_the_pod_exists(start_pair,
                                                  fake_cluster: FakeCluster) -> None:
    a, b = start_pair()
    posts = pod_count(fake_cluster)
    # A's pod create gets a 503 asking it to retry in 60s: it is killed while it waits.
    fake_cluster.api.inject_fault(503, method="POST", resource="pods", times=1, retry_after=60)
    sid = a.create()
    assert wait_until(lambda: pod_count(fake_cluster) > posts, timeout=30)
    a.sigkill()
    assert sid not in cluster_pods(fake_cluster)

    r = b.http.get(f"/sandboxes/{sid}/wait", params={"timeout": FAILOVER_S})
    assert r.status_code == 200 and r.json()["status"] == "failed", r.text
    assert "stopped before it was ready" in r.json()["status_message"], r.text
    rec = b.sandbox(sid)
    assert rec["status"] == "failed" and "replica" in rec["error"], rec
    r = b.http.post(f"/sandboxes/{sid}/exec", json={"command": "true"})
    assert r.status_code == 409 and "failed" in r.json()["detail"], r.text
    assert sid not in cluster_pods(fake_cluster)


@needs_root
def test_sigkill_mid_launch_after_the_pod_was_created(start_pair,
                                                      fake_cluster: FakeCluster) -> None:
    a, b = start_pair()
    sid = a.create()
    assert wait_until(lambda: sid in cluster_pods(fake_cluster), timeout=30, interval=0.005)
    a.sigkill()
    pending_at_kill = b.sandbox(sid)["status"] == "pending"

    r = b.http.get(f"/sandboxes/{sid}/wait", params={"timeout": FAILOVER_S})
    assert r.status_code == 200, r.text  # not 408: it is no longer pending
    rec = b.sandbox(sid)
    print(f"pending when A died: {pending_at_kill}; then {rec['status']} ({rec.get('error')})")
    if rec["status"] == "running":  # B adopted it (or A made it ready just in time)
        out = run(b.http, sid, command="echo adopted")
        assert out["exit_code"] == 0 and out["stdout"] == "adopted\n", out
        assert sid in cluster_pods(fake_cluster)
    else:
        assert rec["status"] == "failed", rec
        assert "stopped before it was ready" in rec["error"], rec
        assert wait_until(lambda: sid not in cluster_pods(fake_cluster), timeout=30)


# --- the store under cancellation ---------------------------------------------------------------

def test_cancelling_a_task_in_a_store_call_always_stops_it(redis_store_url: str) -> None:
    """A replica's loops (reconciler, lock renewers, pub/sub dispatcher) end by cancellation.
    redis-py sends under asyncio.wait_for, which on Python 3.11 can swallow a cancel landing
    as the send completes; the loop then ran on, and `orchard serve` hung on SIGTERM."""
    async def main() -> list[int]:
        store = RedisStore(redis_store_url)
        stop = False

        async def loop() -> None:
            while not stop:
                await store.beat("replica-x", 5)
                await store.list_sandboxes()
                await store.publish("nothing")

        stuck = []
        try:
            for i in range(200):
                task = asyncio.create_task(loop())
                await asyncio.sleep(random.uniform(0, 0.005))
                task.cancel()
                done, _ = await asyncio.wait({task}, timeout=2)
                if not done:
                    stuck.append(i)
                    stop = True
                    await asyncio.wait({task}, timeout=5)
                    stop = False
                    if len(stuck) == 5:
                        break
        finally:
            await store.close()
        return stuck

    stuck = asyncio.run(main())
    assert not stuck, f"cancelled tasks kept running (attempts {stuck})"
