"""The browser agent loop, driven by the scripted web teacher through the recording proxy: one
trace joins the model calls and the browser actions, and the checker grades the sites."""

from __future__ import annotations

import contextlib
import hashlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchard.domains import make_harness
from orchard.domains.web import grade_web, load_web_tasks, start_sites
from orchard.domains.web.browser_agent import run_browser_agent
from orchard.domains.web.demo import BrowserContinuation
from orchard.domains.web.teacher import hedged_web_teacher, web_teacher
from orchard.env.client import SandboxClient
from orchard.eval import RunConfig, evaluate
from orchard.eval.results import read_results
from orchard.recipes.montecarlo import MC_LABEL, MonteCarloAnnotator
from orchard.recipes.trajectories import load_trajectories
from orchard.rollout.tokenizer import TEST_TOKENIZER, load_tokenizer
from orchard.rollout.traces.branch import restore
from orchard.rollout.traces.export import IMAGE_MARK, to_dataset, write_swe_jsonl
from orchard.rollout.traces.trace import collect_trace
from orchard.testing.teacher import FunctionPolicy, TeacherServer
from tests.conftest import needs_browser, needs_root
from tests.test_minisweagent import teacher_behind_proxy

pytestmark = [needs_root, needs_browser]
TASKS = {t.instance_id: t for t in load_web_tasks()}


def web_teacher_proxy(store: Path, solve: float = 1.0) -> contextlib.AbstractContextManager[str]:
    """The recording proxy's URL, with the web teacher behind it."""
    policy = FunctionPolicy(web_teacher(list(TASKS.values()), solve=solve))
    return teacher_behind_proxy(policy, load_tokenizer(TEST_TOKENIZER), store)


@pytest.fixture(scope="module")
def client(orchestrator: str) -> Iterator[SandboxClient]:
    with SandboxClient(orchestrator) as c:
        yield c


@pytest.mark.parametrize("instance_id", ["shop-buy-mouse", "mail-booking-code"])
def test_a_teacher_rollout_is_graded_and_leaves_one_trace(
        client: SandboxClient, tmp_path: Path, instance_id: str) -> None:
    task = TASKS[instance_id]
    session = f"web-{uuid.uuid4().hex[:8]}"
    with web_teacher_proxy(tmp_path / "store") as proxy, \
            client.create_sandbox(session=session, memory="2Gi") as sb:
        start_sites(sb, task)
        result = run_browser_agent(sb, task.goal, task.start_url, f"{proxy}/s/{session}/v1",
                                   "teacher", max_steps=task.budget.steps)
        grade = grade_web(sb, task, result.answer)
    assert result.exit_status == "Submitted", result.messages[-3:]
    assert grade.resolved, grade.reason
    trace = collect_trace(session, client, tmp_path / "store")
    browsing = [e for e in trace.sandbox_events if e.kind.value == "browser"]
    # Every model call is recorded with its tokens, and every action it chose is an event.
    assert len(trace.model_calls) == result.n_steps
    assert all(c.get("response") for c in trace.model_calls)
    assert len(browsing) == 1 + result.n_steps - 1  # the first goto, then one per action call
    assert [s.source for s in trace.timeline].count("model") == result.n_steps
    # The trace restores the rollout mid-way: sites served, the browser on the same page.
    step = min(2, result.n_steps - 1)
    restored = restore(trace, client, step)
    try:
        page = restored.browser("observe")
        seen = [e for e in browsing if e.time < trace.model_calls[step]["started_at"]]
        assert page.url == seen[-1].data["page_url"] and page.error is None, page
        assert hashlib.sha256(page.tree.encode()).hexdigest() == seen[-1].data["tree_sha256"]
    finally:
        restored.delete()


def test_a_weak_teacher_fails_honestly(client: SandboxClient, tmp_path: Path) -> None:
    task = TASKS["shop-buy-mouse"]
    session = f"web-{uuid.uuid4().hex[:8]}"
    with web_teacher_proxy(tmp_path / "store", solve=0.0) as proxy, \
            client.create_sandbox(session=session) as sb:
        start_sites(sb, task)
        result = run_browser_agent(sb, task.goal, task.start_url, f"{proxy}/s/{session}/v1",
                                   "teacher")
        grade = grade_web(sb, task, result.answer)
    # It made progress (half the gold run), then gave up: a failure worth learning from.
    assert result.exit_status == "Submitted" and result.n_steps == len(task.gold) // 2 + 1
    assert not grade.resolved and grade.outcome == "unresolved"


