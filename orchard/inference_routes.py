"""The OpenAI routes that make a model answer, and no other: what the recording proxy forwards
and what the local model relay lets a sandbox send. A model server's control routes (a policy
server's ``/v1/load_weights``, SGLang's and vLLM's admin endpoints) stay out of sandboxes' reach.

A route is the path after ``/v1/``.
"""

from __future__ import annotations

import re

_POSTED = frozenset({"chat/completions", "completions", "responses"})
# A model id may hold slashes (org/name) but no empty, "." or ".." segment and no escape: the
# upstream gets the path as the client wrote it, and must read it as this route and no other.
_MODELS = re.compile(r"models(/[A-Za-z0-9_:@+-][A-Za-z0-9_.:@+-]*)*")


def routes(prefix: str = "/v1/") -> str:
    """The inference routes under ``prefix``, for messages."""
    return (f"POST {prefix}chat/completions, POST {prefix}completions, POST {prefix}responses, "
            f"GET {prefix}models and GET {prefix}models/{{id}}")


def method_of(route: str) -> str | None:
    """The method an inference route takes, or None for a path that is none."""
    if route in _POSTED:
        return "POST"
    return "GET" if _MODELS.fullmatch(route) else None
