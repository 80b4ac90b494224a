"""Tool-call arguments reach chat templates in the form each can write once: the OpenAI wire's
JSON string would be encoded twice by a template that writes ``arguments | tojson`` (Qwen2.5's),
so that one gets a dict; one that writes a string as it is (Qwen3's) keeps the string, so the
model reads back exactly what it wrote. The proxy's renderer, the teacher and SFT all render
through ``apply_template``. The two templates under tests/data/chat_templates reproduce those
families' tool-call forms."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchard.recipes.sft import tokenize_conversation
from orchard.rollout.proxy.render import ChatRenderer
from orchard.rollout.tokenizer import TEST_TOKENIZER, apply_template, load_tokenizer

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "Run a command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                   "required": ["command"]}}}]
CALL = {"command": "grep -n \"PORT\" app/config.py"}
MESSAGES = [
    {"role": "system", "content": "You fix bugs."},
    {"role": "user", "content": "PORT in app/config.py is wrong."},
    {"role": "assistant", "content": "Let me look.", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "bash", "arguments": json.dumps(CALL)}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "3:PORT = 17"},
    {"role": "assistant", "content": "Done."},
]
ONCE = '"arguments": ' + json.dumps(CALL) + "}"
TWICE = '"arguments": ' + json.dumps(json.dumps(CALL))


@pytest.fixture(params=["qwen2_5", "qwen3"])
def tokenizer_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    tok = load_tokenizer(TEST_TOKENIZER)
    tok.chat_template = (TEMPLATES / f"{request.param}.jinja").read_text()
    tok.save_pretrained(tmp_path)
    return tmp_path


def test_the_qwen2_5_form_encodes_a_string_twice_unless_given_a_dict() -> None:
    tok = load_tokenizer(TEST_TOKENIZER)
    tok.chat_template = (TEMPLATES / "qwen2_5.jinja").read_text()
    raw = tok.apply_chat_template(MESSAGES, tools=TOOLS, tokenize=False)
    assert TWICE in raw and ONCE not in raw  # the trap is real
    ours = apply_template(tok, MESSAGES, TOOLS, generation_prompt=False)
    assert ONCE in ours and TWICE not in ours
    # The messages themselves are left as they were.
    assert MESSAGES[2]["tool_calls"][0]["function"]["arguments"] == json.dumps(CALL)


def test_every_renderer_writes_the_call_once_encoded(tokenizer_dir: Path) -> None:
    tok = load_tokenizer(tokenizer_dir)
    text = apply_template(tok, MESSAGES, TOOLS, generation_prompt=False)
    assert text.count(ONCE) == 1 and TWICE not in text
    # The proxy's renderer: the prompt it sends as token ids.
    renderer = ChatRenderer(tokenizer_dir)
    prompt = tok.decode(renderer.prompt_ids({"messages": MESSAGES[:4], "tools": TOOLS}))
    assert ONCE in prompt and prompt.endswith("<|im_start|>assistant\n")
    # SFT: the trained turn is the call, once-encoded, ending at the end-of-turn token.
    ids, mask, spans = tokenize_conversation(tok, MESSAGES, TOOLS, [0])
    (start, end), = spans
    trained = tok.decode(ids[start:end])
    assert ONCE in trained and trained.endswith(tok.eos_token)
    assert sum(mask) == end - start


def test_a_template_that_writes_strings_reads_back_the_models_own_characters() -> None:
    compact = [*MESSAGES[:2], {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "bash",
                                                      "arguments": '{"command":"ls"}'}}]}]
    tok = load_tokenizer(TEST_TOKENIZER)
    tok.chat_template = (TEMPLATES / "qwen3.jinja").read_text()
    assert '"arguments": {"command":"ls"}}' in apply_template(tok, compact, TOOLS,
                                                             generation_prompt=False)
    # The tojson template can only write its own spacing, once.
    tok.chat_template = (TEMPLATES / "qwen2_5.jinja").read_text()
    assert '"arguments": {"command": "ls"}}' in apply_template(tok, compact, TOOLS,
                                                              generation_prompt=False)


def test_arguments_that_are_not_a_json_object_stay_as_they_are() -> None:
    tok = load_tokenizer(TEST_TOKENIZER)
    tok.chat_template = (TEMPLATES / "qwen2_5.jinja").read_text()
    broken = [*MESSAGES[:2], {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "bash",
                                                      "arguments": "not json"}}]}]
    assert '"arguments": "not json"}' in apply_template(tok, broken, TOOLS,
                                                      generation_prompt=False)
