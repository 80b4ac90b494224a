"""Memory of idle sandboxes: PSS of every process in each sandbox's cgroup.

Creates N sandboxes, runs one ``true`` in each, waits, then sums the PSS
(``/proc/PID/smaps_rollup``) of the processes in each sandbox's cgroup, by role: the outer
bwrap (the launcher, exec'd from unshare -> sh), bwrap's init inside the pid namespace, and
the agent. Also the orchestrator's own RSS/PSS (and its growth per sandbox), and baselines:
bare ``bwrap ... sleep`` jails and a bare ``python3 -I -S -c 'import time; time.sleep(60)'``.

    .venv/bin/python bench/idle_memory.py             # N=100
    .venv/bin/python bench/idle_memory.py --quick     # N=10
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    BenchServer,
    base_parser,
    cgroup_pids,
    console,
    create_sandboxes_async,
    finish,
    percentile,
    print_table,
    sandbox_cgroup,
)

from orchard.env.client import AsyncSandboxClient  # noqa: E402

GOAL_MIB = 5.0
KIB_PER_MIB = 1024.0


def smaps(pid: int) -> dict[str, int]:
    """Rss, Pss, Pss_Anon, Pss_File, ... of a process in KiB (empty if it is gone)."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                parts = line.split()
                if len(parts) == 3 and parts[2] == "kB":
                    out[parts[0].rstrip(":")] = int(parts[1])
    except OSError:
        return {}
    return out


def _ppid(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])


def _cmd(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def roles(pids: list[int]) -> dict[int, str]:
    """Name each process of a sandbox: bwrap outer / bwrap init / agent / other."""
    members = set(pids)
    named: dict[int, str] = {}
    for pid in pids:
        argv = _cmd(pid)
        exe = Path(argv[0]).name if argv and argv[0] else "?"
        if exe == "bwrap":
            named[pid] = "bwrap init" if _ppid(pid) in members else "bwrap outer"
        elif exe.startswith("python"):  # started from the bundle, or forked by a zygote
            named[pid] = "agent"
        else:
            named[pid] = f"other ({exe})"
    return named


def sandbox_memory(data_dir: Path, ids: list[str]) -> dict[str, Any]:
    per_sandbox: list[float] = []
    per_role: dict[str, list[dict[str, int]]] = defaultdict(list)
    missing = 0
    for sid in ids:
        cg = sandbox_cgroup(data_dir, sid)
        pids = cgroup_pids(cg) if cg else []
        if not pids:
            missing += 1
            continue
        total = 0
        for pid, role in roles(pids).items():
            m = smaps(pid)
            if m:
                total += m.get("Pss", 0)
                per_role[role].append(m)
        per_sandbox.append(total / KIB_PER_MIB)
    roles_out = {}
    for role, samples in sorted(per_role.items()):
        pss = [s.get("Pss", 0) / KIB_PER_MIB for s in samples]
        roles_out[role] = {
            "processes": len(samples),
            "pss_mean_mib": statistics.fmean(pss),
            "pss_median_mib": statistics.median(pss),
            "rss_mean_mib": statistics.fmean(s.get("Rss", 0) for s in samples) / KIB_PER_MIB,
            "pss_anon_mean_mib": statistics.fmean(s.get("Pss_Anon", 0) for s in samples)
            / KIB_PER_MIB,
            "pss_file_mean_mib": statistics.fmean(s.get("Pss_File", 0) for s in samples)
            / KIB_PER_MIB,
        }
    return {
        "sandboxes_measured": len(per_sandbox),
        "sandboxes_without_processes": missing,
        "per_sandbox_pss_mib": {
            "mean": statistics.fmean(per_sandbox) if per_sandbox else float("nan"),
            "median": statistics.median(per_sandbox) if per_sandbox else float("nan"),
            "p90": percentile(per_sandbox, 90),
            "min": min(per_sandbox, default=float("nan")),
            "max": max(per_sandbox, default=float("nan")),
            "total": sum(per_sandbox),
        },
        "by_role": roles_out,
    }


def process_memory(pid: int) -> dict[str, float]:
    m = smaps(pid)
    return {"rss_mib": m.get("Rss", 0) / KIB_PER_MIB, "pss_mib": m.get("Pss", 0) / KIB_PER_MIB,
            "pss_anon_mib": m.get("Pss_Anon", 0) / KIB_PER_MIB}


def threads(pid: int) -> dict[str, int]:
    """Thread count by thread name (``comm``)."""
    names: dict[str, int] = defaultdict(int)
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                names[(task / "comm").read_text().strip()] += 1
    except OSError:
        pass
    return dict(names)


def helper_processes(server_pid: int, data_dir: Path, ids: list[str]) -> list[dict[str, Any]]:
    """The orchestrator's helpers outside every sandbox (e.g. an agent fork-server/zygote)."""
    inside = {pid for sid in ids for pid in cgroup_pids(sandbox_cgroup(data_dir, sid) or Path())}
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in inside | {server_pid}:
            continue
        argv = _cmd(int(entry.name))
        if not any(str(data_dir) in a for a in argv) or Path(argv[0]).name == "bwrap":
            continue
        if Path(argv[0]).name in ("unshare", "sh"):
            continue
        out.append({"pid": int(entry.name), "ppid": _ppid(int(entry.name)),
                    "argv": " ".join(argv)[:120], **process_memory(int(entry.name))})
    return out


# --- baselines ------------------------------------------------------------------------------


def bare_bwrap_baseline(n: int, settle: float) -> dict[str, Any]:
    """n bare ``bwrap --unshare-pid ... sleep 60`` jails: PSS per jail, by process."""
    argv = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid",
            "--die-with-parent", "--", "sleep", "60"]
    procs = [subprocess.Popen(argv, stdin=subprocess.DEVNULL) for _ in range(n)]
    try:
        time.sleep(settle)
        by_role: dict[str, list[float]] = defaultdict(list)
        per_jail = []
        children: dict[int, list[int]] = defaultdict(list)
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                children[_ppid(int(entry.name))].append(int(entry.name))
        for p in procs:
            total = 0.0
            tree = [(p.pid, "bwrap outer")]
            for child in children.get(p.pid, []):
                tree.append((child, "bwrap init"))
                tree += [(g, "sleep") for g in children.get(child, [])]
            for pid, role in tree:
                pss = smaps(pid).get("Pss", 0) / KIB_PER_MIB
                by_role[role].append(pss)
                total += pss
            per_jail.append(total)
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(10)
    return {"n": n, "per_jail_pss_mean_mib": statistics.fmean(per_jail),
            "by_role_pss_mean_mib": {k: statistics.fmean(v) for k, v in by_role.items()}}


