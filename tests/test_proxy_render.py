"""The proxy rendering chat prompts itself (`--render-with`): chat requests go upstream as
token-id prompts to /v1/completions, and come back as chat answers with tool calls; the
recorded prompt is exactly the chat template's tokens, so the session stays token-exact."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from orchard.rollout.proxy.app import ProxySettings, create_proxy_app
from orchard.rollout.proxy.render import ChatRenderer, parse_tool_calls
from orchard.rollout.tokenizer import TEST_TOKENIZER, load_tokenizer
from orchard.rollout.traces.samples import build_samples
from orchard.serving import ThreadedServer
from orchard.testing.teacher import Reply, ScriptedPolicy, TeacherServer, ToolCall

ADMIN_KEY = "proxy-admin-key"  # reading the proxy's sessions takes it
ADMIN = {"X-API-Key": ADMIN_KEY}
TOKENIZER = TEST_TOKENIZER
TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                   "required": ["command"]}}}]
SCRIPT = [Reply(content="Let me look.", tool_calls=[ToolCall("bash", {"command": "ls -l"})]),
          Reply(tool_calls=[ToolCall("bash", {"command": "cat notes.txt"})]),
          Reply(content="Done: the notes say hello.")]


@pytest.fixture(scope="module")
def tok():  # noqa: ANN201 - a transformers tokenizer
    return load_tokenizer(TOKENIZER)


@pytest.fixture()
def rendering(tok, tmp_path: Path) -> Iterator[tuple[TeacherServer, str]]:  # noqa: ANN001
    """(the teacher, the URL of a proxy that renders prompts with the same tokenizer)."""
    with TeacherServer(ScriptedPolicy(SCRIPT), tok) as teacher:
        proxy = ThreadedServer(create_proxy_app(ProxySettings(
            upstreams=[teacher.url], store=tmp_path / "store", render_with=TOKENIZER,
            admin_key=ADMIN_KEY)), "proxy")
        proxy.start()
        try:
            yield teacher, proxy.url or ""
        finally:
            proxy.stop()


def converse(base_url: str, stream: bool) -> list[dict]:
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    messages: list[dict] = [{"role": "system", "content": "You are careful."},
                            {"role": "user", "content": "What do the notes say?"}]
    replies = []
    for _ in SCRIPT:
        if stream:
            chunks = list(client.chat.completions.create(
                model="teacher", messages=messages, tools=TOOLS, stream=True))
            assert len(chunks) == 1  # the whole answer in one chunk (documented)
            delta = chunks[0].choices[0].delta
            message = {"role": "assistant", "content": delta.content}
            if delta.tool_calls:
                message["tool_calls"] = [
                    {"id": tc.id, "type": "function",
                     "function": {"name": tc.function.name, "arguments": tc.function.arguments}}
                    for tc in delta.tool_calls]
        else:
            answer = client.chat.completions.create(model="teacher", messages=messages,
                                                    tools=TOOLS, logprobs=True)
            message = answer.choices[0].message.model_dump(exclude_none=True)
        replies.append(message)
        messages.append(message)
        for tc in message.get("tool_calls") or []:
            messages.append({"role": "tool", "tool_call_id": tc["id"], "content": "ok"})
    return replies


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_chat_through_rendered_completions_is_token_exact(rendering, tok,  # noqa: ANN001
                                                          stream: bool) -> None:
    teacher, proxy = rendering
    replies = converse(f"{proxy}/s/rendered/v1", stream)
    # The harness sees ordinary chat answers, tool calls parsed back out of the text.
    assert replies[0]["content"] == "Let me look."
    assert [json.loads(tc["function"]["arguments"]) for tc in replies[0]["tool_calls"]] \
        == [{"command": "ls -l"}]
    assert replies[1].get("content") is None
    assert replies[1]["tool_calls"][0]["function"]["name"] == "bash"
    assert replies[2] == {"role": "assistant", "content": "Done: the notes say hello."}

    calls = httpx.get(f"{proxy}/sessions/rendered", headers=ADMIN).json()["calls"]
    assert len(calls) == 3
    for call in calls:
        assert call["status"] == 200 and call["endpoint"] == "/v1/chat/completions"
        assert call["rendered"]["endpoint"] == "/v1/completions"
        request = call["request"]
        expected = tok.encode(tok.apply_chat_template(
            request["messages"], tools=request["tools"], add_generation_prompt=True,
            tokenize=False), add_special_tokens=False)
        tokens = call["tokens"]
        assert tokens["prompt_ids"] == expected
        assert len(tokens["completion_logprobs"]) == len(tokens["completion_ids"])
        assert tokens["completion_ids"][-1] == tok.convert_tokens_to_ids("<|im_end|>")
    # Re-rendered by the same template, the conversation continues token for token.
    samples, drifts = build_samples("rendered", calls)
    assert drifts == [] and len(samples) == 1 and samples[0].calls == [0, 1, 2]


def test_upstream_errors_pass_through_and_are_recorded(rendering) -> None:  # noqa: ANN001
    teacher, proxy = rendering
    teacher.fail_next(503, "overloaded, retry")
    r = httpx.post(f"{proxy}/s/failing/v1/chat/completions", json={
        "model": "teacher", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 503 and "overloaded" in r.text
    (call,) = httpx.get(f"{proxy}/sessions/failing", headers=ADMIN).json()["calls"]
    assert call["status"] == 503 and "overloaded" in json.dumps(call["error"])


def test_requests_it_cannot_render_get_a_clear_400(rendering) -> None:  # noqa: ANN001
    _, proxy = rendering
    r = httpx.post(f"{proxy}/s/bad/v1/chat/completions", json={"model": "teacher",
                                                               "messages": []})
    assert r.status_code == 400 and "messages" in r.json()["error"]["message"]
    r = httpx.post(f"{proxy}/s/bad/v1/chat/completions", json={
        "model": "teacher", "n": 2, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and "n=1" in r.json()["error"]["message"]
    # Other endpoints are forwarded as they are.
    assert httpx.get(f"{proxy}/s/bad/v1/models").status_code == 200


def test_parse_tool_calls_keeps_what_is_not_a_call() -> None:
    content, calls = parse_tool_calls(
        'Sure.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
        "\n<tool_call>not json</tool_call>")
    assert content == "Sure.\n\n<tool_call>not json</tool_call>"
    assert [c["function"] for c in calls] == [{"name": "bash",
                                                "arguments": '{"command": "ls"}'}]


def test_upstream_prompt_mismatch_is_an_error() -> None:
    renderer = ChatRenderer(TOKENIZER)
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    body, prompt = renderer.completion_request(chat)
    assert body["prompt"] == prompt and body["return_token_ids"] is True
    completion = {"choices": [{"text": "hello", "token_ids": [5], "prompt_token_ids": [1, 2]}]}
    with pytest.raises(ValueError, match="other prompt tokens"):
        renderer.chat_response(chat, completion, prompt)
