"""A scripted web teacher: a model policy that plays each task's gold run as tool calls.

Served by the teacher model server (``orchard.testing.teacher``), it drives the browser agent
(``orchard.domains.web.browser_agent``) like a model would: it reads the goal to know the
task, the latest page to find each gold step's element, and answers with one ``browser``
call, then ``finish`` (with the answer, for a question). It solves a ``solve`` share of the
tasks, picked by a stable hash of their ids (as the SWE teacher does), and on the others plays
the first half of the gold run, then finishes with no answer: a failed rollout that made
progress, which is what credit assignment learns from. So a run's resolved rate is known in
advance and does not depend on the order in which concurrent rollouts reach it.

``hedged_web_teacher`` is the Monte-Carlo continuation policy: from wherever a recorded rollout
hands over, each call takes the gold run's next step with probability ``solve`` and otherwise
gives up.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from typing import Any

from orchard.domains.web.grading import element_id
from orchard.domains.web.model import WebTask
from orchard.testing.policies import (
    Messages,
    Policy,
    PolicyError,
    Reply,
    ToolCall,
    Tools,
    stable_share,
)


def _text(message: dict[str, Any]) -> str:
    content = message.get("content") or ""
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def _arguments(call: dict[str, Any]) -> dict[str, Any]:
    args = call.get("function", {}).get("arguments") or "{}"
    return args if isinstance(args, dict) else json.loads(args)


def web_teacher(tasks: Sequence[WebTask], solve: float = 1.0) -> Policy:
    """The policy (see the module doc)."""
    solved = stable_share((t.instance_id for t in tasks), solve)
    return _gold_player(tasks, lambda task, turn: task.instance_id in solved
                        or turn < len(task.gold) // 2)


def hedged_web_teacher(tasks: Sequence[WebTask], solve: float, seed: int) -> Policy:
    """The continuation policy (see the module doc)."""
    rng = random.Random(seed)
    return _gold_player(tasks, lambda task, turn: rng.random() < solve)


def _gold_player(tasks: Sequence[WebTask], goes_on: Callable[[WebTask, int], bool]) -> Policy:
    """Plays a task's gold run while ``goes_on(task, turn)``, then finishes with no answer."""
    by_goal = {t.goal: t for t in tasks}

    def policy(messages: Messages, tools: Tools) -> Reply:
        opening = next((_text(m) for m in messages if m.get("role") == "user"), "")
        task = next((t for goal, t in by_goal.items() if goal in opening), None)
        if task is None:
            raise PolicyError("the web teacher knows no task with this goal")
        # Observations it asked for (a page still changing) are not steps of the script.
        calls = [_arguments(c) for m in messages if m.get("role") == "assistant"
                 for c in m.get("tool_calls") or []]
        turn = sum(1 for c in calls if c.get("action") != "observe")
        pages = [_text(m) for m in messages if m.get("role") in ("user", "tool")
                 and "URL: " in _text(m)]
        steps = task.gold
        if turn >= len(steps) or not goes_on(task, turn):
            return Reply(content="Done.", tool_calls=[ToolCall("finish", {})])
        step = steps[turn]
        if step.action == "answer":
            return Reply(content="I have the answer.",
                         tool_calls=[ToolCall("finish", {"answer": step.text})])
        args: dict[str, Any] = {"action": step.action}
        if step.target is not None:
            found = element_id(pages[-1] if pages else "", step.target)
            if found is None and not (calls and calls[-1].get("action") == "observe"):
                # The page may still be changing (a slow redirect): look once more.
                return Reply(content=f"I do not see {step.target} yet; looking again.",
                             tool_calls=[ToolCall("browser", {"action": "observe"})])
            if found is None:  # the page is not what the script expects: give up honestly
                return Reply(content=f"I cannot find {step.target}.",
                             tool_calls=[ToolCall("finish", {})])
            args["id"] = found
        for name in ("url", "text", "value", "key"):
            if getattr(step, name) is not None:
                args[name] = getattr(step, name)
        if step.action == "type" and step.submit:
            args["submit"] = True
        return Reply(content=f"Next: {step.action} {step.target or step.url or ''}".strip(),
                     tool_calls=[ToolCall("browser", args)])

    return policy
