"""Batched generation for the policy server: requests that wait together decode together.

Rollouts run several at a time, so their model calls overlap. One forward pass over a batch
of sequences costs little more than over one on a GPU, and on a CPU it still shares the
weight reads; decoding them one after another wastes that. ``Batcher`` runs a thread that
takes every waiting request (up to ``max_batch``) and decodes them as one static batch:
prompts left-padded, each row with its own position ids, its own sampling settings and its
own seeded generator; a row that stops is carried along until the last one stops. Requests
that arrive meanwhile wait for the next batch.

A row's tokens and log-probs are what decoding it alone, from scratch, gives, up to float error
(the padded positions are masked out of attention, and cached keys and values are the ones a
full prefill computes), so the same seed gives the same sample.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from transformers import DynamicCache

from orchard.recipes.policy_server.prefix_cache import KeysValues, PrefixCache, row_keys_values


class Sampling(Protocol):
    temperature: float | None
    top_p: float | None
    top_k: int | None
    logprobs: int | None


@dataclass
class Generation:
    ids: list[int]
    logprobs: list[float]
    top: list[list[tuple[int, float]]]  # per token: the top-n (id, log-prob), when asked
    finish_reason: str
    stop_reason: int | None


@dataclass
class Job:
    prompt: list[int]
    max_tokens: int
    stop: set[int]
    """Token ids that end the generation (the EOS among them unless ignore_eos)."""
    eos: int | None
    """The id whose stop is reported as "stop" without a stop_reason (vLLM's convention)."""
    sampling: Sampling
    seed: int
    done: Future[Generation] = field(default_factory=Future)


def sample(logits: torch.Tensor, req: Sampling, rng: torch.Generator) -> int:
    temperature = 1.0 if req.temperature is None else req.temperature
    if temperature == 0:
        return int(logits.argmax())
    logits = logits / temperature
    if req.top_k and 0 < req.top_k < logits.numel():
        logits = logits.masked_fill(logits < logits.topk(req.top_k).values[-1], float("-inf"))
    if req.top_p is not None and req.top_p < 1:
        sorted_logits, order = logits.sort(descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # Keep the most likely tokens up to and including the one that reaches top_p.
        beyond = probs.cumsum(dim=-1) - probs >= req.top_p
        logits = logits.clone()
        logits[order[beyond]] = float("-inf")
    return int(torch.multinomial(logits.softmax(dim=-1), 1, generator=rng))


@dataclass
class _Prefill:
    """Rows whose prompts went through the model: the logits after each prompt, the model's
    cache and the attention mask over it (0 at left padding)."""
    logits: torch.Tensor
    cache: Any
    mask: torch.Tensor


def _prefill(model: Any, prompts: list[list[int]], pad_id: int,
             past: tuple[int, KeysValues] | None = None) -> _Prefill:
    """Run ``prompts`` left-padded through the model; with ``past`` (one prompt only), its
    first ``past[0]`` tokens come from those keys and values and only the rest are run."""
    device = model.device
    done = 0 if past is None else past[0]
    width = max(len(p) for p in prompts) - done
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros((len(prompts), done + width), dtype=torch.long, device=device)
    mask[:, :done] = 1
    for row, prompt in enumerate(prompts):
        new = prompt[done:]
        ids[row, width - len(new):] = torch.tensor(new, device=device)
        mask[row, done + width - len(new):] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, done:]
    cache = None if past is None else DynamicCache(past[1])
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache,
                use_cache=True, logits_to_keep=1)
    return _Prefill(out.logits[:, -1].float(), out.cache, mask)


def _merge(parts: list[_Prefill]) -> tuple[Any, torch.Tensor]:
    """One cache and mask for the rows of ``parts``, each left-padded to the longest."""
    if len(parts) == 1:
        return parts[0].cache, parts[0].mask
    width = max(p.mask.shape[1] for p in parts)

    def left(t: torch.Tensor, n: int) -> torch.Tensor:  # [rows, heads, tokens, size]
        return torch.nn.functional.pad(t, (0, 0, n, 0))

    layers = [(torch.cat([left(p.cache.layers[i].keys, width - p.mask.shape[1]) for p in parts]),
               torch.cat([left(p.cache.layers[i].values, width - p.mask.shape[1])
                          for p in parts]))
              for i in range(len(parts[0].cache.layers))]
    mask = torch.cat([torch.nn.functional.pad(p.mask, (width - p.mask.shape[1], 0))
                      for p in parts])
    return DynamicCache(layers), mask


