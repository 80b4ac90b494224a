"""A scripted assistant teacher: a model policy that makes each task's gold tool calls.

Served by the teacher model server (``orchard.testing.teacher``), it drives the assistant loop
(``orchard.domains.assistant.assistant_agent``) like a model would: it reads the request to know the
task, then answers each turn with the gold run's next tool call, and ``finish`` (with the gold
answer) after the last. It solves a ``solve`` share of the tasks, picked by a stable hash of
their ids, and on the others makes the first half of the calls, then finishes without an
answer: a failed rollout that made progress.

``hedged_assistant_teacher`` is the Monte-Carlo continuation policy: from wherever a recorded
rollout hands over, each call makes the gold run's next call with probability ``solve`` and
otherwise gives up.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from orchard.domains.assistant.model import AssistantTask
from orchard.testing.policies import (
    Messages,
    Policy,
    PolicyError,
    Reply,
    ToolCall,
    Tools,
    stable_share,
)


def assistant_teacher(tasks: Sequence[AssistantTask], solve: float = 1.0) -> Policy:
    """The policy (see the module doc)."""
    solved = stable_share((t.instance_id for t in tasks), solve)
    return _gold_caller(tasks, lambda task, turn: task.instance_id in solved
                        or turn < len(task.gold) // 2)


def hedged_assistant_teacher(tasks: Sequence[AssistantTask], solve: float, seed: int
                             ) -> Policy:
    """The continuation policy (see the module doc)."""
    rng = random.Random(seed)
    return _gold_caller(tasks, lambda task, turn: rng.random() < solve)


def _gold_caller(tasks: Sequence[AssistantTask],
                 goes_on: Callable[[AssistantTask, int], bool]) -> Policy:
    """Makes a task's gold calls while ``goes_on(task, turn)``, then finishes: with the gold
    answer after the last call, with none when it stops early."""
    by_goal = {t.goal: t for t in tasks}
    if len(by_goal) < len(tasks):
        raise ValueError("two of the teacher's tasks ask the same; it knows a task by its goal")

    def policy(messages: Messages, tools: Tools) -> Reply:
        request = next((str(m.get("content")) for m in messages if m.get("role") == "user"),
                       "")
        task = by_goal.get(request)
        if task is None:
            raise PolicyError("the assistant teacher knows no task with this request")
        turn = sum(len(m.get("tool_calls") or []) for m in messages
                   if m.get("role") == "assistant")
        if turn >= len(task.gold) or not goes_on(task, turn):
            answer: dict[str, Any] = ({"answer": task.answer}
                                      if task.answer and turn >= len(task.gold) else {})
            return Reply(content="Done.", tool_calls=[ToolCall("finish", answer)])
        call = task.gold[turn]
        return Reply(content=f"Next: {call.tool}.", tool_calls=[ToolCall(call.tool, call.args)])

    return policy
