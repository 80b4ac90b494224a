"""The assistant domain: its tools and services, its tasks (every gold run resolves, doing
nothing does not), the services in real sandboxes over HTTP and MCP (the mcp SDK's client),
and rollouts of the assistant loop through the recording proxy, graded and traced."""

from __future__ import annotations

import asyncio
import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchard.domains import make_harness
from orchard.domains.assistant import (
    CHECKS,
    TEMPLATES,
    AssistantTask,
    Check,
    call_tool,
    generate,
    grade_assistant,
    load_assistant_tasks,
    start_services,
    validate_assistant,
    world_state,
)
from orchard.domains.assistant.judge import judge_prompt, keyword_judge
from orchard.domains.assistant.services.tools import TOOLS, ToolError, call
from orchard.env.client import AsyncSandboxClient, SandboxClient
from orchard.eval import RunConfig, evaluate
from orchard.eval.results import read_results
from orchard.rollout.tokenizer import TEST_TOKENIZER, load_tokenizer
from orchard.tasks import TaskLoadError
from orchard.testing.policies import Reply
from orchard.testing.teacher import FunctionPolicy, TeacherServer
from tests.conftest import needs_root

TASKS = {t.instance_id: t for t in load_assistant_tasks()}
HAND = load_assistant_tasks("assistant-hand")


def play(task: AssistantTask) -> dict:
    world = task.seed()
    for step in task.gold:
        world, _ = call(world, step.tool, step.args)
    return world


def passes(task: AssistantTask, world: dict, answer: str | None) -> bool:
    return all(CHECKS[c.name](world, answer, **c.args)[0] for c in task.checks)


def test_the_sets_load_with_splits_and_are_varied() -> None:
    generated = load_assistant_tasks("assistant-generated")
    assert len(generated) == 200 and len(HAND) >= 20
    assert len(TASKS) == len(generated) + len(HAND)  # ids are unique
    assert {t.split for t in TASKS.values()} == {"train", "test"}
    assert {t.metadata["template"] for t in generated} == {f.__name__ for f in TEMPLATES}
    # No two ask the same (a scripted teacher knows a task by its request).
    assert len({t.goal for t in TASKS.values()}) == len(TASKS)
    assert generate(20, seed=1) == generate(20, seed=1) != generate(20, seed=2)


@pytest.mark.parametrize("task", list(TASKS.values()), ids=list(TASKS))
def test_every_gold_run_resolves_and_doing_nothing_does_not(task: AssistantTask) -> None:
    assert passes(task, play(task), task.answer)
    assert not passes(task, task.seed(), None)


def test_a_wrong_call_is_an_error_with_the_schema_and_changes_nothing() -> None:
    world = TASKS["hand-move-dana-thursday"].seed()
    before = copy.deepcopy(world)
    for name, args, said in [
            ("calendar_create", {"title": "x"}, "missing ['start', 'end']"),
            ("calendar_create", {"title": "x", "start": 9, "end": "b"}, "'start' must be"),
            ("mail_move", {"id": "m1", "folder": "archive", "extra": 1}, "no argument 'extra'"),
            ("calendar_respond", {"id": "i1", "response": "maybe"}, "one of ['accept'"),
            ("calendar_update", {"id": "e404"}, "no event with id 'e404'"),
            ("calendar_update", {"id": "e1", "end": "2026-03-05T09:00"}, "end after it starts"),
            ("no_such_tool", {}, "no tool 'no_such_tool'")]:
        with pytest.raises(ToolError, match=said.replace("[", r"\[")):
            call(world, name, args)
    assert world == before
    changed, result = call(world, "calendar_create", {
        "title": "Clash", "start": "2026-03-05T10:30", "end": "2026-03-05T11:30"})
    assert result["conflicts"] == ["e1"] and world == before and changed != before
    assert "Its schema" in str(pytest.raises(ToolError, call, world, "files_read", {}).value)
    assert set(TOOLS) >= {"mail_send", "calendar_respond", "contacts_search", "files_write",
                          "notes_add", "todos_done", "web_search"}


