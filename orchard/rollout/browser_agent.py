"""A browser agent: the model sees the goal and the page, and answers with one action.

The whole loop is ``run_browser_agent``: observe, ask the model (OpenAI chat completions with
two tools, ``browser`` and ``finish``), do the action in the sandbox's browser, repeat until
``finish`` or the step budget. Point ``model_url`` at the recording proxy's session URL and the
rollout's model calls are recorded token-exactly, while every browser action is an event in the
sandbox's log: the two join into one trace by the session.

    result = run_browser_agent(sandbox, goal, start_url, f"{proxy}/s/{session}/v1", "policy")
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx

from orchard.env.browser_schema import BrowserObservation
from orchard.env.client import InvalidRequest, Sandbox

SYSTEM = (
    "You operate a web browser to reach a goal. Each turn you see the page as an "
    "accessibility tree: one element per line, '[id] role \"name\"'. Answer with exactly one "
    "tool call: 'browser' to act on the page (ids come from the latest page), or 'finish' when "
    "the goal is reached, with the answer if the goal asks a question.")
BROWSER_TOOL = {"type": "function", "function": {
    "name": "browser", "description": "One action in the browser; the page after it comes back.",
    "parameters": {"type": "object", "required": ["action"], "properties": {
        "action": {"type": "string", "enum": ["observe", "goto", "click", "type", "select",
                                              "scroll", "press", "back", "tab"]},
        "id": {"type": "integer", "description": "The element, from the latest page."},
        "url": {"type": "string"}, "text": {"type": "string"},
        "submit": {"type": "boolean", "description": "type: press Enter after it."},
        "value": {"type": "string", "description": "select: the option."},
        "key": {"type": "string", "description": "press: e.g. Enter, Tab, Escape."},
        "direction": {"type": "string", "enum": ["up", "down"]},
        "op": {"type": "string", "enum": ["new", "switch", "close"]},
        "index": {"type": "integer"}}}}}
FINISH_TOOL = {"type": "function", "function": {
    "name": "finish", "description": "End the task.",
    "parameters": {"type": "object", "properties": {
        "answer": {"type": "string", "description": "The answer, if the goal asks for one."}}}}}
TOOLS = [BROWSER_TOOL, FINISH_TOOL]
# How OpenAI, vLLM and the policy server say a prompt is longer than the model reads.
CONTEXT_FULL = "maximum context length"


@dataclass
class BrowserAgentResult:
    exit_status: str  # "Submitted" (finish was called) or "LimitsExceeded"
    answer: str | None = None
    n_steps: int = 0
    n_tokens: int = 0
    messages: list[dict[str, Any]] = field(default_factory=list)


def render(page: BrowserObservation) -> str:
    """The page as the model reads it."""
    tabs = " | ".join(f"{'*' if t.active else ''}{t.index}: {t.title}" for t in page.tabs)
    head = f"URL: {page.url}\nTitle: {page.title}\nTabs: {tabs}\n"
    if page.error:
        head += f"The last action did not happen: {page.error}\n"
    return head + page.tree + ("\n(the page was cut here)" if page.truncated else "")


def _screenshot(page: BrowserObservation) -> dict[str, Any]:
    return {"role": "user", "content": [
        {"type": "text", "text": "The page, with each element's id drawn on it:"},
        {"type": "image_url",
         "image_url": {"url": f"data:image/png;base64,{page.screenshot_png_b64}"}}]}


def run_browser_agent(sandbox: Sandbox, goal: str, start_url: str, model_url: str,
                      model: str, *, max_steps: int = 20, screenshots: bool = False,
                      action_timeout: float = 15.0, http: httpx.Client | None = None,
                      history: list[dict[str, Any]] | None = None) -> BrowserAgentResult:
    """Run the loop (see the module doc); ``model_url`` is an OpenAI base URL ending in /v1.

    ``history``: carry on a recorded conversation instead of starting at ``start_url``, in a
    sandbox whose browser is where that conversation left it (``orchard.rollout.branch``)."""
    client = http or httpx.Client(timeout=300)
    try:
        if history:
            messages = [dict(m) for m in history]
        else:
            page = sandbox.browser("goto", url=start_url, screenshot=screenshots,
                                   timeout=action_timeout)
            messages = [{"role": "system", "content": SYSTEM},
                        {"role": "user", "content": f"Goal: {goal}\n\n{render(page)}"}]
            if screenshots:
                messages.append(_screenshot(page))
        result = BrowserAgentResult(exit_status="LimitsExceeded", messages=messages)
        while result.n_steps < max_steps:
            reply = client.post(f"{model_url.rstrip('/')}/chat/completions", json={
                "model": model, "messages": messages, "tools": TOOLS})
            if reply.status_code == 400 and CONTEXT_FULL in reply.text:
                return result  # the conversation outgrew the model: a limit, like the steps
            reply.raise_for_status()
            body = reply.json()
            result.n_steps += 1
            result.n_tokens += int((body.get("usage") or {}).get("total_tokens") or 0)
            message = body["choices"][0]["message"]
            messages.append({k: v for k, v in message.items() if v is not None})
            calls = message.get("tool_calls") or []
            if not calls:
                messages.append({"role": "user", "content": "Answer with one tool call: "
                                 "'browser' or 'finish'."})
                continue
            call = calls[0]
            try:
                args = json.loads(call["function"]["arguments"] or "{}")
            except json.JSONDecodeError as e:
                messages.append(_tool_reply(call, f"The arguments are not JSON ({e}); "
                                                  "try again."))
                continue
            if call["function"]["name"] == "finish":
                result.exit_status, result.answer = "Submitted", args.get("answer")
                return result
            if call["function"]["name"] != "browser" or not isinstance(args, dict):
                messages.append(_tool_reply(call, "Use the 'browser' or 'finish' tool."))
                continue
            try:
                page = sandbox.browser(**{**args, "screenshot": screenshots,
                                          "timeout": action_timeout})
            except (InvalidRequest, TypeError, ValueError) as e:
                # A malformed action is the model's to fix, like a stale id.
                messages.append(_tool_reply(call, f"That action is not valid: {e}"))
                continue
            messages.append(_tool_reply(call, render(page)))
            if screenshots:
                messages.append(_screenshot(page))
        return result
    finally:
        if http is None:
            client.close()


def _tool_reply(call: dict[str, Any], content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call["id"], "content": content}
