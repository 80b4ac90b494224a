"""The scripted teacher drawing its script per rollout (``TeacherHarness(per_sample=True)``),
driven turn by turn as mini-swe-agent drives it: no sandbox, the policy function itself."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from orchard.domains.swe.bugfix_family import bugfix_family
from orchard.domains.swe.harness import TeacherHarness
from orchard.tasks import SUBMIT_COMMAND as SUBMIT


def rollout(harness: TeacherHarness, statement: str) -> tuple[str, ...]:
    """The commands of one rollout; tool-call arguments come back as JSON text, as the
    OpenAI wire format carries them."""
    messages = [{"role": "system", "content": "You fix issues."},
                {"role": "user", "content": statement}]
    commands: list[str] = []
    while not commands or commands[-1] != SUBMIT:
        reply = harness.policy(messages, tools=None)
        command = reply.tool_calls[0].arguments["command"]
        commands.append(command)
        messages += [{"role": "assistant", "content": reply.content, "tool_calls": [
                         {"id": f"c{len(commands)}", "type": "function", "function": {
                             "name": "bash", "arguments": json.dumps({"command": command})}}]},
                     {"role": "tool", "tool_call_id": f"c{len(commands)}", "content": "0"}]
        assert len(commands) < 10, "the teacher never submitted"
    return tuple(commands)


def test_each_rollout_follows_one_script_drawn_with_the_solve_odds() -> None:
    task = bugfix_family(3, 0, seed=0)[0]
    scripts = task.metadata["teacher"]
    solving = tuple(c for _, c in scripts["solve"])
    failing = [tuple(c for _, c in f) for f in scripts["fail"]]
    harness = TeacherHarness([task], solve=0.5, per_sample=True, seed=7)
    drawn = Counter(rollout(harness, task.problem_statement) for _ in range(300))
    assert set(drawn) == {solving, *failing}
    assert 0.4 < drawn[solving] / 300 < 0.6
    for fail in failing:
        assert 0.15 < drawn[fail] / 300 < 0.35


def test_per_sample_at_the_extremes_and_without_a_share() -> None:
    task = bugfix_family(1, 0, seed=1)[0]
    solving = tuple(c for _, c in task.metadata["teacher"]["solve"])
    always = TeacherHarness([task], solve=1.0, per_sample=True)
    assert {rollout(always, task.problem_statement) for _ in range(20)} == {solving}
    never = TeacherHarness([task], solve=0.0, per_sample=True)
    assert solving not in {rollout(never, task.problem_statement) for _ in range(20)}
    with pytest.raises(ValueError, match="give solve as a float"):
        TeacherHarness([task], solve=[task.instance_id], per_sample=True)
