"""Measured value curves: V(s_t) as the share of fresh continuations from s_t that resolve.

For a key step t of a recorded rollout: replay the rollout's sandbox side up to s_t (every
action before the t-th model call) in a fresh sandbox once, fork it k times, hand each fork
and the conversation up to s_t to a continuation policy, and grade the patch it leaves in
another fresh sandbox. (``restore="replay"`` replays once per continuation instead, as before
forks existed.) The final state's value is the observed outcome. Between key steps the curve
is interpolated, as for the retrospective annotator.

    annotator = MonteCarloAnnotator(client, tasks, AgentContinuation(client, url, "policy"))
    curve = annotator.annotate(trajectory)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, Protocol

from orchard.env.client import OrchardError, Sandbox, SandboxClient
from orchard.env.schema import EventKind
from orchard.recipes.credit import ValueCurve, interpolate, key_steps
from orchard.recipes.trajectories import Trajectory
from orchard.rollout.replay import ReplayReport, replay
from orchard.rollout.trace import Trace
from orchard.tasks.grading import grade
from orchard.tasks.model import Task

MC_LABEL = "orchard.dev/mc-of"


class Continuation(Protocol):
    """Carries on from a restored state and returns the workspace's patch ("" if none)."""

    def __call__(self, task: Task, sandbox: Sandbox, history: list[dict[str, Any]],
                 sample: int) -> str: ...


def _clean(message: dict[str, Any]) -> dict[str, Any]:
    # The SWE schema pads every message with every key; chat servers want only the ones used.
    return {k: v for k, v in message.items() if v not in (None, [], "") or k == "content"}


class AgentContinuation:
    """mini-swe-agent (the same harness and config as the rollouts) continuing the recorded
    conversation with the model at ``model_url`` (an OpenAI base URL ending in /v1)."""

    def __init__(self, client: SandboxClient, model_url: str, model: str, *,
                 config: Mapping[str, Any] | None = None) -> None:
        self.client, self.model_url, self.model = client, model_url, model
        self.config = dict(config or {})

    def __call__(self, task: Task, sandbox: Sandbox, history: list[dict[str, Any]],
                 sample: int) -> str:
        from orchard.rollout.minisweagent import run_task

        base = sandbox.exec("git rev-parse HEAD", cwd=task.workdir, timeout=60).stdout.strip()
        done = run_task(
            task.problem_statement, orchestrator_url=str(self.client.base_url),
            orchestrator_api_key=self.client.api_key, model_base_url=self.model_url,
            model_name=self.model, sandbox_id=sandbox.id, cwd=task.workdir,
            step_limit=task.budget.steps, token_limit=task.budget.tokens,
            wall_time_limit=task.budget.wall_time, token_ids=False,
            config_overrides=self.config, history=[_clean(m) for m in history])
        if done["exit_status"] != "Submitted":
            return ""
        job = sandbox.exec(f"git add -A && git diff --cached --binary {base}",
                           cwd=task.workdir, timeout=120)
        return job.stdout if job.ok else ""


def state_seq(trace: Trace, step: int, sandbox_id: str) -> int | None:
    """The seq of the last event of ``sandbox_id`` before the ``step``-th model call (None:
    no event yet); replaying up to it restores the state s_step."""
    calls = [c for c in trace.model_calls
             if c.get("error") is None and str(c.get("endpoint", "")).endswith("completions")]
    if step >= len(calls):
        raise ValueError(f"step {step} is past the {len(calls)} model calls of the trace of "
                         f"{trace.rollout_id}")
    start = float(calls[step]["started_at"])
    before = [e.seq for e in trace.sandbox_events
              if e.sandbox_id == sandbox_id and e.time < start]
    return max(before) if before else None


def rollout_sandbox(trace: Trace) -> str:
    """The rollout's own sandbox: the first one the trace created."""
    for event in sorted(trace.sandbox_events, key=lambda e: e.seq):
        if event.kind == EventKind.created:
            return event.sandbox_id
    raise ValueError(f"the trace of {trace.rollout_id} created no sandbox; nothing to replay")


