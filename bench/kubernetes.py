"""The Kubernetes backend against the fake cluster: latency, a burst, and API requests.

Three processes, as in a deployment: this script (the SDK client), the orchestrator
(``BenchServer`` with ``backend: kubernetes``) and the fake cluster (``tests.fakekube``: API
server + a kubelet running each pod as a local sandbox reached at a 127.42.x.y Pod IP) in a
child process of its own, driven over a pipe, so its work shares neither the client's nor the
orchestrator's interpreter while this script still reads what its API server received
(``FakeApiServer.requests``, watches included; the kubelet's own status writes are in-process
and not counted).

(1) sequential create->ready, block_network=true (each then deleted); (2) exec ``true``
through the SDK over the Pod IP, interleaved with a raw ``bash -c true`` spawn (the baseline,
as in exec_latency.py), and the API requests during those execs; (3) lifecycles with
block_network=false (create, wait, ``echo ok``, delete); (4) a burst of N lifecycles at client
concurrency C, as in burst.py. API requests are counted per phase, once every pod, network
policy and kubelet sandbox of the phase is gone, and divided by the phase's lifecycles.

    .venv/bin/python bench/kubernetes.py                 # 30 sequential, 300 execs, burst 1000
    .venv/bin/python bench/kubernetes.py --quick         # 10 sequential, 50 execs, burst 50
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing as mp
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402
from burst import GOAL_SUCCESS, burst, error_key, rejections, sequential  # noqa: E402
from common import (  # noqa: E402
    REPO_ROOT,
    BenchServer,
    base_parser,
    console,
    finish,
    force_kill_group,
    leak_report,
    machine_busy_cpu_s,
    print_table,
    process_cpu_s,
    remove_group_dirs,
    summarize_ms,
    verdict,
)
from exec_latency import GOAL_RATIO, probe  # noqa: E402

sys.path.insert(0, str(REPO_ROOT))  # for tests.fakekube, in this process and the cluster's

from orchard.env.client import SandboxClient  # noqa: E402

# Any container image reference: the fake kubelet runs every image as the host's root.
IMAGE = "python:3.12-slim"
NAMESPACE = "orchard-sandboxes"  # tests.fakekube.cluster.NAMESPACE
DENY_EGRESS = "orchard-deny-egress"  # the namespace-wide policy, made once at start-up
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
GOAL_WRITES_BLOCKED = 2.0  # pod create + pod delete
GOAL_WRITES_OPEN = 4.0  # + allow-egress policy create + delete
GOAL_EXEC_API_REQUESTS = 0  # exec goes to the Pod IP, never through the API server


# --- the fake cluster, in a process of its own ----------------------------------------------


def _cluster_main(data_dir: str, conn: Connection) -> None:
    """Child process: run a FakeCluster and answer the parent's questions until "stop"."""
    from tests.fakekube.cluster import FakeCluster

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    # Its warnings (and its sandboxes' stderr) go to a log file, not into the tables.
    log_fd = os.open(Path(data_dir) / "cluster.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log_fd, 2)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    try:
        cluster = FakeCluster(Path(data_dir)).start()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    try:
        conn.send(("ok", {"kubeconfig": str(cluster.kubeconfig), "url": cluster.api.url}))
        while True:
            try:
                cmd = conn.recv()
            except EOFError:  # the parent is gone
                break
            if cmd[0] == "stop":
                break
            try:
                conn.send(("ok", _answer(cluster, cmd)))
            except Exception as exc:  # noqa: BLE001 - reported to the parent
                conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        cluster.stop()
    with contextlib.suppress(OSError):
        conn.send(("ok", "stopped"))


def _answer(cluster: Any, cmd: tuple[str, ...]) -> Any:
    api = cluster.api
    if cmd[0] == "pod_ip":
        pod = api.run_in_loop(api.get_object("pods", NAMESPACE, cmd[1])).result()
        return ((pod or {}).get("status") or {}).get("podIP")
    if cmd[0] == "requests":
        return Counter((r.method, r.verb, r.resource, r.subresource, r.watch, r.path
                        if r.resource is None else None) for r in api.requests)
    if cmd[0] == "state":
        pods = api.run_in_loop(api.list_objects("pods", NAMESPACE)).result()
        policies = api.run_in_loop(api.list_objects("networkpolicies", NAMESPACE)).result()
        return {"pods": len(pods),
                "allow_egress_policies": sum(p["metadata"]["name"] != DENY_EGRESS
                                             for p in policies),
                "kubelet_sandboxes": len(cluster.kubelet.sandboxes())}
    raise ValueError(f"unknown command {cmd!r}")


class ClusterProcess:
    """``FakeCluster`` in a spawned child process, with a short private data dir (AF_UNIX
    paths live below it) whose ``kubelet/bundle`` may point to a bundle cache kept between
    runs (``ensure_bundle`` keys it by the agent's sources, so a stale one is never used)."""

    def __init__(self, bundle_cache: Path | None, timeout: float = 300.0) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="obk-", dir="/tmp"))
        if bundle_cache is not None:
            bundle_cache.mkdir(parents=True, exist_ok=True)
            (self.dir / "kubelet").mkdir()
            (self.dir / "kubelet" / "bundle").symlink_to(bundle_cache)
        self.timeout = timeout
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_cluster_main, args=(str(self.dir), child),
                                name="fake-cluster")
        self._lock = threading.Lock()
        self.kubeconfig = self.url = ""

    def start(self) -> ClusterProcess:
        self.proc.start()
        info = self._reply()
        self.kubeconfig, self.url = info["kubeconfig"], info["url"]
        return self

    def _reply(self) -> Any:
        if not self._conn.poll(self.timeout):
            raise RuntimeError(f"the fake cluster did not answer within {self.timeout:.0f}s")
        status, value = self._conn.recv()
        if status != "ok":
            raise RuntimeError(f"fake cluster: {value}")
        return value

    def call(self, *cmd: str) -> Any:
        with self._lock:
            self._conn.send(tuple(cmd))
            return self._reply()

    def requests(self) -> Counter[tuple[Any, ...]]:
        """Every HTTP request its API server received so far, counted by kind."""
        return self.call("requests")

    def state(self) -> dict[str, int]:
        return self.call("state")

    def pod_ip(self, name: str) -> str | None:
        return self.call("pod_ip", name)

    def drained(self) -> bool:
        """No pod, no per-sandbox network policy, no kubelet sandbox left (True if the
        cluster is gone: nothing to wait for)."""
        if not self.proc.is_alive():
            return True
        try:
            return not any(self.state().values())
        except (RuntimeError, OSError, EOFError):
            return True

    def cpu_s(self) -> float:
        return process_cpu_s(self.proc.pid) if self.proc.pid else float("nan")

    def stop(self) -> dict[str, Any]:
        """What was left in the cluster, then stop it and check the kubelet leaked nothing."""
        report: dict[str, Any] = {}
        if self.proc.is_alive():
            with contextlib.suppress(RuntimeError, OSError, EOFError):
                report["left_at_stop"] = self.state()
            with contextlib.suppress(RuntimeError, OSError, EOFError):
                self.call("stop")
            self.proc.join(60)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join(10)
        report["exit_code"] = self.proc.exitcode
        with contextlib.suppress(OSError):
            log = (self.dir / "cluster.log").read_text(errors="replace")
            report["log_lines"] = log.count("\n")
            report["log_pending_tasks_destroyed"] = log.count("Task was destroyed but it is "
                                                             "pending")
            report["log_tail"] = log[-3000:]
        time.sleep(0.5)
        report.update(leak_report(self.dir, "kubelet"))
        if report["leaked"]:
            console.print(f"[bold red]fake kubelet LEAK after stop:[/bold red] {report}")
            report["force_killed"] = force_kill_group(self.dir, "kubelet")
            report["after_force_kill"] = leak_report(self.dir, "kubelet")
        remove_group_dirs(self.dir, "kubelet")
        shutil.rmtree(self.dir, ignore_errors=True)  # the bundle cache is only linked
        report["data_dir_removed"] = not self.dir.exists()
        return report


