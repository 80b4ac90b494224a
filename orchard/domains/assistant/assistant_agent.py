"""A tool-calling assistant: the model sees the user's request and calls tools, one a turn.

The tools are served inside the sandbox by a tool server on ``port`` (the assistant domain's,
``orchard/domains/assistant/services``): ``GET /tools`` lists them with JSON schemas, and
``POST /tools/{name}`` calls one (200 ``{"result": ...}``, 400 ``{"error": ...}``). Each call
goes through the sandbox's service requests, so it is an ``http`` event in the sandbox's log,
and the model calls go through ``model_url`` (the recording proxy): one trace joins both. A
refused call (wrong arguments, an unknown id) is the model's to read, with the tool's schema.

    result = run_assistant(sandbox, goal, f"{proxy}/s/{session}/v1", "policy", port=8200)
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from orchard.env.client import Sandbox
from orchard.rollout.agents.tool_loop import ToolLoopResult, ToolRefused, run_tool_loop, tool_reply

SYSTEM = (
    "You are {name}'s personal assistant. Through tools you read and change their mail, "
    "calendar, contacts, files, notes and todos, and search the web. It is now {now}. Do what "
    "they ask with one tool call per turn, using ids that tools gave you. Call 'finish' when "
    "it is done, with the answer if they asked a question.")


def list_tools(sandbox: Sandbox, port: int) -> list[dict[str, Any]]:
    """The tool server's tools: name, description, inputSchema."""
    answer = sandbox.http(port, "/tools")
    if answer.status != 200:
        raise RuntimeError(f"the tool server on port {port} answered GET /tools with "
                           f"{answer.status}: {answer.body[:300]}")
    return list(answer.json())


def call_tool(sandbox: Sandbox, port: int, name: str, args: dict[str, Any]
              ) -> tuple[bool, Any]:
    """(True, result) of one call, or (False, why the tool refused it)."""
    answer = sandbox.http(port, f"/tools/{name}", "POST", json=args)
    body = answer.json()
    if answer.status == 200:
        return True, body["result"]
    return False, body.get("error") or f"status {answer.status}"


def run_assistant(sandbox: Sandbox, goal: str, model_url: str, model: str, *, port: int,
                  tools: list[str] | None = None, max_steps: int = 20,
                  http: httpx.Client | None = None,
                  history: list[dict[str, Any]] | None = None,
                  seed: int | None = None) -> ToolLoopResult:
    """Run the loop on ``goal`` with the server's tools (those named in ``tools``, if given);
    ``history`` carries on a recorded conversation instead; ``seed``: the rollout's sampling
    seed (see ``run_tool_loop``)."""
    listing = [t for t in list_tools(sandbox, port) if tools is None or t["name"] in tools]
    specs = [{"type": "function", "function": {
        "name": t["name"], "description": t["description"], "parameters": t["inputSchema"]}}
        for t in listing]
    if history:
        messages = [dict(m) for m in history]
    else:
        user = sandbox.http(port, "/state").json()["user"]
        messages = [{"role": "system", "content": SYSTEM.format(**user)},
                    {"role": "user", "content": goal}]

    def act(call: dict[str, Any], name: str, args: dict[str, Any]) -> list[dict[str, Any]]:
        ok, result = call_tool(sandbox, port, name, args)
        if not ok:
            raise ToolRefused(f"The tool refused: {result}")
        return [tool_reply(call, json.dumps(result))]

    return run_tool_loop(model_url, model, messages, specs, act, max_steps=max_steps,
                         http=http, seed=seed)
