"""The base prompt's effect on an untrained instruct model: SmolLM2-135M-Instruct (no training)
on held-out bug-fix tasks, under the compact config before and after its worked tool-call
example, with the same tasks and request seeds in both arms (common random numbers), so the
arms differ by the prompt alone.

(1) First turn, every task x sample: the rollout's opening (system turn with the bash tool's
signature, the task) rendered with SmolLM2's chat template, one completion from a
``PolicyServer`` (float32, the config's max_tokens and temperature, the seed a rollout's first
call sends), read back as the recording proxy reads it (``parse_tool_calls``) and judged as
mini-swe-agent judges it: a valid turn has at least one call, each to ``bash`` with a JSON
object holding ``command``. Reported: valid first turns (%), turns cut at max_tokens (%).
(2) Full rollouts (``--rollouts``, 0 to skip): mini-swe-agent through the recording proxy on a
private orchestrator, with the tasks' wall-time budget raised to ``--wall-time`` (on a shared
2-core machine one SmolLM2 call takes most of the default 120 s). Reported: format errors per
rollout, RepeatedFormatError (%), resolved (%).

    .venv/bin/python bench/base_prompt.py --tasks 8 --n 2 --rollouts 0
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402
from common import BenchServer, base_parser, finish, print_table, write_json  # noqa: E402

from orchard.domains.swe.bugfix_family import bugfix_family  # noqa: E402
from orchard.domains.swe.format_control import opening_messages  # noqa: E402
from orchard.domains.swe.harness import MiniSweAgentHarness  # noqa: E402
from orchard.domains.swe.model import Budget, SweTask  # noqa: E402
from orchard.env.client import SandboxClient  # noqa: E402
from orchard.eval import RunConfig, evaluate  # noqa: E402
from orchard.eval.results import read_results  # noqa: E402
from orchard.recipes.demo import COMPACT_CONFIG  # noqa: E402
from orchard.recipes.models import load_policy, smollm2_dir  # noqa: E402
from orchard.recipes.policy_server.server import PolicyServer  # noqa: E402
from orchard.recipes.trajectories import load_trajectories  # noqa: E402
from orchard.rollout.proxy.render import parse_tool_calls  # noqa: E402
from orchard.rollout.seeds import call_seed, rollout_seed  # noqa: E402
from orchard.rollout.tokenizer import apply_template  # noqa: E402

ARMS = ("before", "after")


def arm_config(arm: str, ref: str) -> dict[str, Any]:
    """The compact config now ("after"), or as it was at git revision ``ref`` ("before")."""
    if arm == "after":
        return yaml.safe_load(COMPACT_CONFIG.read_text(encoding="utf-8"))
    path = COMPACT_CONFIG.relative_to(Path(__file__).resolve().parents[1])
    text = subprocess.run(["git", "show", f"{ref}:{path}"], capture_output=True, text=True,
                          check=True, cwd=COMPACT_CONFIG.parent).stdout
    return yaml.safe_load(text)


def valid_turn(text: str) -> bool:
    """mini-swe-agent's rule (parse_toolcall_actions) on the calls the proxy reads back."""
    _, calls = parse_tool_calls(text)
    for call in calls:
        try:
            args = json.loads(call["function"]["arguments"])
        except ValueError:
            return False
        if call["function"]["name"] != "bash" or not isinstance(args, dict) \
                or "command" not in args:
            return False
    return bool(calls)


def first_turns(config: dict[str, Any], tasks: list[SweTask], args: Any, tokenizer: Any,
                url: str) -> dict[str, Any]:
    from minisweagent.models.utils.actions_toolcall import BASH_TOOL

    kwargs = config["model"].get("model_kwargs", {})

    def one(job: tuple[SweTask, int]) -> dict[str, Any]:
        task, k = job
        text = apply_template(tokenizer, opening_messages(task, config), [BASH_TOOL],
                              generation_prompt=True)
        body = {"prompt": tokenizer.encode(text, add_special_tokens=False),
                "max_tokens": kwargs.get("max_tokens", 128),
                "temperature": kwargs.get("temperature", 1.0),
                "seed": call_seed(rollout_seed(args.sampling_seed, task.instance_id, k), 0)}
        reply = httpx.post(f"{url}/v1/completions", json=body, timeout=1800)
        reply.raise_for_status()
        choice = reply.json()["choices"][0]
        return {"valid": valid_turn(choice["text"]), "cut": choice["finish_reason"] == "length",
                "prompt_tokens": len(body["prompt"]), "text": choice["text"][:300]}

    with ThreadPoolExecutor(args.concurrency) as pool:
        turns = list(pool.map(one, [(t, k) for t in tasks for k in range(args.n)]))
    return {"turns": len(turns),
            "valid_pct": 100 * sum(t["valid"] for t in turns) / len(turns),
            "cut_pct": 100 * sum(t["cut"] for t in turns) / len(turns),
            "prompt_tokens": turns[0]["prompt_tokens"], "samples": turns[:4]}


