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
import codecs
import contextlib
import hashlib
import json
import logging
import math
import random
import re
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from transformers import PreTrainedTokenizerFast

from orchard.rollout.openai_wire import envelope, error_body, sse, usage
from orchard.rollout.tokenizer import TEST_TOKENIZER, load_tokenizer, token_bytes
from orchard.serving import ThreadedServer

log = logging.getLogger(__name__)

MAX_TOP_LOGPROBS = 20  # OpenAI's limit; vLLM's default limit too
ROLES = ("system", "user", "assistant", "tool")


# --- policies ---------------------------------------------------------------------------------

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


# --- generation ---------------------------------------------------------------------------------

class TeacherError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class _Call:
    id: str
    name: str
    arguments: str
    name_end: int  # offset in the completion text where the name is complete
    args_span: tuple[int, int]


@dataclass
class _Generation:
    prompt_ids: list[int]
    ids: list[int]
    text: str  # the completion's text, without the end-of-turn token
    content: str | None
    content_span: tuple[int, int]
    calls: list[_Call]
    finish_reason: str
    offsets: list[int] = field(default_factory=list)  # text length once each token is out
    logprobs: list[tuple[float, list[tuple[int, float]]]] = field(default_factory=list)


def _text_of(content: Any, where: str) -> str | None:
    """Message content as text; a list of parts is joined the way vLLM joins text parts."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         for p in content):
        return "\n".join(str(p.get("text", "")) for p in content)
    raise TeacherError(400, f"{where}: content must be a string or a list of text parts")


def _messages(body: dict[str, Any]) -> Messages:
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise TeacherError(400, "messages must be a non-empty list")
    out: Messages = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise TeacherError(400, f"messages[{i}]: role must be one of {', '.join(ROLES)}")
        msg: dict[str, Any] = {"role": m["role"],
                               "content": _text_of(m.get("content"), f"messages[{i}]")}
        if m["role"] == "assistant" and m.get("tool_calls"):
            for j, c in enumerate(m["tool_calls"]):
                f = c.get("function") if isinstance(c, dict) else None
                if not isinstance(f, dict) or not isinstance(f.get("name"), str):
                    raise TeacherError(400, f"messages[{i}].tool_calls[{j}]: needs function.name")
            msg["tool_calls"] = m["tool_calls"]
        elif msg["content"] is None:
            if m["role"] != "assistant":
                raise TeacherError(400, f"messages[{i}]: a {m['role']} message needs content")
            msg["content"] = ""
        if m["role"] == "tool" and "tool_call_id" in m:
            msg["tool_call_id"] = m["tool_call_id"]
        out.append(msg)
    return out


def _drifted(messages: Messages) -> Messages:
    """Earlier assistant turns as a lossy harness re-renders them: content stripped, tool-call
    arguments re-serialised compactly."""
    out = []
    for m in messages:
        if m["role"] == "assistant":
            m = dict(m, content=(m["content"] or "").strip() or None)
            calls = []
            for c in m.get("tool_calls") or []:
                args = c["function"].get("arguments", "{}")
                with contextlib.suppress(json.JSONDecodeError):  # not JSON: left as is
                    args = json.dumps(json.loads(args) if isinstance(args, str) else args,
                                      separators=(",", ":"))
                calls.append(dict(c, function=dict(c["function"], arguments=args)))
            if calls:
                m["tool_calls"] = calls
        out.append(m)
    return out


# A ChatML prompt sent to /v1/completions, read back into messages for the policy.
_CHATML_TURN = re.compile(r"<\|im_start\|>(\w+)\n(.*?)(?:<\|im_end\|>|$)", re.DOTALL)


class _Engine:
    def __init__(self, policy: Policy, tokenizer: PreTrainedTokenizerFast, drift: bool) -> None:
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer needs an EOS (end-of-turn) token")
        self.policy = policy
        self.tok = tokenizer
        self.drift = drift
        self.eos = tokenizer.eos_token
        self.eos_id: int = tokenizer.eos_token_id
        self.vocab_size = len(tokenizer)
        # A fast tokenizer is not safe to call from several threads at once ("Already borrowed").
        self._lock = threading.Lock()
        self._token_cache: dict[int, tuple[str, bytes]] = {}

    def token(self, token_id: int) -> tuple[str, bytes]:
        """The token's text (as vLLM decodes it alone) and its exact bytes."""
        if token_id not in self._token_cache:
            with self._lock:
                self._token_cache[token_id] = (self.tok.decode([token_id]),
                                               token_bytes(self.tok, token_id))
        return self._token_cache[token_id]

    def _render(self, messages: Messages, tools: Tools, gen: bool) -> str:
        return self.tok.apply_chat_template(messages, tools=tools, tokenize=False,
                                            add_generation_prompt=gen)

    def _ask(self, messages: Messages, tools: Tools) -> Reply:
        try:
            return as_reply(self.policy(messages, tools))
        except PolicyError as e:
            raise TeacherError(e.status, str(e)) from None
        except Exception as e:
            # A broken policy is a test bug: say so in the error the client sees.
            log.exception("the teacher's policy failed")
            raise TeacherError(500, f"the teacher's policy failed: {e!r}") from e

    def chat(self, body: dict[str, Any]) -> _Generation:
        messages, tools = _messages(body), body.get("tools") or None
        if tools is not None and not isinstance(tools, list):
            raise TeacherError(400, "tools must be a list")
        seen = _drifted(messages) if self.drift else messages
        with self._lock:
            prompt_ids = self.tok.apply_chat_template(seen, tools=tools, tokenize=True,
                                                      add_generation_prompt=True,
                                                      return_dict=False)
        reply = self._ask(messages, tools)
        return self._complete(body, prompt_ids, seen, tools, reply)

    def completion(self, body: dict[str, Any]) -> _Generation:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]  # a batch of one
        with self._lock:
            if isinstance(prompt, str):
                prompt_ids = self.tok.encode(prompt)
            elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
                if not all(0 <= t < self.vocab_size for t in prompt):
                    raise TeacherError(400, f"prompt token ids must be in [0, {self.vocab_size})")
                prompt_ids, prompt = list(prompt), self.tok.decode(prompt)
            else:
                raise TeacherError(400, "prompt must be a string or a non-empty list of token "
                                        "ids (one prompt per request)")
        turns = [(r, c) for r, c in _CHATML_TURN.findall(prompt) if r in ROLES]
        if turns and turns[-1] == ("assistant", ""):
            # A conversation rendered with the chat template: the reply is an assistant turn.
            messages = [{"role": r, "content": c} for r, c in turns[:-1]]
            return self._complete(body, prompt_ids, messages, None, self._ask(messages, None))
        reply = self._ask([{"role": "user", "content": prompt}], None)
        if reply.tool_calls:
            raise TeacherError(400, "the policy answered a plain completion with tool calls; "
                                    "send a ChatML conversation to get tool calls")
        return self._finish(body, prompt_ids, reply.content or "", reply.content, [])

    def _complete(self, body: dict[str, Any], prompt_ids: list[int], messages: Messages,
                  tools: Tools, reply: Reply) -> _Generation:
        calls = [(f"call_{uuid.uuid4().hex[:24]}", c.name,
                  c.arguments if isinstance(c.arguments, str)
                  else json.dumps(c.arguments, ensure_ascii=False))
                 for c in reply.tool_calls or []]
        turn = {"role": "assistant", "content": reply.content}
        if calls:
            turn["tool_calls"] = [{"id": i, "type": "function",
                                   "function": {"name": n, "arguments": a}} for i, n, a in calls]
        # The completion is whatever the template adds for this assistant turn after the
        # generation prompt, up to the end-of-turn token: so re-rendering the conversation with
        # the reply in it reproduces the prompt and completion exactly.
        with self._lock:
            before = self._render(messages, tools, gen=True)
            after = self._render([*messages, turn], tools, gen=False)
        end = after.rfind(self.eos)
        if not after.startswith(before) or end < len(before):
            raise TeacherError(500, "the chat template does not render an assistant turn as "
                                    "the generation prompt followed by the reply and EOS")
        text = after[len(before):end]
        return self._finish(body, prompt_ids, text, reply.content, calls)

    def _finish(self, body: dict[str, Any], prompt_ids: list[int], text: str,
                content: str | None, calls: list[tuple[str, str, str]]) -> _Generation:
        with self._lock:
            ids = [*self.tok.encode(text, add_special_tokens=False), self.eos_id]
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            raise TeacherError(400, "max_tokens must be a positive integer")
        spans: list[_Call] = []
        if max_tokens is not None and len(ids) > max_tokens:
            # Cut off mid-reply: the text so far is plain content, as a real server reports it.
            ids = ids[:max_tokens]
            with self._lock:
                text = self.tok.decode(ids, skip_special_tokens=True)
            content, finish = text, "length"
        else:
            finish = "tool_calls" if calls else "stop"
            pos = text.find(content) + len(content) if content else 0
            for call_id, name, args in calls:
                name_end = text.index(name, pos) + len(name)
                start = text.index(args, name_end)
                pos = start + len(args)
                spans.append(_Call(call_id, name, args, name_end, (start, pos)))
        start = text.find(content) if content else 0
        return _Generation(
            prompt_ids=prompt_ids, ids=ids, text=text, content=content,
            content_span=(start, start + len(content or "")), calls=spans,
            finish_reason=finish, offsets=self._offsets(ids, len(text)),
            logprobs=self._logprobs(prompt_ids, ids, _top_n(body)))

    def _offsets(self, ids: list[int], limit: int) -> list[int]:
        # A token may end inside a UTF-8 character: its text appears with the next token.
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        out, n = [], 0
        for t in ids:
            if t != self.eos_id:
                n += len(decoder.decode(self.token(t)[1]))
            out.append(min(n, limit))
        return out

    def _logprobs(self, prompt_ids: list[int], ids: list[int],
                  top_n: int) -> list[tuple[float, list[tuple[int, float]]]]:
        state = hashlib.blake2b(json.dumps(prompt_ids).encode(), digest_size=16).digest()
        out = []
        for t in ids:
            state = hashlib.blake2b(state + t.to_bytes(4, "little"), digest_size=16).digest()
            # The chosen token gets p >= 0.6, so it is the most likely one; the alternatives
            # share the rest in halves, so the probabilities sum to less than 1.
            chosen = -(0.001 + 0.5 * int.from_bytes(state[:8], "little") / 2**64)
            rest = 1 - math.exp(chosen)
            rng = random.Random(state)
            alts = [a for a in rng.sample(range(self.vocab_size), top_n) if a != t][:top_n - 1]
            top = [(t, chosen)] if top_n else []
            top += [(a, math.log(rest / 2 ** (k + 1))) for k, a in enumerate(alts)]
            out.append((chosen, top))
        return out


