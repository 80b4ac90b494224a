"""What every task of every domain is, to the runner and the recipes: the ``Task`` protocol,
the ``Grade`` it returns, and the ``TaskSource`` that loads task sets.

A domain (``orchard.domains.<name>``) has its own task model; eval and recipes ask only this
protocol. A task says what it asks (``prompt``), which sandbox a rollout of it runs in
(``sandbox_spec``), how that sandbox is made ready (``set_up``), and how a rollout is judged
(``grade``). Where the judging happens differs: a SWE task grades the rollout's patch in a
fresh sandbox after the rollout, while a web or assistant task judges the state the rollout
left in its own sandbox before that sandbox goes (``graded_in_rollout``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, model_validator

from orchard.env.client import Sandbox, SandboxClient
from orchard.tasks.images import TaskImage

# Also a valid recording-proxy session id once a run id and sample index are added.
INSTANCE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$"
# The first output line by which a mini-swe-agent rollout submits; the one definition the
# agent loop, the scripted teachers and the generated families share.
SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
SUBMIT_COMMAND = f"echo {SUBMIT_MARKER}"


class TaskLoadError(ValueError):
    """A task set could not be read; the message says which file/row and why."""


class TaskSetupError(RuntimeError):
    """The task's environment (repository, pre_commands, sites, services) failed in the
    sandbox: the task (or its image) is broken, so retrying elsewhere would not help."""


class Grade(BaseModel):
    """What grading found, in every domain: ``resolved``, the ``reward`` it earns, an
    ``outcome`` word and, in words, the ``reason``. A domain's grade adds its own details
    (tests passed, checks held, the answer). A grade read back from a results file keeps
    them as extra fields, so nothing a domain recorded is lost on the way through eval."""

    model_config = ConfigDict(extra="allow")

    instance_id: str
    resolved: bool
    reward: float
    outcome: str
    reason: str = ""

    _kinds: ClassVar[list[type[Grade]]] = []

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        Grade._kinds.append(cls)

    @model_validator(mode="wrap")
    @classmethod
    def _as_kind(cls, data: Any, handler: Any) -> Any:
        # A grade read back (from rollouts.jsonl) is as the domain wrote it, with every field
        # of its kind: the kind whose fields it has is the one it was. Kinds register as their
        # modules are imported; an unknown one stays a Grade with its fields as extras.
        if cls is Grade and isinstance(data, dict):
            for kind in Grade._kinds:
                if data.keys() == kind.model_fields.keys():
                    return kind.model_validate(data)
        return handler(data)


@dataclass(frozen=True)
class SandboxSpec:
    """The sandbox a rollout of a task runs in."""

    image: TaskImage = "host"
    """An image name or path, or a Dockerfile build (``sandbox_image`` makes it a name)."""
    block_network: bool = True
    env: dict[str, str] | None = None
    served: bool = False
    """The task's state lives in processes ``set_up`` starts (sites, a browser, services):
    a fork of the sandbox keeps its files but not them, so a state is restored by replay."""


@dataclass(frozen=True)
class Submission:
    """What a rollout hands in: its ``patch`` (SWE), its final ``answer`` (web, assistant),
    and, for tasks graded in the rollout's sandbox, that ``sandbox`` while it lives."""

    patch: str = ""
    answer: str | None = None
    sandbox: Sandbox | None = None

    def live_sandbox(self, task: Task) -> Sandbox:
        """The rollout's sandbox, which a task graded in it needs; a ValueError without."""
        if self.sandbox is None:
            raise ValueError(f"task {task.instance_id} is graded in the rollout's sandbox: "
                             "give Submission(sandbox=...) while it lives")
        return self.sandbox


class TaskBudget(Protocol):
    @property
    def steps(self) -> int: ...

    @property
    def wall_time(self) -> float: ...


@runtime_checkable
class Task(Protocol):
    """One task of any domain, as eval and the recipes see it."""

    graded_in_rollout: ClassVar[bool]
    """True: the state to judge lives in the rollout's sandbox, so the harness grades it
    there (``grade`` with ``Submission.sandbox``) before the sandbox goes. False: the runner
    grades the submission after the rollout, in sandboxes of its own."""

    @property
    def instance_id(self) -> str: ...

    @property
    def split(self) -> str | None: ...

    @property
    def metadata(self) -> dict[str, Any]: ...

    @property
    def budget(self) -> TaskBudget: ...

    @property
    def prompt(self) -> str:
        """What the task asks, in words: a SWE issue, a web or assistant goal."""
        ...

    def sandbox_spec(self) -> SandboxSpec: ...

    def set_up(self, sandbox: Sandbox) -> Any:
        """Make a fresh sandbox ready for a rollout (a repository, sites, services); what it
        returns is the domain's own (a SWE task's workspace and base commit)."""
        ...

    def grade(self, client: SandboxClient, submission: Submission, *,
              labels: dict[str, str] | None = None) -> Grade:
        """Judge a submission; an environment failure is raised, not graded."""
        ...


@runtime_checkable
class TaskSource(Protocol):
    """Loads a domain's task sets: the named ones (``names``) and files it ``accepts``.

    A source may also define ``accepts_name(name) -> bool`` for names beyond ``names`` (the
    SWE source: Hugging Face dataset ids); the registry asks it about a name that is neither
    a named set nor an existing path."""

    names: Sequence[str]

    def accepts(self, path: Path) -> bool:
        """Whether a task file or directory at ``path`` holds this source's tasks."""
        ...

    def load(self, source: str | Path, *, split: str | None = None,
             ids: Iterable[str] | None = None) -> Sequence[Task]:
        """The tasks of a named set or a path, of ``split`` and ``ids`` when given."""
        ...
