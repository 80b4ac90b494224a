"""The sandbox's browser: start (cold and warm), action round trips, memory of 8 at once.

One orchestrator, one run, "host" sandboxes serving a small page from inside themselves.

* start: the first browser action in a fresh sandbox (Chromium starts), against the next one
  in the same sandbox (already running), ``-n`` sandboxes;
* round trip: ``--actions`` alternating type+observe actions, tree only and with a marked
  screenshot, next to a bare exec of ``true`` in the same sandbox (the baseline);
* memory: ``--concurrent`` sandboxes with a browser open at once, each one's cgroup memory
  (the sandbox's own accounting: agent, Chromium and its renderer);
* eval: ``orchard eval`` of the bundled web tasks with the scripted web teacher (solving
  everything), 2 at a time: wall time and rollouts per minute.

    .venv/bin/python bench/browser.py [-n 5] [--actions 40] [--concurrent 8] [--quick]
"""

from __future__ import annotations

import concurrent.futures
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    BenchServer,
    base_parser,
    finish,
    print_table,
    sandbox_cgroup,
    summarize_ms,
)

from orchard.env.client import Sandbox, SandboxClient  # noqa: E402

PAGE = ("<!doctype html><title>Bench</title><h1>Bench</h1><input aria-label=Name>"
        "<button onclick=\"document.getElementById('o').textContent='hi '+"
        "document.querySelector('input').value\">Greet</button><p id=o>-</p>"
        + "".join(f"<p>row {i} <a href='#r{i}'>link {i}</a></p>" for i in range(40)))


def with_site(client: SandboxClient) -> tuple[Sandbox, str]:
    sb = client.create_sandbox(memory="2Gi")
    sb.upload_content(PAGE.encode(), "/workspace/site/index.html")
    sb.start_process("python3 -m http.server 8000 --bind 127.0.0.1 --directory /workspace/site")
    while not sb.exec("python3 -c \"import urllib.request as u; "
                      "u.urlopen('http://127.0.0.1:8000/')\"").ok:
        time.sleep(0.05)
    return sb, "http://127.0.0.1:8000/index.html"


def starts(client: SandboxClient, n: int) -> dict[str, Any]:
    cold, warm = [], []
    for _ in range(n):
        sb, url = with_site(client)
        try:
            t0 = time.perf_counter()
            sb.browser("goto", url=url)
            cold.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            sb.browser("goto", url=url)
            warm.append(time.perf_counter() - t0)
        finally:
            sb.delete()
    return {"cold": summarize_ms(cold), "warm": summarize_ms(warm)}


def round_trips(client: SandboxClient, n: int) -> dict[str, Any]:
    sb, url = with_site(client)
    try:
        page = sb.browser("goto", url=url)
        box = next(int(line.split("]")[0].strip()[1:]) for line in page.tree.splitlines()
                   if "textbox" in line)
        tree, shot, execs = [], [], []
        for i in range(n):
            t0 = time.perf_counter()
            sb.browser("type", id=box, text=f"name {i}")
            tree.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            sb.browser("type", id=box, text=f"name {i}", screenshot=True)
            shot.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            sb.exec(["true"])
            execs.append(time.perf_counter() - t0)
    finally:
        sb.delete()
    return {"tree": summarize_ms(tree), "screenshot": summarize_ms(shot),
            "exec": summarize_ms(execs)}


def memory(client: SandboxClient, server: BenchServer, n: int) -> dict[str, Any]:
    made = [with_site(client) for _ in range(n)]
    try:
        with concurrent.futures.ThreadPoolExecutor(n) as pool:
            list(pool.map(lambda s: s[0].browser("goto", url=s[1]), made))
        time.sleep(2)  # let the renderers settle
        used = []
        for sb, _ in made:
            mem = _cgroup_memory(server, sb.id)
            if mem is not None:
                used.append(mem)
    finally:
        for sb, _ in made:
            sb.delete()
    return {"n": n, "per_sandbox_mib": [u / 2**20 for u in used],
            "median_mib": statistics.median(used) / 2**20 if used else None}


def _cgroup_memory(server: BenchServer, sandbox_id: str) -> int | None:
    group = sandbox_cgroup(server.data_dir, sandbox_id)
    if group is None:
        return None
    memory = Path(str(group).replace("/pids/", "/memory/"))
    for name in ("memory.current", "memory.usage_in_bytes"):
        for d in (group, memory):
            if (d / name).exists():
                return int((d / name).read_text())
    return None


def web_eval(client: SandboxClient, quick: bool) -> dict[str, Any]:
    from orchard.domains import make_harness
    from orchard.domains.web import load_web_tasks
    from orchard.eval import RunConfig, evaluate

    tasks = load_web_tasks()[:4 if quick else None]
    with tempfile.TemporaryDirectory(prefix="orchard-bench-web-") as tmp:
        out = Path(tmp)
        t0 = time.perf_counter()
        summary = evaluate(tasks, make_harness("web-teacher", tasks), out, client,
                           config=RunConfig(out=out, concurrency=2))
        wall = time.perf_counter() - t0
    overall = summary["overall"]
    return {"tasks": len(tasks), "wall_s": wall, "resolved_rate": overall["resolved_rate"],
            "rollouts_per_minute": overall.get("rollouts_per_minute")}


def report(args: Any, r: dict[str, Any]) -> None:
    s, t, m = r["start"], r["round_trip"], r["memory"]
    rows = [
        ["browser start, cold (first action in a sandbox)", f"{s['cold']['p50']:.0f} ms", ""],
        ["same action, browser running (warm)", f"{s['warm']['p50']:.0f} ms",
         f"cold / warm {s['cold']['p50'] / s['warm']['p50']:.1f}x"],
        ["action round trip, tree only (p50)", f"{t['tree']['p50']:.1f} ms",
         f"{t['tree']['p50'] / t['exec']['p50']:.1f}x an exec"],
        ["action round trip, with marked screenshot (p50)", f"{t['screenshot']['p50']:.1f} ms",
         f"{t['screenshot']['p50'] / t['exec']['p50']:.1f}x an exec"],
        ["exec of true, same sandbox (baseline, p50)", f"{t['exec']['p50']:.1f} ms", ""],
        [f"memory per sandbox, {m['n']} browsers at once (median)",
         f"{m['median_mib']:.0f} MiB" if m["median_mib"] else "n/a", "cgroup accounting"],
        [f"eval of {r['eval']['tasks']} web tasks, web teacher, 2 at a time",
         f"{r['eval']['wall_s']:.1f} s", f"resolved {r['eval']['resolved_rate']:.0%}, "
         f"{r['eval']['rollouts_per_minute']:.1f} rollouts/min"],
    ]
    print_table("the sandbox's browser (one run)", ["what", "measured", "vs"], rows)


def main() -> int:
    parser = base_parser(__doc__ or "")
    parser.add_argument("-n", type=int, default=5)
    parser.add_argument("--actions", type=int, default=40)
    parser.add_argument("--concurrent", type=int, default=8)
    args = parser.parse_args()
    if args.quick:
        args.n, args.actions, args.concurrent = 2, 5, 2
    server = BenchServer()
    results: dict[str, Any] = {}
    with server, SandboxClient(server.url, timeout=300) as client:
        results["start"] = starts(client, args.n)
        results["round_trip"] = round_trips(client, args.actions)
        results["memory"] = memory(client, server, args.concurrent)
        results["eval"] = web_eval(client, args.quick)
    return finish("browser", args, results, server, report)


if __name__ == "__main__":
    sys.exit(main())
