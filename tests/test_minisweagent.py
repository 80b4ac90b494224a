"""mini-swe-agent on Orchard, end to end with real parts only: the session orchestrator and
its 'host' sandboxes, the scripted teacher behind the recording proxy over real HTTP, and
mini-swe-agent's own DefaultAgent and litellm model."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from minisweagent.exceptions import Submitted

from orchard.domains.swe.minisweagent import (
    OrchardEnvironment,
    SandboxUnavailable,
    run_task,
)
from orchard.env.client import SandboxClient
from orchard.rollout.proxy.app import ProxySettings, create_proxy_app
from orchard.rollout.tokenizer import TEST_TOKENIZER, load_tokenizer
from orchard.rollout.traces.trace import collect_trace
from orchard.serving import ThreadedServer
from orchard.testing.teacher import (
    FunctionPolicy,
    PolicyError,
    Reply,
    ScriptedPolicy,
    TeacherServer,
    ToolCall,
)
from tests.conftest import create_ready, needs_root

ADMIN_KEY = "proxy-admin-key"  # reading the proxy's sessions takes it
ADMIN = {"X-API-Key": ADMIN_KEY}
TOKENIZER = TEST_TOKENIZER
ORCHARD = Path(sys.executable).with_name("orchard")
REPO = {
    "calc.py": "def add(a, b):\n    return a - b\n",
    "test_calc.py": "from calc import add\n\nassert add(2, 3) == 5, add(2, 3)\nprint('ok')\n",
}
GIT_INIT = "git init -q && git add -A && git -c user.name=t -c user.email=t@t commit -qm init"


@pytest.fixture(scope="module")
def tok():  # noqa: ANN201 - a transformers tokenizer
    return load_tokenizer(TOKENIZER)


@pytest.fixture(autouse=True)
def _fail_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    # mini-swe-agent retries a failed model call 10 times, minutes apart: a broken test would
    # hang instead of failing with the teacher's error.
    monkeypatch.setenv("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "1")


@contextlib.contextmanager
def teacher_behind_proxy(policy: Any, tok: Any, store: Path,
                         drift: bool = False) -> Iterator[str]:
    """The proxy's URL, with the teacher as its upstream."""
    with TeacherServer(policy, tok, drift=drift) as teacher:
        proxy = ThreadedServer(create_proxy_app(ProxySettings(upstreams=[teacher.url],
                                                              store=store, admin_key=ADMIN_KEY)),
                               "proxy")
        proxy.start()
        try:
            yield proxy.url or ""
        finally:
            proxy.stop()


def bash(command: str) -> list[ToolCall]:
    return [ToolCall("bash", {"command": command})]


def sandbox_exists(http: httpx.Client, sandbox_id: str) -> bool:
    """Not deleted (a deleted sandbox stays listed for a while, as status 'deleted')."""
    r = http.get(f"/sandboxes/{sandbox_id}")
    assert r.status_code in (200, 404), r.text
    return r.status_code == 200 and r.json()["status"] not in ("deleting", "deleted")


# --- the whole loop ---------------------------------------------------------------------------

