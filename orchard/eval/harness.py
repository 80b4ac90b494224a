"""Harnesses: what produces a rollout's patch. A harness gets a :class:`RolloutContext` (the
task, a prepared sandbox on demand, the model URL to call) and returns a :class:`HarnessResult`.

    class Harness(Protocol):
        name: str
        model_upstream: str | None   # the model server the runner records calls to, or None
        def run(self, ctx: RolloutContext) -> HarnessResult: ...

A harness may also be a context manager (the teacher starts its model server in ``__enter__``).
Bundled: ``oracle`` (submits the gold patch), ``mini-swe-agent`` (any OpenAI-compatible model)
and ``teacher`` (mini-swe-agent driven by the scripted teacher model, which solves a chosen
share of the tasks).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Self

from pydantic import BaseModel

from orchard.env.client import Sandbox, SandboxClient
from orchard.tasks.assistant.model import AssistantTask
from orchard.tasks.model import Task
from orchard.tasks.web.model import WebTask
from orchard.tasks.workspace import Workspace, open_task_sandbox, prepare_workspace
from orchard.testing.policies import stable_share

PATCH_LIMIT = 8 << 20
SUBMIT_COMMAND = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"

# The key of HarnessResult.detail under which a harness hands over the grade it made in the
# rollout's own sandbox (web and assistant tasks: the state to judge lives there).
SANDBOX_GRADE = "sandbox_grade"
# And the rubric judge's exchanges and, when it gave no verdict, why (assistant tasks).
JUDGE_CALLS = "judge_calls"
JUDGE_FAILURE = "judge_failure"
# A task of any domain: software engineering, web, assistant.
AnyTask = Task | WebTask | AssistantTask

class HarnessError(RuntimeError):
    """The harness itself failed (not the environment, not the model)."""


class HarnessResult(BaseModel):
    exit_status: str
    """"Submitted", or why the harness stopped ("LimitsExceeded", "TimeExceeded", ...)."""
    patch: str = ""
    """The submission: the workspace's diff against the base commit when submitted, else ""."""
    n_steps: int = 0
    n_tokens: int = 0
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

    task: AnyTask
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
    workspace: Workspace | None = field(default=None, repr=False)

    @contextlib.contextmanager
    def timed(self) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
        finally:
            self.env_seconds += time.monotonic() - start

    @contextlib.contextmanager
    def sandbox(self) -> Iterator[Sandbox]:
        """A sandbox with the task's repository ready in ``task.workdir``; deleted after."""
        with self.timed():
            sandbox = open_task_sandbox(self.client, self.task, labels=self.labels,
                                        session=self.rollout_id, ttl=self.sandbox_timeout,
                                        cpu=self.cpu, memory=self.memory)
        try:
            with self.timed():
                self.heartbeats.add(sandbox)
                self.workspace = prepare_workspace(sandbox, self.task)
            yield sandbox
        finally:
            self.heartbeats.discard(sandbox.id)
            with self.timed(), contextlib.suppress(Exception):
                sandbox.delete()

    @contextlib.contextmanager
    def web_sandbox(self, *, model_proxy: bool = False) -> Iterator[Sandbox]:
        """A sandbox for a web or assistant task (its sites or services are the harness's to
        start); deleted after. ``model_proxy``: a harness inside it reaches the orchestrator's
        recording proxy (and, its network blocked, nothing else)."""
        with self.timed():
            sandbox = self.client.create_sandbox(
                self.task.image, labels=self.labels, session=self.rollout_id,
                ttl=self.sandbox_timeout, cpu=self.cpu, memory=self.memory,
                block_network=not getattr(self.task, "live", False), model_proxy=model_proxy)
        try:
            with self.timed():
                self.heartbeats.add(sandbox)
            yield sandbox
        finally:
            self.heartbeats.discard(sandbox.id)
            with self.timed(), contextlib.suppress(Exception):
                sandbox.delete()

    def final_patch(self, sandbox: Sandbox) -> str:
        """Everything changed in the workspace since the base commit, new files included."""
        base = self.workspace.base_commit if self.workspace else "HEAD"
        with self.timed():
            job = sandbox.exec(f"git add -A && git diff --cached --binary {base}",
                               cwd=self.task.workdir, timeout=120,
                               max_output_bytes=PATCH_LIMIT)
        if not job.ok or job.stdout_dropped:
            raise HarnessError(
                f"could not read the patch from sandbox {sandbox.id}: "
                + (f"it is over {PATCH_LIMIT} bytes" if job.stdout_dropped
                   else f"git exited {job.exit_code}: {job.stderr[-500:]}"))
        return job.stdout


