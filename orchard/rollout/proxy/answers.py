"""What a recorded call keeps of the upstream's answer: a streamed answer assembled into the one
response the plain endpoint would have given, and the call's exact tokens when the upstream
returned them."""

from __future__ import annotations

import json
from typing import Any


def assemble_stream(raw: bytes) -> dict[str, Any]:
    """One response object from an SSE stream of chunks (chat or completions), as the
    non-streaming endpoint would have answered: deltas joined, tool-call arguments joined by
    index, token ids and log-probs concatenated."""
    out: dict[str, Any] = {"choices": []}
    choices: dict[int, dict[str, Any]] = {}
    for line in raw.decode(errors="replace").splitlines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]" or not data:
            continue
        try:
            chunk = json.loads(data)
        except ValueError:
            continue
        for key in ("id", "model", "created", "usage", "prompt_token_ids"):
            if chunk.get(key) is not None:
                out[key] = chunk[key]
        for c in chunk.get("choices") or []:
            _merge_choice(choices.setdefault(c.get("index", 0), {"index": c.get("index", 0)}),
                          c)
    out["choices"] = [choices[i] for i in sorted(choices)]
    return out


def _merge_choice(acc: dict[str, Any], c: dict[str, Any]) -> None:
    if c.get("finish_reason") is not None:
        acc["finish_reason"] = c["finish_reason"]
    if c.get("token_ids"):
        acc.setdefault("token_ids", []).extend(c["token_ids"])
    if "text" in c:  # /v1/completions
        acc["text"] = acc.get("text", "") + (c["text"] or "")
    logprobs = c.get("logprobs")
    if logprobs:
        merged = acc.setdefault("logprobs", {})
        for key, value in logprobs.items():
            if isinstance(value, list):
                merged.setdefault(key, []).extend(value)
    delta = c.get("delta")
    if delta is None:
        return
    message = acc.setdefault("message", {"role": "assistant", "content": None})
    if delta.get("content"):
        message["content"] = (message["content"] or "") + delta["content"]
    for tc in delta.get("tool_calls") or []:
        calls = message.setdefault("tool_calls", [])
        while len(calls) <= tc.get("index", 0):
            calls.append({"id": None, "type": "function",
                          "function": {"name": "", "arguments": ""}})
        slot = calls[tc.get("index", 0)]
        if tc.get("id"):
            slot["id"] = tc["id"]
        fn = tc.get("function") or {}
        slot["function"]["name"] += fn.get("name") or ""
        slot["function"]["arguments"] += fn.get("arguments") or ""


def token_view(call: dict[str, Any]) -> dict[str, Any] | None:
    """The exact tokens of a call, when the upstream returned them (vLLM's
    ``return_token_ids`` and log-probs): prompt ids, completion ids, completion log-probs."""
    response = call.get("response")
    if not isinstance(response, dict) or not response.get("choices"):
        return None
    choice = response["choices"][0]
    prompt = response.get("prompt_token_ids") or choice.get("prompt_token_ids")
    completion = choice.get("token_ids")
    if not prompt or completion is None:
        return None
    logprobs = choice.get("logprobs") or {}
    if "content" in logprobs:  # chat format: one entry per token
        values = [t.get("logprob") for t in logprobs["content"] or []]
    else:  # completions format
        values = logprobs.get("token_logprobs") or []
    return {"prompt_ids": prompt, "completion_ids": completion,
            "completion_logprobs": values if len(values) == len(completion) else None}
