"""The scripted teacher: the OpenAI protocol over real HTTP, with token-exact ids and log-probs."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import openai
import pytest

from orchard.rollout.tokenizer import (
    IM_END,
    IM_START,
    TEST_TOKENIZER,
    build_test_tokenizer,
    load_tokenizer,
    token_bytes,
)
from orchard.testing.teacher import (
    FunctionPolicy,
    Reply,
    ScriptedPolicy,
    TeacherServer,
    ToolCall,
)

TOKENIZER_DIR = TEST_TOKENIZER
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TOKEN_IDS = {"return_token_ids": True}


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(TOKENIZER_DIR)


def client(teacher: TeacherServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{teacher.url}/v1", api_key="unused", max_retries=0)


def prompt_ids(tok, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    return tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                   tokenize=True, return_dict=False)


def sse_events(response: httpx.Response) -> list[dict[str, Any]]:
    """The chunks of an SSE body, checking the framing: `data: ...` events, then [DONE]."""
    events = [e for e in response.text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    return [json.loads(e.removeprefix("data: ")) for e in events[:-1]]


def test_tokenizer_loads_from_tests_data(tok):
    assert sum(f.stat().st_size for f in TOKENIZER_DIR.iterdir()) < 1_000_000
    assert 2000 <= len(tok) <= 4096
    assert tok.eos_token == IM_END
    assert {IM_START, IM_END, "<|endoftext|>"} <= set(tok.all_special_tokens)
    text = "def f(x):\n    return {'naïve': x}  # café ☕"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert b"".join(token_bytes(tok, i) for i in ids) == text.encode()
    rendered = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                       add_generation_prompt=True)
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_build_test_tokenizer_is_deterministic(tmp_path):
    build_test_tokenizer(tmp_path / "a")
    build_test_tokenizer(tmp_path / "b")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert (tmp_path / "a" / "chat_template.jinja").read_bytes() == (
        TOKENIZER_DIR / "chat_template.jinja").read_bytes()


def test_models_endpoint(tok):
    with TeacherServer(ScriptedPolicy([]), tok, model_name="tiny") as teacher:
        assert [m.id for m in client(teacher).models.list()] == ["tiny"]


def test_chat_returns_token_exact_ids_and_logprobs(tok):
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Say hello."}]
    with TeacherServer(ScriptedPolicy(["Hello, world! Café ☕."]), tok) as teacher:
        r = client(teacher).chat.completions.create(
            model="teacher", messages=messages, logprobs=True, top_logprobs=3,
            temperature=0.7, max_tokens=100, extra_body=TOKEN_IDS)
    data = r.model_dump()
    choice = data["choices"][0]
    assert choice["message"]["content"] == "Hello, world! Café ☕."
    assert choice["finish_reason"] == "stop"
    assert data["prompt_token_ids"] == prompt_ids(tok, messages)
    expected = tok.encode("Hello, world! Café ☕.", add_special_tokens=False)
    assert choice["token_ids"] == [*expected, tok.eos_token_id]
    assert data["usage"]["prompt_tokens"] == len(data["prompt_token_ids"])
    assert data["usage"]["completion_tokens"] == len(choice["token_ids"])
    assert data["usage"]["total_tokens"] == data["usage"]["prompt_tokens"] + len(
        choice["token_ids"])
    entries = choice["logprobs"]["content"]
    assert len(entries) == len(choice["token_ids"])
    assert b"".join(bytes(e["bytes"]) for e in entries) == (
        "Hello, world! Café ☕.".encode() + IM_END.encode())
    for e, token_id in zip(entries, choice["token_ids"], strict=True):
        assert e["token"] == tok.decode([token_id])
        assert e["logprob"] <= 0
        assert len(e["top_logprobs"]) == 3
        assert e["top_logprobs"][0]["token"] == e["token"]  # greedy: the chosen is the likeliest
        assert e["top_logprobs"][0]["logprob"] == e["logprob"]
        assert sum(2.718281828 ** t["logprob"] for t in e["top_logprobs"]) <= 1


def test_chat_logprobs_are_deterministic(tok):
    messages = [{"role": "user", "content": "Again?"}]
    with TeacherServer(FunctionPolicy(lambda m, t: "Yes, again."), tok) as teacher:
        answers = [client(teacher).chat.completions.create(
            model="teacher", messages=messages, logprobs=True, top_logprobs=2).model_dump()
            for _ in range(2)]
    lp = [a["choices"][0]["logprobs"] for a in answers]
    assert lp[0] == lp[1]


def test_streaming_chat_matches_non_streaming(tok):
    messages = [{"role": "user", "content": "Stream it."}]
    text = "Streaming naïve café ☕ text, token by token."
    with TeacherServer(FunctionPolicy(lambda m, t: text), tok) as teacher:
        body = {"model": "teacher", "messages": messages, "logprobs": True,
                "return_token_ids": True}
        whole = httpx.post(f"{teacher.url}/v1/chat/completions", json=body).json()
        r = httpx.post(f"{teacher.url}/v1/chat/completions",
                       json={**body, "stream": True, "stream_options": {"include_usage": True}})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    chunks = sse_events(r)
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    assert "".join(c["delta"].get("content") or "" for c in choices) == text
    assert [t for c in choices for t in c.get("token_ids", [])] == whole["choices"][0]["token_ids"]
    assert [e for c in choices if c["logprobs"] for e in c["logprobs"]["content"]] == (
        whole["choices"][0]["logprobs"]["content"])
    assert [c["finish_reason"] for c in choices if c["finish_reason"]] == ["stop"]
    assert choices[-1]["finish_reason"] == "stop"
    assert chunks[-1]["usage"] == whole["usage"]


def test_tool_calls_non_streaming_and_streamed_deltas_agree(tok):
    reply = Reply(content="Let me check.", tool_calls=[
        ToolCall("get_weather", {"city": "Paris"}),
        ToolCall("get_weather", '{"city": "Zürich"}')])
    messages = [{"role": "user", "content": "Weather in Paris and Zürich?"}]
    with TeacherServer(FunctionPolicy(lambda m, t: reply), tok) as teacher:
        c = client(teacher)
        whole = c.chat.completions.create(model="teacher", messages=messages,
                                          tools=[WEATHER_TOOL], extra_body=TOKEN_IDS)
        stream = c.chat.completions.create(model="teacher", messages=messages,
                                           tools=[WEATHER_TOOL], stream=True)
        content, calls, finish = "", {}, None
        for chunk in stream:
            delta = chunk.choices[0].delta
            content += delta.content or ""
            for d in delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                if d.id:
                    assert call["id"] is None, "a call's id is sent once"
                    call.update(id=d.id, name=d.function.name)
                call["arguments"] += d.function.arguments or "" if d.function else ""
            finish = chunk.choices[0].finish_reason or finish
    message = whole.choices[0].message
    assert whole.choices[0].finish_reason == "tool_calls" == finish
    assert message.content == content == "Let me check."
    assert [(t.function.name, t.function.arguments) for t in message.tool_calls] == [
        ("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Zürich"}')]
    assert [(calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)] == [
        (t.function.name, t.function.arguments) for t in message.tool_calls]
    assert all(calls[i]["id"].startswith("call_") for i in calls)
    # The completion is the template's own rendering of the assistant turn.
    text = tok.decode(whole.model_dump()["choices"][0]["token_ids"])
    assert text == ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": '
                    '{"city": "Paris"}}\n</tool_call>\n<tool_call>\n{"name": "get_weather", '
                    '"arguments": {"city": "Zürich"}}\n</tool_call><|im_end|>')


def run_conversation(teacher: TeacherServer, tok, turns: int) -> list[dict[str, Any]]:
    """Play a tool-using conversation through the OpenAI client, sending every assistant
    message back as the client got it; the raw responses, one per turn."""
    c = client(teacher)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You use tools."},
                                      {"role": "user", "content": "Weather in Paris?"}]
    out = []
    for _ in range(turns):
        r = c.chat.completions.create(model="teacher", messages=messages, tools=[WEATHER_TOOL],
                                      extra_body=TOKEN_IDS)
        out.append(r.model_dump())
        message = r.choices[0].message.model_dump(exclude_none=True)
        messages.append(message)
        for call in message.get("tool_calls", []):
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "sunny"})
        if not message.get("tool_calls"):
            messages.append({"role": "user", "content": "And tomorrow?"})
    return out


CONVERSATION = [
    Reply(tool_calls=[ToolCall("get_weather", {"city": "Paris"})]),
    Reply(content="It is sunny in Paris.\n"),
    Reply(content="Checking tomorrow.", tool_calls=[ToolCall("get_weather", {"city": "Paris"})]),
    "Sunny again.",
]


def test_multi_turn_prompts_extend_previous_prompt_and_completion(tok):
    with TeacherServer(ScriptedPolicy(CONVERSATION), tok) as teacher:
        responses = run_conversation(teacher, tok, len(CONVERSATION))
    for before, after in zip(responses, responses[1:], strict=False):
        seen = before["prompt_token_ids"] + before["choices"][0]["token_ids"]
        assert after["prompt_token_ids"][:len(seen)] == seen
        assert len(after["prompt_token_ids"]) > len(seen)


def test_drift_breaks_continuity(tok):
    with TeacherServer(ScriptedPolicy(CONVERSATION), tok, drift=True) as teacher:
        responses = run_conversation(teacher, tok, len(CONVERSATION))
    breaks = []
    for before, after in zip(responses, responses[1:], strict=False):
        seen = before["prompt_token_ids"] + before["choices"][0]["token_ids"]
        breaks.append(after["prompt_token_ids"][:len(seen)] != seen)
    # Every turn is re-rendered differently: compact arguments, stripped content.
    assert breaks == [True, True, True]


def test_injected_errors_reach_the_client_as_openai_errors(tok):
    messages = [{"role": "user", "content": "Hi"}]
    teacher = TeacherServer(ScriptedPolicy(["Hello.", "Again."]), tok,
                            fail_next=[(503, "overloaded")])
    with teacher:
        r = httpx.post(f"{teacher.url}/v1/chat/completions",
                       json={"model": "teacher", "messages": messages})
        assert r.status_code == 503
        assert r.json() == {"error": {"message": "overloaded", "type": "server_error",
                                      "param": None, "code": 503}}
        teacher.fail_next(429, "slow down", times=2)
        for _ in range(2):
            with pytest.raises(openai.RateLimitError) as e:
                client(teacher).chat.completions.create(model="teacher", messages=messages)
            assert e.value.status_code == 429
            assert e.value.body["message"] == "slow down"
        teacher.fail_next(400, {"error": {"message": "custom", "type": "x", "code": "y"}})
        with pytest.raises(openai.BadRequestError) as e:
            client(teacher).chat.completions.create(model="teacher", messages=messages)
        assert e.value.body == {"message": "custom", "type": "x", "code": "y"}
        # Faults come before the policy, so the script has not moved on.
        r = client(teacher).chat.completions.create(model="teacher", messages=messages)
        assert r.choices[0].message.content == "Hello."


def test_exhausted_script_and_bad_requests_are_400(tok):
    messages = [{"role": "user", "content": "Hi"}]
    with TeacherServer(ScriptedPolicy(["Only one."]), tok) as teacher:
        c = client(teacher)
        assert c.chat.completions.create(model="teacher", messages=messages).choices[0]
        with pytest.raises(openai.BadRequestError, match="script exhausted"):
            c.chat.completions.create(model="teacher", messages=messages)
        with pytest.raises(openai.NotFoundError, match="does not exist"):
            c.chat.completions.create(model="gpt-4", messages=messages)
        r = httpx.post(f"{teacher.url}/v1/chat/completions",
                       json={"messages": [{"role": "wizard", "content": "x"}]})
        assert r.status_code == 400
        assert "role must be one of" in r.json()["error"]["message"]


def test_max_tokens_cuts_the_reply(tok):
    with TeacherServer(FunctionPolicy(lambda m, t: "A long answer, cut short."), tok) as teacher:
        r = client(teacher).chat.completions.create(
            model="teacher", messages=[{"role": "user", "content": "Go"}], max_tokens=3,
            extra_body=TOKEN_IDS)
    data = r.model_dump()["choices"][0]
    assert data["finish_reason"] == "length"
    assert len(data["token_ids"]) == 3 == r.usage.completion_tokens
    assert data["message"]["content"] == tok.decode(data["token_ids"])


async def test_scripted_policy_follows_the_script_per_conversation(tok):
    with TeacherServer(ScriptedPolicy(["first", "second"]), tok) as teacher:
        async def conversation(i: int, http: httpx.AsyncClient) -> list[str]:
            messages = [{"role": "user", "content": f"conversation {i}"}]
            said = []
            for _ in range(2):
                r = await http.post(f"{teacher.url}/v1/chat/completions",
                                    json={"model": "teacher", "messages": messages})
                r.raise_for_status()
                said.append(r.json()["choices"][0]["message"]["content"])
                messages += [{"role": "assistant", "content": said[-1]},
                             {"role": "user", "content": "more"}]
            return said

        async with httpx.AsyncClient() as http:
            said = await asyncio.gather(*(conversation(i, http) for i in range(8)))
    assert said == [["first", "second"]] * 8


def test_completions_with_string_and_token_prompts(tok):
    with TeacherServer(FunctionPolicy(lambda m, t: " jumps over the dog."), tok) as teacher:
        c = client(teacher)
        r = c.completions.create(model="teacher", prompt="The quick brown fox", logprobs=2,
                                 extra_body=TOKEN_IDS)
        data = r.model_dump()["choices"][0]
        assert data["text"] == " jumps over the dog."
        assert data["prompt_token_ids"] == tok.encode("The quick brown fox")
        expected = [*tok.encode(" jumps over the dog.", add_special_tokens=False),
                    tok.eos_token_id]
        assert data["token_ids"] == expected
        assert r.usage.completion_tokens == len(expected)
        lp = data["logprobs"]
        assert lp["tokens"] == [tok.decode([t]) for t in expected]
        assert len(lp["token_logprobs"]) == len(expected)
        assert all(x <= 0 for x in lp["token_logprobs"])
        assert all(len(top) == 2 for top in lp["top_logprobs"])
        assert lp["text_offset"][0] == 0
        assert lp["text_offset"] == sorted(lp["text_offset"])

        ids = tok.encode("The quick brown fox")
        by_ids = c.completions.create(model="teacher", prompt=ids, extra_body=TOKEN_IDS)
        assert by_ids.model_dump()["choices"][0]["prompt_token_ids"] == ids
        assert by_ids.model_dump()["choices"][0]["token_ids"] == expected

        r = httpx.post(f"{teacher.url}/v1/completions",
                       json={"model": "teacher", "prompt": "The quick brown fox",
                             "stream": True, "return_token_ids": True})
        chunks = sse_events(r)
        assert "".join(ch["choices"][0]["text"] for ch in chunks) == " jumps over the dog."
        assert [t for ch in chunks for t in ch["choices"][0]["token_ids"]] == expected
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_completions_of_a_rendered_conversation_match_chat(tok):
    """A harness that renders the template itself and sends token ids gets the same tokens."""
    reply = Reply(content="Sure.", tool_calls=[ToolCall("get_weather", {"city": "Oslo"})])
    messages = [{"role": "user", "content": "Weather in Oslo?"}]
    with TeacherServer(FunctionPolicy(lambda m, t: reply), tok) as teacher:
        c = client(teacher)
        chat = c.chat.completions.create(model="teacher", messages=messages,
                                         extra_body=TOKEN_IDS).model_dump()
        done = c.completions.create(model="teacher", prompt=prompt_ids(tok, messages),
                                    extra_body=TOKEN_IDS).model_dump()
    assert done["choices"][0]["token_ids"] == chat["choices"][0]["token_ids"]
    assert done["choices"][0]["finish_reason"] == "tool_calls"