def _top_n(body: dict[str, Any]) -> int:
    # Chat: logprobs is a bool and top_logprobs a count; legacy completions: logprobs is a count.
    n = body.get("top_logprobs") if "messages" in body else body.get("logprobs")
    if n is None or isinstance(n, bool):
        return 0
    if not isinstance(n, int) or not 0 <= n <= MAX_TOP_LOGPROBS:
        raise TeacherError(400, f"top_logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}]")
    return n


# --- wire format ----------------------------------------------------------------------------------

def _wants_logprobs(body: dict[str, Any]) -> bool:
    if "messages" in body:
        return bool(body.get("logprobs"))
    return body.get("logprobs") is not None


def _chat_logprob_entries(engine: _Engine, gen: _Generation, lo: int, hi: int) -> list[dict]:
    out = []
    for t, (lp, top) in zip(gen.ids[lo:hi], gen.logprobs[lo:hi], strict=True):
        text, raw = engine.token(t)
        out.append({"token": text, "logprob": lp, "bytes": list(raw),
                    "top_logprobs": [{"token": engine.token(a)[0], "logprob": alp,
                                      "bytes": list(engine.token(a)[1])} for a, alp in top]})
    return out


def _usage(gen: _Generation) -> dict[str, int]:
    return usage(len(gen.prompt_ids), len(gen.ids))


