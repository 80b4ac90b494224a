"""The generated settings family: deterministic, unique statements, held-out tasks disjoint
from training ones, and each task's gold patch and teacher scripts consistent with its tests."""

from __future__ import annotations

import re

import pytest

from orchard.domains.swe.family import MODULE, RIGHT, settings_family


def test_same_seed_same_tasks_other_seed_other_tasks() -> None:
    a, b = settings_family(20, 8, seed=0), settings_family(20, 8, seed=0)
    assert [t.model_dump() for t in a] == [t.model_dump() for t in b]
    c = settings_family(20, 8, seed=1)
    assert [t.problem_statement for t in a] != [t.problem_statement for t in c]


def test_splits_are_disjoint_and_statements_unique() -> None:
    tasks = settings_family(128, 16, seed=0)
    assert [t.split for t in tasks] == ["train"] * 128 + ["test"] * 16
    statements = [t.problem_statement for t in tasks]
    assert len(set(statements)) == len(statements)
    assert len({t.instance_id for t in tasks}) == len(tasks)


def test_each_task_is_one_wrong_constant_with_its_fixed_right_value() -> None:
    for task in settings_family(40, 10, seed=2):
        name, wrong, right = re.fullmatch(
            rf"(\w+) in {MODULE} is (\d+); it should be (\d+)\.", task.problem_statement
        ).groups()
        assert RIGHT[name] == int(right) != int(wrong)
        source = task.source.files[MODULE]
        assert f"{name} = {wrong}\n" in source
        assert all(f"{k} = {v}\n" in source for k, v in RIGHT.items() if k != name)
        assert f"-{name} = {wrong}" in task.patch and f"+{name} = {right}" in task.patch
        assert [f"test_settings.py::test_{name.lower()}"] == task.FAIL_TO_PASS
        assert len(task.PASS_TO_PASS) == len(RIGHT) - 1
        solve = task.metadata["teacher"]["solve"]
        assert f"{name} = {right}/" in solve[1][1]
        for failing in task.metadata["teacher"]["fail"]:
            assert failing != solve


def test_asking_for_more_tasks_than_exist_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="distinct tasks"):
        settings_family(400, 1)
    with pytest.raises(ValueError, match=">= 0"):
        settings_family(-1, 1)
