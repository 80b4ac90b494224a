"""The rollout runner: tasks x harness x n samples, each rollout in its own sandbox, each
patch graded in a fresh one, results on disk as they finish.

A run lives in its output directory: ``run.json`` (its id and settings), ``rollouts.jsonl``
(one line per finished rollout), ``traces/`` (one trace per rollout), ``calls/`` (the
recording proxy's store) and, at the end, ``results.json`` and ``results.parquet``. Running
again with the same directory resumes: finished rollouts are kept, and sandboxes a dead
runner left are deleted first (the orchestrator also reaps them on its own once their
heartbeats stop).

    with SandboxClient(url) as client:
        summary = Runner(RunConfig(out=Path("runs/oracle")), tasks, OracleHarness(), client).run()
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from orchard.env.client import InvalidRequest, OrchardError, SandboxClient
from orchard.env.quantities import parse_cpu, parse_memory
from orchard.eval.harness import (
    JUDGE_CALLS,
    JUDGE_FAILURE,
    Harness,
    HarnessError,
    HarnessResult,
    Heartbeats,
    RolloutContext,
)
from orchard.eval.results import (
    Failure,
    FailureClass,
    RolloutResult,
    append_result,
    read_results,
    summarize,
    write_outputs,
)
from orchard.rollout.seeds import rollout_seed
from orchard.tasks.protocol import Submission, Task, TaskSetupError

log = logging.getLogger(__name__)

RUN_LABEL = "orchard.dev/run"
ROLLOUT_LABEL = "orchard.dev/rollout"
TASK_LABEL = "orchard.dev/task"


class RunConfig(BaseModel):
    out: Path
    n: int = Field(1, ge=1, le=1000, description="Samples per task.")
    concurrency: int = Field(2, ge=1, le=1024)
    max_attempts: int = Field(3, ge=1, le=10, description="Per rollout, on environment "
                              "failures only; each retry doubles cpu and memory.")
    cpu: str = "1"
    memory: str = "2Gi"
    sandbox_grace: float = Field(600, ge=0, description="Seconds a rollout sandbox lives past "
                                 "the task's wall-time budget (set-up, patch reading).")
    heartbeat_interval: float = Field(30, gt=0, description="Seconds between a live "
                                      "sandbox's heartbeats; keep it well under the "
                                      "orchestrator's heartbeat_timeout (180 s by default).")
    grade: bool = True
    sampling_seed: int | None = Field(None, description="Common random numbers: each (task, "
                                      "sample) sends the same request seeds in every run with "
                                      "this value, so stages compare pairwise; None: the "
                                      "model server draws its own.")
    run_id: str | None = None
    settings: dict[str, Any] = Field(default_factory=dict, description="What identifies the "
                                     "run (task set, harness, model): a resume must match it.")


class RunMismatch(ValueError):
    """The output directory holds a different run."""


def classify(exc: BaseException) -> FailureClass:
    """Environment failures are retried; everything else is the rollout's result."""
    if isinstance(exc, TaskSetupError | InvalidRequest):
        return "task"  # the repository, pre_commands or image: the same on every retry
    if isinstance(exc, OrchardError):  # the SDK's, and the harness adapters' SandboxUnavailable
        return "environment"
    if type(exc).__module__.split(".")[0] in ("litellm", "openai", "httpx", "httpcore"):
        return "model"
    return "harness"


def _scaled(cpu: str, memory: str, attempt: int) -> tuple[str, str]:
    factor = 2 ** (attempt - 1)
    return f"{parse_cpu(cpu) * factor:g}", str(parse_memory(memory) * factor)