def test_bad_task_files_say_what_is_wrong(tmp_path: Path) -> None:
    row = TASKS["hand-invoice-question"].model_dump()
    for change, said in [({"checks": [{"name": "nope"}]}, "unknown checks"),
                         ({"gold": [{"tool": "teleport"}]}, "unknown tools"),
                         ({"world": {"bank": {}}}, "no part")]:
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps([{**row, **change}]))
        with pytest.raises(TaskLoadError, match=said):
            load_assistant_tasks(bad)


@pytest.fixture(scope="module")
def client(orchestrator: str) -> Iterator[SandboxClient]:
    with SandboxClient(orchestrator) as c:
        yield c


@needs_root
def test_services_in_a_sandbox_over_http_and_mcp(client: SandboxClient,
                                                 orchestrator: str) -> None:
    from orchard.domains.assistant.mcp_client import mcp_session

    task = TASKS["hand-move-dana-thursday"]
    with client.create_sandbox() as sb:
        start_services(sb, task)
        assert call_tool(sb, "contacts_search", {"query": "dana"})[1][0]["name"] == "Dana Lee"
        ok, why = call_tool(sb, "calendar_update", {"id": "e1", "start": 5})
        assert not ok and "'start' must be a JSON string" in why and "schema" in why

        async def over_mcp() -> tuple[int, bool, str, bool]:
            async with AsyncSandboxClient(orchestrator, api_key=client.api_key) as aclient, \
                    mcp_session(await aclient.get_sandbox(sb.id)) as session:
                listed = await session.list_tools()
                moved = await session.call_tool("calendar_update", {
                    "id": "e2", "start": "2026-03-06T14:00", "end": "2026-03-06T14:30"})
                refused = await session.call_tool("mail_read", {"id": "m404"})
                return (len(listed.tools), moved.is_error, refused.content[0].text,
                        refused.is_error)

        n_tools, moved_error, refusal, refused_error = asyncio.run(over_mcp())
        assert n_tools == len(TOOLS) and not moved_error
        assert refused_error and "no message with id 'm404'" in refusal
        world = world_state(sb)  # the MCP call changed the world the checks read
        assert next(e for e in world["events"] if e["id"] == "e2")["start"] == \
            "2026-03-06T14:00"
        # The world is on disk too: it outlives the server.
        saved = json.loads(sb.download_content("/workspace/.orchard-assistant/world.json"))
        assert saved == world


@needs_root
def test_validation_and_a_broken_check(client: SandboxClient) -> None:
    check = validate_assistant(client, TASKS["hand-answer-invitations"])
    assert check.ok and check.gold and check.gold.resolved, check
    task = TASKS["hand-invoice-todo"]
    broken = task.model_copy(update={"checks": [Check(name="todo", args={"nope": 1})]})
    with client.create_sandbox() as sb:
        start_services(sb, broken)
        grade = grade_assistant(sb, broken, None)
    assert grade.outcome == "task_error" and "crashed" in grade.reason


@needs_root
def test_eval_with_the_assistant_teacher_is_graded_and_traced(client: SandboxClient,
                                                              tmp_path: Path) -> None:
    chosen = [TASKS[i] for i in ("hand-move-dana-thursday", "hand-invoice-question",
                                 "gen-answer-invitation-004")]
    out = tmp_path / "run"
    summary = evaluate(chosen, make_harness("assistant-teacher", chosen), out, client,
                       config=RunConfig(out=out, n=2))
    assert summary["overall"]["rollouts"] == 6 and summary["overall"]["resolved_rate"] == 1.0
    rows = read_results(out)
    trace = json.loads((out / rows[0].trace).read_text())
    tool_calls = [e for e in trace["sandbox_events"] if e["kind"] == "http"
                  and e["data"]["path"].startswith("/tools/")]
    assert len(trace["model_calls"]) == rows[0].n_steps
    assert len(tool_calls) == rows[0].n_steps - 1  # every call but finish is a tool call
    weak_out = tmp_path / "weak"
    weak = evaluate(chosen[:1], make_harness("assistant-teacher", chosen, teacher_solve=0.0),
                    weak_out, client, config=RunConfig(out=weak_out))
    assert weak["overall"]["resolved_rate"] == 0.0
    (row,) = read_results(weak_out)
    assert row.grade is not None and row.grade.outcome == "unresolved" and row.n_steps == 3
    with pytest.raises(ValueError, match="assistant tasks run with"):
        make_harness("web-teacher", chosen)


