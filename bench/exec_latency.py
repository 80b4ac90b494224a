"""Exec round-trip latency and throughput, side by side with a raw host spawn.

(a) raw ``bash -c true`` spawns on the host; (b) ``exec(["true"])`` through the SDK over HTTP
with one sandbox (plus the same through bare httpx, to see what the SDK costs); (c) the same
probe while N sandboxes are live and a load generator (a separate process) keeps execs running
across them; (d) throughput: K concurrent clients exec'ing ``true`` for a few seconds.

    .venv/bin/python bench/exec_latency.py            # full run (~2 min)
    .venv/bin/python bench/exec_latency.py --quick    # smoke run
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import subprocess
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
    console,
    create_sandboxes,
    finish,
    print_table,
    summarize_ms,
    verdict,
)

from orchard.env.client import AsyncSandboxClient, SandboxClient  # noqa: E402

LOAD_COMMAND = "i=0; while [ $i -lt 2000 ]; do i=$((i+1)); done"
GOAL_P50_MS = 5.0
GOAL_RATIO = 3.0
GOAL_P99_LOADED_MS = 25.0
REFERENCE_MEAN_MS = 280.0


def _error_key(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:160]}"


# --- probes ---------------------------------------------------------------------------------


def _spawn_raw() -> None:
    subprocess.run(["bash", "-c", "true"], check=True)


def probe(client: SandboxClient, url: str, sandbox_id: str, n: int, warmup: int) -> dict[str, Any]:
    """n rounds, each: one raw host spawn, one SDK ``exec(["true"])``, one bare httpx POST.

    Interleaving puts the baseline and the two exec paths under the same noise (other jobs on
    this machine come and go). Also collects the agent-side run time of each job and the
    service's own exec histogram (agent round trip as seen by the orchestrator).
    """
    sb = client.get_sandbox(sandbox_id)
    path, body = f"/sandboxes/{sandbox_id}/exec", {"argv": ["true"]}
    raw: list[float] = []
    sdk: list[float] = []
    bare: list[float] = []
    inside: list[float] = []
    failures: Counter[str] = Counter()
    with httpx.Client(base_url=url, timeout=30.0) as http:
        for _ in range(warmup):
            sb.exec(["true"])
            http.post(path, json=body)
        before = exec_histogram(url)
        for _ in range(n):
            t0 = time.perf_counter()
            _spawn_raw()
            raw.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            try:
                r = sb.exec(["true"])
            except Exception as exc:  # noqa: BLE001 - counted, reported
                failures[_error_key(exc)] += 1
            else:
                sdk.append(time.perf_counter() - t0)
                if r.exit_code != 0:
                    failures[f"exit code {r.exit_code}"] += 1
                if r.started_at and r.completed_at:
                    inside.append((r.completed_at - r.started_at).total_seconds())
            t0 = time.perf_counter()
            resp = http.post(path, json=body)
            bare.append(time.perf_counter() - t0)
            if resp.status_code != 200 or resp.json().get("exit_code") != 0:
                failures[f"HTTP {resp.status_code}: {resp.text[:120]}"] += 1
        after = exec_histogram(url)
    count = after[1] - before[1]
    return {
        "raw_ms": summarize_ms(raw), "sdk_ms": summarize_ms(sdk), "httpx_ms": summarize_ms(bare),
        "agent_run_ms": summarize_ms(inside),
        "service_agent_roundtrip_mean_ms": (after[0] - before[0]) / count * 1000 if count else None,
        "failures": dict(failures),
    }


def exec_histogram(url: str) -> tuple[float, float]:
    """(sum, count) of the service's orchard_exec_seconds histogram."""
    text = httpx.get(f"{url}/metrics", timeout=10.0).text
    values = {}
    for line in text.splitlines():
        if line.startswith(("orchard_exec_seconds_sum", "orchard_exec_seconds_count")):
            name, value = line.split()
            values[name] = float(value)
    total = values.get("orchard_exec_seconds_sum", 0.0)
    return total, values.get("orchard_exec_seconds_count", 0.0)


# --- load generator (own process, so it does not share the probe's GIL) --------------------


