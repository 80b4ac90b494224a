"""The assistant task model: a goal over a seeded world, checks over the final world.

A task seeds one user's world (mail, calendar, contacts, files, notes, todos, a web corpus),
says what the user asks (``goal``), which tools the assistant may use, and how its work is
judged: ``checks`` are programmatic assertions over the final world and the final answer (all
must hold), and an optional ``rubric`` (weighted criteria) is for an LLM judge. ``gold`` is a
scripted solution, tool calls then an answer, so validation proves each task solvable and not
solved by doing nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from orchard.domains.assistant.services.tools import TOOLS
from orchard.tasks.protocol import INSTANCE_ID_PATTERN, SandboxSpec, Submission

if TYPE_CHECKING:
    from orchard.domains.assistant.grading import AssistantGrade
    from orchard.env.client import Sandbox, SandboxClient

# Where the services listen inside the sandbox (its own network namespace).
SERVICES_PORT = 8200
EMPTY_WORLD: dict[str, Any] = {
    "user": {"name": "Alex Kim", "email": "alex@example.com", "now": "2026-03-02T09:00"},
    "mail": [], "events": [], "invitations": [], "contacts": [], "files": {}, "notes": [],
    "todos": [], "web": []}


class Check(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="A check of orchard.domains.assistant.checks.CHECKS.")
    args: dict[str, Any] = Field(default_factory=dict)


class Criterion(BaseModel):
    model_config = ConfigDict(extra="forbid")

    criterion: str = Field(min_length=1, description="What a good answer does, for a judge.")
    weight: float = Field(1.0, gt=0)


class GoldCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tool: str
    args: dict[str, Any] = Field(default_factory=dict)


class AssistantBudget(BaseModel):
    model_config = ConfigDict(extra="forbid")

    steps: int = Field(20, gt=0, le=500, description="Model calls.")
    wall_time: float = Field(300, gt=0, le=3600)


class AssistantTask(BaseModel):
    """A request over a seeded world served in the rollout's sandbox; judged there, by its
    checks over the final world and the assistant's answer."""

    model_config = ConfigDict(extra="forbid")
    graded_in_rollout: ClassVar[bool] = True

    instance_id: str = Field(pattern=INSTANCE_ID_PATTERN)
    domain: str = Field("assistant", pattern="^assistant$")
    goal: str = Field(min_length=1)
    world: dict[str, Any] = Field(description="The seed world; missing parts start empty.")
    tools: list[str] | None = Field(None, description="The tools it may use; None: all.")
    checks: list[Check] = Field(min_length=1)
    rubric: list[Criterion] = Field(default_factory=list)
    gold: list[GoldCall] = Field(default_factory=list)
    answer: str | None = Field(None, description="The gold solution's final answer.")
    image: str = "host"
    budget: AssistantBudget = Field(default_factory=AssistantBudget)
    split: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known(self) -> AssistantTask:
        unknown = sorted({*(self.tools or ()), *(c.tool for c in self.gold)} - TOOLS.keys())
        if unknown:
            raise ValueError(f"unknown tools {unknown}; the tools: {sorted(TOOLS)}")
        parts = set(self.world) - EMPTY_WORLD.keys()
        if parts:
            raise ValueError(f"the world has no part {sorted(parts)}; its parts: "
                             f"{sorted(EMPTY_WORLD)}")
        return self

    def seed(self) -> dict[str, Any]:
        """The whole seed world: the task's parts over an empty one."""
        return {**EMPTY_WORLD, **self.world}

    @property
    def available(self) -> list[str]:
        return list(self.tools) if self.tools is not None else list(TOOLS)

    @property
    def prompt(self) -> str:
        return self.goal

    def sandbox_spec(self) -> SandboxSpec:
        return SandboxSpec(image=self.image, block_network=True, served=True)

    def set_up(self, sandbox: Sandbox) -> None:
        """Serve the task's seeded world (its tools, over HTTP and MCP) in the sandbox."""
        from orchard.domains.assistant.environment import start_services

        start_services(sandbox, self)

    def grade(self, client: SandboxClient, submission: Submission, *,
              labels: dict[str, str] | None = None) -> AssistantGrade:
        """The checks over the rollout's sandbox as it is now, with the assistant's answer."""
        from orchard.domains.assistant.grading import grade_assistant

        return grade_assistant(submission.live_sandbox(self), self, submission.answer)
