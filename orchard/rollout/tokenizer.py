"""Tokenizers for rollouts: loading one, and the small offline ChatML tokenizer used by tests.

The test tokenizer is a real byte-level BPE (the kind Qwen, SmolLM2 and GPT-2 use) trained on a
fixed handful of Python standard-library files, so tests and the CPU demo exercise genuine
tokenisation, special tokens and a Jinja chat template with tools, without any download.
Regenerate the committed files with
`python -m orchard.rollout.tokenizer orchard/rollout/data/tokenizer`.
"""

from __future__ import annotations

import functools
import json
import sys
import sysconfig
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ENDOFTEXT = "<|endoftext|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]

# Files present in every CPython from 3.11 on. Their text differs a little between versions, so
# the committed tokenizer (not a regenerated one) is the reference the tests pin.
CORPUS_FILES = [
    "LICENSE.txt", "argparse.py", "textwrap.py", "difflib.py", "shlex.py", "string.py",
    "heapq.py", "bisect.py", "calendar.py", "fractions.py", "csv.py",
    "json/__init__.py", "json/decoder.py", "json/encoder.py",
]

# Chat-shaped text, so role names, tool-call markup and plain English get merges of their own.
SEED_TEXT = """\
system
user
assistant
tool
You are a helpful assistant. Answer the question, then stop.
What is the weather like in Paris today? It is sunny and 21 degrees.
Please read the file and tell me what the function does.
I will call a tool to find out. The result is below.
<tools>
{"type": "function", "function": {"name": "get_weather", "description": "Get the weather",
"parameters": {"type": "object", "properties": {"city": {"type": "string"}},
"required": ["city"]}}}
</tools>
<tool_call>
{"name": "get_weather", "arguments": {"city": "Paris"}}
</tool_call>
<tool_response>
{"temperature": 21, "unit": "celsius"}
</tool_response>
"""

# ChatML, with tools the way Qwen2.5/Qwen3 and SmolLM3 render them: tool signatures in the
# system turn, calls as <tool_call> JSON in the assistant turn, results as <tool_response> in a
# user turn. Arguments sent back as a JSON string (the OpenAI wire format) render verbatim, so
# re-rendering a conversation reproduces the model's own tokens.
CHAT_TEMPLATE = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n\
You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and \
arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n\
{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant' }}
{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
{%- for tool_call in message.tool_calls or [] %}
{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '\\n<tool_call>\\n{\"name\": \"' + tool_call.name + '\", \"arguments\": ' }}
{%- if tool_call.arguments is string %}{{- tool_call.arguments }}
{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}
{{- '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
{{- '<|im_start|>user' }}
{%- endif %}
{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""

# The small offline tokenizer above, shipped with the package (tests, demos, the teacher).
TEST_TOKENIZER = Path(__file__).parent / "data" / "tokenizer"


def load_tokenizer(path_or_name: str | Path) -> PreTrainedTokenizerFast:
    """A fast tokenizer from a directory (e.g. :data:`TEST_TOKENIZER`) or a Hugging Face name."""
    tokenizer = AutoTokenizer.from_pretrained(str(path_or_name))
    if not isinstance(tokenizer, PreTrainedTokenizerFast):
        raise TypeError(f"{path_or_name} has no fast (tokenizers-backed) tokenizer; "
                        f"got {type(tokenizer).__name__}")
    return tokenizer


def template_messages(messages: list[dict[str, Any]],
                      tokenizer: PreTrainedTokenizerBase) -> list[dict[str, Any]]:
    """``messages`` as ``tokenizer``'s chat template must get them. The OpenAI wire carries a
    tool call's ``arguments`` as a JSON string. A template that writes a string as it is (Qwen3's,
    ours) gets it unchanged, so the model reads back exactly the characters it wrote. One that
    writes ``arguments | tojson`` whatever they are (Qwen2.5's) would encode the string a second
    time, so it gets a dict. Arguments that are not a JSON object stay as they are."""
    if not _encodes_strings_twice(tokenizer.chat_template or ""):
        return messages
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if calls:
            m = {**m, "tool_calls": [_decoded(c) for c in calls]}
        out.append(m)
    return out


_PROBE_ARGS = json.dumps({"probe": 1})


@functools.lru_cache(maxsize=32)
def _encodes_strings_twice(template: str) -> bool:
    """Whether ``template`` turns a string of arguments into a JSON string literal."""
    from transformers.utils.chat_template_utils import render_jinja_template

    probe = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "p", "type": "function", "function": {"name": "f", "arguments": _PROBE_ARGS}}]}]
    try:
        rendered, _ = render_jinja_template([probe], chat_template=template)
    except Exception:  # a template that cannot render the probe is left to fail on its own
        return False
    return json.dumps(_PROBE_ARGS) in rendered[0]


def _decoded(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function")
    args = function.get("arguments") if isinstance(function, dict) else None
    if not isinstance(args, str):
        return call
    try:
        value = json.loads(args)
    except ValueError:
        return call
    return {**call, "function": {**function, "arguments": value}} if isinstance(value, dict) \
        else call


def apply_template(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]],
                   tools: list[dict[str, Any]] | None, *, generation_prompt: bool,
                   tokenize: bool = False) -> Any:
    """The tokenizer's chat template over ``messages`` (see ``template_messages``): the text,
    or with ``tokenize`` the token ids. Everything that renders chat goes through here, so the
    proxy, the teacher and SFT agree on what the model read."""
    kwargs: dict[str, Any] = {"return_dict": False} if tokenize else {}
    return tokenizer.apply_chat_template(template_messages(messages, tokenizer), tools=tools,
                                         tokenize=tokenize,
                                         add_generation_prompt=generation_prompt, **kwargs)


def _corpus() -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [SEED_TEXT] + [(stdlib / name).read_text(encoding="utf-8") for name in CORPUS_FILES]


def build_test_tokenizer(out_dir: str | Path, vocab_size: int = 3072) -> PreTrainedTokenizerFast:
    """Train the test tokenizer and save it to `out_dir`; the same Python gives the same files."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(), trainer=trainer)
    # ChatML models stop on <|im_end|>, so it is the EOS token, as in Qwen's instruct models.
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=IM_END, pad_token=ENDOFTEXT,
        additional_special_tokens=[IM_START], chat_template=CHAT_TEMPLATE,
        model_max_length=32768)
    tokenizer.save_pretrained(str(out_dir))
    return tokenizer


@functools.cache
def _byte_decoder() -> dict[str, int]:
    from tokenizers import pre_tokenizers

    # GPT-2's byte-to-unicode table: printable bytes map to themselves, the rest to 256 + n.
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    assert set(chars.values()) == set(pre_tokenizers.ByteLevel.alphabet())
    return {c: b for b, c in chars.items()}


def token_bytes(tokenizer: PreTrainedTokenizerFast, token_id: int) -> bytes:
    """The exact bytes a token stands for, even a partial UTF-8 character of a byte-level BPE."""
    piece = tokenizer.convert_ids_to_tokens(token_id)
    table = _byte_decoder()
    if token_id in tokenizer.all_special_ids or not all(c in table for c in piece):
        return tokenizer.decode([token_id]).encode()
    return bytes(table[c] for c in piece)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m orchard.rollout.tokenizer OUT_DIR")
    build_test_tokenizer(sys.argv[1])
