"""Harnesses: what produces a rollout. A harness gets a :class:`RolloutContext` (the task, a
prepared sandbox on demand, the model URL to call) and returns a :class:`HarnessResult`.

    class Harness(Protocol):
        name: str
        model_upstream: str | None   # the model server the runner records calls to, or None
        def run(self, ctx: RolloutContext) -> HarnessResult: ...

A harness may also be a context manager (a scripted teacher starts its model server in
``__enter__``). Each domain's harnesses live with it (``orchard.domains.<name>.harness``);
``orchard.domains.harness`` makes one by name.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Self

from pydantic import BaseModel, SerializeAsAny

from orchard.env.client import Sandbox, SandboxClient
from orchard.tasks.images import sandbox_image
from orchard.tasks.protocol import Grade, Task

# The keys of HarnessResult.detail under which a harness hands over the rubric judge's
# exchanges and, when it gave no verdict, why (assistant tasks).
JUDGE_CALLS = "judge_calls"
JUDGE_FAILURE = "judge_failure"

class HarnessError(RuntimeError):
    """The harness itself failed (not the environment, not the model)."""


class HarnessResult(BaseModel):
    exit_status: str
    """"Submitted", or why the harness stopped ("LimitsExceeded", "TimeExceeded", ...)."""
    patch: str = ""
    """The submission: the workspace's diff against the base commit when submitted, else ""."""
    n_steps: int = 0
    n_tokens: int = 0
    grade: SerializeAsAny[Grade] | None = None
    """The grade the harness made in the rollout's own sandbox, for tasks whose state to judge
    lives there (``Task.graded_in_rollout``); None for the others, which the runner grades."""
    detail: dict[str, Any] = {}


class Heartbeats:
    """Beats every sandbox a run holds, so the orchestrator reaps them once the run dies
    (its ``heartbeat_timeout`` after the last beat) and never while it lives."""

    def __init__(self, interval: float = 30.0) -> None:
        self.interval = interval
        self._live: dict[str, Sandbox] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="heartbeats", daemon=True)

    def add(self, sandbox: Sandbox) -> None:
        sandbox.heartbeat()  # the first beat arms the orchestrator's heartbeat timeout
        with self._lock:
            self._live[sandbox.id] = sandbox

    def discard(self, sandbox_id: str) -> None:
        with self._lock:
            self._live.pop(sandbox_id, None)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                live = list(self._live.values())
            for sandbox in live:
                # A transient error costs one beat of many before the timeout; a gone sandbox
                # is the rollout's to notice.
                with contextlib.suppress(Exception):
                    sandbox.heartbeat()

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


@dataclass
class RolloutContext:
    """One attempt at one rollout, as the runner hands it to a harness."""

    task: Task
    client: SandboxClient
    rollout_id: str
    """The proxy session and the sandboxes' ``session``: joins the rollout's trace."""
    labels: dict[str, str]
    heartbeats: Heartbeats
    sandbox_timeout: float
    cpu: str | None = None
    memory: str | None = None
    model_url: str | None = None
    """OpenAI base URL for this rollout (the recording proxy's /s/<rollout_id>/v1)."""
    trajectory_dir: Path | None = None
    env_seconds: float = 0.0
    """Time spent setting up, reading and tearing down sandboxes; harness-side execs add to
    it through :meth:`timed`."""
    seed: int | None = None
    """The rollout's sampling seed (``orchard.rollout.seeds.rollout_seed``; the same for a
    (task, sample) at every stage of a run), for the harness to derive each model call's seed
    from with ``call_seed``; None: the run sets no seeds."""
    setup: Any = field(default=None, repr=False)
    """What ``task.set_up`` returned for the rollout's sandbox (a SWE task's workspace)."""

    @contextlib.contextmanager
    def timed(self) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
        finally:
            self.env_seconds += time.monotonic() - start

    @contextlib.contextmanager
    def sandbox(self, *, model_proxy: bool = False) -> Iterator[Sandbox]:
        """A sandbox as the task specifies it, set up by the task (a repository in its
        workdir, sites or services started); deleted after. ``model_proxy``: a harness inside
        it reaches the orchestrator's recording proxy (and, its network blocked, nothing
        else)."""
        spec = self.task.sandbox_spec()
        with self.timed():
            sandbox = self.client.create_sandbox(
                sandbox_image(self.client, spec.image), block_network=spec.block_network,
                cpu=self.cpu, memory=self.memory, ttl=self.sandbox_timeout, labels=self.labels,
                env=spec.env, session=self.rollout_id, model_proxy=model_proxy)
        try:
            with self.timed():
                self.heartbeats.add(sandbox)
                self.setup = self.task.set_up(sandbox)
            yield sandbox
        finally:
            self.heartbeats.discard(sandbox.id)
            with self.timed(), contextlib.suppress(Exception):
                sandbox.delete()


class Harness(Protocol):
    name: str
    model_upstream: str | None

    def run(self, ctx: RolloutContext) -> HarnessResult: ...


class ScriptedTeacher:
    """A harness whose model is the scripted teacher: while the harness is entered, its
    ``policy`` is served as a real OpenAI-compatible model (with a real tokenizer), and that
    server is the harness's ``model_upstream``."""

    model: str
    model_upstream: str | None
    _server: Any = None

    def policy(self, messages: list[dict[str, Any]], tools: Any) -> Any:
        raise NotImplementedError

    def __enter__(self) -> Self:
        from orchard.rollout.tokenizer import TEST_TOKENIZER, load_tokenizer
        from orchard.testing.teacher import FunctionPolicy, TeacherServer

        self._server = TeacherServer(FunctionPolicy(self.policy), load_tokenizer(TEST_TOKENIZER),
                                     model_name=self.model)
        self.model_upstream = self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
