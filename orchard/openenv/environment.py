"""Orchard tasks as OpenEnv environments: one episode, one task, one fresh sandbox.

``reset`` picks a task (by ``task_id``, by ``seed``, or the next in turn), makes a sandbox as
the task specifies and sets it up; the observation is the task's prompt. ``step`` runs a
command in that sandbox. ``submit`` (or the task's step budget running out) ends the episode:
the domain turns the sandbox into a ``Submission`` (a SWE task's diff, the answer), the task
grades it, and the grade's reward is the step's reward. The sandbox is deleted then, or when
the session closes or resets first, so none outlives its episode.

OpenEnv's server makes one environment per WebSocket session and runs its sync methods in
that session's own thread, so an environment needs no lock; what the sessions share (the task
set, the SDK client, the record of graded episodes) is ``ServedTasks``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import EnvironmentMetadata

from orchard.env.client import AsyncSandbox, NotFoundError, Sandbox, SandboxClient
from orchard.env.errors import Conflict, NotFound
from orchard.openenv.models import TaskAction, TaskObservation, TaskState
from orchard.tasks.protocol import Grade, Submission, Task

McpOpener = Callable[[AsyncSandbox], AbstractAsyncContextManager[Any]]
"""An initialized MCP client session (the ``mcp`` SDK's) on the tools a sandbox serves."""


class EpisodeHooks(Protocol):
    """What a domain says about episodes an outside agent drives (``Domain.episodes``)."""

    def workdir(self, task: Any) -> str | None:
        """Where the agent's commands run (None: the sandbox's default)."""
        ...

    def submission(self, task: Any, sandbox: Sandbox, setup: Any,
                   answer: str | None) -> Submission:
        """What the episode hands in: its ``answer``, and what the sandbox holds."""
        ...

    @property
    def mcp(self) -> McpOpener | None:
        """The task's tools as an MCP session on its sandbox, for domains that serve tools."""
        ...


@dataclass(frozen=True)
class GradedEpisode:
    """One episode as the task graded it."""

    episode_id: str
    task_id: str
    sandbox_id: str
    steps: int
    ended_by: str
    grade: Grade
    seconds: float


class ServedTasks:
    """A task set as an OpenEnv server serves it: the tasks, the orchestrator's client, the
    domain's hooks, and every graded episode (in ``graded``, and as JSON lines in ``record``
    when given)."""

    def __init__(self, name: str, tasks: Sequence[Task], client: SandboxClient,
                 hooks: EpisodeHooks, *, sandbox_ttl: float = 3600.0,
                 command_timeout: float = 120.0, output_limit: int = 64 << 10,
                 record: Path | None = None) -> None:
        if not tasks:
            raise ValueError(f"task set {name!r} has no tasks to serve")
        self.name = name
        self.tasks = list(tasks)
        self.by_id = {t.instance_id: t for t in self.tasks}
        self.client = client
        self.hooks = hooks
        self.sandbox_ttl = sandbox_ttl
        self.command_timeout = command_timeout
        self.output_limit = output_limit
        self.record_path = record
        self.graded: list[GradedEpisode] = []
        self._turn = itertools.count()
        self._lock = threading.Lock()

    def task(self, task_id: str | None, seed: int | None) -> Task:
        """The task ``task_id`` names, else the one ``seed`` picks, else the next in turn."""
        if task_id is not None:
            if task_id not in self.by_id:
                known = ", ".join(list(self.by_id)[:10])
                raise NotFound(f"no task {task_id!r} in {self.name} ({len(self.tasks)} tasks: "
                               f"{known}{', ...' if len(self.tasks) > 10 else ''})")
            return self.by_id[task_id]
        index = seed if seed is not None else next(self._turn)
        return self.tasks[index % len(self.tasks)]

    def open_sandbox(self, task: Task, episode_id: str) -> Sandbox:
        spec = task.sandbox_spec()
        # The ttl bounds a sandbox whose server died mid-episode; a live episode deletes its
        # own when it ends.
        return self.client.create_sandbox(
            spec.image, block_network=spec.block_network, env=spec.env, ttl=self.sandbox_ttl,
            labels={"orchard-openenv": self.name[:1024], "episode": episode_id[:1024],
                    "task": task.instance_id})

    def record(self, episode: GradedEpisode) -> None:
        with self._lock:
            self.graded.append(episode)
            if self.record_path is not None:
                line = {"episode_id": episode.episode_id, "task_id": episode.task_id,
                        "sandbox_id": episode.sandbox_id, "steps": episode.steps,
                        "ended_by": episode.ended_by, "seconds": round(episode.seconds, 3),
                        "grade": episode.grade.model_dump(mode="json")}
                with self.record_path.open("a") as f:
                    f.write(json.dumps(line) + "\n")


class TaskEnvironment(Environment[TaskAction, TaskObservation, TaskState]):
    """An OpenEnv environment over a task set: shell commands in the task's sandbox, then
    ``submit``; the reward is the task's grade."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, served: ServedTasks) -> None:
        super().__init__()
        self.served = served
        self._task: Task | None = None
        self._sandbox: Sandbox | None = None
        self._setup: Any = None
        self._started = 0.0
        self._state = TaskState()

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name=f"orchard:{self.served.name}", version="1",
            description=f"{len(self.served.tasks)} Orchard tasks of {self.served.name}, each "
                        "episode in a fresh sandbox, rewarded by the task's own grading")

    def reset(self, seed: int | None = None, episode_id: str | None = None,
              task_id: str | None = None, **unknown: Any) -> TaskObservation:
        """A new episode: the task ``task_id`` names (else ``seed`` picks one, else the next
        in turn) in a fresh sandbox, set up; an episode still open is dropped first."""
        if unknown:
            raise ValueError(f"reset takes task_id, seed and episode_id, not "
                             f"{', '.join(sorted(unknown))}")
        self._drop()
        task = self.served.task(task_id, seed)
        episode_id = episode_id or uuid.uuid4().hex
        self._started = time.monotonic()
        self._sandbox = self.served.open_sandbox(task, episode_id)
        try:
            self._setup = task.set_up(self._sandbox)
        except BaseException:
            self._drop()
            raise
        self._task = task
        self._state = TaskState(episode_id=episode_id, task_id=task.instance_id,
                                sandbox_id=self._sandbox.id)
        return TaskObservation(task_id=task.instance_id, prompt=task.prompt,
                               steps_left=task.budget.steps)

    def step(self, action: TaskAction, timeout_s: float | None = None,
             **kwargs: Any) -> TaskObservation:
        task, sandbox = self._live()
        if action.submit:
            grade = self._finish(action.answer, "submit")
            return self._ended(task, grade)
        assert action.command is not None  # the action's validator: a command or a submit
        job = sandbox.exec(action.command, cwd=self.served.hooks.workdir(task),
                           timeout=action.timeout or timeout_s or self.served.command_timeout,
                           max_output_bytes=self.served.output_limit)
        self._state.step_count += 1
        observed = TaskObservation(task_id=task.instance_id, stdout=job.stdout,
                                   stderr=job.stderr, exit_code=job.exit_code,
                                   timed_out=job.timed_out, steps_left=self._steps_left())
        if observed.steps_left:
            return observed
        grade = self._finish(None, "budget")
        return observed.model_copy(update=self._ended(task, grade).model_dump(
            include={"done", "reward", "grade"}))

    @property
    def state(self) -> TaskState:
        return self._state

    def close(self) -> None:
        self._drop()

    def _live(self) -> tuple[Task, Sandbox]:
        if self._task is None:
            raise Conflict("no episode yet: reset first (reset(task_id=...) or reset())")
        if self._state.done or self._sandbox is None:
            raise Conflict(f"episode {self._state.episode_id} is over ({self._state.ended_by}"
                           f", reward {self._state.reward}): reset to start another")
        return self._task, self._sandbox

    def _steps_left(self) -> int:
        assert self._task is not None
        return max(0, self._task.budget.steps - self._state.step_count)

    def _finish(self, answer: str | None, ended_by: str) -> Grade:
        """Grade what the episode handed in, record it, delete the sandbox."""
        task, sandbox = self._live()
        self._state.done = True
        self._state.ended_by = ended_by
        try:
            submission = self.served.hooks.submission(task, sandbox, self._setup, answer)
            grade = task.grade(self.served.client, submission,
                               labels={"orchard-openenv": "grading", "episode":
                                       str(self._state.episode_id)})
        except BaseException:
            self._state.ended_by = "error"
            raise
        finally:
            self._drop()
        self._state.reward = grade.reward
        self._state.grade = grade.model_dump(mode="json")
        self.served.record(GradedEpisode(
            str(self._state.episode_id), task.instance_id, sandbox.id, self._state.step_count,
            ended_by, grade, time.monotonic() - self._started))
        return grade

    def _ended(self, task: Task, grade: Grade) -> TaskObservation:
        return TaskObservation(task_id=task.instance_id, done=True, reward=grade.reward,
                               grade=grade.model_dump(mode="json"),
                               steps_left=self._steps_left())

    def _drop(self) -> None:
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            # One whose ttl ran out is gone already: nothing is left to delete.
            with contextlib.suppress(NotFoundError):
                sandbox.delete()
