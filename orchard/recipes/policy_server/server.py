"""Serving the policy being trained: vLLM's `/v1/completions` with token-id prompts, on CPU.

The recording proxy renders chat requests with the model's chat template into token ids
(`orchard proxy --render-with DIR`, see orchard/rollout/proxy/render.py), sends them here with
`logprobs=1, return_token_ids=True` and turns the answer back into a chat answer, so the whole
harness <-> proxy <-> policy path records the exact tokens and log-probs. On GPUs, vLLM and
SGLang serve the same endpoint and the same proxy flag works against them.

What a request may carry: `prompt` (token ids, or a string tokenized without special tokens;
one prompt per request), `max_tokens` (default 256, capped at the server's limit), `temperature`
(0 is greedy), `top_p`, `top_k`, `seed` (the same seed gives the same sample), `stop_token_ids`,
`ignore_eos`, `logprobs` (an int) and `return_token_ids`. Generation stops at the tokenizer's EOS
(the end-of-turn token for chat models, e.g. <|im_end|>) or a stop token id; as in vLLM, the
answer's `token_ids` include that token and its `text` does not.

Log-probs, as vLLM's default `raw_logprobs`: `token_logprobs[i]` is the log-probability of the
generated token under the model's raw distribution (log-softmax of the float32 logits, at
temperature 1, before top-k/top-p), whatever sampling settings chose it. They equal a full
forward pass over prompt + completion, up to float error. PPO uses them as the old log-probs,
so the trainer must compute its new ones the same way (raw logits, same dtype: bf16 models
differ between a cached and a full forward by more than float32 ones); sampling at a temperature
other than 1 or with top-p/top-k makes the behaviour policy differ from these log-probs.

Requests that overlap decode together (orchard/recipes/policy_server/batching.py): up to
``max_batch`` (8) waiting requests form one batch, each row with its own sampling settings and
seed, and each answers what it would alone, up to float error. ``max_batch=1`` decodes one at a
time.

A rollout's next prompt extends its last one (prompt + completion + observation), so the server
keeps the keys and values of the sequences it decoded (orchard/recipes/policy_server/
prefix_cache.py): a prompt that starts with one runs only the rest through the model. At most
``max_cached_tokens`` tokens (16384; 0 turns it off) are kept, least recently used first out;
that is 2 KiB a token for the tiny test Llama, 45 KiB for SmolLM2-135M in float32. New weights
clear them. Answers are the same as without the cache, up to float error (same seed, same
tokens; log-probs within 1e-4 of a full forward pass, tests/test_policy_server_cache.py).
On multi-turn rollouts (bench/kv_reuse.py: a 35 M Llama, 3 rollouts of 6 turns, prompts up
to 2023 tokens, 2 CPUs) it saved 79% of the prompt tokens and gave 2.69x the tokens/s per
rollout; SmolLM2-135M 1.92x.

Weights change between RL steps: :meth:`PolicyServer.update` (in-process) or
`POST /v1/load_weights {"path": DIR}` (a trainer in another process saves a model folder, see
orchard/recipes/models.py) swap them once the generation in flight is done, and bump the
`weights_version` that `GET /v1/weights` and `/v1/models` report; no batch sees two
versions. Loading weights takes the server's admin key (`--admin-key` or ORCHARD_POLICY_KEY;
`PolicyServer.admin_key`, random, in-process), sent as `X-API-Key` or `Authorization: Bearer`:
it makes the server read any folder it can see and serve what it holds. On GPUs, vLLM and
SGLang take new weights through their own APIs instead (vLLM: `/collective_rpc` to reload, or a
restart on the new checkpoint; SGLang: `/update_weights_from_disk`).

    with PolicyServer(tiny_llama(tok), tok) as server:
        proxy = ProxySettings(upstreams=[server.url], store=..., render_with=TOKENIZER_DIR)

    ORCHARD_POLICY_KEY=... python -m orchard.recipes.policy_server.server --model DIR --port 8000
"""

from __future__ import annotations

import argparse
import codecs
import os
import random
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerFast

from orchard.http_guard import HostOriginGuard
from orchard.recipes.loss import pad_id_of
from orchard.recipes.models import load_policy, served_weights
from orchard.recipes.policy_server.batching import Batcher, Generation, Job
from orchard.rollout.proxy.wire import envelope, error_body, usage
from orchard.rollout.tokenizer import token_bytes
from orchard.serving import ThreadedServer, admin_key_refusal, new_admin_key

