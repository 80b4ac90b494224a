"""A scripted assistant teacher: a model policy that makes each task's gold tool calls.

Served by the teacher model server (``orchard.rollout.teacher``), it drives the assistant loop
(``orchard.rollout.assistant_agent``) like a model would: it reads the request to know the
task, then answers each turn with the gold run's next tool call, and ``finish`` (with the gold
answer) after the last. It solves a ``solve`` share of the tasks, picked by a stable hash of
their ids, and on the others makes the first half of the calls, then finishes without an
answer: a failed rollout that made progress.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from orchard.rollout.policies import Messages, Policy, PolicyError, Reply, ToolCall, Tools
from orchard.tasks.assistant.model import AssistantTask


def assistant_teacher(tasks: Sequence[AssistantTask], solve: float = 1.0) -> Policy:
    """The policy (see the module doc)."""
    by_goal = {t.goal: t for t in tasks}
    ranked = sorted((t.instance_id for t in tasks),
                    key=lambda i: hashlib.sha256(i.encode()).hexdigest())
    solved = set(ranked[:round(solve * len(ranked))])

    def policy(messages: Messages, tools: Tools) -> Reply:
        request = next((str(m.get("content")) for m in messages if m.get("role") == "user"),
                       "")
        task = by_goal.get(request)
        if task is None:
            raise PolicyError("the assistant teacher knows no task with this request")
        turn = sum(len(m.get("tool_calls") or []) for m in messages
                   if m.get("role") == "assistant")
        stop = len(task.gold) if task.instance_id in solved else len(task.gold) // 2
        if turn >= stop:
            answer: dict[str, Any] = ({"answer": task.answer}
                                      if task.answer and task.instance_id in solved else {})
            return Reply(content="Done.", tool_calls=[ToolCall("finish", answer)])
        call = task.gold[turn]
        return Reply(content=f"Next: {call.tool}.", tool_calls=[ToolCall(call.tool, call.args)])

    return policy
