"""Token-exact chat through a plain completions endpoint: the proxy renders the prompt itself.

Some servers return no token ids for chat (llama.cpp's, most hosted ones) but take a prompt as
token ids on ``/v1/completions`` and say which tokens they generated (vLLM and SGLang with
``return_token_ids``, llama.cpp's ``/completion``). With ``orchard proxy --render-with DIR``
a chat request is rendered here with the model's own chat template, sent as token ids, and the
completion is turned back into a chat answer; so the recorded prompt ids are exactly what the
model read, whatever the server's own chat rendering would have been.

What this costs: the answer is not streamed token by token (a streaming client gets it as one
chunk, then ``[DONE]``), and tool calls are read back from the text in the Hermes/Qwen form
(``<tool_call>{"name": ..., "arguments": ...}</tool_call>``), the form of the templates this is
meant for. One choice per request (``n`` must be 1).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

from orchard.rollout.tokenizer import apply_template, load_tokenizer

# Sampling parameters with the same meaning on both endpoints.
_PASSED = ("model", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "presence_penalty",
           "frequency_penalty", "repetition_penalty", "stop_token_ids", "ignore_eos")
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


class RenderError(ValueError):
    """A request or an upstream answer the renderer cannot handle; says what and why."""


class ChatRenderer:
    def __init__(self, tokenizer: str | Path) -> None:
        self.tok = load_tokenizer(tokenizer)
        if not self.tok.chat_template:
            raise RenderError(f"tokenizer {tokenizer} has no chat template to render with")

    def prompt_ids(self, chat: dict[str, Any]) -> list[int]:
        messages = chat.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RenderError("'messages' must be a non-empty list")
        text = apply_template(self.tok, messages, chat.get("tools"), generation_prompt=True)
        return list(self.tok.encode(text, add_special_tokens=False))

    def completion_request(self, chat: dict[str, Any]) -> tuple[dict[str, Any], list[int]]:
        """The /v1/completions body for a chat request, and the prompt ids it carries."""
        if chat.get("n", 1) != 1:
            raise RenderError("only n=1 is supported when the proxy renders prompts")
        prompt = self.prompt_ids(chat)
        body: dict[str, Any] = {k: chat[k] for k in _PASSED if k in chat}
        max_tokens = chat.get("max_completion_tokens") or chat.get("max_tokens")
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        body.update(prompt=prompt, logprobs=1, return_token_ids=True, stream=False)
        return body, prompt

    def chat_response(self, chat: dict[str, Any], completion: dict[str, Any],
                      prompt: list[int]) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The chat answer for a completions answer, and the call's exact tokens (None when
        the upstream did not say which tokens it generated)."""
        try:
            choice = completion["choices"][0]
            text = choice["text"]
        except (KeyError, IndexError, TypeError):
            raise RenderError("the upstream's /v1/completions answer has no choices[0].text"
                              ) from None
        content, calls = parse_tool_calls(text)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        ids = choice.get("token_ids")
        values = (choice.get("logprobs") or {}).get("token_logprobs")
        out_choice: dict[str, Any] = {
            "index": 0, "message": message, "logprobs": None,
            "finish_reason": "tool_calls" if calls and choice.get("finish_reason") == "stop"
            else choice.get("finish_reason")}
        if chat.get("logprobs") and ids is not None and values is not None:
            out_choice["logprobs"] = {"content": [
                {"token": self.tok.decode([t]), "logprob": lp} for t, lp in zip(ids, values,
                                                                                 strict=False)]}
        response: dict[str, Any] = {
            "id": completion.get("id") or f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion", "created": completion.get("created", int(time.time())),
            "model": completion.get("model", chat.get("model")), "choices": [out_choice],
            "usage": completion.get("usage")}
        if chat.get("return_token_ids"):
            response["prompt_token_ids"] = prompt
            out_choice["token_ids"] = ids
        upstream_prompt = choice.get("prompt_token_ids") or completion.get("prompt_token_ids")
        if upstream_prompt is not None and upstream_prompt != prompt:
            raise RenderError("the upstream reports other prompt tokens than the ones sent; "
                              "is it serving the model whose tokenizer --render-with names?")
        if ids is None:
            return response, None
        return response, {"prompt_ids": prompt, "completion_ids": ids,
                          "completion_logprobs": values if values is not None
                          and len(values) == len(ids) else None}


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """Content and OpenAI-shaped tool calls from an assistant turn in the Hermes/Qwen form; a
    block that is not a JSON call with a name stays in the content, as the model wrote it."""
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    last = 0
    for match in _TOOL_CALL.finditer(text):
        try:
            call = json.loads(match.group(1))
            name, arguments = call["name"], call.get("arguments", {})
        except (ValueError, KeyError, TypeError):
            continue
        kept.append(text[last:match.start()])
        last = match.end()
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": name, "arguments": arguments
                                   if isinstance(arguments, str) else json.dumps(arguments)}})
    kept.append(text[last:])
    content = "".join(kept).strip()
    return content or None, calls


def chat_stream(response: dict[str, Any]) -> bytes:
    """A whole chat answer as an SSE stream: one chunk with the message, then [DONE]."""
    choice = response["choices"][0]
    delta: dict[str, Any] = {"role": "assistant", "content": choice["message"]["content"]}
    if "tool_calls" in choice["message"]:
        delta["tool_calls"] = [{"index": i, **tc}
                               for i, tc in enumerate(choice["message"]["tool_calls"])]
    chunk = {"id": response["id"], "object": "chat.completion.chunk",
             "created": response["created"], "model": response["model"],
             "choices": [{"index": 0, "delta": delta, "logprobs": choice["logprobs"],
                          "finish_reason": choice["finish_reason"]}]}
    if "prompt_token_ids" in response:
        chunk["prompt_token_ids"] = response["prompt_token_ids"]
        chunk["choices"][0]["token_ids"] = choice.get("token_ids")
    if response.get("usage"):
        chunk["usage"] = response["usage"]
    return b"data: " + json.dumps(chunk).encode() + b"\n\ndata: [DONE]\n\n"
