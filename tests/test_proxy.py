"""The recording proxy in front of the scripted teacher, both over real HTTP with the real
OpenAI client: byte-exact passthrough, recording, token-exact samples, drift, errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from orchard.rollout.proxy import ProxySettings, create_proxy_app
from orchard.rollout.samples import build_samples
from orchard.rollout.teacher import Reply, ScriptedPolicy, TeacherServer, ToolCall
from orchard.rollout.tokenizer import load_tokenizer
from orchard.serving import ThreadedServer

TOKENIZER = Path(__file__).parent / "data" / "tokenizer"
TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                   "required": ["command"]}}}]
SCRIPT = [Reply(tool_calls=[ToolCall("bash", {"command": "ls"})]),
          Reply(content="I see the files."),
          Reply(content="Done.")]
EXTRA = {"return_token_ids": True, "logprobs": True}


@pytest.fixture(scope="module")
def tok():  # noqa: ANN201 - a transformers tokenizer
    return load_tokenizer(TOKENIZER)


@pytest.fixture(params=[False, True], ids=["continuous", "drift"])
def stack(request: pytest.FixtureRequest, tok, tmp_path: Path) -> Iterator[tuple[str, str, Path]]:
    """(teacher URL, proxy URL, store dir)."""
    with TeacherServer(ScriptedPolicy(SCRIPT), tok, drift=request.param) as teacher:
        proxy = ThreadedServer(create_proxy_app(ProxySettings(
            upstreams=[teacher.url], store=tmp_path / "store")), "proxy")
        proxy.start()
        try:
            yield teacher.url, proxy.url or "", tmp_path / "store"
        finally:
            proxy.stop()


def converse(base_url: str, stream: bool = False) -> list[dict]:
    """Three turns through the OpenAI client, sending the assistant turns back as a harness
    would; returns the raw responses."""
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    messages: list[dict] = [{"role": "system", "content": "You are careful."},
                            {"role": "user", "content": "List the files, then say done."}]
    out = []
    for turn in range(3):
        if stream:
            chunks = list(client.chat.completions.create(
                model="teacher", messages=messages, tools=TOOLS, stream=True,
                extra_body=EXTRA))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            calls: dict[int, dict] = {}
            for c in chunks:
                for tc in (c.choices[0].delta.tool_calls or []) if c.choices else []:
                    slot = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                    slot["id"] = tc.id or slot["id"]
                    slot["name"] += (tc.function.name or "") if tc.function else ""
                    slot["arguments"] += (tc.function.arguments or "") if tc.function else ""
            message = {"role": "assistant", "content": text or None}
            if calls:
                message["tool_calls"] = [
                    {"id": c["id"], "type": "function",
                     "function": {"name": c["name"], "arguments": c["arguments"]}}
                    for _, c in sorted(calls.items())]
            out.append({"message": message})
        else:
            r = client.chat.completions.create(model="teacher", messages=messages, tools=TOOLS,
                                               extra_body=EXTRA)
            message = r.choices[0].message.model_dump(exclude_none=True)
            out.append(r.model_dump())
        messages.append(message)
        if message.get("tool_calls"):
            messages.append({"role": "tool", "tool_call_id": message["tool_calls"][0]["id"],
                             "content": f"turn {turn}: README.md setup.py"})
        else:
            messages.append({"role": "user", "content": "Go on."})
    return out


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_session_is_recorded_and_becomes_samples(stack: tuple[str, str, Path], tok,
                                                 stream: bool,
                                                 request: pytest.FixtureRequest) -> None:
    _, proxy, _ = stack
    drift = "drift" in request.node.callspec.id
    converse(f"{proxy}/s/run-1.task-7/v1", stream=stream)
    calls = httpx.get(f"{proxy}/sessions/run-1.task-7").json()["calls"]
    assert [c["index"] for c in calls] == [0, 1, 2]
    assert all(c["status"] == 200 and c["endpoint"] == "/v1/chat/completions" for c in calls)
    assert calls[0]["request"]["tools"] == TOOLS  # what the harness sent, as sent
    first = calls[0]["response"]["choices"][0]["message"]
    assert first["tool_calls"][0]["function"]["name"] == "bash"
    assert json.loads(first["tool_calls"][0]["function"]["arguments"]) == {"command": "ls"}
    for c in calls:
        t = c["tokens"]
        assert len(t["completion_logprobs"]) == len(t["completion_ids"])
    for c in calls[:1] if drift else calls:  # a drifting server renders its own history
        t = c["tokens"]
        # The recorded prompt is what the model's tokenizer makes of what the harness sent.
        assert t["prompt_ids"] == tok.apply_chat_template(
            c["request"]["messages"], tools=c["request"]["tools"],
            add_generation_prompt=True, tokenize=True, return_dict=False)
        assert all(lp <= 0 for lp in t["completion_logprobs"])
    body = httpx.get(f"{proxy}/sessions/run-1.task-7/samples").json()
    samples, drifts = build_samples("run-1.task-7", calls)
    assert body["samples"][0]["input_ids"] == samples[0].input_ids
    if drift:  # turn 1 re-rendered turn 0's tool call: never joined, always reported
        assert [s.calls for s in samples] == [[0], [1, 2]]
        assert [d["call"] for d in body["drift"]] == [1]
    else:
        assert len(samples) == 1 and body["drift"] == []
        s = samples[0]
        assert s.input_ids[:len(calls[2]["tokens"]["prompt_ids"])] == \
            calls[2]["tokens"]["prompt_ids"]
        trained = [i for i, m in zip(s.input_ids, s.loss_mask, strict=True) if m]
        assert trained == [i for c in calls for i in c["tokens"]["completion_ids"]]


def test_header_session_and_default(stack: tuple[str, str, Path]) -> None:
    _, proxy, store = stack
    body = {"model": "teacher", "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(f"{proxy}/v1/chat/completions", json=body,
                   headers={"X-Orchard-Session": "by-header"})
    assert r.status_code == 200, r.text
    assert httpx.get(f"{proxy}/sessions/by-header").json()["calls"][0]["status"] == 200
    assert (store / "by-header.jsonl").exists()  # durable: on disk once it can be read
    assert httpx.get(f"{proxy}/sessions").json()["sessions"] == ["by-header"]


def test_upstream_errors_reach_the_harness_unchanged(stack: tuple[str, str, Path]) -> None:
    teacher_url, proxy, _ = stack
    body = {"model": "teacher", "messages": [{"role": "user", "content": "x"}]}
    direct = httpx.post(f"{teacher_url}/v1/chat/completions",
                        json={**body, "model": "no-such-model"})
    proxied = httpx.post(f"{proxy}/s/e/v1/chat/completions",
                         json={**body, "model": "no-such-model"})
    assert proxied.status_code == direct.status_code == 404
    assert proxied.json() == direct.json()
    call = httpx.get(f"{proxy}/sessions/e").json()["calls"][0]
    assert call["status"] == 404 and call["error"] == direct.json()


def test_unreachable_upstream_is_a_502_that_says_so(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    proxy = ThreadedServer(create_proxy_app(ProxySettings(upstreams=[dead],
                                                          store=tmp_path)), "proxy")
    proxy.start()
    try:
        r = httpx.post(f"{proxy.url}/s/x/v1/chat/completions", json={"messages": []})
        assert r.status_code == 502
        assert "unreachable" in r.json()["error"]["message"]
        assert httpx.get(f"{proxy.url}/sessions/x").json()["calls"][0]["status"] == 502
    finally:
        proxy.stop()


def test_bad_input(stack: tuple[str, str, Path]) -> None:
    _, proxy, _ = stack
    r = httpx.post(f"{proxy}/s/..%2Fetc/v1/chat/completions", json={})
    assert r.status_code in (400, 404)
    r = httpx.post(f"{proxy}/s/ok/v1/chat/completions", content=b"{not json",
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not JSON" in r.json()["error"]["message"]
    r = httpx.get(f"{proxy}/sessions/never-seen")
    assert r.status_code == 404 and "GET /sessions" in r.json()["error"]["message"]
