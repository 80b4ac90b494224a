"""TRL's GRPOTrainer, with the project's tiny random Llama on CPU, trains for 2 steps against a
task set served as an OpenEnv environment (``orchard.recipes.openenv_grpo``): the rewards it
logs are the grades the tasks gave the episodes its completions played, and the policy's
weights move."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from orchard.domains import load_tasks
from orchard.env.client import SandboxClient
from orchard.openenv import ServedTasks, create_app
from orchard.recipes.models import tiny_llama
from orchard.recipes.openenv_grpo import (
    OrchardRollouts,
    env_reward,
    split_completion,
    task_dataset,
)
from orchard.rollout.tokenizer import TEST_TOKENIZER, load_tokenizer
from orchard.serving import ThreadedServer
from tests.conftest import needs_root, wait_until

# Judged on the answer alone, which a random policy gets right about half the time: GRPO then
# has groups with both outcomes to learn from.
TASKS_YAML = """\
- instance_id: letter-c
  goal: Answer with one word that contains the letter c.
  world: {}
  checks:
  - {name: answer, args: {contains: c}}
- instance_id: letter-y
  goal: Answer with one word that contains the letter y.
  world: {}
  checks:
  - {name: answer, args: {contains: "y"}}
"""


def test_a_completion_is_commands_then_an_answer() -> None:
    text = "Let me look.\n```bash\nls -la\n```\nthen\n```sh\ncat a.txt\n```\nIt is 42."
    assert split_completion(text) == (["ls -la\n", "cat a.txt\n"],
                                      "Let me look.\n\nthen\n\nIt is 42.")
    assert split_completion("no commands") == ([], "no commands")


@pytest.fixture()
def server(orchestrator: str, tmp_path: Path) -> Iterator[tuple[str, ServedTasks, list]]:
    path = tmp_path / "letters.yaml"
    path.write_text(TASKS_YAML)
    domain, tasks = load_tasks(path)
    with SandboxClient(orchestrator) as client:
        served = ServedTasks("letters", tasks, client, domain.episodes)
        http = ThreadedServer(create_app(served, max_sessions=8, tools=False), "openenv-grpo")
        try:
            yield http.start(), served, tasks
        finally:
            http.stop()
        assert wait_until(lambda: not client.list_sandboxes(
            labels={"orchard-openenv": "letters"})), "an episode's sandbox was left behind"


@needs_root
def test_grpo_trains_on_orchard_grades(server: tuple[str, ServedTasks, list], tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from trl import GRPOConfig, GRPOTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL

    url, served, tasks = server
    tokenizer = load_tokenizer(TEST_TOKENIZER)
    tokenizer.padding_side = "left"
    model = tiny_llama(tokenizer)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    rollouts = OrchardRollouts(url, tasks, concurrency=4)
    args = GRPOConfig(
        output_dir=str(tmp_path / "grpo"), use_cpu=True, max_steps=2, seed=0,
        per_device_train_batch_size=8, num_generations=4, max_completion_length=8,
        learning_rate=1e-2, logging_steps=1, report_to="none", save_strategy="no")
    trainer = GRPOTrainer(model=model, reward_funcs=env_reward, args=args,
                          train_dataset=task_dataset(tasks), processing_class=tokenizer,
                          rollout_func=rollouts)
    trainer.train()

    # Every completion was an episode the server graded, and its reward is that grade.
    played = rollouts.episodes
    assert len(played) == 2 * 8
    graded = {g.episode_id: g for g in served.graded}
    assert set(graded) == {e.episode_id for e in played}
    for e in played:
        assert e.reward == graded[e.episode_id].grade.reward
        assert e.task_id == graded[e.episode_id].task_id
    assert {e.reward for e in played} == {0.0, 1.0}, "no group had both outcomes"

    # What the trainer logged for each step is the mean of that step's grades.
    logged = [h["rewards/env_reward/mean"] for h in trainer.state.log_history
              if "rewards/env_reward/mean" in h]
    assert len(logged) == 2
    for step, mean in enumerate(logged):
        rewards = [e.reward for e in played[8 * step:8 * (step + 1)]]
        assert math.isclose(mean, sum(rewards) / len(rewards), abs_tol=1e-6)

    moved = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
    assert moved, "GRPO changed no weight"
