"""Request seeds for common random numbers: the same (task, sample) samples with the same seeds
at every stage of a run (base, SFT, RL step k), so differences between stages pair up per
rollout instead of carrying each stage's own sampling noise.

A rollout's seed comes from the run's ``sampling_seed``, the task and the sample; each model
call of the rollout then sends ``call_seed(seed, index)``: turn t of a rollout always draws
with the same seed, and different turns draw with different ones.

    seed = rollout_seed(sampling_seed, "bugfix-test-003", 1)
    body["seed"] = call_seed(seed, turn)
"""

from __future__ import annotations

import hashlib

# Servers take a signed or unsigned 64-bit seed (torch, vLLM); 63 bits fit both.
SEED_BITS = 63


def stable_seed(*parts: int | str) -> int:
    """A seed in [0, 2**63) from ``parts``, the same in every process and Python version
    (``hash()`` is salted per process, so it cannot serve)."""
    key = "\x1f".join(f"{type(p).__name__}:{p}" for p in parts)
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:8], "big") >> (64 - SEED_BITS)


def rollout_seed(sampling_seed: int, instance_id: str, sample: int) -> int:
    """The seed of sample ``sample`` of task ``instance_id`` under a run's ``sampling_seed``;
    neither the attempt nor the run id enters it, so a retry and a later stage draw alike."""
    return stable_seed(sampling_seed, instance_id, sample)


def call_seed(seed: int, index: int) -> int:
    """The seed of a rollout's ``index``-th model call (0 first)."""
    return stable_seed(seed, index)
