"""The cost of one RL policy update on a real step's samples: seconds per update and trained
tokens per second, with and without GRPO's KL penalty.

The samples are those an RL step left on disk (``--step``: its rounds' recorded model calls,
joined into training sequences as the step joined them), each with an advantage of +1 if its
rollout resolved and -1 if not (the cost does not depend on the values). The policy is
``--model`` (default SmolLM2-135M-Instruct, float32) with ``--weights`` loaded over it (e.g.
the run's SFT checkpoint); each timed update starts from a fresh copy of it and a fresh
optimizer, with ``RLConfig``'s defaults (4 epochs x 2 minibatches, micro-batches of 4).

The table also gives the padding of the micro-batches: the tokens the forward passes read over
the tokens the samples hold, for micro-batches cut in shuffled order and cut by length. To
compare two versions of the update, run this script against each (``PYTHONPATH`` pointing at
the other tree's root), alternating, on the same samples.

    .venv/bin/python bench/ppo_update.py --step runs/curve-smol16-kl/seed-0/rl/step-000 \\
        --weights runs/curve-smol16-kl/shared/sft.pt --kl 0 0.04 --repeats 3 --tag smollm2
"""

from __future__ import annotations

import copy
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from common import base_parser, print_table, write_json  # noqa: E402

import orchard  # noqa: E402
from orchard.recipes.loop import adamw  # noqa: E402
from orchard.recipes.loss import pad_id_of  # noqa: E402
from orchard.recipes.models import load_policy, smollm2_dir  # noqa: E402
from orchard.recipes.rl import RLConfig, policy_update  # noqa: E402
from orchard.rollout.traces.samples import Sample, build_samples  # noqa: E402


def step_samples(step: Path) -> list[tuple[Sample, float]]:
    """(sample, +1 or -1) for every training sequence of every rollout the step recorded."""
    resolved = {}
    for line in (ln for f in step.glob("round-*/rollouts.jsonl")
                 for ln in f.read_text(encoding="utf-8").splitlines() if ln.strip()):
        record = json.loads(line)
        resolved[record["rollout_id"]] = bool(record.get("resolved"))
    pairs = []
    for path in sorted(step.glob("round-*/calls/*.jsonl")):
        calls = [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines()
                 if ln.strip()]
        advantage = 1.0 if resolved.get(path.stem) else -1.0
        pairs += [(s, advantage) for s in build_samples(path.stem, calls)[0]]
    if not pairs:
        raise SystemExit(f"{step} holds no recorded model calls (round-*/calls/*.jsonl): give "
                         "the folder of one RL step, e.g. runs/<curve>/seed-0/rl/step-000")
    return pairs


def padding(lengths: list[int], config: RLConfig, by_length: bool) -> float:
    """Tokens read over tokens held, over ``config.ppo_epochs`` shuffled epochs."""
    rng, read = random.Random(0), 0
    for _ in range(config.ppo_epochs):
        order = lengths[:]
        rng.shuffle(order)
        size = -(-len(order) // min(config.minibatches, len(order)))
        for part in (order[i:i + size] for i in range(0, len(order), size)):
            part = sorted(part, reverse=True) if by_length else part
            read += sum(max(part[j:j + config.micro_batch]) * len(part[j:j + config.micro_batch])
                        for j in range(0, len(part), config.micro_batch))
    return read / (config.ppo_epochs * sum(lengths))


def main() -> int:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--step", type=Path, required=True, help="an RL step's folder")
    parser.add_argument("--model", help="a causal-LM folder (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--weights", type=Path, help="a state dict to load over the model")
    parser.add_argument("--kl", type=float, nargs="+", default=[0.0, 0.04],
                        help="KL penalty weights to time (0: no reference)")
    parser.add_argument("--sequences", type=int, default=0,
                        help="time on this many of the sequences, drawn at random with a fixed "
                             "seed (0: all)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    pairs = step_samples(args.step)
    if 0 < args.sequences < len(pairs):
        pairs = random.Random(0).sample(pairs, args.sequences)
    model, _ = load_policy(args.model or smollm2_dir(), dtype=torch.float32)
    if args.weights:
        model.load_state_dict(torch.load(args.weights, weights_only=True))
    lengths = [len(s.input_ids) for s, _ in pairs]
    trained = sum(sum(s.loss_mask) for s, _ in pairs)
    results: dict[str, Any] = {
        "orchard": str(Path(orchard.__file__).resolve().parent),
        "samples": len(pairs), "tokens": sum(lengths), "trained_tokens": trained,
        "longest": max(lengths), "median_length": statistics.median(lengths),
        "padding_shuffled": padding(lengths, RLConfig(), by_length=False),
        "padding_by_length": padding(lengths, RLConfig(), by_length=True), "updates": {}}
    rows = []
    for kl in args.kl:
        config = RLConfig(kl_coef=kl)
        reference = copy.deepcopy(model).eval() if kl else None
        seconds = []
        for _ in range(args.repeats):
            policy = copy.deepcopy(model)
            start = time.perf_counter()
            policy_update(policy, adamw(policy, config.lr), pairs, config, pad_id_of(policy),
                          reference)
            seconds.append(time.perf_counter() - start)
            del policy
        median = statistics.median(seconds)
        results["updates"][str(kl)] = {"seconds": seconds, "median_s": median,
                                       "trained_tokens_per_s": trained / median}
        rows.append([f"{kl:g}", " ".join(f"{s:.1f}" for s in seconds), f"{median:.1f}",
                     f"{trained / median:.0f}"])
    print_table(f"one policy update on {args.step} ({len(pairs)} sequences, {sum(lengths)} "
                f"tokens, {trained} trained; padding {results['padding_shuffled']:.2f}x "
                f"shuffled, {results['padding_by_length']:.2f}x by length); orchard from "
                f"{results['orchard']}",
                ["KL weight", "seconds (each)", "median s", "trained tokens/s"], rows)
    write_json("ppo_update", args, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
