"""Check that tasks can tell a fix from no fix: the gold patch resolves each one, and on the
untouched repository every FAIL_TO_PASS test fails and every PASS_TO_PASS test passes (so the
empty patch does not resolve it)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from pydantic import BaseModel, Field

from orchard.domains.swe.grading import SweGrade, grade
from orchard.domains.swe.model import SweTask, patch_files
from orchard.env.client import OrchardError, SandboxClient


class TaskCheck(BaseModel):
    instance_id: str
    ok: bool
    problems: list[str] = Field(default_factory=list)
    gold: SweGrade | None = None
    empty: SweGrade | None = None
    seconds: float = 0.0


def validate_task(client: SandboxClient, task: SweTask, *,
                  labels: dict[str, str] | None = None) -> TaskCheck:
    """SweGrade the gold patch and the empty patch, each in a fresh sandbox."""
    start = time.monotonic()
    problems: list[str] = []
    if not task.patch.strip():
        problems.append("it has no gold patch")
    if tests_in_gold := sorted(set(patch_files(task.patch)) & task.test_files()):
        problems.append(f"its gold patch edits test files ({', '.join(tests_in_gold)})")
    gold = empty = None
    try:
        if not problems:
            gold = grade(client, task, task.patch, labels=labels)
            if not gold.resolved:
                problems.append(f"the gold patch does not resolve it: {gold.reason}"
                                + _failing(gold))
        empty = grade(client, task, None, labels=labels, test_empty=True)
    except OrchardError as e:
        problems.append(f"the environment failed while grading ({type(e).__name__}: {e}); "
                        "this says nothing about the task, run validate again")
    if empty is not None:
        if empty.resolved:
            problems.append("the empty patch resolves it: its tests pass without any fix")
        elif empty.outcome != "tests_failed":
            problems.append(f"without a patch the tests do not run: {empty.reason}")
        else:
            passing_f2p = sorted(set(task.FAIL_TO_PASS) - set(empty.f2p_failing))
            if passing_f2p:
                problems.append("FAIL_TO_PASS tests pass without the fix: "
                                + ", ".join(passing_f2p[:5]))
            if empty.p2p_failing:
                problems.append("PASS_TO_PASS tests fail without the fix: "
                                + ", ".join(empty.p2p_failing[:5]))
    return TaskCheck(instance_id=task.instance_id, ok=not problems, problems=problems,
                     gold=gold, empty=empty, seconds=time.monotonic() - start)


def _failing(g: SweGrade) -> str:
    failing = g.f2p_failing + g.p2p_failing
    return f" (failing: {', '.join(failing[:5])})" if failing else ""


def validate_tasks(client: SandboxClient, tasks: Sequence[SweTask], *, concurrency: int = 2,
                   labels: dict[str, str] | None = None,
                   on_done: Callable[[TaskCheck], None] | None = None) -> list[TaskCheck]:
    """Validate every task, ``concurrency`` at a time; results in the tasks' order."""
    def one(task: SweTask) -> TaskCheck:
        check = validate_task(client, task, labels=labels)
        if on_done is not None:
            on_done(check)
        return check

    with ThreadPoolExecutor(max(1, concurrency), thread_name_prefix="validate") as pool:
        return list(pool.map(one, tasks))
