"""Grading and validating web tasks: the checker over the sites' final state, and the gold run.

``grade_web`` judges a sandbox at the end of a rollout. ``run_gold`` plays a task's scripted
solution in the browser, finding each step's element by how the tree shows it. ``validate_web``
proves a task solvable (the gold run resolves it) and not solved by doing nothing, each in a
fresh sandbox.
"""

from __future__ import annotations

import time
from typing import cast

from pydantic import ConfigDict, Field

from orchard.domains.web.checkers import CHECKERS
from orchard.domains.web.environment import SiteError, site_state, start_sites
from orchard.domains.web.model import GoldStep, WebTask
from orchard.env.browser_schema import BrowserObservation, BrowserVerb
from orchard.env.client import Sandbox, SandboxClient
from orchard.tasks.protocol import Grade
from orchard.tasks.served import GoldFailed, ServedOutcome, ServedTaskCheck, validate_served


class WebGrade(Grade):
    model_config = ConfigDict(extra="ignore")

    outcome: ServedOutcome = Field(description="task_error: the checker or the sites failed; "
                                "the task is broken, the rollout is not to blame.")
    reason: str
    answer: str | None = None


def grade_web(sandbox: Sandbox, task: WebTask, answer: str | None) -> WebGrade:
    """Judge the sandbox's sites as they are now, with the agent's final answer."""
    def graded(outcome: ServedOutcome, reason: str) -> WebGrade:
        return WebGrade(instance_id=task.instance_id, resolved=outcome == "resolved",
                        reward=1.0 if outcome == "resolved" else 0.0, outcome=outcome,
                        reason=reason, answer=answer)

    check = CHECKERS.get(task.checker.name)
    if check is None:
        return graded("task_error", f"unknown checker {task.checker.name!r}; one of "
                      f"{', '.join(sorted(CHECKERS))}")
    try:
        state = site_state(sandbox, task)
    except SiteError as e:
        return graded("task_error", str(e))
    try:
        passed, reason = check(state, answer, **task.checker.args)
    except Exception as e:  # noqa: BLE001 - a broken checker is the task's fault
        return graded("task_error", f"checker {task.checker.name} crashed: "
                      f"{type(e).__name__}: {e}")
    return graded("resolved" if passed else "unresolved", reason)


def element_id(tree: str, target: str) -> int | None:
    """The id of the first element whose tree line starts with ``target``."""
    for line in tree.splitlines():
        line = line.strip()
        if line.startswith("[") and "] " in line:
            number, rest = line[1:].split("] ", 1)
            if rest.startswith(target):
                return int(number)
    return None


def play(sandbox: Sandbox, page: BrowserObservation, step: GoldStep,
         timeout: float) -> BrowserObservation:
    """One gold (or teacher) step on the page as last observed."""
    params: dict[str, object] = {"timeout": timeout}
    if step.target is not None:
        found = element_id(page.tree, step.target)
        if found is None:  # a page still changing: look once more, as an agent would
            time.sleep(0.5)
            page = sandbox.browser("observe", timeout=timeout)
            found = element_id(page.tree, step.target)
        if found is None:
            raise GoldFailed(f"no element {step.target!r} on {page.url}:\n{page.tree[:2000]}")
        params["id"] = found
    for field in ("url", "text", "value", "key"):
        if getattr(step, field) is not None:
            params[field] = getattr(step, field)
    if step.action == "type":
        params["submit"] = step.submit
    after = sandbox.browser(cast(BrowserVerb, step.action), **params)
    if after.error:
        raise GoldFailed(f"{step.action} {step.target or step.url or ''}: {after.error}")
    return after


def run_gold(sandbox: Sandbox, task: WebTask) -> str | None:
    """Play the gold solution from the start URL; returns its answer (None if it gives
    none)."""
    page = sandbox.browser("goto", url=task.start_url, timeout=task.budget.action_timeout)
    answer = None
    for step in task.gold:
        if step.action == "answer":
            answer = step.text
            continue
        page = play(sandbox, page, step, task.budget.action_timeout)
    return answer


WebTaskCheck = ServedTaskCheck[WebGrade]


def validate_web(client: SandboxClient, task: WebTask, *,
                 labels: dict[str, str] | None = None) -> WebTaskCheck:
    """The gold run resolves the task and doing nothing does not, each in a fresh sandbox."""
    def start(sb: Sandbox) -> str | None:
        start_sites(sb, task)
        page = sb.browser("goto", url=task.start_url, timeout=task.budget.action_timeout)
        if task.live and page.error:
            # An answer-checked task could otherwise pass without the site.
            return (f"its live site did not load ({page.error}): validate it where sandboxes "
                    "reach the internet")
        return None

    return validate_served(
        client, task, start=start, gold=lambda sb: run_gold(sb, task),
        grade=lambda sb, answer: grade_web(sb, task, answer), environment_errors=(SiteError,),
        labels=labels)
