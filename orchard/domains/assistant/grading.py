"""Grading and validating assistant tasks: the checks over the final world, the gold run.

``grade_assistant`` judges a sandbox at the end of a rollout: every check must hold. (The
rubric is for a judge and is not part of this pass/fail.) ``run_gold`` makes the gold tool
calls. ``validate_assistant`` proves a task solvable and not solved by doing nothing, each in
a fresh sandbox.
"""

from __future__ import annotations

from pydantic import ConfigDict, Field

from orchard.domains.assistant.checks import CHECKS
from orchard.domains.assistant.environment import (
    ServicesError,
    call_tool,
    start_services,
    world_state,
)
from orchard.domains.assistant.model import AssistantTask
from orchard.env.client import Sandbox, SandboxClient
from orchard.tasks.protocol import Grade
from orchard.tasks.served import GoldFailed, ServedOutcome, ServedTaskCheck, validate_served


class AssistantGrade(Grade):
    model_config = ConfigDict(extra="ignore")

    outcome: ServedOutcome = Field(description="task_error: a check or the services failed; the "
                             "task is broken, the rollout is not to blame.")
    reason: str
    checks: list[tuple[str, bool, str]] = Field(default_factory=list)
    answer: str | None = None
    judge: float | None = Field(None, description="J, the rubric judge's weighted score, when "
                                "judged; reward is then base + 0.5 J.")
    judge_scores: list[float] = Field(default_factory=list)


def grade_assistant(sandbox: Sandbox, task: AssistantTask, answer: str | None
                    ) -> AssistantGrade:
    """Judge the sandbox's world as it is now, with the assistant's final answer."""
    def graded(outcome: ServedOutcome, reason: str,
               results: list[tuple[str, bool, str]] | None = None) -> AssistantGrade:
        return AssistantGrade(instance_id=task.instance_id, resolved=outcome == "resolved",
                              reward=1.0 if outcome == "resolved" else 0.0, outcome=outcome,
                              reason=reason, checks=results or [], answer=answer)

    unknown = sorted({c.name for c in task.checks} - CHECKS.keys())
    if unknown:
        return graded("task_error", f"unknown checks {unknown}; one of {sorted(CHECKS)}")
    try:
        world = world_state(sandbox)
    except ServicesError as e:
        return graded("task_error", str(e))
    results = []
    for check in task.checks:
        try:
            passed, reason = CHECKS[check.name](world, answer, **check.args)
        except Exception as e:  # noqa: BLE001 - a broken check is the task's fault
            return graded("task_error", f"check {check.name} crashed: {type(e).__name__}: {e}")
        results.append((check.name, passed, reason))
    failed = [r for r in results if not r[1]]
    if failed:
        return graded("unresolved", f"{failed[0][0]}: {failed[0][2]}", results)
    return graded("resolved", f"all {len(results)} checks hold", results)


def run_gold(sandbox: Sandbox, task: AssistantTask) -> str | None:
    """Make the gold tool calls; returns the gold answer."""
    for call in task.gold:
        ok, result = call_tool(sandbox, call.tool, call.args)
        if not ok:
            raise GoldFailed(f"{call.tool}({call.args}) was refused: {result}")
    return task.answer


AssistantTaskCheck = ServedTaskCheck[AssistantGrade]


def validate_assistant(client: SandboxClient, task: AssistantTask, *,
                       labels: dict[str, str] | None = None) -> AssistantTaskCheck:
    """The gold run resolves the task and doing nothing does not, each in a fresh sandbox."""
    return validate_served(
        client, task, start=lambda sb: start_services(sb, task),
        gold=lambda sb: run_gold(sb, task),
        grade=lambda sb, answer: grade_assistant(sb, task, answer),
        environment_errors=(ServicesError,), labels=labels)
