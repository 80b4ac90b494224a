"""Value curves, credits and rise segments; the retrospective annotator against a real HTTP judge
(the scripted teacher) whose replies range from clean JSON to garbage."""

from __future__ import annotations

import json
import math
from collections import deque
from typing import Any

import pytest

from orchard.recipes.credit import (
    AnnotationError,
    JudgeError,
    RetrospectiveAnnotator,
    ValueCurve,
    annotate_all,
    interpolate,
    key_steps,
)
from orchard.recipes.trajectories import Trajectory
from orchard.rollout.tokenizer import TEST_TOKENIZER, load_tokenizer
from orchard.testing.teacher import FunctionPolicy, TeacherServer

BASH_TOOL = {"type": "function", "function": {
    "name": "bash", "description": "Run a command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                   "required": ["command"]}}}
TASK = "Fix the off-by-one in paginate(): the last page is always dropped."
TEST_OUTPUT = "FAILED tests/test_pages.py::test_last_page - assert 2 == 3\n1 failed, 9 passed"


def curve(values: list[float]) -> ValueCurve:
    return ValueCurve(values, list(range(len(values))), "test")


def trajectory(n_steps: int = 4, *, resolved: bool = False, rollout_id: str = "r1",
               observation: str | None = None) -> Trajectory:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                      {"role": "user", "content": TASK}]
    for t in range(n_steps):
        messages.append({"role": "assistant", "content": f"I will try idea-{t}.",
                         "tool_calls": [{"id": f"call{t}", "type": "function", "function": {
                             "name": "bash", "arguments": json.dumps({"command": f"cmd-{t}"})}}]})
        messages.append({"role": "tool", "tool_call_id": f"call{t}",
                         "content": observation or f"output-{t}"})
    return Trajectory(rollout_id=rollout_id, instance_id="pages__1", messages=messages,
                      tools=[BASH_TOOL], resolved=resolved, reward=1.0 if resolved else -1.0,
                      test_output="" if resolved else TEST_OUTPUT)


# --- interpolation and key steps ------------------------------------------------------------

def test_interpolate_is_linear_between_points_and_constant_outside():
    assert interpolate({2: 0.2, 4: 0.6}, 7) == pytest.approx([0.2, 0.2, 0.2, 0.4, 0.6, 0.6, 0.6])
    assert interpolate({0: 0.0, 3: 0.9}, 4) == pytest.approx([0.0, 0.3, 0.6, 0.9])
    assert interpolate({1: 0.5}, 3) == [0.5, 0.5, 0.5]
    assert interpolate({0: 1}, 1) == [1.0]


@pytest.mark.parametrize(("points", "n_states", "match"), [
    ({}, 3, "at least one point"),
    ({3: 0.5}, 3, "not a state"),
    ({-1: 0.5}, 3, "not a state"),
    ({True: 0.5}, 3, "not a state"),
    ({"1": 0.5}, 3, "not a state"),
    ({0: 1.5}, 3, r"in \[0, 1\]"),
    ({0: -0.1}, 3, r"in \[0, 1\]"),
    ({0: math.nan}, 3, r"in \[0, 1\]"),
    ({0: 0.5}, 0, "at least one state"),
])
def test_interpolate_rejects_bad_input(points, n_states, match):
    with pytest.raises(ValueError, match=match):
        interpolate(points, n_states)


def test_key_steps_are_all_states_when_few():
    assert key_steps(0) == [0]
    assert key_steps(3) == [0, 1, 2, 3]
    assert key_steps(7, max_points=8) == list(range(8))


def test_key_steps_are_spread_evenly_with_both_ends():
    assert key_steps(14, max_points=8) == [0, 2, 4, 6, 8, 10, 12, 14]
    assert key_steps(14, max_points=4) == [0, 5, 9, 14]
    for n_steps in range(0, 120):
        for max_points in (2, 3, 8, 16):
            ks = key_steps(n_steps, max_points)
            assert ks[0] == 0 and ks[-1] == n_steps
            assert len(ks) == min(n_steps + 1, max_points)
            assert all(a < b for a, b in zip(ks, ks[1:], strict=False))
            gaps = [b - a for a, b in zip(ks, ks[1:], strict=False)]
            assert not gaps or max(gaps) - min(gaps) <= 1


def test_key_steps_reject_bad_input():
    with pytest.raises(ValueError, match="max_points"):
        key_steps(10, max_points=1)
    with pytest.raises(ValueError, match="n_steps"):
        key_steps(-1)


# --- curves, credits, rise segments -----------------------------------------------------------

def test_credits_are_differences_of_consecutive_values():
    assert curve([0.2, 0.5, 0.5, 0.1]).credits == pytest.approx([0.3, 0.0, -0.4])
    assert curve([0.7]).credits == []


def test_rise_segments_are_maximal_runs():
    values = [0.0, 0.1, 0.3, 0.3, 0.6, 0.5, 0.56, 0.63]  # credits .1 .2 0 .3 -.1 .06 .07
    assert curve(values).rise_segments() == [(0, 2), (3, 4), (5, 7)]


def test_rise_segments_none_and_all():
    assert curve([0.5, 0.5, 0.52, 0.4, 0.0]).rise_segments() == []
    assert curve([0.0, 0.2, 0.4, 0.6, 0.8, 1.0]).rise_segments() == [(0, 5)]
    assert curve([0.3]).rise_segments() == []


def test_rise_segments_eps_boundary_counts_as_rising():
    assert curve([0.0, 0.5]).rise_segments(eps=0.5) == [(0, 1)]
    # 0.15 - 0.1 is 0.04999999999999999 in floats: still a rise of eps.
    assert curve([0.1, 0.15, 0.2]).rise_segments(eps=0.05) == [(0, 2)]
    assert curve([0.1, 0.149]).rise_segments(eps=0.05) == []
    assert curve([0.0, 0.5, 0.5]).rise_segments(eps=0.5000001) == []
    with pytest.raises(ValueError, match="positive"):
        curve([0.0, 1.0]).rise_segments(eps=0)


def test_value_curve_validates():
    with pytest.raises(ValueError, match=r"values\[1\]"):
        ValueCurve([0.1, 1.2], [0, 1], "test")
    with pytest.raises(ValueError, match="empty"):
        ValueCurve([], [], "test")
    with pytest.raises(ValueError, match="key_steps"):
        ValueCurve([0.1, 0.2], [0, 2], "test")


def test_value_curve_json_round_trip():
    c = ValueCurve([0.2, 0.4, 0.0], [0, 2], "retrospective",
                   {"replies": ["{...}"], "clamped": {"1": 1.4}})
    back = ValueCurve.from_json(c.to_json())
    assert back == c
    assert back.rise_segments() == [(0, 1)]
    with pytest.raises(ValueError, match="not a value curve"):
        ValueCurve.from_json('{"values": [0.5]}')
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        ValueCurve.from_json('{"values": [2], "key_steps": [0], "source": "x"}')


# --- the retrospective annotator against a scripted judge ---------------------------------------

class Judge:
    """The judge's replies, in order, and every conversation it was sent."""

    def __init__(self) -> None:
        self.replies: deque[str] = deque()
        self.requests: list[list[dict[str, Any]]] = []

    def __call__(self, messages: list[dict[str, Any]], tools: Any) -> str:
        self.requests.append(messages)
        return self.replies.popleft()


@pytest.fixture(scope="module")
def server():
    judge = Judge()
    with TeacherServer(FunctionPolicy(judge), load_tokenizer(TEST_TOKENIZER)) as teacher:
        yield teacher, judge


@pytest.fixture
def judge(server) -> Judge:
    _, judge = server
    judge.replies.clear()
    judge.requests.clear()
    return judge


@pytest.fixture
def annotator(server) -> RetrospectiveAnnotator:
    teacher, _ = server
    return RetrospectiveAnnotator(f"{teacher.url}/v1", teacher.model_name)


def test_well_formed_reply(annotator, judge):
    reply = '{"values": {"0": 0.2, "1": 0.5, "2": 0.6, "3": 0.3}}'
    judge.replies.append(reply)
    c = annotator.annotate(trajectory(4))
    assert c.values == pytest.approx([0.2, 0.5, 0.6, 0.3, 0.0])  # the final state pinned
    assert c.key_steps == [0, 1, 2, 3, 4]
    assert c.source == "retrospective"
    assert c.rise_segments() == [(0, 2)]
    assert c.detail["replies"] == [reply]
    assert c.detail["missing"] == []
    assert not {"clamped", "unreadable", "ignored", "retry_reason"} & set(c.detail)

    [request] = judge.requests
    assert [m["role"] for m in request] == ["user"]
    prompt = request[0]["content"]
    assert TASK in prompt
    for t in range(4):
        assert f"### Step {t}\n" in prompt
        assert f"idea-{t}" in prompt and f"cmd-{t}" in prompt and f"output-{t}" in prompt
    assert "### Step 4" not in prompt
    assert prompt.index("### Step 1") < prompt.index("output-1") < prompt.index("### Step 2")
    assert "NOT resolved" in prompt and TEST_OUTPUT in prompt
    assert "You are a coding agent" not in prompt  # the harness's system prompt is not the task
    assert "steps 0, 1, 2, 3" in prompt and '"values"' in prompt


def test_sparse_key_steps_are_interpolated(server, judge):
    teacher, _ = server
    annotator = RetrospectiveAnnotator(f"{teacher.url}/v1", "teacher", max_points=4)
    judge.replies.append('{"values": {"0": 0.1, "5": 0.6, "9": 0.2}}')
    c = annotator.annotate(trajectory(14))
    assert c.key_steps == [0, 5, 9, 14]
    assert len(c.values) == 15
    assert c.values[:6] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    assert c.values[9:] == pytest.approx([0.2, 0.16, 0.12, 0.08, 0.04, 0.0])
    assert c.rise_segments() == [(0, 5)]
    prompt = judge.requests[0][0]["content"]
    assert "steps 0, 5, 9" in prompt and "### Step 13\n" in prompt


def test_fenced_json_with_prose_and_thoughts(annotator, judge):
    judge.replies.append(
        "Looking back, the agent found the bug at step 1 and then broke it.\n"
        '```json\n{"values": {"0": 0.3, "1": 0.7, "2": 0.4, "3": 0.1,}}\n```\n'
        "I hope this {helps}.")
    c = annotator.annotate(trajectory(4))
    assert c.values == pytest.approx([0.3, 0.7, 0.4, 0.1, 0.0])


def test_percentages_numeric_strings_and_step_keys(annotator, judge):
    judge.replies.append('Scores: {"values": {"Step 0": "70%", "s_1": "85 %", "2": "0.5", '
                         '"step 3": 40%}}')
    c = annotator.annotate(trajectory(4))
    assert c.values == pytest.approx([0.7, 0.85, 0.5, 0.4, 0.0])
    assert c.detail["missing"] == []


def test_bare_step_map_after_thoughts(annotator, judge):
    judge.replies.append('<think>Maybe {"0": 0.99}? No.</think>\n'
                         '{"0": 0.25, "1": 0.25, "2": 0.75, "3": 0.5}')
    c = annotator.annotate(trajectory(4))
    assert c.values == pytest.approx([0.25, 0.25, 0.75, 0.5, 0.0])
    assert c.rise_segments() == [(1, 2)]


def test_out_of_range_values_are_clamped_and_recorded(annotator, judge):
    judge.replies.append('{"values": {"0": 1.3, "1": -0.2, "2": 0.5, "3": 70}}')
    c = annotator.annotate(trajectory(4))
    assert c.values == pytest.approx([1.0, 0.0, 0.5, 1.0, 0.0])
    assert c.detail["clamped"] == {"0": 1.3, "1": -0.2, "3": 70}


def test_missing_unreadable_and_extra_keys(annotator, judge):
    judge.replies.append('{"values": {"0": 0.2, "1": "unsure", "2": 0.6, "4": 0.9, '
                         '"7": 0.5}, "note": "x"}')
    c = annotator.annotate(trajectory(4))
    # Step 1 from steps 0 and 2; step 3 from step 2 and the pinned outcome at step 4.
    assert c.values == pytest.approx([0.2, 0.4, 0.6, 0.3, 0.0])
    assert c.key_steps == [0, 2, 4]
    assert c.detail["missing"] == [1, 3]
    assert c.detail["unreadable"] == {"1": "unsure"}
    assert c.detail["ignored"] == {"4": 0.9, "7": 0.5}  # the final state is not the judge's


def test_resolved_trajectory_is_pinned_to_one(annotator, judge):
    judge.replies.append('{"values": {"0": 0.4, "1": 0.8}}')
    c = annotator.annotate(trajectory(2, resolved=True))
    assert c.values == pytest.approx([0.4, 0.8, 1.0])
    prompt = judge.requests[0][0]["content"]
    assert "RESOLVED" in prompt and "NOT resolved" not in prompt


def test_long_turns_are_cut_to_head_and_tail(server, judge):
    teacher, _ = server
    annotator = RetrospectiveAnnotator(f"{teacher.url}/v1", "teacher", max_chars_per_turn=200)
    long = "HEAD-MARK " + "x" * 3000 + " MIDDLE-MARK " + "y" * 3000 + " TAIL-MARK"
    judge.replies.append('{"values": {"0": 0.5}}')
    annotator.annotate(trajectory(1, observation=long))
    prompt = judge.requests[0][0]["content"]
    assert "HEAD-MARK" in prompt and "TAIL-MARK" in prompt and "MIDDLE-MARK" not in prompt
    assert f"{long[:100]}\n[... {len(long) - 200} characters cut ...]\n{long[-100:]}" in prompt


def test_garbage_then_good_retries_with_a_correction(annotator, judge):
    judge.replies.extend(["I cannot really tell, it depends.",
                          '{"values": {"0": 0.5, "1": 0.6, "2": 0.7, "3": 0.2}}'])
    c = annotator.annotate(trajectory(4))
    assert c.values == pytest.approx([0.5, 0.6, 0.7, 0.2, 0.0])
    assert len(judge.requests) == 2
    first, second = judge.requests
    assert second[0] == first[0]
    assert second[1] == {"role": "assistant", "content": "I cannot really tell, it depends."}
    assert second[2]["role"] == "user"
    assert "no usable value" in second[2]["content"]
    assert "no JSON object" in second[2]["content"] and "0, 1, 2, 3" in second[2]["content"]
    assert len(c.detail["replies"]) == 2
    assert c.detail["retry_reason"] == "no JSON object in the reply"


def test_garbage_twice_raises(annotator, judge):
    judge.replies.extend(["No idea.", '{"values": {"0": "high", "1": null}}'])
    with pytest.raises(AnnotationError, match=r"no usable value in 2 replies \(no JSON object "
                                              r"with a number for any of the steps 0, 1, 2, 3"):
        annotator.annotate(trajectory(4))
    assert len(judge.requests) == 2


def test_trajectory_without_steps_needs_no_judge(annotator, judge):
    c = annotator.annotate(trajectory(0))
    assert c.values == [0.0] and c.key_steps == [0] and c.credits == []
    assert judge.requests == []


def test_trajectory_without_task_is_an_annotation_error(annotator, judge):
    traj = trajectory(2)
    traj.messages = [m for m in traj.messages if m["role"] != "user"]
    with pytest.raises(AnnotationError, match="no user message"):
        annotator.annotate(traj)


def test_http_errors(server, annotator, judge):
    teacher, _ = server
    teacher.fail_next(400, "This model's maximum context length is 4096 tokens")
    with pytest.raises(AnnotationError, match="HTTP 400.*maximum context length"):
        annotator.annotate(trajectory(2))
    teacher.fail_next(503, "overloaded")
    with pytest.raises(JudgeError, match="HTTP 503"):
        annotator.annotate(trajectory(2))
    wrong_model = RetrospectiveAnnotator(f"{teacher.url}/v1", "no-such-model")
    with pytest.raises(JudgeError, match="HTTP 404"):
        wrong_model.annotate(trajectory(2))
    with pytest.raises(JudgeError, match="could not be reached"):
        RetrospectiveAnnotator("http://127.0.0.1:1/v1", "teacher").annotate(trajectory(2))
    assert judge.requests == []


def test_annotate_all(annotator, judge):
    trajs = [trajectory(2, resolved=True, rollout_id="ok"), trajectory(2, rollout_id="good"),
             trajectory(2, rollout_id="bad")]
    judge.replies.extend(['{"values": {"0": 0.3, "1": 0.6}}', "?", "??"])
    curves, failures = annotate_all(annotator, trajs)
    assert list(curves) == ["good"] and list(failures) == ["bad"]
    assert curves["good"].values == pytest.approx([0.3, 0.6, 0.0])
    assert "no usable value" in failures["bad"]
    assert len(judge.requests) == 3  # the resolved one was never sent

    judge.replies.append('{"values": {"0": 0.5, "1": 0.9}}')
    curves, failures = annotate_all(annotator, trajs[:1], skip_resolved=False)
    assert curves["ok"].values == pytest.approx([0.5, 0.9, 1.0]) and failures == {}
    with pytest.raises(ValueError, match="given twice"):
        annotate_all(annotator, [trajs[0], trajs[0]], skip_resolved=True)
