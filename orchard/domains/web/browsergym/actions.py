"""BrowserGym's high-level action set, spoken to the sandbox's browser.

The model answers in text with one action as Python-call code, the way BrowserGym prompts ask
(``click('12')``, maybe inside ```` ``` ```` fences or ``<action>`` tags, maybe after some
reasoning). ``parse_action`` reads it with ``ast`` (never eval): every argument must be a
literal. ``plan`` turns the call into the browser actions of ``orchard.env.browser_schema``
(``press`` is a focus, then the key), or an end of the episode (``send_msg_to_user``,
``report_infeasible``). What the model got wrong is an ``ActionError``, whose message the model
reads on its next turn, as BrowserGym's ``last_action_error``.

A bid is the element id of our last observation, as a string: bids are renumbered by every
observation, like our ids (BrowserGym's stay put while the page does).
"""

from __future__ import annotations

import ast
import random
import re
from dataclasses import dataclass, field
from typing import Any

from orchard.env.browser_schema import BrowserObservation

_REQUIRED = object()
_CLICK_PARAMS = (("bid", _REQUIRED), ("button", "left"), ("modifiers", ()))
_CLICK_SIGNATURE = ("(bid: str, button: Literal['left', 'middle', 'right'] = 'left', modifiers: "
                    "list[typing.Literal['Alt', 'Control', 'ControlOrMeta', 'Meta', 'Shift']] "
                    "= [])")


@dataclass(frozen=True)
class ActionSpec:
    """One high-level action: its parameters (name, default) and how the prompt shows it."""

    name: str
    params: tuple[tuple[str, Any], ...]
    signature: str  # as BrowserGym prints it: Python's inspect.signature of its function
    description: str
    examples: tuple[str, ...]


def _spec(name: str, params: tuple[tuple[str, Any], ...], signature: str, description: str,
          *examples: str) -> ActionSpec:
    return ActionSpec(name, params, name + signature, description, examples)