class Harness(Protocol):
    name: str
    model_upstream: str | None

    def run(self, ctx: RolloutContext) -> HarnessResult: ...


class OracleHarness:
    """Applies the gold patch in the rollout's sandbox and submits the resulting diff: checks
    a task set end to end and measures the environment's own cost."""

    name = "oracle"
    model_upstream = None

    def run(self, ctx: RolloutContext) -> HarnessResult:
        with ctx.sandbox() as sandbox:
            with ctx.timed():
                applied = sandbox.apply_patch(ctx.task.patch, cwd=ctx.task.workdir)
            if not applied.success:
                raise HarnessError(f"the gold patch of {ctx.task.instance_id} does not apply "
                                   f"to its repository: {'; '.join(applied.attempts)}")
            return HarnessResult(exit_status="Submitted", patch=ctx.final_patch(sandbox),
                                 n_steps=1)


class MiniSweAgentHarness:
    """mini-swe-agent's DefaultAgent (its bundled tool-calling config) on the rollout's sandbox,
    calling ``model`` at the rollout's model URL, within the task's budget."""

    name = "mini-swe-agent"

    def __init__(self, model_url: str, model: str, *, token_ids: bool = True,
                 config: Mapping[str, Any] | None = None,
                 render_with: str | Path | None = None) -> None:
        self.model_upstream: str | None = model_url
        self.model = model
        self.token_ids = token_ids
        self.config = dict(config or {})
        self.render_with = render_with
        """A tokenizer for the recording proxy to render chat with, for a model server that
        only takes token-id prompts on /v1/completions (the policy server, vLLM)."""

    def run(self, ctx: RolloutContext) -> HarnessResult:
        from orchard.rollout.agents.minisweagent import run_task

        if ctx.model_url is None:
            raise HarnessError("mini-swe-agent needs a model URL; the runner gives the "
                               "recording proxy's")
        budget = ctx.task.budget
        trajectory = (ctx.trajectory_dir / f"{ctx.rollout_id}.traj.json"
                      if ctx.trajectory_dir else None)
        with ctx.sandbox() as sandbox:
            result = run_task(
                ctx.task.problem_statement, orchestrator_url=str(ctx.client.base_url),
                orchestrator_api_key=ctx.client.api_key, model_base_url=ctx.model_url,
                model_name=self.model, session=ctx.rollout_id, sandbox_id=sandbox.id,
                cwd=ctx.task.workdir, step_limit=budget.steps, token_limit=budget.tokens,
                wall_time_limit=budget.wall_time, token_ids=self.token_ids,
                trajectory_path=trajectory, config_overrides=self.config)
            ctx.env_seconds += result["exec_seconds"]
            submitted = result["exit_status"] == "Submitted"
            return HarnessResult(
                exit_status=result["exit_status"] or "unknown",
                patch=ctx.final_patch(sandbox) if submitted else "",
                n_steps=result["n_steps"], n_tokens=result["n_tokens"])


def _stable_rank(instance_id: str) -> str:
    return hashlib.sha256(instance_id.encode()).hexdigest()


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


