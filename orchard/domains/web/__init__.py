"""The web domain's tasks: self-hosted sites served in the sandbox, goals, checkers, gold runs.

    tasks = load_web_tasks()                   # the bundled set, "web-live", or a file
    check = validate_web(client, tasks[0])     # gold resolves it, doing nothing does not
"""

from __future__ import annotations

from pathlib import Path

from orchard.domains.web.checkers import CHECKERS
from orchard.domains.web.environment import SiteError, site_state, start_sites
from orchard.domains.web.grading import (
    GoldFailed,
    WebGrade,
    WebTaskCheck,
    element_id,
    grade_web,
    play,
    run_gold,
    validate_web,
)
from orchard.domains.web.model import SITE_PORTS, Checker, GoldStep, WebBudget, WebTask
from orchard.tasks.served import read_task_file

BUNDLED = Path(__file__).resolve().parent / "data" / "tasks.yaml"
# Tasks on live sites of the internet, for users whose sandboxes may reach it: kept apart so
# that "web" always runs offline.
LIVE = Path(__file__).resolve().parent / "data" / "live.yaml"
WEB_SETS = {"web": BUNDLED, "web-live": LIVE}

__all__ = ["BUNDLED", "CHECKERS", "LIVE", "SITE_PORTS", "WEB_SETS", "Checker", "GoldFailed",
           "GoldStep", "SiteError", "WebBudget", "WebGrade", "WebTask", "WebTaskCheck",
           "element_id", "grade_web", "load_web_tasks", "play", "run_gold", "site_state",
           "start_sites", "validate_web"]


def load_web_tasks(source: str | Path | None = None, *,
                   split: str | None = None) -> list[WebTask]:
    """The bundled web tasks (``None`` or ``"web"``), the live ones (``"web-live"``), or a
    .yaml/.json/.jsonl file of them."""
    path = BUNDLED if source is None else WEB_SETS.get(str(source), Path(str(source)).expanduser())
    from orchard.tasks.protocol import TaskLoadError

    tasks = read_task_file(path, WebTask, "web task")
    unknown = sorted({t.checker.name for t in tasks} - CHECKERS.keys())
    if unknown:
        raise TaskLoadError(f"{path}: unknown checkers {unknown}; one of {sorted(CHECKERS)}")
    return [t for t in tasks if split is None or t.split == split]