DEFAULT_MAX_TOKENS = 256
DEFAULT_MAX_CACHED_TOKENS = 16384
ADMIN_KEY_ENV = "ORCHARD_POLICY_KEY"
MAX_LOGPROBS = 20  # vLLM's default limit, and OpenAI's
# Request fields this server does not implement, with the values that leave them off: a request
# that turns one on gets a 400 instead of a sample from some other sampler than it asked for.
_UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "n": (None, 1), "best_of": (None, 1), "stream": (None, False), "echo": (None, False),
    "suffix": (None, ""), "stop": (None, "", []), "logit_bias": (None, {}), "min_p": (None, 0),
    "min_tokens": (None, 0), "presence_penalty": (None, 0), "frequency_penalty": (None, 0),
    "repetition_penalty": (None, 1), "prompt_logprobs": (None,), "use_beam_search": (None, False),
}


class RequestError(Exception):
    """A request the server cannot answer; `status` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class CompletionRequest(BaseModel):
    """The sampling fields of a `/v1/completions` body (the prompt is checked separately)."""

    model_config = ConfigDict(strict=True, extra="ignore")

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    seed: int | None = Field(None, ge=-2**63, le=2**64 - 1)  # what torch takes
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    return_token_ids: bool | None = None


class PolicyEngine:
    """The model and its tokenizer: requests decoded in batches of up to ``max_batch``
    (``batching.Batcher``; 1 decodes them one at a time), reusing up to ``max_cached_tokens``
    of earlier sequences' keys and values (``prefix_cache.PrefixCache``; 0 turns it off), weight
    updates between batches."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, *,
                 model_name: str = "policy", max_new_tokens_limit: int = 1024,
                 seed: int = 0, max_batch: int = 8,
                 max_cached_tokens: int = DEFAULT_MAX_CACHED_TOKENS) -> None:
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no EOS (end-of-turn) token to stop at")
        if max_new_tokens_limit < 1:
            raise ValueError(f"max_new_tokens_limit must be at least 1, not "
                             f"{max_new_tokens_limit}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.max_new_tokens_limit = max_new_tokens_limit
        self.vocab_size: int = model.get_input_embeddings().num_embeddings
        self.max_positions: int = model.config.max_position_embeddings
        self.weights_version = 0
        self.loaded_from: str | None = None
        self._lock = threading.Lock()  # the tokenizer is not safe to share between threads
        # Seeds for requests that bring none: the server's seed makes a run repeatable.
        self._seeds = random.Random(seed)
        self.batcher = Batcher(self.model, pad_id_of(self.model), max_batch=max_batch,
                               max_cached_tokens=max_cached_tokens)

    def close(self) -> None:
        self.batcher.close()

    # --- weights ---

    def update(self, weights: torch.nn.Module | Mapping[str, torch.Tensor]) -> int:
        """Copy in new weights (a model of the same architecture, or its state dict) once the
        generation in flight is done; returns the new weights version."""
        # A LoRA model is served merged: the server holds plain weights.
        state = served_weights(weights) if isinstance(weights, torch.nn.Module) else weights
        with self.batcher.lock:
            current = self.model.state_dict()
            # Checked first: load_state_dict copies what fits before it reports what does not.
            missing = sorted(current.keys() - state.keys())
            unexpected = sorted(state.keys() - current.keys())
            wrong = sorted(k for k in current.keys() & state.keys()
                           if tuple(current[k].shape) != tuple(state[k].shape))
            if missing or unexpected or wrong:
                raise ValueError(
                    "these weights do not fit the served model (another architecture or size?): "
                    f"missing {missing[:3]}, unexpected {unexpected[:3]}, "
                    f"other shapes {wrong[:3]}")
            self.model.load_state_dict(state)
            # Cached keys and values came from the old weights.
            self.batcher.prefix.clear()
            self.weights_version += 1
            return self.weights_version

    def load(self, path: str | Path) -> int:
        """Load the weights of a model folder (written by `save_pretrained`)."""
        folder = Path(path)
        if not (folder / "config.json").is_file():
            raise RequestError(f"{path} is not a model folder (no config.json); save one with "
                               f"orchard.recipes.models.save_policy or save_pretrained")
        try:
            model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=self.model.dtype)
        except (OSError, ValueError) as e:
            raise RequestError(f"cannot load the model in {path}: {e}") from None
        try:
            version = self.update(model)
        except ValueError as e:
            raise RequestError(f"{path}: {e}") from None
        self.loaded_from = str(folder)
        return version

    # --- completions ---

    def complete(self, body: Any) -> dict[str, Any]:
        """The `/v1/completions` answer to a request body; raises RequestError for bad input."""
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        for key, off in _UNSUPPORTED.items():
            if body.get(key) not in off:
                raise RequestError(f"{key}={body[key]!r} is not supported by this server; "
                                   f"leave it out (supported: prompt, max_tokens, temperature, "
                                   f"top_p, top_k, seed, stop_token_ids, ignore_eos, logprobs, "
                                   f"return_token_ids)")
        try:
            req = CompletionRequest.model_validate(body)
        except ValidationError as e:
            raise RequestError("; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}"
                                         for err in e.errors())) from None
        if req.model is not None and req.model != self.model_name:
            raise RequestError(f"the model {req.model!r} does not exist; this server serves "
                               f"{self.model_name!r}", status=404)
        stop = set(req.stop_token_ids or ())
        if bad := sorted(t for t in stop if not 0 <= t < self.vocab_size):
            raise RequestError(f"stop_token_ids must be in [0, {self.vocab_size}); got {bad[:5]}")
        if not req.ignore_eos:
            stop.add(self.tokenizer.eos_token_id)
        with self._lock:
            prompt = self._prompt_ids(body.get("prompt"))
            seed = req.seed if req.seed is not None else self._seeds.getrandbits(63)
            job = Job(prompt, self._max_tokens(req.max_tokens, len(prompt)), stop,
                      None if req.ignore_eos else self.tokenizer.eos_token_id, req, seed)
        gen = self.batcher.submit(job)
        with self._lock:
            return self._response(prompt, gen, req)

    def _prompt_ids(self, prompt: Any) -> list[int]:
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list | str):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            ids = list(self.tokenizer.encode(prompt, add_special_tokens=False))
        elif isinstance(prompt, list) and all(type(t) is int for t in prompt):
            ids = prompt
        elif isinstance(prompt, list) and all(isinstance(p, list | str) for p in prompt):
            raise RequestError(f"one prompt per request: got a batch of {len(prompt)}; send "
                               f"them as separate requests")
        else:
            raise RequestError("prompt must be a string or a list of token ids (integers)")
        if not ids:
            raise RequestError("the prompt is empty: give at least one token")
        if bad := [t for t in ids if not 0 <= t < self.vocab_size]:
            raise RequestError(f"prompt token ids must be in [0, {self.vocab_size}) (the model's "
                               f"vocabulary); got {bad[:5]}")
        return ids

    def _max_tokens(self, asked: int | None, prompt_len: int) -> int:
        room = self.max_positions - prompt_len
        if asked is None:
            if room < 1:
                # The words OpenAI and vLLM use, which clients look for.
                raise RequestError(f"this model's maximum context length is "
                                   f"{self.max_positions} tokens (prompt and completion "
                                   f"together), and the prompt has {prompt_len}")
            return min(DEFAULT_MAX_TOKENS, self.max_new_tokens_limit, room)
        wanted = min(asked, self.max_new_tokens_limit)
        if wanted > room:
            raise RequestError(f"this model's maximum context length is {self.max_positions} "
                               f"tokens, but the prompt has {prompt_len} and max_tokens asks for "
                               f"{wanted} more; lower max_tokens or shorten the prompt")
        return wanted

    def _response(self, prompt: list[int], gen: Generation,
                  req: CompletionRequest) -> dict[str, Any]:
        shown = gen.ids[:-1] if gen.finish_reason == "stop" else gen.ids
        text = self.tokenizer.decode(shown, skip_special_tokens=True)
        choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None,
                                  "finish_reason": gen.finish_reason,
                                  "stop_reason": gen.stop_reason}
        if req.logprobs is not None:
            choice["logprobs"] = self._logprobs(gen, len(shown), len(text))
        if req.return_token_ids:
            choice["prompt_token_ids"] = prompt
            choice["token_ids"] = gen.ids
        return {**envelope("text_completion", self.model_name), "choices": [choice],
                "usage": usage(len(prompt), len(gen.ids))}

    def _logprobs(self, gen: Generation, shown: int, text_len: int) -> dict[str, Any]:
        tok = self.tokenizer
        # A byte-level token may end inside a UTF-8 character, whose text comes with the next.
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        offsets, n = [], 0
        for i, t in enumerate(gen.ids):
            offsets.append(min(n, text_len))
            if i < shown and t not in tok.all_special_ids:
                n += len(decoder.decode(token_bytes(tok, t)))
        tops = []
        for i, t in enumerate(gen.ids):
            entry = {tok.decode([a]): lp for a, lp in gen.top[i]} if gen.top else {}
            tops.append({tok.decode([t]): gen.logprobs[i], **entry})
        return {"tokens": [tok.decode([t]) for t in gen.ids], "token_logprobs": gen.logprobs,
                "top_logprobs": tops, "text_offset": offsets}


