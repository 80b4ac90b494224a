"""Validating MiniWoB++ tasks: each page loads, gives its instruction, and ends with a reward.

Two runs, each in a fresh sandbox, as ``orchard tasks validate`` does for every web task:

- the idle run loads the page on a short clock and does nothing: the page must report an
  instruction, then end the episode itself when its timer runs out, with the reward it gives
  a timeout (-1), so the task is not resolved by doing nothing;
- the solver run (pages the scripted solver covers) plays the solver: the page's raw reward
  must be 1.
"""

from __future__ import annotations

import time

from orchard.domains.web.environment import SiteError
from orchard.domains.web.grading import WebGrade, WebTaskCheck, grade_web
from orchard.domains.web.miniwob.environment import episode, start_miniwob
from orchard.domains.web.miniwob.solver import SOLVED_PAGES, run_solver
from orchard.domains.web.miniwob.tasks import MiniWobTask
from orchard.env.client import OrchardError, Sandbox, SandboxClient
from orchard.tasks.served import verdict_problems

IDLE_CLOCK_MS = 1500  # the idle run's episode: long enough to load, short to wait out


def wait_done(sandbox: Sandbox, timeout: float) -> dict:
    """The episode once the page has ended it, or as it is after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    state = episode(sandbox)
    while not state["done"] and time.monotonic() < deadline:
        time.sleep(0.25)
        state = episode(sandbox)
    return state


def validate_miniwob(client: SandboxClient, task: MiniWobTask, *,
                     labels: dict[str, str] | None = None) -> WebTaskCheck:
    """The idle run and, where the solver covers the page, the solver run (see the module
    doc)."""
    started = time.monotonic()
    problems: list[str] = []
    grades: dict[str, WebGrade] = {}
    runs = ("empty", "gold") if task.page in SOLVED_PAGES else ("empty",)
    for run in runs:
        try:
            with client.create_sandbox(labels=labels or {}, block_network=True) as sb:
                start_miniwob(sb)
                if run == "gold":
                    run_solver(sb, task.start_url, task.budget.action_timeout)
                else:
                    page = sb.browser("goto", url=task.url(time_limit_ms=IDLE_CLOCK_MS),
                                      timeout=task.budget.action_timeout)
                    if page.error:
                        problems.append(f"the page did not load: {page.error}")
                        break
                    state = wait_done(sb, IDLE_CLOCK_MS / 1000 + 10)
                    if not state["instruction"]:
                        problems.append("the page gave no instruction (#query is empty)")
                    if not state["done"] or state["reward"] is None:
                        problems.append("the page did not end its episode with a reward "
                                        f"when its clock ran out: {state}")
                grades[run] = grade_web(sb, task, None)
        except (OrchardError, SiteError) as e:
            problems.append(f"the environment failed ({type(e).__name__}: {e}); this says "
                            "nothing about the task, validate again")
    gold, empty = grades.get("gold"), grades.get("empty")
    problems += verdict_problems(gold, empty, "the scripted solver does not solve it")
    return WebTaskCheck(instance_id=task.instance_id, ok=not problems, problems=problems,
                        gold=gold, empty=empty, seconds=time.monotonic() - started)
