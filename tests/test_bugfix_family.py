"""The bug-fix family: its fixes are only in what the sandbox shows, no held-out task shares a
solving script with a training one, and a policy that ignores observations scores near chance.

The repositories are laid out in temp dirs and graded by their hidden tests, as the grader
does in a sandbox (tests/test_recipes_pipeline.py runs them there, with pytest)."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from orchard.domains.swe.bugfix_family import (
    HIDDEN_TESTS,
    KINDS,
    SPEC,
    blind_fix,
    bugfix_family,
    solving_script,
)
from orchard.domains.swe.model import SweTask

TASKS = bugfix_family(128, 64, seed=0)
TRAIN = [t for t in TASKS if t.split == "train"]
TEST = [t for t in TASKS if t.split == "test"]


def lay_out(task: SweTask, where: Path) -> Path:
    for path, text in (task.source.files or {}).items():
        (where / path).parent.mkdir(parents=True, exist_ok=True)
        (where / path).write_text(text)
    return where


def run(commands: list[str], where: Path) -> None:
    for command in commands:
        subprocess.run(["bash", "-c", command], cwd=where, check=True, capture_output=True)


# Runs each hidden test function in a fresh interpreter, as pytest would, without pytest's
# start-up (a second or more a task on a loaded 2-core machine). The sandbox tests grade with
# pytest itself.
RUNNER = """
import importlib, sys, traceback
sys.path.insert(0, ".")
module = importlib.import_module(sys.argv[1])
for name in dir(module):
    if name.startswith("test_"):
        try:
            getattr(module, name)()
        except Exception:
            continue
        print(name)
"""


def passing(task: SweTask, where: Path) -> set[str]:
    """The hidden tests that pass in ``where``, as the grader's ids."""
    if not (where / HIDDEN_TESTS).exists():
        subprocess.run(["git", "apply", "-"], input=task.test_patch, text=True, cwd=where,
                       check=True)
    done = subprocess.run([sys.executable, "-B", "-c", RUNNER, HIDDEN_TESTS.removesuffix(".py")],
                          cwd=where, capture_output=True, text=True, check=True)
    return {f"{HIDDEN_TESTS}::{name}" for name in done.stdout.split()}


def resolved(task: SweTask, where: Path) -> bool:
    return set(task.FAIL_TO_PASS + task.PASS_TO_PASS) <= passing(task, where)


def fix_commands(script: list[list[str]]) -> list[str]:
    return [command for _, command in script[1:] if "COMPLETE_TASK" not in command]


def test_same_seed_same_tasks_and_every_kind_in_both_splits() -> None:
    assert [t.model_dump() for t in bugfix_family(9, 3, seed=4)] == \
        [t.model_dump() for t in bugfix_family(9, 3, seed=4)]
    assert len(TRAIN) == 128 and len(TEST) == 64
    for split in (TRAIN, TEST):
        assert Counter(t.metadata["kind"] for t in split).keys() == set(KINDS)
    assert len({t.problem_statement for t in TASKS}) == len(TASKS)


def test_no_held_out_task_shares_a_solving_script_with_training() -> None:
    train_scripts = {solving_script(t) for t in TRAIN}
    assert not any(solving_script(t) in train_scripts for t in TEST)


def test_the_issue_never_gives_the_fix_but_the_sandbox_does() -> None:
    for task in TASKS:
        fix = task.metadata["fix"]
        right = fix["right"].strip()
        assert right not in task.problem_statement
        assert fix["path"] in task.problem_statement
        files = task.source.files or {}
        shown = files[SPEC] if task.metadata["kind"] == "spec" else "".join(
            text for path, text in files.items() if path.startswith("tests/"))
        value = right.split(" = ")[-1].strip('"') if " = " in right else None
        if value is not None:
            assert value in shown, task.instance_id  # the spec or a visible test states it
        else:  # an operator: a visible test's message gives the result it must have
            assert f'"{fix["name"]}(' in shown


@pytest.mark.parametrize("task", [t for k in KINDS
                                  for t in [t for t in TASKS if t.metadata["kind"] == k][:3]],
                         ids=lambda t: t.instance_id)
