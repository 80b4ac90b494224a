"""A scripted OpenAI-compatible model server (the "teacher") for tests and demos.

It speaks the real protocol over real HTTP, the way vLLM does: chat and legacy completions,
streaming (SSE) or not, tool calls, log-probs, and vLLM's `return_token_ids` extension. What it
says comes from a policy (a script, or a function of the conversation); the tokens it reports are
exactly the given tokenizer's: the prompt is `apply_chat_template(messages, tools=tools,
add_generation_prompt=True)` and the completion is the encoding of the reply rendered the way the
chat template renders an assistant turn, then the end-of-turn token. So a client that sends the
conversation back gets a prompt that extends the previous prompt and completion token for token,
as with a real model, unless the server runs with `drift=True`, which re-renders earlier
assistant turns the lossy way some harnesses do.

Log-probs are deterministic (hashed from the tokens so far) and form a valid distribution in
which the chosen token is the most likely one, as in greedy decoding.

    with TeacherServer(ScriptedPolicy(["Hello!"]), load_tokenizer(TEST_TOKENIZER)) as t:
        client = openai.OpenAI(base_url=f"{t.url}/v1", api_key="none")
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from transformers import PreTrainedTokenizerFast

from orchard.rollout.proxy.wire import envelope, error_body, sse, usage
from orchard.rollout.tokenizer import TEST_TOKENIZER, load_tokenizer
from orchard.serving import ThreadedServer
from orchard.testing.policies import (
    FunctionPolicy,
    Policy,
    PolicyError,
    Reply,
    ScriptedPolicy,
    ScriptExhausted,
    ToolCall,
)
from orchard.testing.teacher_engine import Engine, Generation, TeacherError

# The policies are the teacher's public API too: TeacherServer(ScriptedPolicy([...])).
__all__ = ["FunctionPolicy", "Policy", "PolicyError", "Reply", "ScriptExhausted",
           "ScriptedPolicy", "TeacherServer", "ToolCall", "create_teacher_app"]

log = logging.getLogger(__name__)



# --- wire format ----------------------------------------------------------------------------------

def _wants_logprobs(body: dict[str, Any]) -> bool:
    if "messages" in body:
        return bool(body.get("logprobs"))
    return body.get("logprobs") is not None


def _chat_logprob_entries(engine: Engine, gen: Generation, lo: int, hi: int) -> list[dict]:
    out = []
    for t, (lp, top) in zip(gen.ids[lo:hi], gen.logprobs[lo:hi], strict=True):
        text, raw = engine.token(t)
        out.append({"token": text, "logprob": lp, "bytes": list(raw),
                    "top_logprobs": [{"token": engine.token(a)[0], "logprob": alp,
                                      "bytes": list(engine.token(a)[1])} for a, alp in top]})
    return out


def _usage(gen: Generation) -> dict[str, int]:
    return usage(len(gen.prompt_ids), len(gen.ids))


def _chat_response(engine: Engine, gen: Generation, body: dict[str, Any],
                   model: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": gen.content}
    if gen.calls:
        message["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}}
                                 for c in gen.calls]
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": gen.finish_reason,
                              "logprobs": None}
    if _wants_logprobs(body):
        choice["logprobs"] = {"content": _chat_logprob_entries(engine, gen, 0, len(gen.ids))}
    out = {**envelope("chat.completion", model), "choices": [choice], "usage": _usage(gen)}
    if body.get("return_token_ids"):
        out["prompt_token_ids"] = gen.prompt_ids
        choice["token_ids"] = gen.ids
    return out


def _overlap(lo: int, hi: int, span: tuple[int, int]) -> tuple[int, int] | None:
    a, b = max(lo, span[0]), min(hi, span[1])
    return (a, b) if a < b else None


def _chat_chunks(engine: Engine, gen: Generation, body: dict[str, Any],
                 model: str) -> Iterator[dict[str, Any]]:
    """One chunk per token, as vLLM streams: its text lands in `content` or in a tool call's
    `arguments`; a call's id and name come once its name is complete; markup tokens give an
    empty delta (but still their token id and log-prob)."""
    base = envelope("chat.completion.chunk", model)
    first: dict[str, Any] = {**base, "choices": [{"index": 0, "logprobs": None,
                                                  "delta": {"role": "assistant", "content": ""},
                                                  "finish_reason": None}]}
    if body.get("return_token_ids"):
        first["prompt_token_ids"] = gen.prompt_ids
    yield first
    announced: set[int] = set()
    prev = 0
    for j, end in enumerate(gen.offsets):
        delta: dict[str, Any] = {}
        if (span := _overlap(prev, end, gen.content_span)) is not None:
            delta["content"] = gen.text[span[0]:span[1]]
        calls = []
        for i, call in enumerate(gen.calls):
            entry: dict[str, Any] = {"index": i}
            if i not in announced and end >= call.name_end:
                announced.add(i)
                entry.update(id=call.id, type="function",
                             function={"name": call.name, "arguments": ""})
            if (span := _overlap(prev, end, call.args_span)) is not None:
                entry.setdefault("function", {})["arguments"] = gen.text[span[0]:span[1]]
            if len(entry) > 1:
                calls.append(entry)
        if calls:
            delta["tool_calls"] = calls
        prev = end
        last = j == len(gen.ids) - 1
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None,
                                  "finish_reason": gen.finish_reason if last else None}
        if _wants_logprobs(body):
            choice["logprobs"] = {"content": _chat_logprob_entries(engine, gen, j, j + 1)}
        if body.get("return_token_ids"):
            choice["token_ids"] = [gen.ids[j]]
        yield {**base, "choices": [choice]}
    if (body.get("stream_options") or {}).get("include_usage"):
        yield {**base, "choices": [], "usage": _usage(gen)}


def _completion_logprobs(engine: Engine, gen: Generation, lo: int, hi: int) -> dict[str, Any]:
    starts = [0, *gen.offsets][lo:hi]
    return {"tokens": [engine.token(t)[0] for t in gen.ids[lo:hi]],
            "token_logprobs": [lp for lp, _ in gen.logprobs[lo:hi]],
            "top_logprobs": [{engine.token(a)[0]: alp for a, alp in top}
                             for _, top in gen.logprobs[lo:hi]],
            "text_offset": starts}


def _completion_response(engine: Engine, gen: Generation, body: dict[str, Any],
                         model: str) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "text": gen.text, "finish_reason": gen.finish_reason,
                              "logprobs": None}
    if _wants_logprobs(body):
        choice["logprobs"] = _completion_logprobs(engine, gen, 0, len(gen.ids))
    if body.get("return_token_ids"):
        # vLLM reports token ids per choice for completions (a request may batch prompts).
        choice["prompt_token_ids"] = gen.prompt_ids
        choice["token_ids"] = gen.ids
    return {**envelope("text_completion", model), "choices": [choice], "usage": _usage(gen)}


def _completion_chunks(engine: Engine, gen: Generation, body: dict[str, Any],
                       model: str) -> Iterator[dict[str, Any]]:
    base = envelope("text_completion", model)
    prev = 0
    for j, end in enumerate(gen.offsets):
        last = j == len(gen.ids) - 1
        choice: dict[str, Any] = {"index": 0, "text": gen.text[prev:end], "logprobs": None,
                                  "finish_reason": gen.finish_reason if last else None}
        prev = end
        if _wants_logprobs(body):
            choice["logprobs"] = _completion_logprobs(engine, gen, j, j + 1)
        if body.get("return_token_ids"):
            choice["token_ids"] = [gen.ids[j]]
            if j == 0:
                choice["prompt_token_ids"] = gen.prompt_ids
        yield {**base, "choices": [choice]}
    if (body.get("stream_options") or {}).get("include_usage"):
        yield {**base, "choices": [], "usage": _usage(gen)}


# --- the app ------------------------------------------------------------------------------------

class Faults:
    """Errors to answer the next generation requests with, in order, before asking the policy."""

    def __init__(self) -> None:
        self._queue: deque[tuple[int, Any]] = deque()
        self._lock = threading.Lock()

    def add(self, status: int, body: str | dict[str, Any] | None = None, times: int = 1) -> None:
        """`body`: a message (wrapped as an OpenAI error), a whole JSON body, or None."""
        with self._lock:
            self._queue.extend([(status, body)] * times)

    def take(self) -> JSONResponse | None:
        with self._lock:
            if not self._queue:
                return None
            status, body = self._queue.popleft()
        if not isinstance(body, dict):
            body = error_body(status, body or f"injected error {status}")
        return JSONResponse(body, status_code=status)


def create_teacher_app(policy: Policy, tokenizer: PreTrainedTokenizerFast,
                       model_name: str = "teacher", drift: bool = False) -> FastAPI:
    """The OpenAI-compatible app; `app.state.faults` (a `Faults`) injects errors."""
    engine = Engine(policy, tokenizer, drift)
    app = FastAPI(title="orchard teacher")
    app.state.faults = faults = Faults()

    @app.exception_handler(TeacherError)
    async def _teacher_error(_: Request, e: TeacherError) -> JSONResponse:
        return JSONResponse(error_body(e.status, str(e)), status_code=e.status)

    async def generate(request: Request, make: Callable[[dict[str, Any]], Generation],
                       respond: Callable[..., dict[str, Any]],
                       stream: Callable[..., Iterator[dict[str, Any]]]) -> Response:
        if (fault := faults.take()) is not None:
            return fault
        try:
            body = await request.json()
        except ValueError:
            raise TeacherError(400, "the request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise TeacherError(400, "the request body must be a JSON object")
        if body.get("model", model_name) != model_name:
            raise TeacherError(404, f"the model {body.get('model')!r} does not exist; "
                                    f"this server serves {model_name!r}")
        if body.get("n", 1) != 1:
            raise TeacherError(400, "the teacher answers with one choice: n must be 1")
        # The policy may be slow (a solver), so it runs off the event loop.
        gen = await run_in_threadpool(make, body)
        if body.get("stream"):
            return StreamingResponse(sse(stream(engine, gen, body, model_name)),
                                     media_type="text/event-stream")
        return JSONResponse(respond(engine, gen, body, model_name))

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                            "owned_by": "orchard",
                                            "max_model_len": tokenizer.model_max_length}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await generate(request, engine.chat, _chat_response, _chat_chunks)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await generate(request, engine.completion, _completion_response,
                              _completion_chunks)

    return app


class TeacherServer(ThreadedServer):
    """The teacher on 127.0.0.1 in a background thread; a context manager giving itself, with
    `.url` (the base URL: the OpenAI client's is `url + "/v1"`)."""

    def __init__(self, policy: Policy, tokenizer: PreTrainedTokenizerFast,
                 model_name: str = "teacher", drift: bool = False,
                 fail_next: Sequence[tuple[int, str | dict[str, Any] | None]] = ()) -> None:
        super().__init__(create_teacher_app(policy, tokenizer, model_name, drift),
                         name="orchard-teacher")
        self.model_name = model_name
        for status, body in fail_next:
            self.fail_next(status, body)

    def fail_next(self, status: int, body: str | dict[str, Any] | None = None,
                  times: int = 1) -> None:
        """Answer the next `times` generation requests with this HTTP status and error."""
        self.app.state.faults.add(status, body, times)

    def __enter__(self) -> TeacherServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m orchard.testing.teacher",
        description="Serve a scripted OpenAI-compatible model (the teacher).")
    parser.add_argument("script", type=Path,
                        help="JSON list of replies: strings, or {content, tool_calls}")
    parser.add_argument("--tokenizer", default=str(TEST_TOKENIZER))
    parser.add_argument("--model-name", default="teacher")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--drift", action="store_true",
                        help="re-render earlier assistant turns lossily (stripped content, "
                             "compact tool arguments), so prompts stop extending each other")
    args = parser.parse_args(argv)
    replies = json.loads(args.script.read_text())
    app = create_teacher_app(ScriptedPolicy(replies), load_tokenizer(args.tokenizer),
                             args.model_name, args.drift)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
