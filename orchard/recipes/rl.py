"""Balanced Adaptive Rollout RL: GRPO on balanced groups of real rollouts.

One step, top to bottom:
1. For prompts (tasks) in a shuffled order, sample rollouts of the served policy through the
   real harness, the recording proxy, sandboxes and fresh-sandbox grading, ``stride`` at a
   time, until BAR assembles a group (``bar_group``); drop groups the filter rejects and take
   the next prompt instead, until ``batch_prompts`` groups are kept (``fill_batch``).
2. Each rollout's reward (+1 resolved, else -1) becomes a GRPO advantage within its group.
3. The proxy recorded every model call token for token; each rollout becomes one or more
   samples (``build_samples``): the policy's own tokens (mask 1, with the log-probs it sampled
   them with) inside the context it saw (mask 0).
4. PPO-clip over those samples: ``ppo_epochs`` shuffled passes of ``minibatches`` optimizer
   steps each (gradient accumulated over micro-batches, the loss a mean over the minibatch's
   trained tokens), then the new weights go to the server. Time-exceeded rollouts count in
   their group's baseline but are not trained on.

Steps 1-3 are ``sample_groups``, step 4 is ``policy_update``; the loop around them (sample ->
update -> sync -> log) is ``loop.train_loop``, the one distillation runs too.

    history = train_rl(model, tasks, client, server, out, RLConfig(steps=4), harness=harness)
"""

from __future__ import annotations

import copy
import json
import logging
import random
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from orchard.env.client import SandboxClient
from orchard.eval.evaluate import evaluate
from orchard.eval.harness import Harness
from orchard.eval.results import RolloutResult
from orchard.eval.runner import RunConfig
from orchard.recipes.bar import (
    BARConfig,
    GroupResult,
    Rollout,
    bar_group,
    fill_batch,
    filter_group,
    grpo_advantages,
)
from orchard.recipes.loop import adamw, optimizer_step, train_loop, trainable
from orchard.recipes.loss import pad_id_of, pad_right, ppo_clip_loss, shift, token_logprobs
from orchard.recipes.policy_server.weight_sync import ServesWeights
from orchard.recipes.reporting import Reporter, section
from orchard.rollout.seeds import stable_seed
from orchard.rollout.traces.samples import Sample, build_samples
from orchard.tasks.protocol import Task

log = logging.getLogger(__name__)

# How a harness's exit maps to BAR's statuses. A rollout that failed (environment, model,
# harness) is aborted, and so is one whose exit this table does not know: a status nobody
# defined cannot be trusted to mean the rollout ran to its end. mini-swe-agent's
# RepeatedFormatError is the policy's own doing (malformed turns until it gave up), so it is
# an ending to learn from.
FORMAT_FAILURE = "RepeatedFormatError"
_STATUS = {"Submitted": "completed", FORMAT_FAILURE: "completed",
           "LimitsExceeded": "truncated", "TimeExceeded": "time_exceeded"}