@needs_root
@pytest.mark.parametrize("drift", [False, True], ids=["token-exact", "re-rendered"])
def test_agent_fixes_a_bug_in_a_sandbox_and_every_call_is_recorded(
        orchestrator: str, http: httpx.Client, tok: Any, tmp_path: Path, drift: bool) -> None:
    """With drift, the teacher re-renders earlier turns differently from the tokens it gave:
    the samples must break at every turn instead of merging them."""
    session = f"msa-{uuid.uuid4().hex[:8]}"
    problems: list[str] = []
    live: list[str] = []

    def solver(messages: list[dict], tools: list[dict] | None) -> Reply:
        """A solver that reads what its commands printed, as a model would."""
        if [t["function"]["name"] for t in tools or []] != ["bash"]:
            raise PolicyError(f"expected mini-swe-agent's bash tool, got {tools}")
        turn = sum(m["role"] == "assistant" for m in messages)
        seen = json.loads(messages[-1]["content"]) if messages[-1]["role"] == "tool" else None

        def expect(ok: bool) -> None:
            if not ok:
                problems.append(f"turn {turn}: unexpected observation {seen}")
                raise PolicyError(problems[-1])

        if turn == 0:
            live.extend(s["sandbox_id"] for s in http.get("/sandboxes").json()["sandboxes"]
                        if s["session"] == session)
            return Reply("Let me read the code and run its test.",
                         bash("cat calc.py && python3 test_calc.py"))
        if turn == 1:  # the test's traceback (stderr) comes with the file (stdout)
            expect(seen is not None and seen["returncode"] == 1
                   and "return a - b" in seen["output"]
                   and seen["output"].rstrip().endswith("AssertionError: -1"))
            return Reply("The operator is wrong.",
                         bash("sed -i 's/return a - b/return a + b/' calc.py"))
        if turn == 2:
            expect(seen == {"returncode": 0, "output": ""})
            return Reply("Now the test again.", bash("python3 test_calc.py"))
        if turn == 3:
            expect(seen == {"returncode": 0, "output": "ok\n"})
            return Reply(None, bash("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git diff"))
        raise PolicyError(f"turn {turn}: the agent should have stopped at the submission")

    trajectory = tmp_path / "traj.json"
    with teacher_behind_proxy(FunctionPolicy(solver), tok, tmp_path / "store",
                              drift=drift) as proxy:
        result = run_task(
            "test_calc.py fails: fix calc.py", orchestrator_url=orchestrator,
            model_base_url=f"{proxy}/s/{session}/v1", model_name="teacher", image="host",
            model_api_key="sk-do-not-leak", session=session, files=REPO,
            setup_command=GIT_INIT, eval_command="python3 test_calc.py",
            trajectory_path=trajectory,
            # Same-size edits within a second would be masked by stale .pyc files.
            config_overrides={"environment": {"env": {"PYTHONDONTWRITEBYTECODE": "1"}}})
        calls = httpx.get(f"{proxy}/sessions/{session}", headers=ADMIN).json()["calls"]
        samples = httpx.get(f"{proxy}/sessions/{session}/samples", headers=ADMIN).json()

    assert problems == []
    assert result["exit_status"] == "Submitted", result["messages"][-1]
    assert "-    return a - b\n+    return a + b\n" in result["submission"]
    assert result["submission"].startswith("diff --git a/calc.py b/calc.py")
    assert result["eval"] == {"returncode": 0, "output": "ok\n", "exception_info": ""}
    assert result["n_steps"] == 4 and result["messages"][-1]["role"] == "exit"

    # The sandbox existed, in the session, while the agent worked; it is gone now.
    assert live == [result["sandbox_id"]]
    assert not sandbox_exists(http, result["sandbox_id"])

    # Every model call went through the proxy and was recorded with its exact tokens.
    assert len(calls) == result["n_steps"]
    assert [c["index"] for c in calls] == list(range(len(calls)))
    for c in calls:
        assert c["status"] == 200 and c["endpoint"] == "/v1/chat/completions"
        assert c["request"]["model"] == "teacher"
        assert c["request"]["return_token_ids"] is True and c["request"]["logprobs"] is True
        assert [t["function"]["name"] for t in c["request"]["tools"]] == ["bash"]
        tokens = c["tokens"]
        assert tokens["prompt_ids"] and tokens["completion_ids"]
        assert len(tokens["completion_logprobs"]) == len(tokens["completion_ids"])
    # What the model saw last is the whole conversation bar its last answer and the exit.
    assert len(calls[-1]["request"]["messages"]) == len(result["messages"]) - 2
    if drift:  # every turn after the first is flagged, and each call is a sample of its own
        assert [d["call"] for d in samples["drift"]] == [1, 2, 3]
        assert [s["calls"] for s in samples["samples"]] == [[0], [1], [2], [3]]
        sample = samples["samples"][-1]
    else:
        # mini-swe-agent sends the history back as the model wrote it: one token-exact sample.
        assert samples["drift"] == [] and len(samples["samples"]) == 1
        sample = samples["samples"][0]
    last = calls[-1]
    assert sample["input_ids"] == last["tokens"]["prompt_ids"] + last["tokens"]["completion_ids"]
    if not drift:  # and then those are the tokenizer's own encoding of the conversation
        seen = tok.encode(tok.apply_chat_template(
            last["request"]["messages"], tools=last["request"]["tools"],
            add_generation_prompt=True, tokenize=False), add_special_tokens=False)
        assert last["tokens"]["prompt_ids"] == seen
    assert sum(sample["loss_mask"]) == sum(len(c["tokens"]["completion_ids"])
                                           for c in calls if c["index"] in sample["calls"])

    # One trace joins the four model calls with every command the sandbox ran, in order.
    with SandboxClient(orchestrator) as client:
        trace = collect_trace(session, client, tmp_path / "store")  # the proxy's own log
    assert len(trace.model_calls) == 4
    agent_commands = ["cat calc.py && python3 test_calc.py",
                      "sed -i 's/return a - b/return a + b/' calc.py", "python3 test_calc.py",
                      "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git diff"]
    def program(e: Any) -> str:  # what a shell ran, whether sent as argv or as a command
        return (e.data["argv"] or [e.data["command"]])[-1]

    ran = [program(e) for e in trace.execs()]
    # (the last is run_task's evaluation, the same command as the agent's third)
    assert [c for c in ran if c in agent_commands] == [*agent_commands, "python3 test_calc.py"]
    assert {e.sandbox_id for e in trace.sandbox_events} == {result["sandbox_id"]}
    steps = [(t.source, t.index) for t in trace.timeline]
    for i in range(4):  # each call comes before the command it asked for
        command_event = next(j for j, e in enumerate(trace.sandbox_events)
                             if e.kind == "exec" and program(e) == agent_commands[i])
        assert steps.index(("model", i)) < steps.index(("sandbox", command_event))
    assert [e.kind for e in trace.sandbox_events][-1] == "deleted"

    saved = trajectory.read_text()
    assert json.loads(saved)["info"]["exit_status"] == "Submitted"
    assert "sk-do-not-leak" not in saved and "sk-do-not-leak" not in json.dumps(result)


