"""What the demo's training stages do to held-out success, over seeds, with standard errors.

Per seed, one teacher run feeds every arm. Each SFT arm (``--values``: Monte-Carlo values,
the retrospective hindsight judge, or none, the resolved-only ablation) trains the same initial
policy on its own data, and is evaluated on ``--n-test`` held-out tasks x ``--eval-n`` samples.
Each RL setting (``--rl``) starts from the first arm's SFT weights and is evaluated the same
way, then reranked (value model, random, lookup of training fixes, oracle). Every stage of a
seed sees the same tasks, so RL's effect is also given as the paired difference to its SFT.

The table gives, per stage, the resolved rate of each seed, their mean, the standard error of
that mean over seeds, and the binomial standard error of one run (sqrt(p(1-p)/rollouts)).
The JSON is rewritten after every seed, so a run cut short keeps what it measured, and
``--resume`` adds seeds to an earlier run's JSON.

    .venv/bin/python bench/learning.py --domain swe --seeds 0 1 2 \\
        --rl lr=1e-5 --rl lr=3e-5,steps=4 [--values montecarlo none] [--base] [--quick]

An --rl setting is comma-separated key=value changes to the demo's RL: lr, steps, epochs (PPO
epochs), minibatches, batch (prompts per step), concurrency (rollouts at once in a round),
kl (the KL penalty's weight), format (the reward of an unsolved rollout that ended in format
errors, in place of -1), stride (BAR's rollouts a round), paper=1 (BAR's N=8, Nmax=16,
stride 16); "" is the demo's own ("rl/demo").
"""

from __future__ import annotations

import contextlib
import json
import math
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from common import BenchServer, base_parser, finish, print_table, write_json  # noqa: E402

from orchard.domains import demo_domain  # noqa: E402
from orchard.env.client import SandboxClient  # noqa: E402
from orchard.recipes.bar import BARConfig  # noqa: E402
from orchard.recipes.demo import Demo, DemoConfig, copy_model, pretrained  # noqa: E402
from orchard.recipes.models import with_lora  # noqa: E402
from orchard.recipes.policy_server.server import PolicyServer  # noqa: E402
from orchard.recipes.rl import RLConfig  # noqa: E402

RL_KEYS = {"lr": ("lr", float), "steps": ("steps", int), "epochs": ("ppo_epochs", int),
           "minibatches": ("minibatches", int), "batch": ("batch_prompts", int),
           "concurrency": ("concurrency", int), "kl": ("kl_coef", float),
           "format": ("format_failure_reward", float)}
BAR_KEYS = {"stride": int}


def rl_setting(spec: str, base: RLConfig) -> RLConfig:
    """``base`` with the comma-separated key=value changes of ``spec``."""
    config = base
    for part in filter(None, spec.split(",")):
        key, _, value = part.partition("=")
        if key == "paper":
            config = replace(config, bar=BARConfig.paper()) if value == "1" else config
        elif key in RL_KEYS:
            field, kind = RL_KEYS[key]
            config = replace(config, **{field: kind(value)})
        elif key in BAR_KEYS:
            try:
                config = replace(config, bar=replace(config.bar, **{key: BAR_KEYS[key](value)}))
            except ValueError as e:
                raise SystemExit(f"--rl {spec!r}: {e}") from None
        else:
            raise SystemExit(f"--rl {spec!r}: unknown key {key!r}; use "
                             f"{', '.join([*RL_KEYS, *BAR_KEYS, 'paper'])}")
    return config


def one_seed(args: Any, seed: int, client: SandboxClient, root: Path) -> dict[str, Any]:
    config = DemoConfig(domain=args.domain, seed=seed, lora_rank=args.lora_rank)
    if args.model:
        config = pretrained(replace(config, model=args.model))
        # The make-demo preset runs no RL step; an RL arm is this bench's point: one step
        # unless --rl gives steps.
        config.rl = replace(config.rl, steps=1)
    config = replace(config, n_train=args.n_train, n_test=args.n_test, eval_n=args.eval_n)
    config.sft = replace(config.sft, seed=seed,
                         max_steps=args.sft_steps or config.sft.max_steps)
    config.rl = replace(config.rl, seed=seed)
    log = print if not args.quiet else (lambda _: None)
    torch.set_num_threads(config.threads)
    clock = Clock()
    with clock("teacher"):
        teacher = Demo(root / "teacher-run", config, client, log,
                       domain=demo_domain(config.domain))
        run = teacher.teacher()
    stages: dict[str, Any] = {}
    details: dict[str, Any] = {"teacher": teacher.results["teacher"]}
    for i, values in enumerate(args.values):
        sft_name = f"sft/{values}"
        (root / f"sft-{values}").mkdir(parents=True)
        arm = Demo(root / f"sft-{values}", replace(
            config, values=values,
            values_judge_url="scripted" if values == "retrospective" else None), client, log,
                   domain=demo_domain(config.domain))
        model, tokenizer = arm.load_model()
        with clock(f"values/{values}"):
            examples = arm.sft_data(run, arm.values(run), tokenizer)
        served = copy_model(model)
        if config.lora_rank:
            model = with_lora(model, config.lora_rank)
        with PolicyServer(served, tokenizer, seed=seed) as server:
            if args.base and i == 0:
                with clock("eval base"):
                    stages["base"] = arm.evaluate_policy(server, "base")
            with clock(sft_name):
                arm.sft(model, examples, server)
            with clock(f"eval {sft_name}"):
                stages[sft_name] = arm.evaluate_policy(server, "sft")
            details[sft_name] = {k: arm.results[k] for k in ("values", "sft_data", "sft")}
            if i > 0:
                continue
            sft_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            for spec in args.rl:
                name, folder = f"rl/{spec or 'demo'}", f"rl-{spec or 'demo'}"
                model.load_state_dict(sft_state)
                server.update(model)
                with clock(name):
                    details[name] = arm.rl(model, server, rl_setting(spec, config.rl),
                                           name=folder)
                with clock(f"eval {name}"):
                    stages[name] = arm.evaluate_policy(server, folder)
                stages[name]["rerank"] = arm.rerank(tokenizer, teacher=run, rl=folder,
                                                    stage=folder)["overall"]
    return {"stages": {k: with_se(v) for k, v in stages.items()}, "details": details,
            "seconds": clock.seconds}