def test_gold_and_teacher_scripts_agree_with_the_hidden_tests(task: SweTask,
                                                              tmp_path: Path) -> None:
    start = lay_out(task, tmp_path / "start")
    assert passing(task, start) == set(task.PASS_TO_PASS)  # only the bug fails at first
    teacher = task.metadata["teacher"]
    solved = lay_out(task, tmp_path / "solved")
    run(fix_commands(teacher["solve"]), solved)
    assert resolved(task, solved)
    gold = lay_out(task, tmp_path / "gold")
    subprocess.run(["git", "apply", "-"], input=task.patch, text=True, cwd=gold, check=True)
    assert (gold / task.metadata["fix"]["path"]).read_text() == \
        (solved / task.metadata["fix"]["path"]).read_text()
    for i, failing in enumerate(teacher["fail"]):
        where = lay_out(task, tmp_path / f"fail-{i}")
        run(fix_commands(failing), where)
        assert not resolved(task, where)


@pytest.mark.parametrize("task", [t for k in KINDS
                                  for t in [t for t in TASKS if t.metadata["kind"] == k][:3]],
                         ids=lambda t: t.instance_id)
def test_the_teachers_fix_needs_no_value_it_has_not_read(task: SweTask, tmp_path: Path) -> None:
    # The wrong value is never shown to the agent. The teacher's fix must work whatever it
    # is, or its demonstrations would teach a policy to guess it.
    fix, kind = task.metadata["fix"], task.metadata["kind"]
    where = lay_out(task, tmp_path)
    path = where / fix["path"]
    if kind == "operator":
        other = next(f"    return a {op} b" for op in "+-*"
                     if f" {op} " not in fix["wrong"] + fix["right"])
        head = f"def {fix['name']}(a, b):\n"
        text = path.read_text().replace(head + fix["wrong"], head + other)
    else:
        other = f'{fix["name"]} = ' + ("1234" if kind == "spec" else '"zz"')
        text = path.read_text().replace(fix["wrong"] + "\n", other + "\n")
    assert text != path.read_text()
    path.write_text(text)
    run(fix_commands(task.metadata["teacher"]["solve"]), where)
    assert resolved(task, where)


def test_a_policy_that_ignores_observations_scores_near_chance(tmp_path: Path) -> None:
    blind = blind_fix(TRAIN)
    outcomes: dict[str, list[bool]] = {k: [] for k in KINDS}
    for task in TEST:
        where = lay_out(task, tmp_path / task.instance_id)
        run([blind(task)], where)
        outcomes[task.metadata["kind"]].append(resolved(task, where))
    rate = {k: sum(v) / len(v) for k, v in outcomes.items()}
    # Chance: a number in 2..999; one of three operators; one of eight strings.
    assert rate["spec"] == 0.0
    assert rate["operator"] <= 0.6 and rate["string"] <= 0.35, rate
    assert sum(map(sum, outcomes.values())) / len(TEST) <= 0.3, rate
    # The same harness of lay-out, command and hidden tests resolves every task that reads.
    for task in TEST[:6]:
        where = lay_out(task, tmp_path / f"read-{task.instance_id}")
        run(fix_commands(task.metadata["teacher"]["solve"]), where)
        assert resolved(task, where)


def test_asking_for_a_negative_count_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        bugfix_family(-1, 1)


def test_the_hindsight_judge_credits_the_fix_and_not_the_break() -> None:
    import json

    from orchard.domains.swe.demo import hindsight_judge
    from orchard.recipes.credit import RetrospectiveAnnotator
    from orchard.recipes.trajectories import Trajectory
    from orchard.rollout.tokenizer import TEST_TOKENIZER, load_tokenizer
    from orchard.testing.teacher import FunctionPolicy, TeacherServer

    def played(task: SweTask, script: list[list[str]]) -> Trajectory:
        messages: list[dict] = [{"role": "user", "content": task.problem_statement}]
        for t, (thought, command) in enumerate(script):
            messages += [{"role": "assistant", "content": thought, "tool_calls": [
                {"id": f"c{t}", "type": "function", "function": {
                    "name": "bash", "arguments": json.dumps({"command": command})}}]},
                {"role": "tool", "tool_call_id": f"c{t}", "content": "ok"}]
        return Trajectory("r", task.instance_id, messages, [], resolved=False, reward=-1.0)

    with TeacherServer(FunctionPolicy(hindsight_judge(TRAIN)), load_tokenizer(TEST_TOKENIZER),
                       model_name="judge") as judge:
        annotator = RetrospectiveAnnotator(f"{judge.url}/v1", "judge")
        for task in TRAIN[:3]:
            fix_then_break, wrong_fix = task.metadata["teacher"]["fail"]
            # look, fix, break, submit: the fix (step 1) is the only rise.
            curve = annotator.annotate(played(task, fix_then_break))
            assert curve.rise_segments(0.05) == [(1, 2)], curve.values
            assert annotator.annotate(played(task, wrong_fix)).rise_segments(0.05) == []
