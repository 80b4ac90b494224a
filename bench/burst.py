"""Create->ready latency, and a burst of N sandbox lifecycles at bounded client concurrency.

Sequential: n times POST /sandboxes then GET /sandboxes/{id}/wait (the SDK's create_sandbox),
then delete. Burst: N tasks, at most C at a time, each: create (the SDK retries 503s after
Retry-After: admission is the server's), wait ready, exec ``echo ok`` (must print ok), delete.
Afterwards it checks that every sandbox is gone and no cgroup of this orchestrator still holds
a process.

    .venv/bin/python bench/burst.py                  # 50 sequential + a burst of 1000
    .venv/bin/python bench/burst.py --quick          # 10 sequential + a burst of 50
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402
from common import (  # noqa: E402
    BenchServer,
    base_parser,
    cgroup_pids,
    console,
    finish,
    group_dirs,
    machine_busy_cpu_s,
    print_table,
    process_cpu_s,
    summarize_ms,
    verdict,
)

from orchard.env.client import AsyncSandboxClient, RetryPolicy, SandboxClient  # noqa: E402

GOAL_WALL_S = 26.0
GOAL_SUCCESS = 1.0
_IDS = re.compile(r"\b(sb|job)-[0-9a-f]{6,}\b")


def error_key(stage: str, exc: BaseException | str) -> str:
    """A failure's group: the stage plus the message with ids blanked out."""
    text = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
    return f"{stage}: " + _IDS.sub(lambda m: f"{m[1]}-*", text)[:240]


def metric(url: str, name: str) -> float:
    """The value of an unlabelled counter/gauge (or a histogram's _sum/_count) in /metrics."""
    for line in httpx.get(f"{url}/metrics", timeout=10.0).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def rejections(url: str) -> float:
    return metric(url, "orchard_admission_rejections_total")


def quota(disk: str | None) -> dict[str, str]:
    """Only when asked for: the SDK of older checkouts (benched for comparison) has no disk."""
    return {"disk": disk} if disk else {}


# --- sequential create->ready -----------------------------------------------------------


def sequential(url: str, n: int, image: str = "host", disk: str | None = None
               ) -> dict[str, Any]:
    """n times: POST /sandboxes, wait ready, delete."""
    post: list[float] = []
    ready: list[float] = []
    delete: list[float] = []
    failures: Counter[str] = Counter()
    with SandboxClient(url, timeout=120.0) as client:
        for _ in range(n):
            t0 = time.perf_counter()
            sb = None
            try:
                sb = client.create_sandbox(image, wait=False, **quota(disk))
                t1 = time.perf_counter()
                sb.wait_ready(120.0)
                t2 = time.perf_counter()
            except Exception as exc:  # noqa: BLE001 - counted, reported
                failures[error_key("create", exc)] += 1
                if sb is not None:
                    with contextlib.suppress(Exception):
                        sb.delete()
                continue
            post.append(t1 - t0)
            ready.append(t2 - t0)
            t3 = time.perf_counter()
            try:
                sb.delete()
            except Exception as exc:  # noqa: BLE001 - counted, reported
                failures[error_key("delete", exc)] += 1
            delete.append(time.perf_counter() - t3)
    return {"create_to_ready_ms": summarize_ms(ready), "post_ms": summarize_ms(post),
            "delete_ms": summarize_ms(delete), "failures": dict(failures)}



# --- the burst ------------------------------------------------------------------------------