class Runner:
    def __init__(self, config: RunConfig, tasks: Sequence[Task], harness: Harness,
                 client: SandboxClient, *, proxy_url: str | None = None,
                 proxy_key: str | None = None,
                 on_result: Callable[[RolloutResult], None] | None = None,
                 on_start: Callable[[RolloutResult | None, int, int], None] | None = None) -> None:
        self.config = config
        self.tasks = list(tasks)
        self.harness = harness
        self.client = client
        self.proxy_url = proxy_url
        self.proxy_key = proxy_key  # the proxy's admin key: reading the calls takes it
        self.on_result = on_result
        self.on_start = on_start
        self.out = config.out
        self._lock = threading.Lock()
        self.run_id = self._open_run_dir()

    # --- the run directory ----------------------------------------------------------------

    def _open_run_dir(self) -> str:
        import json

        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "traces").mkdir(exist_ok=True)
        meta = self.out / "run.json"
        ids = [t.instance_id for t in self.tasks]
        wanted = {"settings": self.config.settings, "n": self.config.n, "tasks": ids,
                  "sampling_seed": self.config.sampling_seed}
        if meta.exists():
            saved = json.loads(meta.read_text(encoding="utf-8"))
            for key, value in wanted.items():
                if saved.get(key) != value:
                    raise RunMismatch(
                        f"{self.out} holds run {saved.get('run_id')} with other {key} "
                        f"({saved.get(key)!r:.200} here vs {value!r:.200} asked); resume it "
                        "with the same options, or give another --out")
            return str(saved["run_id"])
        run_id = self.config.run_id or f"r{uuid.uuid4().hex[:10]}"
        meta.write_text(json.dumps({"run_id": run_id, **wanted}, indent=2), encoding="utf-8")
        return run_id

    def reap_leftovers(self) -> int:
        """Delete this run's sandboxes that no live rollout holds (a dead runner's)."""
        n = 0
        for info in self.client.list_sandboxes(labels={RUN_LABEL: self.run_id}):
            with contextlib.suppress(OrchardError):
                self.client.delete_sandbox(info.sandbox_id)
                n += 1
        return n

    # --- running ----------------------------------------------------------------------------

    def pending(self, done: set[tuple[str, int]]) -> list[tuple[Task, int]]:
        return [(t, k) for k in range(self.config.n) for t in self.tasks
                if (t.instance_id, k) not in done]

    def run(self) -> dict[str, Any]:
        start = time.monotonic()
        finished = read_results(self.out)
        wanted = {(t.instance_id, k) for t in self.tasks for k in range(self.config.n)}
        finished = [r for r in finished if r.key in wanted]
        todo = self.pending({r.key for r in finished})
        reaped = self.reap_leftovers()
        if reaped:
            log.info("deleted %d sandboxes left by an earlier runner of run %s",
                     reaped, self.run_id)
        if self.on_start is not None:
            self.on_start(None, len(finished), len(wanted))
        with Heartbeats(self.config.heartbeat_interval) as beats, ThreadPoolExecutor(
                self.config.concurrency, thread_name_prefix="rollout") as pool:
            futures = [pool.submit(self.rollout, task, k, beats) for task, k in todo]
            try:
                for future in as_completed(futures):
                    result = future.result()
                    with self._lock:
                        append_result(self.out, result)
                        finished.append(result)
                    if self.on_result is not None:
                        self.on_result(result)
            except BaseException:
                for f in futures:
                    f.cancel()
                raise
            finally:
                self.reap_leftovers()
        summary = summarize(finished, n=self.config.n,
                            wall_seconds=time.monotonic() - start if todo else None)
        write_outputs(self.out, finished, summary, {"run_id": self.run_id,
                                                    "harness": self.harness.name,
                                                    "n": self.config.n,
                                                    **self.config.settings})
        return summary

    def rollout(self, task: Task, k: int, beats: Heartbeats) -> RolloutResult:
        """One rollout: the harness (retried on environment failures), then grading."""
        started = time.time()
        t0 = time.monotonic()
        result = RolloutResult(run_id=self.run_id, rollout_id="", instance_id=task.instance_id,
                               sample=k, harness=self.harness.name, started_at=started)
        outcome = None
        ctx = None
        for attempt in range(1, self.config.max_attempts + 1):
            cpu, memory = _scaled(self.config.cpu, self.config.memory, attempt)
            rollout_id = f"{self.run_id}.{task.instance_id}.{k}.{attempt}"
            ctx = RolloutContext(
                task=task, client=self.client, rollout_id=rollout_id,
                labels={RUN_LABEL: self.run_id, ROLLOUT_LABEL: rollout_id,
                        TASK_LABEL: task.instance_id, "orchard.dev/purpose": "rollout"},
                heartbeats=beats, cpu=cpu, memory=memory,
                sandbox_timeout=task.budget.wall_time + self.config.sandbox_grace,
                model_url=(f"{self.proxy_url.rstrip('/')}/s/{rollout_id}/v1"
                           if self.proxy_url else None),
                trajectory_dir=self.out / "traces",
                seed=(None if self.config.sampling_seed is None else
                      rollout_seed(self.config.sampling_seed, task.instance_id, k)))
            result.rollout_id, result.attempts = rollout_id, attempt
            h0 = time.monotonic()
            try:
                outcome = self.harness.run(ctx)
                result.failure = None
            except Exception as e:  # classified below: every failure lands in the results
                cls = classify(e)
                result.failure = Failure(cls=cls, type=type(e).__name__, message=str(e)[:2000])
                log.warning("rollout %s failed (%s): %s", rollout_id, cls, e)
            result.timings.harness += time.monotonic() - h0
            result.timings.env += ctx.env_seconds
            if result.failure is None or result.failure.cls != "environment":
                break
        if outcome is not None:
            result.exit_status = outcome.exit_status
            result.patch = outcome.patch
            result.n_steps, result.n_tokens = outcome.n_steps, outcome.n_tokens
        if self.config.grade and result.failure is None:
            self._grade(task, result, outcome)
        self._trace(result, outcome.detail.get(JUDGE_CALLS, []) if outcome else [])
        result.timings.total = time.monotonic() - t0
        result.ended_at = time.time()
        return result

    def _grade(self, task: Task, result: RolloutResult,
               outcome: HarnessResult | None) -> None:
        if task.graded_in_rollout:
            # Graded by the harness, in the rollout's sandbox, where the state to judge was.
            if outcome is not None and outcome.grade is not None:
                result.grade = outcome.grade
                result.resolved, result.reward = result.grade.resolved, result.grade.reward
            if outcome is not None and outcome.detail.get(JUDGE_FAILURE):
                result.failure = Failure(cls="judge", type="JudgeFailed",
                                         message=outcome.detail[JUDGE_FAILURE])
            return
        labels = {RUN_LABEL: self.run_id, ROLLOUT_LABEL: result.rollout_id,
                  TASK_LABEL: task.instance_id}
        g0 = time.monotonic()
        for attempt in range(1, self.config.max_attempts + 1):
            try:
                result.grade = task.grade(self.client, Submission(patch=result.patch),
                                          labels=labels)
                break
            except OrchardError as e:
                if attempt == self.config.max_attempts:
                    result.failure = Failure(cls="grading", type=type(e).__name__,
                                             message=f"grading failed {attempt} times: {e}")
        spent = time.monotonic() - g0
        result.timings.grading = spent
        result.timings.env += spent
        if result.grade is not None:
            result.resolved, result.reward = result.grade.resolved, result.grade.reward

    def _trace(self, result: RolloutResult, judge_calls: list[dict[str, Any]]) -> None:
        from orchard.rollout.traces.trace import collect_trace

        try:
            trace = collect_trace(result.rollout_id, self.client, self.proxy_url, metadata={
                "run_id": self.run_id, "instance_id": result.instance_id,
                "sample": result.sample, "harness": result.harness,
                "reward": result.reward, "resolved": result.resolved},
                proxy_key=self.proxy_key)
        except (OrchardError, OSError, ValueError) as e:
            log.warning("no trace for %s: %s", result.rollout_id, e)
            return
        trace.judge_calls = judge_calls
        result.model_calls = len(trace.model_calls)
        # The proxy saw every call, including ones the harness dropped (a reply that failed
        # its format check never reaches the agent's own count).
        spent = sum(int(((c.get("response") or {}).get("usage") or {}).get("total_tokens") or 0)
                    for c in trace.model_calls)
        result.n_tokens = max(result.n_tokens, spent)
        path = Path("traces") / f"{result.rollout_id}.json"
        (self.out / path).write_text(trace.model_dump_json(), encoding="utf-8")
        result.trace = str(path)


__all__ = ["HarnessError", "RunConfig", "RunMismatch", "Runner", "classify"]