def test_the_keyword_judge_scores_what_the_assistant_wrote() -> None:
    def scores(task: AssistantTask, messages: list[dict]) -> list[float]:
        prompt = judge_prompt(task, messages, task.answer if messages else None)
        return json.loads(keyword_judge([{"role": "user", "content": prompt}], None)
                          .content or "")["scores"]

    judged = [t for t in load_assistant_tasks() if t.rubric]
    assert len(judged) >= 40  # hand-written rubrics and four templates'
    for task in judged:
        gold = [{"role": "assistant", "tool_calls": [{"function": {
            "name": c.tool, "arguments": json.dumps(c.args)}}]} for c in task.gold]
        # Results are the tools' words, not the assistant's: they earn nothing.
        echoed = [{"role": "tool", "content": json.dumps(task.world)}]
        assert scores(task, []) == scores(task, echoed) == [0.0] * len(task.rubric)
        assert len(scores(task, gold)) == len(task.rubric) and sum(scores(task, gold)) > 0


def scripted_judge(messages: list[dict], tools: object) -> Reply:
    """Full marks on the first criterion, half on the rest: J is known in advance."""
    prompt = str(messages[-1]["content"])
    n = len(re.findall(r"^\d+\. ", prompt, re.MULTILINE))
    return Reply(content=json.dumps({"scores": [1.0] + [0.5] * (n - 1)}))


def nonsense_judge(messages: list[dict], tools: object) -> Reply:
    return Reply(content="It looks fine to me.")


@needs_root
def test_the_rubric_judge_gives_the_process_reward_and_is_traced(client: SandboxClient,
                                                                 tmp_path: Path) -> None:
    task = TASKS["hand-move-dana-thursday"]  # two criteria, weights 2 and 1
    with TeacherServer(FunctionPolicy(scripted_judge), load_tokenizer(TEST_TOKENIZER),
                       model_name="judge") as judge:
        out = tmp_path / "judged"
        harness = make_harness("assistant-teacher", [task], judge_url=f"{judge.url}/v1")
        evaluate([task], harness, out, client, config=RunConfig(out=out))
    (row,) = read_results(out)
    assert row.grade is not None and row.grade.resolved and row.failure is None
    assert row.grade.judge_scores == [1.0, 0.5]
    assert row.grade.judge == pytest.approx((2 * 1.0 + 1 * 0.5) / 3)
    assert row.reward == pytest.approx(1.0 + 0.5 * row.grade.judge)
    trace = json.loads((out / row.trace).read_text())
    (call,) = trace["judge_calls"]
    assert "Criteria:" in call["request"]["messages"][-1]["content"]
    assert "CALL calendar_update" in call["request"]["messages"][-1]["content"]


