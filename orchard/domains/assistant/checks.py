"""Checks of assistant tasks: assertions over the final world and the final answer.

Each takes ``(world, answer, **args)`` and returns ``(passed, reason)``. A task passes when all
its checks do. A check that raises is a broken task, not a failed rollout (``grading.py``).
Text is compared case- and space-insensitively, as a substring.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

World = dict[str, Any]
Result = tuple[bool, str]


def _norm(text: Any) -> str:
    return re.sub(r"\s+", " ", str(text)).strip().lower()


def _has(text: Any, parts: list[str] | str | None) -> bool:
    wanted = [parts] if isinstance(parts, str) else parts or []
    return all(_norm(p) in _norm(text) for p in wanted)


def answer(world: World, answer: str | None, contains: list[str] | str) -> Result:
    if not answer:
        return False, "no answer was given"
    return (_has(answer, contains),
            f"the answer {'mentions' if _has(answer, contains) else 'lacks'} {contains}")


def sent(world: World, answer: str | None, to: list[str], subject: list[str] | str | None = None,
         body: list[str] | str | None = None, in_reply_to: str | None = None) -> Result:
    """A sent message to (at least) these addresses, with these words."""
    for m in world["mail"]:
        if m["folder"] == "sent" and set(to) <= {*m["to"], *m.get("cc", [])} \
                and _has(m["subject"], subject) and _has(m["body"], body) \
                and (in_reply_to is None or m.get("in_reply_to") == in_reply_to):
            return True, f"message {m['id']} was sent to {m['to']}"
    return False, f"no sent message to {to} with subject {subject!r} and body {body!r}"


def not_sent(world: World, answer: str | None, to: list[str]) -> Result:
    """No sent message to any of these addresses (the seed has none to them)."""
    wrong = [m["id"] for m in world["mail"] if m["folder"] == "sent" and set(to) & set(m["to"])]
    return not wrong, f"message(s) {wrong} were sent to {to}" if wrong else f"none to {to}"


def folder(world: World, answer: str | None, id: str, folder: str) -> Result:
    m = next((m for m in world["mail"] if m["id"] == id), None)
    if m is None:
        return False, f"message {id} is gone"
    return m["folder"] == folder, f"message {id} is in {m['folder']}"


def event(world: World, answer: str | None, title: list[str] | str | None = None,
          start: str | None = None, end: str | None = None,
          attendees: list[str] | None = None) -> Result:
    """An event with these words in its title, this start/end and (at least) these attendees."""
    for e in world["events"]:
        if _has(e["title"], title) and (start is None or e["start"] == start) \
                and (end is None or e["end"] == end) \
                and set(attendees or []) <= set(e["attendees"]):
            return True, f"event {e['id']} {e['title']!r} at {e['start']}"
    return False, f"no event {title!r} at {start} with {attendees}"


def no_event(world: World, answer: str | None, id: str | None = None,
             title: list[str] | str | None = None, start: str | None = None) -> Result:
    """No event with this id, or none with these words in its title starting at start."""
    left = [e for e in world["events"] if (id is None or e["id"] == id)
            and (title is None or _has(e["title"], title))
            and (start is None or e["start"] == start)]
    return not left, f"{[e['id'] for e in left]} still there" if left else "none left"


def invitation(world: World, answer: str | None, id: str, status: str) -> Result:
    i = next(i for i in world["invitations"] if i["id"] == id)
    return i["status"] == status, f"invitation {id} is {i['status']}"


def file(world: World, answer: str | None, path: str, contains: list[str] | str) -> Result:
    text = world["files"].get(path)
    if text is None:
        return False, f"no file {path}"
    return _has(text, contains), f"{path} {'has' if _has(text, contains) else 'lacks'} " \
                                 f"{contains}"


def todo(world: World, answer: str | None, text: list[str] | str, done: bool = False,
         due: str | None = None) -> Result:
    for t in world["todos"]:
        if _has(t["text"], text) and t["done"] == done and (due is None or t["due"] == due):
            return True, f"todo {t['id']} {t['text']!r}"
    return False, f"no {'done' if done else 'open'} todo {text!r}" + (f" due {due}" if due
                                                                        else "")


def note(world: World, answer: str | None, contains: list[str] | str) -> Result:
    for n in world["notes"]:
        if _has(n["title"] + " " + n["body"], contains):
            return True, f"note {n['id']} {n['title']!r}"
    return False, f"no note with {contains}"


CHECKS: dict[str, Callable[..., Result]] = {
    f.__name__: f for f in (answer, sent, not_sent, folder, event, no_event, invitation, file,
                            todo, note)}
