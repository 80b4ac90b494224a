"""bench/ppo_update.py: a step's recorded calls become the training sequences the step trained
on, and one policy update on them is timed with and without the KL penalty."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

from ppo_update import padding, step_samples  # noqa: E402

from orchard.recipes.models import save_policy, tiny_llama  # noqa: E402
from orchard.recipes.rl import RLConfig  # noqa: E402
from orchard.rollout.tokenizer import TEST_TOKENIZER, load_tokenizer  # noqa: E402


def recorded_step(step: Path, lengths: list[int]) -> None:
    """One round whose rollout i has two turns, the second extending the first, a prompt of
    lengths[i] tokens; even rollouts resolved."""
    calls_dir = step / "round-0001" / "calls"
    calls_dir.mkdir(parents=True)
    records = []
    for i, length in enumerate(lengths):
        rid = f"run.task-{i}.0.1"
        prompt = [10 + (i + j) % 90 for j in range(length)]
        first, second = [40, 41, 42], [43, 44]
        calls = [{"index": 0, "tokens": {"prompt_ids": prompt, "completion_ids": first,
                                         "completion_logprobs": [-1.0] * 3}},
                 {"index": 1, "tokens": {"prompt_ids": prompt + first + [50, 51],
                                         "completion_ids": second,
                                         "completion_logprobs": [-2.0] * 2}}]
        (calls_dir / f"{rid}.jsonl").write_text("".join(json.dumps(c) + "\n" for c in calls))
        records.append({"rollout_id": rid, "resolved": i % 2 == 0})
    (step / "round-0001" / "rollouts.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in records))


def test_a_steps_calls_become_its_sequences_and_one_update_is_timed(tmp_path: Path) -> None:
    lengths = [40, 7, 33, 12, 25, 9, 60, 3, 18, 51, 5, 27, 44, 8, 36, 14]
    step = tmp_path / "step-000"
    recorded_step(step, lengths)
    pairs = step_samples(step)
    # Each rollout's turns join into one sequence: prompt, reply, observation, reply.
    assert sorted(len(s.input_ids) for s, _ in pairs) == sorted(n + 7 for n in lengths)
    assert all(sum(s.loss_mask) == 5 for s, _ in pairs)
    assert sorted(a for _, a in pairs) == [-1.0] * 8 + [1.0] * 8
    config = RLConfig()
    sizes = [n + 7 for n in lengths]
    assert 1.0 <= padding(sizes, config, by_length=True) < padding(sizes, config,
                                                                   by_length=False)

    tokenizer = load_tokenizer(TEST_TOKENIZER)
    model_dir = save_policy(tiny_llama(tokenizer, hidden_size=32, layers=1, max_positions=128),
                            tokenizer, tmp_path / "model")
    results = tmp_path / "results"
    r = subprocess.run(
        [sys.executable, str(BENCH / "ppo_update.py"), "--step", str(step), "--model",
         str(model_dir), "--kl", "0", "0.5", "--repeats", "1", "--threads", "1"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "ORCHARD_BENCH_RESULTS": str(results)})
    assert r.returncode == 0, r.stderr
    doc = json.loads((results / "ppo_update.json").read_text())["results"]
    assert doc["samples"] == len(lengths) and doc["trained_tokens"] == 5 * len(lengths)
    assert set(doc["updates"]) == {"0.0", "0.5"}
    assert all(u["median_s"] > 0 for u in doc["updates"].values())

    empty = tmp_path / "step-001"
    empty.mkdir()
    r = subprocess.run([sys.executable, str(BENCH / "ppo_update.py"), "--step", str(empty),
                        "--model", str(model_dir)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "ORCHARD_BENCH_RESULTS": str(results)})
    assert r.returncode != 0 and "holds no recorded model calls" in r.stderr