# --- the app ------------------------------------------------------------------------------------

def create_policy_app(engine: PolicyEngine, admin_key: str | None = None) -> FastAPI:
    """The server's routes; ``admin_key`` guards weight loading (None: no loading over HTTP)."""
    app = FastAPI(title="orchard policy")
    # No browser page may call it: it spends the policy's compute, and pushes its weights.
    app.add_middleware(HostOriginGuard, allowed_hosts=["*"], allowed_origins=[])

    @app.exception_handler(RequestError)
    async def _request_error(_: Request, e: RequestError) -> JSONResponse:
        return JSONResponse(error_body(e.status, str(e)), status_code=e.status)

    async def json_body(request: Request) -> Any:
        try:
            return await request.json()
        except ValueError:
            raise RequestError("the request body is not valid JSON") from None

    def weights() -> dict[str, Any]:
        return {"weights_version": engine.weights_version, "loaded_from": engine.loaded_from}

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{
            "id": engine.model_name, "object": "model", "created": 0, "owned_by": "orchard",
            "max_model_len": engine.max_positions, **weights()}]}

    @app.get("/v1/weights")
    async def get_weights() -> dict[str, Any]:
        return weights()

    @app.post("/v1/load_weights")
    async def load_weights(request: Request) -> dict[str, Any]:
        refusal = admin_key_refusal(
            admin_key, request.headers, "loading weights",
            f"start the server with --admin-key KEY (or {ADMIN_KEY_ENV}) and give FolderSync "
            "key=KEY; in-process, it is PolicyServer.admin_key")
        if refusal is not None:
            raise RequestError(refusal[1], refusal[0])
        body = await json_body(request)
        if not isinstance(body, dict) or not isinstance(body.get("path"), str):
            raise RequestError('send {"path": "<model folder>"}')
        await run_in_threadpool(engine.load, body["path"])
        return weights()

    @app.post("/v1/completions")
    async def completions(request: Request) -> dict[str, Any]:
        return await run_in_threadpool(engine.complete, await json_body(request))

    @app.post("/v1/chat/completions")
    async def chat() -> None:
        raise RequestError("this server takes token-id prompts on /v1/completions; send chat "
                           "through the orchard proxy with --render-with <tokenizer dir>", 404)

    return app