async def _load(url: str, ids: list[str], concurrency: int, command: str,
                stop: Any) -> dict[str, Any]:
    done = 0
    failures: Counter[str] = Counter()
    times: list[float] = []
    async with AsyncSandboxClient(url, timeout=60.0, cleanup_on_close=False) as client:
        sandboxes = [await client.get_sandbox(sid) for sid in ids]
        cursor = iter(range(10**12))
        t_start = time.perf_counter()

        async def worker() -> None:
            nonlocal done
            while not stop.is_set():
                sb = sandboxes[next(cursor) % len(sandboxes)]
                ok = await _timed_exec(sb, command, times, failures)
                done += ok  # not `done += await ...`: that reads done before the await

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t_start
    return {"execs": done, "seconds": elapsed, "execs_per_s": done / elapsed,
            "latency_ms": summarize_ms(times), "failures": dict(failures),
            "sandboxes": len(ids), "concurrency": concurrency, "command": command}


async def _timed_exec(sb: Any, command: Any, times: list[float],
                      failures: Counter[str]) -> bool:
    """One exec, timed into ``times``; failures are counted by cause. True if it exited 0."""
    t0 = time.perf_counter()
    try:
        r = await sb.exec(command)
    except Exception as exc:  # noqa: BLE001 - counted, reported
        failures[_error_key(exc)] += 1
        return False
    times.append(time.perf_counter() - t0)
    if r.exit_code != 0:
        failures[f"exit code {r.exit_code}"] += 1
    return r.exit_code == 0


def load_process(url: str, ids: list[str], concurrency: int, command: str, stop: Any,
                 out: Any) -> None:
    try:
        out.put(asyncio.run(_load(url, ids, concurrency, command, stop)))
    except BaseException as exc:  # noqa: BLE001 - the parent reports it
        out.put({"error": _error_key(exc)})


# --- throughput -----------------------------------------------------------------------------


async def _throughput(url: str, ids: list[str], seconds: float) -> dict[str, Any]:
    clients = [AsyncSandboxClient(url, timeout=60.0, cleanup_on_close=False) for _ in ids]
    try:
        sandboxes = [await c.get_sandbox(sid) for c, sid in zip(clients, ids, strict=True)]
        done = 0
        failures: Counter[str] = Counter()
        times: list[float] = []
        deadline = time.perf_counter() + seconds

        async def worker(sb: Any) -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                ok = await _timed_exec(sb, ["true"], times, failures)
                done += ok

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(sb) for sb in sandboxes))
        elapsed = time.perf_counter() - t0
    finally:
        for c in clients:
            await c.close()
    return {"clients": len(ids), "seconds": elapsed, "execs": done, "execs_per_s": done / elapsed,
            "latency_ms": summarize_ms(times), "failures": dict(failures)}


# --- main -----------------------------------------------------------------------------------


def main() -> int:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("-n", "--n", type=int, default=300, help="probe execs per phase")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--sandboxes", type=int, default=100, help="live sandboxes under load")
    parser.add_argument("--load-concurrency", type=int, default=8, help="load execs in flight")
    parser.add_argument("--load-command", default=LOAD_COMMAND)
    parser.add_argument("--clients", type=int, default=16, help="throughput clients")
    parser.add_argument("--seconds", type=float, default=5.0, help="throughput duration")
    args = parser.parse_args()
    if args.quick:
        args.n, args.warmup = 50, 5
        args.sandboxes, args.clients, args.seconds = 10, 4, 1.0

    results: dict[str, Any] = {}
    with BenchServer(max_sandboxes=args.sandboxes + 8, port=args.port) as srv:
        client = SandboxClient(srv.url, timeout=60.0)
        try:
            console.print(f"orchestrator at {srv.url}; data dir {srv.data_dir}")
            probe_id = client.create_sandbox().id
            results["one_sandbox"] = probe(client, srv.url, probe_id, args.n, args.warmup)

            console.print(f"creating {args.sandboxes} sandboxes for the load ...")
            t0 = time.perf_counter()
            ids = create_sandboxes(srv.url, args.sandboxes, concurrency=16)
            results["load_sandboxes_created_s"] = time.perf_counter() - t0

            ctx = mp.get_context("spawn")
            stop, out = ctx.Event(), ctx.Queue()
            loader = ctx.Process(target=load_process, args=(
                srv.url, ids, args.load_concurrency, args.load_command, stop, out))
            loader.start()
            time.sleep(2.0)  # let the load reach its steady state
            try:
                results["loaded"] = probe(client, srv.url, probe_id, args.n, args.warmup)
            finally:
                stop.set()
                load = out.get(timeout=120)
                loader.join(30)
            results["load"] = load

            k = min(args.clients, len(ids))
            results["throughput"] = asyncio.run(_throughput(srv.url, ids[:k], args.seconds))
        finally:
            client.close()
    return finish("exec_latency", args, results, srv, report)


