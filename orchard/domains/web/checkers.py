"""Checkers of web tasks: functions of the sites' final state and the agent's answer.

Each takes ``(state, answer, **args)``, where ``state`` maps a site name to its state file's
content, and returns ``(passed, reason)``. A checker that raises is a broken task, not a failed
rollout (``grading.py`` says so).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

State = dict[str, dict[str, Any]]
Result = tuple[bool, str]


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text.replace(",", "")).strip().lower()


def answer(state: State, answer: str | None, expected: str | list[str]) -> Result:
    """The answer contains one of the expected strings (case, spaces and thousands commas
    aside)."""
    wanted = [expected] if isinstance(expected, str) else expected
    if not answer:
        return False, "no answer was given"
    if any(_norm(w) in _norm(answer) for w in wanted):
        return True, f"the answer mentions {wanted[0]!r}"
    return False, f"the answer {answer[:200]!r} does not mention {wanted[0]!r}"


def shop_order(state: State, answer: str | None, items: dict[str, int], name: str | None = None,
               address: str | None = None, shipping: str | None = None) -> Result:
    """An order of exactly these items (and name, address, shipping where given)."""
    for order in state["shop"]["orders"]:
        if order["items"] != items:
            continue
        wrong = [(k, v) for k, v in (("name", name), ("address", address),
                                     ("shipping", shipping))
                 if v is not None and _norm(str(order[k])) != _norm(v)]
        if not wrong:
            return True, f"order {order['id']} has {items}"
        return False, f"order {order['id']} has the items but {wrong[0][0]} " \
                      f"{order[wrong[0][0]]!r}, not {wrong[0][1]!r}"
    return False, f"no order of exactly {items} (orders: {state['shop']['orders']})"


def shop_cart(state: State, answer: str | None, items: dict[str, int],
              no_orders: bool = True) -> Result:
    cart = state["shop"]["cart"]
    if no_orders and state["shop"]["orders"]:
        return False, "an order was placed; the task said not to check out"
    return (cart == items, f"the cart holds {cart}" + ("" if cart == items
                                                        else f", not {items}"))


def wiki_edit(state: State, answer: str | None, title: str, contains: list[str],
              absent: list[str] | None = None) -> Result:
    text = state["wiki"]["articles"].get(title, "")
    if not any(e["title"] == title for e in state["wiki"]["edits"]):
        return False, f"{title} was never edited"
    missing = [c for c in contains if c not in text]
    present = [a for a in absent or [] if a in text]
    if missing or present:
        return False, f"{title} reads {text[:200]!r}: " + (
            f"missing {missing[0]!r}" if missing else f"still has {present[0]!r}")
    return True, f"{title} was edited as asked"


def booking_made(state: State, answer: str | None, room: str, day: str, slot: str,
                 name: str | None = None, people: int | None = None) -> Result:
    for b in state["booking"]["bookings"]:
        if (b["room"], b["day"], b["slot"]) == (room, day, slot) and \
                (name is None or _norm(b["name"]) == _norm(name)) and \
                (people is None or b["people"] == people):
            return True, f"{room} is booked on {day} at {slot}"
    return False, f"no booking of {room} on {day} at {slot} as asked " \
                  f"(bookings: {state['booking']['bookings']})"


def booking_cancelled(state: State, answer: str | None, name: str) -> Result:
    left = [b for b in state["booking"]["bookings"] if _norm(b["name"]) == _norm(name)]
    return (not left, f"{name!r} is " + ("still booked" if left else "cancelled"))


def mail_sent(state: State, answer: str | None, to: str, subject_contains: str = "",
              body_contains: list[str] | None = None) -> Result:
    for m in state["mail"]["messages"]:
        if m["folder"] != "sent" or _norm(m["to"]) != _norm(to):
            continue
        if _norm(subject_contains) in _norm(m["subject"]) and all(
                _norm(b) in _norm(m["body"]) for b in body_contains or []):
            return True, f"a message to {to} was sent"
    return False, f"no sent message to {to} with subject {subject_contains!r} and body " \
                  f"{body_contains}"


def mail_moved(state: State, answer: str | None, subject: str, folder: str) -> Result:
    for m in state["mail"]["messages"]:
        if m["subject"] == subject:
            return (m["folder"] == folder, f"{subject!r} is in {m['folder']}")
    return False, f"there is no message {subject!r}"


def miniwob_reward(state: State, answer: str | None, page: str) -> Result:
    """A MiniWoB++ episode ended with the page's raw reward 1: upstream's binary success,
    what published success rates count. The reason quotes the page's instruction and its own
    rewards (the time-scaled one too)."""
    episode = state["miniwob"]
    if not episode["started"]:
        return False, f"the page {page} never started an episode"
    said = f"{page} ({episode['instruction']!r})"
    if not episode["done"]:
        return False, f"{said}: the episode did not end"
    raw, reward = episode["raw_reward"], episode["reward"]
    return (raw == 1, f"{said}: the page's reward {reward:.3f}, raw {raw:g}"
            + (f" ({episode['reason']})" if episode["reason"] else ""))


CHECKERS: dict[str, Callable[..., Result]] = {
    f.__name__: f for f in (answer, shop_order, shop_cart, wiki_edit, booking_made,
                            booking_cancelled, mail_sent, mail_moved, miniwob_reward)}