class PolicyServer(ThreadedServer):
    """The policy on 127.0.0.1 (a free port) in a background thread; a context manager giving
    itself, with `.url` (the base URL: the OpenAI client's is `url + "/v1"`) and `.admin_key`
    (what `POST /v1/load_weights` takes; random unless given)."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, *,
                 model_name: str = "policy", max_new_tokens_limit: int = 1024,
                 seed: int = 0, max_batch: int = 8,
                 max_cached_tokens: int = DEFAULT_MAX_CACHED_TOKENS,
                 admin_key: str | None = None) -> None:
        self.engine = PolicyEngine(model, tokenizer, model_name=model_name,
                                   max_new_tokens_limit=max_new_tokens_limit, seed=seed,
                                   max_batch=max_batch, max_cached_tokens=max_cached_tokens)
        self.admin_key = admin_key or new_admin_key()
        super().__init__(create_policy_app(self.engine, self.admin_key), name="orchard-policy")

    def update(self, weights: torch.nn.Module | Mapping[str, torch.Tensor]) -> int:
        """New weights (a model or a state dict), used from the next generation on; returns the
        new weights version."""
        return self.engine.update(weights)

    @property
    def weights_version(self) -> int:
        return self.engine.weights_version

    @property
    def model_name(self) -> str:
        return self.engine.model_name

    def stop(self) -> None:
        super().stop()
        self.engine.close()

    def __enter__(self) -> PolicyServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "auto": None}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m orchard.recipes.policy_server.server",
        description="Serve a policy model on /v1/completions (token-id prompts, vLLM-style).")
    parser.add_argument("--model", required=True, type=Path,
                        help="a model folder with its tokenizer (save_policy / save_pretrained)")
    parser.add_argument("--model-name", default="policy")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--dtype", choices=sorted(_DTYPES), default="float32",
                        help="float32 keeps log-probs exact enough for PPO; auto keeps the "
                             "saved dtype")
    parser.add_argument("--max-new-tokens-limit", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-cached-tokens", type=int, default=DEFAULT_MAX_CACHED_TOKENS,
                        help="keys and values of earlier sequences kept for prompts that extend "
                             "them, in tokens (0: none); see prefix_cache.py for the memory")
    parser.add_argument("--admin-key", default=os.environ.get(ADMIN_KEY_ENV),
                        help=f"key POST /v1/load_weights takes (default: ${ADMIN_KEY_ENV}); "
                             "without one, weights are not loaded over HTTP")
    args = parser.parse_args(argv)
    model, tokenizer = load_policy(args.model, dtype=_DTYPES[args.dtype])
    engine = PolicyEngine(model, tokenizer, model_name=args.model_name,
                          max_new_tokens_limit=args.max_new_tokens_limit, seed=args.seed,
                          max_cached_tokens=args.max_cached_tokens)
    uvicorn.run(create_policy_app(engine, args.admin_key), host=args.host, port=args.port,
                log_level="warning")


if __name__ == "__main__":
    main()
