"""Traces out of Orchard: JSONL (one full trace per line, the lossless form), and the public
Orchard SWE schema (``tools``, ``messages``, ``metadata``) as JSONL rows or a Hugging Face
``datasets.Dataset`` / Parquet file.

A SWE row is the conversation as the harness last sent it: the last successful chat call's
request messages plus the assistant message it got back. Earlier calls are prefixes of it for
a harness that keeps its history; token-level samples (and the drift between turns) come from
``orchard.rollout.traces.samples``, whose drift report goes into the row's metadata.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchard.rollout.traces.samples import build_samples
from orchard.rollout.traces.trace import Trace

if TYPE_CHECKING:
    import datasets

SWE_COLUMNS = ("tools", "messages", "metadata")


def _is_chat(call: dict[str, Any]) -> bool:
    return str(call.get("endpoint", "")).rstrip("/").endswith("/chat/completions")


def _succeeded(call: dict[str, Any]) -> bool:
    response = call.get("response")
    return (call.get("error") is None and call.get("status") in (None, 200)
            and isinstance(response, dict) and bool(response.get("choices")))


def last_chat_call(trace: Trace) -> dict[str, Any]:
    """The trace's last successful chat-completions call; ValueError if it has none."""
    for call in reversed(trace.model_calls):
        if _is_chat(call) and _succeeded(call):
            return call
    raise ValueError(
        f"rollout {trace.rollout_id!r} has no successful chat-completions call "
        f"({len(trace.model_calls)} model call(s) recorded), so it has no conversation to "
        "export: check that the harness used the proxy's /s/<rollout>/v1 base URL and that "
        "its calls got HTTP 200")


IMAGE_MARK = "<image>"


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        # Text parts joined as vLLM joins them for the model; an image stands as IMAGE_MARK,
        # and the row's "images" column says, in order, where each one is.
        return "\n".join((p.get("text") or "") if p.get("type", "text") == "text"
                         else IMAGE_MARK for p in content if isinstance(p, dict)
                         and p.get("type", "text") in ("text", "image_url"))
    return json.dumps(content)


def _images(messages: list[dict[str, Any]]) -> list[str]:
    """The image URLs of the messages' image parts, in order (data: URLs included)."""
    return [p["image_url"]["url"] for m in messages if isinstance(m.get("content"), list)
            for p in m["content"] if isinstance(p, dict) and p.get("type") == "image_url"]


def save_images(row: dict[str, Any], image_dir: Path, name: str) -> dict[str, Any]:
    """The row with its inline (data:) images written to ``image_dir`` as files and the
    ``images`` column holding their paths relative to its parent (a dataset's layout)."""
    paths = []
    for i, url in enumerate(row.get("images", [])):
        if url.startswith("data:image/png;base64,"):
            image_dir.mkdir(parents=True, exist_ok=True)
            target = image_dir / f"{name}-{i:03d}.png"
            target.write_bytes(base64.b64decode(url.split(",", 1)[1]))
            url = str(target.relative_to(image_dir.parent))
        paths.append(url)
    return {**row, "images": paths}


def _tool_call(tc: dict[str, Any]) -> dict[str, Any]:
    fn = tc.get("function") or {}
    args = fn.get("arguments")
    if args is None:
        args = "{}"
    elif not isinstance(args, str):
        args = json.dumps(args)
    return {"id": str(tc.get("id") or ""), "type": tc.get("type") or "function",
            "function": {"name": str(fn.get("name") or ""), "arguments": args}}


def normalise_message(message: dict[str, Any]) -> dict[str, Any]:
    """A chat message with exactly the SWE schema's keys (role, content, tool_call_id,
    tool_calls); content is a string, tool-call arguments are JSON strings."""
    return {"role": str(message.get("role", "")),
            "content": _text(message.get("content")),
            "tool_call_id": message.get("tool_call_id"),
            "tool_calls": [_tool_call(tc) for tc in message.get("tool_calls") or []]}


