"""The rubric judge: an LLM behind an OpenAI-compatible URL scores an assistant's work.

A task's ``rubric`` lists criteria with weights. The judge reads the request, the criteria, what
the assistant did (its tool calls and what came back) and its answer, and answers with one
score in [0, 1] per criterion; J is their weighted mean, and the rollout's process reward is
R = base + 0.5 * J, base being 1 when the checks hold and 0 otherwise.

``keyword_judge`` is a scripted stand-in for tests and the demo, served like any model (e.g. by
``TeacherServer``): it scores a criterion by how many of its words the assistant wrote.

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

from orchard.domains.assistant.model import AssistantTask
from orchard.testing.policies import Reply, Tools

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


_NO_ANSWER = "FINAL ANSWER (none)"


def transcript(messages: list[dict[str, Any]], answer: str | None) -> str:
    """What the assistant did, as the judge reads it: its calls, the results, its answer."""
    lines = []
    for m in messages:
        if m.get("role") == "assistant":
            for call in m.get("tool_calls") or []:
                lines.append(f"CALL {call['function']['name']} {call['function']['arguments']}")
        elif m.get("role") == "tool":
            lines.append(f"RESULT {str(m.get('content'))[:1000]}")
    lines.append(f"FINAL ANSWER {answer}" if answer else _NO_ANSWER)
    return "\n".join(lines)


def judge_prompt(task: AssistantTask, messages: list[dict[str, Any]],
                 answer: str | None) -> str:
    criteria = "\n".join(f"{i + 1}. {c.criterion}" for i, c in enumerate(task.rubric))
    return (f"Request: {task.goal}\n\nCriteria:\n{criteria}\n\nWhat the assistant did:\n"
            f"{transcript(messages, answer)}")


class RubricJudge:
    def __init__(self, url: str, model: str, *, timeout: float = 120.0,
                 attempts: int = 2) -> None:
        self.url, self.model, self.timeout, self.attempts = url.rstrip("/"), model, timeout, \
            attempts

    def score(self, task: AssistantTask, messages: list[dict[str, Any]],
              answer: str | None) -> Verdict:
        body = {"model": self.model, "temperature": 0, "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": judge_prompt(task, messages, answer)}]}
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


# Words a criterion uses to say what it wants, not what must be there.
_FILLER = frozenset({
    "a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "gives", "how", "in", "is",
    "it", "its", "names", "not", "of", "on", "or", "says", "so", "tells", "that", "the",
    "their", "them", "they", "this", "to", "what", "when", "where", "which", "who", "with",
    "message", "email", "reply", "note", "todo"})


def _words(text: str) -> set[str]:
    return {w.strip(".,:;!?'\"()").lower() for w in text.split()} - _FILLER - {""}


def keyword_judge(messages: list[dict[str, Any]], tools: Tools) -> Reply:
    """A scripted judge: each criterion scores the share of its words found in what the
    assistant wrote (its calls' arguments and its answer, not the tools' results). It reads
    ``RubricJudge``'s prompt, so it is a real endpoint's stand-in, not an LLM's equal: it
    rewards naming the right things, and cannot tell a right sentence from a wrong one."""
    prompt = str(messages[-1]["content"])
    criteria_part, _, did = prompt.partition("\n\nWhat the assistant did:\n")
    criteria = re.findall(r"^\d+\. (.*)$", criteria_part.partition("Criteria:\n")[2],
                          re.MULTILINE)
    wrote = " ".join(line.removeprefix("CALL ").removeprefix("FINAL ANSWER ")
                     for line in did.splitlines()
                     if line.startswith(("CALL ", "FINAL ANSWER ")) and line != _NO_ANSWER)
    written = _words(wrote.replace('\\"', " ").replace('"', " "))
    scores = [round(len(_words(c) & written) / len(_words(c)), 3) if _words(c) else 1.0
              for c in criteria]
    return Reply(content=json.dumps({"scores": scores}))


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
