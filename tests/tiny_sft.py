"""What the SFT entry point's tests train on: the tiny Llama and a few random examples."""

from __future__ import annotations

import random
from pathlib import Path

from orchard.recipes.models import save_policy, tiny_llama
from orchard.recipes.sft import SFTExample, save_examples
from orchard.rollout.tokenizer import TEST_TOKENIZER, load_tokenizer


def write_sft_inputs(folder: Path, examples: int) -> tuple[Path, Path]:
    """A policy folder and an examples file under ``folder``: (model, examples)."""
    tok = load_tokenizer(TEST_TOKENIZER)
    save_policy(tiny_llama(tok, hidden_size=64), tok, folder / "model")
    rng = random.Random(0)
    save_examples([SFTExample(f"r{i}", "t", [rng.randrange(5, 300) for _ in range(40)],
                              [0] * 20 + [1] * 20, [0], True) for i in range(examples)],
                  folder / "sft.jsonl")
    return folder / "model", folder / "sft.jsonl"
