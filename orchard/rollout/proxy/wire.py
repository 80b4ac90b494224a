"""The OpenAI wire format pieces that Orchard's servers share: error bodies, the completion
envelopes and usage blocks, and server-sent events.

The scripted teacher, the recording proxy and the policy server each speak this protocol;
building its shapes in one place keeps them answering harnesses alike.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any


def error_type(status: int) -> str:
    """OpenAI's error ``type`` for an HTTP status."""
    return {400: "invalid_request_error", 401: "authentication_error",
            403: "permission_error", 404: "not_found_error", 429: "rate_limit_error"}.get(
        status, "server_error" if status >= 500 else "invalid_request_error")


def error_body(status: int, message: str, kind: str | None = None) -> dict[str, Any]:
    """An OpenAI-style error body (vLLM also puts the status in ``code``); ``kind`` overrides
    the type a status implies (the proxy marks its own errors so)."""
    return {"error": {"message": message, "type": kind or error_type(status), "param": None,
                      "code": status}}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def envelope(kind: str, model: str) -> dict[str, Any]:
    """The fields every response or chunk of ``kind`` starts with: ``chat.completion``,
    ``chat.completion.chunk`` or ``text_completion``."""
    prefix = "chatcmpl" if kind.startswith("chat.") else "cmpl"
    return {"id": f"{prefix}-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()),
            "model": model}


def sse(chunks: Iterator[dict[str, Any]]) -> Iterator[str]:
    """Chunks as server-sent events, ended the way OpenAI ends a stream."""
    for chunk in chunks:
        yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
    yield "data: [DONE]\n\n"
