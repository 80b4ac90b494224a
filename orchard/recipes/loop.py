"""The training loop the recipes share: one optimizer step, taken by SFT, the PPO/GRPO policy
update and the value model, and one outer loop (sample -> update -> sync -> log), run by RL and
by on-policy distillation.

    optimizer = adamw(model, lr=1e-4)
    grad_norm = optimizer_step(optimizer, trainable(model), [loss], grad_clip=1.0)

    history = train_loop(model, server, steps, sample=sample, update=update,
                         log=out / "rl.jsonl")

``sample(step)`` returns the step's training data (rollouts of the served policy, as samples)
and a record of how sampling went; ``update(data)`` trains the model on the data and returns
its statistics. The loop does the rest: it times both, pushes the new weights to the server
and logs one record per step.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from orchard.recipes.reporting import JsonlReporter, Reporter

if TYPE_CHECKING:
    from accelerate import Accelerator

    from orchard.recipes.policy_server.weight_sync import ServesWeights

Data = TypeVar("Data", bound=Sequence[Any])


def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters the optimizer moves: with LoRA, only the adapters."""
    return [p for p in model.parameters() if p.requires_grad]


def adamw(model: torch.nn.Module, lr: float, weight_decay: float = 0.0) -> torch.optim.AdamW:
    """AdamW over the trainable parameters. As nanoGPT: the matrices decay, the norms and
    biases do not."""
    params = trainable(model)
    return torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2],
                               "weight_decay": weight_decay},
                              {"params": [p for p in params if p.dim() < 2],
                               "weight_decay": 0.0}], lr=lr)


def optimizer_step(optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor],
                   losses: Iterable[torch.Tensor], *, grad_clip: float, lr: float | None = None,
                   accelerator: Accelerator | None = None) -> float:
    """One optimizer step; returns the gradient norm before clipping.

    ``losses`` are the step's micro-batch losses. Each is backpropagated as it comes, so a
    generator keeps one micro-batch's graph alive at a time. Their gradients add up, so each
    must already be its share of the step's loss (e.g. summed over its tokens and divided by
    the token count of the whole step). Then the gradient norm of ``params`` is clipped to
    ``grad_clip``, and the optimizer steps, at ``lr`` when a schedule gives one.

    With an ``accelerator`` it does the backward pass and the clipping, so gradients are
    averaged across processes before they are clipped."""
    optimizer.zero_grad(set_to_none=True)
    for loss in losses:
        if accelerator is None:
            loss.backward()
        else:
            accelerator.backward(loss)
    clip = torch.nn.utils.clip_grad_norm_ if accelerator is None else accelerator.clip_grad_norm_
    grad_norm = clip(params, grad_clip)
    if lr is not None:
        for group in optimizer.param_groups:
            group["lr"] = lr
    optimizer.step()
    return float(grad_norm)


@contextlib.contextmanager
def torch_threads(n: int = 0) -> Iterator[None]:
    """torch on ``n`` intra-op threads while the block runs (0: every core this process may
    use), then on as many as before. For a CPU stage that has the machine to itself."""
    before = torch.get_num_threads()
    torch.set_num_threads(n or len(os.sched_getaffinity(0)))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def train_loop(model: torch.nn.Module, server: ServesWeights, steps: int, *,
               sample: Callable[[int], tuple[Data, dict[str, Any]]],
               update: Callable[[Data], dict[str, Any]], log: Path,
               on_step: Callable[[dict[str, Any]], None] | None = None, start: int = 0,
               update_threads: int | None = None, report: Reporter | None = None
               ) -> list[dict[str, Any]]:
    """Steps ``start`` .. ``steps`` - 1 of sample -> update -> sync -> log (``start``: where a
    resumed run picks up); returns one record per step run.

    Each record is the step, what ``sample`` said, what ``update`` returned, the seconds spent
    sampling (``rollout_seconds``), training (``train_seconds``) and in all (``seconds``), and
    the ``weights_version`` the server holds after the sync. A step whose sampling gave no data
    trains on nothing and syncs nothing (e.g. BAR dropped every group). Records are appended
    to ``log`` as JSON lines as they are made, handed to ``report`` (a ``Reporter``, e.g. the
    recipe's ``section`` of ``open_reporters``) and to ``on_step``.

    ``update_threads`` runs ``update`` on that many torch threads (0: every core; None: as
    set). Sampling is over by then, so on a CPU the update can have the whole machine."""
    journal = JsonlReporter(log)
    history: list[dict[str, Any]] = []
    for step in range(start, steps):
        started = time.monotonic()
        data, sampled = sample(step)
        record: dict[str, Any] = {"step": step, **sampled,
                                  "rollout_seconds": time.monotonic() - started}
        if data:
            trained = time.monotonic()
            with (torch_threads(update_threads) if update_threads is not None
                  else contextlib.nullcontext()):
                record.update(update(data))
            record["train_seconds"] = time.monotonic() - trained
            record["weights_version"] = server.update(model)
        else:
            record["train_seconds"] = 0.0
        record["seconds"] = time.monotonic() - started
        history.append(record)
        journal.log(record, step)
        if report is not None:
            report.log(record, step)
        if on_step is not None:
            on_step(record)
    return history


__all__ = ["adamw", "optimizer_step", "torch_threads", "train_loop", "trainable"]
