"""Credit assignment for credit-assignment SFT: value curves over trajectories, and the
retrospective annotator that draws them with an LLM judge.

A value curve holds V(s_0) .. V(s_T) for a trajectory of T steps (assistant turns), where s_t is
the history before step t and V(s) = P(the task gets resolved | s). The credit of step t is
c_t = V(s_{t+1}) - V(s_t); its rise segments (maximal runs of steps with c_t >= eps) are the
actions of a failed trajectory worth imitating.

The retrospective annotator shows a judge model the whole trajectory and its test outcome in one
chat request and asks for V at a few key states; the rest of the curve is interpolated, and the
final state is pinned to the outcome. A Monte-Carlo annotator (replaying from states) produces
the same `ValueCurve`.

    judge = RetrospectiveAnnotator("http://localhost:8000/v1", "Qwen/Qwen3-32B")
    curves, failures = annotate_all(judge, load_trajectories("runs/teacher"))
    for rollout_id, curve in curves.items():
        print(rollout_id, curve.rise_segments())
"""

from __future__ import annotations

import bisect
import json
import logging
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import httpx

from orchard.recipes.trajectories import Trajectory

log = logging.getLogger(__name__)

# Credits are differences of floats: 0.15 - 0.10 is 0.04999999999999999, which is meant to be a
# rise of exactly 0.05. A rise is c_t >= eps up to this rounding slack.
_FLOAT_SLACK = 1e-9


# --- value curves ---------------------------------------------------------------------------

def _check_probability(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            math.isfinite(value) and 0.0 <= value <= 1.0):
        raise ValueError(f"{where} is {value!r}: a value is a probability, a number in [0, 1]")
    return float(value)


@dataclass
class ValueCurve:
    values: list[float]
    """V(s_0) .. V(s_T): T + 1 probabilities for a trajectory of T steps."""
    key_steps: list[int]
    """The states actually scored (by a judge, rollouts or the observed outcome); the other
    values are interpolated."""
    source: str
    """Who drew the curve: "retrospective", "monte_carlo", ..."""
    detail: dict[str, Any] = field(default_factory=dict)
    """How it was drawn (e.g. the judge's raw replies and what had to be fixed up); JSON-safe."""

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError("a value curve needs at least V(s_0): values is empty")
        self.values = [_check_probability(v, f"values[{i}]") for i, v in enumerate(self.values)]
        bad = [k for k in self.key_steps
               if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < len(self.values)]
        if bad:
            raise ValueError(f"key_steps {bad} are not states of this curve (0 .. "
                             f"{len(self.values) - 1})")

    @property
    def n_steps(self) -> int:
        return len(self.values) - 1

    @property
    def credits(self) -> list[float]:
        """c_t = V(s_{t+1}) - V(s_t) for each step t: how much step t moved the odds."""
        return [b - a for a, b in zip(self.values, self.values[1:], strict=False)]

    def rise_segments(self, eps: float = 0.05) -> list[tuple[int, int]]:
        """Maximal runs of consecutive steps with c_t >= eps, as half-open (start, end) ranges
        of step indices, in order."""
        if not (isinstance(eps, int | float) and math.isfinite(eps) and eps > 0):
            raise ValueError(f"eps is {eps!r}: a rise threshold must be a positive number "
                             "(the recipe's is 0.05)")
        segments: list[tuple[int, int]] = []
        start = None
        for t, c in enumerate([*self.credits, -math.inf]):  # the sentinel closes a last run
            rising = c >= eps - _FLOAT_SLACK
            if rising and start is None:
                start = t
            elif not rising and start is not None:
                segments.append((start, t))
                start = None
        return segments

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> ValueCurve:
        data = json.loads(text)
        if not isinstance(data, dict) or not {"values", "key_steps", "source"} <= set(data):
            raise ValueError("not a value curve: expected a JSON object with values, "
                             "key_steps, source (and detail), as ValueCurve.to_json writes")
        return cls(values=data["values"], key_steps=data["key_steps"], source=data["source"],
                   detail=data.get("detail") or {})


def interpolate(points: dict[int, float], n_states: int) -> list[float]:
    """Values for states 0 .. n_states - 1 from the scored ones: linear between scored states,
    constant before the first and after the last."""
    if isinstance(n_states, bool) or not isinstance(n_states, int) or n_states < 1:
        raise ValueError(f"n_states is {n_states!r}: a curve has at least one state")
    if not points:
        raise ValueError("no scored state to interpolate from: give at least one point")
    for k, v in points.items():
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < n_states:
            raise ValueError(f"point {k!r} is not a state: states are ints 0 .. {n_states - 1}")
        _check_probability(v, f"the value at state {k}")
    known = sorted(points.items())
    keys = [k for k, _ in known]
    out = []
    for s in range(n_states):
        j = bisect.bisect_right(keys, s)  # keys[j - 1] <= s < keys[j]
        if j == 0:
            out.append(float(known[0][1]))
        elif j == len(known):
            out.append(float(known[-1][1]))
        else:
            (a, va), (b, vb) = known[j - 1], known[j]
            out.append(va + (vb - va) * (s - a) / (b - a))
    return out


