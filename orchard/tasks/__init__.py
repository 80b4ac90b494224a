"""Tasks, whatever their domain: the ``Task`` protocol eval and the recipes ask, the ``Grade``
it returns, task sources, the one submit marker, and what the served domains (web, assistant)
share. Each domain's own task model, loaders and grading live in ``orchard.domains.<name>``."""

from orchard.extras import require

# Before any third-party import: a missing one is then a one-line error naming its extra.
require("tasks")

from orchard.tasks.images import ImageBuild, TaskImage, sandbox_image
from orchard.tasks.protocol import (
    INSTANCE_ID_PATTERN,
    SUBMIT_COMMAND,
    SUBMIT_MARKER,
    Grade,
    SandboxSpec,
    Submission,
    Task,
    TaskBudget,
    TaskLoadError,
    TaskSetupError,
    TaskSource,
)
from orchard.tasks.served import (
    GoldFailed,
    ServedTaskCheck,
    read_task_file,
    validate_served,
    wait_serving,
)

__all__ = [
    "INSTANCE_ID_PATTERN",
    "SUBMIT_COMMAND",
    "SUBMIT_MARKER",
    "GoldFailed",
    "ImageBuild",
    "TaskImage",
    "sandbox_image",
    "Grade",
    "SandboxSpec",
    "ServedTaskCheck",
    "Submission",
    "Task",
    "TaskBudget",
    "TaskLoadError",
    "TaskSetupError",
    "TaskSource",
    "read_task_file",
    "validate_served",
    "wait_serving",
]
