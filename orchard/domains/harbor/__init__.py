"""The Harbor domain: task directories in Harbor's format (task.toml, instruction.md,
environment/, tests/, solution/) as an Orchard task set.

    tasks = load_harbor_tasks("path/to/dataset")   # a task directory, or a directory of them
    check = validate_harbor(client, tasks[0])      # the oracle earns reward 1, nothing does not

Harbor's own CLI runs the same directories in Orchard sandboxes through
``orchard.integrations.harbor`` (docs/guides/harbor.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from orchard.domains.harbor.grading import (
    HarborGrade,
    HarborTaskCheck,
    run_solution,
    run_tests,
    set_up,
    upload_dir,
    validate_harbor,
)
from orchard.domains.harbor.task import (
    HarborBudget,
    HarborTask,
    is_task_dir,
    read_task,
    resolve_env,
    task_dirs,
)
from orchard.tasks.protocol import TaskLoadError


def load_harbor_tasks(source: str | Path, *, ids: Iterable[str] | None = None) -> list[HarborTask]:
    """The task directory ``source``, or every task directory in the dataset ``source``."""
    path = Path(source).expanduser()
    if not path.is_dir():
        raise TaskLoadError(f"{path} is not a Harbor task or dataset directory")
    dirs = task_dirs(path)
    if not dirs:
        raise TaskLoadError(f"{path} holds no Harbor task: no task.toml in it or in its "
                            "subdirectories")
    keep = set(ids) if ids else None
    return [read_task(d) for d in dirs if keep is None or d.name in keep]


__all__ = ["HarborBudget", "HarborGrade", "HarborTask", "HarborTaskCheck", "is_task_dir",
           "load_harbor_tasks", "read_task", "resolve_env", "run_solution", "run_tests",
           "set_up", "task_dirs", "upload_dir", "validate_harbor"]
