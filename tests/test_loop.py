"""The shared training loop: one optimizer step (clears stale gradients, accumulates micro-batch
losses, clips, applies a scheduled learning rate, lowers a tiny model's loss) and the outer loop
of RL and distillation (sample -> update -> sync -> log)."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from orchard.recipes.loop import adamw, optimizer_step, train_loop, trainable
from orchard.recipes.loss import masked_nll, shift, token_logprobs
from orchard.recipes.models import tiny_llama
from orchard.rollout.tokenizer import TEST_TOKENIZER, load_tokenizer


def linear() -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 1)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    return torch.randn(6, 4), torch.randn(6, 1)


def squared_error(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((model(x) - y) ** 2).sum()


def test_the_step_clips_the_gradient_and_returns_its_norm_before_clipping() -> None:
    model = linear()
    before = [p.detach().clone() for p in model.parameters()]
    x, y = batch()
    loss = squared_error(model, 100 * x, y)
    expected = torch.cat([g.flatten() for g in torch.autograd.grad(
        loss, list(model.parameters()), retain_graph=True)]).norm().item()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    norm = optimizer_step(optimizer, list(model.parameters()), [loss], grad_clip=0.5)
    assert norm == pytest.approx(expected) and norm > 100
    # Plain SGD at lr 1 moves the weights by minus the clipped gradient: a step of norm 0.5.
    moved = torch.cat([(p.detach() - b).flatten() for p, b in zip(model.parameters(), before,
                                                                  strict=True)])
    assert moved.norm().item() == pytest.approx(0.5, rel=1e-5)


def test_micro_batch_losses_accumulate_to_the_whole_batchs_step() -> None:
    whole, parts = linear(), linear()
    x, y = batch()
    steps = []
    for model, losses in ((whole, lambda m: [squared_error(m, x, y) / 6]),
                          (parts, lambda m: [squared_error(m, x[:2], y[:2]) / 6,
                                             squared_error(m, x[2:], y[2:]) / 6])):
        for p in model.parameters():  # a stale gradient the step must clear, not add to
            p.grad = torch.full_like(p, 7.0)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        steps.append(optimizer_step(optimizer, list(model.parameters()), losses(model),
                                    grad_clip=1e9))
    assert steps[0] == pytest.approx(steps[1])
    for a, b in zip(whole.parameters(), parts.parameters(), strict=True):
        torch.testing.assert_close(a, b)


def test_each_micro_batch_is_backpropagated_before_the_next_is_made() -> None:
    model = linear()
    x, y = batch()
    seen = []

    def losses() -> Iterator[torch.Tensor]:
        for i in range(3):
            seen.append(model.weight.grad is not None)
            yield squared_error(model, x[2 * i:2 * i + 2], y[2 * i:2 * i + 2])

    optimizer_step(torch.optim.SGD(model.parameters(), lr=0.1), list(model.parameters()),
                   losses(), grad_clip=1.0)
    assert seen == [False, True, True]


def test_a_scheduled_learning_rate_is_the_one_the_step_uses() -> None:
    model = linear()
    x, y = batch()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    before = model.bias.detach().clone()
    optimizer_step(optimizer, list(model.parameters()), [squared_error(model, x, y)],
                   grad_clip=1e9, lr=0.0)
    assert [g["lr"] for g in optimizer.param_groups] == [0.0]
    torch.testing.assert_close(model.bias.detach(), before)  # lr 0: nothing moved


def test_adamw_decays_the_matrices_only_and_leaves_frozen_weights_out() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    model[1].weight.requires_grad_(False)
    optimizer = adamw(model, 1e-3, weight_decay=0.1)
    decayed, plain = optimizer.param_groups
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert [p.shape for p in decayed["params"]] == [torch.Size([4, 4])]
    assert len(plain["params"]) == 2  # the two biases; the frozen norm weight is not there
    assert len(trainable(model)) == 3


def test_steps_lower_a_tiny_models_loss() -> None:
    tok = load_tokenizer(TEST_TOKENIZER)
    model = tiny_llama(tok, hidden_size=32, layers=1, heads=2)
    ids = torch.tensor([list(range(10, 40))])
    mask = shift(torch.ones_like(ids))

    def loss() -> torch.Tensor:
        logprobs, _ = token_logprobs(model, ids, mask=mask, entropy=False)
        return masked_nll(logprobs, mask)

    optimizer = adamw(model, 1e-2)
    model.train()
    losses = []
    for _ in range(10):
        current = loss()
        losses.append(current.item())
        optimizer_step(optimizer, trainable(model), [current], grad_clip=1.0)
    assert losses[-1] < losses[0] - 1.0, losses


class CountingServer:
    def __init__(self) -> None:
        self.versions: list[float] = []

    def update(self, model: torch.nn.Module) -> int:
        self.versions.append(float(model.weight.detach().sum()))
        return len(self.versions)


def test_the_outer_loop_samples_updates_syncs_and_logs(tmp_path: Path) -> None:
    model = linear()
    server = CountingServer()
    seen: list[dict] = []

    def sample(step: int) -> tuple[list[int], dict]:
        # Step 1 samples nothing (as when BAR drops every group): no update, no sync.
        return ([] if step == 1 else [step] * 3), {"asked": step}

    def update(data: list[int]) -> dict:
        with torch.no_grad():
            model.weight.add_(1.0)
        return {"trained_on": len(data)}

    start = float(model.weight.detach().sum())
    history = train_loop(model, server, 3, sample=sample, update=update,
                         log=tmp_path / "log.jsonl", on_step=seen.append)
    assert [r["step"] for r in history] == [0, 1, 2] and seen == history
    assert [r["asked"] for r in history] == [0, 1, 2]
    assert [r.get("trained_on") for r in history] == [3, None, 3]
    assert [r.get("weights_version") for r in history] == [1, None, 2]
    # The server got the weights as each update left them.
    assert server.versions == pytest.approx([start + 4, start + 8])
    assert history[1]["train_seconds"] == 0.0
    assert all(r[k] >= 0 for r in history for k in ("rollout_seconds", "train_seconds",
                                                    "seconds"))
    logged = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert logged == copy.deepcopy(history)


def test_the_update_gets_the_threads_it_asks_for_and_gives_them_back(tmp_path: Path) -> None:
    model, server = linear(), CountingServer()
    threads: list[int] = []

    def update(data: list[int]) -> dict:
        threads.append(torch.get_num_threads())
        return {}

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for asked in (0, 1, None):
            train_loop(model, server, 1, sample=lambda step: ([step], {}), update=update,
                       log=tmp_path / "log.jsonl", update_threads=asked)
            assert torch.get_num_threads() == 1  # sampling's setting, back after the update
    finally:
        torch.set_num_threads(before)
    # 0 is every core this process may use; None leaves the caller's setting.
    assert threads == [len(os.sched_getaffinity(0)), 1, 1]