def rollouts(config: dict[str, Any], tasks: list[SweTask], args: Any, client: SandboxClient,
             url: str, root: Path) -> dict[str, Any]:
    harness = MiniSweAgentHarness(url, "policy", config=config, render_with=smollm2_dir())
    evaluate(tasks, harness, root, client,
             config=RunConfig(out=root, n=1, concurrency=args.concurrency,
                              sampling_seed=args.sampling_seed))
    results = read_results(root)
    # A format error answers the model with a user turn; the task is the first one.
    errors = [sum(m["role"] == "user" for m in t.messages) - 1 for t in load_trajectories(root)]
    n = max(len(results), 1)
    return {"rollouts": len(results), "format_errors_per_rollout": sum(errors) / n,
            "repeated_format_error_pct": 100 * sum(
                r.exit_status == "RepeatedFormatError" for r in results) / n,
            "resolved_pct": 100 * sum(r.resolved for r in results) / n,
            "exit_statuses": sorted(r.exit_status or "" for r in results)}


def report(args: Any, results: dict[str, Any]) -> None:
    first = results["first_turn"]
    print_table(f"SmolLM2-135M-Instruct, untrained: first turns of {args.tasks} held-out "
                f"bug-fix tasks x {args.n} (same seeds in both arms)",
                ["prompt", "turns", "prompt tokens", "valid bash call %", "cut at max_tokens %"],
                [[arm, r["turns"], r["prompt_tokens"], f"{r['valid_pct']:.1f}",
                  f"{r['cut_pct']:.1f}"] for arm, r in first.items()])
    if results.get("rollouts"):
        print_table(f"Full rollouts, {args.rollouts} tasks x 1, wall time {args.wall_time:g} s",
                    ["prompt", "rollouts", "format errors / rollout", "RepeatedFormatError %",
                     "resolved %"],
                    [[arm, r["rollouts"], f"{r['format_errors_per_rollout']:.2f}",
                      f"{r['repeated_format_error_pct']:.0f}", f"{r['resolved_pct']:.1f}"]
                     for arm, r in results["rollouts"].items()])


def main() -> int:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--tasks", type=int, default=8, help="held-out tasks, first turns")
    parser.add_argument("--n", type=int, default=2, help="samples per task, first turns")
    parser.add_argument("--rollouts", type=int, default=0,
                        help="tasks run as full rollouts (1 sample each); 0: none")
    parser.add_argument("--wall-time", type=float, default=900,
                        help="the full rollouts' wall-time budget, seconds")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--sampling-seed", type=int, default=0)
    parser.add_argument("--task-seed", type=int, default=0)
    parser.add_argument("--before", default="c477e82",
                        help="git revision holding the prompt before the change")
    args = parser.parse_args()
    if args.quick:
        args.tasks, args.n, args.rollouts = 2, 1, 0
    tasks = bugfix_family(n_train=0, n_test=max(args.tasks, args.rollouts),
                          seed=args.task_seed)
    configs = {arm: arm_config(arm, args.before) for arm in ARMS}
    model, tokenizer = load_policy(smollm2_dir(), dtype=torch.float32)
    results: dict[str, Any] = {"model": "SmolLM2-135M-Instruct (untrained)",
                               "first_turn": {}, "rollouts": {}}
    with PolicyServer(model, tokenizer, seed=0) as policy:
        for arm in ARMS:
            results["first_turn"][arm] = first_turns(configs[arm], tasks[:args.tasks], args,
                                                     tokenizer, policy.url)
            write_json("base_prompt", args, results)  # a slow run keeps each arm's figures
        if not args.rollouts:
            report(args, results)
            return 0
        slow = [t.model_copy(update={"budget": Budget(**{
            **t.budget.model_dump(), "wall_time": args.wall_time})})
            for t in tasks[:args.rollouts]]
        server = BenchServer()
        with server, SandboxClient(server.url, timeout=600) as client, \
                tempfile.TemporaryDirectory(prefix="orchard-base-prompt-") as tmp:
            for arm in ARMS:
                results["rollouts"][arm] = rollouts(configs[arm], slow, args, client,
                                                    policy.url, Path(tmp) / arm)
                write_json("base_prompt", args, results)
    return finish("base_prompt", args, results, server, report)


if __name__ == "__main__":
    sys.exit(main())
