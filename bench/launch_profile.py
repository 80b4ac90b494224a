"""Where a sandbox's cost goes: CPU per lifecycle by stage, the 1,000-burst against bare bwrap,
idle memory per sandbox; for this checkout and, with ``--baseline-tree``, others.

The figures of issue 32, section 3, from one run (both sides measured in it):

1. CPU per lifecycle (create, wait ready, exec ``echo ok``, delete), N lifecycles one after
   the other, while two ``perf stat -e task-clock`` counters (inherited by every process
   forked after they attach) watch the orchestrator and the zygote. Stages, and how each is
   attributed:

   - orchestrator: utime+stime of the orchestrator process (all its threads) from
     /proc/PID/stat, read around each request, so split into create / exec / delete (before
     issue 32 the delete request included the whole teardown; since, it sends SIGKILL and
     moves the sandbox dir aside; the reaper's threads do the rest in the background, so their
     time lands in whichever window they overlap, mostly the next create).
   - orchestrator's children: perf task-clock of the orchestrator and its new descendants
     minus the orchestrator's own time. Before issue 32 this was the launch chain,
     ``unshare -> bash launch.sh -> setpriv -> bwrap`` (one pid, one exec after another),
     ``mount -a``, and bwrap's sandboxed child (the holder, which only blocks), with their
     exits; since, only slirp4netns for a networked sandbox (none here).
   - zygote (self): utime+stime of the zygote process: its forks (one per sandbox since issue
     32; before, two: one for the user namespace, one to spawn the agent), i.e. copying its
     page tables, and its request handling.
   - zygote children: perf task-clock of the zygote and its descendants, minus the zygote's
     own time and the agents' time. Since issue 32: the launcher (clone3, id maps, id-mapped
     lowers, mounts) and the clone's set-up before it becomes the agent (pivot_root, /proc,
     confinement), and their exits. Before: the user-namespace child (unshare; the id-mapped
     mount), the spawn child (setns, chroot, fork) and their exits.
   - agent start: the agent's own run time when the sandbox is ready (the schedstat of its
     threads, the pid in ``agent.pid``).
   - agent exec: the growth of the sandbox cgroup's CPU usage over the exec request (the
     agent and the ``echo ok`` shell; nothing else runs there then). The agent's exit at
     delete is counted in "zygote children" (it descends from the zygote).
   The sum is compared with the machine's busy CPU over the same lifecycles; the difference
   (kernel threads, the bench client, perf itself, and the other load on a shared machine) is
   shown as "not attributed". The same loop times create -> ready and the exec (wall clock,
   one at a time, with the two perf counters attached). In-sandbox: the cgroup v2
   ``cpu.stat`` usage of the sandbox's cgroup when ready (whatever ran in it by then: before
   issue 32 the chain after ``launch.sh`` joined it and the spawn child; since, the clone from
   its birth), a cross-check that overlaps the stages above.

2. The burst: ``burst.burst`` of bench/burst.py (create, wait ready, exec ``echo ok``,
   delete; all must succeed) of N at C in flight, and the same number of bare
   ``bwrap --unshare-all --ro-bind / / --dev /dev --proc /proc -- sh -c 'echo i'`` at the same
   concurrency (each must print i), once before and once after the sandboxes; the ratio is
   to the mean of the two.

3. Idle memory: ``idle_memory.sandbox_memory`` of bench/idle_memory.py (PSS of every process
   in each sandbox's cgroup, after one ``true`` in each) plus the orchestrator's PSS growth per
   sandbox and the zygote's PSS (shared by all sandboxes).

    .venv/bin/python bench/launch_profile.py                        # this checkout
    .venv/bin/python bench/launch_profile.py --baseline-tree /work/base --tag issue32
    .venv/bin/python bench/launch_profile.py --baseline-tree A --baseline-tree B  # both
    .venv/bin/python bench/launch_profile.py --quick
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402
from burst import burst, rejections  # noqa: E402
from common import (  # noqa: E402
    BenchServer,
    base_parser,
    cgroup_group_key,
    console,
    create_sandboxes_async,
    finish,
    machine_busy_cpu_s,
    print_table,
    process_cpu_s,
    summarize_ms,
)
from idle_memory import exec_true_in_each, process_memory, sandbox_memory  # noqa: E402

from orchard.env.client import SandboxClient  # noqa: E402

UNIFIED = Path("/sys/fs/cgroup/unified")


def threads_cpu_s(pid: int) -> float:
    """Run time of a live process's threads from schedstat (ns, not 10 ms ticks)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9


def cgroup_usage_s(path: Path) -> float:
    """usage_usec of a cgroup v2 ``cpu.stat`` (present without the cpu controller)."""
    try:
        for line in (path / "cpu.stat").read_text().splitlines():
            if line.startswith("usage_usec "):
                return int(line.split()[1]) / 1e6
    except OSError:
        pass
    return float("nan")


