"""Evaluation: harnesses (oracle, mini-swe-agent, the scripted teacher), the rollout runner
(tasks x harness x n, concurrency, retries, resume, heartbeats), results (resolved rate,
pass@k, failure classes) and reports comparing runs."""

from orchard.extras import require

# Before any third-party import: a missing one is then a one-line error naming its extra.
require("rollout", "tasks")

from orchard.eval.evaluate import evaluate, make_harness
from orchard.eval.harness import (
    HARNESSES,
    Harness,
    HarnessError,
    HarnessResult,
    Heartbeats,
    MiniSweAgentHarness,
    OracleHarness,
    RolloutContext,
    TeacherHarness,
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
    "HARNESSES",
    "Failure",
    "Harness",
    "HarnessError",
    "HarnessResult",
    "Heartbeats",
    "MiniSweAgentHarness",
    "OracleHarness",
    "RolloutContext",
    "RolloutResult",
    "RunConfig",
    "RunMismatch",
    "Runner",
    "TeacherHarness",
    "classify",
    "compare_tables",
    "draw_chart",
    "evaluate",
    "load_summary",
    "make_harness",
    "pass_at_k",
    "read_results",
    "run_table",
    "summarize",
]
