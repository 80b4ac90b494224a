"""The demo's Monte-Carlo value stage, restoring s_t by forks against by replays, in one run.

The demo's teacher stage makes the trajectories once; then the value stage annotates the same
unresolved trajectories with ``mc_restore="replay"`` (k replays of the rollout's sandbox side
per key state, as before forks) and ``"fork"`` (one replay, k forks), alternating, ``--rounds``
times each. The continuation policy is seeded, so both must give the same value curves; the
script checks that.

    .venv/bin/python bench/mc_values.py [--n-train 16] [--mc-max 4] [--mc-k 4] [--quick]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import BenchServer, base_parser, finish, print_table  # noqa: E402

from orchard.domains import demo_domain  # noqa: E402
from orchard.env.client import SandboxClient  # noqa: E402
from orchard.recipes.demo import Demo, DemoConfig  # noqa: E402


def report(args: Any, r: dict[str, Any]) -> None:
    rows = [[mode, f"{statistics.median(r[mode]):.1f} s",
             " ".join(f"{t:.1f}" for t in r[mode])] for mode in ("replay", "fork")]
    rows.append(["replay / fork", f"{r['speedup']:.2f}x", ""])
    print_table(f"value stage: {r['annotated']} trajectories, k={args.mc_k} (one run)",
                ["restore", "median", "each round (s)"], rows)


def main() -> int:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--n-train", type=int, default=16)
    parser.add_argument("--mc-max", type=int, default=4)
    parser.add_argument("--mc-k", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if args.quick:
        args.n_train, args.mc_max, args.mc_k, args.rounds = 8, 1, 2, 1
    results: dict[str, Any] = {"replay": [], "fork": []}
    server = BenchServer()
    with server, SandboxClient(server.url, timeout=600) as client, \
            tempfile.TemporaryDirectory(prefix="orchard-bench-mc-") as tmp:
        config = DemoConfig(n_train=args.n_train, n_test=4, mc_max=args.mc_max, mc_k=args.mc_k)
        demo = Demo(Path(tmp), config, client, log=lambda _: None,
                    domain=demo_domain(config.domain))
        run = demo.teacher()
        curves: dict[str, str] = {}
        for _ in range(args.rounds):
            for mode in ("replay", "fork"):
                demo.config = replace(config, mc_restore=mode)
                t0 = time.perf_counter()
                demo.values(run)
                results[mode].append(time.perf_counter() - t0)
                text = (Path(tmp) / "values.jsonl").read_text()
                if curves.setdefault(mode, text) != text or curves.get("replay", text) != text:
                    raise SystemExit("fork and replay gave different value curves")
        results["annotated"] = demo.results["values"]["annotated"]
    results["speedup"] = statistics.median(results["replay"]) / statistics.median(
        results["fork"])
    return finish("mc_values", args, results, server, report)


if __name__ == "__main__":
    sys.exit(main())
