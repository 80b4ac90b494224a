"""What the demo pipeline and Monte-Carlo values need of the assistant domain: the family
adapter (hand-written and generated tasks with the tool-calling assistant, optionally judged
by a rubric judge) and the assistant continuing a recorded rollout."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from orchard.domains.assistant import load_assistant_tasks
from orchard.domains.assistant.grading import grade_assistant
from orchard.domains.assistant.harness import AssistantHarness, AssistantTeacherHarness
from orchard.domains.assistant.judge import RubricJudge, keyword_judge
from orchard.domains.assistant.model import SERVICES_PORT, AssistantTask
from orchard.domains.assistant.teacher import hedged_assistant_teacher
from orchard.env.client import Sandbox, SandboxClient
from orchard.eval.harness import Harness
from orchard.recipes.demo import DemoConfig
from orchard.recipes.montecarlo import Continuation, clean_message
from orchard.testing.policies import Policy


class AssistantContinuation:
    """The assistant loop continuing the recorded conversation with the model at
    ``model_url``, graded in its own sandbox (where the world is) by the task's checks."""

    def __init__(self, model_url: str, model: str) -> None:
        self.model_url, self.model = model_url, model

    def __call__(self, task: AssistantTask, sandbox: Sandbox, history: list[dict[str, Any]],
                 sample: int, labels: dict[str, str]) -> str:
        from orchard.domains.assistant.assistant_agent import run_assistant

        done = sum(1 for m in history if m.get("role") == "assistant")
        result = run_assistant(sandbox, task.goal, self.model_url, self.model,
                               port=SERVICES_PORT, tools=task.tools,
                               max_steps=max(1, task.budget.steps - done),
                               history=[clean_message(m) for m in history])
        return grade_assistant(sandbox, task, result.answer).outcome


class AssistantFamily:
    """The assistant tasks (hand-written and generated) with the tool-calling assistant;
    with a ``judge``, the policy's rollouts of tasks with a rubric earn base + 0.5 J."""

    name = "assistant"
    text_of: Literal["patch", "trajectory"] = "trajectory"
    replays = True

    def __init__(self, judge: RubricJudge | None = None) -> None:
        self.judge = judge

    def configure(self, config: DemoConfig) -> DemoConfig:
        """As on the web, a continuation must make every remaining gold call, so it continues
        at 0.85 (see ``WebFamily.configure``)."""
        return replace(config, mc_solve=0.85)

    def tasks(self, n_train: int, n_test: int, seed: int) -> list[Any]:
        return list(load_assistant_tasks())

    def teacher(self, train: Sequence[Any], solve: float) -> Harness:
        return AssistantTeacherHarness(train, solve=solve)

    def policy(self, url: str, model: str, tokenizer_dir: str | Path) -> Harness:
        return AssistantHarness(url, model, render_with=tokenizer_dir, judge=self.judge)

    def continuation_policy(self, train: Sequence[Any], solve: float, seed: int) -> Policy:
        return hedged_assistant_teacher(train, solve, seed)

    def continuation(self, client: SandboxClient, url: str, model: str) -> Continuation:
        return AssistantContinuation(url, model)

    def values_judge(self, train: Sequence[Any]) -> Policy:
        raise ValueError(f"no scripted retrospective judge for the {self.name} domain: value "
                         "its rollouts by Monte-Carlo continuations, or give an OpenAI base URL")

    def scripted_judge(self) -> Policy:
        return keyword_judge

    def judged(self, url: str, model: str) -> AssistantFamily:
        return AssistantFamily(RubricJudge(url, model))