# --- API request accounting -----------------------------------------------------------------


def request_label(key: tuple[Any, ...]) -> str:
    method, verb, resource, sub, _watch, path = key
    if resource is None:
        return f"{method} {path}"  # discovery or an unknown path
    return f"{verb} {resource}{'/' + sub if sub else ''}"


def api_summary(delta: Counter[tuple[Any, ...]], lifecycles: int) -> dict[str, Any]:
    """Requests of one phase: writes, reads and watches, in all and per lifecycle."""
    writes: Counter[str] = Counter()
    reads: Counter[str] = Counter()
    watches: Counter[str] = Counter()
    for key, n in delta.items():
        method, watch = key[0], key[4]
        group = watches if watch else writes if method in WRITE_METHODS else reads
        group[request_label(key)] += n
    per = max(lifecycles, 1)
    return {
        "lifecycles": lifecycles,
        "writes": sum(writes.values()), "reads": sum(reads.values()),
        "watches": sum(watches.values()),
        "writes_per_lifecycle": sum(writes.values()) / per,
        "reads_per_lifecycle": sum(reads.values()) / per,
        "by_request": {"writes": dict(writes), "reads": dict(reads), "watches": dict(watches)},
        "by_request_per_lifecycle": {label: n / per for label, n in
                                     (writes + reads + watches).items()},
    }