async def burst(url: str, n: int, concurrency: int, retries: int,
                image: str = "host", disk: str | None = None) -> dict[str, Any]:
    """N lifecycles, at most concurrency at a time: create (POST, then wait ready: timed
    apart), exec ``echo ok`` (must print ok), delete."""
    sem = asyncio.Semaphore(concurrency)
    times: dict[str, list[float]] = {k: [] for k in ("post", "ready_wait", "create_to_ready",
                                                      "exec", "delete", "lifecycle")}
    failures: Counter[str] = Counter()
    ok = 0
    policy = RetryPolicy(retries=retries, max_retry_after=10.0)
    async with AsyncSandboxClient(url, timeout=120.0, retry=policy) as client:

        async def task() -> None:
            nonlocal ok
            async with sem:
                stage, sb = "create", None
                try:
                    t0 = time.perf_counter()
                    sb = await client.create_sandbox(image, wait=False, **quota(disk))
                    t1 = time.perf_counter()
                    stage = "wait ready"
                    await sb.wait_ready(300.0)
                    t2 = time.perf_counter()
                    stage = "exec"
                    r = await sb.exec("echo ok")
                    t3 = time.perf_counter()
                    if r.exit_code != 0 or r.stdout != "ok\n":
                        raise ValueError(f"echo ok gave exit {r.exit_code}, stdout "
                                         f"{r.stdout!r}, stderr {r.stderr[:100]!r}")
                    stage = "delete"
                    await sb.delete()
                    sb = None
                    t4 = time.perf_counter()
                    for key, value in (("post", t1 - t0), ("ready_wait", t2 - t1),
                                       ("create_to_ready", t2 - t0), ("exec", t3 - t2),
                                       ("delete", t4 - t3), ("lifecycle", t4 - t0)):
                        times[key].append(value)
                    ok += 1
                except Exception as exc:  # noqa: BLE001 - counted, reported
                    failures[error_key(stage, exc)] += 1
                finally:
                    if sb is not None:  # failed after create: do not leave it behind
                        try:
                            await sb.delete()
                        except Exception as exc:  # noqa: BLE001
                            failures[error_key("cleanup delete", exc)] += 1

        t_start = time.perf_counter()
        await asyncio.gather(*(task() for _ in range(n)))
        wall = time.perf_counter() - t_start
    return {
        "n": n, "concurrency": concurrency, "succeeded": ok, "failed": n - ok,
        "success_rate": ok / n if n else 0.0, "wall_s": wall, "lifecycles_per_s": ok / wall,
        # every lifecycle that got past its exec ran one command
        "commands_per_s": len(times["exec"]) / wall,
        **{f"{k}_ms": summarize_ms(v) for k, v in times.items()},
        "failures": dict(failures),
    }



def settle(url: str, data_dir: Path, timeout: float) -> dict[str, Any]:
    """Wait until no sandbox is listed and no cgroup of ours holds a process."""
    t0 = time.perf_counter()
    snapshots = {}
    while True:
        listed = len(httpx.get(f"{url}/sandboxes", timeout=30.0).json()["sandboxes"])
        busy = {str(d) for g in group_dirs(data_dir) for d in g.iterdir()
                if d.is_dir() and cgroup_pids(d)}
        dirs = sum(1 for g in group_dirs(data_dir) for d in g.iterdir() if d.is_dir())
        elapsed = time.perf_counter() - t0
        state = {"after_s": round(elapsed, 2), "sandboxes_listed": listed,
                 "cgroups_with_processes": len(busy), "cgroup_dirs": dirs,
                 "examples": sorted(busy)[:5]}
        if not snapshots:
            snapshots["immediately"] = state
        if elapsed >= 2.0 and "after_2s" not in snapshots:
            snapshots["after_2s"] = state
        if (listed == 0 and not busy and elapsed >= 2.0) or elapsed > timeout:
            snapshots["final"] = state
            return snapshots
        time.sleep(0.25)


def main() -> int:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--seq-n", type=int, default=50, help="sequential create->ready samples")
    parser.add_argument("-n", "--n", type=int, default=1000, help="sandboxes in the burst")
    parser.add_argument("-c", "--concurrency", type=int, default=64, help="client tasks at once")
    parser.add_argument("--max-concurrent-creates", type=int, default=64)
    parser.add_argument("--retries", type=int, default=30, help="SDK retries on 503")
    parser.add_argument("--settle-timeout", type=float, default=60.0)
    parser.add_argument("--disk", help="a disk quota for every sandbox, e.g. 10Gi")
    args = parser.parse_args()
    if args.quick:
        args.seq_n, args.n = 10, 50

    max_sandboxes = max(args.n, args.seq_n) + 8
    results: dict[str, Any] = {}
    with BenchServer(max_sandboxes=max_sandboxes, port=args.port,
                     max_concurrent_creates=args.max_concurrent_creates) as srv:
        console.print(f"orchestrator at {srv.url}; data dir {srv.data_dir}")
        results["sequential"] = sequential(srv.url, args.seq_n, disk=args.disk)
        console.print(f"burst of {args.n} at concurrency {args.concurrency} ...")
        rej0 = rejections(srv.url)
        assert srv.proc is not None
        cpu0, busy0 = process_cpu_s(srv.proc.pid), machine_busy_cpu_s()
        results["burst"] = b = asyncio.run(burst(srv.url, args.n, args.concurrency, args.retries,
                                                 disk=args.disk))
        b["http_503s"] = rejections(srv.url) - rej0
        b["orchestrator_cpu_s"] = process_cpu_s(srv.proc.pid) - cpu0
        b["machine_busy_cpu_s"] = machine_busy_cpu_s() - busy0
        b["machine_cpu_capacity_s"] = b["wall_s"] * (os.cpu_count() or 1)
        results["after_burst"] = settle(srv.url, srv.data_dir, args.settle_timeout)
    return finish("burst", args, results, srv, report)