def bare_python_baseline(settle: float) -> dict[str, Any]:
    proc = subprocess.Popen(["python3", "-I", "-S", "-c", "import time; time.sleep(60)"],
                            stdin=subprocess.DEVNULL)
    try:
        time.sleep(settle)
        return {"argv": proc.args, **process_memory(proc.pid)}
    finally:
        proc.kill()
        proc.wait(10)


# --- main -----------------------------------------------------------------------------------


async def exec_true_in_each(url: str, ids: list[str], concurrency: int = 16) -> int:
    sem = asyncio.Semaphore(concurrency)
    bad = 0
    async with AsyncSandboxClient(url, timeout=60.0, cleanup_on_close=False) as client:

        async def one(sid: str) -> None:
            nonlocal bad
            async with sem:
                sb = await client.get_sandbox(sid)
                r = await sb.exec(["true"])
                bad += r.exit_code != 0

        await asyncio.gather(*(one(sid) for sid in ids))
    return bad


def main() -> int:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("-n", "--n", type=int, default=100, help="idle sandboxes")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds to wait before reading")
    parser.add_argument("--baseline-n", type=int, default=20, help="bare bwrap jails (0: skip)")
    args = parser.parse_args()
    if args.quick:
        args.n, args.baseline_n = 10, 5

    results: dict[str, Any] = {}
    with BenchServer(max_sandboxes=args.n + 8, port=args.port) as srv:
        assert srv.proc is not None
        server_pid = srv.proc.pid
        console.print(f"orchestrator at {srv.url} (pid {server_pid}); data dir {srv.data_dir}")
        results["orchestrator_before"] = {**process_memory(server_pid),
                                          "threads": threads(server_pid)}
        ids = asyncio.run(create_sandboxes_async(srv.url, args.n, concurrency=16))
        results["exec_failures"] = asyncio.run(exec_true_in_each(srv.url, ids))
        time.sleep(args.settle)
        results["sandboxes"] = sandbox_memory(srv.data_dir, ids)
        results["orchestrator_after"] = {**process_memory(server_pid),
                                         "threads": threads(server_pid)}
        results["orchestrator_helpers"] = helper_processes(server_pid, srv.data_dir, ids)
    if args.baseline_n:
        results["bare_bwrap"] = bare_bwrap_baseline(args.baseline_n, args.settle)
    results["bare_python"] = bare_python_baseline(args.settle)
    return finish("idle_memory", args, results, srv, report)


