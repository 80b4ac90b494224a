"""The console's run pages over real HTTP: a real eval run (the scripted teacher through
mini-swe-agent, the recording proxy, real sandboxes) shown as its report, rollout timelines,
a comparison and the proxy's sessions; hand-built files for screenshots, paging and bad input."""

from __future__ import annotations

import html
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from orchard.console import mount_console, run_files
from orchard.domains.swe import load_tasks
from orchard.domains.swe.harness import TeacherHarness
from orchard.env.client import SandboxClient
from orchard.env.schema import EventKind, SandboxEvent
from orchard.eval import RunConfig, evaluate, read_results
from orchard.eval.results import RolloutResult
from orchard.rollout.traces.trace import build_trace
from tests.browser_harness import check_accessibility, check_keyboard, save_screenshot
from tests.conftest import dedicated_orchestrator, needs_browser, needs_root

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = needs_root

KEY = "console-runs-test-key"
# A 1x1 PNG: an inline screenshot as the web domain's agents send them.
PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU"
       "5ErkJggg==")
# Never fetched: the page must show it as text, whatever the address.
REMOTE = "http://127.0.0.1:9/shot.png"


def text(page: str) -> str:
    """What a reader sees: tags out, entities decoded, whitespace folded."""
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", page)))


@pytest.fixture(scope="module")
def server(data_dir: Path, orchestrator: str,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    del orchestrator  # only for the bundle the dedicated one reuses
    # The runs this module makes are under pytest's temp dir; the working directory is there
    # for the relative-path case.
    roots = [tmp_path_factory.getbasetemp(), Path.cwd()]
    with dedicated_orchestrator(
            data_dir, api_keys=[KEY],
            extend=lambda app, s: mount_console(app, s.api_keys, runs_dirs=roots)) as url, \
            httpx.Client(base_url=url, headers={"x-api-key": KEY}, timeout=120) as http:
        yield http


@pytest.fixture(scope="module")
def run_dir(server: httpx.Client, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two tasks, two samples each; the teacher solves the first task only."""
    tasks = load_tasks("bundled")[:2]
    out = tmp_path_factory.mktemp("console-run")
    with SandboxClient(str(server.base_url), api_key=KEY) as client:
        evaluate(tasks, TeacherHarness(tasks, solve=[tasks[0].instance_id]), out, client,
                 config=RunConfig(out=out, n=2, concurrency=2, settings={"harness": "teacher"}))
    return out


def get(http: httpx.Client, url: str, params: dict[str, object], status: int = 200) -> str:
    r = http.get(url, params=params)
    assert r.status_code == status, (r.status_code, text(r.text)[:2000])
    return r.text


def test_the_run_page_shows_the_report_and_links_every_rollout(
        server: httpx.Client, run_dir: Path) -> None:
    saved = json.loads((run_dir / "results.json").read_text())
    page = get(server, "/ui/runs", {"path": str(run_dir)})
    seen = text(page)
    o = saved["overall"]
    assert f"{o['resolved']} of {o['rollouts']} rollouts ({100 * o['resolved_rate']:.1f}%)" in seen
    assert o["resolved"] == 2 and o["rollouts"] == 4
    for k, v in o["pass_at_k"].items():
        assert f"pass@{k} {100 * v:.1f}%" in seen
    for tid, t in saved["tasks"].items():
        assert f"{tid} {t['n']} {t['resolved']} {100 * t['resolved_rate']:.1f}%" in seen
        assert f"Compare samples 0 and 1 of {tid}" in seen
    for r in read_results(run_dir):
        assert f'rollout={r.rollout_id}"' in html.unescape(page)
    # Charts carry their numbers for those who cannot see them.
    labels = re.findall(r'<svg role="img"[^>]*aria-label="([^"]*)"', page)
    tasks = sorted(saved["tasks"])
    assert any(f"{tasks[0]} 100.0%, {tasks[1]} 0.0%" in html.unescape(x) for x in labels)
    assert '<label for="pick-a">' in page and '<label for="pick-b">' in page
    assert "The recording proxy's sessions of this run" in seen
    # The runs page lists the run dirs in the folders it may read, this one among them.
    listed = get(server, "/ui/runs", {})
    assert f'<span class="muted mono">{run_dir}</span>' in listed


def test_a_rollouts_timeline_shows_its_commands_messages_and_log_probs(
        server: httpx.Client, run_dir: Path) -> None:
    solved = next(r for r in read_results(run_dir) if r.resolved)
    trace = json.loads((run_dir / solved.trace).read_text())
    page = get(server, "/ui/runs/trace", {"path": str(run_dir), "rollout": solved.rollout_id})
    seen = text(page)
    assert f"Task {solved.instance_id} (sample {solved.sample})" in seen
    assert "Resolved yes" in seen and "Reward 1.000" in seen and "Exit status Submitted" in seen
    assert solved.grade is not None
    assert solved.grade.test_output_tail.strip().splitlines()[-1].strip() in seen
    commands = [e["data"]["argv"][-1] for e in trace["sandbox_events"]
                if e["kind"] == "exec" and e["data"].get("argv")]
    applied = next(c for c in commands if c.startswith("git apply"))
    assert applied.splitlines()[0] in seen  # the teacher's own command, as the sandbox ran it
    for call in trace["model_calls"]:
        said = call["response"]["choices"][0]["message"]["content"]
        assert f"Answer assistant {said}" in seen
        first = call["response"]["choices"][0]["logprobs"]["content"][0]
        assert f'<span title="logprob {first["logprob"]:.3f}">' in page
    # The conversation is not repeated: the system prompt went out twice, it shows once.
    system = trace["model_calls"][0]["request"]["messages"][0]["content"]
    assert [c["request"]["messages"][0]["content"] for c in trace["model_calls"]] == [system] * 2
    assert seen.count(system) == 1
    assert "3 earlier messages as in the previous call" in seen
    # A later page starts where asked and links back.
    later = get(server, "/ui/runs/trace",
                {"path": str(run_dir), "rollout": solved.rollout_id, "offset": 5})
    assert 'id="step-6"' in later and 'id="step-5"' not in later
    assert "offset=0" in html.unescape(later) and "Earlier steps" in later


def test_two_rollouts_of_a_task_side_by_side(server: httpx.Client, run_dir: Path) -> None:
    results = read_results(run_dir)
    task = results[0].instance_id
    a, b = [r for r in results if r.instance_id == task][:2]
    page = get(server, "/ui/runs/compare",
               {"path": str(run_dir), "a": a.rollout_id, "b": b.rollout_id})
    seen = text(page)
    assert seen.count(f"Task {task}") == 2
    for r in (a, b):
        assert f"The whole timeline of {r.rollout_id}" in seen
    assert page.count('<li class="step') >= 2 * 5
    assert "different tasks" not in seen


def test_the_proxy_store_and_a_session(server: httpx.Client, run_dir: Path) -> None:
    store = run_dir / "calls"
    page = text(get(server, "/ui/runs", {"path": str(store)}))
    assert "Recording proxy store" in page
    results = read_results(run_dir)
    for r in results:
        assert f"{r.rollout_id} {r.model_calls} {r.n_tokens} 0" in page
    session = get(server, "/ui/runs/session", {"path": str(store),
                                               "session": results[0].rollout_id})
    assert session.count('<li class="step model"') == results[0].model_calls
    assert "Tool call bash" in text(session)


def _hand_run(root: Path, steps: int) -> tuple[Path, str]:
    """A run directory written by hand: one rollout whose first model call sent a PNG
    screenshot and a remote image, then ``steps`` exec events."""
    rid = "hand.task-1.0"
    call = {"index": 0, "endpoint": "/v1/chat/completions", "status": 200, "started_at": 1.0,
            "request": {"messages": [{"role": "user", "content": [
                {"type": "text", "text": "What is on the page?"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
                {"type": "image_url", "image_url": {"url": REMOTE}}]}]},
            "response": {"choices": [{"message": {"role": "assistant", "content": "A login form."},
                                      "finish_reason": "stop"}],
                         "usage": {"prompt_tokens": 7, "completion_tokens": 3}}}
    events = [SandboxEvent(seq=i + 1, sandbox_id="sb-hand", time=2.0 + i, kind=EventKind.exec,
                           data={"command": f"echo step-{i}", "exit_code": 0,
                                 "duration_ms": 1.0}) for i in range(steps)]
    trace = build_trace(rid, [call], events, {"reward": 1.0})  # type: ignore[list-item]
    (root / "traces").mkdir(parents=True)
    (root / "traces" / f"{rid}.json").write_text(trace.model_dump_json())
    result = RolloutResult(run_id="hand", rollout_id=rid, instance_id="task-1", sample=0,
                           harness="browser", exit_status="done", resolved=True, reward=1.0,
                           n_steps=1, trace=f"traces/{rid}.json")
    (root / "run.json").write_text(json.dumps({"run_id": "hand", "n": 1, "tasks": ["task-1"]}))
    (root / "rollouts.jsonl").write_text(result.model_dump_json() + "\n{\"run_id\": \"cut sh\n")
    return root, rid


def test_screenshots_inline_remote_images_not_and_long_traces_paged(
        server: httpx.Client, tmp_path: Path) -> None:
    run, rid = _hand_run(tmp_path / "hand", steps=130)
    first = get(server, "/ui/runs/trace", {"path": str(run), "rollout": rid})
    assert f'<img alt="screenshot at step 1" src="data:image/png;base64,{PNG}">' in first
    assert first.count("<img") == 1 and f'src="{REMOTE}"' not in first
    assert f"image not shown (only inline PNG, JPEG or WebP data URLs under 8 MiB are): {REMOTE}" \
        in text(first)
    # 131 steps: 50 a page, the later ones only behind "Later".
    assert 'id="step-50"' in first and 'id="step-51"' not in first
    assert "echo step-48" in first and "echo step-49" not in first
    assert "offset=50" in html.unescape(first) and "Earlier steps" not in first
    middle = html.unescape(get(server, "/ui/runs/trace",
                               {"path": str(run), "rollout": rid, "offset": 50}))
    assert 'id="step-51"' in middle and 'id="step-100"' in middle and 'id="step-50"' not in middle
    assert "offset=0" in middle and "offset=100" in middle
    # The cut line of rollouts.jsonl is named, and the rollout before it still shows.
    page = text(get(server, "/ui/runs", {"path": str(run)}))
    assert "rollouts.jsonl line 2 is not a rollout result" in page and rid in page


def test_bad_input_is_said_in_the_page(server: httpx.Client, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    run, rid = _hand_run(tmp_path / "hand", steps=3)
    form = get(server, "/ui/runs", {})
    assert '<label for="path">' in form and 'name="path"' in form

    def said(url: str, params: dict[str, object], status: int) -> str:
        page = get(server, url, params, status)
        assert 'role="alert"' in page and "Traceback" not in page
        return text(page)

    assert "no path: give the directory `orchard eval --out` wrote" in said(
        "/ui/runs/trace", {"rollout": rid}, 400)
    missing = tmp_path / "nowhere"
    assert f"{missing} does not exist on the server: give the directory `orchard eval --out`" \
        in said("/ui/runs", {"path": str(missing)}, 404)
    assert "is a file, not a directory" in said("/ui/runs", {"path": str(run / "run.json")}, 400)
    (tmp_path / "empty").mkdir()
    assert "is neither a run directory" in said("/ui/runs", {"path": str(tmp_path / "empty")},
                                                400)
    unknown = said("/ui/runs/trace", {"path": str(run), "rollout": "no-such"}, 404)
    assert "no rollout 'no-such'" in unknown and rid in unknown
    assert "no rollout given" in said("/ui/runs/trace", {"path": str(run)}, 400)
    assert "offset 'x' is not a whole number" in said(
        "/ui/runs/trace", {"path": str(run), "rollout": rid, "offset": "x"}, 400)
    assert "no session 'nope'" in said("/ui/runs/session", {"path": str(run), "session": "nope"},
                                       404)
    assert not (run / "calls").exists()  # reading a store never makes one
    # A key drives sandboxes; it does not open the host's other folders.
    outside = said("/ui/runs", {"path": "/etc"}, 403)
    assert "/etc is outside the directories this console may read" in outside
    assert "start `orchard serve` with --runs-dir / (or a folder above it)" in outside
    # A relative path is read under the server's working directory, and the page says so.
    relative = os.path.relpath(run, Path.cwd())
    page = text(get(server, "/ui/runs", {"path": relative}))
    assert f"is a relative path: it was read under the server's working directory, as {run}" \
        in page
    # A trace over the size limit is not parsed.
    monkeypatch.setattr(run_files, "MAX_FILE_BYTES", 1000)
    assert "over the console's limit of 1000 B: read it with `orchard trace show`" in said(
        "/ui/runs/trace", {"path": str(run), "rollout": rid}, 413)
    monkeypatch.undo()
    trace_file = run / "traces" / f"{rid}.json"
    call = json.loads(trace_file.read_text())["model_calls"][0]
    trace_file.write_text("{not json")
    assert f"{trace_file} is not a trace" in said(
        "/ui/runs/trace", {"path": str(run), "rollout": rid}, 400)
    # Without its trace file a rollout is shown from the proxy's record; a torn line is named.
    trace_file.unlink()
    (run / "calls").mkdir()
    (run / "calls" / f"{rid}.jsonl").write_text(json.dumps(call) + '\n{"index": 1, "sess')
    page = text(get(server, "/ui/runs/trace", {"path": str(run), "rollout": rid}))
    assert f"{trace_file} is missing: showing the proxy's record of the model calls only" in page
    assert f"{rid}.jsonl line 2 is not a call record" in page
    assert "Answer assistant A login form." in page


def test_the_pages_need_a_login(server: httpx.Client, run_dir: Path) -> None:
    r = httpx.get(str(server.base_url.join("/ui/runs")), params={"path": str(run_dir)})
    assert r.status_code == 303 and r.headers["location"].startswith("/ui/login?next=")


@needs_browser
def test_every_run_page_passes_axe(server: httpx.Client, run_dir: Path, tmp_path: Path,
                                   browser_page: Page) -> None:
    hand, hand_id = _hand_run(tmp_path / "hand", steps=3)
    results = read_results(run_dir)
    a, b = [r.rollout_id for r in results if r.instance_id == results[0].instance_id][:2]
    browser_page.set_extra_http_headers({"x-api-key": KEY})
    pages = {
        "/ui/runs": {},
        "/ui/runs?": {"path": str(run_dir)},
        "/ui/runs/trace": {"path": str(run_dir), "rollout": a},
        "/ui/runs/trace?": {"path": str(hand), "rollout": hand_id},
        "/ui/runs/compare": {"path": str(run_dir), "a": a, "b": b},
        "/ui/runs?store": {"path": str(run_dir / "calls")},
        "/ui/runs/session": {"path": str(run_dir / "calls"), "session": a},
        "/ui/runs?missing": {"path": str(tmp_path / "nowhere")},
    }
    for url, params in pages.items():
        target = server.base_url.join(url.split("?")[0]).copy_merge_params(params)
        browser_page.goto(str(target))
        assert browser_page.title().endswith("Orchard console")
        check_accessibility(browser_page, min_impact="minor")


@needs_browser
def test_open_a_run_and_step_through_a_trace_in_a_browser(
        server: httpx.Client, run_dir: Path, tmp_path: Path, browser_page: Page) -> None:
    from playwright.sync_api import expect

    page = browser_page
    hand, hand_id = _hand_run(tmp_path / "hand", steps=130)
    page.goto(str(server.base_url.join("/ui/runs")))
    page.get_by_label("API key").fill(KEY)  # sent to the login form first
    page.get_by_role("button", name="Log in").click()
    check_keyboard(page, ["#path"])
    page.get_by_label("Directory on the server").fill(str(run_dir))
    page.get_by_role("button", name="Open").click()
    expect(page.get_by_role("heading", level=1)).to_contain_text("Run")
    save_screenshot(page, "console-run")
    solved = next(r for r in read_results(run_dir) if r.resolved)
    # Every rollout's trace and the comparison form are reachable by Tab alone.
    check_keyboard(page, ["#pick-a", "#pick-b", f'a[href*="rollout={solved.rollout_id}"]'])
    page.get_by_role("link", name=solved.rollout_id, exact=True).click()
    expect(page.get_by_role("heading", level=1)).to_contain_text(solved.rollout_id)
    expect(page.locator(".timeline")).to_contain_text("git apply")
    save_screenshot(page, "console-trace")
    page.go_back()
    page.get_by_role("link", name=re.compile(r"^Compare samples 0 and 1 of ")).first.click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Two rollouts side by side")
    save_screenshot(page, "console-compare")
    # A long trace, a page at a time: step 51 is on the second page only.
    page.goto(str(server.base_url.join("/ui/runs/trace").copy_merge_params(
        {"path": str(hand), "rollout": hand_id})))
    expect(page.locator("img[alt^='screenshot at step']")).to_have_count(1)
    expect(page.locator("#step-51")).to_have_count(0)
    check_keyboard(page, ["a[href*='offset=50']"])
    page.get_by_role("link", name="Later steps").first.click()
    expect(page.locator("#step-51")).to_be_visible()
    page.get_by_role("link", name="Earlier steps").first.click()
    expect(page.locator("#step-1")).to_be_visible()
