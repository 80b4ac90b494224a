"""Reranking where a lookup cannot: best-of-N on the bug-fix family, over seeds.

On the settings family a held-out fix repeats a training one, so remembering the lines of the
resolved training patches reranks nearly as well as the value model. On the bug-fix family the
right value is drawn per task and read in the sandbox, so that lookup has little to go on.

Per seed: the scripted teacher draws a script per rollout (``TeacherHarness(per_sample=True)``:
the solving one with probability ``--solve``, else breaking a neighbour after the fix, or a
decoy fix). It runs ``--train-n`` samples of each of ``--n-train`` training tasks, whose graded
rollouts train a value model per ``--readers`` entry, and ``--n`` samples of each of ``--n-test``
held-out tasks, the candidates. Each value model picks one candidate per task; the table sets
it against a random pick, the lookup of training fixes, a pick among the patches that change
the fewest files, and an oracle pick.

A decoy fix and the right one differ only in a value that the patch and the actions do not
show the source of; the breaking fix changes a second file, which the fewest-files pick sees.
With ``--fail decoy`` the teacher fails only by decoys, so every candidate changes one line of
one file, the same way, and no regex over the patch does better than chance. Only a reader of
what the rollout saw (the ``observed`` text: the spec it printed, the test failure it ran
into) can tell the right value from the decoy. A reader is ``backbone:text``: the tiny random
value model or one on SmolLM2-135M (``smollm2``), reading the patch, the actions, both, or the
actions with what they observed and the patch (see ``candidate_text``). ``smollm2:likelihood``
trains nothing: it picks the candidate whose actions untrained SmolLM2 finds most likely, each
given the conversation before it (``likelihood_rerank``).

    .venv/bin/python bench/rerank_family.py --seeds 0 1 2 [--quick]
    .venv/bin/python bench/rerank_family.py --fail decoy --tag decoy \
        --readers tiny:patch tiny:observed smollm2:likelihood
"""

from __future__ import annotations

import functools
import math
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any, get_args

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from common import BenchServer, base_parser, finish, print_table, write_json  # noqa: E402

from orchard.domains.swe.bugfix_family import bugfix_family  # noqa: E402
from orchard.domains.swe.harness import TeacherHarness  # noqa: E402
from orchard.domains.swe.minisweagent import config_from_specs  # noqa: E402
from orchard.domains.swe.model import SweTask  # noqa: E402
from orchard.env.client import SandboxClient  # noqa: E402
from orchard.eval.evaluate import evaluate  # noqa: E402
from orchard.eval.results import read_results  # noqa: E402
from orchard.eval.runner import RunConfig  # noqa: E402
from orchard.recipes.demo import COMPACT_CONFIG, DemoConfig  # noqa: E402
from orchard.recipes.models import load_policy, smollm2_dir  # noqa: E402
from orchard.recipes.rerank import (  # noqa: E402
    TextOf,
    ValueModel,
    known_fixes,
    likelihood_rerank,
    rerank_run,
    training_examples,
)
from orchard.rollout.tokenizer import TEST_TOKENIZER, load_tokenizer  # noqa: E402

PICKS = ("value", "random", "lookup", "fewest_files", "oracle")


def fewest_files(run_dir: Path) -> float:
    """The expected success of a random pick among each task's candidates whose patch changes
    the fewest files (an empty patch counts as none to pick): the regex that sees the
    neighbour-breaking failure, a second changed file."""
    groups: dict[str, list[Any]] = defaultdict(list)
    for r in read_results(run_dir):
        groups[r.instance_id].append(r)
    rates = []
    for candidates in groups.values():
        files = [r.patch.count("diff --git") or math.inf for r in candidates]
        picked = [r for r, f in zip(candidates, files, strict=True) if f == min(files)]
        rates.append(sum(r.resolved for r in picked) / len(picked))
    return statistics.fmean(rates)


def decoys_only(task: SweTask) -> SweTask:
    """``task`` whose teacher fails only by scripts that change nothing but the fix's file."""
    path = task.metadata["fix"]["path"]
    teacher = task.metadata["teacher"]
    fail = [script for script in teacher["fail"]
            if all(path in command for _, command in script if command.startswith("sed"))]
    metadata = {**task.metadata, "teacher": {**teacher, "fail": fail}}
    return task.model_copy(update={"metadata": metadata})


def value_model(args: Any, backbone: str, seed: int) -> ValueModel:
    # Room for the observations: a patch alone fits the demo's 256 tokens.
    config = replace(DemoConfig().value, seed=seed, max_tokens=args.max_tokens)
    if backbone == "smollm2":
        return ValueModel.from_pretrained(smollm2_dir(), replace(
            config, lr=args.value_lr, epochs=args.value_epochs))
    return ValueModel.tiny(load_tokenizer(TEST_TOKENIZER), config)


@functools.cache
def scoring_lm() -> tuple[Any, Any]:
    """SmolLM2-135M-Instruct as it comes, in float32 (the CPU's fast path)."""
    return load_policy(smollm2_dir(), dtype=torch.float32)


def by_kind(report: dict[str, Any], tasks: list[SweTask]) -> dict[str, dict[str, float]]:
    """The value, random and oracle picks' means over each kind's tasks."""
    kinds: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for task in tasks:
        kinds[task.metadata["kind"]].append(report["tasks"][task.instance_id])
    return {kind: {k: statistics.fmean(t[k] for t in picks) for k in ("value", "random",
                                                                        "oracle")}
            for kind, picks in kinds.items()}