def swe_row(trace: Trace) -> dict[str, Any]:
    """The trace as one row of the Orchard SWE dataset schema: {tools, messages, metadata},
    tools and metadata as JSON strings."""
    call = last_chat_call(trace)
    request = call.get("request") or {}
    reply = call["response"]["choices"][0].get("message") or {"role": "assistant"}
    messages = [*request.get("messages", []), {"role": "assistant", **reply}]
    _, drifts = build_samples(trace.rollout_id, trace.model_calls)
    metadata = {
        "rollout_id": trace.rollout_id,
        "metadata": trace.metadata,
        "n_model_calls": len(trace.model_calls),
        "n_execs": len(trace.execs()),
        "model": request.get("model"),
        "drift": [asdict(d) for d in drifts],
        "started_at": trace.started_at,
        "ended_at": trace.ended_at,
    }
    row = {"tools": json.dumps(request.get("tools") or []),
           "messages": [normalise_message(m) for m in messages],
           "metadata": json.dumps(metadata)}
    if images := _images(messages):  # a multimodal rollout (the web domain's screenshots)
        row["images"] = images
    return row


# --- JSONL ----------------------------------------------------------------------------------

def write_jsonl(traces: Iterable[Trace], path: str | Path) -> int:
    """One full trace per line, written as each arrives (traces may be a generator); returns
    how many. Samples are left out: ``build_samples(t.rollout_id, t.model_calls)`` remakes
    them."""
    n = 0
    with Path(path).open("w", encoding="utf-8") as f:
        for trace in traces:
            f.write(trace.model_dump_json() + "\n")
            n += 1
    return n


def iter_jsonl(path: str | Path) -> Iterator[Trace]:
    """The traces of a write_jsonl file, one at a time."""
    with Path(path).open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield Trace.model_validate_json(line)
            except ValueError as e:
                raise ValueError(f"{path}:{lineno} is not a trace ({e}); was the file written "
                                 "by write_jsonl / `orchard trace export --format jsonl`?"
                                 ) from None


def read_jsonl(path: str | Path) -> list[Trace]:
    return list(iter_jsonl(path))


def write_swe_jsonl(traces: Iterable[Trace], path: str | Path) -> int:
    """One SWE row per line; returns how many. Rows with images get an ``images`` column of
    file paths: the images are written to ``images/`` beside the file."""
    n = 0
    path = Path(path)
    with path.open("w", encoding="utf-8") as f:
        for trace in traces:
            row = swe_row(trace)
            if "images" in row:
                row = save_images(row, path.parent / "images", trace.rollout_id)
            f.write(json.dumps(row) + "\n")
            n += 1
    return n


# --- datasets / Parquet ---------------------------------------------------------------------

def swe_features() -> datasets.Features:
    """The SWE schema's column types (explicit, so an empty or all-null column keeps its
    type and every file written agrees)."""
    from datasets import Features, List, Value

    return Features({
        "tools": Value("string"),
        "messages": List({
            "role": Value("string"),
            "content": Value("string"),
            "tool_call_id": Value("string"),
            "tool_calls": List({
                "id": Value("string"),
                "type": Value("string"),
                "function": {"name": Value("string"), "arguments": Value("string")},
            }),
        }),
        "metadata": Value("string"),
    })


def to_dataset(traces: Iterable[Trace]) -> datasets.Dataset:
    """The traces' SWE rows as a ``datasets.Dataset``; ValueError if one has no conversation.
    With any multimodal rollout the rows get an ``images`` column (its data: URLs inline, so
    the file stands alone; ``write_swe_jsonl`` writes them as files instead)."""
    from datasets import Dataset, List, Value

    rows = [swe_row(t) for t in traces]
    features = swe_features()
    if any("images" in r for r in rows):
        features["images"] = List(Value("string"))
        rows = [{"images": [], **r} for r in rows]
    return Dataset.from_list(rows, features=features)


def write_parquet(traces: Iterable[Trace], path: str | Path) -> int:
    """The traces' SWE rows as one Parquet file; returns how many rows."""
    dataset = to_dataset(traces)
    dataset.to_parquet(str(path))
    return len(dataset)
