"""SFT in two processes under `accelerate launch` (DDP over gloo on this CPU machine): both
processes train on their rows of each batch, end with the same weights, and the main one saves
a policy folder that loads back with those weights."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from orchard.recipes.distributed import weights_digest
from orchard.recipes.models import load_policy
from tests.tiny_sft import write_sft_inputs

ACCELERATE = Path(sys.executable).parent / "accelerate"


def test_two_processes_train_one_model(tmp_path: Path) -> None:
    write_sft_inputs(tmp_path, 16)
    out = tmp_path / "out"
    done = subprocess.run(
        [str(ACCELERATE), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines",
         "1", "--mixed_precision", "no", "--dynamo_backend", "no", "-m",
         "orchard.recipes.distributed", "--examples", str(tmp_path / "sft.jsonl"),
         "--model", str(tmp_path / "model"), "--out", str(out), "--lr", "3e-3",
         "--epochs", "3", "--batch-size", "4"],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2] and [r["rank"] for r in ranks] == [0, 1]
    # 16 rows, 4 a step (2 each), 3 epochs.
    assert all(r["steps"] == 12 and r["last_loss"] < r["first_loss"] - 0.5 for r in ranks)
    # Each process saw other rows, yet the averaged gradients kept the weights identical.
    assert ranks[0]["history"][0]["loss"] != ranks[1]["history"][0]["loss"]
    assert ranks[0]["weights"] == ranks[1]["weights"]
    trained, _ = load_policy(out / "policy")
    assert weights_digest(trained) == ranks[0]["weights"]
    assert weights_digest(trained) != weights_digest(load_policy(tmp_path / "model")[0])