def one_seed(args: Any, seed: int, client: SandboxClient, root: Path) -> dict[str, Any]:
    tasks = bugfix_family(args.n_train, args.n_test, seed)
    if args.fail == "decoy":
        tasks = [decoys_only(t) for t in tasks]
    train = [t for t in tasks if t.split == "train"]
    test = [t for t in tasks if t.split == "test"]
    agent_config = config_from_specs([COMPACT_CONFIG])
    runs, seconds = {}, {}
    for split, split_tasks, n in (("train", train, args.train_n), ("test", test, args.n)):
        started = time.monotonic()
        runs[split] = root / split
        harness = TeacherHarness(split_tasks, solve=args.solve, config=agent_config,
                                 per_sample=True, seed=seed)
        evaluate(split_tasks, harness, runs[split], client,
                 config=RunConfig(out=runs[split], n=n, concurrency=args.concurrency))
        seconds[split] = round(time.monotonic() - started, 1)
    fixes = known_fixes([runs["train"]])
    out: dict[str, Any] = {"seconds": seconds, "readers": {}}
    for reader in args.readers:
        backbone, text_of = reader.split(":")
        started = time.monotonic()
        fit: dict[str, Any] = {}
        if text_of == "likelihood":
            report = likelihood_rerank(runs["test"], test, *scoring_lm(), fixes=fixes)
        else:
            value = value_model(args, backbone, seed)
            fit = value.train(training_examples([runs["train"]], train, text_of=text_of))
            report = rerank_run(runs["test"], test, value, text_of=text_of, fixes=fixes)
        overall = report["overall"]
        overall["fewest_files"] = fewest_files(runs["test"])
        out["readers"][reader] = {**{k: overall[k] for k in PICKS}, "train": fit,
                                   "by_kind": by_kind(report, test),
                                   "seconds": round(time.monotonic() - started, 1)}
        if not args.quiet:
            print(f"seed {seed} {reader}: " + ", ".join(
                f"{k} {100 * overall[k]:.1f}" for k in PICKS), flush=True)
    return out


def summarize(per_seed: dict[str, dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for reader in next(iter(per_seed.values()))["readers"]:
        summary[reader] = {}
        for pick in PICKS:
            values = [s["readers"][reader][pick] for s in per_seed.values()]
            se = (statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1
                  else float("nan"))
            summary[reader][pick] = {"each": values, "mean": statistics.fmean(values),
                                      "se_seeds": se}
    return summary


def report(args: Any, r: dict[str, Any]) -> None:
    rows = [[reader, *[f"{100 * s[p]['mean']:.1f} ± {100 * s[p]['se_seeds']:.1f}"
                       for p in PICKS]] for reader, s in r["summary"].items()]
    print_table(f"best-of-{args.n} on {args.n_test} held-out bug-fix tasks, % resolved "
                f"(mean ± SE over seeds {' '.join(map(str, r['seeds']))}; the teacher "
                f"solves a sample with p={args.solve}; it fails by {args.fail})",
                ["value model", *PICKS], rows)


def main() -> int:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--n-train", type=int, default=64)
    parser.add_argument("--train-n", type=int, default=2, help="samples per training task")
    parser.add_argument("--n-test", type=int, default=48)
    parser.add_argument("--n", type=int, default=4, help="candidates per held-out task")
    parser.add_argument("--solve", type=float, default=0.5)
    parser.add_argument("--readers", nargs="+", default=["tiny:patch", "tiny:both"],
                        choices=[f"{b}:{t}" for b in ("tiny", "smollm2")
                                 for t in get_args(TextOf)] + ["smollm2:likelihood"],
                        help="value models, as backbone:text; smollm2:likelihood ranks by "
                             "the untrained model's mean log-prob of the actions")
    parser.add_argument("--fail", choices=("any", "decoy"), default="any",
                        help="the teacher's failures: both kinds, or decoy fixes only")
    parser.add_argument("--max-tokens", type=int, default=640,
                        help="the value model's input budget")
    parser.add_argument("--value-lr", type=float, default=2e-5,
                        help="the learning rate of smollm2 value-model readers")
    parser.add_argument("--value-epochs", type=int, default=3,
                        help="the epochs of smollm2 value-model readers")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("runs/rerank-family"))
    parser.add_argument("--reuse", action="store_true",
                        help="keep the rollouts already in --out (same arguments)")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.n_train, args.n_test, args.n = args.seeds[:1], 8, 4, 2
    results: dict[str, Any] = {"seeds": [], "per_seed": {}}
    server = BenchServer()
    with server, SandboxClient(server.url, timeout=600) as client:
        for seed in args.seeds:
            root = args.out / f"seed-{seed}"
            if root.exists() and any(root.iterdir()) and not args.reuse:
                raise SystemExit(f"{root} is not empty: give a new --out, or --reuse to "
                                 "rerank the rollouts it holds (it finishes missing ones)")
            results["per_seed"][str(seed)] = one_seed(args, seed, client, root)
            results["seeds"].append(seed)
            results["summary"] = summarize(results["per_seed"])
            write_json("rerank_family", args, results)
    return finish("rerank_family", args, results, server, report)


if __name__ == "__main__":
    sys.exit(main())
