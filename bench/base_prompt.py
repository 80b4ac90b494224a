"""The base prompt's effect on an untrained instruct model: format errors and resolved rate of
SmolLM2-135M-Instruct (no training) on held-out bug-fix tasks, under the compact config before
and after its worked tool-call example, with the same tasks and request seeds for both.

Path: a private orchestrator, mini-swe-agent (``MiniSweAgentHarness``) through the recording
proxy (rendering with SmolLM2's chat template) to a ``PolicyServer`` serving SmolLM2 in float32;
``RunConfig.sampling_seed`` gives each (task, sample) the same request seeds under both
prompts, so the two arms differ by the prompt alone. Reported per arm: format errors per
rollout (model turns with no valid bash call), the share of rollouts ended by three format
errors in a row (RepeatedFormatError), the share with at least one valid call, resolved (%).

    .venv/bin/python bench/base_prompt.py --tasks 4 --n 1     # ~20 s a rollout on 2 CPUs
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import yaml  # noqa: E402
from common import BenchServer, base_parser, finish, print_table  # noqa: E402

from orchard.domains.swe.bugfix_family import bugfix_family  # noqa: E402
from orchard.domains.swe.harness import MiniSweAgentHarness  # noqa: E402
from orchard.env.client import SandboxClient  # noqa: E402
from orchard.eval import RunConfig, evaluate  # noqa: E402
from orchard.eval.results import read_results  # noqa: E402
from orchard.recipes.demo import COMPACT_CONFIG  # noqa: E402
from orchard.recipes.models import load_policy, smollm2_dir  # noqa: E402
from orchard.recipes.policy_server.server import PolicyServer  # noqa: E402
from orchard.recipes.trajectories import load_trajectories  # noqa: E402


def arm_config(arm: str, ref: str) -> dict[str, Any]:
    """The compact config now ("after"), or as it was at git revision ``ref`` ("before")."""
    if arm == "after":
        return yaml.safe_load(COMPACT_CONFIG.read_text(encoding="utf-8"))
    path = COMPACT_CONFIG.relative_to(Path(__file__).resolve().parents[1])
    text = subprocess.run(["git", "show", f"{ref}:{path}"], capture_output=True, text=True,
                          check=True, cwd=COMPACT_CONFIG.parent).stdout
    return yaml.safe_load(text)


def run_arm(arm: str, config: dict[str, Any], tasks: list, args: Any,
            client: SandboxClient, server: PolicyServer, root: Path) -> dict[str, Any]:
    harness = MiniSweAgentHarness(server.url, "policy", config=config,
                                  render_with=smollm2_dir())
    out = root / arm
    evaluate(tasks, harness, out, client,
             config=RunConfig(out=out, n=args.n, concurrency=args.concurrency,
                              sampling_seed=args.sampling_seed))
    results = read_results(out)
    errors, valid = [], []
    for traj in load_trajectories(out):
        # A format error answers the model with a user turn; the task is the first one.
        errors.append(sum(m["role"] == "user" for m in traj.messages) - 1)
        valid.append(any(m.get("tool_calls") for m in traj.messages
                         if m["role"] == "assistant"))
    n = len(results)
    return {"rollouts": n, "format_errors_per_rollout": sum(errors) / max(len(errors), 1),
            "repeated_format_error": sum(r.exit_status == "RepeatedFormatError"
                                         for r in results) / max(n, 1),
            "with_a_valid_call": sum(valid) / max(len(valid), 1),
            "resolved_pct": 100 * sum(r.resolved for r in results) / max(n, 1),
            "exit_statuses": sorted(r.exit_status or "" for r in results)}


def report(args: Any, results: dict[str, Any]) -> None:
    print_table(f"SmolLM2-135M-Instruct, untrained, {args.tasks} held-out bug-fix tasks x "
                f"{args.n} (same request seeds in both arms)",
                ["prompt", "rollouts", "format errors / rollout", "RepeatedFormatError",
                 "with a valid call", "resolved %"],
                [[arm, r["rollouts"], f"{r['format_errors_per_rollout']:.2f}",
                  f"{r['repeated_format_error']:.0%}", f"{r['with_a_valid_call']:.0%}",
                  f"{r['resolved_pct']:.1f}"] for arm, r in results["arms"].items()])


def main() -> int:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--tasks", type=int, default=4, help="held-out bug-fix tasks")
    parser.add_argument("--n", type=int, default=1, help="samples per task")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--sampling-seed", type=int, default=0)
    parser.add_argument("--task-seed", type=int, default=0)
    parser.add_argument("--before", default="c477e82",
                        help="git revision holding the prompt before the change")
    args = parser.parse_args()
    if args.quick:
        args.tasks, args.n = 2, 1
    tasks = bugfix_family(n_train=0, n_test=args.tasks, seed=args.task_seed)
    model, tokenizer = load_policy(smollm2_dir(), dtype=torch.float32)
    results: dict[str, Any] = {"model": "SmolLM2-135M-Instruct (untrained)", "arms": {}}
    server = BenchServer()
    with server, SandboxClient(server.url, timeout=600) as client, \
            tempfile.TemporaryDirectory(prefix="orchard-base-prompt-") as tmp, \
            PolicyServer(model, tokenizer, seed=0) as policy:
        for arm in ("before", "after"):
            results["arms"][arm] = run_arm(arm, arm_config(arm, args.before), tasks, args,
                                           client, policy, Path(tmp))
    return finish("base_prompt", args, results, server, report)


if __name__ == "__main__":
    sys.exit(main())