def wait_drained(url: str, cluster: ClusterProcess, timeout: float) -> dict[str, Any]:
    """Poll until the orchestrator lists no sandbox and the cluster holds nothing of ours."""
    t0 = time.perf_counter()
    snapshots: dict[str, Any] = {}
    while True:
        listed = len(httpx.get(f"{url}/sandboxes", timeout=30.0).json()["sandboxes"])
        state = {"after_s": round(time.perf_counter() - t0, 2), "sandboxes_listed": listed,
                 **cluster.state()}
        snapshots.setdefault("immediately", state)
        done = not any(v for k, v in state.items() if k != "after_s")
        if done or state["after_s"] > timeout:
            snapshots["final"] = state
            snapshots["drained"] = done
            return snapshots
        time.sleep(0.1)


def phase_requests(url: str, cluster: ClusterProcess, before: Counter[tuple[Any, ...]],
                   lifecycles: int, timeout: float) -> dict[str, Any]:
    """The requests since ``before``, counted once the phase's sandboxes are all gone."""
    drain = wait_drained(url, cluster, timeout)
    return {**api_summary(cluster.requests() - before, lifecycles), "drain": drain}


# --- the phases -----------------------------------------------------------------------------


def exec_phase(url: str, cluster: ClusterProcess, n: int, warmup: int) -> dict[str, Any]:
    """exec_latency.probe on one pod, and the API requests made during its execs."""
    with SandboxClient(url, timeout=60.0) as client:
        sb = client.create_sandbox(IMAGE)
        pod_ip = cluster.pod_ip(sb.id)
        before = cluster.requests()
        out = probe(client, url, sb.id, n, warmup)
        during = api_summary(cluster.requests() - before, 0)
        sb.delete()
    out["api_requests_during_execs"] = during["writes"] + during["reads"]
    out["api_during_execs"] = during["by_request"]
    out["execs"] = 2 * (n + warmup)  # SDK + bare httpx, each round
    out["pod_ip"] = pod_ip
    return out


def open_network(url: str, n: int) -> dict[str, Any]:
    """n sequential lifecycles with block_network=false: create, wait, ``echo ok``, delete."""
    ready: list[float] = []
    failures: Counter[str] = Counter()
    ok = 0
    with SandboxClient(url, timeout=120.0) as client:
        for _ in range(n):
            stage, sb = "create", None
            try:
                t0 = time.perf_counter()
                sb = client.create_sandbox(IMAGE, block_network=False)
                ready.append(time.perf_counter() - t0)
                stage = "exec"
                r = sb.exec("echo ok")
                if r.exit_code != 0 or r.stdout != "ok\n":
                    raise ValueError(f"echo ok gave exit {r.exit_code}, stdout {r.stdout!r}")
                ok += 1
            except Exception as exc:  # noqa: BLE001 - counted, reported
                failures[error_key(stage, exc)] += 1
            finally:
                if sb is not None:
                    try:
                        sb.delete()
                    except Exception as exc:  # noqa: BLE001 - counted, reported
                        failures[error_key("delete", exc)] += 1
    return {"n": n, "succeeded": ok, "create_to_ready_ms": summarize_ms(ready),
            "failures": dict(failures)}


# --- main -----------------------------------------------------------------------------------


