"""The format-only control: conversations that open as real rollouts do, call the bash tool in
the exact form the chat template renders and the proxy parses back, never fix anything, and
train under the SFT masks."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from minisweagent.models.utils.actions_toolcall import format_toolcall_observation_messages

from orchard.domains.swe.bugfix_family import bugfix_family
from orchard.domains.swe.format_control import (
    format_control_conversation,
    format_control_examples,
    looks,
)
from orchard.domains.swe.harness import TeacherHarness
from orchard.domains.swe.minisweagent import config_from_specs
from orchard.domains.swe.model import SweTask
from orchard.domains.swe.workspace import open_task_sandbox
from orchard.env.client import SandboxClient
from orchard.eval import RunConfig, evaluate
from orchard.recipes.demo import COMPACT_CONFIG
from orchard.recipes.trajectories import load_trajectories
from orchard.rollout.proxy.render import parse_tool_calls
from orchard.rollout.tokenizer import TEST_TOKENIZER, load_tokenizer
from orchard.tasks.protocol import SUBMIT_COMMAND
from tests.conftest import needs_root


@pytest.fixture(scope="module")
def tasks() -> list[SweTask]:
    return bugfix_family(n_train=6, n_test=0, seed=1)


def _spans(mask: list[int]) -> list[tuple[int, int]]:
    spans, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    return spans


def test_every_trained_turn_parses_back_as_one_bash_call_that_fixes_nothing(
        tasks: list[SweTask]) -> None:
    tokenizer = load_tokenizer(TEST_TOKENIZER)
    examples = format_control_examples(tasks, tokenizer, samples=2, seed=0)
    assert len(examples) == 2 * len(tasks)
    by_task = {t.instance_id: t for t in tasks}
    commands = []
    for example in examples:
        task = by_task[example.instance_id]
        allowed = {c for c, _ in looks(task)} | {SUBMIT_COMMAND}
        spans = _spans(example.loss_mask)
        assert len(spans) == len(example.trained_steps) >= 2
        for i, (a, b) in enumerate(spans):
            text = tokenizer.decode(example.input_ids[a:b])
            assert text.endswith(tokenizer.eos_token)
            content, calls = parse_tool_calls(text.removesuffix(tokenizer.eos_token))
            assert content and len(calls) == 1 and calls[0]["function"]["name"] == "bash"
            command = json.loads(calls[0]["function"]["arguments"])["command"]
            assert command in allowed
            assert (command == SUBMIT_COMMAND) == (i == len(spans) - 1)  # then submits
            commands.append(command)
            # Neither the fixed line nor an edit of the file it lives in.
            fix = task.metadata["fix"]
            assert fix["right"].strip() not in text and fix["path"] not in command
        # The observations are not trained: only the assistant turns are.
        everything = tokenizer.decode(example.input_ids)
        assert task.problem_statement in everything
        assert task.metadata["fix"]["right"].strip() not in everything
    assert len(set(commands)) > 4  # the looks vary across tasks and samples


def test_observations_are_what_the_commands_print(tasks: list[SweTask]) -> None:
    task = tasks[0]
    found = dict(looks(task))
    assert found["ls"].split() == sorted({p.split("/")[0] for p in task.source.files
                                          if not p.startswith(".")})
    assert found["git status --short"] == ""
    read = [c for c in found if c.startswith("cat ")]
    assert read and all(found[c] == task.source.files[c.removeprefix("cat ")] for c in read)
    assert f"cat {task.metadata['fix']['path']}" not in found
    config = config_from_specs([COMPACT_CONFIG])
    messages = format_control_conversation(task, config, random.Random(0))
    for call, answer in zip(messages[2::2], messages[3::2], strict=False):
        command = json.loads(call["tool_calls"][0]["function"]["arguments"])["command"]
        # What mini-swe-agent itself makes of that output.
        (real,) = format_toolcall_observation_messages(
            actions=[{"command": command, "tool_call_id": call["tool_calls"][0]["id"]}],
            outputs=[{"output": found[command], "returncode": 0, "exception_info": ""}],
            observation_template=config["model"]["observation_template"])
        assert answer == {k: v for k, v in real.items() if k != "extra"}


def test_tasks_without_inline_files_are_refused(tasks: list[SweTask]) -> None:
    task = tasks[0].model_copy(update={"source": tasks[0].source.model_copy(
        update={"kind": "image", "files": None})})
    with pytest.raises(ValueError, match="inline files"):
        looks(task)


@needs_root
def test_the_opening_turns_and_observations_are_a_real_rollouts(
        orchestrator: str, tasks: list[SweTask], tmp_path: Path) -> None:
    config = config_from_specs([COMPACT_CONFIG])
    with SandboxClient(orchestrator) as client:
        evaluate(tasks[:1], TeacherHarness(tasks[:1], solve=0.0, config=config), tmp_path,
                 client, config=RunConfig(out=tmp_path, grade=False))
        sandbox = open_task_sandbox(client, tasks[0], labels={"orchard.dev/purpose": "test"})
        try:
            tasks[0].set_up(sandbox)
            for command, output in looks(tasks[0]):
                job = sandbox.exec(["bash", "-lc", command], cwd=tasks[0].workdir, timeout=30)
                assert (job.exit_code, job.stdout) == (0, output), command
        finally:
            sandbox.delete()
    (real,) = load_trajectories(tmp_path)
    ours = format_control_conversation(tasks[0], config, random.Random(0))
    assert [(m["role"], m["content"]) for m in ours[:2]] == [
        (m["role"], m["content"]) for m in real.messages[:2]]
    # The assistant and tool turns have the shape the recorded ones have.
    assert {k for m in real.messages[2:] for k in m} >= {k for m in ours[2:] for k in m}
