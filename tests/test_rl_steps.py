"""How far an RL step moves the policy (the final epoch's statistics and the warnings on them),
and a long RL run split in two: checkpoint after each step, resume from it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from orchard.domains.swe.family import settings_family
from orchard.domains.swe.harness import TeacherHarness
from orchard.domains.swe.minisweagent import config_from_specs
from orchard.env.client import SandboxClient
from orchard.recipes.bar import BARConfig
from orchard.recipes.demo import COMPACT_CONFIG, step_line
from orchard.recipes.loss import token_logprobs
from orchard.recipes.models import tiny_llama
from orchard.recipes.policy_server.server import PolicyServer
from orchard.recipes.rl import RLConfig, policy_update, step_warnings, train_rl
from orchard.rollout.tokenizer import TEST_TOKENIZER, load_tokenizer
from orchard.rollout.traces.samples import Sample
from tests.conftest import needs_root


def _on_policy_samples(model: torch.nn.Module, n: int = 4,
                       lengths: tuple[int, ...] = (24,)) -> list[Sample]:
    """Random conversations (lengths taken in turn) whose second half is the policy's, with
    the log-probs the model gives them now: the first ratio is exactly 1."""
    gen = torch.Generator().manual_seed(1)
    samples = []
    for i in range(n):
        length = lengths[i % len(lengths)]
        ids = torch.randint(10, 200, (1, length), generator=gen)
        with torch.no_grad():
            lp, _ = token_logprobs(model, ids)
        mask = [0] * (length // 2) + [1] * (length - length // 2)
        samples.append(Sample(session=f"s{i}", input_ids=ids[0].tolist(), loss_mask=mask,
                              logprobs=[None, *lp[0].tolist()]))
    return samples


@pytest.mark.parametrize(("lr", "verdict"), [(1e-7, "below"), (5e-4, None), (0.3, "above")])
def test_the_final_epoch_says_how_far_a_step_moved(lr: float, verdict: str | None) -> None:
    tokenizer = load_tokenizer(TEST_TOKENIZER)
    model = tiny_llama(tokenizer, hidden_size=32, layers=1, max_positions=64, seed=0)
    samples = _on_policy_samples(model)
    config = RLConfig(lr=lr, ppo_epochs=4, minibatches=2, grad_clip=1e9)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    advantages = [1.0, -1.0, 1.0, -1.0]
    stats = policy_update(model, optimizer, list(zip(samples, advantages, strict=True)), config,
                          tokenizer.eos_token_id)
    # The first minibatch of the first epoch is on-policy; the final epoch is not.
    assert stats["first_epoch"] == stats["epochs"][0] and stats["epochs"][-1]["approx_kl"] == \
        stats["approx_kl"]
    assert stats["epochs"][0]["approx_kl"] <= stats["approx_kl"]
    for key in ("clip_fraction", "ratio_mean", "ratio_std", "entropy", "grad_norm"):
        assert key in stats and stats[key] >= 0
    assert stats["ratio_std"] > 0
    warnings = step_warnings(stats, config)
    if verdict is None:
        assert 1e-3 <= stats["approx_kl"] <= 0.1 and warnings == []
    else:
        assert len(warnings) == 1 and f"is {verdict}" in warnings[0]
        assert f"{lr:g}" in warnings[0]  # it names the setting to change
    line = step_line("rl", {"step": 0, "groups": 2, "resolved_rate": 0.5, "rollouts": 8,
                            "mean_reward": 0.0, "seconds": 3.0, **stats,
                            "warnings": warnings})
    assert "final-epoch KL" in line and line.count("warning:") == len(warnings)
    assert "KL to the reference" not in line  # no penalty, no reference


def test_the_reference_is_read_once_a_step_and_padding_changes_nothing() -> None:
    """The KL penalty's reference log-probs come from one pass a step, whatever the epochs,
    and line up with each sample: while the policy still is the reference, the KL is 0. How
    the minibatch is cut into micro-batches (and so padded) leaves the update as it was."""
    tokenizer = load_tokenizer(TEST_TOKENIZER)

    def fresh() -> torch.nn.Module:
        return tiny_llama(tokenizer, hidden_size=32, layers=1, max_positions=64, seed=0)

    samples = _on_policy_samples(fresh(), n=6, lengths=(24, 9, 31, 14, 20, 11))
    pairs = list(zip(samples, [1.0, -1.0, 0.5, -0.5, 1.0, -1.0], strict=True))
    reference = fresh()
    calls: list[int] = []
    # The loss reads the trunk and projects only the trained slots, so count the trunk's calls.
    reference.model.register_forward_hook(lambda *_: calls.append(1))
    results = {}
    for micro in (1, 4):
        model = fresh()
        config = RLConfig(lr=1e-3, ppo_epochs=3, minibatches=1, micro_batch=micro,
                          kl_coef=1.0, grad_clip=1e9)
        calls.clear()
        stats = policy_update(model, torch.optim.AdamW(model.parameters(), lr=1e-3), pairs,
                              config, tokenizer.eos_token_id, reference)
        assert len(calls) == -(-len(samples) // micro)  # one pass, not one per epoch
        assert stats["first_epoch"]["ref_kl"] == pytest.approx(0.0, abs=1e-6)
        assert stats["ref_kl"] > 1e-6  # by the last epoch the policy has left it
        results[micro] = (stats, model.state_dict())
    (one, weights_one), (four, weights_four) = results[1], results[4]
    assert one["loss"] == pytest.approx(four["loss"], rel=1e-4)
    assert one["ref_kl"] == pytest.approx(four["ref_kl"], rel=1e-3)
    for key, value in weights_one.items():
        torch.testing.assert_close(weights_four[key], value, rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def client(orchestrator: str) -> Iterator[SandboxClient]:
    with SandboxClient(orchestrator) as c:
        yield c


def _adam_steps(optimizer_state: dict) -> set[float]:
    return {float(s["step"]) for s in optimizer_state["state"].values()}


@needs_root
def test_a_long_run_resumes_from_its_last_checkpoint(client: SandboxClient,
                                                     tmp_path: Path) -> None:
    """Step 0 runs, then the run "dies" during step 1 (a log line and rollouts of it are left
    behind). Resuming loads the checkpoint, drops what step 1 left and runs it again, with
    the KL penalty still measured against the policy the run started from."""
    tasks = settings_family(n_train=4, n_test=0, seed=5)
    tokenizer = load_tokenizer(TEST_TOKENIZER)
    config = RLConfig(steps=1, batch_prompts=1, oversample=4, lr=1e-3, ppo_epochs=1,
                      minibatches=1, kl_coef=0.05,
                      bar=BARConfig(n=2, n_max=4, stride=2, rho_min=0.5, rho_max=0.5))
    # The scripted teacher samples (half of its rollouts solve); the tiny policy trains on
    # them and the policy server takes its weights.
    harness = TeacherHarness(tasks, solve=0.5, per_sample=True, seed=3,
                             config=config_from_specs([COMPACT_CONFIG]))
    out = tmp_path / "rl"

    def run(steps: int, resume: bool, init: int = 0) -> tuple[list[dict], torch.nn.Module]:
        model = tiny_llama(tokenizer, hidden_size=32, layers=1, max_positions=4096, seed=init)
        served = tiny_llama(tokenizer, hidden_size=32, layers=1, max_positions=4096, seed=0)
        with harness, PolicyServer(served, tokenizer) as server:
            history = train_rl(model, tasks, client, server, out,
                               replace(config, steps=steps),
                               harness=harness, resume=resume)
        return history, model

    start = tiny_llama(tokenizer, hidden_size=32, layers=1, max_positions=4096,
                       seed=0).state_dict()
    first, model = run(1, resume=False)
    assert [r["step"] for r in first] == [0] and first[0]["groups"] == 1
    # The reference is the starting policy, kept for a resume; the step measured KL to it.
    reference = torch.load(out / "reference.pt", weights_only=True)
    assert all(torch.equal(reference[k], v) for k, v in start.items())
    assert first[0]["ref_kl"] >= 0 and "ref_kl" in first[0]["first_epoch"]
    saved = torch.load(out / "checkpoint.pt", weights_only=True)
    assert saved["step"] == 0 and _adam_steps(saved["optimizer"]) == {1.0}
    assert all(torch.equal(saved["model"][k], v) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match="already holds an RL run"):
        run(2, resume=False)

    with (out / "rl.jsonl").open("a") as f:
        f.write(json.dumps({"step": 1, "groups": 0, "left": "by the dead run"}) + "\n")
    (out / "step-001" / "round-0001").mkdir(parents=True)
    (out / "step-001" / "round-0001" / "stale").write_text("from the dead run")

    # Resumed with another initial model: the checkpoint replaces its weights, and the
    # reference comes from reference.pt, not from it.
    history, _ = run(2, resume=True, init=1)
    assert [r["step"] for r in history] == [0, 1] and history[0] == first[0]
    logged = [json.loads(line) for line in (out / "rl.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == [0, 1] and "left" not in logged[1]
    assert not (out / "step-001" / "round-0001" / "stale").exists()
    saved = torch.load(out / "checkpoint.pt", weights_only=True)
    # The optimizer went on from step 0's state: two Adam steps in all, not one.
    assert saved["step"] == 1 and _adam_steps(saved["optimizer"]) == {2.0}
    reference = torch.load(out / "reference.pt", weights_only=True)
    assert all(torch.equal(reference[k], v) for k, v in start.items())
    assert history[1]["ref_kl"] > 0  # the policy has left the reference by step 1
    assert not list(out.glob("*.part"))
    assert client.list_sandboxes() == []
