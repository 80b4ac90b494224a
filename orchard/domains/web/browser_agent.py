"""A browser agent: the model sees the goal and the page, and answers with one action.

The whole loop is ``run_browser_agent``: observe, ask the model (OpenAI chat completions with
two tools, ``browser`` and ``finish``), do the action in the sandbox's browser, repeat until
``finish`` or the step budget. Point ``model_url`` at the recording proxy's session URL and the
rollout's model calls are recorded token-exactly, while every browser action is an event in the
sandbox's log: the two join into one trace by the session.

    result = run_browser_agent(sandbox, goal, start_url, f"{proxy}/s/{session}/v1", "policy")
"""

from __future__ import annotations

from typing import Any, Literal

import httpx

from orchard.domains.web.browsergym import run_browsergym_agent
from orchard.env.browser_schema import BrowserObservation
from orchard.env.client import InvalidRequest, Sandbox
from orchard.rollout.agents.tool_loop import ToolLoopResult, ToolRefused, run_tool_loop, tool_reply

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
TOOLS = [BROWSER_TOOL]
BrowserActionSet = Literal["orchard", "browsergym"]
ACTION_SETS: tuple[BrowserActionSet, ...] = ("orchard", "browsergym")


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
                      history: list[dict[str, Any]] | None = None,
                      seed: int | None = None,
                      action_set: BrowserActionSet = "orchard") -> ToolLoopResult:
    """Run the loop (see the module doc); ``model_url`` is an OpenAI base URL ending in /v1.
    ``seed``: the rollout's sampling seed (see ``run_tool_loop``).

    ``history``: carry on a recorded conversation instead of starting at ``start_url``, in a
    sandbox whose browser is where that conversation left it (``orchard.rollout.traces.branch``).

    ``action_set="browsergym"``: BrowserGym's observation text and high-level actions, answered
    in plain text (``orchard.domains.web.browsergym``) instead of our tools."""
    if action_set == "browsergym":
        return run_browsergym_agent(sandbox, goal, start_url, model_url, model,
                                    max_steps=max_steps, screenshots=screenshots,
                                    action_timeout=action_timeout, http=http, history=history,
                                    seed=seed)
    if action_set != "orchard":
        raise ValueError(f"unknown action set {action_set!r}; one of {', '.join(ACTION_SETS)}")
    if history:
        messages = [dict(m) for m in history]
        # A live fork's browser kept its page but not the ids the agent handed out: looking
        # again numbers the same page's elements as the conversation last saw them.
        sandbox.browser("observe", timeout=action_timeout)
    else:
        page = sandbox.browser("goto", url=start_url, screenshot=screenshots,
                               timeout=action_timeout)
        messages = [{"role": "system", "content": SYSTEM},
                    {"role": "user", "content": f"Goal: {goal}\n\n{render(page)}"}]
        if screenshots:
            messages.append(_screenshot(page))

    def act(call: dict[str, Any], name: str, args: dict[str, Any]) -> list[dict[str, Any]]:
        try:
            page = sandbox.browser(**{**args, "screenshot": screenshots,
                                      "timeout": action_timeout})
        except (InvalidRequest, TypeError, ValueError) as e:
            # A malformed action is the model's to fix, like a stale id.
            raise ToolRefused(f"That action is not valid: {e}") from None
        return [tool_reply(call, render(page)), *([_screenshot(page)] if screenshots else [])]

    return run_tool_loop(model_url, model, messages, TOOLS, act, max_steps=max_steps,
                         http=http, seed=seed)
