"""Trajectories: what the recipes learn from. One graded rollout of an eval run, as the
conversation the harness held with the model (the SWE schema's messages), its outcome and the
place of its trace, so a recipe can go back to the exact tokens or replay the sandbox side.

Steps are the assistant turns: step t is the t-th assistant message, s_t the history before it,
s_T the finished rollout. A value curve over a trajectory has T + 1 points, V(s_0) .. V(s_T).

    trajectories = load_trajectories("runs/teacher")
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchard.eval.results import RolloutResult, read_results
from orchard.rollout.traces.export import swe_row
from orchard.rollout.traces.trace import Trace


@dataclass
class Trajectory:
    rollout_id: str
    instance_id: str
    messages: list[dict[str, Any]]
    """OpenAI-shaped: role, content, tool_calls (arguments as JSON strings), tool_call_id."""
    tools: list[dict[str, Any]]
    resolved: bool
    reward: float
    test_output: str = ""
    """The tail of the grading run's test output: what the gold tests said (for a web task,
    the checker's reason)."""
    trace_path: Path | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def steps(self) -> list[int]:
        """Indices into ``messages`` of the assistant turns, in order (step t is steps[t])."""
        return [i for i, m in enumerate(self.messages) if m["role"] == "assistant"]

    def trace(self) -> Trace:
        if self.trace_path is None:
            raise ValueError(f"rollout {self.rollout_id} has no trace file")
        return Trace.model_validate_json(self.trace_path.read_text(encoding="utf-8"))


def from_result(result: RolloutResult, run_dir: Path) -> Trajectory:
    """The trajectory of one rollout of the run in ``run_dir``; ValueError when the rollout
    has no trace or its trace no conversation (the harness never reached the model)."""
    if result.trace is None:
        raise ValueError(f"rollout {result.rollout_id} has no trace (failure: "
                         f"{result.failure.message if result.failure else 'none'})")
    path = run_dir / result.trace
    row = swe_row(Trace.model_validate_json(path.read_text(encoding="utf-8")))
    return Trajectory(
        rollout_id=result.rollout_id, instance_id=result.instance_id,
        messages=row["messages"], tools=json.loads(row["tools"]),
        resolved=result.resolved, reward=result.reward,
        # What judged it: the gold tests' output, or a web checker's reason.
        test_output=(getattr(result.grade, "test_output_tail", None) or result.grade.reason
                     if result.grade else ""),
        trace_path=path,
        metadata={"run_id": result.run_id, "sample": result.sample, "harness": result.harness,
                  "exit_status": result.exit_status, "patch": result.patch,
                  "outcome": result.grade.outcome if result.grade else None})


def iter_trajectories(run_dir: str | Path, *, skipped: list[tuple[str, str]] | None = None
                      ) -> Iterator[Trajectory]:
    """Every graded rollout of a run with a conversation; the others are skipped, and listed
    in ``skipped`` as (rollout id, why) when given."""
    run_dir = Path(run_dir)
    for result in read_results(run_dir):
        try:
            yield from_result(result, run_dir)
        except (ValueError, OSError) as e:
            if skipped is not None:
                skipped.append((result.rollout_id, str(e)))


def load_trajectories(*run_dirs: str | Path) -> list[Trajectory]:
    return [t for d in run_dirs for t in iter_trajectories(d)]