@dataclass
class RLConfig:
    steps: int = 4
    batch_prompts: int = 4
    """Groups per step (the rollout batch, in prompts)."""
    oversample: int = 2
    """Prompts tried per step, as a multiple of batch_prompts."""
    bar: BARConfig = field(default_factory=lambda: BARConfig(n=4, n_max=8, stride=4))
    lr: float = 1e-4
    """The reference uses 1e-6 for a 35B model; a tiny random-init model needs far more."""
    clip_low: float = 0.2
    clip_high: float = 0.28
    entropy_coef: float = 1e-4
    kl_coef: float = 0.0
    """Weight of GRPO's KL penalty to the policy RL started from (DeepSeekMath used 0.04).
    0 leaves it out, as DAPO does; the reference model then is never built."""
    ppo_epochs: int = 4
    """Passes over each step's samples. More than one reuses the rollouts off-policy, so the
    ratio leaves 1 and the clip bounds how far a batch moves the policy."""
    minibatches: int = 2
    """Optimizer steps per pass."""
    micro_batch: int = 4
    grad_clip: float = 1.0
    concurrency: int = 2
    """Rollouts at once within a group's round."""
    update_threads: int | None = 0
    """torch threads for the policy update: 0 every core (sampling is over, the update has
    the machine), None as the caller set them (e.g. processes that share the cores)."""
    seed: int = 0
    format_failure_reward: float | None = None
    """The reward of an unsolved rollout that ended in format errors, in place of the grade's.
    None keeps the grade's (-1, as for a wrong fix). Below -1 (e.g. -2), a group ranks a
    well-formed wrong fix above a derailment, so GRPO pushes format failures down harder."""
    kl_low: float = 1e-3
    kl_high: float = 0.1
    """A step whose final-epoch approx KL falls outside [kl_low, kl_high] gets a warning:
    below, the update barely moved the policy; above, it moved it further than its rollouts
    can vouch for."""


def rollout_status(result: RolloutResult) -> str:
    if result.failure is not None:
        return "aborted"
    return _STATUS.get(result.exit_status, "aborted")


def rollout_reward(result: RolloutResult, format_failure_reward: float | None = None
                   ) -> float | None:
    """The reward RL sees: the grade's (with a rubric judge, base + 0.5 J), None when the
    rollout was never graded. With ``format_failure_reward``, an unsolved rollout that ended
    in format errors gets that instead."""
    if result.grade is None:
        return None
    if (format_failure_reward is not None and result.exit_status == FORMAT_FAILURE
            and not result.resolved):
        return format_failure_reward
    return result.reward


class PolicySampler:
    """``sampler(task, k)``: k new rollouts of ``task`` by the policy behind ``harness``, each
    graded; a rollout's payload is (its RolloutResult, its training samples). With ``seed``,
    each round's requests are seeded from it and the round's number, so a run samples the
    same rollouts again (a resumed step too), and no two rounds share seeds. Rewards are
    ``rollout_reward``'s."""

    def __init__(self, client: SandboxClient, harness: Harness, out: Path, *,
                 concurrency: int = 2, seed: int | None = None,
                 format_failure_reward: float | None = None) -> None:
        self.client, self.harness, self.out, self.concurrency = client, harness, out, concurrency
        self.seed, self.format_failure_reward = seed, format_failure_reward
        self.rounds = 0

    def __call__(self, task: Task, k: int) -> list[Rollout]:
        self.rounds += 1
        out = self.out / f"round-{self.rounds:04d}"
        results: list[RolloutResult] = []
        evaluate([task], self.harness, out, self.client,
                 config=RunConfig(out=out, n=k, concurrency=self.concurrency,
                                  max_attempts=2, sampling_seed=None if self.seed is None
                                  else stable_seed(self.seed, self.rounds)),
                 on_result=results.append)
        # BAR balances the groups on whether the task was solved, whatever the reward.
        return [Rollout(reward=rollout_reward(r, self.format_failure_reward),
                        status=rollout_status(r), payload=(r, self._samples(out, r)),
                        success=r.resolved if r.grade is not None else None)
                for r in sorted(results, key=lambda r: r.sample)]

    @staticmethod
    def _samples(out: Path, result: RolloutResult) -> list[Sample]:
        path = out / "calls" / f"{result.rollout_id}.jsonl"
        if not path.exists():
            return []
        calls = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
                 if line.strip()]
        return build_samples(result.rollout_id, calls)[0]


def training_pairs(groups: Sequence[Sequence[Rollout]]) -> list[tuple[Sample, float]]:
    """(sample, GRPO advantage) for every sample of the groups' rollouts. A time-exceeded
    rollout's reward stays in its group's baseline, but its tokens are not trained on: it was
    cut off, so how it ended is not the policy's doing."""
    return [(sample, advantage)
            for group in groups
            for rollout, advantage in zip(group, grpo_advantages(
                [r.reward if r.reward is not None else 0.0 for r in group]), strict=True)
            if rollout.status != "time_exceeded"
            for sample in rollout.payload[1]]


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


