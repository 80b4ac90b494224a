"""Evaluation, for tasks of any domain (``orchard.tasks.Task``): the harness protocol, the
rollout runner (tasks x harness x n, concurrency, retries, resume, heartbeats), results
(resolved rate, pass@k, failure classes) and reports comparing runs. Each domain's harnesses
live with it (``orchard.domains``, which also makes one by name)."""

from orchard.extras import require

# Before any third-party import: a missing one is then a one-line error naming its extra.
require("rollout", "tasks")

from orchard.eval.evaluate import evaluate
from orchard.eval.harness import (
    Harness,
    HarnessError,
    HarnessResult,
    Heartbeats,
    RolloutContext,
    ScriptedTeacher,
)
from orchard.eval.paired import (
    PairedDifference,
    paired_difference,
    pooled_difference,
    rollout_outcomes,
)
from orchard.eval.report import compare_tables, draw_chart, run_table
from orchard.eval.results import (
    Failure,
    RolloutResult,
    load_summary,
    pass_at_k,
    read_results,
    summarize,
)
from orchard.eval.runner import RunConfig, RunMismatch, Runner, classify

__all__ = [
    "Failure",
    "Harness",
    "HarnessError",
    "HarnessResult",
    "Heartbeats",
    "PairedDifference",
    "RolloutContext",
    "RolloutResult",
    "RunConfig",
    "RunMismatch",
    "Runner",
    "ScriptedTeacher",
    "classify",
    "compare_tables",
    "draw_chart",
    "evaluate",
    "load_summary",
    "paired_difference",
    "pass_at_k",
    "pooled_difference",
    "read_results",
    "rollout_outcomes",
    "run_table",
    "summarize",
]
