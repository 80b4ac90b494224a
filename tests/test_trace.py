"""Rollout traces end to end: a rollout driven by hand (the real OpenAI client through the
recording proxy to the scripted teacher; execs, uploads and a patch in real sandboxes of the
session orchestrator), then its event log, trace, exports, replay and CLI."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import httpx
import openai
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from orchard.cli import app as cli_app
from orchard.env.client import SandboxClient
from orchard.env.schema import EventKind, SandboxEvent, SandboxStatus
from orchard.rollout.proxy.app import ProxySettings, create_proxy_app
from orchard.rollout.tokenizer import TEST_TOKENIZER, load_tokenizer
from orchard.rollout.traces import export
from orchard.rollout.traces.replay import REPLAY_LABEL, ReplayReport, replay
from orchard.rollout.traces.trace import Trace, build_trace, collect_trace
from orchard.serving import ThreadedServer
from orchard.testing.teacher import Reply, ScriptedPolicy, TeacherServer, ToolCall
from tests.conftest import needs_root

ADMIN_KEY = "proxy-admin-key"  # reading the proxy's sessions takes it
ADMIN = {"X-API-Key": ADMIN_KEY}
pytestmark = needs_root

TOKENIZER = TEST_TOKENIZER
EXTRA = {"return_token_ids": True, "logprobs": True}


def _tool(name: str, **params: str) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": f"The {name} tool.",
        "parameters": {"type": "object", "required": sorted(params),
                       "properties": {k: {"type": v} for k, v in params.items()}}}}


TOOLS = [_tool("bash", command="string"), _tool("write_file", path="string", content="string"),
         _tool("apply_patch", patch="string")]
PATCH = """\
--- a/app/greet.sh
+++ b/app/greet.sh
@@ -1 +1 @@
-echo hi
+echo hello
"""
SCRIPT = [
    Reply(tool_calls=[ToolCall("bash", {"command": "printf 'hello\\n' > notes.txt && "
                                                   "cat notes.txt"})]),
    Reply(tool_calls=[ToolCall("write_file", {"path": "/workspace/app/greet.sh",
                                              "content": "echo hi\n"})]),
    Reply(tool_calls=[ToolCall("apply_patch", {"patch": PATCH})]),
    Reply(content="Let me check it.",
          tool_calls=[ToolCall("bash", {"command": "sh app/greet.sh; exit 3"})]),
    Reply(content="Done: greet.sh says hello."),
]
USER_PARTS = [{"type": "text", "text": "Make app/greet.sh say hello."},
              {"type": "text", "text": "Then stop."}]
METADATA = {"task": "greet", "reward": 1.0}


@dataclass
class Rollout:
    id: str
    agent: str  # sandbox ids
    tests: str
    proxy: str
    store: Path
    trace: Trace
    sent: list[dict[str, Any]]  # the conversation as the harness last sent it
    expected: list[tuple[str, str]] = field(default_factory=list)  # (source, what) in order


@pytest.fixture(scope="module")
def teacher_and_proxy(tmp_path_factory: pytest.TempPathFactory
                      ) -> Iterator[tuple[TeacherServer, str, Path]]:
    store = tmp_path_factory.mktemp("proxy-store")
    with TeacherServer(ScriptedPolicy(SCRIPT), load_tokenizer(TOKENIZER)) as teacher:
        proxy = ThreadedServer(create_proxy_app(ProxySettings(upstreams=[teacher.url],
                                                              store=store, admin_key=ADMIN_KEY)),
                               "proxy")
        proxy.start()
        try:
            yield teacher, proxy.url or "", store
        finally:
            proxy.stop()


@pytest.fixture(scope="module")
def client(orchestrator: str) -> Iterator[SandboxClient]:
    with SandboxClient(orchestrator) as c:
        yield c


def _harness_step(sandbox: Any, call: Any) -> str:
    """Run one tool call the way a harness would; the tool message's content."""
    args = json.loads(call.function.arguments)
    if call.function.name == "bash":
        job = sandbox.exec(args["command"], cwd="/workspace")
        return f"exit {job.exit_code}\n{job.stdout}{job.stderr}"
    if call.function.name == "write_file":
        return f"wrote {sandbox.upload_content(args['content'], args['path']).size} bytes"
    result = sandbox.apply_patch(args["patch"], cwd="/workspace")
    return f"patch: {'applied' if result.success else 'failed'} ({result.method})"


