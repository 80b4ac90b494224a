"""The scripted MiniWoB++ solver, and the random-action baseline: policies a browser agent runs.

The solver reads what an agent reads, the page's accessibility tree: the instruction is the
text at its top, and a plan for the page names elements the way the tree shows them
(``button "Submit"``, the second ``textbox``). It never looks at the page's JavaScript or the
reward. ``plan`` makes the plan from the first observation; ``solver_policy`` plays it as tool
calls for the browser agent (through the scripted teacher server, like the web teacher), one
element found in the latest page per call, and ``run_solver`` plays it directly on a sandbox.

``random_policy`` is the baseline: each call a random action (click, type a word, select an
option, press a key) on a random element of the latest page, for a fixed number of steps,
seeded by the page so a run is repeatable.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from orchard.domains.web.teacher import _arguments, _text
from orchard.env.browser_schema import BrowserObservation
from orchard.env.client import Sandbox
from orchard.testing.policies import Messages, Policy, Reply, ToolCall, Tools

_LINE = re.compile(r'^\s*\[(\d+)\] (.*)$')
_QUOTED = re.compile(r'"\s*([^"]*?)\s*"')
ORDINALS = {"1st": 0, "2nd": 1, "3rd": 2, "4th": 3, "5th": 4}


@dataclass(frozen=True)
class Step:
    """One browser action on the ``nth`` element whose tree line starts with ``target``."""

    action: str
    target: str
    nth: int = 0
    text: str | None = None
    value: str | None = None


def instruction(tree: str) -> str:
    """The instruction: the text lines at the top of the page, before its first element, one
    sentence (a page may split it over several lines where it has markup)."""
    words = []
    for line in tree.splitlines():
        line = line.strip()
        if not line.startswith('"'):
            break
        words.append(line[1:-1].replace('\\"', '"'))
        if words[-1].rstrip().endswith("."):
            break
    return " ".join(words)


def find(tree: str, target: str, nth: int = 0) -> int | None:
    """The id of the ``nth`` element (0: the first) whose tree line starts with ``target``."""
    found = [int(m.group(1)) for m in map(_LINE.match, tree.splitlines())
             if m and m.group(2).startswith(target)]
    return found[nth] if nth < len(found) else None


def _submit(*steps: Step, button: str = "Submit") -> list[Step]:
    return [*steps, Step("click", f'button "{button}"')]


def plan(page: str, tree: str) -> list[Step] | None:
    """The solver's steps for ``page`` as first observed; None where it has no plan."""
    said = instruction(tree)
    quoted = _QUOTED.findall(said)
    ordinal = re.search(r"\b(\d(?:st|nd|rd|th))\b", said)
    number = re.search(r"#(\d+)", said)
    lower = said.lower()
    plans: dict[str, Callable[[], list[Step]]] = {
        "click-button": lambda: [Step("click", f'button "{quoted[0]}"')],
        "click-test": lambda: [Step("click", 'button "Click Me!"')],
        "click-test-2": lambda: [Step("click", f'button "{said.split()[-1].rstrip(".")}"')],
        "click-button-sequence": lambda: [Step("click", 'button "ONE"'),
                                          Step("click", 'button "TWO"')],
        "click-dialog": lambda: [Step("click", 'button "Close"')],
        "click-tab": lambda: [Step("click", f'link "Tab #{number.group(1)}"')],
        "click-collapsible": lambda: [Step("click", 'tab "Section'),
                                      Step("click", 'button "Submit"')],
        "click-option": lambda: _submit(Step("click", f'radio "{_after(said, "Select ")}"')),
        "click-checkboxes": lambda: _submit(*[
            Step("click", f'checkbox "{name}"') for name in _after(said, "Select ").split(", ")
            if name != "nothing"]),
        "choose-list": lambda: _submit(Step("select", "combobox",
                                            value=_after(said, "Select ", " from"))),
        "enter-text": lambda: _submit(Step("type", "textbox", text=quoted[0])),
        "enter-text-2": lambda: _submit(Step("type", "textbox", text=(
            quoted[0].upper() if "upper case" in lower else quoted[0].lower()))),
        "enter-password": lambda: _submit(Step("type", "textbox", text=quoted[0]),
                                          Step("type", "textbox", 1, text=quoted[0])),
        "login-user": lambda: _submit(Step("type", "textbox", text=quoted[0]),
                                      Step("type", "textbox", 1, text=quoted[1]),
                                      button="Login"),
        "focus-text": lambda: [Step("click", "textbox")],
        "focus-text-2": lambda: [Step("click", "textbox", ORDINALS[ordinal.group(1)])],
    }
    make = plans.get(page)
    if make is None:
        return None
    try:
        return make()
    except (IndexError, AttributeError, KeyError):  # an instruction not as the plan expects
        return None


