"""Harbor's oracle on Orchard: the wall time of ``harbor run --agent oracle`` on a 10-task
dataset whose environments are Dockerfiles FROM an image in a registry on loopback, through
Orchard's provider (``orchard.integrations.harbor``).

* cold: the first run: the base image pulled, each Dockerfile built (one COPY step each);
* warm: the same run again (images pulled and built: the build cache runs no step), repeated,
  median;
* baseline: the same trials without Harbor, in the same run: per task one sandbox of the built
  image, the oracle and the tests as Harbor runs them (``orchard.domains.harbor``), at the
  same concurrency; median of the repeats. warm / baseline is Harbor's own cost.

Every trial must earn reward 1. The orchestrator is a child process on loopback with a fresh
data dir; Harbor's telemetry and litellm's price list fetch are off (nothing leaves the host).

    .venv/bin/python bench/harbor_oracle.py [--tasks 10] [--concurrency 4] [--repeat 3]
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO_ROOT, BenchServer, base_parser, finish, print_table  # noqa: E402

sys.path.insert(0, str(REPO_ROOT))
from orchard.domains.harbor import (  # noqa: E402
    load_harbor_tasks,
    run_solution,
    run_tests,
    set_up,
)
from orchard.env.client import SandboxClient  # noqa: E402
from orchard.tasks.images import sandbox_image  # noqa: E402
from tests.harbor_tasks import write_dataset  # noqa: E402
from tests.image_fixtures import make_busybox_rootfs  # noqa: E402
from tests.registry import IMAGE_CONFIG, push_rootfs, running_registry  # noqa: E402

HARBOR = REPO_ROOT / ".venv-harbor" / "bin" / "harbor"
PROVIDER = "orchard.integrations.harbor.environment:OrchardEnvironment"


def harbor_run(url: str, dataset: Path, jobs: Path, job: str, concurrency: int) -> dict[str, Any]:
    env = {"PATH": os.environ["PATH"], "HOME": str(jobs), "ORCHARD_URL": url,
           "PYTHONPATH": str(REPO_ROOT), "HARBOR_TELEMETRY": "0",
           "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    started = time.perf_counter()
    done = subprocess.run([str(HARBOR), "run", "--path", str(dataset), "--agent", "oracle",
                           "--env", PROVIDER, "--jobs-dir", str(jobs), "--job-name", job,
                           "--n-concurrent", str(concurrency), "--yes", "--quiet"],
                          env=env, capture_output=True, text=True, timeout=3600)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"harbor run failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    trials = [json.loads(p.read_text()) for p in (jobs / job).glob("*/result.json")]
    rewards = [(t["verifier_result"] or {}).get("rewards", {}).get("reward") for t in trials]
    return {"seconds": seconds, "trials": len(trials), "rewards": rewards}


def without_harbor(url: str, dataset: Path, concurrency: int) -> dict[str, Any]:
    """The trials' sandbox work alone: create, set up, solve, test, delete."""
    tasks = load_harbor_tasks(dataset)
    with SandboxClient(url) as client:
        def trial(task: Any) -> float:
            spec = task.sandbox_spec()
            with client.create_sandbox(sandbox_image(client, spec.image), env=spec.env,
                                       block_network=spec.block_network) as sb:
                set_up(sb, task)
                run_solution(sb, task)
                return run_tests(sb, task).reward

        started = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
            rewards = list(pool.map(trial, tasks))
        return {"seconds": time.perf_counter() - started, "trials": len(tasks),
                "rewards": rewards}


def main() -> int:
    parser = base_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if args.quick:
        args.tasks, args.repeat = 3, 1
    if not HARBOR.exists():
        raise SystemExit(f"{HARBOR} is missing: run `make harbor`")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="harbor-bench-") as tmp, \
            running_registry(Path(tmp) / "registry") as registry, \
            BenchServer(port=args.port) as server:
        base = push_rootfs(registry, make_busybox_rootfs(Path(tmp) / "rootfs"),
                           "orchard/busybox", "1", config=IMAGE_CONFIG)
        dataset = write_dataset(Path(tmp) / "dataset", base, build=True, n=args.tasks)
        jobs = Path(tmp) / "jobs"
        results["cold"] = harbor_run(server.url, dataset, jobs, "cold", args.concurrency)
        results["warm"] = [harbor_run(server.url, dataset, jobs, f"warm{i}", args.concurrency)
                           for i in range(args.repeat)]
        results["baseline"] = [without_harbor(server.url, dataset, args.concurrency)
                               for _ in range(args.repeat)]
    runs = [results["cold"], *results["warm"], *results["baseline"]]
    results["all_rewards_1"] = all(r == 1.0 for run in runs for r in run["rewards"]) and all(
        run["trials"] == args.tasks for run in runs)
    warm = statistics.median(r["seconds"] for r in results["warm"])
    base = statistics.median(r["seconds"] for r in results["baseline"])
    results["summary"] = {"tasks": args.tasks, "concurrency": args.concurrency,
                          "cold_s": results["cold"]["seconds"], "warm_median_s": warm,
                          "baseline_median_s": base, "warm_over_baseline": warm / base}
    return finish("harbor_oracle", args, results, server, report)


def report(args: Any, results: dict[str, Any]) -> None:
    s = results["summary"]
    print_table(f"Harbor oracle run, {s['tasks']} tasks, {s['concurrency']} at a time "
                f"(every reward 1: {results['all_rewards_1']})",
                ["run", "wall s", "per task s", "vs baseline"],
                [["harbor run, cold (pull + builds)", s["cold_s"], s["cold_s"] / s["tasks"],
                  s["cold_s"] / s["baseline_median_s"]],
                 ["harbor run, warm (median)", s["warm_median_s"],
                  s["warm_median_s"] / s["tasks"], s["warm_over_baseline"]],
                 ["same trials, SDK only (median)", s["baseline_median_s"],
                  s["baseline_median_s"] / s["tasks"], 1.0]])


if __name__ == "__main__":
    raise SystemExit(main())
