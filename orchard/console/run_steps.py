"""A trace's steps as the run pages show them: for a model call the messages it added to
the conversation, the answer and its tokens' log-probs; for a sandbox event what it did.
Texts are cut to a size a page can hold, and only inline images are ever shown."""

from __future__ import annotations

import base64
import binascii
import json
import re
import shlex
from typing import Any

from orchard.env.schema import SandboxEvent
from orchard.rollout.proxy.recorder import ModelCall
from orchard.rollout.traces.export import normalise_message
from orchard.rollout.traces.trace import Trace

# Text shown per message, patch or file write; the rest is counted, not shown.
MAX_TEXT = 20_000
# Completion tokens shown one by one with their log-probs; a longer answer is shown as text.
MAX_TOKEN_SPANS = 2_000
# Inline screenshots only: a data: URL of a raster type, never a remote URL.
IMAGE_DATA = re.compile(r"data:image/(?:png|jpeg|webp);base64,[A-Za-z0-9+/=\s]*")
MAX_IMAGE_CHARS = 8 * 1024 * 1024


def _cut(text: str) -> dict[str, Any]:
    return {"kind": "text", "text": text[:MAX_TEXT], "cut": max(0, len(text) - MAX_TEXT)}


def _image(url: str, step: int) -> dict[str, Any]:
    if len(url) <= MAX_IMAGE_CHARS and IMAGE_DATA.fullmatch(url):
        return {"kind": "image", "src": url, "alt": f"screenshot at step {step}"}
    shown = url[:120] + ("..." if len(url) > 120 else "")
    return {"kind": "note", "text": f"image not shown (only inline PNG, JPEG or WebP data "
            f"URLs under {MAX_IMAGE_CHARS // 2**20} MiB are): {shown}"}


def _parts(content: Any, step: int) -> list[dict[str, Any]]:
    if content is None or content == "":
        return []
    if isinstance(content, str):
        return [_cut(content)]
    if not isinstance(content, list):
        return [_cut(json.dumps(content, indent=2))]
    parts = []
    for p in content:
        if isinstance(p, dict) and p.get("type") in ("text", "input_text", "output_text"):
            parts.append(_cut(str(p.get("text") or "")))
        elif isinstance(p, dict) and p.get("type") in ("image_url", "input_image"):
            image = p.get("image_url")
            parts.append(_image(str(image.get("url") if isinstance(image, dict) else image),
                                step))
        else:
            parts.append(_cut(json.dumps(p, indent=2)))
    return parts


def _message(m: Any, step: int) -> dict[str, Any]:
    if not isinstance(m, dict):
        return {"role": "?", "parts": [_cut(json.dumps(m))], "tool_calls": []}
    calls = []
    for tc in m.get("tool_calls") or []:
        # Chat tool calls nest under "function"; a Responses function_call item does not.
        fn = tc.get("function") if isinstance(tc, dict) else None
        fn = fn if isinstance(fn, dict) else tc if isinstance(tc, dict) else {}
        calls.append((str(fn.get("name") or "?"), _pretty(fn.get("arguments"))))
    return {"role": str(m.get("role") or m.get("type") or "?"),
            "parts": _parts(m.get("content"), step), "tool_calls": calls,
            "tool_call_id": m.get("tool_call_id")}


