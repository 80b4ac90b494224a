"""The tool-calling loop that the browser agent and the assistant share.

Ask the model (OpenAI chat completions with tools), do the one tool call it answers with, add
the result to the conversation, repeat until it calls ``finish`` or the step budget is spent.
What a call does is the caller's ``act``; the loop handles the model's side: a reply without a
tool call, arguments that are not JSON, a tool that does not exist, a context that is full.

    result = run_tool_loop(f"{proxy}/s/{session}/v1", "policy", messages, tools, act)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from orchard.rollout.seeds import call_seed

FINISH_TOOL = {"type": "function", "function": {
    "name": "finish", "description": "End the task.",
    "parameters": {"type": "object", "properties": {
        "answer": {"type": "string", "description": "The answer, if the goal asks for one."}}}}}
# How OpenAI, vLLM and the policy server say a prompt is longer than the model reads.
CONTEXT_FULL = "maximum context length"


class ToolRefused(Exception):
    """A call the tool could not do; the message is the model's to read and fix."""


@dataclass
class ToolLoopResult:
    exit_status: str  # "Submitted" (finish was called) or "LimitsExceeded"
    answer: str | None = None
    n_steps: int = 0
    n_tokens: int = 0
    messages: list[dict[str, Any]] = field(default_factory=list)


# act(call, name, arguments) -> the messages that answer the call: its tool message first.
Act = Callable[[dict[str, Any], str, dict[str, Any]], list[dict[str, Any]]]


def tool_reply(call: dict[str, Any], content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call["id"], "content": content}


def ask_model(client: httpx.Client, model_url: str, request: dict[str, Any],
              result: ToolLoopResult, seed: int | None) -> dict[str, Any] | None:
    """One chat completion for the loop: counted in ``result`` and added to its messages.
    None when the conversation outgrew the model's context (a limit, like the steps)."""
    if seed is not None:
        request["seed"] = call_seed(seed, result.n_steps)
    reply = client.post(f"{model_url.rstrip('/')}/chat/completions", json=request)
    if reply.status_code == 400 and CONTEXT_FULL in reply.text:
        return None
    reply.raise_for_status()
    body = reply.json()
    result.n_steps += 1
    result.n_tokens += int((body.get("usage") or {}).get("total_tokens") or 0)
    message: dict[str, Any] = body["choices"][0]["message"]
    result.messages.append({k: v for k, v in message.items() if v is not None})
    return message


def run_tool_loop(model_url: str, model: str, messages: list[dict[str, Any]],
                  tools: list[dict[str, Any]], act: Act, *, max_steps: int = 20,
                  http: httpx.Client | None = None, seed: int | None = None) -> ToolLoopResult:
    """Run the loop (see the module doc) on ``messages``, which it extends in place.

    ``tools`` are OpenAI tool specs; ``finish`` is added. ``act(call, name, args)`` does one
    call and returns the messages that answer it (a ``tool_reply`` first); it raises
    ToolRefused for a call the model should fix. ``seed`` (a rollout's, see
    ``orchard.rollout.seeds``): call i sends the request seed ``call_seed(seed, i)``."""
    names = {t["function"]["name"] for t in tools}
    client = http or httpx.Client(timeout=300)
    result = ToolLoopResult(exit_status="LimitsExceeded", messages=messages)
    try:
        while result.n_steps < max_steps:
            message = ask_model(client, model_url, {
                "model": model, "messages": messages, "tools": [*tools, FINISH_TOOL]},
                result, seed)
            if message is None:
                return result
            calls = message.get("tool_calls") or []
            if not calls:
                messages.append({"role": "user", "content": "Answer with one tool call: "
                                 f"one of {sorted(names)} or 'finish'."})
                continue
            call = calls[0]
            name = call["function"]["name"]
            try:
                args = json.loads(call["function"]["arguments"] or "{}")
            except json.JSONDecodeError as e:
                messages.append(tool_reply(call, f"The arguments are not JSON ({e}); "
                                                 "try again."))
                continue
            if name == "finish":
                result.exit_status = "Submitted"
                result.answer = args.get("answer") if isinstance(args, dict) else None
                return result
            if name not in names or not isinstance(args, dict):
                messages.append(tool_reply(call, f"Use one of the tools {sorted(names)} or "
                                                 "'finish', with a JSON object of arguments."))
                continue
            try:
                messages.extend(act(call, name, args))
            except ToolRefused as e:
                messages.append(tool_reply(call, str(e)))
        return result
    finally:
        if http is None:
            client.close()
