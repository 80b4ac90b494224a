"""MiniWoB++ as web tasks: the vendored pages served in real sandboxes, driven by the real
Chromium, judged by the pages' own JavaScript; the scripted solver, the random baseline, and
`orchard eval --harness browser-agent` against a scripted model on loopback."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchard.cli import app as cli_app
from orchard.domains import load_tasks, make_harness
from orchard.domains.web import CHECKERS, grade_web
from orchard.domains.web.miniwob import (
    SOLVED_PAGES,
    episode,
    load_miniwob_tasks,
    miniwob_task,
    page_names,
    plan,
    start_miniwob,
    validate_miniwob,
)
from orchard.domains.web.miniwob.solver import find, instruction, solver_policy
from orchard.domains.web.miniwob.tasks import PAGES
from orchard.env.client import SandboxClient
from orchard.eval import RunConfig, evaluate
from orchard.eval.results import read_results
from orchard.rollout.tokenizer import TEST_TOKENIZER, load_tokenizer
from orchard.tasks import TaskLoadError
from orchard.testing.policies import FunctionPolicy
from orchard.testing.teacher import TeacherServer
from tests.conftest import needs_browser, needs_root

# login-user's first page, as the browser agent saw it (the instruction spans several lines
# where the page has markup).
LOGIN_TREE = """"Enter the"
"username"
"\\"karrie\\" and the"
"password"
"\\"AU\\" into the text fields and press login."
"Username"
[1] textbox
"Password"
[2] textbox
[3] button "Login"
[4] Canvas"""


def test_the_sets_are_every_page_times_three_seeds_with_upstream_clocks() -> None:
    assert len(page_names()) == 130 and "click-button" in page_names()
    assert (PAGES / "LICENSE").read_text().startswith("The MIT License")
    timed, untimed = load_miniwob_tasks("miniwob"), load_miniwob_tasks("miniwob-untimed")
    assert len(timed) == len(untimed) == 390
    assert len({t.instance_id for t in timed + untimed}) == 780
    assert {t.split for t in timed} == {"train", "test"}
    assert all(t.mode == t.split for t in timed)
    by_id = {t.instance_id: t for t in timed}
    # core.js's 10 s, or the page's own core.EPISODE_MAX_TIME.
    assert by_id["miniwob.click-button.0"].time_limit_ms == 10_000
    assert by_id["miniwob.enter-password.0"].time_limit_ms == 15_000
    assert by_id["miniwob.email-inbox.1"].time_limit_ms == 30_000
    assert "limit=15000" in by_id["miniwob.enter-password.0"].start_url
    assert all(t.time_limit_ms == 300_000 and t.upstream_time_limit_ms <= 30_000
               for t in untimed)
    domain, listed = load_tasks("miniwob", split="test", ids=["miniwob.click-button.2"])
    assert domain.name == "web" and [t.seed for t in listed] == [2]
    assert domain.listing.row(listed[0])[2] == "miniwob (10 s)"


def test_bad_names_say_what_to_do() -> None:
    with pytest.raises(TaskLoadError, match=r"ids are miniwob\.<page>\.<seed>"):
        load_tasks("miniwob", ids=["click-button"])
    with pytest.raises(TaskLoadError, match="no MiniWoB\\+\\+ page 'click-buton'"):
        miniwob_task("click-buton", 0)
    with pytest.raises(TaskLoadError, match="one of miniwob, miniwob-untimed"):
        load_miniwob_tasks("miniwob-hard")


def test_the_solver_reads_the_instruction_from_the_tree() -> None:
    said = instruction(LOGIN_TREE)
    assert said == ('Enter the username "karrie" and the password "AU" into the text fields '
                    'and press login.')
    steps = plan("login-user", LOGIN_TREE)
    assert steps is not None and [(s.action, s.target, s.nth, s.text) for s in steps] == [
        ("type", "textbox", 0, "karrie"), ("type", "textbox", 1, "AU"),
        ("click", 'button "Login"', 0, None)]
    assert find(LOGIN_TREE, "textbox", 1) == 2 and find(LOGIN_TREE, "textbox", 2) is None
    assert plan("ascending-numbers", LOGIN_TREE) is None  # a page it does not cover
    assert plan("click-tab", LOGIN_TREE) is None  # an instruction not as it expects (no #N)
    assert len(SOLVED_PAGES) >= 10 and set(SOLVED_PAGES) <= set(page_names())


def test_the_checker_reads_the_pages_reward() -> None:
    check = CHECKERS["miniwob_reward"]
    base = {"started": True, "instruction": "Click the button.", "done": True, "reason": None}
    ok, why = check({"miniwob": {**base, "reward": 0.93, "raw_reward": 1}}, None, page="p")
    assert ok and "reward 0.930, raw 1" in why and "Click the button." in why
    ok, why = check({"miniwob": {**base, "reward": -1, "raw_reward": -1,
                                 "reason": "timed out"}}, None, page="p")
    assert not ok and "(timed out)" in why
    partial = {"miniwob": {**base, "reward": 0.5, "raw_reward": 0.5}}
    assert not check(partial, None, page="p")[0]  # success is the raw reward 1
    ok, why = check({"miniwob": {**base, "done": False}}, None, page="p")
    assert not ok and "did not end" in why


# --- real sandboxes, a real Chromium ---------------------------------------------------------


@pytest.fixture(scope="module")
def client(orchestrator: str) -> Iterator[SandboxClient]:
    with SandboxClient(orchestrator) as c:
        yield c


@needs_root
@needs_browser
def test_every_solver_page_is_solved_and_other_pages_end_with_a_reward(
        client: SandboxClient) -> None:
    # Every page the solver covers, and pages on each of the special libraries (jQuery UI,
    # the pie menu, the inbox, the flight form, the editor, d3 shapes).
    others = ["click-pie", "email-inbox", "book-flight", "text-editor", "count-shape",
              "use-autocomplete"]
    # The untimed set: a loaded machine would otherwise lose some to upstream's 10-s clock.
    tasks = [miniwob_task(p, 0, timed=False) for p in (*SOLVED_PAGES, *others)]
    # One first: two threads making a data dir's first browser race on its `current` link
    # (orchard/env/agent/browser_bundle.py names the temporary link by pid only).
    checks = [validate_miniwob(client, tasks[0])]
    with ThreadPoolExecutor(2) as pool:
        checks += pool.map(lambda t: validate_miniwob(client, t), tasks[1:])
    failed = {c.instance_id: c.problems for c in checks if not c.ok}
    assert not failed, failed
    for task, check in zip(tasks, checks, strict=True):
        assert check.empty is not None and "(timed out)" in check.empty.reason
        if task.page in SOLVED_PAGES:
            assert check.gold is not None and check.gold.resolved
            assert "raw 1" in check.gold.reason
        else:
            assert check.gold is None


@needs_root
@needs_browser
def test_a_seed_fixes_the_problem_and_a_wrong_action_ends_the_episode(
        client: SandboxClient) -> None:
    task = miniwob_task("click-button", 0)
    with client.create_sandbox() as sb:
        start_miniwob(sb)
        assert episode(sb)["started"] is False  # nothing loaded: nothing to grade yet
        page = sb.browser("goto", url=task.start_url)
        said = episode(sb)["instruction"]
        assert said == instruction(page.tree) == 'Click on the "okay" button.'
        wrong = find(page.tree, 'button "next"')
        assert wrong is not None
        sb.browser("click", id=wrong)
        state = episode(sb)
        assert state["done"] and state["raw_reward"] == -1 and state["seed"] == "0"
        grade = grade_web(sb, task, None)
        assert not grade.resolved and grade.outcome == "unresolved"
        # The first end is final: the right button now, or a reload, changes nothing.
        page = sb.browser("observe")
        assert '"DONE"' in page.tree
        sb.browser("goto", url=task.start_url)
        page = sb.browser("observe")
        right = find(page.tree, 'button "okay"')
        assert right is not None
        sb.browser("click", id=right)
        assert episode(sb) == {**state, "loads": 2}
    with client.create_sandbox() as sb:  # the same seed on a fresh site: the same problem
        start_miniwob(sb)
        page = sb.browser("goto", url=miniwob_task("click-button", 1).start_url)
        assert instruction(page.tree) == 'Click on the "Ok" button.'


@needs_root
@needs_browser
def test_orchard_eval_runs_the_browser_agent_on_miniwob(client: SandboxClient, orchestrator: str,
                                                        tmp_path: Path) -> None:
    """`orchard eval --harness browser-agent` with a model URL: the model is the scripted
    solver behind an OpenAI-compatible server on loopback."""
    ids = ["miniwob-untimed.click-checkboxes.2", "miniwob-untimed.login-user.0",
           "miniwob-untimed.ascending-numbers.0"]  # the last: no plan, so it gives up
    out = tmp_path / "run"
    with TeacherServer(FunctionPolicy(solver_policy()), load_tokenizer(TEST_TOKENIZER),
                       model_name="solver") as model:
        result = CliRunner().invoke(cli_app, [
            "eval", "--orchestrator", orchestrator, "--tasks", "miniwob-untimed",
            *[a for i in ids for a in ("--task", i)], "--harness", "browser-agent",
            "--model-url", model.url, "--model", "solver", "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = {r.instance_id: r for r in read_results(out)}
    assert {i for i, r in rows.items() if r.grade and r.grade.resolved} == set(ids[:2])
    assert "did not end" in rows[ids[2]].grade.reason
    # The page's reward, scaled by the time left of a 300 s clock: hardly scaled at all.
    reward = re.search(r"the page's reward ([-\d.]+), raw 1$", rows[ids[1]].grade.reason)
    assert reward and 0.98 < float(reward.group(1)) <= 1
    summary = json.loads((out / "results.json").read_text())
    assert summary["overall"]["resolved_rate"] == pytest.approx(2 / 3)


@needs_root
@needs_browser
def test_the_random_baseline_acts_then_gives_up(client: SandboxClient, tmp_path: Path) -> None:
    tasks = [miniwob_task("click-test", 0, timed=False), miniwob_task("enter-text", 0)]
    out = tmp_path / "run"
    summary = evaluate(tasks, make_harness("random-browser", tasks), out, client,
                       config=RunConfig(out=out))
    assert summary["overall"]["rollouts"] == 2
    rows = read_results(out)
    # Ten random actions, then finish.
    assert all(r.n_steps == 11 and r.grade is not None for r in rows)
    enter = next(r for r in rows if "enter-text" in r.instance_id)
    assert not enter.grade.resolved  # typing "hello" at random spells no name