_BID = (("bid", _REQUIRED),)
# BrowserGym's default set (subsets chat, infeas, bid, nav, tab; noop first), in its order,
# less drag_and_drop and upload_file, which this browser cannot do (see UNSUPPORTED).
ACTIONS: dict[str, ActionSpec] = {s.name: s for s in (
    _spec("noop", (("wait_ms", 1000),), "(wait_ms: float = 1000)",
          "Do nothing, and optionally wait for the given time (in milliseconds).",
          "noop()", "noop(500)"),
    _spec("send_msg_to_user", (("text", _REQUIRED),), "(text: str)",
          "Sends a message to the user.",
          "send_msg_to_user('Based on the results of my search, the city was built in 1751.')"),
    _spec("report_infeasible", (("reason", _REQUIRED),), "(reason: str)",
          "Notifies the user that their instructions are infeasible.",
          "report_infeasible('I cannot follow these instructions because there is no email "
          "field in this form.')"),
    _spec("scroll", (("delta_x", _REQUIRED), ("delta_y", _REQUIRED)),
          "(delta_x: float, delta_y: float)",
          "Scroll horizontally and vertically. Amounts in pixels, positive for right or down "
          "scrolling, negative for left or up scrolling. Dispatches a wheel event.",
          "scroll(0, 200)", "scroll(-50.2, -100.5)"),
    _spec("fill", (*_BID, ("value", _REQUIRED), ("enable_autocomplete_menu", False)),
          "(bid: str, value: str, enable_autocomplete_menu: bool = False)",
          "Fill out a form field. It focuses the element and triggers an input event with the "
          "entered text. It works for <input>, <textarea> and [contenteditable] elements.",
          "fill('45', 'multi-line\\nexample')", "fill('a12', 'example with \"quotes\"')",
          "fill('b534', 'Montre', True)"),
    _spec("select_option", (*_BID, ("options", _REQUIRED)),
          "(bid: str, options: str | list[str])",
          "Select one or multiple options in a <select> element. You can specify option value "
          "or label to select. Multiple options can be selected.",
          "select_option('a48', 'blue')", "select_option('c48', ['red', 'green', 'blue'])"),
    _spec("click", _CLICK_PARAMS, _CLICK_SIGNATURE, "Click an element.",
          "click('a51')", "click('b22', button='right')",
          "click('48', button='middle', modifiers=['Shift'])"),
    _spec("dblclick", _CLICK_PARAMS, _CLICK_SIGNATURE, "Double click an element.",
          "dblclick('12')", "dblclick('ca42', button='right')",
          "dblclick('178', button='middle', modifiers=['Shift'])"),
    _spec("hover", _BID, "(bid: str)", "Hover over an element.", "hover('b8')"),
    _spec("press", (*_BID, ("key_comb", _REQUIRED)), "(bid: str, key_comb: str)",
          "Focus the matching element and press a combination of keys. It accepts the logical "
          "key names that are emitted in the keyboardEvent.key property of the keyboard "
          "events: Backspace, Tab, Delete, Escape, ArrowDown, End, Enter, Home, PageDown, "
          "PageUp, ArrowRight, ArrowUp, etc. You can alternatively specify a single character "
          "you'd like to produce such as \"a\" or \"#\". Following modification shortcuts are "
          "also supported: Shift, Control, Alt, Meta, ControlOrMeta. ControlOrMeta resolves "
          "to Control on Windows and Linux and to Meta on macOS.",
          "press('88', 'Backspace')", "press('a26', 'ControlOrMeta+a')",
          "press('a61', 'Meta+Shift+t')"),
    _spec("focus", _BID, "(bid: str)", "Focus the matching element.", "focus('b455')"),
    _spec("clear", _BID, "(bid: str)", "Clear the input field.", "clear('996')"),
    _spec("go_back", (), "()", "Navigate to the previous page in history.", "go_back()"),
    _spec("go_forward", (), "()", "Navigate to the next page in history.", "go_forward()"),
    _spec("goto", (("url", _REQUIRED),), "(url: str)", "Navigate to a url.",
          "goto('http://www.example.com')"),
    _spec("tab_close", (), "()", "Close the current tab.", "tab_close()"),
    _spec("tab_focus", (("index", _REQUIRED),), "(index: int)",
          "Bring tab to front (activate tab).", "tab_focus(2)"),
    _spec("new_tab", (), "()", "Open a new tab. It will become the active one.", "new_tab()"),
)}
# BrowserGym's other actions: named so that a model that uses one learns why it did nothing.
UNSUPPORTED = {
    "drag_and_drop": "this browser does not drag", "upload_file": "this browser has no files "
    "to upload", "check": "click the checkbox instead", "uncheck": "click the checkbox instead",
    **dict.fromkeys(("scroll_at", "mouse_move", "mouse_up", "mouse_down", "mouse_click",
                     "mouse_dblclick", "mouse_drag_and_drop", "mouse_upload_file",
                     "keyboard_down", "keyboard_up", "keyboard_press", "keyboard_type",
                     "keyboard_insert_text"),
                    "coordinate and keyboard-only actions are not in this action set; act on "
                    "an element by its bid")}
# Where an answer marks its action: AgentLab's <action> tags, the demo agent's fences.
_FENCED = (re.compile(r"<action>(.*?)</action>", re.S),
           re.compile(r"```(?:[\w-]*\n)?(.*?)```", re.S))
_CALL = re.compile(r"\b(" + "|".join(sorted([*ACTIONS, *UNSUPPORTED], key=len, reverse=True))
                   + r")\s*\(")


class ActionError(ValueError):
    """What was wrong with the model's action, for the model to read (last_action_error)."""


@dataclass(frozen=True)
class Call:
    """One parsed action: its name and every parameter bound (defaults filled in)."""

    name: str
    args: dict[str, Any]


@dataclass
class Plan:
    """What a call does: browser actions in order (``BrowserAction`` fields), a wait first
    (noop), or the end of the episode with an answer."""

    actions: list[dict[str, Any]] = field(default_factory=list)
    wait_s: float = 0.0
    finish: bool = False
    answer: str | None = None