@pytest.fixture(scope="module")
def rollout(teacher_and_proxy: tuple[TeacherServer, str, Path],
            client: SandboxClient) -> Rollout:
    teacher, proxy, store = teacher_and_proxy
    rid = f"trace-{uuid.uuid4().hex[:8]}"
    expected: list[tuple[str, str]] = []
    agent = client.create_sandbox("host", session=rid, env={"GREETING": "hi"},
                                  labels={"run": rid, "role": "agent"})
    tests = client.create_sandbox("host", session=rid, labels={"run": rid, "role": "tests"})
    expected += [("sandbox", "created"), ("sandbox", "ready")] * 2
    # The harness's set-up: one of each kind of sandbox action.
    agent.mkdir("/workspace/app")
    agent.upload_content(b"scratch", "/workspace/tmp.txt")
    agent.remove("/workspace/tmp.txt")
    job = agent.exec(["sh", "-c", "cat > input.txt; echo $GREETING $WHO"], cwd="/workspace",
                     env={"WHO": "world"}, stdin=b"from stdin\n")
    assert job.stdout == "hi world\n", job
    agent.start_process(["sleep", "300"])
    expected += [("sandbox", k) for k in ("mkdir", "file_write", "remove", "exec", "process")]

    model = openai.OpenAI(base_url=f"{proxy}/s/{rid}/v1", api_key="unused", max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are careful."},
                                      {"role": "user", "content": USER_PARTS}]
    kinds = {"bash": "exec", "write_file": "file_write", "apply_patch": "patch"}
    for turn in range(len(SCRIPT)):
        r = model.chat.completions.create(model="teacher", messages=messages, tools=TOOLS,
                                          extra_body=EXTRA)
        expected.append(("model", str(turn)))
        message = r.choices[0].message
        sent = list(messages)
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or []:
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": _harness_step(agent, call)})
            expected.append(("sandbox", kinds[call.function.name]))
        if not message.tool_calls:
            break
    # The harness asks once more and the model server fails: a recorded call with no reply.
    teacher.fail_next(503, "overloaded")
    with pytest.raises(openai.APIStatusError):
        model.chat.completions.create(model="teacher", messages=[
            *messages, {"role": "user", "content": "Anything else?"}], tools=TOOLS)
    expected.append(("model", str(len(SCRIPT))))
    # The evaluation, in the second sandbox.
    tests.upload_content(agent.download_content("/workspace/app/greet.sh"), "/workspace/g.sh")
    assert tests.exec("sh /workspace/g.sh").stdout == "hello\n"
    expected += [("sandbox", "file_write"), ("sandbox", "exec")]
    agent.delete()
    tests.delete()
    expected += [("sandbox", "deleted")] * 2
    trace = collect_trace(rid, client, proxy, METADATA, proxy_key=ADMIN_KEY)
    return Rollout(rid, agent.id, tests.id, proxy, store, trace,
                   sent + [messages[len(sent)]], expected)


def _label(trace: Trace, step: Any) -> tuple[str, str]:
    if step.source == "model":
        return "model", str(trace.model_calls[step.index]["index"])
    return "sandbox", trace.sandbox_events[step.index].kind.value


def _events(trace: Trace, kind: EventKind, sid: str | None = None) -> list[SandboxEvent]:
    return [e for e in trace.sandbox_events
            if e.kind == kind and (sid is None or e.sandbox_id == sid)]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- the event log and the trace -------------------------------------------------------------