# An advantage per rollout (GRPO), or per token aligned with the sample's input_ids (on-policy
# distillation's dense reward).
Advantage = float | Sequence[float]


def _batch(samples: Sequence[tuple[Sample, Advantage]], pad_id: int,
           refs: Sequence[Sequence[float]] | None = None) -> dict[str, torch.Tensor]:
    rows = [s for s, _ in samples]
    advantages = [list(a) if isinstance(a, Sequence) else [float(a)] * len(s.input_ids)
                  for s, a in samples]
    # A trained token needs the log-prob it was sampled with: without one there is no
    # importance ratio, so it is left out rather than guessed.
    mask = [[m == 1 and lp is not None for m, lp in zip(s.loss_mask, s.logprobs, strict=True)]
            for s in rows]
    batch = {"input_ids": pad_right([s.input_ids for s in rows], pad_id, torch.long),
             "attention_mask": pad_right([[1] * len(s.input_ids) for s in rows], 0, torch.long),
             "mask": pad_right(mask, False, torch.bool),
             "old": pad_right([[lp if lp is not None else 0.0 for lp in s.logprobs]
                               for s in rows], 0.0, torch.float32),
             "advantages": pad_right(advantages, 0.0, torch.float32)}
    if refs is not None:  # already on the prediction grid, one slot shorter
        batch["ref"] = pad_right(refs, 0.0, torch.float32)
    return batch


def _trained_tokens(samples: Sequence[tuple[Sample, Advantage]]) -> int:
    return sum(sum(m == 1 and lp is not None for m, lp in zip(s.loss_mask, s.logprobs,
                                                                strict=True))
               for s, _ in samples)


def _by_length(indices: Sequence[int], samples: Sequence[tuple[Sample, Advantage]],
               size: int) -> list[list[int]]:
    """``indices`` in micro-batches of ``size``, longest first, so each pads to a length near
    its own. The loss is a token sum over the whole minibatch, so how it is cut up changes
    only the padding."""
    ordered = sorted(indices, key=lambda i: -len(samples[i][0].input_ids))
    return [ordered[i:i + size] for i in range(0, len(ordered), size)]


def _reference_logprobs(reference: torch.nn.Module,
                        samples: Sequence[tuple[Sample, Advantage]], config: RLConfig,
                        pad_id: int) -> list[list[float]]:
    """Each sample's log-probs under the frozen reference, on the prediction grid (0 where
    nothing is trained). One pass a step: every epoch reads the same values."""
    device = next(reference.parameters()).device
    refs: list[list[float]] = [[] for _ in samples]
    with torch.no_grad():
        for micro in _by_length(range(len(samples)), samples, config.micro_batch):
            b = {k: v.to(device) for k, v in _batch([samples[i] for i in micro], pad_id).items()}
            ref, _ = token_logprobs(reference, b["input_ids"], b["attention_mask"],
                                    mask=shift(b["mask"]), entropy=False)
            for row, i in zip(ref.cpu(), micro, strict=True):
                refs[i] = row[:len(samples[i][0].input_ids) - 1].tolist()
    return refs


