"""Results of a run: one :class:`RolloutResult` per rollout, summed up per task and per run
(resolved rate, unbiased pass@k, mean steps/tokens/time, failure classes), written as JSONL,
Parquet and ``results.json``, and printed as a table."""

from __future__ import annotations

import json
import math
import os
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from statistics import mean, median
from typing import Any, Literal

from pydantic import BaseModel, Field, SerializeAsAny

from orchard.tasks.protocol import Grade

FailureClass = Literal["environment", "model", "task", "harness", "grading", "judge"]


class Failure(BaseModel):
    cls: FailureClass
    """environment: no sandbox / agent unreachable (retried with more resources); model: the
    model server failed (never retried); task: the repository or pre_commands failed;
    harness: the harness raised; grading: the grader's sandbox failed after every retry;
    judge: the rubric judge was unreachable, refused, or answered nonsense (the checks' grade
    stands; the process reward is not given)."""
    type: str
    message: str


class Timings(BaseModel):
    total: float = 0.0
    harness: float = 0.0
    """The harness's wall time, sandbox set-up included."""
    env: float = 0.0
    """Inside the environment: sandbox set-up/teardown, execs, patch reading, grading."""
    grading: float = 0.0


class RolloutResult(BaseModel):
    run_id: str
    rollout_id: str
    instance_id: str
    sample: int
    harness: str
    attempts: int = 1
    exit_status: str = ""
    patch: str = ""
    resolved: bool = False
    reward: float = -1.0
    grade: SerializeAsAny[Grade] | None = None
    """The domain's grade as the task made it. Read back from a file, it is the domain's kind
    again (``Grade`` picks the kind whose fields it has); a kind no loaded domain knows stays
    a plain ``Grade`` with its fields kept as extras."""
    failure: Failure | None = None
    n_steps: int = 0
    n_tokens: int = 0
    model_calls: int = 0
    timings: Timings = Field(default_factory=Timings)
    started_at: float = 0.0
    ended_at: float = 0.0
    trace: str | None = Field(None, description="The trace file, relative to the run dir.")

    @property
    def key(self) -> tuple[str, int]:
        return self.instance_id, self.sample


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator of pass@k from n samples with c correct (Chen et al., 2021):
    1 - C(n-c, k) / C(n, k), computed as a product to stay exact for large n."""
    if not 0 < k <= n:
        raise ValueError(f"pass@k needs 0 < k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def ks_for(n: int) -> list[int]:
    return [k for k in (1, 2, 5, 10, 20, 50, 100) if k <= n]


def _means(rows: Sequence[RolloutResult]) -> dict[str, float]:
    return {"mean_steps": mean(r.n_steps for r in rows),
            "mean_tokens": mean(r.n_tokens for r in rows),
            "mean_seconds": mean(r.timings.total for r in rows)}


def summarize(results: Iterable[RolloutResult], *, n: int,
              wall_seconds: float | None = None) -> dict[str, Any]:
    """Per-task and overall figures. pass@k averages over tasks, each with its own n."""
    by_task: dict[str, list[RolloutResult]] = defaultdict(list)
    rows = sorted(results, key=lambda r: r.key)
    for r in rows:
        by_task[r.instance_id].append(r)
    tasks = {}
    for tid, rs in by_task.items():
        c = sum(r.resolved for r in rs)
        tasks[tid] = {"n": len(rs), "resolved": c, "resolved_rate": c / len(rs),
                      "pass_at_k": {str(k): pass_at_k(len(rs), c, k) for k in ks_for(len(rs))},
                      **_means(rs),
                      "failures": dict(Counter(r.failure.cls for r in rs if r.failure))}
    overall: dict[str, Any] = {"tasks": len(tasks), "rollouts": len(rows), "n": n}
    if rows:
        overall |= {
            "resolved": sum(r.resolved for r in rows),
            "resolved_rate": sum(r.resolved for r in rows) / len(rows),
            "pass_at_k": {str(k): mean(t["pass_at_k"][str(k)] for t in tasks.values()
                                       if str(k) in t["pass_at_k"]) for k in ks_for(n)},
            **_means(rows),
            "failures": dict(Counter(r.failure.cls for r in rows if r.failure)),
            "outcomes": dict(Counter(r.grade.outcome if r.grade else "not_graded"
                                     for r in rows)),
            "exit_statuses": dict(Counter(r.exit_status or "none" for r in rows)),
            "median_grading_seconds": median(r.timings.grading for r in rows),
            "env_share": (sum(r.timings.env for r in rows)
                          / max(1e-9, sum(r.timings.total for r in rows))),
        }
    if wall_seconds is not None:
        overall["wall_seconds"] = wall_seconds
        overall["rollouts_per_minute"] = len(rows) / wall_seconds * 60 if wall_seconds else 0
    return {"overall": overall, "tasks": tasks}


# --- files --------------------------------------------------------------------------------------

ROLLOUTS_FILE = "rollouts.jsonl"


def append_result(run_dir: Path, result: RolloutResult) -> None:
    """One line per finished rollout, on disk before the next starts: what a resume trusts."""
    with open(run_dir / ROLLOUTS_FILE, "a", encoding="utf-8") as f:
        f.write(result.model_dump_json() + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_results(run_dir: str | Path) -> list[RolloutResult]:
    """Finished rollouts; a last line cut short by a crash is ignored (that rollout reruns)."""
    path = Path(run_dir) / ROLLOUTS_FILE
    if not path.exists():
        return []
    out: dict[tuple[str, int], RolloutResult] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            r = RolloutResult.model_validate_json(line)
        except ValueError:
            continue
        out[r.key] = r
    return list(out.values())


def flat_row(r: RolloutResult) -> dict[str, Any]:
    g = r.grade
    return {
        "run_id": r.run_id, "rollout_id": r.rollout_id, "instance_id": r.instance_id,
        "sample": r.sample, "harness": r.harness, "attempts": r.attempts,
        "exit_status": r.exit_status, "resolved": r.resolved, "reward": r.reward,
        "outcome": g.outcome if g else None, "reason": g.reason if g else None,
        "patch_method": getattr(g, "patch_method", None),
        "f2p_total": getattr(g, "f2p_total", None), "f2p_passed": getattr(g, "f2p_passed", None),
        "p2p_total": getattr(g, "p2p_total", None), "p2p_passed": getattr(g, "p2p_passed", None),
        "answer": getattr(g, "answer", None),
        "failure_class": r.failure.cls if r.failure else None,
        "failure": r.failure.message if r.failure else None,
        "n_steps": r.n_steps, "n_tokens": r.n_tokens, "model_calls": r.model_calls,
        "seconds": r.timings.total, "harness_seconds": r.timings.harness,
        "env_seconds": r.timings.env, "grading_seconds": r.timings.grading,
        "patch": r.patch, "trace": r.trace,
    }


def write_outputs(run_dir: Path, results: Sequence[RolloutResult], summary: dict[str, Any],
                  config: dict[str, Any]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [flat_row(r) for r in sorted(results, key=lambda r: r.key)]
    if rows:
        pq.write_table(pa.Table.from_pylist(rows), run_dir / "results.parquet")
    tmp = run_dir / "results.json.tmp"
    tmp.write_text(json.dumps({"run": config, **summary}, indent=2), encoding="utf-8")
    tmp.replace(run_dir / "results.json")


def load_summary(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / "results.json"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} holds no results.json: is it the --out of an "
                                "`orchard eval` run that finished?")
    return json.loads(path.read_text(encoding="utf-8"))
