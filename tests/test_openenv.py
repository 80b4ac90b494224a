"""Task sets served as OpenEnv environments, driven by OpenEnv's own clients over real HTTP and
WebSocket, against the session's orchestrator and real sandboxes: the prompt at reset,
commands in the episode's sandbox, the task's own grade as the reward, one sandbox per
episode and none left after, clear errors; the assistant's tools through the MCP path; and
`orchard openenv serve` itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from openenv.core import GenericEnvClient
from openenv.core.env_server.mcp_types import CallToolAction

from orchard.domains import Episodes, load_tasks
from orchard.env.client import SandboxClient
from orchard.openenv import (
    ServedTasks,
    TaskAction,
    TaskEnv,
    ToolsEnv,
    create_app,
)
from orchard.serving import ThreadedServer
from orchard.tasks import Submission
from tests.conftest import dies_with_the_tests, free_port, needs_root, wait_until

pytestmark = needs_root

SWE_ID = "orchard__backoff-1"  # small repository, 14 tests: grades in about a second
SWE, (SWE_TASK,) = load_tasks("bundled", ids=[SWE_ID])
_, ASSISTANT_TASKS = load_tasks("assistant-hand")
MOVE = next(t for t in ASSISTANT_TASKS if t.instance_id == "hand-move-dana-thursday")


def heredoc_apply(patch: str) -> str:
    return f"git apply <<'ORCHARD_PATCH'\n{patch}\nORCHARD_PATCH"


@pytest.fixture(scope="module")
def client(orchestrator: str) -> Iterator[SandboxClient]:
    with SandboxClient(orchestrator) as c:
        yield c


ServeFn = Callable[..., tuple[str, ServedTasks]]


@pytest.fixture()
def serve(client: SandboxClient) -> Iterator[ServeFn]:
    """Serves tasks with OpenEnv's app on a real port; every episode's sandbox is gone after."""
    started: list[tuple[ThreadedServer, ServedTasks]] = []

    def start(name: str, tasks: list, hooks: Episodes, **options: object) -> tuple[str,
                                                                                     ServedTasks]:
        served = ServedTasks(name, tasks, client, hooks, **options)  # type: ignore[arg-type]
        server = ThreadedServer(create_app(served, max_sessions=4), f"openenv-{name}")
        started.append((server, served))
        return server.start(), served

    yield start
    for server, served in started:
        server.stop()
        # Sessions close with the server (or before): no episode's sandbox outlives it.
        assert wait_until(lambda s=served: not client.list_sandboxes(
            labels={"orchard-openenv": s.name})), "an episode's sandbox was left behind"


def live_sandboxes(client: SandboxClient, name: str) -> set[str]:
    return {s.sandbox_id for s in client.list_sandboxes(labels={"orchard-openenv": name})}


def test_commands_then_submit_are_graded_by_the_task(serve: ServeFn,
                                                     client: SandboxClient) -> None:
    url, served = serve("bundled", [SWE_TASK], SWE.episodes)
    with TaskEnv(base_url=url).sync() as env:
        first = env.reset(task_id=SWE_ID)
        assert first.observation.prompt == SWE_TASK.prompt and not first.done
        assert first.observation.steps_left == SWE_TASK.budget.steps
        state = env.state()
        assert state.task_id == SWE_ID and live_sandboxes(client, "bundled") == {
            state.sandbox_id}

        # Commands run in the task's repository, in the episode's sandbox.
        ran = env.step(TaskAction(command="pwd; git rev-parse --is-inside-work-tree; exit 3"))
        assert ran.observation.stdout.split() == [SWE_TASK.workdir, "true"]
        assert ran.observation.exit_code == 3 and ran.reward is None and not ran.done
        assert env.state().step_count == 1

        # Submitting nothing: the task's grading says so, and the sandbox goes.
        wrong = env.step(TaskAction(submit=True))
        assert wrong.done and wrong.observation.grade is not None
        assert wrong.observation.grade["outcome"] == "empty_patch"
        assert wrong.reward == wrong.observation.grade["reward"] < 1
        ended = env.state()
        assert ended.done and ended.ended_by == "submit" and ended.reward == wrong.reward
        assert live_sandboxes(client, "bundled") == set()

        # A new episode of the same task, this time fixed with the gold patch.
        env.reset(task_id=SWE_ID)
        second = env.state()
        assert second.episode_id != ended.episode_id
        applied = env.step(TaskAction(command=heredoc_apply(SWE_TASK.patch)))
        assert applied.observation.exit_code == 0, applied.observation.stderr
        right = env.step(TaskAction(submit=True))
        assert right.done and right.reward == 1.0
        assert right.observation.grade["resolved"] and right.observation.grade["f2p_passed"] == 4

    # What the server recorded is what the task said: the same grades, episode by episode.
    assert [(g.episode_id, g.grade.reward, g.grade.outcome) for g in served.graded] == [
        (ended.episode_id, wrong.reward, "empty_patch"), (second.episode_id, 1.0, "resolved")]
    # And grading the same patch directly gives the same verdict.
    direct = SWE_TASK.grade(client, Submission(patch=SWE_TASK.patch))
    assert direct.resolved and direct.reward == right.reward


def test_sessions_have_a_sandbox_each_and_lose_it_on_close(serve: ServeFn,
                                                           client: SandboxClient) -> None:
    domain, tasks = load_tasks("bundled", ids=[SWE_ID, "orchard__daterange-1"])
    url, _ = serve("two", tasks, domain.episodes)
    with TaskEnv(base_url=url).sync() as a, TaskEnv(base_url=url).sync() as b:
        a.reset(seed=0)
        b.reset(seed=1)
        sa, sb = a.state(), b.state()
        assert {sa.task_id, sb.task_id} == {t.instance_id for t in tasks}
        assert live_sandboxes(client, "two") == {sa.sandbox_id, sb.sandbox_id}
        a.step(TaskAction(command="echo only-in-a > mark"))
        seen = b.step(TaskAction(command="cat mark"))
        assert seen.observation.exit_code != 0  # b's sandbox is its own
        # Resetting mid-episode drops the old episode's sandbox, ungraded.
        a.reset(seed=0)
        assert sa.sandbox_id not in live_sandboxes(client, "two")
    # Closing the sessions deletes the open episodes' sandboxes.
    assert wait_until(lambda: not live_sandboxes(client, "two"))


def test_the_step_budget_ends_the_episode_with_a_grade(serve: ServeFn) -> None:
    short = SWE_TASK.model_copy(update={"budget": SWE_TASK.budget.model_copy(
        update={"steps": 2})})
    url, served = serve("short", [short], SWE.episodes)
    with TaskEnv(base_url=url).sync() as env:
        env.reset()
        env.step(TaskAction(command=heredoc_apply(SWE_TASK.patch)))
        last = env.step(TaskAction(command="true"))
        assert last.done and last.observation.exit_code == 0 and last.reward == 1.0
        assert env.state().ended_by == "budget" and served.graded[0].ended_by == "budget"


def test_bad_requests_say_what_is_wrong(serve: ServeFn) -> None:
    url, _ = serve("errors", [SWE_TASK], SWE.episodes)
    with GenericEnvClient(base_url=url).sync() as env:
        with pytest.raises(RuntimeError, match="no episode yet: reset first"):
            env.step({"command": "ls"})
        with pytest.raises(RuntimeError, match="no task 'nope' in errors .*orchard__backoff-1"):
            env.reset(task_id="nope")
        with pytest.raises(RuntimeError, match="reset takes task_id, seed and episode_id, "
                                               "not colour"):
            env.reset(colour="blue")
        env.reset()
        # OpenEnv's client shows a refused action's code; the reasons are in the error frame
        # (and in HTTP's 422, below). The session lives on.
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
            env.step({"command": "ls", "submit": True})
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
            env.step({"cmd": "ls"})
        assert env.step({"command": "echo still here"}).observation["stdout"] == "still here\n"
        env.step({"submit": True})
        with pytest.raises(RuntimeError, match="is over .*reset to start another"):
            env.step({"command": "ls"})

    # Plain HTTP: a bad action is a 422; a step outside an episode a 409 with the reason.
    bad = httpx.post(f"{url}/step", json={"action": {"command": "ls", "answer": "x"}})
    assert bad.status_code == 422 and "'answer' goes with" in bad.text
    both = httpx.post(f"{url}/step", json={"action": {"command": "ls", "submit": True}})
    assert both.status_code == 422 and "exactly one of the two" in both.text
    early = httpx.post(f"{url}/step", json={"action": {"command": "ls"}})
    assert early.status_code == 409 and "reset first" in early.json()["detail"]
    schema = httpx.get(f"{url}/schema").json()
    assert {"command", "submit", "answer"} <= schema["action"]["properties"].keys()
    assert httpx.get(f"{url}/metadata").json()["name"] == "orchard:errors"


def test_assistant_tools_through_the_mcp_path(serve: ServeFn, client: SandboxClient) -> None:
    domain, _ = load_tasks("assistant-hand", ids=[MOVE.instance_id])
    assert domain.episodes.mcp is not None
    url, served = serve("assistant", [MOVE], domain.episodes)
    with ToolsEnv(base_url=url).sync() as env:
        with pytest.raises(RuntimeError, match="reset first"):
            env.list_tools()
        first = env.reset(task_id=MOVE.instance_id)
        assert first.observation.prompt == MOVE.goal
        names = {t.name for t in env.list_tools(use_cache=False)}
        assert {"calendar_list", "calendar_update", "mail_send", "submit"} <= names

        found = env.call_tool("contacts_search", query="dana")
        assert "Dana Lee" in str(found)
        refused = env.step(CallToolAction(tool_name="mail_read", arguments={"id": "m404"}))
        assert refused.observation.result["is_error"]
        assert "no message with id 'm404'" in str(refused.observation.result["content"])
        for call in MOVE.gold:
            done = env.step(CallToolAction(tool_name=call.tool, arguments=call.args))
            assert not done.observation.result["is_error"], done.observation.result
        graded = env.step(CallToolAction(tool_name="submit",
                                         arguments={"answer": MOVE.answer or "done"}))
        assert graded.done and graded.reward == 1.0
        assert graded.observation.result["data"]["outcome"] == "resolved"

        # The same task with nothing done: its checks fail, the reward says so.
        env.reset(task_id=MOVE.instance_id)
        lazy = env.step(CallToolAction(tool_name="submit", arguments={"answer": "done"}))
        assert lazy.done and lazy.reward == 0.0
        assert lazy.observation.result["data"]["outcome"] == "unresolved"

        env.reset(task_id=MOVE.instance_id)
        bad = env.step(CallToolAction(tool_name="submit", arguments={"answer": 3}))
        assert not bad.done and bad.observation.error.error_type.value == "invalid_args"
    assert [g.grade.outcome for g in served.graded] == ["resolved", "unresolved"]


def test_the_cli_serves_a_task_set(orchestrator: str, client: SandboxClient,
                                   tmp_path: Path) -> None:
    port = free_port()
    record = tmp_path / "graded.jsonl"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchard", "openenv", "serve", "--tasks", "bundled", "--task",
         SWE_ID, "--port", str(port), "--orchestrator", orchestrator, "--record", str(record)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=dies_with_the_tests)
    try:
        url = f"http://127.0.0.1:{port}"
        assert wait_until(lambda: _healthy(url), timeout=120), "orchard openenv serve not up"
        with GenericEnvClient(base_url=url).sync() as env_client:
            first = env_client.reset(task_id=SWE_ID)
            assert first.observation["prompt"] == SWE_TASK.prompt
            env_client.step({"command": heredoc_apply(SWE_TASK.patch)})
            graded = env_client.step({"submit": True})
            assert graded.done and graded.reward == 1.0
        assert '"outcome": "resolved"' in record.read_text()
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert "serving 1 swe tasks of bundled (commands)" in out
    assert not client.list_sandboxes(labels={"orchard-openenv": "bundled"})


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False