@needs_root
def test_a_nested_command_argument_is_a_format_error_the_model_sees(
        orchestrator: str, tok: Any, tmp_path: Path) -> None:
    """A small model sometimes wraps the command in a second object: the rollout goes on with
    a format error, as for any other malformed call, instead of failing in the harness."""
    nested = [ToolCall("bash", {"command": {"command": "ls"}})]
    script = [Reply(None, nested),
              Reply(None, bash("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && echo fixed"))]
    with TeacherServer(ScriptedPolicy(script), tok) as teacher:
        result = run_task("Say fixed.", orchestrator_url=orchestrator,
                          model_base_url=f"{teacher.url}/v1", model_name="teacher",
                          image="host")
    assert result["exit_status"] == "Submitted" and result["submission"] == "fixed\n"
    errors = [m for m in result["messages"]
              if m.get("extra", {}).get("interrupt_type") == "FormatError"]
    assert len(errors) == 1
    assert "'command' argument must be a string" in errors[0]["content"]
    assert '{"command": "ls"}' in errors[0]["content"]  # the model is shown what it sent


# --- the environment alone ----------------------------------------------------------------------

@pytest.fixture()
def env(orchestrator: str) -> Iterator[OrchardEnvironment]:
    with OrchardEnvironment(base_url=orchestrator, image="host", timeout=20,
                            env={"GREETING": "hello"}, session="unit-1",
                            labels={"suite": "minisweagent"}) as environment:
        yield environment


@needs_root
def test_merged_output_and_nonzero_exit(env: OrchardEnvironment, http: httpx.Client) -> None:
    out = env.execute({"command": "echo one; echo two >&2; echo three; exit 3"})
    assert out == {"output": "one\ntwo\nthree\n", "returncode": 3, "exception_info": ""}
    out = env.execute({"command": 'pwd; echo "$GREETING"; echo $0'})
    assert out["output"] == "/workspace\nhello\nbash\n" and out["returncode"] == 0
    assert env.execute({"command": "pwd"}, cwd="/tmp")["output"] == "/tmp\n"
    info = http.get(f"/sandboxes/{env.sandbox_id}").json()
    assert info["labels"] == {"suite": "minisweagent"} and info["session"] == "unit-1"
    assert info["block_network"] is True


