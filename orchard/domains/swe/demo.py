"""What the demo pipeline and Monte-Carlo values need of the SWE domain: the family adapter
(``SweFamily``: the settings or bug-fix family with mini-swe-agent), the weak continuation
teacher, the scripted retrospective judge, and mini-swe-agent continuing a recorded rollout."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Self

from orchard.domains.swe.family import settings_family
from orchard.domains.swe.grading import grade
from orchard.domains.swe.harness import MiniSweAgentHarness, TeacherHarness
from orchard.domains.swe.model import SweTask
from orchard.env.client import Sandbox, SandboxClient
from orchard.eval.harness import Harness
from orchard.recipes.demo import DemoConfig
from orchard.recipes.domains import NO_RUBRICS
from orchard.recipes.montecarlo import Continuation, clean_message
from orchard.testing.policies import Policy, Reply, ToolCall


class AgentContinuation:
    """mini-swe-agent (the same harness and config as the rollouts) continuing the recorded
    conversation with the model at ``model_url`` (an OpenAI base URL ending in /v1)."""

    def __init__(self, client: SandboxClient, model_url: str, model: str, *,
                 config: Mapping[str, Any] | None = None) -> None:
        self.client, self.model_url, self.model = client, model_url, model
        self.config = dict(config or {})

    def __call__(self, task: SweTask, sandbox: Sandbox, history: list[dict[str, Any]],
                 sample: int, labels: dict[str, str]) -> str:
        from orchard.domains.swe.minisweagent import run_task

        base = sandbox.exec("git rev-parse HEAD", cwd=task.workdir, timeout=60).stdout.strip()
        done = run_task(
            task.problem_statement, orchestrator_url=str(self.client.base_url),
            orchestrator_api_key=self.client.api_key, model_base_url=self.model_url,
            model_name=self.model, sandbox_id=sandbox.id, cwd=task.workdir,
            step_limit=task.budget.steps, token_limit=task.budget.tokens,
            wall_time_limit=task.budget.wall_time, token_ids=False,
            config_overrides=self.config, history=[clean_message(m) for m in history])
        patch = ""
        if done["exit_status"] == "Submitted":
            job = sandbox.exec(f"git add -A && git diff --cached --binary {base}",
                               cwd=task.workdir, timeout=120)
            patch = job.stdout if job.ok else ""
        return grade(self.client, task, patch, labels=labels).outcome



def hedged_teacher(tasks: Sequence[SweTask], solve: float, seed: int) -> Policy:
    """A weak but not hopeless continuation policy, so that value estimates move when a step
    helps or hurts: at each call it takes the task's next solving step with probability
    ``solve``, and otherwise submits the workspace as it is."""
    by_statement = {t.problem_statement: t for t in tasks}
    rng = random.Random(seed)

    def policy(messages: list[dict[str, Any]], tools: Any) -> Reply:
        first = next(str(m.get("content")) for m in messages if m["role"] == "user")
        task = next(t for s, t in by_statement.items() if s in first)
        script = task.metadata["teacher"]["solve"]
        turn = sum(1 for m in messages if m["role"] == "assistant")
        thought, command = (script[min(turn, len(script) - 1)] if rng.random() < solve
                            else script[-1])
        return Reply(content=thought, tool_calls=[ToolCall("bash", {"command": command})])

    return policy


def hindsight_judge(tasks: Sequence[SweTask]) -> Policy:
    """A scripted retrospective judge for the generated SWE families, served like a model: it
    reads ``RetrospectiveAnnotator``'s prompt and, knowing each task's fix, values the state
    before step k at 0.9 when the fix was made in an earlier step and no other edit followed,
    and at 0.1 otherwise. A stand-in for an LLM judge in tests and ablations."""
    by_statement = {t.problem_statement: t for t in tasks}

    def policy(messages: list[dict[str, Any]], tools: Any) -> Reply:
        prompt = str(messages[-1]["content"])
        task = next(t for st, t in by_statement.items() if st in prompt)
        fix = task.metadata["teacher"]["solve"][1][1]
        forms = (fix, json.dumps(fix)[1:-1])
        actions = re.split(r"^### Step \d+\nAction:\n", prompt.split("## Outcome")[0],
                           flags=re.MULTILINE)[1:]
        asked = [int(k) for k in re.findall(r'"(\d+)": p', prompt.rsplit("\n", 1)[-1])]
        values, fixed = {}, False
        for k in range(max(asked, default=-1) + 1):
            values[str(k)] = 0.9 if fixed else 0.1
            action = actions[k] if k < len(actions) else ""
            if any(f in action for f in forms):
                fixed = True
            elif "sed -i" in action:
                fixed = False
        return Reply(content=json.dumps({"values": {k: values[str(k)] for k in map(str, asked)}}))

    return policy


class SweFamily:
    """Software engineering with mini-swe-agent: a generated family, ``settings_family`` (the
    right value is in the issue; a tiny model learns it) or ``bugfix_family`` (the right value
    must be read in the sandbox)."""

    name = "swe"
    text_of: Literal["patch", "trajectory"] = "patch"
    replays = False

    def __init__(self, agent_config: dict[str, Any],
                 generate: Callable[[int, int, int], list[SweTask]] = settings_family) -> None:
        self.agent_config, self.generate = agent_config, generate

    def configure(self, config: DemoConfig) -> DemoConfig:
        return config  # the demo's defaults were measured on the SWE families

    def tasks(self, n_train: int, n_test: int, seed: int) -> list[Any]:
        return list(self.generate(n_train, n_test, seed))

    def teacher(self, train: Sequence[Any], solve: float) -> Harness:
        return TeacherHarness(train, solve=solve, config=self.agent_config)

    def policy(self, url: str, model: str, tokenizer_dir: str | Path) -> Harness:
        return MiniSweAgentHarness(url, model, config=self.agent_config,
                                   render_with=tokenizer_dir)

    def continuation_policy(self, train: Sequence[Any], solve: float, seed: int) -> Policy:
        return hedged_teacher(train, solve, seed)

    def continuation(self, client: SandboxClient, url: str, model: str) -> Continuation:
        return AgentContinuation(client, url, model, config=self.agent_config)

    def values_judge(self, train: Sequence[Any]) -> Policy:
        return hindsight_judge(train)

    def scripted_judge(self) -> Policy:
        raise ValueError(NO_RUBRICS.format(domain=self.name))

    def judged(self, url: str, model: str) -> Self:
        raise ValueError(NO_RUBRICS.format(domain=self.name))