def _minibatch_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    part: Sequence[tuple[Sample, Advantage]], config: RLConfig, pad_id: int,
                    refs: Sequence[Sequence[float]] | None) -> dict[str, float]:
    """One optimizer step on ``part`` (gradient accumulated over micro-batches, the loss a
    mean over its trained tokens); its stats, token-weighted. ``refs``: the reference's
    log-probs of each sample, for the KL penalty."""
    total = _trained_tokens(part)
    device = next(model.parameters()).device
    sums: dict[str, float] = {}

    def micro_losses() -> Iterator[torch.Tensor]:
        for micro in _by_length(range(len(part)), part, config.micro_batch):
            b = {k: v.to(device) for k, v in _batch(
                [part[i] for i in micro], pad_id,
                None if refs is None else [refs[i] for i in micro]).items()}
            mask = shift(b["mask"])
            logprobs, entropy = token_logprobs(model, b["input_ids"], b["attention_mask"],
                                               mask=mask)
            ref = b.get("ref")
            # Divided by the whole minibatch's token count, not this micro-batch's: the
            # accumulated gradient is then that of the minibatch's token mean.
            loss, stats = ppo_clip_loss(
                logprobs, shift(b["old"]), shift(b["advantages"]), mask,
                clip_low=config.clip_low, clip_high=config.clip_high, entropy=entropy,
                entropy_coef=config.entropy_coef, num_tokens=total, ref_logprobs=ref,
                kl_coef=config.kl_coef)
            weight = mask.sum().item() / total
            for key, value in {"loss": loss.item() / weight, **stats}.items():
                sums[key] = sums.get(key, 0.0) + value * weight
            yield loss

    sums["grad_norm"] = optimizer_step(optimizer, trainable(model), micro_losses(),
                                       grad_clip=config.grad_clip)
    sums["tokens"] = float(total)
    return sums


