"""Harnesses of the web domain: the browser agent on a model, and the scripted web teacher.

A web rollout is graded in its own sandbox, where the sites' final state lives, before the
sandbox goes: the harness hands the grade to the runner in ``HarnessResult.grade``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchard.domains.web.grading import grade_web
from orchard.domains.web.model import WebTask
from orchard.domains.web.teacher import web_teacher
from orchard.eval.harness import HarnessError, HarnessResult, RolloutContext, ScriptedTeacher
from orchard.testing.policies import Policy


class BrowserAgentHarness:
    """``orchard.domains.web.browser_agent`` on the rollout's sandbox, calling ``model`` at the
    rollout's model URL (the recording proxy's session), within the task's budget."""

    name = "browser-agent"

    def __init__(self, model_url: str, model: str, *, screenshots: bool = False,
                 render_with: str | Path | None = None, action_set: str = "orchard") -> None:
        from orchard.domains.web.browser_agent import ACTION_SETS

        if action_set not in ACTION_SETS:
            raise ValueError(f"unknown action set {action_set!r}; one of "
                             f"{', '.join(ACTION_SETS)}")
        self.action_set = action_set
        """``orchard`` (our tools) or ``browsergym`` (BrowserGym's actions, in plain text)."""
        self.model_upstream: str | None = model_url
        self.model = model
        self.screenshots = screenshots
        self.render_with = render_with
        """A tokenizer for the recording proxy to render chat with, for a model server that
        only takes token-id prompts (the policy server)."""

    def run(self, ctx: RolloutContext) -> HarnessResult:
        from orchard.domains.web.browser_agent import run_browser_agent

        task = ctx.task
        if not isinstance(task, WebTask):
            raise HarnessError(f"{self.name} runs web tasks; {task.instance_id} is not one")
        if ctx.model_url is None:
            raise HarnessError(f"{self.name} needs a model URL; the runner gives the "
                               "recording proxy's")
        with ctx.sandbox() as sandbox:  # the task's sites started in it
            result = run_browser_agent(
                sandbox, task.goal, task.start_url, ctx.model_url, self.model,
                max_steps=task.budget.steps, screenshots=self.screenshots,
                action_timeout=task.budget.action_timeout, seed=ctx.seed,
                action_set=self.action_set)
            with ctx.timed():
                grade = grade_web(sandbox, task, result.answer)
        return HarnessResult(exit_status=result.exit_status, n_steps=result.n_steps,
                             n_tokens=result.n_tokens, grade=grade,
                             detail={"answer": result.answer})


class WebTeacherHarness(ScriptedTeacher, BrowserAgentHarness):
    """The browser agent driven by the scripted web teacher (``domains.web.teacher``), which
    plays the gold run of a ``solve`` share of the tasks and gives up on the rest."""

    name = "web-teacher"

    def __init__(self, tasks: Sequence[WebTask], solve: float = 1.0) -> None:
        super().__init__("", "teacher")
        self._policy = web_teacher(tasks, solve)

    def policy(self, messages: list[dict[str, Any]], tools: Any) -> Any:
        return self._policy(messages, tools)


class PolicyBrowserHarness(ScriptedTeacher, BrowserAgentHarness):
    """The browser agent driven by a scripted policy served as a model: the MiniWoB++ solver
    (``miniwob-solver``) or the random-action baseline (``random-browser``), see
    ``domains.web.miniwob.solver``."""

    def __init__(self, name: str, policy: Policy) -> None:
        super().__init__("", name)
        self.name = name
        self._policy = policy

    def policy(self, messages: list[dict[str, Any]], tools: Any) -> Any:
        return self._policy(messages, tools)
