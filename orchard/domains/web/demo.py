"""What the demo pipeline and Monte-Carlo values need of the web domain: the family adapter
(the bundled web tasks with the browser agent) and the browser agent continuing a recorded
rollout."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, Self

from orchard.domains.web import WebTask, grade_web, load_web_tasks
from orchard.domains.web.harness import BrowserAgentHarness, WebTeacherHarness
from orchard.domains.web.teacher import hedged_web_teacher
from orchard.env.client import Sandbox, SandboxClient
from orchard.eval.harness import Harness
from orchard.recipes.demo import DemoConfig
from orchard.recipes.domains import NO_RUBRICS
from orchard.recipes.montecarlo import Continuation, clean_message
from orchard.testing.policies import Policy


class BrowserContinuation:
    """The browser agent continuing the recorded conversation with the model at ``model_url``
    (an OpenAI base URL ending in /v1), graded in its own sandbox as web rollouts are."""

    def __init__(self, model_url: str, model: str) -> None:
        self.model_url, self.model = model_url, model

    def __call__(self, task: WebTask, sandbox: Sandbox, history: list[dict[str, Any]],
                 sample: int, labels: dict[str, str]) -> str:
        from orchard.domains.web.browser_agent import run_browser_agent

        done = sum(1 for m in history if m.get("role") == "assistant")
        result = run_browser_agent(
            sandbox, task.goal, task.start_url, self.model_url, self.model,
            max_steps=max(1, task.budget.steps - done), history=[clean_message(m) for m in history],
            action_timeout=task.budget.action_timeout)
        return grade_web(sandbox, task, result.answer).outcome


class WebFamily:
    """The bundled web tasks with the browser agent."""

    name = "web"
    text_of: Literal["patch", "trajectory"] = "trajectory"  # a web rollout leaves no patch
    replays = False  # live forks keep the sites and the browser's page

    def configure(self, config: DemoConfig) -> DemoConfig:
        """Its SFT examples are ~10x the settings family's tokens (a page tree each turn), so
        400 steps would take an hour on 2 cores: it takes 120. A web continuation must take
        every remaining gold step, so at mc_solve 0.5 a state four steps from the goal is
        worth 6%, which two samples read as 0 (measured: 9 of 10 curves flat): it continues at
        0.85."""
        return replace(config, mc_solve=0.85, sft=replace(config.sft, max_steps=120))

    def tasks(self, n_train: int, n_test: int, seed: int) -> list[Any]:
        return list(load_web_tasks())

    def teacher(self, train: Sequence[Any], solve: float) -> Harness:
        return WebTeacherHarness(train, solve=solve)

    def policy(self, url: str, model: str, tokenizer_dir: str | Path) -> Harness:
        return BrowserAgentHarness(url, model, render_with=tokenizer_dir)

    def continuation_policy(self, train: Sequence[Any], solve: float, seed: int) -> Policy:
        return hedged_web_teacher(train, solve, seed)

    def continuation(self, client: SandboxClient, url: str, model: str) -> Continuation:
        return BrowserContinuation(url, model)

    def values_judge(self, train: Sequence[Any]) -> Policy:
        raise ValueError(f"no scripted retrospective judge for the {self.name} domain: value "
                         "its rollouts by Monte-Carlo continuations, or give an OpenAI base URL")

    def scripted_judge(self) -> Policy:
        raise ValueError(NO_RUBRICS.format(domain=self.name))

    def judged(self, url: str, model: str) -> Self:
        raise ValueError(NO_RUBRICS.format(domain=self.name))