def main() -> int:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--seq-n", type=int, default=30, help="sequential create->ready samples")
    parser.add_argument("--exec-n", type=int, default=300, help="exec rounds (SDK + baseline)")
    parser.add_argument("--warmup", type=int, default=20, help="exec warm-up rounds")
    parser.add_argument("--open-n", type=int, default=10,
                        help="sequential lifecycles with block_network=false")
    parser.add_argument("--burst", type=int, default=1000, help="sandboxes in the burst")
    parser.add_argument("-c", "--concurrency", type=int, default=64, help="client tasks at once")
    parser.add_argument("--max-concurrent-creates", type=int, default=64)
    parser.add_argument("--max-api-concurrency", type=int,
                        help="kubernetes.max_api_concurrency (default: the backend's)")
    parser.add_argument("--retries", type=int, default=30, help="SDK retries on 503")
    parser.add_argument("--settle-timeout", type=float, default=120.0,
                        help="seconds to wait for a phase's pods to be gone")
    parser.add_argument("--bundle-cache", type=Path,
                        help="a directory to keep the fake kubelet's agent bundle in between "
                        "runs (default: build a fresh one in the temp dir)")
    args = parser.parse_args()
    if args.quick:
        args.seq_n, args.exec_n, args.warmup, args.open_n, args.burst = 10, 50, 5, 5, 50

    results: dict[str, Any] = {}
    cluster = ClusterProcess(args.bundle_cache)
    srv: BenchServer | None = None
    try:
        console.print(f"starting the fake cluster in {cluster.dir} ...")
        t0 = time.perf_counter()
        cluster.start()
        results["cluster_start_s"] = time.perf_counter() - t0
        kube: dict[str, Any] = {"kubeconfig": cluster.kubeconfig, "namespace": NAMESPACE,
                                "agent_secret": "bench-secret"}
        if args.max_api_concurrency:
            kube["max_api_concurrency"] = args.max_api_concurrency
        srv = BenchServer(max_sandboxes=max(args.burst, args.seq_n) + 8, port=args.port,
                          max_concurrent_creates=args.max_concurrent_creates,
                          settings={"backend": "kubernetes", "kubernetes": kube},
                          drained=cluster.drained)
        with srv:
            url, settle = srv.url, args.settle_timeout
            console.print(f"orchestrator at {url}; fake API server at {cluster.url}")
            api: dict[str, Any] = {"startup": api_summary(cluster.requests(), 0)}
            results["api"] = api

            console.print(f"(1) {args.seq_n} sequential create->ready ...")
            before = cluster.requests()
            results["sequential"] = sequential(url, args.seq_n, IMAGE)
            api["sequential_blocked"] = phase_requests(url, cluster, before, args.seq_n, settle)

            console.print(f"(2) {args.exec_n} exec rounds over the Pod IP ...")
            before = cluster.requests()
            results["exec"] = exec_phase(url, cluster, args.exec_n, args.warmup)
            api["exec_one_sandbox"] = phase_requests(url, cluster, before, 1, settle)

            console.print(f"(3) {args.open_n} lifecycles with block_network=false ...")
            before = cluster.requests()
            results["open_network"] = open_network(url, args.open_n)
            api["sequential_open"] = phase_requests(url, cluster, before, args.open_n, settle)

            console.print(f"(4) burst of {args.burst} at concurrency {args.concurrency} ...")
            before = cluster.requests()
            rej0 = rejections(url)
            assert srv.proc is not None
            cpu0 = (process_cpu_s(srv.proc.pid), cluster.cpu_s(), process_cpu_s(os.getpid()),
                    machine_busy_cpu_s())
            results["burst"] = b = asyncio.run(
                burst(url, args.burst, args.concurrency, args.retries, IMAGE))
            cpu1 = (process_cpu_s(srv.proc.pid), cluster.cpu_s(), process_cpu_s(os.getpid()),
                    machine_busy_cpu_s())
            b["http_503s"] = rejections(url) - rej0
            b["cpu_s"] = {k: end - start for k, start, end in zip(
                ("orchestrator", "fake_cluster", "client", "machine_busy"), cpu0, cpu1,
                strict=True)}
            b["machine_cpu_capacity_s"] = b["wall_s"] * (os.cpu_count() or 1)
            api["burst_blocked"] = phase_requests(url, cluster, before, args.burst, settle)
            api["whole_run"] = api_summary(cluster.requests(), 0)
            with contextlib.suppress(httpx.HTTPError, KeyError, TypeError):
                # The orchestrator's own count (watch requests excluded), for comparison.
                res = httpx.get(f"{url}/resources", timeout=10.0).json()
                api["orchestrator_api_calls"] = res["cgroup"].get("api_calls")
            results["orchestrator_log_tail"] = srv.log_tail(3000)
        results["orchestrator_stopped"] = srv.proc is not None and srv.proc.poll() is not None
    finally:
        results["cluster_teardown"] = cluster.stop()
    assert srv is not None
    rc = finish("kubernetes", args, results, srv, report)
    return rc or int(bool(results["cluster_teardown"].get("leaked")
                          or not results["goals"]["clean_after_run"]["value"]))


