"""The web task model: a goal on self-hosted sites, a checker over their final state, a gold run.

A web task names the sites a sandbox serves for it (``sites``), where the browser starts
(``start_url``), what to do (``goal``), a checker (a function of the sites' final state and
the agent's answer, see ``checkers.py``) and a scripted gold solution, so ``validate`` can prove
the task solvable and not solved by doing nothing. Gold steps name elements the way an
observation shows them (``button "Add to cart"``), never by id: ids change with every
observation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from orchard.tasks.protocol import INSTANCE_ID_PATTERN, SandboxSpec, Submission

if TYPE_CHECKING:
    from orchard.domains.web.grading import WebGrade
    from orchard.env.client import Sandbox, SandboxClient

# Where each bundled site listens inside the sandbox (its own network namespace).
SITE_PORTS = {"shop": 8101, "wiki": 8102, "booking": 8103, "mail": 8104, "miniwob": 8105}


class Checker(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="A checker of orchard.domains.web.checkers.CHECKERS.")
    args: dict[str, Any] = Field(default_factory=dict)


class GoldStep(BaseModel):
    """One step of the gold solution: a browser action on an element found by its tree line,
    or the final answer."""

    model_config = ConfigDict(extra="forbid")

    action: Literal["goto", "click", "type", "select", "press", "back", "answer"]
    target: str | None = Field(None, description='An element as the tree shows it, e.g. '
                               'link "About us": the first line that starts with it.')
    url: str | None = None
    text: str | None = None
    value: str | None = None
    key: str | None = None
    submit: bool = False

    @model_validator(mode="after")
    def _complete(self) -> GoldStep:
        needs = {"goto": "url", "answer": "text", "press": "key"}.get(self.action)
        if needs and getattr(self, needs) is None:
            raise ValueError(f"a gold {self.action!r} step needs {needs!r}")
        if self.action in ("click", "type", "select") and not self.target:
            raise ValueError(f"a gold {self.action!r} step needs a 'target'")
        return self


class WebBudget(BaseModel):
    model_config = ConfigDict(extra="forbid")

    steps: int = Field(20, gt=0, le=500, description="Model calls (browser actions).")
    wall_time: float = Field(300, gt=0, le=3600)
    action_timeout: float = Field(15, gt=0, le=300, description="Seconds a page may load.")


class WebTask(BaseModel):
    """A goal on sites served in the rollout's sandbox; judged there, by its checker over the
    sites' final state and the agent's answer."""

    model_config = ConfigDict(extra="forbid")
    graded_in_rollout: ClassVar[bool] = True

    instance_id: str = Field(pattern=INSTANCE_ID_PATTERN)
    domain: Literal["web"] = "web"
    goal: str = Field(min_length=1)
    sites: list[Literal["shop", "wiki", "booking", "mail", "miniwob"]] = Field(
        default_factory=list, description="Served in the sandbox; only a live task has none.")
    start_url: str
    checker: Checker
    gold: list[GoldStep] = Field(min_length=1)
    live: bool = Field(False, description="The task needs a live site on the internet, so its "
                       "sandboxes are networked; the tasks of the 'web' set never do.")
    image: str = "host"
    budget: WebBudget = Field(default_factory=WebBudget)
    split: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _served(self) -> WebTask:
        if not self.sites and not self.live:
            raise ValueError("a task serves at least one site; only a live task (live: true) "
                             "may have none")
        return self

    @property
    def answers(self) -> bool:
        """Whether the task is solved by an answer rather than by a change to a site."""
        return self.checker.name == "answer"

    @property
    def prompt(self) -> str:
        return self.goal

    def sandbox_spec(self) -> SandboxSpec:
        # Network blocked: the sites are served inside. A live task reaches the internet.
        return SandboxSpec(image=self.image, block_network=not self.live, served=True)

    def set_up(self, sandbox: Sandbox) -> None:
        """Serve the task's sites in the sandbox."""
        from orchard.domains.web.environment import start_sites

        start_sites(sandbox, self)

    def grade(self, client: SandboxClient, submission: Submission, *,
              labels: dict[str, str] | None = None) -> WebGrade:
        """The checker over the rollout's sandbox as it is now, with the agent's answer."""
        from orchard.domains.web.grading import grade_web

        return grade_web(submission.live_sandbox(self), self, submission.answer)