def test_monte_carlo_values_of_a_web_rollout(client: SandboxClient, tmp_path: Path) -> None:
    """Continuations carry on from restored states of a failed web rollout, live forks of one
    replay (sites and browser included) and replays of their own alike: a continuation policy
    that always plays the gold run on resolves from every one of them, which it can only do
    on the right page with the sites in the right state."""
    task = TASKS["shop-buy-mouse"]
    out = tmp_path / "run"
    evaluate([task], make_harness("web-teacher", [task], teacher_solve=0.0), out, client,
             config=RunConfig(out=out))
    (traj,) = load_trajectories(out)
    assert not traj.resolved and len(traj.steps) == len(task.gold) // 2 + 1
    policy = FunctionPolicy(hedged_web_teacher([task], solve=1.0, seed=0))
    with TeacherServer(policy, load_tokenizer(TEST_TOKENIZER), model_name="teacher") as server:
        continuation = BrowserContinuation(f"{server.url}/v1", "teacher")
        curves = {restore: MonteCarloAnnotator(client, [task], continuation, k=2,
                                               restore=restore).annotate(traj)
                  for restore in ("fork", "replay")}
    for curve in curves.values():
        inner = [s for s in curve.key_steps if s < len(traj.steps)]
        assert inner and all(curve.values[s] == 1.0 for s in inner), curve
        assert curve.values[-1] == 0.0  # the rollout itself failed
    assert client.list_sandboxes({MC_LABEL: traj.rollout_id}) == []


def test_eval_runs_web_tasks_with_the_web_teacher(client: SandboxClient, tmp_path: Path
                                                  ) -> None:
    chosen = [TASKS[i] for i in ("shop-price-tent", "booking-cancel-team-sync",
                                 "wiki-rust-package-manager")]
    out = tmp_path / "run"
    harness = make_harness("web-teacher", chosen, teacher_solve=1.0)
    summary = evaluate(chosen, harness, out, client, config=RunConfig(out=out, n=2))
    assert summary["overall"]["rollouts"] == 6
    assert summary["overall"]["resolved_rate"] == 1.0, summary
    rows = read_results(out)
    assert {r.grade.outcome for r in rows if r.grade} == {"resolved"}
    assert all(r.trace and (out / r.trace).is_file() for r in rows)
    trace = json.loads((out / rows[0].trace).read_text())
    assert trace["model_calls"] and any(e["kind"] == "browser" for e in trace["sandbox_events"])
    # A rerun resumes: nothing is left to do.
    again = evaluate(chosen, make_harness("web-teacher", chosen), out, client,
                     config=RunConfig(out=out, n=2))
    assert again["overall"]["rollouts"] == 6 and len(read_results(out)) == 6
    with pytest.raises(ValueError, match="web tasks run with"):
        make_harness("oracle", chosen)


def test_screenshots_travel_as_image_parts_and_are_recorded(client: SandboxClient,
                                                            tmp_path: Path) -> None:
    task = TASKS["mail-booking-code"]
    session = f"web-{uuid.uuid4().hex[:8]}"
    with web_teacher_proxy(tmp_path / "store") as proxy, \
            client.create_sandbox(session=session, memory="2Gi") as sb:
        start_sites(sb, task)
        result = run_browser_agent(sb, task.goal, task.start_url, f"{proxy}/s/{session}/v1",
                                   "teacher", screenshots=True)
        assert grade_web(sb, task, result.answer).resolved
    images = [m for m in result.messages if isinstance(m.get("content"), list)]
    assert len(images) == result.n_steps  # one per page the model saw
    trace = collect_trace(session, client, tmp_path / "store")
    last = json.dumps(trace.model_calls[-1])
    assert "data:image/png;base64," in last  # the request as sent, image and all
    # The public schema's rows reference the images by file; a dataset keeps them inline.
    assert write_swe_jsonl([trace], tmp_path / "rows.jsonl") == 1
    row = json.loads((tmp_path / "rows.jsonl").read_text())
    marks = sum(m["content"].count(IMAGE_MARK) for m in row["messages"])
    assert marks == len(row["images"]) == result.n_steps
    for ref in row["images"]:
        assert (tmp_path / ref).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    dataset = to_dataset([trace])
    assert dataset[0]["images"][0].startswith("data:image/png;base64,")
