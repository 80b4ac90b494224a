"""The policy server's prefix cache over real HTTP: multi-turn rollouts answer with the cache as
without it (same seed, same tokens; log-probs equal to a full forward pass), new weights clear
it, and the cached tokens stay within their budget."""

from __future__ import annotations

import random
import threading
from typing import Any

import httpx
import pytest
import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from orchard.recipes.models import tiny_llama
from orchard.recipes.policy_server.prefix_cache import PrefixCache
from orchard.recipes.policy_server.server import PolicyServer
from orchard.rollout.tokenizer import TEST_TOKENIZER, load_tokenizer
from tests.conftest import wait_until


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerFast:
    return load_tokenizer(TEST_TOKENIZER)


@pytest.fixture(scope="module")
def model(tok: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    return tiny_llama(tok, max_positions=2048)


def complete(url: str, prompt: list[int], seed: int, max_tokens: int = 12) -> dict[str, Any]:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 1.0, "seed": seed,
            "ignore_eos": True, "logprobs": 0, "return_token_ids": True}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def full_logprobs(model: LlamaForCausalLM, prompt: list[int], ids: list[int]) -> torch.Tensor:
    """The completion's log-probs from one forward pass over prompt + completion."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0].float()
    full = torch.log_softmax(logits, dim=-1)[len(prompt) - 1:-1]
    return full[torch.arange(len(ids)), torch.tensor(ids)]


def words(rng: random.Random, n: int) -> list[int]:
    """An observation: ``n`` ordinary token ids."""
    return [rng.randrange(10, 300) for _ in range(n)]


def as_one_batch(server: PolicyServer, asks: list[tuple[list[int], int]]) -> list[dict]:
    """The answers to ``asks`` (prompt, seed), sent together and decoded as one batch."""
    batcher = server.engine.batcher
    answers: dict[int, dict] = {}
    before = batcher.batches
    # Every put counts here (the batcher never marks a job done), including the job the
    # batcher thread may already hold while it waits for the lock.
    queued = batcher._queue.unfinished_tasks
    with batcher.lock:  # hold the batch back until every request waits
        threads = [threading.Thread(target=lambda i=i, p=p, s=s: answers.update(
            {i: complete(server.url or "", p, s)})) for i, (p, s) in enumerate(asks)]
        for t in threads:
            t.start()
        assert wait_until(lambda: batcher._queue.unfinished_tasks - queued == len(asks)), \
            "the requests never reached the batcher"
    for t in threads:
        t.join()
    assert batcher.batches == before + 1
    return [answers[i] for i in range(len(asks))]


def test_multi_turn_rollouts_answer_with_the_cache_as_without(
        tok: PreTrainedTokenizerFast, model: LlamaForCausalLM) -> None:
    """Three rollouts of four turns, each turn's prompt the last prompt + its completion + an
    observation, and a new rollout joining every turn: each batch mixes prompts with cached
    prefixes of different lengths and prompts without one."""
    rng = random.Random(0)
    prompts = [words(rng, 20 + 7 * r) for r in range(3)]
    with PolicyServer(model, tok, max_batch=4) as cached, \
            PolicyServer(model, tok, max_batch=1, max_cached_tokens=0) as scratch:
        prefix = cached.engine.batcher.prefix
        reusable = 0
        for turn in range(4):
            asks = [(p, 100 * turn + r) for r, p in enumerate(prompts)]
            asks.append((words(rng, 15 + turn), 999 - turn))  # a rollout's first turn
            hits = prefix.hits
            answers = as_one_batch(cached, asks)
            assert prefix.hits - hits == (0 if turn == 0 else 3)
            for (prompt, seed), got in zip(asks, answers, strict=True):
                want = complete(scratch.url or "", prompt, seed)
                assert got["token_ids"] == want["token_ids"]
                lp = torch.tensor(got["logprobs"]["token_logprobs"])
                assert lp == pytest.approx(torch.tensor(want["logprobs"]["token_logprobs"]),
                                           abs=1e-4)
                # What PPO takes as the old log-probs: a full pass over the sequence.
                assert torch.allclose(lp, full_logprobs(model, prompt, got["token_ids"]),
                                      atol=1e-4)
            assert prefix.reused == reusable
            # Next turn reuses the whole sequence (less the last token, never run) of this one.
            reusable += sum(len(p) + 12 - 1 for p in prompts)
            prompts = [p + a["token_ids"] + words(rng, 9)
                       for p, a in zip(prompts, answers[:3], strict=True)]
        assert scratch.engine.batcher.prefix.hits == 0 and len(scratch.engine.batcher.prefix) == 0


def test_new_weights_clear_the_cache(tok: PreTrainedTokenizerFast) -> None:
    rng = random.Random(1)
    old, new = tiny_llama(tok, seed=0), tiny_llama(tok, seed=5)
    served = tiny_llama(tok, seed=0)
    prompt = words(rng, 30)
    with PolicyServer(served, tok) as server:
        prefix = server.engine.batcher.prefix
        first = complete(server.url or "", prompt, seed=1)
        assert prefix.tokens == len(prompt) + 12 - 1
        repeat = complete(server.url or "", prompt, seed=2)
        assert prefix.hits == 1
        assert torch.allclose(torch.tensor(repeat["logprobs"]["token_logprobs"]),
                              full_logprobs(old, prompt, repeat["token_ids"]), atol=1e-4)
        server.update(new)
        assert prefix.tokens == 0 and len(prefix) == 0
        # The same prompt again: the new model's log-probs, nothing from the old keys.
        after = complete(server.url or "", prompt, seed=2)
        assert prefix.hits == 1
        assert torch.allclose(torch.tensor(after["logprobs"]["token_logprobs"]),
                              full_logprobs(new, prompt, after["token_ids"]), atol=1e-4)
        assert not torch.allclose(torch.tensor(after["logprobs"]["token_logprobs"]),
                                  full_logprobs(old, prompt, after["token_ids"]), atol=1e-2)
        # And the cache fills again, with the new weights' keys and values.
        longer = prompt + after["token_ids"] + words(rng, 5)
        again = complete(server.url or "", longer, seed=3)
        assert prefix.hits == 2
        assert torch.allclose(torch.tensor(again["logprobs"]["token_logprobs"]),
                              full_logprobs(new, longer, again["token_ids"]), atol=1e-4)
    assert first["token_ids"] != after["token_ids"]


def test_cached_tokens_stay_within_the_budget(tok: PreTrainedTokenizerFast,
                                              model: LlamaForCausalLM) -> None:
    rng = random.Random(2)
    budget = 150
    with PolicyServer(model, tok, max_cached_tokens=budget) as server, \
            PolicyServer(model, tok, max_cached_tokens=0) as scratch:
        prefix = server.engine.batcher.prefix
        prompts = [words(rng, n) for n in (20, 30, 200, 25)]  # 200: more than the budget
        for turn in range(3):
            for i, prompt in enumerate(prompts):
                got = complete(server.url or "", prompt, seed=10 * turn + i)
                assert prefix.tokens <= budget
                assert prefix.tokens == sum(len(e.ids) for e in prefix._entries.values())
                want = complete(scratch.url or "", prompt, seed=10 * turn + i)
                assert got["token_ids"] == want["token_ids"]
                prompts[i] = prompt + got["token_ids"] + words(rng, 3)
        assert all(len(e.ids) <= budget for e in prefix._entries.values())
        assert prefix.hits > 0 and len(prefix) >= 1


def test_prefix_cache_keeps_the_longest_and_drops_what_a_newer_entry_holds() -> None:
    def kv(n: int, mark: float) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(torch.full((1, 2, n, 4), mark), torch.full((1, 2, n, 4), -mark))]

    cache = PrefixCache(max_tokens=10)
    assert cache.lookup([1, 2, 3]) is None
    cache.store([1, 2, 3], kv(3, 1.0))
    cache.store([1, 2, 3, 4, 5], kv(5, 2.0))  # holds the first: that one goes
    assert len(cache) == 1 and cache.tokens == 5
    cache.store([1, 2], kv(2, 3.0))  # already held
    assert len(cache) == 1
    # A prompt that differs after three tokens reuses three; at least one token is left to run.
    found = cache.lookup([1, 2, 3, 9])
    assert found is not None and found[0] == 3
    assert found[1][0][0].shape == (1, 2, 3, 4) and float(found[1][0][0].max()) == 2.0
    assert cache.lookup([1, 2, 3, 4, 5])[0] == 4  # type: ignore[index]
    assert cache.lookup([7, 1, 2]) is None
    cache.store([6, 7, 8, 9], kv(4, 4.0))
    assert cache.tokens == 9
    cache.store([5, 5, 5], kv(3, 5.0))  # over the budget: the least recently used goes
    assert cache.tokens == 7 and cache.lookup([1, 2, 3]) is None
    cache.store(list(range(11)), kv(11, 6.0))  # longer than the budget: not kept
    assert cache.tokens == 7
    with pytest.raises(ValueError, match="max_tokens"):
        PrefixCache(-1)
