"""What the web and assistant domains share: tasks whose state is served by processes inside the
sandbox (sites, tool services) and judged there.

- ``read_task_file``: a YAML, JSON or JSONL file of tasks, each row validated into the model;
- ``wait_serving``: one exec that waits inside the sandbox until its ports answer (the event
  log, and so a replay, sees it succeed once);
- ``validate_served``: the gold run resolves a task and doing nothing does not, each in a
  fresh sandbox.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Generic, Literal, Protocol, TypeVar

import yaml
from pydantic import BaseModel, Field, ValidationError

from orchard.env.client import OrchardError, Sandbox, SandboxClient
from orchard.tasks.images import sandbox_image
from orchard.tasks.protocol import Task, TaskLoadError

M = TypeVar("M", bound=BaseModel)
G = TypeVar("G", bound=BaseModel)

_WAIT = """
import sys, time, urllib.request
deadline = time.monotonic() + float(sys.argv[1])
for url in sys.argv[2:]:
    while True:
        try:
            urllib.request.urlopen(url, timeout=2)
            break
        except OSError as e:
            if time.monotonic() > deadline:
                sys.exit(f"{url}: {e}")
            time.sleep(0.05)
"""


# How a served task (web, assistant) ends. task_error: its checker or services failed.
ServedOutcome = Literal["resolved", "unresolved", "task_error"]


class GoldFailed(RuntimeError):
    """A gold step could not be played: the task's script does not fit its environment."""


class ServedTaskCheck(BaseModel, Generic[G]):
    """A task's validation: what is wrong with it (``ok`` when nothing), and the grades of the
    gold run and the empty run."""

    instance_id: str
    ok: bool
    problems: list[str] = Field(default_factory=list)
    gold: G | None = None
    empty: G | None = None
    seconds: float = 0.0


def read_task_file(path: Path, model: type[M], what: str) -> list[M]:
    """Every row of a .yaml/.yml, .json or .jsonl file as a ``model``; TaskLoadError says which
    row is wrong and why."""
    try:
        text = path.read_text()
    except OSError as e:
        raise TaskLoadError(f"cannot read {what} from {path}: {e}") from None
    if path.suffix == ".jsonl":
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    else:
        rows = yaml.safe_load(text) if path.suffix in (".yaml", ".yml") else json.loads(text)
    tasks = []
    for i, row in enumerate(rows):
        try:
            tasks.append(model.model_validate(row))
        except ValidationError as e:
            raise TaskLoadError(f"{path}: {what} {i} ({row.get('instance_id', '?')}): "
                                f"{e.errors()[0]['loc']}: {e.errors()[0]['msg']}") from None
    return tasks


def wait_serving(sandbox: Sandbox, urls: Sequence[str], timeout: float) -> str | None:
    """Wait until every URL answers inside the sandbox; None, or why not."""
    waited = sandbox.exec(f"python3 -c {shlex.quote(_WAIT)} {timeout} "
                          + " ".join(shlex.quote(u) for u in urls), timeout=timeout + 10)
    return None if waited.ok else (waited.stderr.strip()[-300:] or f"exit {waited.exit_code}")


class _Graded(Protocol):
    resolved: bool
    outcome: str
    reason: str


def verdict_problems(gold: _Graded | None, empty: _Graded | None,
                     unsolved: str) -> list[str]:
    """What the gold run and the empty run say is wrong with a task; ``unsolved`` says that
    the gold run failed."""
    problems = []
    if gold is not None and not gold.resolved:
        problems.append(f"{unsolved}: {gold.reason}")
    if empty is not None and empty.resolved:
        problems.append(f"doing nothing resolves it: {empty.reason}")
    for graded in (gold, empty):
        if graded is not None and graded.outcome == "task_error":
            problems.append(f"its checker is broken: {graded.reason}")
    return problems


def validate_served(client: SandboxClient, task: Task, *,
                    start: Callable[[Sandbox], str | None],
                    gold: Callable[[Sandbox], str | None],
                    grade: Callable[[Sandbox, str | None], G],
                    environment_errors: tuple[type[Exception], ...],
                    labels: dict[str, str] | None = None) -> ServedTaskCheck[G]:
    """An empty run and a gold run, each in a fresh sandbox, graded. ``start`` serves the task
    in a sandbox and returns a reason it cannot be validated here (or None); ``gold`` plays
    the gold solution and returns its answer. The grades' fields ``resolved``, ``outcome``
    and ``reason`` say what is wrong. Each sandbox is the one the task specifies."""
    spec = task.sandbox_spec()
    started = time.monotonic()
    problems: list[str] = []
    grades: dict[str, G] = {}
    for run in ("empty", "gold"):
        try:
            with client.create_sandbox(sandbox_image(client, spec.image), labels=labels or {},
                                       env=spec.env,
                                       block_network=spec.block_network) as sb:
                refused = start(sb)
                if refused:
                    problems.append(refused)
                    break
                grades[run] = grade(sb, gold(sb) if run == "gold" else None)
        except GoldFailed as e:
            problems.append(f"its gold solution cannot be played: {e}")
        except (OrchardError, *environment_errors) as e:
            problems.append(f"the environment failed ({type(e).__name__}: {e}); this says "
                            "nothing about the task, validate again")
    gold_grade, empty = grades.get("gold"), grades.get("empty")
    problems += verdict_problems(gold_grade, empty, "the gold solution does not resolve it")
    return ServedTaskCheck[G](instance_id=task.instance_id, ok=not problems, problems=problems,
                              gold=gold_grade, empty=empty, seconds=time.monotonic() - started)
