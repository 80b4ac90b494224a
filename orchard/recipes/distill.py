"""On-policy distillation: the student samples, a teacher scores the student's own tokens.

RL gives a rollout one reward; here every token gets one. For each token the student wrote,
the reward is log p_teacher(token) - log p_student(token): summed over a sequence it is minus a
sample of the reverse KL(student || teacher), so raising it pulls the student towards what the
teacher would say, on the states the student itself reaches (which offline SFT on the teacher's
own rollouts never shows it). The teacher is any causal LM with the student's tokenizer.

One step, top to bottom:
1. The student's rollouts (any harness through the recording proxy, as in RL) give samples:
   the student's tokens with the log-probs it sampled them with.
2. The teacher scores the same token ids in one forward pass each (``teacher_logprobs``).
3. Per-token advantages A_t = lp_teacher - lp_student (``distill_pairs``), no baseline.
4. The PPO-clip update of ``rl.policy_update`` with those per-token advantages; then the new
   weights go to the server. The loop around the steps is RL's, ``loop.train_loop``.

    teacher_lp = teacher_logprobs(teacher, samples)
    stats = policy_update(student, optimizer, distill_pairs(samples, teacher_lp), config, pad)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from orchard.env.client import SandboxClient
from orchard.eval.harness import Harness
from orchard.recipes.loop import adamw, train_loop
from orchard.recipes.loss import pad_id_of, token_logprobs
from orchard.recipes.policy_server.weight_sync import ServesWeights
from orchard.recipes.reporting import Reporter, section
from orchard.recipes.rl import PolicySampler, RLConfig, policy_update
from orchard.rollout.traces.samples import Sample
from orchard.tasks.protocol import Task


@torch.no_grad()
def teacher_logprobs(teacher: torch.nn.Module, samples: Sequence[Sample]
                     ) -> list[list[float | None]]:
    """The teacher's log-prob of each token of each sample, aligned with ``input_ids`` (None
    for the first token, which nothing predicts)."""
    device = next(teacher.parameters()).device
    out = []
    for s in samples:
        ids = torch.tensor([s.input_ids], device=device)
        lp, _ = token_logprobs(teacher, ids, entropy=False)
        out.append([None, *lp[0].tolist()])
    return out


def distill_pairs(samples: Sequence[Sample], teacher: Sequence[Sequence[float | None]]
                  ) -> list[tuple[Sample, list[float]]]:
    """(sample, per-token advantage): lp_teacher - lp_student on the student's trained tokens,
    0 elsewhere (those are masked out of the loss anyway)."""
    pairs = []
    for s, t in zip(samples, teacher, strict=True):
        if len(t) != len(s.input_ids):
            raise ValueError(f"sample {s.session}: {len(t)} teacher log-probs for "
                             f"{len(s.input_ids)} tokens")
        pairs.append((s, [tl - sl if m == 1 and sl is not None and tl is not None else 0.0
                          for m, sl, tl in zip(s.loss_mask, s.logprobs, t, strict=True)]))
    return pairs


def reverse_kl(pairs: Sequence[tuple[Sample, list[float]]]) -> float:
    """The mean over trained tokens of lp_student - lp_teacher: the per-token reverse KL the
    recipe lowers, estimated on the student's own samples."""
    values = [-a for s, adv in pairs for m, lp, a in zip(s.loss_mask, s.logprobs, adv,
                                                         strict=True)
              if m == 1 and lp is not None]
    return sum(values) / len(values) if values else 0.0


def distill_step(student: torch.nn.Module, teacher: torch.nn.Module,
                 optimizer: torch.optim.Optimizer, samples: Sequence[Sample],
                 config: RLConfig) -> dict[str, Any]:
    """One update of ``student`` towards ``teacher`` on the student's ``samples``."""
    pairs = distill_pairs(samples, teacher_logprobs(teacher, samples))
    stats = policy_update(student, optimizer, pairs, config, pad_id_of(student))
    return {"reverse_kl": reverse_kl(pairs), **stats}


def train_distill(student: torch.nn.Module, teacher: torch.nn.Module,
                  tasks: Sequence[Task], client: SandboxClient, server: ServesWeights,
                  harness: Harness, out: Path, config: RLConfig, *, rollouts_per_step: int = 4,
                  on_step: Callable[[dict[str, Any]], None] | None = None,
                  report: Reporter | None = None) -> list[dict[str, Any]]:
    """``config.steps`` distillation steps: each samples ``rollouts_per_step`` rollouts of a
    task (in turn) by the student behind ``server`` through ``harness``, updates the student
    on them and pushes its weights to the server. One record per step (also out/distill.jsonl,
    and its numbers to ``report`` under ``distill/``);
    the loop is ``loop.train_loop``, as in RL. The task's grade is kept for the record only:
    the teacher is the whole signal."""
    if not tasks:
        raise ValueError("distillation needs at least one task to sample on")
    out.mkdir(parents=True, exist_ok=True)
    optimizer = adamw(student, config.lr)

    def sample(step: int) -> tuple[list[Sample], dict[str, Any]]:
        sampler = PolicySampler(client, harness, out / f"step-{step:03d}",
                                concurrency=config.concurrency)
        rollouts = sampler(tasks[step % len(tasks)], rollouts_per_step)
        samples = [s for r in rollouts for s in r.payload[1]]
        return samples, {"rollouts": len(rollouts), "samples": len(samples),
                         "resolved": sum(bool(r.success) for r in rollouts)}

    def update(samples: list[Sample]) -> dict[str, Any]:
        return distill_step(student, teacher, optimizer, samples, config)

    return train_loop(student, server, config.steps, sample=sample, update=update,
                      log=out / "distill.jsonl", on_step=on_step,
                      report=section(report, "distill"))


__all__ = ["distill_pairs", "distill_step", "reverse_kl", "teacher_logprobs", "train_distill"]
