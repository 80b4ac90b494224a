"""MiniWoB++ as web tasks: its task pages (vendored, MIT) served in the sandbox, one task per
page and seed, judged by the page's own JavaScript reward.

    tasks = load_miniwob_tasks("miniwob")        # or "miniwob-untimed"
    check = validate_miniwob(client, tasks[0])   # loads, instructs, ends with a reward

See docs/guides/web-tasks.md (MiniWoB++).
"""

from __future__ import annotations

from orchard.domains.web.miniwob.environment import episode, start_miniwob
from orchard.domains.web.miniwob.solver import (
    SOLVED_PAGES,
    plan,
    random_policy,
    run_solver,
    solver_policy,
)
from orchard.domains.web.miniwob.tasks import (
    MINIWOB_SETS,
    MiniWobTask,
    load_miniwob_tasks,
    miniwob_task,
    page_names,
)
from orchard.domains.web.miniwob.validate import validate_miniwob

__all__ = ["MINIWOB_SETS", "SOLVED_PAGES", "MiniWobTask", "episode", "load_miniwob_tasks",
           "miniwob_task", "page_names", "plan", "random_policy", "run_solver", "solver_policy",
           "start_miniwob", "validate_miniwob"]
