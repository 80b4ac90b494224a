"""The recipes on real rollouts: Monte-Carlo value curves from replayed sandboxes, the SFT
dataset they select, token-exact RL samples from the served policy, and the demo end to end."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest
import torch
from rich.console import Console

from orchard.domains import run_demo
from orchard.domains.swe.demo import AgentContinuation, hedged_teacher
from orchard.domains.swe.family import settings_family
from orchard.domains.swe.harness import MiniSweAgentHarness, TeacherHarness, _stable_rank
from orchard.domains.swe.minisweagent import config_from_specs
from orchard.domains.swe.model import SweTask
from orchard.env.client import SandboxClient
from orchard.eval import RunConfig, evaluate
from orchard.eval.results import read_results
from orchard.recipes.bar import BARConfig
from orchard.recipes.demo import COMPACT_CONFIG, DemoConfig
from orchard.recipes.demo_view import StageProgress
from orchard.recipes.loss import token_logprobs
from orchard.recipes.models import tiny_llama
from orchard.recipes.montecarlo import MonteCarloAnnotator
from orchard.recipes.policy_server.server import PolicyServer
from orchard.recipes.rl import PolicySampler, RLConfig, policy_update
from orchard.recipes.sft import SFTConfig, build_sft_dataset
from orchard.recipes.trajectories import Trajectory, load_trajectories
from orchard.rollout.tokenizer import TEST_TOKENIZER, load_tokenizer
from orchard.rollout.traces.branch import branch
from orchard.testing.teacher import FunctionPolicy, TeacherServer
from tests.conftest import needs_browser, needs_root

pytestmark = needs_root


@pytest.fixture(scope="module")
def client(orchestrator: str) -> Iterator[SandboxClient]:
    with SandboxClient(orchestrator) as c:
        yield c


@pytest.fixture(scope="module")
def agent_config() -> dict:
    return config_from_specs([COMPACT_CONFIG])


@pytest.fixture(scope="module")
def family() -> list[SweTask]:
    return settings_family(n_train=8, n_test=0, seed=3)


def _fails_by_breaking(task: SweTask) -> bool:
    # The teacher harness picks a failing task's script by its stable rank (0: fix then break).
    return int(_stable_rank(task.instance_id), 16) % 2 == 0


@pytest.fixture(scope="module")
def teacher_run(client: SandboxClient, family: list[SweTask], agent_config: dict,
                tmp_path_factory: pytest.TempPathFactory) -> dict[str, Trajectory]:
    """One solved task, one that the teacher fixes then breaks, one it fixes wrongly."""
    solved = family[0]
    broken = next(t for t in family[1:] if _fails_by_breaking(t))
    wrong = next(t for t in family[1:] if not _fails_by_breaking(t))
    tasks = [solved, broken, wrong]
    out = tmp_path_factory.mktemp("teacher")
    evaluate(tasks, TeacherHarness(tasks, solve=[solved.instance_id], config=agent_config),
             out, client, config=RunConfig(out=out))
    by_task = {t.instance_id: t for t in load_trajectories(out)}
    return {"solved": by_task[solved.instance_id], "broken": by_task[broken.instance_id],
            "wrong": by_task[wrong.instance_id]}


def _annotator(client: SandboxClient, family: list[SweTask], server: TeacherServer,
               agent_config: dict, restore: Literal["fork", "replay"]) -> MonteCarloAnnotator:
    continuation = AgentContinuation(client, f"{server.url}/v1", "teacher", config=agent_config)
    return MonteCarloAnnotator(client, family, continuation, k=1, restore=restore)


# Forks of one replay (the default) and one replay per continuation must agree.
@pytest.mark.parametrize(("solve", "restore"), [(0.0, "fork"), (1.0, "fork"), (0.0, "replay")])
def test_monte_carlo_values_follow_the_restored_state(
        client: SandboxClient, family: list[SweTask], teacher_run: dict[str, Trajectory],
        agent_config: dict, solve: float, restore: Literal["fork", "replay"]) -> None:
    # solve=0: the continuation submits the workspace as it is, so V(s_t) says exactly whether
    # the replayed state at step t is already fixed; solve=1: it finishes the solving script.
    policy = hedged_teacher(family, solve, seed=0)
    with TeacherServer(FunctionPolicy(policy), load_tokenizer(TEST_TOKENIZER),
                       model_name="teacher") as server:
        annotator = _annotator(client, family, server, agent_config, restore)
        curves = {name: annotator.annotate(traj) for name, traj in teacher_run.items()}
    # Steps: look, fix, submit | look, fix, break, submit | look, wrong fix, submit.
    if solve == 0.0:
        assert curves["solved"].values == [0, 0, 1, 1]
        assert curves["broken"].values == [0, 0, 1, 0, 0]
        assert curves["wrong"].values == [0, 0, 0, 0]
        assert curves["broken"].rise_segments(0.05) == [(1, 2)]
        assert curves["wrong"].rise_segments(0.05) == []
    else:
        assert curves["solved"].values == [1, 1, 1, 1]
        assert curves["broken"].values == [1, 1, 1, 0, 0]
        # After a wrong fix the solving script's next step is to submit: the state is lost.
        assert curves["wrong"].values == [1, 1, 0, 0]
        assert curves["broken"].rise_segments(0.05) == []
    assert all(c.source == "monte_carlo" for c in curves.values())
    leftovers = [s for s in client.list_sandboxes() if "orchard.dev/mc-of" in s.labels]
    assert leftovers == []


def test_sft_dataset_trains_resolved_whole_and_unresolved_only_on_rises(
        teacher_run: dict[str, Trajectory]) -> None:
    tokenizer = load_tokenizer(TEST_TOKENIZER)
    segments = {teacher_run["broken"].rollout_id: [(1, 2)],
                teacher_run["wrong"].rollout_id: []}
    examples, dropped = build_sft_dataset(teacher_run.values(), segments, tokenizer)
    by_id = {e.rollout_id: e for e in examples}
    assert by_id[teacher_run["solved"].rollout_id].trained_steps == [0, 1, 2]
    assert by_id[teacher_run["broken"].rollout_id].trained_steps == [1]
    assert "nothing to train" in dropped[teacher_run["wrong"].rollout_id]
    # The one trained turn of the broken trajectory is its fix, and nothing else.
    broken = by_id[teacher_run["broken"].rollout_id]
    trained = tokenizer.decode([t for t, m in zip(broken.input_ids, broken.loss_mask,
                                                  strict=True) if m])
    assert "sed -i" in trained and "should change too" not in trained
    assert "cat settings.py" not in trained


def test_rl_samples_are_token_exact_and_an_update_moves_the_policy(
        client: SandboxClient, family: list[SweTask], agent_config: dict,
        tmp_path: Path) -> None:
    torch.manual_seed(0)
    tokenizer = load_tokenizer(TEST_TOKENIZER)
    model = tiny_llama(tokenizer, hidden_size=64, layers=2, max_positions=4096, seed=0)
    served = tiny_llama(tokenizer, hidden_size=64, layers=2, max_positions=4096, seed=0)
    with PolicyServer(served, tokenizer, seed=0) as server:
        harness = MiniSweAgentHarness(server.url, "policy", config=agent_config,
                                      render_with=TEST_TOKENIZER)
        rollouts = PolicySampler(client, harness, tmp_path, seed=0)(family[0], 2)
        shaped = PolicySampler(client, harness, tmp_path / "shaped", seed=0,
                               format_failure_reward=-2.0)(family[0], 2)
    samples = [s for r in rollouts for s in r.payload[1]]
    assert len(rollouts) == 2 and samples
    assert all(r.reward == -1.0 and r.status == "completed" for r in rollouts)
    # The untrained policy writes no valid tool call, so mini-swe-agent gives up on format
    # errors; the same seeds give the same rollouts, and the shaped reward replaces the -1.
    assert [r.payload[0].exit_status for r in shaped] == ["RepeatedFormatError"] * 2
    assert [r.reward for r in shaped] == [-2.0, -2.0]
    assert [s.input_ids for r in shaped for s in r.payload[1]] == [s.input_ids for s in samples]
    # Every token the policy produced carries the log-prob it was sampled with, and those are
    # what the trainer computes for the same tokens: on-policy, the first ratio is 1.
    for s in samples:
        assert all(lp is not None for m, lp in zip(s.loss_mask, s.logprobs, strict=True) if m)
    config = RLConfig(lr=1e-2, ppo_epochs=1, minibatches=1)

    def likelihood() -> float:
        with torch.no_grad():
            total = 0.0
            for s in samples:
                lp, _ = token_logprobs(model, torch.tensor([s.input_ids]))
                total += sum(v for v, m in zip(lp[0].tolist(), s.loss_mask[1:], strict=True)
                             if m)
            return total

    before = likelihood()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    stats = policy_update(model, optimizer, [(s, 1.0) for s in samples], config,
                          tokenizer.pad_token_id or tokenizer.eos_token_id)
    assert abs(stats["ratio_mean"] - 1) < 1e-3 and abs(stats["approx_kl"]) < 1e-4
    assert stats["tokens"] == sum(sum(s.loss_mask) for s in samples)
    assert likelihood() > before  # a positive advantage makes those tokens more likely
    assert stats["optimizer_steps"] == 1 and len(stats["epochs"]) == 1
    # More passes reuse the rollouts off-policy: the ratio leaves 1 and the clip binds.
    more = policy_update(model, optimizer, [(s, 1.0) for s in samples],
                         RLConfig(lr=1e-2, ppo_epochs=3, minibatches=2),
                         tokenizer.pad_token_id or tokenizer.eos_token_id)
    assert len(more["epochs"]) == 3 and more["optimizer_steps"] == 3 * min(2, len(samples))
    assert more["epochs"][-1]["ratio_mean"] > 1 + 1e-3
    assert more["epochs"][-1]["clip_fraction"] > 0


@pytest.mark.parametrize("rl_steps", [1, 0])
def test_demo_end_to_end(client: SandboxClient, tmp_path: Path, rl_steps: int) -> None:
    config = DemoConfig(
        n_train=6, n_test=2, mc_max=1, mc_k=1, eval_n=1, tiny_hidden=64,
        sft=SFTConfig(epochs=1, batch_size=4, warmup=1),
        rl=RLConfig(steps=rl_steps, batch_prompts=1, bar=BARConfig(n=2, n_max=2, stride=2)))
    with StageProgress(Console(file=io.StringIO())) as progress:
        results = run_demo(tmp_path, config, client=client, log=lambda _: None,
                           progress=progress)
    saved = json.loads((tmp_path / "results.json").read_text())
    # Without RL steps the pipeline ends at SFT: no RL stage, no evaluation of one.
    last = "sft_rl" if rl_steps else "sft"
    assert list(saved["stages"]) == ["base", "sft", "sft_rl"][:3 if rl_steps else 2]
    assert (tmp_path / "eval-sft_rl").exists() == bool(rl_steps)
    bars = {t.description: t for t in progress.progress.tasks}
    assert list(bars) == ["teacher", "values", "sft_data", "eval_base", "sft", "eval_sft",
                          *(["rl", "eval_rl"] if rl_steps else []), "rerank"]
    assert bars["eval_base"].total == 2 and bars["teacher"].total == 6
    assert all(t.finished for t in bars.values())
    # Every evaluation drew with the same seeds: stages pair up per task.
    assert saved["paired"].keys() == ({"sft_minus_base", "sft_rl_minus_sft", "sft_rl_minus_base"}
                                      if rl_steps else {"sft_minus_base"})
    assert all(d["units"] == 2 for d in saved["paired"].values())
    for key, d in saved["paired"].items():
        stage, reference = key.split("_minus_")
        assert d["mean"] == pytest.approx(saved["stages"][stage]["resolved_rate"]
                                          - saved["stages"][reference]["resolved_rate"])
    for stage in saved["stages"].values():
        assert stage["rollouts"] == 2 and 0 <= stage["resolved_rate"] <= 1
        assert set(stage["pass_at_k"]) == {"1"}
    assert saved["sft_data"]["examples"] >= 1 and saved["sft"]["steps"] >= 1
    assert len(saved.get("rl", [])) == rl_steps and results["seeds"]["rl"] == 0
    rerank = saved["rerank"]  # best-of-1 over the last stage: every pick is the only one
    assert rerank["n"] == 1 and rerank["tasks"] == 2
    assert rerank["value"] == rerank["random"] == rerank["oracle"] == rerank["likelihood"] \
        == pytest.approx(saved["stages"][last]["resolved_rate"])
    assert rerank["train"]["examples"] >= 6  # the teacher's rollouts, at least
    assert (tmp_path / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert client.list_sandboxes() == []


def test_branch_restores_a_step_k_times(client: SandboxClient, family: list[SweTask],
                                        teacher_run: dict[str, Trajectory]) -> None:
    traj = teacher_run["broken"]  # look, fix, break, submit
    task = next(t for t in family if t.instance_id == traj.instance_id)
    trace = traj.trace()
    with pytest.raises(ValueError, match="past the"):
        branch(trace, client, step=99, k=2)
    forks = branch(trace, client, step=2, k=3, labels={"test": "branch"})
    try:
        assert len({f.id for f in forks}) == 3
        assert all(f.info.status.value == "running" for f in forks)
        # Before the third model call: the fix is in, the break is not, the same in each.
        diffs = {f.exec("git diff", cwd=task.workdir).stdout for f in forks}
        assert len(diffs) == 1 and diffs.pop().strip()
        source = forks[0].info.labels["orchard.dev/fork-of"]
    finally:
        for fork in forks:
            fork.delete()
    # The replayed sandbox they were forked from is gone too.
    assert client.get_sandbox(source).info.status.value == "deleted"
    assert client.list_sandboxes({"test": "branch"}) == []


@pytest.mark.parametrize("domain", [pytest.param("web", marks=needs_browser), "assistant",
                                    "bugfix"])
def test_demo_on_the_other_families(client: SandboxClient, tmp_path: Path, domain: str) -> None:
    # The assistant run is judged: its policy's rollouts of tasks with a rubric earn
    # base + 0.5 J from the scripted judge.
    config = DemoConfig(
        domain=domain, n_train=6, n_test=2, eval_n=1, tiny_hidden=64, mc_k=1, mc_max=1,
        mc_solve=0.85, sft=SFTConfig(epochs=1, batch_size=4, warmup=1),
        rl=RLConfig(steps=1, batch_prompts=1, bar=BARConfig(n=2, n_max=2, stride=2)),
        judge="scripted" if domain == "assistant" else None)
    results = run_demo(tmp_path, config, client=client, log=lambda _: None)
    assert results["stages"].keys() == {"base", "sft", "sft_rl"}
    for stage in results["stages"].values():
        # A random-init policy resolves nothing, but its rollouts run and are graded: none
        # fails for the model's or the environment's sake (a full context is a limit).
        assert stage["rollouts"] == 2 and not stage["failures"], stage
    teacher = json.loads((tmp_path / "teacher" / "results.json").read_text())
    assert teacher["overall"]["rollouts"] == 6 and teacher["overall"]["resolved"] >= 1
    assert results["values"]["annotated"] == 1  # a failed teacher rollout, valued by continuations
    assert results["sft_data"]["examples"] >= 1 and results["sft_data"]["resolved"] >= 1
    assert len(results["rl"]) == 1 and results["rerank"]["tasks"] == 2
    assert results["rl"][0]["mean_reward"] is not None
    if domain == "assistant":
        (judged,) = [r for r in read_results(tmp_path / "eval-base")
                     if r.instance_id == "hand-move-dana-thursday"]
        assert judged.grade is not None and judged.grade.judge is not None
        assert len(judged.grade.judge_scores or []) == 2
    assert client.list_sandboxes() == []