def describe(with_long_description: bool = False, with_examples: bool = True) -> str:
    """The action space as BrowserGym's ``HighLevelActionSet.describe`` lays it out (one action
    at a time), the way its demo agent puts it in the prompt."""
    out = f"\n{len(ACTIONS)} different types of actions are available.\n\n"
    for spec in ACTIONS.values():
        out += spec.signature + "\n"
        if with_long_description:
            out += f"    Description: {spec.description}\n"
        if with_examples:
            out += "    Examples:\n" + "".join(f"        {e}\n\n" for e in spec.examples)
    # BrowserGym's example: its fill and click examples shuffled by Random(1), the first.
    picked = [*ACTIONS["fill"].examples, *ACTIONS["click"].examples]
    random.Random(1).shuffle(picked)
    return out + f"Only a single action can be provided at once. Example:\n{picked[0]}\n"


def parse_action(text: str | None) -> Call:
    """The one action in a model's answer (see the module doc), or ActionError."""
    if not text or not text.strip():
        raise ActionError("Received an empty action. Answer with one action as code, "
                          "e.g. click('12').")
    code = text
    for pattern in _FENCED:  # the last block marked as the action, if any
        blocks = pattern.findall(text)
        if blocks:
            code = blocks[-1]
            break
    calls = _whole(code)
    if calls is None:
        calls = _search(code)
    if not calls:
        raise ActionError("No action found in the answer. Answer with one action as code, "
                          "e.g. click('12'); the actions are " + ", ".join(ACTIONS) + ".")
    if len(calls) > 1:
        raise ActionError(f"Received {len(calls)} actions; only single-actions are allowed. "
                          "Answer with exactly one.")
    return _bind(calls[0])


def _whole(code: str) -> list[ast.Call] | None:
    """The calls, if the code is nothing but calls (so an unknown name is reported)."""
    try:
        tree = ast.parse(code.strip())
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if not all(isinstance(s, ast.Expr) and isinstance(s.value, ast.Call) for s in tree.body):
        return None
    return [s.value for s in tree.body if isinstance(s, ast.Expr)
            and isinstance(s.value, ast.Call)]


def _search(text: str) -> list[ast.Call]:
    """Calls of known actions within prose: each from its name to the first ')' that closes
    a whole call (strings may hold parentheses)."""
    calls, pos = [], 0
    while match := _CALL.search(text, pos):
        pos = match.end()
        close = match.end() - 1
        while (close := text.find(")", close + 1)) != -1:
            try:
                node = ast.parse(text[match.start():close + 1], mode="eval").body
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                continue
            if isinstance(node, ast.Call):
                calls.append(node)
                pos = close + 1
            break
    return calls


def _bind(node: ast.Call) -> Call:
    if not isinstance(node.func, ast.Name):
        raise ActionError(f"{ast.unparse(node.func)}(...) is not an action; the actions are "
                          + ", ".join(ACTIONS) + ".")
    name = node.func.id
    if name in UNSUPPORTED:
        raise ActionError(f"{name} is not supported here: {UNSUPPORTED[name]}.")
    spec = ACTIONS.get(name)
    if spec is None:
        raise ActionError(f"Unknown action {name!r}; the actions are "
                          + ", ".join(ACTIONS) + ".")
    names = [p for p, _ in spec.params]
    if any(isinstance(a, ast.Starred) for a in node.args) or any(
            k.arg is None for k in node.keywords):
        raise ActionError(f"{name}: write each argument out, without * or **.")
    if len(node.args) > len(names):
        raise ActionError(f"{name} takes {len(names)} arguments ({spec.signature}), "
                          f"got {len(node.args)}.")
    given = dict(zip(names, node.args, strict=False))
    for kw in node.keywords:
        if kw.arg not in names:
            raise ActionError(f"{name} has no argument {kw.arg!r}: {spec.signature}.")
        if kw.arg in given:
            raise ActionError(f"{name} got {kw.arg!r} twice.")
        given[kw.arg] = kw.value
    args = {}
    for param, default in spec.params:
        if param in given:
            try:
                args[param] = ast.literal_eval(given[param])
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                raise ActionError(f"{name}: {param} must be a literal (a string, a number, a "
                                  f"list...), not {ast.unparse(given[param])}.") from None
        elif default is _REQUIRED:
            raise ActionError(f"{name} needs {param!r}: {spec.signature}.")
        else:
            args[param] = default
    return Call(name, args)