def test_trace_holds_every_call_and_action_in_order(rollout: Rollout) -> None:
    trace = rollout.trace
    assert [c["index"] for c in trace.model_calls] == list(range(len(SCRIPT) + 1))
    assert [_label(trace, s) for s in trace.timeline] == rollout.expected
    seqs = [e.seq for e in trace.sandbox_events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert len(trace.execs()) == 4  # set-up, two bash tool calls, the evaluation
    assert trace.started_at == trace.timeline[0].time
    assert trace.ended_at is not None and trace.ended_at >= trace.timeline[-1].time
    assert trace.metadata == METADATA


def test_events_carry_session_labels_and_what_it_takes_to_redo(rollout: Rollout) -> None:
    trace = rollout.trace
    role = {rollout.agent: "agent", rollout.tests: "tests"}
    for e in trace.sandbox_events:
        assert e.session == rollout.id
        assert e.labels == {"run": rollout.id, "role": role[e.sandbox_id]}
    (created, _) = _events(trace, EventKind.created)
    assert created.sandbox_id == rollout.agent
    assert created.data["image"] == "host" and created.data["env"] == {"GREETING": "hi"}
    assert created.data["block_network"] is True and created.data["model_proxy"] is False
    assert all(e.data["create_ms"] > 0 for e in _events(trace, EventKind.ready))
    setup = trace.execs()[0].data
    assert setup["argv"] == ["sh", "-c", "cat > input.txt; echo $GREETING $WHO"]
    assert setup["command"] is None and setup["cwd"] == "/workspace"
    assert setup["env"] == {"WHO": "world"}
    assert setup["stdin"] == {"size": 11, "sha256": _sha(b"from stdin\n"),
                              "content_b64": base64.b64encode(b"from stdin\n").decode()}
    assert setup["exit_code"] == 0 and setup["timed_out"] is False and setup["error"] is None
    assert setup["stdout"] == {"bytes": 9, "sha256": _sha(b"hi world\n")}
    assert setup["stderr"] == {"bytes": 0, "sha256": _sha(b"")}
    assert setup["duration_ms"] >= 0
    last = trace.execs()[2].data
    assert last["command"] == "sh app/greet.sh; exit 3" and last["exit_code"] == 3
    writes = _events(trace, EventKind.file_write, rollout.agent)
    assert [w.data["path"] for w in writes] == ["/workspace/tmp.txt", "/workspace/app/greet.sh"]
    assert writes[1].data["content_b64"] == base64.b64encode(b"echo hi\n").decode()
    assert writes[1].data["sha256"] == _sha(b"echo hi\n") and writes[1].data["size"] == 8
    (patch,) = _events(trace, EventKind.patch)
    assert patch.data["patch"] == PATCH and patch.data["success"] is True
    assert patch.data["method"] == "git apply" and patch.data["cwd"] == "/workspace"
    (process,) = _events(trace, EventKind.process)
    assert process.data["argv"] == ["sleep", "300"] and process.data["process_id"]
    assert _events(trace, EventKind.mkdir)[0].data == {"path": "/workspace/app"}
    assert _events(trace, EventKind.remove)[0].data == {"path": "/workspace/tmp.txt",
                                                        "recursive": False}


def test_events_outlive_their_sandbox(rollout: Rollout, client: SandboxClient,
                                      http: httpx.Client) -> None:
    assert client.get_sandbox(rollout.agent).info.status == SandboxStatus.deleted
    assert rollout.agent not in {s.sandbox_id for s in client.list_sandboxes()}
    r = http.get(f"/sandboxes/{rollout.agent}/events")
    assert r.status_code == 200, r.text
    events = [SandboxEvent.model_validate(e) for e in r.json()["events"]]
    assert events == [e for e in rollout.trace.sandbox_events if e.sandbox_id == rollout.agent]
    assert events[-1].kind == EventKind.deleted
    assert events[-1].data == {"reason": "deleted by request"}


def test_label_filters(rollout: Rollout, http: httpx.Client, client: SandboxClient) -> None:
    tests_events = [e for e in rollout.trace.sandbox_events if e.sandbox_id == rollout.tests]
    r = http.get("/events", params=[("label", f"run={rollout.id}"), ("label", "role=tests")])
    assert r.status_code == 200, r.text
    assert [SandboxEvent.model_validate(e) for e in r.json()["events"]] == tests_events
    assert client.events(labels={"run": rollout.id}) == rollout.trace.sandbox_events
    assert client.events(labels={"run": rollout.id, "role": "nobody"}) == []
    r = http.get("/events", params={"label": "no-equals-sign"})
    assert r.status_code == 400 and "key=value" in r.json()["detail"]


def test_paging_with_after(rollout: Rollout, http: httpx.Client) -> None:
    everything = rollout.trace.sandbox_events
    for params in ({"session": rollout.id}, {"label": "role=tests"}):
        pages, after = [], 0
        while True:
            r = http.get("/events", params={**params, "after": after, "limit": 3})
            assert r.status_code == 200, r.text
            body = r.json()
            page = [SandboxEvent.model_validate(e) for e in body["events"]]
            if not page:
                break
            assert len(page) <= 3 and body["next_after"] == page[-1].seq > after
            pages.append(page)
            after = body["next_after"]
        got = [e for page in pages for e in page]
        if "session" in params:
            assert got == everything and all(len(p) == 3 for p in pages[:-1])
        else:  # other tests' sandboxes may carry role=tests too
            assert [e for e in got if e.session == rollout.id] == [
                e for e in everything if e.sandbox_id == rollout.tests]
    r = http.get(f"/sandboxes/{rollout.tests}/events", params={"limit": 2})
    first = r.json()
    r = http.get(f"/sandboxes/{rollout.tests}/events",
                 params={"limit": 100, "after": first["next_after"]})
    assert [e["seq"] for e in first["events"] + r.json()["events"]] == [
        e.seq for e in everything if e.sandbox_id == rollout.tests]


def test_a_trace_needs_no_proxy(rollout: Rollout, client: SandboxClient) -> None:
    trace = collect_trace(rollout.id, client, None)
    assert trace.model_calls == [] and trace.sandbox_events == rollout.trace.sandbox_events
    from_dir = collect_trace(rollout.id, client, rollout.store, METADATA)
    assert from_dir == rollout.trace


# --- exports ----------------------------------------------------------------------------------

def test_model_calls_are_typed_and_keep_fields_they_do_not_name() -> None:
    call = {"index": 0, "started_at": 5.0, "status": 200, "latency_ms": 2.5,
            "response": {"choices": []}, "added_by_a_newer_proxy": {"x": 1}}
    trace = Trace.model_validate_json(build_trace("r-typed", [call], []).model_dump_json())
    assert trace.model_calls == [call]
    with pytest.raises(ValueError, match="status"):
        build_trace("r-bad", [{**call, "status": "not a status"}], [])


def test_swe_row_is_the_last_conversation(rollout: Rollout) -> None:
    row = export.swe_row(rollout.trace)
    assert set(row) == {"tools", "messages", "metadata"}
    assert json.loads(row["tools"]) == TOOLS
    messages = row["messages"]
    assert [m["role"] for m in messages] == ["system", "user"] + ["assistant", "tool"] * 4 + [
        "assistant"]
    assert len(messages) == len(rollout.sent)
    for m in messages:
        assert set(m) == {"role", "content", "tool_call_id", "tool_calls"}
        assert isinstance(m["content"], str) and isinstance(m["tool_calls"], list)
    assert messages[1]["content"] == "Make app/greet.sh say hello.\nThen stop."
    calls = [tc for m in messages for tc in m["tool_calls"]]
    assert [json.loads(tc["function"]["arguments"]) for tc in calls] == [
        r.tool_calls[0].arguments for r in SCRIPT[:4]]
    assert all(tc["type"] == "function" and tc["id"] for tc in calls)
    tool_ids = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
    assert tool_ids == [tc["id"] for tc in calls]
    assert all(m["tool_call_id"] is None for m in messages if m["role"] != "tool")
    assert messages[3]["content"] == "exit 0\nhello\n"
    assert messages[2]["content"] == "" and messages[8]["content"] == "Let me check it."
    assert messages[-1] == {"role": "assistant", "content": "Done: greet.sh says hello.",
                            "tool_call_id": None, "tool_calls": []}
    meta = json.loads(row["metadata"])
    assert meta == {"rollout_id": rollout.id, "metadata": METADATA,
                    "n_model_calls": len(SCRIPT) + 1, "n_execs": 4, "model": "teacher",
                    "drift": [], "started_at": rollout.trace.started_at,
                    "ended_at": rollout.trace.ended_at}


def test_swe_row_without_a_conversation_says_so(rollout: Rollout) -> None:
    failed_only = build_trace("r-x", rollout.trace.model_calls[-1:], [])
    assert failed_only.model_calls[0]["error"] is not None
    for trace in (failed_only, Trace(rollout_id="r-y")):
        with pytest.raises(ValueError, match="no successful chat-completions call"):
            export.swe_row(trace)


def test_jsonl_round_trips(rollout: Rollout, tmp_path: Path) -> None:
    other = build_trace("other", [], rollout.trace.sandbox_events[:3], {"n": 2})
    path = tmp_path / "traces.jsonl"
    assert export.write_jsonl((t for t in (rollout.trace, other)), path) == 2
    lines = path.read_text().splitlines()
    assert [json.loads(line)["rollout_id"] for line in lines] == [rollout.id, "other"]
    assert export.read_jsonl(path) == [rollout.trace, other]
    path.write_text(lines[0] + "\n{not json\n")
    with pytest.raises(ValueError, match=r"traces.jsonl:2 is not a trace"):
        export.read_jsonl(path)


def test_dataset_and_parquet(rollout: Rollout, tmp_path: Path) -> None:
    row = export.swe_row(rollout.trace)
    ds = export.to_dataset([rollout.trace, rollout.trace])
    assert ds.features == export.swe_features() and len(ds) == 2
    assert ds[0] == row
    path = tmp_path / "swe.parquet"
    assert export.write_parquet([rollout.trace], path) == 1
    loaded = datasets.load_dataset("parquet", data_files=str(path), split="train",
                                   cache_dir=str(tmp_path / "cache"))
    assert loaded.column_names == ["tools", "messages", "metadata"]
    assert loaded[0] == row
    schema = pq.read_schema(path)
    assert str(schema.field("tools").type) == "string"
    message = schema.field("messages").type.value_type
    assert [f.name for f in message] == ["role", "content", "tool_call_id", "tool_calls"]
    function = message.field("tool_calls").type.value_type.field("function").type
    assert [f.name for f in function] == ["name", "arguments"]
    with pytest.raises(ValueError, match="no successful chat-completions call"):
        export.to_dataset([Trace(rollout_id="empty")])


# --- replay -----------------------------------------------------------------------------------

def _actions(trace: Trace) -> list[SandboxEvent]:
    return [e for e in trace.sandbox_events if e.kind not in (
        EventKind.created, EventKind.ready, EventKind.deleted, EventKind.failed)]


def _assert_deleted(client: SandboxClient, report: ReplayReport) -> None:
    for sid in report.sandbox_ids.values():
        assert client.get_sandbox(sid).info.status == SandboxStatus.deleted


def test_replay_reproduces_files_and_exit_codes(rollout: Rollout,
                                                client: SandboxClient) -> None:
    report = replay(rollout.trace, client, keep=True)
    try:
        assert (report.matched, report.diverged, report.skipped) == (
            len(_actions(rollout.trace)), 0, 0), report.steps
        assert report.ok and report.kept
        assert [s.seq for s in report.steps] == [e.seq for e in _actions(rollout.trace)]
        assert set(report.sandbox_ids) == {rollout.agent, rollout.tests}
        assert not set(report.sandbox_ids.values()) & {rollout.agent, rollout.tests}
        agent = client.get_sandbox(report.sandbox_ids[rollout.agent])
        assert agent.info.status == SandboxStatus.running
        assert agent.info.labels[REPLAY_LABEL] == rollout.agent
        assert agent.download_content("/workspace/notes.txt") == b"hello\n"
        assert agent.download_content("/workspace/app/greet.sh") == b"echo hello\n"
        assert agent.download_content("/workspace/input.txt") == b"from stdin\n"
        assert agent.exec("test -e /workspace/tmp.txt").exit_code == 1
        assert [p.command for p in agent.list_processes()] == ["sleep 300"]
        exit3 = next(s for s in report.steps if s.original.get("exit_code") == 3)
        assert exit3.replayed is not None and exit3.replayed["exit_code"] == 3 and exit3.matches
        # Nothing of the replay was logged under the original rollout.
        assert client.events(session=rollout.id) == rollout.trace.sandbox_events
    finally:
        for sid in report.sandbox_ids.values():
            client.delete_sandbox(sid)


def test_replay_detects_an_edited_outcome(rollout: Rollout, client: SandboxClient) -> None:
    trace = copy.deepcopy(rollout.trace)
    edited = next(e for e in trace.execs() if e.data["exit_code"] == 3)
    edited.data["exit_code"] = 0
    report = replay(trace, client)
    (bad,) = [s for s in report.steps if not s.matches]
    assert (bad.seq, bad.status, bad.detail) == (edited.seq, "diverged",
                                                  "exit code 0 then, 3 now")
    assert report.diverged == 1 and not report.ok
    _assert_deleted(client, report)


def test_replay_detects_a_changed_environment(rollout: Rollout, client: SandboxClient) -> None:
    # Without the write of greet.sh the patch has nothing to patch and the script is missing.
    trace = copy.deepcopy(rollout.trace)
    dropped = next(e for e in _events(trace, EventKind.file_write, rollout.agent)
                   if e.data["path"].endswith("greet.sh"))
    trace.sandbox_events.remove(dropped)
    report = replay(trace, client)
    (patch,) = _events(trace, EventKind.patch)
    check = next(e for e in trace.execs() if e.data["exit_code"] == 3)
    diverged = {s.seq: s for s in report.steps if s.status == "diverged"}
    assert set(diverged) == {patch.seq, check.seq}, report.steps
    assert diverged[patch.seq].detail.startswith("patch applied then, failed now")
    assert diverged[check.seq].detail.startswith(
        "stdout differs (6 bytes then, 0 now); stderr differs (0 bytes then, ")
    assert diverged[check.seq].replayed["exit_code"] == 3
    _assert_deleted(client, report)


def test_replay_until_and_one_sandbox(rollout: Rollout, client: SandboxClient) -> None:
    first_bash = rollout.trace.execs()[1]
    report = replay(rollout.trace, client, until=first_bash.seq, keep=True)
    try:
        assert report.steps[-1].seq == first_bash.seq and report.ok
        assert [s.seq for s in report.steps] == [
            e.seq for e in _actions(rollout.trace) if e.seq <= first_bash.seq]
        # The state at that point: notes.txt is there, greet.sh not yet.
        agent = client.get_sandbox(report.sandbox_ids[rollout.agent])
        assert agent.download_content("/workspace/notes.txt") == b"hello\n"
        assert agent.exec("test -e /workspace/app/greet.sh").exit_code == 1
    finally:
        for sid in report.sandbox_ids.values():
            client.delete_sandbox(sid)
    only = replay(rollout.trace, client, sandbox_id=rollout.tests)
    assert list(only.sandbox_ids) == [rollout.tests]
    assert [s.kind for s in only.steps] == [EventKind.file_write, EventKind.exec] and only.ok
    _assert_deleted(client, only)
    with pytest.raises(ValueError, match="not in the trace"):
        replay(rollout.trace, client, sandbox_id="sb-nothere")
    headless = rollout.trace.model_copy(update={"sandbox_events": _actions(rollout.trace)})
    with pytest.raises(ValueError, match="no 'created' event.*pass image="):
        replay(headless, client)


def test_replay_skips_what_the_log_did_not_keep(client: SandboxClient) -> None:
    rid = f"big-{uuid.uuid4().hex[:8]}"
    big = b"x" * ((1 << 20) + 1)  # one byte over the default event_content_bytes
    with client.create_sandbox("host", session=rid) as sandbox:
        sandbox.upload_content(big, "/workspace/big.bin")
        assert sandbox.exec("wc -c < /workspace/big.bin").stdout.strip() == str(len(big))
    trace = collect_trace(rid, client, None)
    write = _events(trace, EventKind.file_write)[0]
    assert write.data["content_b64"] is None and write.data["sha256"] == _sha(big)
    report = replay(trace, client)
    assert [s.status for s in report.steps] == ["skipped", "diverged"]
    assert report.steps[0].detail == (f"skipped: content not kept (size {len(big)} bytes > "
                                      "the orchestrator's event_content_bytes)")
    assert report.steps[0].replayed is None and not report.steps[0].matches
    assert (report.skipped, report.diverged, report.matched) == (1, 1, 0)
    _assert_deleted(client, report)


# --- the CLI ----------------------------------------------------------------------------------

def _cli(*args: str) -> Any:
    result = CliRunner().invoke(cli_app, list(args), env={
        "ORCHARD_API_KEY": None, "ORCHARD_PROXY_KEY": ADMIN_KEY, "COLUMNS": "200"})
    assert "Traceback" not in result.output, result.output
    return result


def test_cli_show_and_export(rollout: Rollout, orchestrator: str, tmp_path: Path) -> None:
    r = _cli("trace", "show", rollout.id, "--orchestrator", orchestrator, "--proxy",
             rollout.proxy)
    assert r.exit_code == 0, r.output
    assert "model call 0: 1 tool call(s): bash" in r.stdout
    assert "exec 'sh app/greet.sh; exit 3' -> 3" in r.stdout
    assert f"{len(SCRIPT) + 1} model call(s), {len(rollout.trace.sandbox_events)} sandbox " \
           "event(s) (4 exec(s))" in r.stdout
    r = _cli("trace", "show", rollout.id, "--orchestrator", orchestrator, "--proxy",
             rollout.proxy, "--proxy-key", "not-the-key")
    assert r.exit_code == 1 and "refused to show its sessions" in r.stderr
    assert "--proxy-key" in r.stderr
    jsonl = tmp_path / "t.jsonl"
    r = _cli("trace", "export", rollout.id, "--orchestrator", orchestrator, "--proxy",
             str(rollout.store), "--format", "jsonl", "--output", str(jsonl))
    assert r.exit_code == 0, r.output
    assert export.read_jsonl(jsonl) == [rollout.trace.model_copy(update={"metadata": {}})]
    swe = tmp_path / "swe.jsonl"
    r = _cli("trace", "export", rollout.id, "nothing-recorded", "--orchestrator", orchestrator,
             "--proxy", rollout.proxy, "--format", "swe-jsonl", "-o", str(swe))
    assert r.exit_code == 0, r.output
    assert "skipped: rollout 'nothing-recorded' has no successful" in r.stderr
    (line,) = swe.read_text().splitlines()
    assert json.loads(line)["messages"] == export.swe_row(rollout.trace)["messages"]
    parquet = tmp_path / "swe.parquet"
    r = _cli("trace", "export", rollout.id, "--orchestrator", orchestrator, "--proxy",
             rollout.proxy, "--format", "parquet", "-o", str(parquet))
    assert r.exit_code == 0, r.output
    assert pq.read_table(parquet).column_names == ["tools", "messages", "metadata"]
    r = _cli("trace", "export", "nothing-recorded", "--orchestrator", orchestrator,
             "--format", "parquet", "-o", str(tmp_path / "none.parquet"))
    assert r.exit_code == 1 and "nothing written" in r.stderr
    assert not (tmp_path / "none.parquet").exists()


def test_cli_replay(rollout: Rollout, orchestrator: str, client: SandboxClient,
                    tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    trace = copy.deepcopy(rollout.trace)
    export.write_jsonl([build_trace("other", [], [])], path)
    r = _cli("trace", "replay", str(path), "--rollout", rollout.id, "--orchestrator",
             orchestrator)
    assert r.exit_code == 1 and f"has no trace of rollout '{rollout.id}'" in r.stderr
    export.write_jsonl([trace], path)
    r = _cli("trace", "replay", str(path), "--orchestrator", orchestrator)
    assert r.exit_code == 0, r.output
    assert f"{len(_actions(trace))} matched, 0 diverged, 0 skipped" in r.stdout
    next(e for e in trace.execs() if e.data["exit_code"] == 3).data["exit_code"] = 7
    export.write_jsonl([trace], path)
    r = _cli("trace", "replay", str(path), "--rollout", rollout.id, "--orchestrator",
             orchestrator)
    assert r.exit_code == 1, r.output
    assert "1 diverged" in r.stdout and "exit code 7 then, 3 now" in r.stdout
    # Every replay's sandboxes are gone again.
    assert not [s for s in client.list_sandboxes() if REPLAY_LABEL in s.labels]


@needs_root
def test_a_streamed_exec_whose_client_hangs_up_is_still_in_the_log(
        orchestrator: str, client: SandboxClient) -> None:
    session = f"hangup-{uuid.uuid4().hex[:8]}"
    sandbox = client.create_sandbox("host", session=session)
    try:
        body = {"command": "echo a; sleep 2; echo b > /workspace/b", "stream": True}
        with httpx.Client(base_url=orchestrator, timeout=30) as http, http.stream(
                "POST", f"/sandboxes/{sandbox.id}/exec", json=body) as r:
            assert r.status_code == 200
            next(r.iter_lines())  # the first output line, then hang up mid-command

        def exec_events() -> list[SandboxEvent]:
            return [e for e in client.events(session=session) if e.kind == EventKind.exec]

        deadline = time.monotonic() + 20
        while not exec_events() and time.monotonic() < deadline:
            time.sleep(0.1)
        (event,) = exec_events()
        assert event.data["command"] == body["command"]
        assert event.data["exit_code"] is None and "disconnected" in event.data["error"]
    finally:
        sandbox.delete()
