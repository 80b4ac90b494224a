"""What the scripted teacher says: replies, and policies that choose them from the conversation."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any] | str  # a JSON string is sent as is; a dict as json.dumps gives


@dataclass
class Reply:
    content: str | None = None
    tool_calls: list[ToolCall] | None = None


Messages = list[dict[str, Any]]
Tools = list[dict[str, Any]] | None
# A policy may also answer with a bare string (the content) or a mapping shaped like Reply.
Policy = Callable[[Messages, Tools], Reply | str | Mapping[str, Any]]


class PolicyError(Exception):
    """Raised by a policy to answer with an OpenAI-style error of the given HTTP status."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class ScriptExhausted(PolicyError):
    pass


def as_reply(value: Reply | str | Mapping[str, Any]) -> Reply:
    """A policy's answer as a Reply: a string is the content; a mapping has Reply's fields."""
    if isinstance(value, Reply):
        reply = value
    elif isinstance(value, str):
        reply = Reply(content=value)
    elif isinstance(value, Mapping):
        unknown = set(value) - {"content", "tool_calls"}
        if unknown:
            raise TypeError(f"a reply has content and tool_calls, not {sorted(unknown)}")
        reply = Reply(content=value.get("content"), tool_calls=value.get("tool_calls"))
    else:
        raise TypeError(f"a policy must return a Reply, a str or a mapping, not {value!r}")
    calls = [c if isinstance(c, ToolCall) else ToolCall(name=c["name"], arguments=c["arguments"])
             for c in reply.tool_calls or []]
    return Reply(content=reply.content, tool_calls=calls or None)


class ScriptedPolicy:
    """Replies in order, per conversation: each conversation (told apart by its first user
    message) starts at the top of the script, so concurrent rollouts each follow it. A
    conversation that asks for more replies than the script holds gets HTTP 400."""

    def __init__(self, replies: Sequence[Reply | str | Mapping[str, Any]]) -> None:
        self.replies = [as_reply(r) for r in replies]
        self._next: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, messages: Messages, tools: Tools) -> Reply:
        key = next((str(m.get("content")) for m in messages if m["role"] == "user"), "")
        with self._lock:
            turn = self._next.get(key, 0)
            self._next[key] = turn + 1
        if turn >= len(self.replies):
            raise ScriptExhausted(
                f"script exhausted: the conversation starting {key[:80]!r} asked for reply "
                f"{turn + 1} of a script of {len(self.replies)}")
        return self.replies[turn]


class FunctionPolicy:
    """Replies computed by `fn(messages, tools)`, e.g. a solver that reads the tool results."""

    def __init__(self, fn: Callable[[Messages, Tools], Reply | str | Mapping[str, Any]]) -> None:
        self.fn = fn

    def __call__(self, messages: Messages, tools: Tools) -> Reply:
        return as_reply(self.fn(messages, tools))


def stable_share(instance_ids: Iterable[str], share: float) -> set[str]:
    """A ``share`` of the ids, picked by a stable hash: which tasks a scripted teacher solves,
    so a run's resolved rate is known in advance and no order of concurrent rollouts changes
    it."""
    ranked = sorted(instance_ids, key=lambda i: hashlib.sha256(i.encode()).hexdigest())
    return set(ranked[:round(share * len(ranked))])
