"""The software-engineering domain: SWE-bench-compatible tasks (``SweTask``), offline loaders
(files, saved datasets, the bundled set, HumanEval, the generated settings and bug-fix
families), repository set-up in a sandbox, fresh-sandbox grading by tests, task-set
validation, mini-swe-agent (``minisweagent``) and its harnesses (``harness``)."""

from orchard.domains.swe.bundled_data import bundled_dir
from orchard.domains.swe.grading import SweGrade, grade
from orchard.domains.swe.loaders import load_task_dir, load_tasks
from orchard.domains.swe.model import Budget, RepoSource, SweTask, file_diff, patch_files
from orchard.domains.swe.validate import TaskCheck, validate_task, validate_tasks
from orchard.domains.swe.workspace import Workspace, open_task_sandbox, prepare_workspace
from orchard.tasks.protocol import TaskLoadError, TaskSetupError

__all__ = [
    "Budget",
    "RepoSource",
    "SweGrade",
    "SweTask",
    "TaskCheck",
    "TaskLoadError",
    "TaskSetupError",
    "Workspace",
    "bundled_dir",
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