class TeacherHarness(ScriptedTeacher, MiniSweAgentHarness):
    """mini-swe-agent driven by the scripted teacher model (a real OpenAI-compatible server
    with a real tokenizer). For the tasks it is told to solve it applies the gold patch with a
    bash tool call and submits; for the others it looks around and submits nothing. So the
    resolved rate of a run is known in advance: ``solve`` (a share of the tasks, picked by a
    stable hash of their ids, or a set of ids).

    With ``per_sample`` (a float ``solve``, tasks with scripts in ``metadata["teacher"]``),
    each rollout draws its script instead: the solving one with probability ``solve``, else
    one of the failing ones. Samples of one task then differ, as a sampled policy's do."""

    name = "teacher"

    def __init__(self, tasks: Sequence[Task], solve: float | Sequence[str] = 1.0, *,
                 config: Mapping[str, Any] | None = None, per_sample: bool = False,
                 seed: int = 0) -> None:
        super().__init__("", "teacher", config=config)
        self.tasks = {t.instance_id: t for t in tasks}
        if per_sample and not isinstance(solve, float | int):
            raise ValueError("per_sample draws each rollout's script with probability solve: "
                             "give solve as a float, not a set of task ids")
        if isinstance(solve, float | int):
            self.solved = stable_share(self.tasks, float(solve))
        else:
            self.solved = set(solve)
        self.solve = float(solve) if per_sample else None
        self._rng = random.Random(seed)

    def _task_of(self, messages: list[dict[str, Any]]) -> Task:
        first = next((str(m.get("content")) for m in messages if m["role"] == "user"), "")
        for task in self.tasks.values():
            if task.problem_statement.strip() in first:
                return task
        raise ValueError("the teacher knows no task with this problem statement")

    def _drawn(self, scripts: Mapping[str, Any], messages: list[dict[str, Any]]) -> Any:
        """A script drawn from the per-sample prior, given the commands run so far: drawing
        again at each turn among the scripts that agree with them gives each rollout the
        prior's odds of every whole script."""
        assert self.solve is not None
        fails = scripts["fail"]
        weighted = [(self.solve, scripts["solve"])] + [
            ((1 - self.solve) / len(fails), f) for f in fails]
        done = [_command(m) for m in messages if m["role"] == "assistant"]
        agree = [(w, s) for w, s in weighted if w > 0 and all(
            s[min(i, len(s) - 1)][1] == c for i, c in enumerate(done))] or weighted
        return self._rng.choices([s for _, s in agree], [w for w, _ in agree])[0]

    def policy(self, messages: list[dict[str, Any]], tools: Any) -> Any:
        from orchard.testing.teacher import Reply, ToolCall

        task = self._task_of(messages)
        turn = sum(1 for m in messages if m["role"] == "assistant")
        scripts = task.metadata.get("teacher")
        if scripts and self.solve is not None:
            script = self._drawn(scripts, messages)
        elif scripts:
            # The task set says how its teacher acts; failing tasks rotate through its
            # failing scripts by the same stable rank.
            fails = scripts["fail"]
            script = (scripts["solve"] if task.instance_id in self.solved
                      else fails[int(_stable_rank(task.instance_id), 16) % len(fails)])
        elif task.instance_id in self.solved:
            script = [("I will apply the fix.",
                       f"git apply <<'ORCHARD_PATCH_EOF'\n{task.patch}ORCHARD_PATCH_EOF"),
                      ("The fix is in; submitting.", SUBMIT_COMMAND)]
        else:
            script = [("Let me look at the repository.", "git status --short && ls"),
                      ("I cannot find the problem; submitting.", SUBMIT_COMMAND)]
        thought, command = script[min(turn, len(script) - 1)]
        return Reply(content=thought, tool_calls=[ToolCall("bash", {"command": command})])


def _command(message: Mapping[str, Any]) -> str | None:
    """The bash command of an assistant message's first tool call, if any."""
    calls = message.get("tool_calls") or []
    if not calls:
        return None
    arguments = calls[0]["function"]["arguments"]
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    return arguments.get("command") if isinstance(arguments, dict) else None


HARNESSES = ("oracle", "teacher", "mini-swe-agent")
