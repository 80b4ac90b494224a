"""The rubric judge: an LLM behind an OpenAI-compatible URL scores an assistant's work.

A task's ``rubric`` lists criteria with weights. The judge reads the request, the criteria, what
the assistant did (its tool calls and what came back) and its answer, and answers with one
score in [0, 1] per criterion; J is their weighted mean, and the rollout's process reward is
R = base + 0.5 * J, base being 1 when the checks hold and 0 otherwise.

A judge that cannot be reached, refuses, or answers with anything but the scores asked for
(after one retry) is a ``JudgeFailed`` with a class, never a silent 0. Every exchange is kept
(``calls``) so the rollout's trace can show how it was graded.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from orchard.tasks.assistant.model import AssistantTask

JUDGE_WEIGHT = 0.5
SYSTEM = ("You grade a personal assistant's work against a rubric. Read the user's request, "
          "the criteria and what the assistant did. Answer with JSON only: "
          '{"scores": [s1, s2, ...]}, one score from 0 to 1 per criterion, in their order.')


class JudgeFailed(Exception):
    """The judge gave no usable verdict; ``cls`` says how, ``calls`` what was exchanged."""

    def __init__(self, cls: Literal["unreachable", "refused", "nonsense"], message: str,
                 calls: list[dict[str, Any]]) -> None:
        super().__init__(f"the judge {cls}: {message}")
        self.cls, self.calls = cls, calls


@dataclass
class Verdict:
    j: float
    scores: list[float]
    calls: list[dict[str, Any]] = field(default_factory=list)


def process_reward(resolved: bool, j: float) -> float:
    return (1.0 if resolved else 0.0) + JUDGE_WEIGHT * j


def transcript(messages: list[dict[str, Any]], answer: str | None) -> str:
    """What the assistant did, as the judge reads it: its calls, the results, its answer."""
    lines = []
    for m in messages:
        if m.get("role") == "assistant":
            for call in m.get("tool_calls") or []:
                lines.append(f"CALL {call['function']['name']} {call['function']['arguments']}")
        elif m.get("role") == "tool":
            lines.append(f"RESULT {str(m.get('content'))[:1000]}")
    lines.append(f"FINAL ANSWER {answer or '(none)'}")
    return "\n".join(lines)


class RubricJudge:
    def __init__(self, url: str, model: str, *, timeout: float = 120.0,
                 attempts: int = 2) -> None:
        self.url, self.model, self.timeout, self.attempts = url.rstrip("/"), model, timeout, \
            attempts

    def score(self, task: AssistantTask, messages: list[dict[str, Any]],
              answer: str | None) -> Verdict:
        criteria = "\n".join(f"{i + 1}. {c.criterion}" for i, c in enumerate(task.rubric))
        prompt = (f"Request: {task.goal}\n\nCriteria:\n{criteria}\n\nWhat the assistant did:\n"
                  f"{transcript(messages, answer)}")
        body = {"model": self.model, "temperature": 0, "messages": [
            {"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]}
        calls: list[dict[str, Any]] = []
        why = ""
        with httpx.Client(timeout=self.timeout) as http:
            for _ in range(self.attempts):
                started = time.time()
                try:
                    reply = http.post(f"{self.url}/chat/completions", json=body)
                except httpx.HTTPError as e:
                    raise JudgeFailed("unreachable", f"{self.url}: {e}", calls) from None
                call = {"endpoint": "judge", "model": self.model, "started_at": started,
                        "latency_ms": (time.time() - started) * 1000, "request": body,
                        "status": reply.status_code, "response": _json_or_text(reply)}
                calls.append(call)
                if reply.status_code != 200:
                    raise JudgeFailed("refused", f"status {reply.status_code}: "
                                      f"{reply.text[:300]}", calls)
                scores, why = _scores(call["response"], len(task.rubric))
                if scores is not None:
                    weights = [c.weight for c in task.rubric]
                    j = sum(w * s for w, s in zip(weights, scores, strict=True)) / sum(weights)
                    return Verdict(j=j, scores=scores, calls=calls)
        raise JudgeFailed("nonsense", why, calls)


def _json_or_text(reply: httpx.Response) -> Any:
    try:
        return reply.json()
    except ValueError:
        return reply.text


def _scores(response: Any, n: int) -> tuple[list[float] | None, str]:
    try:
        content = response["choices"][0]["message"]["content"] or ""
    except (KeyError, IndexError, TypeError):
        return None, f"not a chat completion: {str(response)[:200]}"
    found = re.search(r"\{.*\}", content, re.DOTALL)
    try:
        scores = json.loads(found.group(0))["scores"] if found else None
    except (ValueError, KeyError, TypeError):
        scores = None
    if not isinstance(scores, list) or len(scores) != n or not all(
            isinstance(s, int | float) and not isinstance(s, bool) and 0 <= s <= 1
            for s in scores):
        return None, f"wanted {n} scores in [0, 1] as JSON, got {content[:200]!r}"
    return [float(s) for s in scores], ""