def report(args: Any, r: dict[str, Any]) -> None:
    one, loaded = r["one_sandbox"], r["loaded"]
    load, tput = r["load"], r["throughput"]
    rows = []
    for label, phase in (("1 sandbox", one), (f"{args.sandboxes} busy sandboxes", loaded)):
        for what, key in (("raw `bash -c true` on the host", "raw_ms"),
                          ("SDK exec ['true']", "sdk_ms"),
                          ("bare httpx POST /exec", "httpx_ms"),
                          ("agent-side run (job started->completed)", "agent_run_ms")):
            m = phase[key]
            rows.append((f"{label}: {what}", m["n"], m["p50"], m["p99"], m["mean"], m["max"]))
        mean = phase["service_agent_roundtrip_mean_ms"]
        if phase is one and mean is not None:  # under load the histogram mixes in the load
            rows.append((f"{label}: service->agent round trip (metrics, mean)", "", "", "",
                         mean, ""))
    print_table("exec round-trip latency (ms); each round = raw spawn, SDK exec, httpx exec",
                ["measurement", "n", "p50", "p99", "mean", "max"], rows)
    if "error" in load:
        console.print(f"[red]load generator failed: {load['error']}[/red]")
    else:
        console.print(
            f"(c) load: {load['execs']} execs of the load command in {load['seconds']:.1f} s = "
            f"{load['execs_per_s']:.1f}/s across {load['sandboxes']} sandboxes at "
            f"{load['concurrency']} in flight (p50 {load['latency_ms'].get('p50', 0):.1f} ms); "
            f"failures: {load['failures'] or 'none'}")
    console.print(
        f"(d) throughput: {tput['clients']} clients x `true` for {tput['seconds']:.1f} s: "
        f"{tput['execs_per_s']:.0f} execs/s (p50 {tput['latency_ms'].get('p50', 0):.1f} ms, "
        f"p99 {tput['latency_ms'].get('p99', 0):.1f} ms); failures: {tput['failures'] or 'none'}")
    failures = {k: v["failures"] for k, v in r.items()
                if isinstance(v, dict) and v.get("failures")}
    if failures:
        console.print(f"[red]failures: {failures}[/red]")
    p50, raw50 = one["sdk_ms"]["p50"], one["raw_ms"]["p50"]
    ratio = p50 / raw50
    p99 = loaded["sdk_ms"]["p99"]
    r["goals"] = {
        "p50_1_sandbox_ms": {"value": p50, "goal": GOAL_P50_MS,
                             "verdict": verdict(p50, GOAL_P50_MS)},
        "p50_ratio_to_raw": {"value": ratio, "goal": GOAL_RATIO,
                             "verdict": verdict(ratio, GOAL_RATIO)},
        "p99_loaded_ms": {"value": p99, "goal": GOAL_P99_LOADED_MS,
                          "verdict": verdict(p99, GOAL_P99_LOADED_MS)},
    }
    g = r["goals"]
    print_table("goals", ["goal", "measured", "target", "verdict"], [
        ("p50 SDK exec, 1 sandbox (ms)", p50, f"<= {GOAL_P50_MS}",
         g["p50_1_sandbox_ms"]["verdict"]),
        ("p50 SDK exec / p50 raw spawn (same rounds)", ratio, f"<= {GOAL_RATIO}x",
         g["p50_ratio_to_raw"]["verdict"]),
        (f"p99 SDK exec, {args.sandboxes} busy sandboxes (ms)", p99,
         f"<= {GOAL_P99_LOADED_MS}", g["p99_loaded_ms"]["verdict"]),
        ("(reference system, published mean, ms)", REFERENCE_MEAN_MS, "-", "-"),
    ])


if __name__ == "__main__":
    sys.exit(main())