@needs_root
def test_timeout_is_returncode_minus_one_and_keeps_output(env: OrchardEnvironment) -> None:
    t0 = time.monotonic()
    out = env.execute({"command": "echo started; sleep 30; echo never"}, timeout=1)
    assert time.monotonic() - t0 < 15
    assert out["returncode"] == -1 and out["output"] == "started\n"
    assert "timed out after 1 seconds and was killed" in out["exception_info"]
    assert env.execute({"command": "echo still usable"})["output"] == "still usable\n"


@needs_root
def test_submission_is_detected_as_upstream_does(env: OrchardEnvironment) -> None:
    with pytest.raises(Submitted) as caught:
        env.execute({"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; echo the patch"})
    assert caught.value.messages == ({
        "role": "exit", "content": "the patch\n",
        "extra": {"exit_status": "Submitted", "submission": "the patch\n"}},)
    # Not a submission: a failing command, or the marker anywhere but the first line.
    out = env.execute({"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; exit 1"})
    assert out["returncode"] == 1
    out = env.execute({"command": "echo x; echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})
    assert out["returncode"] == 0
    # run_command (for set-up and evaluation) never submits.
    assert env.run_command("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")["returncode"] == 0


@needs_root
def test_template_vars_and_serialize(env: OrchardEnvironment) -> None:
    tv = env.get_template_vars(extra="x")
    uname = env.execute({"command": "uname -r; uname -m"})["output"].split()
    assert (tv["system"], tv["release"], tv["machine"]) == ("Linux", *uname)
    assert tv["cwd"] == "/workspace" and tv["extra"] == "x" and tv["sandbox_id"] == env.sandbox_id
    data = env.serialize()["info"]
    assert (data["config"]["environment_type"]
            == "orchard.domains.swe.minisweagent.OrchardEnvironment")
    assert data["sandbox_id"] == env.sandbox_id
    assert "api_key" not in data["config"]["environment"] and "api_key" not in tv


@needs_root
def test_created_sandbox_is_deleted_attached_one_is_not(orchestrator: str,
                                                       http: httpx.Client) -> None:
    created = OrchardEnvironment(base_url=orchestrator)
    assert created.created and sandbox_exists(http, created.sandbox_id)
    created.close()
    created.close()  # idempotent
    assert not sandbox_exists(http, created.sandbox_id)

    sid = create_ready(http, {"image": "host"})
    try:
        with OrchardEnvironment(base_url=orchestrator, sandbox_id=sid) as attached:
            assert not attached.created
            assert attached.execute({"command": "echo hi > /workspace/f"})["returncode"] == 0
        assert sandbox_exists(http, sid)
        with OrchardEnvironment(base_url=orchestrator, sandbox_id=sid) as again:
            assert again.execute({"command": "cat /workspace/f"})["output"] == "hi\n"
    finally:
        http.delete(f"/sandboxes/{sid}")


@needs_root
def test_unknown_sandbox_id_is_a_clear_error(orchestrator: str) -> None:
    with pytest.raises(SandboxUnavailable) as caught:
        OrchardEnvironment(base_url=orchestrator, sandbox_id="sb-000000000000")
    message = str(caught.value)
    assert "no sandbox 'sb-000000000000'" in message and "orchard sandbox ls" in message


def test_unreachable_orchestrator_is_a_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(SandboxUnavailable, match="cannot reach the Orchard orchestrator at "
                                                 + dead.replace(".", r"\.")):
        OrchardEnvironment(base_url=dead)


def test_bad_session_id_is_rejected_before_anything_starts() -> None:
    with pytest.raises(ValueError, match="session id 'a b'"):
        OrchardEnvironment(base_url="http://127.0.0.1:9", session="a b")


@needs_root
def test_dead_sandbox_and_bad_cwd_become_exception_info(env: OrchardEnvironment,
                                                        http: httpx.Client) -> None:
    out = env.execute({"command": "true"}, cwd="/no/such/dir")
    assert out["returncode"] == -1 and out["output"] == ""
    assert "rejected" in out["exception_info"] and "/no/such/dir" in out["exception_info"]
    assert http.delete(f"/sandboxes/{env.sandbox_id}").status_code == 200
    out = env.execute({"command": "echo hi"})
    assert out["returncode"] == -1 and out["output"] == ""
    assert f"sandbox {env.sandbox_id} no longer exists" in out["exception_info"]
    assert out["extra"]["exception_type"] == "NotFoundError"


# --- the command line -------------------------------------------------------------------------

def cli_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("ORCHARD_URL", "ORCHARD_API_KEY", "ORCHARD_API_KEYS", "OPENAI_API_KEY")}
    return {**env, "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "1",
            "MSWEA_GLOBAL_CONFIG_DIR": str(tmp_path / "mswea"), **extra}


@needs_root
def test_cli_runs_a_task(orchestrator: str, http: httpx.Client, tok: Any,
                         tmp_path: Path) -> None:
    session = f"cli-{uuid.uuid4().hex[:8]}"
    script = [Reply("Writing it.", bash("printf 'hi\\n' > hello.txt && cat hello.txt")),
              Reply(None, bash("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat hello.txt"))]
    task = tmp_path / "task.md"
    task.write_text("Create hello.txt saying hi.")
    with teacher_behind_proxy(ScriptedPolicy(script), tok, tmp_path / "store") as proxy:
        r = subprocess.run(
            [str(ORCHARD), "rollout", "mini-swe-agent", "--task-file", str(task),
             "--image", "host", "--model-url", f"{proxy}/v1", "--model", "teacher",
             "--orchestrator", orchestrator, "--session", session, "--eval", "cat hello.txt",
             "--output", str(tmp_path / "out.json"), "-c", "agent.step_limit=5"],
            capture_output=True, text=True, timeout=120, env=cli_env(tmp_path))
        assert r.returncode == 0, r.stderr
        # The plain /v1 URL plus --session: the proxy files the calls by the header.
        calls = httpx.get(f"{proxy}/sessions/{session}", headers=ADMIN).json()["calls"]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["exit_status"] == "Submitted" and summary["submission"] == "hi\n"
    assert summary["n_steps"] == len(calls) == 2
    assert summary["eval"]["output"] == "hi\n" and summary["session"] == session
    full = json.loads((tmp_path / "out.json").read_text())
    assert full["messages"][-1]["role"] == "exit" and full["sandbox_id"] == summary["sandbox_id"]
    assert all(c["tokens"]["completion_ids"] for c in calls)
    assert not sandbox_exists(http, summary["sandbox_id"])


@needs_root
def test_cli_starts_an_embedded_orchestrator_without_one(tok: Any, tmp_path: Path) -> None:
    script = [Reply(None, bash("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && uname -s"))]
    with TeacherServer(ScriptedPolicy(script), tok) as teacher:
        r = subprocess.run(
            [str(ORCHARD), "rollout", "mini-swe-agent", "--task", "Name the kernel.",
             "--image", "host", "--model-url", f"{teacher.url}/v1", "--model", "teacher"],
            capture_output=True, text=True, timeout=180, env=cli_env(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "starting an embedded orchestrator" in r.stderr
    # stdout is the result alone: no banner or log line from mini-swe-agent or litellm.
    summary = json.loads(r.stdout)
    assert summary["exit_status"] == "Submitted" and summary["submission"] == "Linux\n"


def test_cli_needs_exactly_one_task(tmp_path: Path) -> None:
    r = subprocess.run([str(ORCHARD), "rollout", "mini-swe-agent", "--image", "host",
                        "--model-url", "http://127.0.0.1:9/v1", "--model", "m"],
                       capture_output=True, text=True, timeout=60, env=cli_env(tmp_path))
    assert r.returncode == 2 and "exactly one of --task and --task-file" in r.stderr