class MonteCarloAnnotator:
    """V(s_t) measured by ``k`` continuations from each key state (see the module doc)."""

    source = "monte_carlo"

    def __init__(self, client: SandboxClient, tasks: Mapping[str, Task] | Sequence[Task],
                 continuation: Continuation, *, k: int = 4, max_points: int = 8,
                 restore: Literal["fork", "replay"] = "fork") -> None:
        if k < 1:
            raise ValueError("k (continuations per key state) must be >= 1")
        if restore not in ("fork", "replay"):
            raise ValueError(f"restore must be 'fork' or 'replay', not {restore!r}")
        self.client, self.continuation, self.k, self.max_points = client, continuation, k, \
            max_points
        self.restore = restore
        self.tasks = dict(tasks) if isinstance(tasks, Mapping) else {
            t.instance_id: t for t in tasks}

    def value(self, traj: Trajectory, trace: Trace, step: int) -> tuple[float, list[str]]:
        """The share of ``k`` continuations from s_step that resolve, and their outcomes."""
        task = self.tasks.get(traj.instance_id)
        if task is None:
            raise ValueError(f"no task {traj.instance_id!r} among the annotator's tasks")
        sid = rollout_sandbox(trace)
        seq = state_seq(trace, step, sid)
        history = traj.messages[:traj.steps[step]]
        labels = {MC_LABEL: traj.rollout_id}
        outcomes = []
        for sample, sandbox in enumerate(self._states(trace, sid, seq, step, labels)):
            try:
                patch = self.continuation(task, sandbox, history, sample)
            finally:
                _delete(self.client, [sandbox.id])
            outcomes.append(grade(self.client, task, patch, labels=labels).outcome)
        return sum(o == "resolved" for o in outcomes) / self.k, outcomes

    def _states(self, trace: Trace, sid: str, seq: int | None, step: int,
                labels: dict[str, str]) -> Iterator[Sandbox]:
        """k sandboxes in the state s_step, each the caller's to delete: forks of one replay,
        or one replay each."""
        if self.restore == "replay":
            for _ in range(self.k):
                yield self._replayed(trace, sid, seq, step, labels)
            return
        source = self._replayed(trace, sid, seq, step, labels)
        try:
            pending = source.fork(self.k, labels=labels)
        finally:
            _delete(self.client, [source.id])
        try:
            while pending:
                yield pending.pop(0)
        finally:  # the caller stopped early: the forks it never got are ours to delete
            _delete(self.client, [f.id for f in pending])

    def _replayed(self, trace: Trace, sid: str, seq: int | None, step: int,
                  labels: dict[str, str]) -> Sandbox:
        report = replay(trace, self.client, sandbox_id=sid, until=seq, keep=True,
                        labels=labels)
        if broken := _broken(report):
            _delete(self.client, report.sandbox_ids.values())
            raise RuntimeError(f"replaying {trace.rollout_id} to step {step} did not restore "
                               f"its state: {broken}")
        return self.client.get_sandbox(report.sandbox_ids[sid])

    def annotate(self, traj: Trajectory) -> ValueCurve:
        trace = traj.trace()
        n_steps = len(traj.steps)
        keys = key_steps(n_steps, self.max_points)
        points: dict[int, float] = {}
        detail: dict[str, Any] = {"k": self.k, "outcomes": {}}
        for step in keys:
            if step == n_steps:  # the finished rollout: its outcome is observed
                points[step] = 1.0 if traj.resolved else 0.0
                continue
            points[step], detail["outcomes"][str(step)] = self.value(traj, trace, step)
        return ValueCurve(values=interpolate(points, n_steps + 1), key_steps=keys,
                          source=self.source, detail=detail)


def _broken(report: ReplayReport) -> str:
    """Why a replay did not restore the state, or "". Output may differ (the host name is the
    sandbox's id, timestamps move); a skipped action or another exit code is a different
    state."""
    for step in report.steps:
        if step.status == "skipped":
            return f"event {step.seq} ({step.kind.value}) was skipped: {step.detail}"
        if step.kind == EventKind.exec and (step.original.get("exit_code")
                                            != (step.replayed or {}).get("exit_code")):
            return (f"event {step.seq} exited {(step.replayed or {}).get('exit_code')}, "
                    f"not {step.original.get('exit_code')}")
    return ""


def _delete(client: SandboxClient, ids: Any) -> None:
    for sid in ids:
        with contextlib.suppress(OrchardError):
            client.delete_sandbox(sid)