def report(args: Any, r: dict[str, Any]) -> None:
    seq, ex, op, b, api = r["sequential"], r["exec"], r["open_network"], r["burst"], r["api"]
    rows = []
    for label, m in (("sequential: POST /sandboxes -> ready", seq["create_to_ready_ms"]),
                     ("sequential: POST /sandboxes alone", seq["post_ms"]),
                     ("sequential: DELETE", seq["delete_ms"]),
                     ("raw `bash -c true` on the host (baseline)", ex["raw_ms"]),
                     ("SDK exec ['true'] over the Pod IP", ex["sdk_ms"]),
                     ("bare httpx POST /exec", ex["httpx_ms"]),
                     ("agent-side run (job started->completed)", ex["agent_run_ms"]),
                     ("block_network=false: create -> ready", op["create_to_ready_ms"]),
                     ("burst: POST /sandboxes (incl. 503 retries)", b["post_ms"]),
                     ("burst: POST -> ready", b["create_to_ready_ms"]),
                     ("burst: exec `echo ok`", b["exec_ms"]),
                     ("burst: DELETE", b["delete_ms"]),
                     ("burst: whole lifecycle", b["lifecycle_ms"])):
        rows.append((label, m["n"], m.get("p50", 0.0), m.get("p99", 0.0), m.get("mean", 0.0),
                     m.get("max", 0.0)))
    print_table("latency (ms)", ["measurement", "n", "p50", "p99", "mean", "max"], rows)
    if ex.get("service_agent_roundtrip_mean_ms") is not None:
        console.print(f"orchestrator -> agent round trip (service histogram, mean): "
                      f"{ex['service_agent_roundtrip_mean_ms']:.2f} ms")
    cpu = b["cpu_s"]
    console.print(
        f"burst: {b['succeeded']}/{b['n']} succeeded ({100 * b['success_rate']:.1f}%), wall "
        f"{b['wall_s']:.1f} s, {b['lifecycles_per_s']:.1f} lifecycles/s, 503s seen: "
        f"{b['http_503s']:.0f}")
    console.print(
        f"CPU during the burst (s): orchestrator {cpu['orchestrator']:.1f} "
        f"({1000 * cpu['orchestrator'] / max(b['n'], 1):.1f} ms per lifecycle), fake cluster (API "
        f"server + kubelet + Pod IP relays) {cpu['fake_cluster']:.1f}, this client "
        f"{cpu['client']:.1f}; whole machine busy {cpu['machine_busy']:.1f} of "
        f"{b['machine_cpu_capacity_s']:.1f} (includes the sandboxes and anything else running)")
    failures: Counter[str] = Counter()
    for phase in (seq, ex, op, b):
        failures.update(phase.get("failures") or {})
    for key, count in failures.most_common():
        console.print(f"[red]  {count:5d} x {key}[/red]")

    phases = (("orchestrator start-up", "startup"),
              ("sequential, blocked net", "sequential_blocked"),
              ("1 sandbox + exec rounds", "exec_one_sandbox"),
              ("sequential, open net", "sequential_open"),
              (f"burst of {b['n']}, blocked net", "burst_blocked"),
              ("whole run", "whole_run"))
    rows = []
    for label, key in phases:
        s = api[key]
        n = s["lifecycles"]
        rows.append((label, n or "-", s["writes"], s["reads"], s["watches"],
                     s["writes_per_lifecycle"] if n else "-",
                     s["reads_per_lifecycle"] if n else "-"))
    print_table("Kubernetes API requests the fake API server received (lc: lifecycle)",
                ["phase", "lc", "writes", "reads", "watches", "writes/lc", "reads/lc"], rows)
    for label, key in phases:
        s = api[key]
        counts = {**s["by_request"]["writes"], **s["by_request"]["reads"],
                  **s["by_request"]["watches"]}
        console.print(f"  {label}: " + (", ".join(f"{k}={v}" for k, v in sorted(counts.items()))
                                         or "none"))
    console.print("  (writes: POST/PUT/PATCH/DELETE; watches: GET ?watch=true; the kubelet's "
                  "pod status writes are in-process and not counted)")
    console.print(f"API requests during {ex['execs']} execs (to the pod at {ex['pod_ip']}): "
                  f"{ex['api_requests_during_execs']} ({ex['api_during_execs']})")
    if api.get("orchestrator_api_calls") is not None:
        console.print(f"the orchestrator's own count (GET /resources, watches not counted): "
                      f"{api['orchestrator_api_calls']}")
    for label, key in phases[1:5]:
        drain = api[key]["drain"]
        if not drain["drained"]:
            console.print(f"[red]{label}: not drained after {drain['final']['after_s']} s: "
                          f"{drain['final']}[/red]")

    left = r["cluster_teardown"].get("left_at_stop")  # None: the cluster did not answer
    clean = (left is not None and not any(left.values()) and r.get("orchestrator_stopped", False)
             and not r["cluster_teardown"].get("leaked"))
    blocked = max(api["sequential_blocked"]["writes_per_lifecycle"],
                  api["burst_blocked"]["writes_per_lifecycle"])
    opened = api["sequential_open"]["writes_per_lifecycle"]
    ratio = ex["sdk_ms"]["p50"] / ex["raw_ms"]["p50"]
    other_failures = sum(sum((phase.get("failures") or {}).values()) for phase in (seq, ex, op))
    r["goals"] = {
        "writes_per_lifecycle_blocked": {"value": blocked, "goal": GOAL_WRITES_BLOCKED,
                                         "verdict": verdict(blocked, GOAL_WRITES_BLOCKED)},
        "writes_per_lifecycle_open": {"value": opened, "goal": GOAL_WRITES_OPEN,
                                      "verdict": verdict(opened, GOAL_WRITES_OPEN)},
        "api_requests_during_execs": {
            "value": ex["api_requests_during_execs"], "goal": GOAL_EXEC_API_REQUESTS,
            "verdict": verdict(ex["api_requests_during_execs"], GOAL_EXEC_API_REQUESTS)},
        "exec_p50_ratio_to_raw": {"value": ratio, "goal": GOAL_RATIO,
                                  "verdict": verdict(ratio, GOAL_RATIO)},
        "failures_outside_burst": {"value": other_failures, "goal": 0,
                                   "verdict": verdict(other_failures, 0)},
        "burst_success_rate": {"value": b["success_rate"], "goal": GOAL_SUCCESS,
                               "verdict": "met" if b["success_rate"] >= GOAL_SUCCESS
                               else "NOT met"},
        "clean_after_run": {"value": clean, "goal": True, "verdict": "met" if clean
                            else "NOT met", "left_at_stop": left},
    }
    g = r["goals"]
    print_table("goals", ["goal", "measured", "target", "verdict"], [
        ("API writes/lifecycle, blocked net (worst of seq., burst)", blocked,
         f"<= {GOAL_WRITES_BLOCKED:.0f}", g["writes_per_lifecycle_blocked"]["verdict"]),
        ("API writes/lifecycle, open net (expected 4)", opened,
         f"<= {GOAL_WRITES_OPEN:.0f}", g["writes_per_lifecycle_open"]["verdict"]),
        ("API requests during the exec rounds", ex["api_requests_during_execs"],
         str(GOAL_EXEC_API_REQUESTS), g["api_requests_during_execs"]["verdict"]),
        ("p50 SDK exec via Pod IP / p50 raw spawn", ratio,
         f"<= {GOAL_RATIO}x", g["exec_p50_ratio_to_raw"]["verdict"]),
        ("failures outside the burst", other_failures, "0",
         g["failures_outside_burst"]["verdict"]),
        (f"burst success rate, {b['n']} at {b['concurrency']}",
         f"{100 * b['success_rate']:.1f}%", "100%", g["burst_success_rate"]["verdict"]),
        ("after: no pod/kubelet sandbox, orchestrator stopped", str(clean),
         "True", g["clean_after_run"]["verdict"]),
    ])
    t = r["cluster_teardown"]
    console.print(
        f"fake cluster teardown: left at stop {left or 'unknown'}, exit code {t.get('exit_code')}"
        f", log lines {t.get('log_lines')} (of which 'Task was destroyed but it is pending', "
        f"from the kubelet's Pod IP relays: {t.get('log_pending_tasks_destroyed')}), "
        f"kubelet cgroups with processes {len(t.get('cgroups_with_processes', {}))}, "
        f"processes left {len(t.get('processes_left', []))}, data dir removed "
        f"{t.get('data_dir_removed')}; orchestrator stopped: {r.get('orchestrator_stopped')}")


if __name__ == "__main__":
    sys.exit(main())