def plan(call: Call, page: BrowserObservation) -> Plan:
    """The browser actions that do ``call`` on ``page`` (the last observation), or
    ActionError for arguments of the wrong kind or an action this browser cannot do."""
    a, name = call.args, call.name
    if name in ("send_msg_to_user", "report_infeasible"):
        # Both end the episode; only a message to the user is an answer.
        return Plan(finish=True, answer=str(a["text"]) if name == "send_msg_to_user" else None)
    if name == "noop":
        wait_ms = min(max(_number(a, "wait_ms"), 0.0), 10_000.0)  # no stalling the rollout
        return Plan([{"action": "observe"}], wait_s=wait_ms / 1000)
    if name in ("click", "dblclick"):
        if a["button"] not in ("left", "middle", "right"):
            raise ActionError(f"{name}: button is 'left', 'middle' or 'right', not "
                              f"{a['button']!r}.")
        if a["button"] != "left" or a["modifiers"]:
            raise ActionError(f"{name}: only the left button without modifiers is supported "
                              f"here; use {name}('{_bid(a)}').")
        return Plan([{"action": name, "id": _bid(a)}])
    if name in ("hover", "focus"):
        return Plan([{"action": name, "id": _bid(a)}])
    if name in ("fill", "clear"):
        text = _text(a, "value") if name == "fill" else ""
        return Plan([{"action": "type", "id": _bid(a), "text": text, "clear": True}])
    if name == "select_option":
        options = a["options"]
        if isinstance(options, list | tuple) and len(options) == 1:
            options = options[0]
        if not isinstance(options, str):
            raise ActionError("select_option: options is one option's value or label (this "
                              "browser selects one option at a time).")
        return Plan([{"action": "select", "id": _bid(a), "value": options}])
    if name == "press":
        # The browser reads the combination (and says what is wrong with one).
        keys = _text(a, "key_comb")
        if not keys:
            raise ActionError("press: key_comb is a key, e.g. 'Enter' or 'Control+a'.")
        return Plan([{"action": "focus", "id": _bid(a)}, {"action": "press", "key": keys}])
    if name == "scroll":
        dx, dy = _number(a, "delta_x"), _number(a, "delta_y")
        if dx:
            raise ActionError("scroll: this browser scrolls vertically only; use "
                              f"scroll(0, {dy:g}).")
        if round(dy) == 0:
            return Plan([{"action": "observe"}])
        return Plan([{"action": "scroll", "direction": "down" if dy > 0 else "up",
                      "amount": abs(round(dy))}])
    if name == "goto":
        return Plan([{"action": "goto", "url": _text(a, "url")}])
    if name in ("go_back", "go_forward"):
        return Plan([{"action": "back" if name == "go_back" else "forward"}])
    if name == "new_tab":
        return Plan([{"action": "tab", "op": "new"}])
    if name == "tab_focus":
        index = a["index"]
        if not isinstance(index, int) or isinstance(index, bool):
            raise ActionError(f"tab_focus: index is a tab's number, not {index!r}.")
        return Plan([{"action": "tab", "op": "switch", "index": index}])
    if name == "tab_close":
        active = next((t.index for t in page.tabs if t.active), -1)
        return Plan([{"action": "tab", "op": "close", "index": active}])
    raise AssertionError(f"ACTIONS has {name} but plan does not")  # pragma: no cover


def _bid(args: dict[str, Any]) -> int:
    bid = args["bid"]
    if isinstance(bid, int) and not isinstance(bid, bool) and bid > 0:
        return bid
    if isinstance(bid, str) and bid.strip().isdigit() and int(bid) > 0:
        return int(bid)
    raise ActionError(f"{bid!r} is not a bid on this page: bids are the numbers in brackets "
                      "in the accessibility tree, e.g. click('12').")


def _text(args: dict[str, Any], name: str) -> str:
    if not isinstance(args[name], str):
        raise ActionError(f"{name} must be a string, not {args[name]!r}.")
    return args[name]


def _number(args: dict[str, Any], name: str) -> float:
    value = args[name]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ActionError(f"{name} must be a number, not {value!r}.")
    return float(value)
