"""MiniWoB++ baselines: the scripted solver and random actions, through `orchard eval`.

One orchestrator, the ``miniwob`` set (upstream's clocks), both through the browser agent
(``evaluate`` with the ``miniwob-solver`` and ``random-browser`` harnesses), 2 rollouts at a
time:

* solver: every page the solver covers, seeds 0-2;
* random: 10 random actions on random elements, then finish: every page (``--random-seeds``
  seeds each, default seed 0 only), and the solver's pages with seeds 0-2.

Success is the page's raw reward 1 (upstream's binary reward); ``reward`` is the page's own,
time-scaled, with an episode that never ended counted 0. Per page and overall, so a run of a
real model (``orchard eval --tasks miniwob --harness browser-agent --model-url ...``) can be
set beside them.

    .venv/bin/python bench/miniwob_baselines.py [--quick] [--random-seeds 1] [--concurrency 2]
"""

from __future__ import annotations

import re
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import BenchServer, base_parser, finish, print_table  # noqa: E402

from orchard.domains import make_harness  # noqa: E402
from orchard.domains.web.miniwob import SOLVED_PAGES, miniwob_task, page_names  # noqa: E402
from orchard.env.client import SandboxClient  # noqa: E402
from orchard.eval import RunConfig, evaluate  # noqa: E402
from orchard.eval.results import read_results  # noqa: E402

REWARD = re.compile(r"the page's reward ([-\d.]+), raw ([-\d.e]+)")


def run(client: SandboxClient, harness: str, tasks: list[Any], concurrency: int
        ) -> dict[str, Any]:
    """Each task once with ``harness``; per page: episodes, successes, mean page reward."""
    with tempfile.TemporaryDirectory(prefix=f"orchard-bench-miniwob-{harness}-") as tmp:
        out = Path(tmp)
        t0 = time.perf_counter()
        evaluate(tasks, make_harness(harness, tasks), out, client,
                 config=RunConfig(out=out, concurrency=concurrency))
        wall = time.perf_counter() - t0
        rows = read_results(out)
    pages: dict[str, dict[str, Any]] = defaultdict(lambda: {"n": 0, "success": 0,
                                                            "rewards": [], "failed": 0})
    for r in rows:
        page = pages[r.instance_id.split(".")[1]]
        page["n"] += 1
        # An environment failure after every retry, or a page the browser never loaded: not
        # the policy's doing, so counted apart.
        if r.grade is None or "never started" in r.grade.reason:
            page["failed"] += 1
            continue
        page["success"] += int(r.grade.resolved)
        found = REWARD.search(r.grade.reason)
        page["rewards"].append(float(found.group(1)) if found else 0.0)
    for page in pages.values():
        page["mean_reward"] = statistics.fmean(page.pop("rewards") or [0.0])
    graded = sum(p["n"] - p["failed"] for p in pages.values())
    return {"harness": harness, "rollouts": len(rows), "wall_s": wall,
            "environment_failures": sum(p["failed"] for p in pages.values()),
            "success_rate": sum(p["success"] for p in pages.values()) / max(graded, 1),
            "pages": dict(sorted(pages.items()))}


def report(args: Any, r: dict[str, Any]) -> None:
    solver, random_solver, random_all = r["solver"], r["random_solver_pages"], r["random_all"]
    rows = []
    for page, s in solver["pages"].items():
        rnd = random_solver["pages"][page]
        rows.append([page, f"{s['success']}/{s['n']}", f"{s['mean_reward']:.2f}",
                     f"{rnd['success']}/{rnd['n']}", f"{rnd['mean_reward']:.2f}"])
    rows.append(["all solver pages", f"{solver['success_rate']:.0%}", "",
                 f"{random_solver['success_rate']:.0%}", ""])
    print_table("MiniWoB++ (upstream clocks): the solver's pages, seeds 0-2",
                ["page", "solver", "solver reward", "random", "random reward"], rows)
    solved = [p for p, v in random_all["pages"].items() if v["success"]]
    print_table(f"random actions on every page ({len(random_all['pages'])} pages)",
                ["what", "measured"], [
                    ["episodes", str(random_all["rollouts"])],
                    ["success rate", f"{random_all['success_rate']:.1%}"],
                    ["pages solved at least once", f"{len(solved)}: {', '.join(solved)}"],
                    ["wall time (2 at a time)", f"{random_all['wall_s']:.0f} s"]])
    failures = {k: r[k]["environment_failures"] for k in ("solver", "random_solver_pages",
                                                          "random_all")}
    print(f"environment failures (left out of the rates): {failures}")


def main() -> int:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--random-seeds", type=int, default=1, help="seeds per page (0-2)")
    parser.add_argument("--concurrency", type=int, default=2)
    args = parser.parse_args()
    seeds = range(1 if args.quick else 3)
    solver_pages = SOLVED_PAGES[:3] if args.quick else SOLVED_PAGES
    every_page = page_names()[:6] if args.quick else page_names()
    solver_tasks = [miniwob_task(p, s) for p in solver_pages for s in seeds]
    random_tasks = [miniwob_task(p, s) for p in every_page
                    for s in range(min(args.random_seeds, 3))]
    server = BenchServer()
    results: dict[str, Any] = {}
    with server, SandboxClient(server.url, timeout=300) as client:
        results["solver"] = run(client, "miniwob-solver", solver_tasks, args.concurrency)
        results["random_solver_pages"] = run(client, "random-browser", solver_tasks,
                                             args.concurrency)
        results["random_all"] = run(client, "random-browser", random_tasks, args.concurrency)
    return finish("miniwob_baselines", args, results, server, report)


if __name__ == "__main__":
    sys.exit(main())