@needs_root
def test_a_judge_that_fails_is_a_judge_failure_not_a_zero(client: SandboxClient,
                                                           tmp_path: Path) -> None:
    task = TASKS["hand-contract-term"]
    with TeacherServer(FunctionPolicy(nonsense_judge), load_tokenizer(TEST_TOKENIZER),
                       model_name="judge") as judge:
        out = tmp_path / "nonsense"
        evaluate([task], make_harness("assistant-teacher", [task],
                                      judge_url=f"{judge.url}/v1"),
                 out, client, config=RunConfig(out=out))
    (row,) = read_results(out)
    assert row.failure is not None and row.failure.cls == "judge"
    assert "nonsense" in row.failure.message and "It looks fine" in row.failure.message
    trace = json.loads((out / row.trace).read_text())
    assert len(trace["judge_calls"]) == 2  # it asked again once
    out = tmp_path / "unreachable"
    evaluate([task], make_harness("assistant-teacher", [task],
                                  judge_url="http://127.0.0.1:9/v1"),
             out, client, config=RunConfig(out=out))
    (row,) = read_results(out)
    assert row.failure is not None and row.failure.cls == "judge"
    assert "unreachable" in row.failure.message


# An external assistant CLI, standard library only, as a user would bring one: it reads the
# environment the adapter sets, calls the model at OPENAI_BASE_URL and the tools over HTTP.
CLI = r"""
import json, os, urllib.request as u

def post(url, body):
    req = u.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        return json.load(u.urlopen(req, timeout=120))
    except u.HTTPError as e:
        return json.load(e)

tools_url = os.environ["ORCHARD_TOOLS_URL"]
tools = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
          "parameters": t["inputSchema"]}} for t in json.load(u.urlopen(tools_url + "/tools"))]
tools.append({"type": "function", "function": {"name": "finish", "parameters": {
    "type": "object", "properties": {"answer": {"type": "string"}}}}})
messages = [{"role": "user", "content": os.environ["ORCHARD_GOAL"]}]
for _ in range(20):
    reply = post(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
                 {"model": "teacher", "messages": messages, "tools": tools})
    message = reply["choices"][0]["message"]
    messages.append(message)
    call = message["tool_calls"][0]
    args = json.loads(call["function"]["arguments"])
    if call["function"]["name"] == "finish":
        if args.get("answer"):
            open(os.environ["ORCHARD_ANSWER_FILE"], "w").write(args["answer"])
        break
    result = post(tools_url + "/tools/" + call["function"]["name"], args)
    messages.append({"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)})
"""


@needs_root
def test_an_external_assistant_cli_runs_inside_the_sandbox(data_dir: Path, orchestrator: str,
                                                           tmp_path: Path) -> None:
    from orchard.domains.assistant.harness import AssistantCliHarness
    from orchard.domains.assistant.teacher import assistant_teacher
    from orchard.rollout.proxy.app import ProxySettings, create_proxy_app
    from orchard.serving import ThreadedServer
    from tests.conftest import dedicated_orchestrator

    chosen = [TASKS["hand-invoice-question"], TASKS["hand-prep-block"]]
    store = tmp_path / "store"
    with TeacherServer(FunctionPolicy(assistant_teacher(chosen)),
                       load_tokenizer(TEST_TOKENIZER)) as teacher:
        settings = ProxySettings(upstreams=[teacher.url], store=store)
        proxy = ThreadedServer(create_proxy_app(settings), "proxy")
        proxy.start()
        try:
            with dedicated_orchestrator(data_dir, model_proxy=proxy.url) as url, \
                    SandboxClient(url) as own:
                out = tmp_path / "run"
                harness = AssistantCliHarness("python3 /workspace/cli.py",
                                              files={"/workspace/cli.py": CLI.encode()})
                summary = evaluate(chosen, harness, out, own, config=RunConfig(out=out),
                                   proxy_url=proxy.url, proxy_key=settings.admin_key)
        finally:
            proxy.stop()
    assert summary["overall"]["resolved_rate"] == 1.0, summary
    rows = {r.instance_id: r for r in read_results(out)}
    assert rows["hand-invoice-question"].grade.answer == "$18,250, due 2026-03-10."
    trace = json.loads((out / rows["hand-prep-block"].trace).read_text())
    # The model calls went through the orchestrator's proxy under the rollout's session.
    assert len(trace["model_calls"]) == len(TASKS["hand-prep-block"].gold) + 1