def key_steps(n_steps: int, max_points: int = 8) -> list[int]:
    """The states to score for a trajectory of `n_steps` steps: every state when there are at
    most `max_points`, else `max_points` states evenly spread from 0 to T (both always in).

    Even spacing because nothing is known about where a trajectory turns before it is read; it
    bounds every interpolated stretch to about T / (max_points - 1) steps. Few points because a
    judge scores a handful of states more consistently than dozens and the prompt's cost is the
    trajectory, not the points; raise `max_points` for finer rise segments on long
    trajectories.
    """
    if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < 0:
        raise ValueError(f"n_steps is {n_steps!r}: a trajectory has 0 or more steps")
    if isinstance(max_points, bool) or not isinstance(max_points, int) or max_points < 2:
        raise ValueError(f"max_points is {max_points!r}: at least 2 (the first and last state)")
    if n_steps + 1 <= max_points:
        return list(range(n_steps + 1))
    # The spacing is over 1, so the rounded states are distinct.
    return [round(i * n_steps / (max_points - 1)) for i in range(max_points)]


# --- annotators -------------------------------------------------------------------------------

class AnnotationError(Exception):
    """This trajectory could not be annotated (e.g. the judge gave no usable value twice); the
    caller skips it."""


class JudgeError(RuntimeError):
    """The judge endpoint itself failed (unreachable, refused, or not OpenAI-shaped): a setup
    problem, so it stops a batch instead of failing every trajectory one by one."""


class Annotator(Protocol):
    def annotate(self, traj: Trajectory) -> ValueCurve: ...


def annotate_all(annotator: Annotator, trajectories: Iterable[Trajectory], *,
                 skip_resolved: bool = True
                 ) -> tuple[dict[str, ValueCurve], dict[str, str]]:
    """Curves by rollout id, and why annotation failed by rollout id. Resolved trajectories are
    skipped by default: they train on every turn, so they need no curve."""
    curves: dict[str, ValueCurve] = {}
    failures: dict[str, str] = {}
    seen: set[str] = set()
    for traj in trajectories:
        if traj.rollout_id in seen:
            raise ValueError(f"rollout {traj.rollout_id!r} is given twice: rollout ids must be "
                             "unique (were the same run's trajectories loaded twice?)")
        seen.add(traj.rollout_id)
        if skip_resolved and traj.resolved:
            continue
        try:
            curves[traj.rollout_id] = annotator.annotate(traj)
        except AnnotationError as e:
            log.warning("skipping rollout %s: %s", traj.rollout_id, e)
            failures[traj.rollout_id] = str(e)
    return curves, failures


# --- the retrospective judge's prompt ---------------------------------------------------------

def _cut(text: str, limit: int) -> str:
    """Head and tail of a long text: commands and errors show at the ends of outputs."""
    if len(text) <= limit:
        return text
    head = limit // 2
    return (f"{text[:head]}\n[... {len(text) - limit} characters cut ...]\n"
            f"{text[len(text) - (limit - head):]}")


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, list):
        return "\n".join(p.get("text") or "" for p in content if isinstance(p, dict))
    return str(content)


def _action(message: dict[str, Any], limit: int) -> str:
    parts = [_cut(_text(message.get("content")).strip(), limit)]
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        parts.append(f"[tool call] {fn.get('name')} {_cut(str(fn.get('arguments')), limit)}")
    return "\n".join(p for p in parts if p) or "(empty)"


def _fmt_steps(steps: list[int]) -> str:
    return ", ".join(map(str, steps))