def policy_update(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                  samples: Sequence[tuple[Sample, Advantage]], config: RLConfig, pad_id: int,
                  reference: torch.nn.Module | None = None) -> dict[str, Any]:
    """PPO on (sample, advantage) pairs, an advantage per sample or per token:
    ``config.ppo_epochs`` shuffled passes, each split into ``config.minibatches`` optimizer
    steps. Only the very first step is on-policy; after
    it the ratio to the sampling policy leaves 1 and the clip starts to bind.

    Returns the final epoch's stats at the top level: approx_kl, clip_fraction, ratio_mean,
    ratio_std, entropy, grad_norm, loss. They say how far the step moved the policy from the
    one that sampled, as measured before each of that epoch's optimizer steps (one epoch of
    one minibatch is on-policy, so it shows no movement). Also ``first_epoch`` (its first
    minibatch is the on-policy check), ``epochs`` (each epoch's stats, token-weighted over
    its minibatches), ``tokens`` and ``optimizer_steps``. With a ``reference`` policy (and
    ``config.kl_coef``), the loss holds the KL penalty to it, and the stats its ``ref_kl``."""
    trained = [(s, a) for s, a in samples if _trained_tokens([(s, a)])]
    if not trained:
        raise ValueError("no sample has a trained token with a log-prob: did the model server "
                         "return token ids and log-probs (return_token_ids, logprobs)?")
    rng = random.Random(config.seed)
    refs = (_reference_logprobs(reference, trained, config, pad_id)
            if reference is not None and config.kl_coef else None)
    model.train()
    epochs: list[dict[str, float]] = []
    steps = 0
    for _ in range(config.ppo_epochs):
        order = list(range(len(trained)))
        rng.shuffle(order)
        size = -(-len(order) // min(config.minibatches, len(order)))
        parts = [_minibatch_step(model, optimizer, [trained[j] for j in order[i:i + size]],
                                 config, pad_id,
                                 None if refs is None else [refs[j] for j in order[i:i + size]])
                 for i in range(0, len(order), size)]
        steps += len(parts)
        tokens = sum(p["tokens"] for p in parts)
        epoch = {key: sum(p[key] * p["tokens"] for p in parts) / tokens
                 for key in parts[0] if key != "tokens"}
        epoch["ratio_std"] = max(0.0, epoch.pop("ratio_sq_mean") - epoch["ratio_mean"] ** 2
                                 ) ** 0.5
        epochs.append(epoch)
    model.eval()
    return {**epochs[-1], "first_epoch": epochs[0], "epochs": epochs,
            "tokens": float(_trained_tokens(trained)), "optimizer_steps": steps}


def step_warnings(stats: dict[str, Any], config: RLConfig) -> list[str]:
    """What is wrong with an update whose stats ``policy_update`` returned, in words."""
    kl = stats["approx_kl"]
    if kl < config.kl_low:
        return [f"final-epoch approx KL {kl:.1e} is below {config.kl_low:g}: the update "
                f"barely moved the policy, so this step's rollouts taught it next to nothing; "
                f"raise the learning rate (now {config.lr:g}) or ppo_epochs "
                f"(now {config.ppo_epochs})"]
    if kl > config.kl_high:
        return [f"final-epoch approx KL {kl:.1e} is above {config.kl_high:g}: the update "
                f"moved the policy far from the one that sampled its rollouts; lower the "
                f"learning rate (now {config.lr:g}) or ppo_epochs (now {config.ppo_epochs})"]
    return []


def train_rl(model: torch.nn.Module, tasks: Sequence[Task],
             client: SandboxClient, server: ServesWeights, out: Path, config: RLConfig, *,
             harness: Harness, on_step: Callable[[dict[str, Any]], None] | None = None,
             resume: bool = False, report: Reporter | None = None) -> list[dict[str, Any]]:
    """``config.steps`` BAR RL steps on ``tasks``; ``server`` serves ``model`` and gets its new
    weights after each step (a ``PolicyServer``, or an external engine's ``FolderSync``). The
    rollouts are ``harness``'s, calling the server (e.g. the domain's policy harness:
    ``MiniSweAgentHarness(server.url, model, render_with=tokenizer_dir)`` for SWE tasks, the
    browser agent for web tasks). Returns one record per step (also appended to
    out/rl.jsonl, and its numbers to ``report`` under ``rl/``); the loop is
    ``loop.train_loop``.

    A record whose update looks inert or too large carries ``warnings`` (``step_warnings``),
    also logged. After each step (and after ``on_step``, e.g. an evaluation) the model, the
    optimizer and the prompt order are saved to out/checkpoint.pt; ``resume`` continues
    from there to ``config.steps``, so a long run can be split across sessions."""
    if not tasks:
        raise ValueError("RL needs at least one task")
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(config.seed)
    pad_id = pad_id_of(model)
    optimizer = adamw(model, config.lr)
    if not resume and (out / "rl.jsonl").exists():
        raise ValueError(f"{out} already holds an RL run (rl.jsonl); resume it (resume=True, "
                         f"--resume) or give a new folder")
    reference = _reference(out, model) if config.kl_coef else None
    history = _restore(out, model, optimizer, rng, server) if resume else []

    def sample(step: int) -> tuple[list[tuple[Sample, Advantage]], dict[str, Any]]:
        sampler = PolicySampler(client, harness, out / f"step-{step:03d}",
                                concurrency=config.concurrency,
                                seed=stable_seed("rl", config.seed, step),
                                format_failure_reward=config.format_failure_reward)
        return sample_groups(tasks, sampler, rng, config)

    def update(pairs: list[tuple[Sample, Advantage]]) -> dict[str, Any]:
        stats = policy_update(model, optimizer, pairs, config, pad_id, reference)
        if warnings := step_warnings(stats, config):
            stats["warnings"] = warnings
            for warning in warnings:
                log.warning("RL step: %s", warning)
        return stats

    def after(record: dict[str, Any]) -> None:
        if on_step is not None:
            on_step(record)
        _checkpoint(out, model, optimizer, rng, record["step"])

    return history + train_loop(model, server, config.steps, sample=sample, update=update,
                                log=out / "rl.jsonl", on_step=after, start=len(history),
                                update_threads=config.update_threads,
                                report=section(report, "rl"))


def _reference(out: Path, model: torch.nn.Module) -> torch.nn.Module:
    """A frozen copy of the policy RL started from, for the KL penalty. Its weights are kept
    in out/reference.pt, so a resumed run measures KL to the same policy."""
    reference = copy.deepcopy(model).eval().requires_grad_(False)
    path = out / "reference.pt"
    if path.exists():
        reference.load_state_dict(torch.load(path, weights_only=True))
    else:
        part = out / "reference.pt.part"
        torch.save(reference.state_dict(), part)
        part.replace(path)
    return reference


def _checkpoint(out: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                rng: random.Random, step: int) -> None:
    # Written aside and renamed: a run killed mid-save keeps the previous checkpoint.
    part = out / "checkpoint.pt.part"
    torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "rng": rng.getstate()}, part)
    part.replace(out / "checkpoint.pt")