def _after(text: str, start: str, end: str = " and click") -> str:
    return text.split(start, 1)[1].split(end, 1)[0].strip()


SOLVED_PAGES = ("click-button", "click-button-sequence", "click-checkboxes",
                "click-collapsible", "click-dialog", "click-option", "click-tab",
                "click-test", "click-test-2", "choose-list", "enter-password", "enter-text",
                "enter-text-2", "focus-text", "focus-text-2", "login-user")


def browser_args(step: Step, tree: str) -> dict[str, Any] | None:
    """The ``browser`` tool's arguments for ``step`` on the page; None if its element is not
    there."""
    found = find(tree, step.target, step.nth)
    if found is None:
        return None
    args: dict[str, Any] = {"action": step.action, "id": found}
    if step.text is not None:
        args["text"] = step.text
    if step.value is not None:
        args["value"] = step.value
    return args


def page_name(url: str) -> str:
    """The task page a URL of the MiniWoB++ site shows (click-button)."""
    return urlsplit(url).path.rsplit("/", 1)[-1].removesuffix(".html")


def run_solver(sandbox: Sandbox, start_url: str, timeout: float = 15.0) -> int:
    """Play the solver's plan from ``start_url``; the number of actions it took. A page it
    has no plan for, or an element it cannot find, stops it (the episode then stays open)."""
    page: BrowserObservation = sandbox.browser("goto", url=start_url, timeout=timeout)
    steps = plan(page_name(start_url), page.tree) or []
    for n, step in enumerate(steps):
        args = browser_args(step, page.tree)
        if args is None:
            return n
        page = sandbox.browser(**args, timeout=timeout)
    return len(steps)


def _pages(messages: Messages) -> list[str]:
    return [_text(m) for m in messages if m.get("role") in ("user", "tool")
            and "URL: " in _text(m)]


def _url(page_text: str) -> str:
    return next((line[5:] for line in page_text.splitlines() if line.startswith("URL: ")), "")


def _tree(page_text: str) -> str:
    return page_text.split("\nTabs: ", 1)[-1].split("\n", 1)[-1]


def _actions(messages: Messages) -> int:
    return sum(1 for m in messages if m.get("role") == "assistant"
               for c in m.get("tool_calls") or [] if c.get("function", {}).get("name") ==
               "browser" and _arguments(c).get("action") != "observe")


def solver_policy() -> Policy:
    """The solver as a model policy for the browser agent (see the module doc)."""
    def policy(messages: Messages, tools: Tools) -> Reply:
        pages = _pages(messages)
        first = pages[0] if pages else ""
        steps = plan(page_name(_url(first)), _tree(first)) or []
        turn = _actions(messages)
        if turn >= len(steps):
            return Reply(content="Done." if steps else "I have no plan for this page.",
                         tool_calls=[ToolCall("finish", {})])
        args = browser_args(steps[turn], _tree(pages[-1]))
        if args is None:
            return Reply(content=f"I cannot find {steps[turn].target}.",
                         tool_calls=[ToolCall("finish", {})])
        return Reply(content=f"Next: {steps[turn].action} {steps[turn].target}",
                     tool_calls=[ToolCall("browser", args)])

    return policy


WORDS = ("yes", "no", "submit", "42", "hello", "Alice")
KEYS = ("Enter", "Tab", "Escape", "ArrowDown", "Space")


def random_policy(steps: int = 10) -> Policy:
    """The random-action baseline (see the module doc): ``steps`` actions, then finish."""
    def policy(messages: Messages, tools: Tools) -> Reply:
        pages = _pages(messages)
        turn = _actions(messages)
        if turn >= steps or not pages:
            return Reply(content="Done.", tool_calls=[ToolCall("finish", {})])
        # Seeded by the task's opening page and the turn: repeatable, different each step.
        rng = random.Random(hashlib.sha256(f"{pages[0]}|{turn}".encode()).digest())
        ids = [int(m.group(1)) for m in map(_LINE.match, _tree(pages[-1]).splitlines()) if m]
        action = rng.choice(("click", "click", "click", "type", "select", "press"))
        if action == "press" or not ids:
            args: dict[str, Any] = {"action": "press", "key": rng.choice(KEYS)}
        else:
            args = {"action": action, "id": rng.choice(ids)}
            if action == "type":
                args["text"] = rng.choice(WORDS)
            elif action == "select":
                args["value"] = rng.choice(WORDS)
        return Reply(content=f"Random: {args}", tool_calls=[ToolCall("browser", args)])

    return policy
