"""What the demo pipeline needs to know of each task domain, one small class per domain.

The pipeline (``demo.py``) is the same everywhere: teacher rollouts, Monte-Carlo values of the
failed ones, SFT, BAR RL, held-out evaluation, reranking. A domain says where its tasks come
from, which harnesses play the teacher and the policy, how a Monte-Carlo continuation carries
on a recorded rollout, and what a value model reads of a rollout.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

from orchard.env.client import SandboxClient
from orchard.eval.assistant_harness import AssistantHarness, AssistantTeacherHarness
from orchard.eval.harness import Harness, MiniSweAgentHarness, TeacherHarness
from orchard.eval.web_harness import BrowserAgentHarness, WebTeacherHarness
from orchard.recipes.montecarlo import (
    AgentContinuation,
    AssistantContinuation,
    BrowserContinuation,
    Continuation,
)
from orchard.tasks.assistant import load_assistant_tasks
from orchard.tasks.assistant.judge import RubricJudge
from orchard.tasks.assistant.teacher import hedged_assistant_teacher
from orchard.tasks.bugfix_family import bugfix_family
from orchard.tasks.family import settings_family
from orchard.tasks.model import Task
from orchard.tasks.web import load_web_tasks
from orchard.tasks.web.teacher import hedged_web_teacher
from orchard.testing.policies import Policy, Reply, ToolCall


class DemoDomain(Protocol):
    text_of: Literal["patch", "trajectory"]
    """What a value model reads of a rollout."""
    replays: bool
    """Monte-Carlo states must be replayed: a fork keeps files, not the processes (sites,
    browser, services) the domain's state lives in."""

    def tasks(self, n_train: int, n_test: int, seed: int) -> list[Any]: ...

    def teacher(self, train: Sequence[Any], solve: float) -> Harness: ...

    def policy(self, url: str, model: str, tokenizer_dir: str | Path) -> Harness: ...

    def continuation_policy(self, train: Sequence[Any], solve: float, seed: int
                            ) -> Policy: ...

    def continuation(self, client: SandboxClient, url: str, model: str) -> Continuation: ...


def hedged_teacher(tasks: Sequence[Task], solve: float, seed: int) -> Policy:
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


def hindsight_judge(tasks: Sequence[Task]) -> Policy:
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

    text_of: Literal["patch", "trajectory"] = "patch"
    replays = False

    def __init__(self, agent_config: dict[str, Any],
                 generate: Callable[[int, int, int], list[Task]] = settings_family) -> None:
        self.agent_config, self.generate = agent_config, generate

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


class WebFamily:
    """The bundled web tasks with the browser agent."""

    text_of: Literal["patch", "trajectory"] = "trajectory"  # a web rollout leaves no patch
    replays = True

    def tasks(self, n_train: int, n_test: int, seed: int) -> list[Any]:
        return list(load_web_tasks())

    def teacher(self, train: Sequence[Any], solve: float) -> Harness:
        return WebTeacherHarness(train, solve=solve)

    def policy(self, url: str, model: str, tokenizer_dir: str | Path) -> Harness:
        return BrowserAgentHarness(url, model, render_with=tokenizer_dir)

    def continuation_policy(self, train: Sequence[Any], solve: float, seed: int) -> Policy:
        return hedged_web_teacher(train, solve, seed)

    def continuation(self, client: SandboxClient, url: str, model: str) -> Continuation:
        return BrowserContinuation(url, model)


class AssistantFamily:
    """The assistant tasks (hand-written and generated) with the tool-calling assistant;
    with a ``judge``, the policy's rollouts of tasks with a rubric earn base + 0.5 J."""

    text_of: Literal["patch", "trajectory"] = "trajectory"
    replays = True

    def __init__(self, judge: RubricJudge | None = None) -> None:
        self.judge = judge

    def tasks(self, n_train: int, n_test: int, seed: int) -> list[Any]:
        return list(load_assistant_tasks())

    def teacher(self, train: Sequence[Any], solve: float) -> Harness:
        return AssistantTeacherHarness(train, solve=solve)

    def policy(self, url: str, model: str, tokenizer_dir: str | Path) -> Harness:
        return AssistantHarness(url, model, render_with=tokenizer_dir, judge=self.judge)

    def continuation_policy(self, train: Sequence[Any], solve: float, seed: int) -> Policy:
        return hedged_assistant_teacher(train, solve, seed)

    def continuation(self, client: SandboxClient, url: str, model: str) -> Continuation:
        return AssistantContinuation(url, model)


def demo_domain(name: str, agent_config: dict[str, Any], *,
                judge: RubricJudge | None = None) -> DemoDomain:
    if judge is not None and name != "assistant":
        raise ValueError(f"a rubric judge scores assistant tasks; the {name} domain has no "
                         "rubrics: drop the judge or use the assistant domain")
    if name == "web":
        return WebFamily()
    if name == "assistant":
        return AssistantFamily(judge)
    if name == "swe":
        return SweFamily(agent_config)
    if name == "bugfix":
        return SweFamily(agent_config, bugfix_family)
    raise ValueError(f"no demo domain {name!r}: swe, bugfix, web or assistant")
