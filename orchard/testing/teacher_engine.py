"""The teacher's generation: a policy's reply turned into exactly the tokens, text offsets and
log-probs a real model served by vLLM would report."""

from __future__ import annotations

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
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedTokenizerFast

from orchard.rollout.tokenizer import apply_template, token_bytes
from orchard.testing.policies import Messages, Policy, PolicyError, Reply, Tools, as_reply

log = logging.getLogger(__name__)

MAX_TOP_LOGPROBS = 20  # OpenAI's limit; vLLM's default limit too
ROLES = ("system", "user", "assistant", "tool")

class TeacherError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Call:
    id: str
    name: str
    arguments: str
    name_end: int  # offset in the completion text where the name is complete
    args_span: tuple[int, int]


@dataclass
class Generation:
    prompt_ids: list[int]
    ids: list[int]
    text: str  # the completion's text, without the end-of-turn token
    content: str | None
    content_span: tuple[int, int]
    calls: list[Call]
    finish_reason: str
    offsets: list[int] = field(default_factory=list)  # text length once each token is out
    logprobs: list[tuple[float, list[tuple[int, float]]]] = field(default_factory=list)


# What an image part becomes in the prompt: a vision model's chat template likewise puts
# placeholder tokens where the image's embeddings go.
IMAGE_PLACEHOLDER = "<image>"


def _text_of(content: Any, where: str) -> str | None:
    """Message content as text; a list of parts is joined the way vLLM joins text parts, an
    image part standing as IMAGE_PLACEHOLDER."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list) and all(
            isinstance(p, dict) and p.get("type") in ("text", "image_url") for p in content):
        return "\n".join(str(p.get("text", "")) if p["type"] == "text" else IMAGE_PLACEHOLDER
                         for p in content)
    raise TeacherError(400, f"{where}: content must be a string or a list of text and "
                       "image_url parts")


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


class Engine:
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
        return apply_template(self.tok, messages, tools, generation_prompt=gen)

    def _ask(self, messages: Messages, tools: Tools) -> Reply:
        try:
            return as_reply(self.policy(messages, tools))
        except PolicyError as e:
            raise TeacherError(e.status, str(e)) from None
        except Exception as e:
            # A broken policy is a test bug: say so in the error the client sees.
            log.exception("the teacher's policy failed")
            raise TeacherError(500, f"the teacher's policy failed: {e!r}") from e

    def chat(self, body: dict[str, Any]) -> Generation:
        messages, tools = _messages(body), body.get("tools") or None
        if tools is not None and not isinstance(tools, list):
            raise TeacherError(400, "tools must be a list")
        seen = _drifted(messages) if self.drift else messages
        with self._lock:
            prompt_ids = apply_template(self.tok, seen, tools, generation_prompt=True,
                                        tokenize=True)
        reply = self._ask(messages, tools)
        return self._complete(body, prompt_ids, seen, tools, reply)

    def completion(self, body: dict[str, Any]) -> Generation:
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
                  tools: Tools, reply: Reply) -> Generation:
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
                content: str | None, calls: list[tuple[str, str, str]]) -> Generation:
        with self._lock:
            ids = [*self.tok.encode(text, add_special_tokens=False), self.eos_id]
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            raise TeacherError(400, "max_tokens must be a positive integer")
        spans: list[Call] = []
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
                spans.append(Call(call_id, name, args, name_end, (start, pos)))
        start = text.find(content) if content else 0
        return Generation(
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