def _pretty(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return arguments
    return json.dumps(arguments, indent=2, ensure_ascii=False)


def _sent(call: ModelCall) -> list[Any]:
    """What the call sent, as messages: chat messages, a Responses input, or a prompt."""
    request = call.get("request")
    if not isinstance(request, dict):
        return [{"role": "request", "content": str(request)}] if request else []
    if isinstance(request.get("messages"), list):
        return request["messages"]
    given = request.get("input", request.get("prompt"))
    if isinstance(given, list) and all(isinstance(x, dict) for x in given):
        return given
    return [{"role": "prompt", "content": given if isinstance(given, str)
             else json.dumps(given)}] if given is not None else []


def _choice(call: ModelCall) -> dict[str, Any]:
    response = call.get("response")
    choices = response.get("choices") if isinstance(response, dict) else None
    return choices[0] if isinstance(choices, list) and choices and isinstance(
        choices[0], dict) else {}


def _answer(call: ModelCall) -> dict[str, Any] | None:
    choice, response = _choice(call), call.get("response")
    if isinstance(choice.get("message"), dict):
        return {"role": "assistant", **choice["message"]}
    if "text" in choice:
        return {"role": "assistant", "content": choice["text"]}
    if isinstance(response, dict) and isinstance(response.get("output"), list):
        texts = [c.get("text", "") for o in response["output"] if isinstance(o, dict)
                 for c in o.get("content") or [] if isinstance(c, dict)]
        calls = [o for o in response["output"] if isinstance(o, dict)
                 and o.get("type") == "function_call"]
        return {"role": "assistant", "content": "\n".join(texts), "tool_calls": calls}
    return None


def _same(m: Any) -> str:
    """A message's identity across calls: a harness re-sends the reply it got, maybe with
    fields the answer lacked, so only what the model reads is compared."""
    if not isinstance(m, dict):
        return json.dumps(m, sort_keys=True, default=str)
    return json.dumps({**normalise_message(m), "content": m.get("content")},
                      sort_keys=True, default=str)


def _logprobs(call: ModelCall, choice: dict[str, Any]) -> tuple[list[tuple[str, float]], int]:
    """Each completion token with its log-prob, and how many there were in all."""
    given = choice.get("logprobs")
    pairs: list[tuple[str, float]] = []
    if isinstance(given, dict) and isinstance(given.get("content"), list):
        pairs = [(str(t.get("token", "")), t.get("logprob")) for t in given["content"]
                 if isinstance(t, dict)]
    elif isinstance(given, dict) and isinstance(given.get("tokens"), list):
        pairs = list(zip(map(str, given["tokens"]), given.get("token_logprobs") or [],
                         strict=False))
    elif isinstance(tokens := call.get("tokens"), dict) and tokens.get("completion_logprobs"):
        # Ids only (a rendered call): the id stands for the token's text.
        pairs = [(f"[{i}]", lp) for i, lp in zip(tokens.get("completion_ids") or [],
                                                 tokens["completion_logprobs"], strict=False)]
    pairs = [(t, float(lp)) for t, lp in pairs if isinstance(lp, int | float)]
    return pairs[:MAX_TOKEN_SPANS], len(pairs)


def model_step(calls: list[ModelCall], index: int, step: int) -> dict[str, Any]:
    call = calls[index]
    sent = _sent(call)
    seen: list[Any] = []
    if index > 0:
        before = calls[index - 1]
        seen = [*_sent(before), *([a] if (a := _answer(before)) else [])]
    new_from = 0
    while (new_from < min(len(sent), len(seen))
           and _same(sent[new_from]) == _same(seen[new_from])):
        new_from += 1
    choice = _choice(call)
    response = call.get("response")
    usage = response.get("usage") if isinstance(response, dict) else None
    usage = usage if isinstance(usage, dict) else {}
    answer = _answer(call)
    tokens, n_tokens = _logprobs(call, choice)
    error = call.get("error")
    return {"call": call.get("index", index), "endpoint": call.get("endpoint"),
            "status": call.get("status"), "latency_ms": call.get("latency_ms"),
            "new_from": new_from, "rewritten": new_from < len(seen) and index > 0,
            "messages": [_message(m, step) for m in sent[new_from:]],
            "answer": _message(answer, step) if answer else None,
            "finish": choice.get("finish_reason"),
            "prompt_tokens": usage.get("prompt_tokens", usage.get("input_tokens")),
            "completion_tokens": usage.get("completion_tokens", usage.get("output_tokens")),
            "tokens": tokens, "n_tokens": n_tokens,
            "error": None if error is None else _pretty(error)}


def _digest(out: Any) -> str | None:
    if not isinstance(out, dict):
        return None
    sha = out.get("sha256")
    return f"{out.get('bytes')} bytes, sha256 {sha[:16] if sha else 'not kept'}"


def _kept(d: dict[str, Any]) -> dict[str, Any] | None:
    """A file write's or stdin's content when the log kept it and it is text."""
    raw = d.get("content_b64")
    if not raw:
        return None
    try:
        return _cut(base64.b64decode(raw).decode("utf-8"))
    except (binascii.Error, ValueError):
        return {"kind": "note", "text": "binary content (not shown)"}


def event_step(event: SandboxEvent) -> dict[str, Any]:
    d, kind = event.data, event.kind.value
    facts: list[tuple[str, Any]] = []
    texts: list[tuple[str, dict[str, Any]]] = []
    if kind in ("exec", "process"):
        argv = [str(a) for a in d.get("argv") or []]
        if d.get("command") is not None:
            texts.append(("command", _cut(str(d["command"]))))
        elif argv and "\n" in argv[-1]:
            # A script passed to a shell: quoted into one line it could not be read.
            facts.append(("argv before the script", shlex.join(argv[:-1])))
            texts.append(("script (the last argument)", _cut(argv[-1])))
        else:
            texts.append(("command", _cut(shlex.join(argv))))
        facts += [("exit code", d.get("exit_code")), ("timed out", d.get("timed_out")),
                  ("duration", f"{d['duration_ms']:.0f} ms" if isinstance(
                      d.get("duration_ms"), int | float) else None),
                  ("cwd", d.get("cwd")), ("error", d.get("error")),
                  ("stdout", _digest(d.get("stdout"))), ("stderr", _digest(d.get("stderr"))),
                  ("process", d.get("process_id"))]
        if isinstance(d.get("stdin"), dict) and (stdin := _kept(d["stdin"])):
            texts.append(("stdin", stdin))
    elif kind == "file_write":
        facts += [("path", d.get("path")), ("size", d.get("size")), ("mode", d.get("mode"))]
        content = _kept(d)
        texts.append(("content", content or {"kind": "note", "text": "content not kept "
                                              "(over the event log's content limit)"}))
    elif kind == "patch":
        facts += [("applied", d.get("success")), ("method", d.get("method")),
                  ("exit code", d.get("exit_code")), ("cwd", d.get("cwd"))]
        texts.append(("patch", _cut(str(d.get("patch") or ""))))
    elif kind == "created":
        facts += [(k, d.get(k)) for k in ("image", "cpu", "memory", "block_network", "pool")]
    else:
        facts += [(k, v if isinstance(v, str | int | float | bool) else json.dumps(v))
                  for k, v in d.items()]
    return {"kind": kind, "sandbox": event.sandbox_id, "seq": event.seq,
            "facts": [(k, v) for k, v in facts if v is not None and v != ""],
            "texts": texts}


def steps(trace: Trace, offset: int, limit: int) -> list[dict[str, Any]]:
    """The trace's timeline from ``offset``: at most ``limit`` steps, numbered from 1."""
    shown = []
    for n, s in enumerate(trace.timeline[offset:offset + limit], offset + 1):
        view: dict[str, Any] = {"n": n, "time": s.time, "source": s.source,
                                "summary": s.summary}
        if s.source == "model" and 0 <= s.index < len(trace.model_calls):
            view["model"] = model_step(trace.model_calls, s.index, n)
        elif s.source == "sandbox" and 0 <= s.index < len(trace.sandbox_events):
            view["event"] = event_step(trace.sandbox_events[s.index])
        shown.append(view)
    return shown


def session_summary(calls: list[ModelCall]) -> dict[str, Any]:
    tokens = 0
    for c in calls:
        usage = (c.get("response") or {}).get("usage") if isinstance(
            c.get("response"), dict) else None
        if isinstance(usage, dict):
            tokens += int(usage.get("total_tokens") or 0)
    return {"calls": len(calls), "tokens": tokens,
            "errors": sum(1 for c in calls if c.get("error") is not None),
            "started_at": min((c["started_at"] for c in calls if c.get("started_at")),
                              default=None)}