class Clock:
    """``with clock(name):`` records the block's wall seconds under ``name``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.seconds[name] = round(time.monotonic() - started, 1)


def with_se(stage: dict[str, Any]) -> dict[str, Any]:
    p, n = stage["resolved_rate"], stage["rollouts"]
    return stage | {"se": math.sqrt(p * (1 - p) / n) if n else float("nan")}


def summarize(per_seed: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per stage: mean over seeds, SE of that mean, mean binomial SE of one run; per RL
    setting: the paired RL - SFT difference."""
    names = list(next(iter(per_seed.values()))["stages"])
    out: dict[str, Any] = {}
    for name in names:
        rates = [s["stages"][name]["resolved_rate"] for s in per_seed.values()
                 if name in s["stages"]]
        out[name] = {"rates": rates, "mean": statistics.fmean(rates),
                     "se_seeds": stat_se(rates),
                     "se_run": statistics.fmean(s["stages"][name]["se"]
                                                for s in per_seed.values()
                                                if name in s["stages"])}
        if name.startswith("rl/"):
            sft = next(n for n in names if n.startswith("sft/"))
            diffs = [s["stages"][name]["resolved_rate"] - s["stages"][sft]["resolved_rate"]
                     for s in per_seed.values() if name in s["stages"]]
            out[name]["minus_sft"] = {"diffs": diffs, "mean": statistics.fmean(diffs),
                                      "se_seeds": stat_se(diffs)}
    return out


def stat_se(values: list[float]) -> float:
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")


def pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:.1f}"


def report(args: Any, r: dict[str, Any]) -> None:
    summary = r["summary"]
    rows = []
    for name, s in summary.items():
        delta = s.get("minus_sft")
        rows.append([name, " ".join(pct(x) for x in s["rates"]), pct(s["mean"]),
                     pct(s["se_seeds"]), pct(s["se_run"]),
                     f"{pct(delta['mean'])} ± {pct(delta['se_seeds'])}" if delta else ""])
    print_table(f"held-out {args.domain} tasks: resolved % ({args.n_test} tasks x "
                f"{args.eval_n} samples a run; seeds {' '.join(map(str, r['seeds']))})",
                ["stage", "each seed", "mean", "SE (seeds)", "SE (one run)",
                 "minus SFT (paired)"], rows)
    rerank_rows = []
    for name in summary:
        picks = [seed["stages"][name].get("rerank") for seed in r["per_seed"].values()
                 if name in seed["stages"]]
        if picks and all(picks):
            rerank_rows.append([name, *[pct(statistics.fmean(p[k] for p in picks))
                                        for k in ("value", "random", "lookup", "oracle")]])
    if rerank_rows:
        print_table("best-of-N over each RL stage's held-out samples (mean over seeds, %)",
                    ["stage", "value", "random", "lookup", "oracle"], rerank_rows)


def main() -> int:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--domain", choices=("swe", "bugfix", "bugfix-read"), default="bugfix")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--values", nargs="+", default=["montecarlo"],
                        choices=("montecarlo", "retrospective", "none"))
    parser.add_argument("--rl", action="append", help="an RL setting (see above); repeat")
    parser.add_argument("--base", action="store_true", help="evaluate the untrained policy")
    parser.add_argument("--n-train", type=int, default=128)
    parser.add_argument("--n-test", type=int, default=64)
    parser.add_argument("--eval-n", type=int, default=4)
    parser.add_argument("--sft-steps", type=int, default=0, help="0: the demo's")
    parser.add_argument("--model", help="a causal-LM folder (default: the tiny Llama)")
    parser.add_argument("--lora-rank", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/learning"))
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--resume", type=Path, help="an earlier run's JSON: keep its seeds "
                        "and run only the others")
    args = parser.parse_args()
    args.rl = args.rl or [""]
    if args.quick:
        args.seeds, args.n_train, args.n_test, args.eval_n = args.seeds[:1], 16, 4, 2
        args.sft_steps = args.sft_steps or 20
    if args.model == "smollm2":
        from orchard.recipes.models import smollm2_dir

        args.model = str(smollm2_dir())
    for spec in args.rl:
        rl_setting(spec, RLConfig())  # a typo fails now, not after an hour of training
    results: dict[str, Any] = {"seeds": [], "per_seed": {}}
    if args.resume:
        results = json.loads(args.resume.read_text())["results"]
    server = BenchServer()
    with server, SandboxClient(server.url, timeout=600) as client:
        for seed in args.seeds:
            if str(seed) in results["per_seed"]:
                continue
            root = args.out / f"seed-{seed}"
            if root.exists() and any(root.iterdir()):
                raise SystemExit(f"{root} is not empty: give a new --out")
            results["per_seed"][str(seed)] = one_seed(args, seed, client, root)
            results["seeds"] = sorted({*results["seeds"], seed})
            results["summary"] = summarize(results["per_seed"])
            write_json("learning", args, results)
    return finish("learning", args, results, server, report)


if __name__ == "__main__":
    sys.exit(main())
