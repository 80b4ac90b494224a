"""The Task protocol and the domain registry, without sandboxes: every registered domain's tasks
satisfy the protocol, the registry resolves every task-set name the CLI accepted before, and an
unknown name, harness or demo is a clear error naming the choices."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchard.domains import (
    DOMAINS,
    demo_names,
    domain,
    domain_of,
    harness_names,
    load_tasks,
    make_harness,
    resolve,
    task_set_names,
)
from orchard.domains.assistant import AssistantGrade
from orchard.domains.swe import SweGrade
from orchard.domains.web import WebGrade
from orchard.eval.results import RolloutResult
from orchard.tasks import SUBMIT_COMMAND, SUBMIT_MARKER, Grade, Submission, Task, TaskLoadError

NAMED = {"bundled": "swe", "humaneval": "swe", "settings": "swe", "bugfix": "swe",
         "web": "web", "web-live": "web", "miniwob": "web", "miniwob-untimed": "web",
         "assistant": "assistant",
         "assistant-hand": "assistant", "assistant-generated": "assistant"}


@pytest.mark.parametrize(("name", "expected"), NAMED.items())
def test_the_registry_resolves_every_named_set(name: str, expected: str) -> None:
    assert resolve(name).name == expected


def test_task_files_go_to_their_domain(tmp_path: Path) -> None:
    web, helped, rows = tmp_path / "w.yaml", tmp_path / "a.yaml", tmp_path / "t.jsonl"
    web.write_text("- instance_id: w\n  goal: g\n")
    helped.write_text("- instance_id: a\n  world: {}\n")
    rows.write_text("")
    assert [resolve(p).name for p in (web, helped, rows, tmp_path)] == ["web", "assistant",
                                                                       "swe", "swe"]


def test_an_unknown_set_names_the_choices(tmp_path: Path) -> None:
    with pytest.raises(TaskLoadError, match="no task set at .*nope.* bundled, .*web-live"):
        resolve(tmp_path / "nope")


def test_unknown_harness_domain_and_demo_name_the_choices() -> None:
    with pytest.raises(ValueError, match="unknown harness 'x'; choose one of oracle, teacher, "
                                         "mini-swe-agent, harbor-oracle, web-teacher"):
        make_harness("x", [])
    with pytest.raises(ValueError, match="no domain 'x'; the domains: assistant, web, harbor, "
                                         "swe"):
        domain("x")
    with pytest.raises(ValueError,
                       match="no demo domain 'x': swe, bugfix, bugfix-read, web, assistant"):
        from orchard.domains import demo_domain

        demo_domain("x", {})
    assert set(harness_names()) == {"oracle", "teacher", "mini-swe-agent", "web-teacher",
                                    "browser-agent", "miniwob-solver", "random-browser",
                                    "assistant-teacher", "assistant", "harbor-oracle"}
    assert demo_names() == ["swe", "bugfix", "bugfix-read", "web", "assistant"]


@pytest.mark.parametrize("source", task_set_names())  # every named set of every domain
def test_every_domain_s_tasks_satisfy_the_protocol(source: str) -> None:
    d, tasks = load_tasks(source)
    assert tasks and d is resolve(source)
    for task in tasks:
        assert isinstance(task, Task) and domain_of(task) is d
        assert task.prompt.strip() and task.budget.wall_time > 0
        spec = task.sandbox_spec()
        # A served domain's state lives in processes: only live forks or replays keep it.
        assert spec.served == task.graded_in_rollout == (d.name != "swe")
        assert len(d.listing.row(task)) == len(d.listing.columns)


def test_a_served_task_grades_only_the_rollout_s_sandbox() -> None:
    _, (task, *_) = load_tasks("web")
    with pytest.raises(ValueError, match="graded in the rollout's sandbox"):
        task.grade(None, Submission(answer="x"))  # type: ignore[arg-type]


def test_a_swe_task_grades_an_empty_patch_without_a_sandbox() -> None:
    _, (task, *_) = load_tasks("bundled")
    # No client is touched: no submission is graded without a sandbox.
    grade = task.grade(None, Submission(patch=""))  # type: ignore[arg-type]
    assert isinstance(grade, SweGrade) and grade.outcome == "empty_patch" and not grade.resolved


def test_a_harness_refuses_tasks_of_another_domain() -> None:
    _, web = load_tasks("web")
    with pytest.raises(ValueError, match="web tasks run with web-teacher or browser-agent or "
                                         "miniwob-solver or random-browser, not 'oracle'"):
        make_harness("oracle", web)
    _, swe = load_tasks("bundled")
    with pytest.raises(ValueError, match="swe tasks run with oracle or teacher or "
                                         "mini-swe-agent, not 'assistant-teacher'"):
        make_harness("assistant-teacher", swe)


@pytest.mark.parametrize("grade", [
    SweGrade(instance_id="a", resolved=False, reward=-1, outcome="tests_failed",
             f2p_total=2, f2p_passed=1, f2p_failing=["t::x"]),
    WebGrade(instance_id="a", resolved=True, reward=1, outcome="resolved", reason="ok",
             answer="42"),
    AssistantGrade(instance_id="a", resolved=True, reward=1.25, outcome="resolved",
                   reason="ok", checks=[("sent", True, "")], judge=0.5, judge_scores=[1, 0])])
def test_a_typed_grade_round_trips_through_a_results_line(grade: Grade) -> None:
    result = RolloutResult(run_id="r", rollout_id="r.a.0.1", instance_id="a", sample=0,
                           harness="h", grade=grade)
    back = RolloutResult.model_validate_json(result.model_dump_json())
    assert type(back.grade) is type(grade) and back == result


def test_a_grade_of_an_unknown_kind_keeps_its_fields() -> None:
    line = ('{"run_id": "r", "rollout_id": "x", "instance_id": "a", "sample": 0, '
            '"harness": "h", "grade": {"instance_id": "a", "resolved": true, "reward": 1.0, '
            '"outcome": "resolved", "reason": "", "score": 0.7}}')
    back = RolloutResult.model_validate_json(line)
    assert type(back.grade) is Grade and back.grade.score == 0.7  # type: ignore[union-attr]


def test_one_submit_marker() -> None:
    from orchard.domains.swe import bugfix_family, family, minisweagent

    assert f"echo {SUBMIT_MARKER}" == SUBMIT_COMMAND
    assert minisweagent.SUBMIT_MARKER is SUBMIT_MARKER
    assert family.SUBMIT_COMMAND is bugfix_family.SUBMIT_COMMAND is SUBMIT_COMMAND


def test_every_domain_is_registered_once() -> None:
    assert list(DOMAINS) == ["assistant", "web", "harbor", "swe"]
    names = [n for d in DOMAINS.values() for n in d.source.names]
    assert sorted(names) == sorted(NAMED) and len(names) == len(set(names))