def _chat_response(engine: _Engine, gen: _Generation, body: dict[str, Any],
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


def _chat_chunks(engine: _Engine, gen: _Generation, body: dict[str, Any],
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


def _completion_logprobs(engine: _Engine, gen: _Generation, lo: int, hi: int) -> dict[str, Any]:
    starts = [0, *gen.offsets][lo:hi]
    return {"tokens": [engine.token(t)[0] for t in gen.ids[lo:hi]],
            "token_logprobs": [lp for lp, _ in gen.logprobs[lo:hi]],
            "top_logprobs": [{engine.token(a)[0]: alp for a, alp in top}
                             for _, top in gen.logprobs[lo:hi]],
            "text_offset": starts}


def _completion_response(engine: _Engine, gen: _Generation, body: dict[str, Any],
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


def _completion_chunks(engine: _Engine, gen: _Generation, body: dict[str, Any],
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
    engine = _Engine(policy, tokenizer, drift)
    app = FastAPI(title="orchard teacher")
    app.state.faults = faults = Faults()

    @app.exception_handler(TeacherError)
    async def _teacher_error(_: Request, e: TeacherError) -> JSONResponse:
        return JSONResponse(error_body(e.status, str(e)), status_code=e.status)

    async def generate(request: Request, make: Callable[[dict[str, Any]], _Generation],
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
        prog="python -m orchard.rollout.teacher",
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
