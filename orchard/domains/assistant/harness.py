"""Harnesses of the assistant domain: the tool-calling assistant on a model, and the scripted
assistant teacher.

Like a web rollout, an assistant rollout is graded in its own sandbox, where the services'
final world lives, before the sandbox goes: the harness hands the grade to the runner in
``HarnessResult.grade``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchard.domains.assistant.grading import grade_assistant
from orchard.domains.assistant.judge import JudgeFailed, RubricJudge, process_reward
from orchard.domains.assistant.model import SERVICES_PORT, AssistantTask
from orchard.domains.assistant.teacher import assistant_teacher
from orchard.eval.harness import (
    JUDGE_CALLS,
    JUDGE_FAILURE,
    HarnessError,
    HarnessResult,
    RolloutContext,
    ScriptedTeacher,
)


class AssistantHarness:
    """``orchard.domains.assistant.assistant_agent`` on the rollout's sandbox, calling
    ``model`` at the rollout's model URL (the recording proxy's session), with the task's
    tools and budget."""

    name = "assistant"

    def __init__(self, model_url: str, model: str, *, render_with: str | Path | None = None,
                 judge: RubricJudge | None = None) -> None:
        self.model_upstream: str | None = model_url
        self.model = model
        self.render_with = render_with
        """A tokenizer for the recording proxy to render chat with (the policy server)."""
        self.judge = judge
        """Scores the rubric of tasks that have one: the reward becomes base + 0.5 J."""

    def run(self, ctx: RolloutContext) -> HarnessResult:
        from orchard.domains.assistant.assistant_agent import run_assistant

        task = ctx.task
        if not isinstance(task, AssistantTask):
            raise HarnessError(f"{self.name} runs assistant tasks; {task.instance_id} is not "
                               "one")
        if ctx.model_url is None:
            raise HarnessError(f"{self.name} needs a model URL; the runner gives the "
                               "recording proxy's")
        with ctx.sandbox() as sandbox:  # the task's services started in it
            result = run_assistant(sandbox, task.goal, ctx.model_url, self.model,
                                   port=SERVICES_PORT, tools=task.tools,
                                   max_steps=task.budget.steps, seed=ctx.seed)
            with ctx.timed():
                grade = grade_assistant(sandbox, task, result.answer)
        detail: dict[str, Any] = {"answer": result.answer}
        if self.judge is not None and task.rubric and grade.outcome != "task_error":
            try:
                verdict = self.judge.score(task, result.messages, result.answer)
            except JudgeFailed as e:
                detail[JUDGE_CALLS], detail[JUDGE_FAILURE] = e.calls, str(e)
            else:
                grade.judge, grade.judge_scores = verdict.j, verdict.scores
                grade.reward = process_reward(grade.resolved, verdict.j)
                detail[JUDGE_CALLS] = verdict.calls
        return HarnessResult(exit_status=result.exit_status, n_steps=result.n_steps,
                             n_tokens=result.n_tokens, grade=grade, detail=detail)


class AssistantTeacherHarness(ScriptedTeacher, AssistantHarness):
    """The assistant driven by the scripted assistant teacher, which makes the gold calls of a
    ``solve`` share of the tasks and half of them on the rest."""

    name = "assistant-teacher"

    def __init__(self, tasks: Sequence[AssistantTask], solve: float = 1.0, *,
                 judge: RubricJudge | None = None) -> None:
        super().__init__("", "teacher", judge=judge)
        self._policy = assistant_teacher(tasks, solve)

    def policy(self, messages: list[dict[str, Any]], tools: Any) -> Any:
        return self._policy(messages, tools)


ANSWER_FILE = "/workspace/.orchard-answer"


class AssistantCliHarness:
    """An external assistant CLI run inside the rollout's sandbox, as any CLI harness runs
    (docs/guides/harnesses.md): the sandbox is a model-proxy one, so the CLI reaches the model
    only through the orchestrator's recording proxy (``OPENAI_BASE_URL`` is set) and, its
    network blocked, nothing else but the tools on its own loopback. The CLI gets:

    - ``ORCHARD_GOAL``: the user's request;
    - ``ORCHARD_TOOLS_URL``: the tools' HTTP API (``GET /tools``, ``POST /tools/{name}``);
    - ``ORCHARD_MCP_URL``: the same tools over MCP;
    - ``ORCHARD_ANSWER_FILE``: where to write its final answer, if the request asks one.

    ``files`` are uploaded first (the CLI itself, its config); ``command`` runs in /workspace
    within the task's wall time. The orchestrator must have a model proxy (``orchard serve
    --model-proxy``); the runner collects the model calls from it (``evaluate(proxy_url=)``).
    """

    name = "assistant-cli"
    model_upstream: str | None = None  # the orchestrator's proxy carries the model calls

    def __init__(self, command: str, *, files: dict[str, bytes] | None = None) -> None:
        self.command, self.files = command, dict(files or {})

    def run(self, ctx: RolloutContext) -> HarnessResult:
        task = ctx.task
        if not isinstance(task, AssistantTask):
            raise HarnessError(f"{self.name} runs assistant tasks; {task.instance_id} is not "
                               "one")
        with ctx.sandbox(model_proxy=True) as sandbox:  # the task's services started in it
            with ctx.timed():
                for path, content in self.files.items():
                    sandbox.upload_content(content, path)
            base = f"http://127.0.0.1:{SERVICES_PORT}"
            done = sandbox.exec(self.command, cwd="/workspace", timeout=task.budget.wall_time,
                                env={"ORCHARD_GOAL": task.goal, "ORCHARD_TOOLS_URL": base,
                                     "ORCHARD_MCP_URL": f"{base}/mcp",
                                     "ORCHARD_ANSWER_FILE": ANSWER_FILE})
            if done.timed_out:
                raise HarnessError(f"the assistant CLI ran past the task's wall time "
                                   f"({task.budget.wall_time:g}s)")
            answer = sandbox.exec(["cat", ANSWER_FILE]).stdout.strip() or None
            with ctx.timed():
                grade = grade_assistant(sandbox, task, answer)
        status = "Submitted" if done.exit_code == 0 else f"exited {done.exit_code}"
        return HarnessResult(exit_status=status, grade=grade,
                             detail={"answer": answer, "stderr": done.stderr[-2000:]})