def judge_prompt(traj: Trajectory, asked: list[int], max_chars_per_turn: int) -> str:
    """The one message the retrospective judge gets: the task, the numbered steps, the outcome,
    and the request for V at the `asked` states."""
    user = [i for i, m in enumerate(traj.messages) if m["role"] == "user"]
    if not user:
        raise AnnotationError(f"rollout {traj.rollout_id} has no user message, so no task to "
                              "show the judge (the task is the first user message)")
    limit = max_chars_per_turn
    steps = traj.steps
    step_of = {m: t for t, m in enumerate(steps)}
    lines = ["You are reviewing a finished attempt by an AI agent at a software task, knowing "
             "how it ended. Judge, in hindsight, how the agent's chances of success evolved "
             "step by step.", "", "## Task", _cut(_text(traj.messages[user[0]]["content"]), limit),
             "", f"## Trajectory ({len(steps)} steps, numbered 0 to {len(steps) - 1}; each is "
             "an action of the agent and what it observed)"]
    for i, m in enumerate(traj.messages[user[0] + 1:], start=user[0] + 1):
        if m["role"] == "assistant":
            lines += ["", f"### Step {step_of[i]}", "Action:", _action(m, limit)]
        elif m["role"] in ("tool", "user"):
            label = "Observation:" if steps and i > steps[0] else "More context:"
            lines += [label, _cut(_text(m.get("content")), limit)]
    outcome = "RESOLVED (the tests pass)" if traj.resolved else "NOT resolved (the tests fail)"
    lines += ["", "## Outcome", f"The tests were run on the agent's final result: the task was "
              f"{outcome}."]
    if traj.test_output.strip():
        tail = traj.test_output[-limit:]
        cut = "[... earlier output cut ...]\n" if len(traj.test_output) > limit else ""
        lines += ["Test output (tail):", "```", cut + tail, "```"]
    example = ", ".join(f'"{s}": p' for s in asked)
    lines += ["", "## Your answer",
              f"For each of the steps {_fmt_steps(asked)}, estimate p = the probability that "
              "the task will be resolved, given the history up to (before) that step: the "
              "task and every earlier step with its observation. Use what you know about how "
              "the attempt ended to tell which steps helped and which went wrong.",
              "Reply with one JSON object, with each p a number between 0 and 1:",
              f'{{"values": {{{example}}}}}']
    return "\n".join(lines)


def _corrective(reason: str, asked: list[int]) -> str:
    example = ", ".join(f'"{s}": p' for s in asked)
    return (f"Your reply had no usable value ({reason}). Reply with only the JSON object "
            f'{{"values": {{{example}}}}}, with each p a number between 0 and 1 for steps '
            f"{_fmt_steps(asked)}.")


# --- reading the judge's reply --------------------------------------------------------------

_FENCE = re.compile(r"```[a-zA-Z]*\s*(.*?)```", re.DOTALL)
_TRAILING_COMMA = re.compile(r",\s*([}\]])")
_BARE_PERCENT = re.compile(r"(?<![\"\w.])(\d+(?:\.\d+)?)\s*%")
_STEP_KEY = re.compile(r"\s*(?:step|s)?[\s_#-]*(\d+)\s*", re.IGNORECASE)
_NUMBER = re.compile(r"\s*([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*(%?)\s*")


def _objects(text: str) -> Iterator[dict[str, Any]]:
    """JSON objects in a reply, fenced blocks first, then anywhere in the text; each text also
    with common slips repaired (trailing commas, bare percentages like 70%)."""
    text = text.rsplit("</think>", 1)[-1]  # a reasoning model's thoughts are not its answer
    decoder = json.JSONDecoder()
    for block in [*_FENCE.findall(text), text]:
        repaired = _BARE_PERCENT.sub(r'"\1%"', _TRAILING_COMMA.sub(r"\1", block))
        for variant in dict.fromkeys([block, repaired]):
            for brace in re.finditer(r"\{", variant):
                try:
                    obj, _ = decoder.raw_decode(variant, brace.start())
                except ValueError:
                    continue
                if isinstance(obj, dict):
                    yield obj


def _step(key: Any) -> int | None:
    if isinstance(key, int) and not isinstance(key, bool):
        return key
    m = _STEP_KEY.fullmatch(key) if isinstance(key, str) else None
    return int(m[1]) if m else None