def report(args: Any, r: dict[str, Any]) -> None:
    seq, b = r["sequential"], r["burst"]
    rows = []
    for label, m in (("sequential: POST /sandboxes -> ready", seq["create_to_ready_ms"]),
                     ("sequential: POST /sandboxes alone", seq["post_ms"]),
                     ("sequential: DELETE", seq["delete_ms"]),
                     ("burst: POST /sandboxes (incl. 503 retries)", b["post_ms"]),
                     ("burst: create -> ready (incl. 503 retries)", b["create_to_ready_ms"]),
                     ("burst: exec `echo ok`", b["exec_ms"]),
                     ("burst: DELETE", b["delete_ms"])):
        rows.append((label, m["n"], m.get("p50", 0.0), m.get("p99", 0.0), m.get("mean", 0.0),
                     m.get("max", 0.0)))
    print_table("latency (ms)", ["measurement", "n", "p50", "p99", "mean", "max"], rows)
    console.print(
        f"burst: {b['succeeded']}/{b['n']} succeeded ({100 * b['success_rate']:.1f}%), "
        f"wall {b['wall_s']:.1f} s, {b['commands_per_s']:.1f} commands/s, "
        f"{b['lifecycles_per_s']:.1f} lifecycles/s, 503s seen: {b['http_503s']:.0f}")
    console.print(
        f"CPU during the burst: orchestrator process {b['orchestrator_cpu_s']:.1f} s "
        f"({1000 * b['orchestrator_cpu_s'] / b['n']:.1f} ms per lifecycle); whole machine busy "
        f"{b['machine_busy_cpu_s']:.1f} of {b['machine_cpu_capacity_s']:.1f} CPU-s (includes "
        "this client, the sandboxes and anything else running)")
    for key, count in sorted({**seq["failures"], **b["failures"]}.items(), key=lambda kv: -kv[1]):
        console.print(f"[red]  {count:5d} x {key}[/red]")
    for when, state in r["after_burst"].items():
        console.print(f"after the burst ({when}, {state['after_s']} s): {state['sandboxes_listed']}"
                      f" sandboxes listed, {state['cgroups_with_processes']} cgroups with "
                      f"processes, {state['cgroup_dirs']} cgroup dirs left")
    final = r["after_burst"]["final"]
    clean = final["sandboxes_listed"] == 0 and final["cgroups_with_processes"] == 0
    r["goals"] = {
        "success_rate": {"value": b["success_rate"], "goal": GOAL_SUCCESS,
                         "verdict": "met" if b["success_rate"] >= GOAL_SUCCESS else "NOT met"},
        "wall_s": {"value": b["wall_s"], "goal": GOAL_WALL_S,
                   "verdict": verdict(b["wall_s"], GOAL_WALL_S)},
        "no_leak_after_burst": {"value": clean, "goal": True,
                                "verdict": "met" if clean else "NOT met"},
    }
    g = r["goals"]
    print_table("goals", ["goal", "measured", "target", "verdict"], [
        (f"success rate, burst of {b['n']}", f"{100 * b['success_rate']:.1f}%", "100%",
         g["success_rate"]["verdict"]),
        (f"wall time, burst of {b['n']} at {b['concurrency']} (s)", b["wall_s"],
         f"<= {GOAL_WALL_S}", g["wall_s"]["verdict"]),
        ("every sandbox gone, no cgroup with processes", str(clean), "True",
         g["no_leak_after_burst"]["verdict"]),
    ])


if __name__ == "__main__":
    sys.exit(main())
