"""Measured value curves: V(s_t) as the share of fresh continuations from s_t that resolve.

For a key step t of a recorded rollout: replay the rollout's sandbox side up to s_t (every
action before the t-th model call) in a fresh sandbox once, fork it k times, hand each fork
and the conversation up to s_t to a continuation policy, and grade where it ends. (With
``restore="replay"`` each continuation gets a replay of its own, as before forks existed: a
web task needs that, since a fork keeps the files but not the browser's page.) The final
state's value is the observed outcome. Between key steps the curve is interpolated, as for the
retrospective annotator.

    annotator = MonteCarloAnnotator(client, tasks, AgentContinuation(client, url, "policy"))
    curve = annotator.annotate(trajectory)

Each domain's continuation (``AgentContinuation`` for SWE tasks, ``BrowserContinuation``,
``AssistantContinuation``) lives with it, in ``orchard.domains.<name>.montecarlo``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

from orchard.env.client import Sandbox, SandboxClient
from orchard.recipes.credit import ValueCurve, interpolate, key_steps
from orchard.recipes.trajectories import Trajectory
from orchard.rollout.traces.branch import branch, delete_all, restore
from orchard.rollout.traces.trace import Trace
from orchard.tasks.protocol import Task

MC_LABEL = "orchard.dev/mc-of"


class Continuation(Protocol):
    """Carries on from a restored state and returns the graded outcome ("resolved", ...);
    sandboxes it makes for grading carry ``labels``."""

    def __call__(self, task: Any, sandbox: Sandbox, history: list[dict[str, Any]],
                 sample: int, labels: dict[str, str]) -> str: ...


def clean_message(message: dict[str, Any]) -> dict[str, Any]:
    """A recorded message as a chat server takes it back: the SWE schema pads every message
    with every key, and servers want only the ones used."""
    return {k: v for k, v in message.items() if v not in (None, [], "") or k == "content"}


class MonteCarloAnnotator:
    """V(s_t) measured by ``k`` continuations from each key state (see the module doc)."""

    source = "monte_carlo"

    def __init__(self, client: SandboxClient,
                 tasks: Mapping[str, Task] | Sequence[Task],
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
        history = traj.messages[:traj.steps[step]]
        labels = {MC_LABEL: traj.rollout_id}
        # Sites, a browser and its page are processes: only a live fork keeps them.
        forks = (branch(trace, self.client, step, self.k, labels=labels,
                        memory=task.sandbox_spec().served)
                 if self.restore == "fork" else [])
        outcomes: list[str] = []
        try:
            for sample in range(self.k):
                sandbox = forks[sample] if forks else restore(trace, self.client, step,
                                                              labels=labels)
                try:
                    outcomes.append(self.continuation(task, sandbox, history, sample, labels))
                finally:
                    delete_all(self.client, [sandbox.id])
        except BaseException:  # the forks not reached yet are ours to delete
            delete_all(self.client, [f.id for f in forks[len(outcomes) + 1:]])
            raise
        return sum(o == "resolved" for o in outcomes) / self.k, outcomes

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

