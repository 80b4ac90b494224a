"""What an Orchard task episode says over OpenEnv: its action, observation and state.

One episode is one task in one fresh sandbox. An agent runs shell commands in it
(``TaskAction(command=...)``) and ends it with ``TaskAction(submit=True, answer=...)``; the
task's own grading then gives the reward. The tools of a domain that serves them (the
assistant's) are reached with OpenEnv's own ``ListToolsAction`` / ``CallToolAction`` instead,
and its ``submit`` tool ends the episode.
"""

from __future__ import annotations

from typing import Any

from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

SUBMIT_TOOL = "submit"
"""The tool by which an episode of a tools environment hands in its answer and ends."""


class TaskAction(Action):
    """One step: run ``command`` in the episode's sandbox, or ``submit`` (with the ``answer``
    a task judged on one needs) to end the episode and have the task grade it."""

    command: str | None = Field(None, min_length=1, description="A shell command (sh -c), run "
                                "in the task's working directory.")
    timeout: float | None = Field(None, gt=0, le=3600, description="Seconds the command may "
                                  "run (default: the server's).")
    submit: bool = Field(False, description="End the episode: the task grades the sandbox.")
    answer: str | None = Field(None, description="The final answer, with submit.")

    @model_validator(mode="after")
    def _one_thing(self) -> TaskAction:
        # PydanticCustomError, not ValueError: OpenEnv sends a WebSocket client the error list
        # as JSON, and a ValueError in it would not serialize (the session would end).
        if (self.command is None) == (not self.submit):
            raise PydanticCustomError("action", "an action either runs a command ({'command': "
                                      "'ls'}) or submits ({'submit': true, 'answer': '...'}), "
                                      "exactly one of the two")
        if self.answer is not None and not self.submit:
            raise PydanticCustomError("action", "'answer' goes with 'submit': true")
        if self.timeout is not None and self.command is None:
            raise PydanticCustomError("action", "'timeout' goes with 'command'")
        return self


class TaskObservation(Observation):
    """What the agent sees: the task's ``prompt`` after reset, a command's output after a
    step, the task's ``grade`` (and ``reward``, ``done``) once the episode ends."""

    task_id: str
    prompt: str = ""
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    timed_out: bool = False
    steps_left: int = 0
    grade: dict[str, Any] | None = Field(None, description="The task's Grade, as JSON: "
                                         "resolved, reward, outcome, reason and its details.")


class TaskState(State):
    """The episode: which task, in which sandbox (gone once graded), how it ended."""

    task_id: str | None = None
    sandbox_id: str | None = None
    done: bool = False
    reward: float | None = None
    grade: dict[str, Any] | None = None
    ended_by: str | None = Field(None, description="'submit' or 'budget'.")