def _restore(out: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             rng: random.Random, server: ServesWeights) -> list[dict[str, Any]]:
    """Load out/checkpoint.pt into the run's state; the records of the steps it holds."""
    path = out / "checkpoint.pt"
    if not path.exists():
        if (out / "rl.jsonl").exists():
            raise ValueError(f"{out} has an RL log but no checkpoint.pt to resume from; give "
                             f"a new folder")
        return []  # nothing ran yet: a fresh start
    state = torch.load(path, weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    version, internal, gauss = state["rng"]
    rng.setstate((version, tuple(internal), gauss))
    done = state["step"] + 1
    log_path = out / "rl.jsonl"
    records = [json.loads(line) for line in log_path.read_text(encoding="utf-8").splitlines()
               if line.strip()]
    history = [r for r in records if r["step"] < done]
    # A step cut short after the checkpoint is run again from scratch: its log line and its
    # rollouts go.
    log_path.write_text("".join(json.dumps(r) + "\n" for r in history), encoding="utf-8")
    for stale in out.glob("step-*"):
        if int(stale.name.removeprefix("step-")) >= done:
            shutil.rmtree(stale)
    server.update(model)
    return history


def sample_groups(tasks: Sequence[Task], sampler: Callable[[Task, int], list[Rollout]],
                  rng: random.Random, config: RLConfig
                  ) -> tuple[list[tuple[Sample, Advantage]], dict[str, Any]]:
    """One step's rollouts: BAR groups on prompts drawn from ``tasks`` until
    ``config.batch_prompts`` groups are kept; ``sampler(task, k)`` gives k new rollouts whose
    payload is (result, samples), as ``PolicySampler`` does. Returns their (sample, GRPO
    advantage) pairs and a record of the sampling (groups kept, drops and why, BAR's modes,
    rewards)."""
    built: list[GroupResult] = []

    def make_group(task: Task) -> list[Rollout]:
        result = bar_group(lambda k: sampler(task, k), config.bar)
        built.append(result)
        return result.group

    # Over-sampling: dropped groups are replaced by fresh prompts, up to a bound, so a policy
    # that fails everywhere (every group zero-spread) cannot sample the whole pool.
    prompts = rng.sample(list(tasks), min(len(tasks), config.batch_prompts * config.oversample))
    kept, dropped = fill_batch(prompts, make_group, config.batch_prompts, filter_group)
    pairs = training_pairs([group for _, group in kept])
    pool = [r for g in built for r in g.pool]
    return pairs, {
        "groups": len(kept), "dropped": [reason for _, reason in dropped],
        "modes": [g.mode for g in built], "rollouts": len(pool),
        "resolved_rate": sum(r.reward is not None and r.positive for r in pool) / max(1, len(pool)),
        # With a rubric judge the reward is base + 0.5 J: above the resolved rate when the
        # judge liked unsolved work.
        "mean_reward": _mean([r.reward for r in pool if r.reward is not None]),
        "samples": len(pairs)}


__all__ = ["FORMAT_FAILURE", "Advantage", "PolicySampler", "RLConfig", "policy_update",
           "rollout_reward", "rollout_status", "sample_groups", "step_warnings", "train_rl",
           "training_pairs"]
