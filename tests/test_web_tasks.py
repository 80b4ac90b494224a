"""The bundled web tasks: they load, every one is solvable by its gold run and not solved by
doing nothing (on the real sites, in real sandboxes, through the real browser), and a broken
checker is the task's error, not the rollout's."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from orchard.domains.web import (
    BUNDLED,
    CHECKERS,
    Checker,
    WebBudget,
    WebTask,
    grade_web,
    load_web_tasks,
    start_sites,
    validate_web,
)
from orchard.env.client import SandboxClient
from orchard.tasks import TaskLoadError
from tests.conftest import needs_browser, needs_root

TASKS = load_web_tasks()


def test_the_bundled_set_loads_with_splits_and_sites() -> None:
    assert len(TASKS) >= 30
    assert len({t.instance_id for t in TASKS}) == len(TASKS)
    assert {s for t in TASKS for s in t.sites} == {"shop", "wiki", "booking", "mail"}
    assert {t.split for t in TASKS} == {"train", "test"}
    assert load_web_tasks(split="test") == [t for t in TASKS if t.split == "test"]
    assert all(t.checker.name in CHECKERS and not t.live for t in TASKS)
    assert sum(t.answers for t in TASKS) >= 8  # answer tasks and state-changing ones


def test_bad_task_files_say_what_is_wrong(tmp_path: Path) -> None:
    rows = yaml.safe_load(BUNDLED.read_text())[:1]
    rows[0]["checker"]["name"] = "no_such_checker"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(rows))
    with pytest.raises(TaskLoadError, match="unknown checkers"):
        load_web_tasks(bad)
    del rows[0]["gold"]
    bad.write_text(yaml.safe_dump(rows))
    with pytest.raises(TaskLoadError, match="gold"):
        load_web_tasks(bad)
    with pytest.raises(TaskLoadError, match="cannot read"):
        load_web_tasks(tmp_path / "missing.yaml")


def test_checkers_judge_state_and_answers() -> None:
    answer = CHECKERS["answer"]
    assert answer({}, "It is 8,849 metres high", expected="8849")[0]
    assert not answer({}, None, expected="8849")[0]
    order = {"id": 1, "items": {"ms-202": 1}, "name": "Alice Smith", "address": "12 Oak St",
             "shipping": "standard", "total": 25.5}
    state = {"shop": {"orders": [order], "cart": {}}}
    ok, _ = CHECKERS["shop_order"](state, None, items={"ms-202": 1}, name="alice smith")
    assert ok
    ok, why = CHECKERS["shop_order"](state, None, items={"ms-202": 1}, shipping="express")
    assert not ok and "shipping" in why


@pytest.fixture(scope="module")
def client(orchestrator: str) -> Iterator[SandboxClient]:
    with SandboxClient(orchestrator) as c:
        yield c


@needs_root
@needs_browser
@pytest.mark.parametrize("site", ["shop", "wiki", "booking", "mail"])
def test_every_task_is_solvable_and_not_solved_by_doing_nothing(
        client: SandboxClient, site: str) -> None:
    tasks = [t for t in TASKS if site in t.sites]
    with ThreadPoolExecutor(2) as pool:
        checks = list(pool.map(lambda t: validate_web(client, t), tasks))
    failed = {c.instance_id: c.problems for c in checks if not c.ok}
    assert not failed, failed
    assert all(c.gold and c.gold.resolved and c.empty and not c.empty.resolved for c in checks)


@needs_root
@needs_browser
def test_a_crashing_checker_is_a_task_error(client: SandboxClient) -> None:
    task = next(t for t in TASKS if t.checker.name == "shop_order")
    broken = task.model_copy(update={"checker": Checker(name="shop_order", args={"nope": 1})})
    with client.create_sandbox() as sb:
        start_sites(sb, broken)
        grade = grade_web(sb, broken, None)
    assert grade.outcome == "task_error" and "crashed" in grade.reason and grade.reward == 0


def test_live_tasks_are_kept_apart_and_marked() -> None:
    live = load_web_tasks("web-live")
    assert live and all(t.live and not t.sites for t in live)
    assert all(t.start_url.startswith("https://") for t in live)
    assert not {t.instance_id for t in live} & {t.instance_id for t in TASKS}
    offline = yaml.safe_load(BUNDLED.read_text())[0]
    offline["sites"] = []
    with pytest.raises(ValueError, match="only a live task"):
        WebTask.model_validate(offline)


@needs_root
@needs_browser
def test_a_live_task_whose_site_does_not_load_is_not_valid(client: SandboxClient) -> None:
    # The live task's sandbox is networked: a port on its own loopback, where nothing listens
    # in a fresh sandbox, fails to load at once and sends no packet out of its namespace.
    task = load_web_tasks("web-live")[0].model_copy(update={
        "start_url": "http://127.0.0.1:8999/", "budget": WebBudget(action_timeout=3)})
    check = validate_web(client, task)
    assert not check.ok and check.gold is None, check
    assert any("live site did not load" in p and "internet" in p for p in check.problems)