def report(args: Any, r: dict[str, Any]) -> None:
    s = r["sandboxes"]
    per = s["per_sandbox_pss_mib"]
    print_table(f"PSS per idle sandbox (MiB), {s['sandboxes_measured']} sandboxes",
                ["", "mean", "median", "p90", "min", "max"],
                [("sum over the sandbox's cgroup", per["mean"], per["median"], per["p90"],
                  per["min"], per["max"])])
    print_table("by process (MiB, mean over all sandboxes)",
                ["process", "count", "PSS mean", "PSS median", "PSS anon", "PSS file", "RSS"],
                [(role, v["processes"], v["pss_mean_mib"], v["pss_median_mib"],
                  v["pss_anon_mean_mib"], v["pss_file_mean_mib"], v["rss_mean_mib"])
                 for role, v in s["by_role"].items()])
    before, after = r["orchestrator_before"], r["orchestrator_after"]
    growth = (after["pss_mib"] - before["pss_mib"]) / max(1, s["sandboxes_measured"])
    r["orchestrator_pss_growth_per_sandbox_mib"] = growth
    rows = [("orchestrator, no sandboxes", before["rss_mib"], before["pss_mib"],
             sum(before["threads"].values())),
            (f"orchestrator, {args.n} idle sandboxes", after["rss_mib"], after["pss_mib"],
             sum(after["threads"].values()))]
    rows += [(f"helper pid {h['pid']}: {h['argv'][:60]}", h["rss_mib"], h["pss_mib"], "")
             for h in r["orchestrator_helpers"]]
    print_table("orchestrator process (MiB)", ["", "RSS", "PSS", "threads"], rows)
    console.print(f"orchestrator threads by name: {after['threads']}")
    console.print(f"orchestrator PSS growth per sandbox: {growth:.3f} MiB")
    if "bare_bwrap" in r:
        b = r["bare_bwrap"]
        roles_txt = ", ".join(f"{k} {v:.2f}" for k, v in b["by_role_pss_mean_mib"].items())
        console.print(f"baseline: {b['n']} bare bwrap+sleep jails: {b['per_jail_pss_mean_mib']:.2f}"
                      f" MiB PSS each ({roles_txt})")
    p = r["bare_python"]
    console.print(f"baseline: one bare `python3 -I -S -c 'import time; time.sleep(60)'`: "
                  f"PSS {p['pss_mib']:.2f} MiB, RSS {p['rss_mib']:.2f} MiB")
    if r["exec_failures"] or s["sandboxes_without_processes"]:
        console.print(f"[red]exec failures: {r['exec_failures']}, sandboxes without processes: "
                      f"{s['sandboxes_without_processes']}[/red]")
    verdict_txt = "met" if per["mean"] <= GOAL_MIB else "NOT met"
    r["goals"] = {"pss_per_sandbox_mean_mib": {"value": per["mean"], "goal": GOAL_MIB,
                                               "verdict": verdict_txt}}
    print_table("goals", ["goal", "measured", "target", "verdict"], [
        ("mean PSS per idle sandbox (MiB)", per["mean"], f"<= {GOAL_MIB}", verdict_txt),
    ])


if __name__ == "__main__":
    sys.exit(main())
