"""The personal-assistant domain's tasks: a seeded world of mail, calendar, contacts, files,
notes, todos and web pages, served in the sandbox as tools (HTTP and MCP), and checks over the
world the assistant leaves.

    tasks = load_assistant_tasks()              # hand-written + 200 generated, or a file
    check = validate_assistant(client, tasks[0])
"""

from __future__ import annotations

from pathlib import Path

from orchard.domains.assistant.checks import CHECKS
from orchard.domains.assistant.environment import (
    ServicesError,
    call_tool,
    start_services,
    world_state,
)
from orchard.domains.assistant.generator import TEMPLATES, generate
from orchard.domains.assistant.grading import (
    AssistantGrade,
    AssistantTaskCheck,
    GoldFailed,
    grade_assistant,
    run_gold,
    validate_assistant,
)
from orchard.domains.assistant.model import SERVICES_PORT, AssistantTask, Check, Criterion, GoldCall
from orchard.tasks.served import read_task_file

HAND_WRITTEN = Path(__file__).resolve().parent / "data" / "tasks.yaml"
ASSISTANT_SETS = ("assistant", "assistant-hand", "assistant-generated")

__all__ = ["ASSISTANT_SETS", "CHECKS", "HAND_WRITTEN", "SERVICES_PORT", "TEMPLATES",
           "AssistantGrade", "AssistantTask", "AssistantTaskCheck", "Check", "Criterion",
           "GoldCall", "GoldFailed", "ServicesError", "call_tool", "generate", "grade_assistant",
           "load_assistant_tasks", "run_gold", "start_services", "validate_assistant",
           "world_state"]


def load_assistant_tasks(source: str | Path | None = None, *,
                         split: str | None = None) -> list[AssistantTask]:
    """``"assistant"`` (or None): the hand-written tasks and 200 generated ones;
    ``"assistant-hand"``, ``"assistant-generated"``: either; or a .yaml/.json/.jsonl file."""
    name = "assistant" if source is None else str(source)
    tasks: list[AssistantTask] = []
    if name in ("assistant", "assistant-hand"):
        tasks += _load_file(HAND_WRITTEN)
    if name in ("assistant", "assistant-generated"):
        tasks += generate(200)
    if name not in ASSISTANT_SETS:
        tasks = _load_file(Path(name).expanduser())
    return [t for t in tasks if split is None or t.split == split]


def _load_file(path: Path) -> list[AssistantTask]:
    from orchard.tasks.protocol import TaskLoadError

    tasks = read_task_file(path, AssistantTask, "assistant task")
    unknown = sorted({c.name for t in tasks for c in t.checks} - CHECKS.keys())
    if unknown:
        raise TaskLoadError(f"{path}: unknown checks {unknown}; one of {sorted(CHECKS)}")
    return tasks