def zygote_pid(server_pid: int) -> int:
    """The zygote: the orchestrator's child running zygote.py."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == server_pid and b"zygote" in cmd:
            return int(entry.name)
    raise RuntimeError(f"no zygote among the children of the orchestrator (pid {server_pid})")


class PerfTaskClock:
    """``perf stat -e task-clock -p PID``: CPU of PID and every process it forks later."""

    def __init__(self, pid: int) -> None:
        self.out = Path(tempfile.mkstemp(prefix="orchard-perf-", suffix=".csv")[1])
        self.proc = subprocess.Popen(
            ["perf", "stat", "-x", ",", "-e", "task-clock", "-p", str(pid), "-o", str(self.out)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.3)  # attached before the first lifecycle

    def stop(self) -> float:
        """Seconds of task-clock counted since the start."""
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(30)
        try:
            for line in self.out.read_text().splitlines():
                parts = line.split(",")
                if len(parts) > 2 and parts[2].startswith("task-clock"):
                    return float(parts[0]) / 1000.0
            return float("nan")
        finally:
            self.out.unlink(missing_ok=True)


def cpu_profile(srv: BenchServer, n: int) -> dict[str, Any]:
    """n lifecycles one at a time; CPU seconds per stage (see the module docstring)."""
    assert srv.proc is not None
    server = srv.proc.pid
    zygote = zygote_pid(server)
    group = UNIFIED / "orchard" / cgroup_group_key(srv.data_dir)
    sandboxes = srv.data_dir / "local" / "sandboxes"
    acc = dict.fromkeys(("orch_create", "orch_exec", "orch_delete", "agent_start", "agent_exec",
                         "in_sandbox_ready"), 0.0)
    failures = 0
    create_s: list[float] = []
    exec_s: list[float] = []
    perf_orch, perf_zyg = PerfTaskClock(server), PerfTaskClock(zygote)
    group0 = cgroup_usage_s(group) if group.is_dir() else 0.0  # made with the first sandbox
    orch0, zyg0 = process_cpu_s(server), process_cpu_s(zygote)
    busy0, client0, t0 = machine_busy_cpu_s(), process_cpu_s(os.getpid()), time.perf_counter()
    try:
        with SandboxClient(srv.url, timeout=120.0) as client:
            for _ in range(n):
                a, t_a = process_cpu_s(server), time.perf_counter()
                sb = client.create_sandbox("host")
                b, t_b = process_cpu_s(server), time.perf_counter()
                create_s.append(t_b - t_a)
                agent = int((sandboxes / sb.id / "agent.pid").read_text())
                start = threads_cpu_s(agent)
                ready = cgroup_usage_s(group / sb.id)
                acc["in_sandbox_ready"] += ready
                c, t_c = process_cpu_s(server), time.perf_counter()
                r = sb.exec("echo ok")
                d, t_d = process_cpu_s(server), time.perf_counter()
                exec_s.append(t_d - t_c)
                failures += r.stdout != "ok\n"
                acc["agent_exec"] += cgroup_usage_s(group / sb.id) - ready
                e = process_cpu_s(server)
                sb.delete()
                f = process_cpu_s(server)
                acc["orch_create"] += b - a
                acc["orch_exec"] += d - c
                acc["orch_delete"] += f - e
                acc["agent_start"] += start
    finally:
        orch_tree, zyg_tree = perf_orch.stop(), perf_zyg.stop()
    wall = time.perf_counter() - t0
    busy, client_cpu = machine_busy_cpu_s() - busy0, process_cpu_s(os.getpid()) - client0
    orch, zyg = process_cpu_s(server) - orch0, process_cpu_s(zygote) - zyg0
    agents = acc["agent_start"] + acc["agent_exec"]
    stages = {
        "orchestrator: create request": acc["orch_create"],
        "orchestrator: exec request": acc["orch_exec"],
        "orchestrator: delete request (teardown)": acc["orch_delete"],
        "orchestrator: between requests": orch - acc["orch_create"] - acc["orch_exec"]
        - acc["orch_delete"],
        "orchestrator's children (before #32: unshare, bash, mount, setpriv, bwrap, holder)":
            orch_tree - orch,
        "zygote itself (its forks)": zyg,
        "zygote children (launcher, holder; before #32: userns and spawn children)":
            zyg_tree - zyg - agents,
        "agent start": acc["agent_start"],
        "agent exec (incl. the shell)": acc["agent_exec"],
    }
    attributed = sum(stages.values())
    return {
        "n": n, "failures": failures, "wall_s": wall,
        "per_lifecycle_ms": {k: 1000 * v / n for k, v in stages.items()},
        "attributed_ms": 1000 * attributed / n,
        "bench_client_ms": 1000 * client_cpu / n,
        "machine_busy_ms": 1000 * busy / n,
        "not_attributed_ms": 1000 * (busy - attributed - client_cpu) / n,
        "in_sandbox_cgroup_at_ready_ms": 1000 * acc["in_sandbox_ready"] / n,
        "sandbox_group_cgroup_total_ms": 1000 * (cgroup_usage_s(group) - group0) / n,
        "create_to_ready_ms": summarize_ms(create_s),
        "exec_ms": summarize_ms(exec_s),
        "loadavg_after": os.getloadavg(),
    }


async def bare_bwrap_burst(n: int, concurrency: int) -> dict[str, Any]:
    """n bare bwrap jails running ``sh -c 'echo i'``, at most concurrency at a time."""
    sem = asyncio.Semaphore(concurrency)
    times: list[float] = []
    failures = 0

    async def one(i: int) -> None:
        nonlocal failures
        async with sem:
            t0 = time.perf_counter()
            proc = await asyncio.create_subprocess_exec(
                "bwrap", "--unshare-all", "--ro-bind", "/", "/", "--dev", "/dev", "--proc",
                "/proc", "--die-with-parent", "--", "sh", "-c", f"echo {i}",
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL)
            out, _ = await proc.communicate()
            failures += proc.returncode != 0 or out != f"{i}\n".encode()
            times.append(time.perf_counter() - t0)

    t_start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    wall = time.perf_counter() - t_start
    return {"n": n, "concurrency": concurrency, "failed": failures, "wall_s": wall,
            "lifecycle_ms": summarize_ms(times)}


def idle_memory(srv: BenchServer, n: int, settle: float) -> dict[str, Any]:
    assert srv.proc is not None
    server = srv.proc.pid
    before = process_memory(server)
    ids = asyncio.run(create_sandboxes_async(srv.url, n, concurrency=16))
    bad = asyncio.run(exec_true_in_each(srv.url, ids))
    time.sleep(settle)
    mem = sandbox_memory(srv.data_dir, ids)
    after = process_memory(server)
    with httpx.Client(base_url=srv.url, timeout=60.0) as http:
        for sid in ids:
            http.delete(f"/sandboxes/{sid}")
    per = mem["per_sandbox_pss_mib"]["mean"]
    growth = (after["pss_mib"] - before["pss_mib"]) / n
    return {"n": n, "exec_failures": bad, "sandboxes": mem,
            "orchestrator_pss_growth_per_sandbox_mib": growth,
            "zygote": process_memory(zygote_pid(server)),
            "per_sandbox_total_pss_mib": per + growth}


def measure(tree: Path | None, args: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"tree": str(tree) if tree else "this checkout"}
    with BenchServer(max_sandboxes=args.n + args.idle_n + 8, tree=tree) as srv:
        console.print(f"{out['tree']}: CPU profile: {args.profile_n} lifecycles ...")
        out["cpu"] = cpu_profile(srv, args.profile_n)
        console.print(f"{out['tree']}: idle memory: {args.idle_n} sandboxes ...")
        out["idle_memory"] = idle_memory(srv, args.idle_n, args.settle)
        console.print(f"{out['tree']}: burst of {args.n} at {args.concurrency} ...")
        rej0, load0 = rejections(srv.url), os.getloadavg()
        assert srv.proc is not None
        orch0 = process_cpu_s(srv.proc.pid)
        out["burst"] = b = asyncio.run(burst(srv.url, args.n, args.concurrency, args.retries))
        b["http_503s"] = rejections(srv.url) - rej0
        b["orchestrator_cpu_s"] = process_cpu_s(srv.proc.pid) - orch0
        b["loadavg_before"], b["loadavg_after"] = load0, os.getloadavg()
    out["teardown"] = srv.leaks
    return out


def main() -> int:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("-n", "--n", type=int, default=1000, help="lifecycles in each burst")
    parser.add_argument("-c", "--concurrency", type=int, default=100, help="in flight")
    parser.add_argument("--profile-n", type=int, default=100, help="lifecycles profiled")
    parser.add_argument("--idle-n", type=int, default=50, help="idle sandboxes measured")
    parser.add_argument("--settle", type=float, default=2.0)
    parser.add_argument("--retries", type=int, default=30, help="SDK retries on 503")
    parser.add_argument("--baseline-tree", type=Path, action="append", default=[],
                        help="another checkout measured in the same run (git worktree add); "
                             "repeat for several")
    args = parser.parse_args()
    if args.quick:
        args.n, args.profile_n, args.idle_n = 50, 10, 5
    if shutil.which("perf") is None:
        parser.error("perf is not installed: apt-get install linux-perf (the Makefile lists it)")
    results: dict[str, Any] = {"loadavg_at_start": os.getloadavg(), "trees": {}}
    trees: list[tuple[str, Path | None]] = [("this", None)]
    trees += [(tree.name, tree.resolve()) for tree in args.baseline_tree]
    # The bare burst before and after the sandboxes: the machine's drift shows between them.
    console.print(f"bare bwrap burst of {args.n} at {args.concurrency} ...")
    bare = [asyncio.run(bare_bwrap_burst(args.n, args.concurrency))]
    for name, tree in trees:
        results["trees"][name] = measure(tree, args)
    bare.append(asyncio.run(bare_bwrap_burst(args.n, args.concurrency)))
    results["bare_bwrap_runs"] = bare
    results["bare_bwrap"] = {
        "n": args.n, "concurrency": args.concurrency, "failed": sum(b["failed"] for b in bare),
        "wall_s": sum(b["wall_s"] for b in bare) / len(bare),
        "lifecycle_ms": {"p50": sum(b["lifecycle_ms"]["p50"] for b in bare) / len(bare)}}
    leaks = {name: t["teardown"] for name, t in results["trees"].items()}
    results["teardown"] = {"leaked": any(v.get("leaked") for v in leaks.values()),
                           "by_tree": leaks}
    for key in ("cgroups_with_processes", "processes_left"):
        results["teardown"][key] = [x for v in leaks.values() for x in v.get(key, [])]
    for key in ("sandboxes_deleted_at_stop", "data_dir_removed"):
        results["teardown"][key] = [v.get(key) for v in leaks.values()]
    srv = BenchServer.__new__(BenchServer)  # finish() reads only .leaks
    srv.leaks = results["teardown"]
    return finish("launch_profile", args, results, srv, report)


def report(args: Any, r: dict[str, Any]) -> None:
    names = list(r["trees"])
    cpus = [r["trees"][n]["cpu"] for n in names]
    rows = [(stage, *(c["per_lifecycle_ms"][stage] for c in cpus))
            for stage in cpus[0]["per_lifecycle_ms"]]
    for key, label in (("attributed_ms", "sum of the stages"),
                       ("bench_client_ms", "bench client (this process)"),
                       ("not_attributed_ms", "not attributed (kernel threads, perf, other load)"),
                       ("machine_busy_ms", "machine busy"),
                       ("in_sandbox_cgroup_at_ready_ms", "cross-check: sandbox cgroup at ready"),
                       ("sandbox_group_cgroup_total_ms", "cross-check: sandbox cgroups, total")):
        rows.append((label, *(c[key] for c in cpus)))
    for key, label in (("create_to_ready_ms", "latency: create -> ready p50 / p99 (wall)"),
                       ("exec_ms", "latency: exec `echo ok` p50 / p99 (wall)")):
        rows.append((label, *(f"{c[key]['p50']:.1f} / {c[key]['p99']:.1f}" for c in cpus)))
    print_table(f"CPU ms per lifecycle (create, exec, delete), {cpus[0]['n']} one at a time",
                ["stage", *names], rows)
    bare = r["bare_bwrap"]
    rows = [(f"bare bwrap sh -c 'echo i' ({when})", b["n"], b["n"] - b["failed"], b["wall_s"],
             b["wall_s"] / bare["wall_s"], b["lifecycle_ms"]["p50"])
            for when, b in zip(("before", "after"), r["bare_bwrap_runs"], strict=True)]
    for name in names:
        b = r["trees"][name]["burst"]
        b["ratio_to_bare_bwrap"] = b["wall_s"] / bare["wall_s"]
        rows.append((f"orchard ({name}): create, exec, delete", b["n"], b["succeeded"],
                     b["wall_s"], b["ratio_to_bare_bwrap"], b["lifecycle_ms"].get("p50", 0.0)))
    print_table(f"burst of {args.n} at {args.concurrency} in flight",
                ["", "n", "succeeded", "wall s", "x bare bwrap", "lifecycle p50 ms"], rows)
    rows = []
    for name in names:
        m = r["trees"][name]["idle_memory"]
        per = m["sandboxes"]["per_sandbox_pss_mib"]
        rows.append((name, m["sandboxes"]["sandboxes_measured"], per["mean"], per["median"],
                     m["orchestrator_pss_growth_per_sandbox_mib"], m["per_sandbox_total_pss_mib"],
                     m["zygote"]["pss_mib"]))
    print_table("idle memory per sandbox (MiB PSS)",
                ["", "n", "cgroup mean", "cgroup median", "orchestrator growth", "total",
                 "zygote (shared)"], rows)
    console.print(f"load average at start {r['loadavg_at_start']}")


if __name__ == "__main__":
    sys.exit(main())
