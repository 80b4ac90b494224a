"""Tasks and their grading: the SWE-bench-compatible task model, offline loaders (files, saved
datasets, the bundled set, HumanEval), repository set-up in a sandbox, fresh-sandbox grading
and task-set validation."""

from orchard.extras import require

# Before any third-party import: a missing one is then a one-line error naming its extra.
require("tasks")

from orchard.tasks.bundled_data import bundled_dir
from orchard.tasks.grading import Grade, grade
from orchard.tasks.loaders import TaskLoadError, load_task_dir, load_tasks
from orchard.tasks.model import Budget, RepoSource, Task, file_diff, patch_files
from orchard.tasks.validate import TaskCheck, validate_task, validate_tasks
from orchard.tasks.workspace import TaskSetupError, open_task_sandbox, prepare_workspace

__all__ = [
    "bundled_dir",
    "Budget",
    "Grade",
    "RepoSource",
    "Task",
    "TaskCheck",
    "TaskLoadError",
    "TaskSetupError",
    "file_diff",
    "grade",
    "load_task_dir",
    "load_tasks",
    "open_task_sandbox",
    "patch_files",
    "prepare_workspace",
    "validate_task",
    "validate_tasks",
]
