"""Rollouts per minute and grading time per task with the oracle harness, against a host baseline.

(1) Baseline, on the host, no sandbox, each bundled task in turn: copy its repository to a
temp dir, ``git init`` + commit, ``git apply`` the gold patch and the test patch, run the
task's tests (``/usr/bin/python3 -m pytest -rA -p no:cacheprovider``); timed (a) the pytest
run alone and (b) the whole thing. What grading costs at the least, without any isolation.
(2) The oracle run: ``evaluate(tasks, OracleHarness(), out, client, config=RunConfig(out=out,
concurrency=C))`` against a private orchestrator, for each C (1 and 2 by default), each into
a fresh temp output dir: wall time, rollouts/minute, rollout/grading/set-up/test/harness
seconds, the share of rollout time spent in the environment, resolved count (the oracle must
resolve every task; the script exits 1 otherwise). (3) Ratios to the baseline of the same run.

    .venv/bin/python bench/eval_oracle.py             # all 33 bundled tasks, C=1 and C=2
    .venv/bin/python bench/eval_oracle.py --quick     # the first 6 tasks, C=2
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    BenchServer,
    base_parser,
    console,
    finish,
    machine_busy_cpu_s,
    percentile,
    print_table,
    process_cpu_s,
)

from orchard.domains.swe import SweTask, load_tasks  # noqa: E402
from orchard.domains.swe.grading import score  # noqa: E402
from orchard.domains.swe.harness import OracleHarness  # noqa: E402
from orchard.domains.swe.workspace import GIT_ENV  # noqa: E402
from orchard.env.backends.local.launch import USER_PATH  # noqa: E402
from orchard.env.client import SandboxClient  # noqa: E402
from orchard.eval import RolloutResult, RunConfig, evaluate  # noqa: E402

HOST_PYTHON = "/usr/bin/python3"
# What a sandbox's exec gets (the local backend's agent env plus the task sandbox's own).
BASELINE_ENV = {"PATH": USER_PATH, "HOME": "/root", "LANG": "C.UTF-8",
                "PYTHONDONTWRITEBYTECODE": "1"}
# Left out of the copy, as the workspace's archive leaves them out.
SKIP = shutil.ignore_patterns("__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache",
                              "*.pyc")
QUICK_TASKS = 6


def stats_s(values: list[float]) -> dict[str, float]:
    """n, mean, min, p50, p90, max of durations in seconds (kept in seconds)."""
    if not values:
        return {"n": 0}
    return {"n": len(values), "mean": statistics.fmean(values), "min": min(values),
            "p50": percentile(values, 50), "p90": percentile(values, 90), "max": max(values)}


# --- (1) the baseline: the same grading steps on the host, no sandbox -----------------------


def _run(argv: list[str], cwd: Path, env: dict[str, str],
         stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, input=stdin, capture_output=True, text=True,
                          check=False)


def baseline_one(task: SweTask) -> dict[str, Any]:
    """Copy, git init + commit, apply gold and test patches, pytest: (a) pytest, (b) all."""
    assert task.source.kind == "dir" and task.source.path, task.source
    test_argv = task.test_command.split()
    if test_argv[0] == "python3":
        test_argv[0] = HOST_PYTHON
    git_env = {**BASELINE_ENV, **GIT_ENV}
    tmp = Path(tempfile.mkdtemp(prefix="orchard-bench-eval-base-", dir="/tmp"))
    try:
        repo = tmp / "repo"
        t0 = time.perf_counter()
        shutil.copytree(task.source.path, repo, ignore=SKIP, symlinks=True)
        steps = [(["git", "init", "-q"], None), (["git", "add", "-A"], None),
                 (["git", "commit", "-q", "--no-verify", "-m", "base"], None),
                 (["git", "apply", "-"], task.patch)]
        if task.test_patch.strip():
            steps.append((["git", "apply", "-"], task.test_patch))
        for argv, stdin in steps:
            done = _run(argv, repo, git_env, stdin)
            if done.returncode != 0:
                raise RuntimeError(f"baseline of {task.instance_id}: {' '.join(argv)} exited "
                                   f"{done.returncode}: {done.stderr[-500:]}")
        t1 = time.perf_counter()
        job = _run(test_argv, repo, BASELINE_ENV)
        t2 = time.perf_counter()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    f2p_failing, p2p_failing = score(task, job.stdout + ("\n" + job.stderr if job.stderr
                                                          else ""))
    return {"instance_id": task.instance_id, "pytest_s": t2 - t1, "total_s": t2 - t0,
            "prepare_s": t1 - t0, "exit_code": job.returncode,
            "resolved": not f2p_failing and not p2p_failing,
            "failing": [*f2p_failing, *p2p_failing][:10]}


def baseline(tasks: list[SweTask]) -> dict[str, Any]:
    rows = []
    for task in tasks:
        rows.append(baseline_one(task))
    return {"tasks": rows,
            "pytest_s": stats_s([r["pytest_s"] for r in rows]),
            "total_s": stats_s([r["total_s"] for r in rows]),
            "prepare_s": stats_s([r["prepare_s"] for r in rows]),
            "all_resolved": all(r["resolved"] for r in rows),
            "loadavg_at_start": os.getloadavg()}


# --- (2) the oracle run ---------------------------------------------------------------------


def warm_up(client: SandboxClient) -> float:
    """One sandbox, one exec, deleted: the first create on a fresh orchestrator is slower."""
    t0 = time.perf_counter()
    sb = client.create_sandbox(block_network=True)
    try:
        sb.exec(["true"])
    finally:
        sb.delete()
    return time.perf_counter() - t0


def oracle_run(client: SandboxClient, srv: BenchServer, tasks: list[SweTask],
               concurrency: int) -> dict[str, Any]:
    out = Path(tempfile.mkdtemp(prefix="orchard-bench-eval-out-", dir="/tmp"))
    results: list[RolloutResult] = []
    assert srv.proc is not None
    loadavg = os.getloadavg()
    cpu0, busy0 = process_cpu_s(srv.proc.pid), machine_busy_cpu_s()
    t0 = time.perf_counter()
    try:
        summary = evaluate(tasks, OracleHarness(), out, client,
                           config=RunConfig(out=out, concurrency=concurrency),
                           on_result=results.append)
        wall = time.perf_counter() - t0
    finally:
        shutil.rmtree(out, ignore_errors=True)
    overall = summary["overall"]
    grades = [r.grade for r in results if r.grade is not None]
    env_share = overall.get("env_share", float("nan"))
    rows = {r.instance_id: {
        "rollout_s": r.timings.total, "harness_s": r.timings.harness, "env_s": r.timings.env,
        "grading_wall_s": r.timings.grading,
        "grading_s": r.grade.grading_seconds if r.grade else None,
        "setup_s": r.grade.setup_seconds if r.grade else None,
        "test_s": r.grade.test_seconds if r.grade else None,
        "resolved": r.resolved, "attempts": r.attempts,
        "outcome": r.grade.outcome if r.grade else None,
        "reason": (r.grade.reason if r.grade else "") or (r.failure.message if r.failure
                                                            else ""),
    } for r in results}
    return {
        "concurrency": concurrency,
        "tasks": len(tasks),
        "rollouts": len(results),
        "resolved": sum(r.resolved for r in results),
        "unresolved": sorted(r.instance_id for r in results if not r.resolved),
        "wall_s": overall.get("wall_seconds", wall),
        "wall_s_around_evaluate": wall,
        "rollouts_per_minute": overall.get("rollouts_per_minute",
                                           len(results) / wall * 60 if wall else 0.0),
        "rollout_s": stats_s([r.timings.total for r in results]),
        "grading_s": stats_s([g.grading_seconds for g in grades]),
        "grading_setup_s": stats_s([g.setup_seconds for g in grades]),
        "test_s": stats_s([g.test_seconds for g in grades]),
        "harness_s": stats_s([r.timings.harness for r in results]),
        "env_share": env_share,
        "harness_share": 1.0 - env_share,
        "retried_rollouts": sum(r.attempts > 1 for r in results),
        "orchestrator_cpu_s": process_cpu_s(srv.proc.pid) - cpu0,
        "machine_busy_cpu_s": machine_busy_cpu_s() - busy0,
        "machine_cpu_capacity_s": wall * (os.cpu_count() or 1),
        "loadavg_at_start": loadavg,
        "summary": overall,
        "per_task": rows,
    }


# --- main -----------------------------------------------------------------------------------


def main() -> int:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,2",
                        help="comma-separated rollout concurrencies, one oracle run each")
    args = parser.parse_args()
    concurrencies = [int(c) for c in str(args.concurrency).split(",") if c.strip()]
    if args.quick:
        concurrencies = [2]
    args.concurrency = ",".join(map(str, concurrencies))
    tasks = load_tasks("bundled")
    if args.quick:
        tasks = tasks[:QUICK_TASKS]

    # swebench's log parsers take ~1.5 s to import on first use; the baseline's scoring does
    # it here, so it does not land in the first rollout's grading time.
    results: dict[str, Any] = {"task_count": len(tasks), "concurrencies": concurrencies}
    console.print(f"baseline: {len(tasks)} tasks on the host, no sandbox ...")
    results["baseline"] = baseline(tasks)
    with BenchServer(max_sandboxes=max(concurrencies) * 4 + 8, port=args.port) as srv:
        client = SandboxClient(srv.url, timeout=120.0)
        try:
            console.print(f"orchestrator at {srv.url}; data dir {srv.data_dir}")
            results["warm_up_s"] = warm_up(client)
            runs = []
            for c in concurrencies:
                console.print(f"oracle run: {len(tasks)} tasks at concurrency {c} ...")
                runs.append(oracle_run(client, srv, tasks, c))
                console.print(f"  {runs[-1]['resolved']}/{len(tasks)} resolved in "
                              f"{runs[-1]['wall_s']:.1f} s")
            results["runs"] = runs
        finally:
            client.close()
    rc = finish("eval_oracle", args, results, srv, report)
    if not results["all_resolved"]:
        rc = 1
    return rc


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def report(args: Any, r: dict[str, Any]) -> None:
    base, runs = r["baseline"], r["runs"]
    b_pytest, b_total = base["pytest_s"], base["total_s"]
    print_table("(1) baseline on the host, no sandbox, sequential (s)",
                ["measurement", "n", "p50", "p90", "mean", "min", "max"], [
                    (what, m["n"], m["p50"], m["p90"], m["mean"], m["min"], m["max"])
                    for what, m in (("(a) pytest run only", b_pytest),
                                    ("copy + git init/commit + 2x git apply", base["prepare_s"]),
                                    ("(b) all: copy + git + apply + pytest", b_total))])
    if not base["all_resolved"]:
        bad = [(t["instance_id"], t["exit_code"], t["failing"]) for t in base["tasks"]
               if not t["resolved"]]
        console.print(f"[bold red]baseline: tests failing on the host for {bad}[/bold red]")

    by_id = {t["instance_id"]: t for t in base["tasks"]}
    columns = ["task", "base a", "base b"]
    for run in runs:
        c = run["concurrency"]
        columns += [f"C{c} roll", f"C{c} grade", f"C{c} test"]
    rows = []
    per_task = []
    for tid, b in by_id.items():
        row: list[Any] = [tid, b["pytest_s"], b["total_s"]]
        entry: dict[str, Any] = {"instance_id": tid, "baseline_a": b["pytest_s"],
                                 "baseline_b": b["total_s"], "by_concurrency": {}}
        for run in runs:
            t = run["per_task"].get(tid, {})
            row += [t.get("rollout_s", "-"), t.get("grading_s", "-"), t.get("test_s", "-")]
            entry["by_concurrency"][str(run["concurrency"])] = {
                "rollout_seconds": t.get("rollout_s"), "grading_seconds": t.get("grading_s"),
                "setup_seconds": t.get("setup_s"), "test_seconds": t.get("test_s"),
                "harness_seconds": t.get("harness_s"), "resolved": t.get("resolved")}
        rows.append(row)
        per_task.append(entry)
    r["per_task"] = per_task
    width = console.width
    console.width = max(width, 30 + 10 * (len(columns) - 1))  # room for the task ids
    try:
        print_table("per task (s): baseline (a) pytest, (b) all; per concurrency C the rollout "
                    "(harness + grading), grading (Grade.grading_seconds), its test run",
                    columns, rows)
    finally:
        console.width = width

    metric_rows: list[list[Any]] = []
    summary: dict[str, Any] = {}

    def add(label: str, key: str, values: list[Any], shown: list[Any] | None = None) -> None:
        metric_rows.append([label, *(shown or values)])
        for run, v in zip(runs, values, strict=True):
            summary.setdefault(str(run["concurrency"]), {})[key] = v

    add("resolved", "resolved", [x["resolved"] for x in runs],
        [f"{x['resolved']}/{x['tasks']}" for x in runs])
    add("wall time (s)", "wall_s", [x["wall_s"] for x in runs])
    add("rollouts / minute", "rollouts_per_minute", [x["rollouts_per_minute"] for x in runs])
    add("rollout p50 (s)", "rollout_p50_s", [x["rollout_s"].get("p50") for x in runs])
    add("rollout p90 (s)", "rollout_p90_s", [x["rollout_s"].get("p90") for x in runs])
    add("grading p50 (s, Grade.grading_seconds)", "grading_p50_s",
        [x["grading_s"].get("p50") for x in runs])
    add("- grading set-up p50 (s)", "grading_setup_p50_s",
        [x["grading_setup_s"].get("p50") for x in runs])
    add("- grading test run p50 (s)", "test_p50_s", [x["test_s"].get("p50") for x in runs])
    add("harness p50 (s)", "harness_p50_s", [x["harness_s"].get("p50") for x in runs])
    add("env share of rollout time", "env_share", [x["env_share"] for x in runs])
    add("harness share (1 - env share)", "harness_share", [x["harness_share"] for x in runs])
    add("grading p50 / baseline (b) p50", "grading_over_baseline_b",
        [_ratio(x["grading_s"].get("p50"), b_total.get("p50")) for x in runs])
    add("test p50 in sandbox / baseline (a) p50", "test_over_baseline_a",
        [_ratio(x["test_s"].get("p50"), b_pytest.get("p50")) for x in runs])
    add("rollouts retried (environment failures)", "retried_rollouts",
        [x["retried_rollouts"] for x in runs])
    add("machine busy CPU-s / capacity", "machine_busy_cpu_s",
        [x["machine_busy_cpu_s"] for x in runs],
        [f"{x['machine_busy_cpu_s']:.0f} / {x['machine_cpu_capacity_s']:.0f}" for x in runs])
    add("orchestrator CPU (s)", "orchestrator_cpu_s", [x["orchestrator_cpu_s"] for x in runs])
    add("1-min load at start", "loadavg_1m", [x["loadavg_at_start"][0] for x in runs])
    print_table(f"(2)+(3) oracle harness, {r['task_count']} bundled tasks, "
                f"{os.cpu_count()} CPUs; baseline p50 (a) {b_pytest.get('p50', 0):.2f} s, "
                f"(b) {b_total.get('p50', 0):.2f} s",
                ["measurement", *(f"C={x['concurrency']}" for x in runs)], metric_rows)
    r["summary"] = {"baseline_a_p50_s": b_pytest.get("p50"),
                    "baseline_b_p50_s": b_total.get("p50"), "by_concurrency": summary}

    r["all_resolved"] = all(x["resolved"] == x["tasks"] == x["rollouts"] for x in runs)
    for x in runs:
        if x["resolved"] != x["tasks"] or x["rollouts"] != x["tasks"]:
            reasons = {tid: x["per_task"].get(tid, {}).get("reason", "no result")
                       for tid in x["unresolved"]}
            console.print(
                f"[bold red]!!! ORACLE DID NOT RESOLVE EVERY TASK at C={x['concurrency']}: "
                f"{x['resolved']}/{x['tasks']} resolved, {x['rollouts']} rollouts. "
                f"Unresolved: {reasons}[/bold red]")


if __name__ == "__main__":
    sys.exit(main())
