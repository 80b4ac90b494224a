"""Harnesses of the software-engineering domain: ``oracle`` (submits the gold patch),
``mini-swe-agent`` (any OpenAI-compatible model) and ``teacher`` (mini-swe-agent driven by the
scripted teacher model, which solves a chosen share of the tasks). Each hands in the
workspace's diff against its base commit; the runner grades it in a fresh sandbox.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from orchard.domains.swe.model import SweTask
from orchard.domains.swe.workspace import PatchUnreadable, workspace_patch
from orchard.env.client import Sandbox
from orchard.eval.harness import HarnessError, HarnessResult, RolloutContext, ScriptedTeacher
from orchard.tasks.protocol import SUBMIT_COMMAND
from orchard.testing.policies import stable_share

HARNESSES = ("oracle", "teacher", "mini-swe-agent")


def final_patch(ctx: RolloutContext, sandbox: Sandbox) -> str:
    """Everything changed in the workspace since the base commit, new files included."""
    task = _swe(ctx, "reading a patch")
    base = ctx.setup.base_commit if ctx.setup is not None else "HEAD"
    try:
        with ctx.timed():
            return workspace_patch(sandbox, task, base)
    except PatchUnreadable as e:
        raise HarnessError(str(e)) from None


def _swe(ctx: RolloutContext, what: str) -> SweTask:
    if not isinstance(ctx.task, SweTask):
        raise HarnessError(f"{what} takes a SWE task; {ctx.task.instance_id} is not one")
    return ctx.task


class OracleHarness:
    """Applies the gold patch in the rollout's sandbox and submits the resulting diff: checks
    a task set end to end and measures the environment's own cost."""

    name = "oracle"
    model_upstream = None

    def run(self, ctx: RolloutContext) -> HarnessResult:
        task = _swe(ctx, self.name)
        with ctx.sandbox() as sandbox:
            with ctx.timed():
                applied = sandbox.apply_patch(task.patch, cwd=task.workdir)
            if not applied.success:
                raise HarnessError(f"the gold patch of {task.instance_id} does not apply "
                                   f"to its repository: {'; '.join(applied.attempts)}")
            return HarnessResult(exit_status="Submitted", patch=final_patch(ctx, sandbox),
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
        from orchard.domains.swe.minisweagent import run_task

        if ctx.model_url is None:
            raise HarnessError("mini-swe-agent needs a model URL; the runner gives the "
                               "recording proxy's")
        task = _swe(ctx, self.name)
        budget = task.budget
        trajectory = (ctx.trajectory_dir / f"{ctx.rollout_id}.traj.json"
                      if ctx.trajectory_dir else None)
        with ctx.sandbox() as sandbox:
            result = run_task(
                task.problem_statement, orchestrator_url=str(ctx.client.base_url),
                orchestrator_api_key=ctx.client.api_key, model_base_url=ctx.model_url,
                model_name=self.model, session=ctx.rollout_id, sandbox_id=sandbox.id,
                cwd=task.workdir, step_limit=budget.steps, token_limit=budget.tokens,
                wall_time_limit=budget.wall_time, token_ids=self.token_ids,
                trajectory_path=trajectory, config_overrides=self.config, seed=ctx.seed)
            ctx.env_seconds += result["exec_seconds"]
            submitted = result["exit_status"] == "Submitted"
            return HarnessResult(
                exit_status=result["exit_status"] or "unknown",
                patch=final_patch(ctx, sandbox) if submitted else "",
                n_steps=result["n_steps"], n_tokens=result["n_tokens"])


def _stable_rank(instance_id: str) -> str:
    return hashlib.sha256(instance_id.encode()).hexdigest()


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

    def __init__(self, tasks: Sequence[SweTask], solve: float | Sequence[str] = 1.0, *,
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

    def _task_of(self, messages: list[dict[str, Any]]) -> SweTask:
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