@torch.no_grad()
def generate(model: Any, jobs: list[Job], pad_id: int,
             prefix: PrefixCache | None = None) -> list[Generation]:
    """Decode ``jobs`` together, one row each; their generations in order. With ``prefix``,
    a job whose prompt starts with a cached sequence prefills only the rest, alone, and the
    finished sequences are cached."""
    device = model.device
    reuse = prefix is not None and prefix.max_tokens > 0
    found = [prefix.lookup(j.prompt) if reuse else None for j in jobs]  # type: ignore[union-attr]
    # Jobs without a cached prefix prefill as one batch, the others one by one after them.
    order = ([i for i, f in enumerate(found) if f is None]
             + [i for i, f in enumerate(found) if f is not None])
    jobs = [jobs[i] for i in order]
    fresh = [j.prompt for j, i in zip(jobs, order, strict=True) if found[i] is None]
    parts = [_prefill(model, fresh, pad_id)] if fresh else []
    parts += [_prefill(model, [j.prompt], pad_id, f) for j, i in zip(jobs, order, strict=True)
              if (f := found[i]) is not None]
    cache, mask = _merge(parts)
    logits = torch.cat([p.logits for p in parts])
    width = mask.shape[1]
    positions = mask.sum(-1, keepdim=True) - 1
    rngs = [torch.Generator(device=device).manual_seed(j.seed) for j in jobs]
    made: list[Generation | None] = [None] * len(jobs)
    rows = [Generation([], [], [], "length", None) for _ in jobs]
    while True:
        raw = torch.log_softmax(logits, dim=-1)
        step = []
        for row, job in enumerate(jobs):
            gen = rows[row]
            if made[row] is not None:
                step.append(pad_id)
                continue
            token = sample(logits[row], job.sampling, rngs[row])
            gen.ids.append(token)
            gen.logprobs.append(raw[row, token].item())
            if job.sampling.logprobs:
                values, indices = raw[row].topk(job.sampling.logprobs)
                gen.top.append(list(zip(indices.tolist(), values.tolist(), strict=True)))
            if token in job.stop:
                gen.finish_reason = "stop"
                gen.stop_reason = None if token == job.eos else token
                made[row] = gen
            elif len(gen.ids) == job.max_tokens:
                made[row] = gen
            step.append(token)
        if all(g is not None for g in made):
            break
        mask = torch.cat([mask, mask.new_ones((len(jobs), 1))], dim=-1)
        positions = positions + 1
        out = model(input_ids=torch.tensor([step], device=device).T, attention_mask=mask,
                    position_ids=positions, cache=cache, use_cache=True)
        logits, cache = out.logits[:, -1].float(), out.cache
    if reuse:
        # A row's sequence: its prompt up to the padded width, then the tokens it was fed.
        for row, (job, gen) in enumerate(zip(jobs, rows, strict=True)):
            kv = row_keys_values(cache, row, width - len(job.prompt), width + len(gen.ids) - 1)
            if kv is not None:
                prefix.store(job.prompt + gen.ids[:-1], kv)  # type: ignore[union-attr]
    return [rows[order.index(i)] for i in range(len(order))]


class Batcher:
    """A thread that decodes the waiting jobs as batches of at most ``max_batch``, reusing up to
    ``max_cached_tokens`` of earlier sequences' keys and values (0: none). ``lock`` is held for
    each batch: whoever swaps the weights takes it, so no batch sees two versions."""

    def __init__(self, model: Any, pad_id: int, *, max_batch: int = 8,
                 max_cached_tokens: int = 0) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, not {max_batch}")
        self.model, self.pad_id, self.max_batch = model, pad_id, max_batch
        self.prefix = PrefixCache(max_cached_tokens)
        """Keys and values of finished sequences; whoever swaps the weights clears it."""
        self.lock = threading.Lock()
        self.batches = 0
        """Batches decoded so far, and the jobs in them: how much batching happened."""
        self.jobs = 0
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._starting = threading.Lock()

    def submit(self, job: Job) -> Generation:
        """Decode ``job`` with whatever else is waiting; blocks until it is done. The thread
        starts with the first job (and again after ``close``)."""
        with self._starting:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="orchard-batcher",
                                                daemon=True)
                self._thread.start()
        self._queue.put(job)
        return job.done.result()

    def close(self) -> None:
        """Stop the thread once the jobs already waiting are done."""
        with self._starting:
            if self._thread is not None and self._thread.is_alive():
                self._queue.put(None)
                self._thread.join(timeout=60)
            self._thread = None

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            # The batch is filled once the lock is held: jobs that came while a weight update
            # held it decode together.
            with self.lock:
                batch = [first]
                while len(batch) < self.max_batch:
                    try:
                        job = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if job is None:
                        self._queue.put(None)  # close after this batch
                        break
                    batch.append(job)
                try:
                    gens = generate(self.model, batch, self.pad_id, self.prefix)
                except Exception as e:  # a failed batch fails its requests, not the server
                    for job in batch:
                        job.done.set_exception(e)
                    continue
            self.batches, self.jobs = self.batches + 1, self.jobs + len(batch)
            for job, gen in zip(batch, gens, strict=True):
                job.done.set_result(gen)
