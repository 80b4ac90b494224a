"""The registry: every domain by name, task sets by name or path, harnesses by name, demo
adapters by name. What the CLI (``orchard tasks``, ``eval``, ``demo``) resolves through.

    domain, tasks = load_tasks("web", split="test")
    harness = make_harness("web-teacher", tasks)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from orchard.domains.assistant.domain import ASSISTANT
from orchard.domains.domain import Domain, HarnessOptions
from orchard.domains.harbor.domain import HARBOR
from orchard.domains.swe.domain import SWE
from orchard.domains.web.domain import WEB
from orchard.tasks.protocol import Task, TaskLoadError

# In the order a task file is offered to them: the first whose source accepts it loads it (SWE
# takes any directory, so a Harbor dataset must be offered first).
DOMAINS: dict[str, Domain] = {d.name: d for d in (ASSISTANT, WEB, HARBOR, SWE)}


def domain(name: str) -> Domain:
    """A domain by name; a ValueError names the domains."""
    try:
        return DOMAINS[name]
    except KeyError:
        raise ValueError(f"no domain {name!r}; the domains: {', '.join(DOMAINS)}") from None


def task_set_names() -> list[str]:
    """Every named task set, of every domain, SWE's first (as the CLI lists them)."""
    return [n for d in reversed(DOMAINS.values()) for n in d.source.names]


def resolve(source: str | Path) -> Domain:
    """The domain whose tasks ``source`` names: a named set, a task file or directory, or a
    name a source takes beyond its fixed ones (``accepts_name``: a Hugging Face dataset id)."""
    name = str(source)
    for d in DOMAINS.values():
        if name in d.source.names:
            return d
    path = Path(name).expanduser()
    if not path.exists():
        for d in DOMAINS.values():
            # Optional in a TaskSource: most take only their names and paths.
            accepts_name = getattr(d.source, "accepts_name", None)
            if accepts_name is not None and accepts_name(name):
                return d
        raise TaskLoadError(f"no task set at {path}: give a task file (.json, .jsonl, .parquet, "
                            f".yaml) or directory, a Hugging Face dataset id (owner/name), or "
                            f"one of {', '.join(task_set_names())}")
    for d in DOMAINS.values():
        if d.source.accepts(path):
            return d
    raise TaskLoadError(f"no domain reads {path}")  # SWE accepts all but YAML: unreachable


def load_tasks(source: str | Path, *, split: str | None = None,
               ids: Iterable[str] | None = None) -> tuple[Domain, list[Any]]:
    """The domain of ``source`` and its tasks, of ``split`` and ``ids`` when given."""
    d = resolve(source)
    return d, list(d.source.load(source, split=split, ids=ids))


def domain_of(task: Task) -> Domain:
    for d in DOMAINS.values():
        if d.owns(task):
            return d
    raise ValueError(f"task {task.instance_id} ({type(task).__name__}) is of no registered "
                     f"domain; the domains: {', '.join(DOMAINS)}")


def harness_names() -> list[str]:
    """Every harness of every domain, SWE's first (as the CLI lists them)."""
    return [h for d in reversed(DOMAINS.values()) for h in d.harnesses]


def make_harness(name: str, tasks: Sequence[Task], *, model_url: str | None = None,
                 model: str | None = None, teacher_solve: float = 1.0,
                 config: dict[str, Any] | None = None, token_ids: bool = True,
                 render_with: str | Path | None = None, judge_url: str | None = None,
                 judge_model: str | None = None, browser_action_set: str = "orchard") -> Any:
    """A bundled harness by name: ``oracle``, ``teacher`` or ``mini-swe-agent`` for SWE tasks;
    ``web-teacher`` or ``browser-agent`` for web tasks; ``assistant-teacher`` or
    ``assistant`` for assistant tasks, whose rubric ``judge_url`` (an OpenAI base URL) scores
    when given. Every task must be of the harness's domain."""
    options = HarnessOptions(model_url=model_url, model=model, teacher_solve=teacher_solve,
                             config=config, token_ids=token_ids, render_with=render_with,
                             judge_url=judge_url, judge_model=judge_model,
                             browser_action_set=browser_action_set)
    owner = next((d for d in DOMAINS.values() if name in d.harnesses), None)
    if owner is None:
        raise ValueError(f"unknown harness {name!r}; choose one of "
                         f"{', '.join(harness_names())}")
    for d in DOMAINS.values():
        if d is not owner and any(d.owns(t) for t in tasks):
            raise ValueError(f"{d.name} tasks run with {' or '.join(d.harnesses)}, not "
                             f"{name!r}")
    return owner.harnesses[name]([t for t in tasks if owner.owns(t)], options)


def demo_names() -> list[str]:
    return [n for d in reversed(DOMAINS.values()) for n in d.demos]


def demo_domain(name: str, agent_config: dict[str, Any] | None = None) -> Any:
    """The demo adapter (``orchard.recipes.domains.DemoDomain``) ``orchard demo --domain``
    names: swe (the settings family), bugfix, web or assistant. SWE agents run with
    ``agent_config`` (by default the demo's compact mini-swe-agent config)."""
    for d in DOMAINS.values():
        if name in d.demos:
            if agent_config is None:
                from orchard.domains.swe.minisweagent import config_from_specs
                from orchard.recipes.demo import COMPACT_CONFIG

                agent_config = config_from_specs([COMPACT_CONFIG])
            return d.demos[name](agent_config)
    raise ValueError(f"no demo domain {name!r}: {', '.join(demo_names())}")


def run_demo(out: Path, config: Any, *, client: Any = None,
             log: Callable[[str], None] = print, progress: Any = None) -> dict[str, Any]:
    """``orchard.recipes.demo.run_demo`` on the adapter of ``config.domain`` (a
    ``DemoConfig``); ``progress``: a ``StageProgress`` to show the stages on."""
    from orchard.recipes.demo import run_demo as run

    return run(out, config, domain=demo_domain(config.domain), client=client, log=log,
               progress=progress)
