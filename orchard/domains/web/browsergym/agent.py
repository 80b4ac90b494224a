"""The browser agent in BrowserGym's terms: its observation text, its actions, plain-text answers.

The model reads what BrowserGym's demo agent shows (the goal, the open tabs, the page's
accessibility tree with bids, the last action's error, the action space as BrowserGym
describes it) and answers in plain text with one action as code; no tools are offered. The
conversation grows turn by turn (each page a user message), so a rollout is recorded and
exported like the tool-calling agent's.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from orchard.domains.web.browsergym.actions import ActionError, describe, parse_action, plan
from orchard.env.browser_schema import BrowserObservation
from orchard.env.client import InvalidRequest, Sandbox
from orchard.rollout.agents.tool_loop import ToolLoopResult, ask_model

INSTRUCTIONS = (
    "# Instructions\n"
    "Review the current state of the page and all other information to find the best\n"
    "possible next action to accomplish your goal. Your answer will be interpreted\n"
    "and executed by a program, make sure to follow the formatting instructions.\n")
EXAMPLES = (
    "Here are examples of actions with chain-of-thought reasoning:\n\n"
    "I now need to click on the Submit button to send the form. I will use the click action "
    "on the button, which has bid 12.\n```click(\"12\")```\n\n"
    "I found the information requested by the user, I will send it to the chat.\n"
    "```send_msg_to_user(\"The price for a 15\\\" laptop is 1499 USD.\")```\n")
NEXT = ("# Next action\nYou will now think step by step and produce your next best action. "
        "Reflect on your past actions, any resulting error message, and the current state of "
        "the page before deciding on your next action.\n")
# Our tree shows these states only when set; BrowserGym prints them as properties.
_STATES = {"checked": "checked='true'", "selected": "selected=True",
           "disabled": "disabled=True", "expanded": "expanded=True"}


def system_prompt() -> str:
    return f"{INSTRUCTIONS}\n# Action Space\n{describe()}\n{EXAMPLES}"


def render_axtree(page: BrowserObservation) -> str:
    """The page's tree in BrowserGym's text form (``flatten_axtree_to_str``): tab-indented
    ``[bid] role 'name'``, ``value='...'`` and ``, property=...``, text as ``StaticText``,
    under the ``RootWebArea``."""
    lines = [f"RootWebArea {page.title!r}, focused"]
    for line in page.tree.splitlines():
        body = line.lstrip(" ")
        indent = "\t" * ((len(line) - len(body)) // 2 + 1)
        lines.append(indent + _convert(body))
    return "\n".join(lines)


def _convert(body: str) -> str:
    """One line of our tree (``[3] link "Home"``, ``"some text"``) in BrowserGym's form."""
    decode = json.JSONDecoder().raw_decode
    if body.startswith('"'):
        return f"StaticText {decode(body)[0]!r}"
    head, _, rest = body.partition(" ") if body.startswith("[") else ("", "", body)
    role, _, rest = rest.partition(" ")
    name = ""
    if rest.startswith('"'):
        name, end = decode(rest)
        rest = rest[end:].lstrip()
    out = f"{head} {role} {name!r}".lstrip()
    if rest.startswith('value="'):
        value, end = decode(rest, len("value="))
        out += f" value={value!r}"
        rest = rest[end:].lstrip()
    return out + "".join(f", {_STATES.get(s, s)}" for s in rest.split())


def render_turn(page: BrowserObservation, error: str | None, goal: str | None = None,
                screenshot: bool = False) -> dict[str, Any]:
    """One user message: the goal (first turn), the tabs, the tree, the last action's error,
    the question; with ``screenshot``, the page's marked screenshot as an image part."""
    text = f"# Goal\n{goal}\n\n" if goal is not None else ""
    # The active tab as the page itself says (the tab list can lag behind a '#' link).
    text += "# Currently open tabs\n" + "".join(
        f"Tab {t.index} (active tab)\n  Title: {page.title}\n  URL: {page.url}\n" if t.active
        else f"Tab {t.index}\n  Title: {t.title}\n  URL: {t.url}\n" for t in page.tabs)
    text += f"\n# Current page Accessibility Tree\n{render_axtree(page)}\n"
    if page.truncated:
        text += "(the tree was cut here: the page is longer)\n"
    if error:
        text += f"\n# Error message from last action\n{error}\n"
    text += f"\n{NEXT}"
    if not screenshot or not page.screenshot_png_b64:
        return {"role": "user", "content": text}
    return {"role": "user", "content": [
        {"type": "text", "text": text + "\n# Current page Screenshot\n"},
        {"type": "image_url",
         "image_url": {"url": f"data:image/png;base64,{page.screenshot_png_b64}"}}]}


def run_browsergym_agent(sandbox: Sandbox, goal: str, start_url: str, model_url: str,
                         model: str, *, max_steps: int = 20, screenshots: bool = False,
                         action_timeout: float = 15.0, http: httpx.Client | None = None,
                         history: list[dict[str, Any]] | None = None,
                         seed: int | None = None) -> ToolLoopResult:
    """``run_browser_agent`` with BrowserGym's action set (same arguments and result);
    ``send_msg_to_user(text)`` ends it with ``text`` as the answer, ``report_infeasible``
    with none."""
    def browse(action: dict[str, Any]) -> BrowserObservation:
        return sandbox.browser(**{**action, "screenshot": screenshots,
                                  "timeout": action_timeout})

    if history:
        messages = [dict(m) for m in history]
        page = browse({"action": "observe"})  # the page the conversation left off at
    else:
        page = browse({"action": "goto", "url": start_url})
        messages = [{"role": "system", "content": system_prompt()},
                    render_turn(page, page.error, goal, screenshots)]
    client = http or httpx.Client(timeout=300)
    result = ToolLoopResult(exit_status="LimitsExceeded", messages=messages)
    try:
        while result.n_steps < max_steps:
            message = ask_model(client, model_url, {"model": model, "messages": messages},
                                result, seed)
            if message is None:
                return result
            try:
                todo = plan(parse_action(message.get("content")), page)
            except ActionError as e:
                # Nothing happened: the same page (its bids still hold) and what was wrong.
                messages.append(render_turn(page, str(e), screenshot=screenshots))
                continue
            if todo.finish:
                result.exit_status, result.answer = "Submitted", todo.answer
                return result
            time.sleep(todo.wait_s)
            page, error = _do(browse, todo.actions, page)
            messages.append(render_turn(page, error, screenshot=screenshots))
        return result
    finally:
        if http is None:
            client.close()


def _do(browse: Any, actions: list[dict[str, Any]], page: BrowserObservation
        ) -> tuple[BrowserObservation, str | None]:
    """Do the actions in order until one fails; the page after, and why it failed."""
    for action in actions:
        try:
            page = browse(action)
        except (InvalidRequest, ValueError) as e:
            # A request the browser refused (a key it does not know): the model's to fix.
            return page, f"{action['action']} failed: {e}"
        if page.error:
            return page, page.error
    return page, None