def _probability(raw: Any) -> float | None:
    """A number, a numeric string or a percentage as a float (not yet clamped)."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int | float):
        value = float(raw)
    elif isinstance(raw, str) and (m := _NUMBER.fullmatch(raw)):
        value = float(m[1]) / (100 if m[2] else 1)
    else:
        return None
    return value if math.isfinite(value) else None


@dataclass
class _Reading:
    points: dict[int, float] = field(default_factory=dict)  # asked state -> value in [0, 1]
    clamped: dict[str, Any] = field(default_factory=dict)  # state -> the judge's raw value
    unreadable: dict[str, Any] = field(default_factory=dict)
    ignored: dict[str, Any] = field(default_factory=dict)  # keys that are not asked states


def _read(obj: dict[str, Any], asked: list[int]) -> _Reading:
    values = obj.get("values", obj)
    reading = _Reading()
    if not isinstance(values, dict):
        return reading
    for key, raw in values.items():
        step = _step(key)
        if step not in asked:
            reading.ignored[str(key)] = raw
        elif (p := _probability(raw)) is None:
            reading.unreadable[str(step)] = raw
        else:
            if not 0.0 <= p <= 1.0:
                reading.clamped[str(step)] = raw
            reading.points[step] = min(1.0, max(0.0, p))
    return reading


def _read_reply(reply: str, asked: list[int]) -> tuple[_Reading | None, str]:
    """The first JSON object in the reply with a value for an asked state, or None and why
    there is none."""
    found_object = False
    for obj in _objects(reply):
        found_object = True
        reading = _read(obj, asked)
        if reading.points:
            return reading, ""
    if not found_object:
        return None, "no JSON object in the reply"
    return None, f"no JSON object with a number for any of the steps {_fmt_steps(asked)}"


# --- the retrospective annotator --------------------------------------------------------------

class RetrospectiveAnnotator:
    """V at the key states of a trajectory, estimated in hindsight by a judge model behind an
    OpenAI-compatible endpoint (`base_url` is the API root, ending in /v1), in one chat request
    per trajectory (two when the first reply has no usable number).

    The final state is not asked: V(s_T) is pinned to the observed outcome (1.0 if resolved,
    else 0.0), because at s_T nothing is left to estimate; a judge's number there could only
    add noise, and the pin makes the steps before a failure carry its drop.
    """

    source = "retrospective"

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None,
                 max_points: int = 8, temperature: float = 0.0, timeout: float = 120,
                 max_chars_per_turn: int = 2000) -> None:
        if max_chars_per_turn < 100:
            raise ValueError(f"max_chars_per_turn is {max_chars_per_turn}: at least 100, or "
                             "the judge sees too little of each turn to judge it")
        key_steps(0, max_points)  # validates max_points now rather than per trajectory
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.max_points = max_points
        self.temperature = temperature
        self.timeout = timeout
        self.max_chars_per_turn = max_chars_per_turn

    def annotate(self, traj: Trajectory) -> ValueCurve:
        n_steps = len(traj.steps)
        final = 1.0 if traj.resolved else 0.0
        states = key_steps(n_steps, self.max_points)
        asked = states[:-1]
        if not asked:  # no step taken: the curve is the outcome alone
            return ValueCurve([final], [0], self.source, {"model": self.model, "replies": []})
        messages = [{"role": "user",
                     "content": judge_prompt(traj, asked, self.max_chars_per_turn)}]
        detail: dict[str, Any] = {"model": self.model, "asked": asked, "replies": []}
        for attempt in range(2):
            reply = self._chat(messages)
            detail["replies"].append(reply)
            reading, reason = _read_reply(reply, asked)
            if reading is not None:
                break
            if attempt == 0:
                detail["retry_reason"] = reason
                messages += [{"role": "assistant", "content": reply},
                             {"role": "user", "content": _corrective(reason, asked)}]
        else:
            raise AnnotationError(
                f"rollout {traj.rollout_id}: the judge {self.model!r} gave no usable value "
                f"in 2 replies ({reason}); its last reply began {reply[:200]!r}")
        detail["missing"] = [s for s in asked if s not in reading.points]
        for name in ("clamped", "unreadable", "ignored"):
            if getattr(reading, name):
                detail[name] = getattr(reading, name)
        points = {**reading.points, n_steps: final}
        return ValueCurve(interpolate(points, n_steps + 1), sorted(points), self.source, detail)

    def _chat(self, messages: list[dict[str, Any]]) -> str:
        body = {"model": self.model, "messages": messages, "temperature": self.temperature}
        try:
            r = httpx.post(self.url, json=body, headers=self.headers, timeout=self.timeout)
        except httpx.HTTPError as e:
            raise JudgeError(f"the judge at {self.url} could not be reached: {e!r}") from e
        if r.status_code == 400:
            # Typically the prompt is over the model's context: this trajectory only.
            raise AnnotationError(f"the judge refused the request (HTTP 400: {r.text[:300]}); "
                                  "if the prompt is too long, lower max_chars_per_turn")
        if r.status_code != 200:
            raise JudgeError(f"the judge at {self.url} answered HTTP {r.status_code}: "
                             f"{r.text[:300]} (is base_url the API root ending in /v1, and "
                             "the model name and API key right?)")
        try:
            return _text(r.json()["choices"][0]["message"]["content"])
        except (ValueError, LookupError, TypeError) as e:
            raise JudgeError(f"the judge at {self.url} did not answer as an OpenAI chat "
                             f"completion ({e!r}): {r.text[:300]}") from e
