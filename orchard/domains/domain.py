"""What a domain bundles: its task model and sources, its harnesses by name, how its tasks are
validated and listed, and its demo adapters. One ``Domain`` per package under
``orchard.domains``; the registry (``registry.py``) holds them.

Harness factories and demo adapters import their modules when called, so listing or loading
tasks needs neither the rollout extra nor torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from orchard.env.client import Sandbox, SandboxClient
from orchard.tasks.protocol import Submission, Task, TaskSource

T = TypeVar("T")
C = TypeVar("C")


@dataclass(frozen=True)
class HarnessOptions:
    """What ``orchard eval`` may tell a harness; each harness reads the options it needs."""

    model_url: str | None = None
    model: str | None = None
    teacher_solve: float = 1.0
    config: dict[str, Any] | None = None
    token_ids: bool = True
    render_with: str | Path | None = None
    judge_url: str | None = None
    judge_model: str | None = None
    browser_action_set: str = "orchard"
    """The browser agent's: ``orchard`` or ``browsergym`` (BrowserGym's actions)."""

    def require_model(self, harness: str) -> tuple[str, str]:
        """The model URL and name, which ``harness`` cannot run without."""
        if not self.model_url or not self.model:
            raise ValueError(f"the {harness} harness needs --model-url and --model")
        return self.model_url, self.model


HarnessFactory = Callable[[Sequence[Any], HarnessOptions], Any]
"""(the domain's tasks, options) -> a harness (``orchard.eval.Harness``)."""


@dataclass(frozen=True)
class Listing:
    """How ``orchard tasks list`` shows a domain's tasks."""

    columns: tuple[str, ...]
    row: Callable[[Any], tuple[str, ...]]
    json_exclude: frozenset[str] = frozenset()


def _default_workdir(task: Any) -> str | None:
    return None


def answer_submission(task: Any, sandbox: Sandbox, setup: Any, answer: str | None
                      ) -> Submission:
    """The answer, and the sandbox while it lives (a task graded in it judges it there)."""
    return Submission(answer=answer, sandbox=sandbox)


@dataclass(frozen=True)
class Episodes:
    """How an agent outside Orchard works a task's sandbox (``orchard openenv serve``, an
    ``orchard.openenv.EpisodeHooks``): where its commands run, what the sandbox hands in when
    it submits, and the tools the sandbox serves, as an MCP session (None: it serves none)."""

    workdir: Callable[[Any], str | None] = _default_workdir
    submission: Callable[[Any, Sandbox, Any, str | None], Submission] = answer_submission
    mcp: Callable[[Any], Any] | None = None
    """(an ``AsyncSandbox``) -> an async context manager giving an initialized MCP session."""


@dataclass(frozen=True)
class Domain:
    """One domain: a task model, where its tasks come from, what runs them."""

    name: str
    task_type: type
    """The domain's task model (it satisfies ``orchard.tasks.Task``)."""
    source: TaskSource
    harnesses: Mapping[str, HarnessFactory]
    """Harness factories by name, in the order the CLI lists them."""
    validate: Callable[[SandboxClient, Sequence[Any], int, Callable[[Any], None]], list[Any]]
    """(client, tasks, concurrency, on_done) -> one check per task (``.ok``, ``.problems``)."""
    listing: Listing
    demos: Mapping[str, Callable[[dict[str, Any]], Any]]
    """Demo adapters by ``orchard demo --domain`` name: (agent config) -> a
    ``orchard.recipes.domains.DemoDomain``."""
    episodes: Episodes = Episodes()
    """Episodes driven from outside (OpenEnv): commands' workdir, submission, MCP tools."""

    def owns(self, task: Task) -> bool:
        return isinstance(task, self.task_type)


def validate_each(validate: Callable[[SandboxClient, T], C]
                  ) -> Callable[[SandboxClient, Sequence[T], int, Callable[[C], None]], list[C]]:
    """A domain's ``validate`` from a one-task validation: ``concurrency`` tasks at once,
    each check reported as it is done."""
    def run(client: SandboxClient, tasks: Sequence[T], concurrency: int,
            on_done: Callable[[C], None]) -> list[C]:
        def one(task: T) -> C:
            check = validate(client, task)
            on_done(check)
            return check

        with ThreadPoolExecutor(concurrency) as pool:
            return list(pool.map(one, tasks))

    return run
