"""The policy server over real HTTP on loopback: vLLM-style /v1/completions with token-id
prompts from a tiny random float32 Llama, weight updates in-process and from a saved folder,
and chat through the real recording proxy rendering prompts with the chat template."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from orchard.recipes.models import load_policy, save_policy, tiny_llama
from orchard.recipes.policy_server.server import PolicyEngine, PolicyServer
from orchard.rollout.proxy.app import ProxySettings, create_proxy_app
from orchard.rollout.proxy.render import parse_tool_calls
from orchard.rollout.tokenizer import TEST_TOKENIZER, load_tokenizer
from orchard.serving import ThreadedServer
from tests.conftest import free_port

ADMIN_KEY = "proxy-admin-key"  # reading the proxy's sessions takes it
ADMIN = {"X-API-Key": ADMIN_KEY}
MESSAGES = [{"role": "system", "content": "You are careful."},
            {"role": "user", "content": "What do the notes say?"}]
TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                   "required": ["command"]}}}]


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerFast:
    return load_tokenizer(TEST_TOKENIZER)


@pytest.fixture(scope="module")
def model(tok: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    return tiny_llama(tok, max_positions=2048)


@pytest.fixture(scope="module")
def prompt(tok: PreTrainedTokenizerFast) -> list[int]:
    return list(tok.apply_chat_template(MESSAGES, add_generation_prompt=True)["input_ids"])


@pytest.fixture(scope="module")
def server(model: LlamaForCausalLM,
           tok: PreTrainedTokenizerFast) -> Iterator[PolicyServer]:
    """A server the tests only read from (tests that change weights start their own)."""
    with PolicyServer(model, tok) as s:
        yield s


def eos_lover(tok: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    """A tiny Llama whose most likely next token is always EOS: every token's embedding gets
    a large first coordinate, EOS's twice as large, so with tied embeddings EOS's logit wins."""
    model = tiny_llama(tok, seed=1)
    with torch.no_grad():
        embeddings = model.get_input_embeddings().weight
        embeddings[:, 0] += 1.0
        embeddings[tok.eos_token_id, 0] += 1.0
    return model


def complete(url: str, **body: Any) -> dict[str, Any]:
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def greedy(url: str, prompt: list[int], n: int = 12) -> list[int]:
    return complete(url, prompt=prompt, max_tokens=n, temperature=0,
                    return_token_ids=True)["choices"][0]["token_ids"]


def full_forward(model: LlamaForCausalLM, ids: list[int]) -> torch.Tensor:
    """Log-probs at every position from one forward pass over the whole sequence."""
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


def test_completion_tokens_and_logprobs_match_a_full_forward_pass(server: PolicyServer,
                                                                  model: LlamaForCausalLM,
                                                                  tok: PreTrainedTokenizerFast,
                                                                  prompt: list[int]) -> None:
    answer = complete(server.url, model="policy", prompt=prompt, max_tokens=16, temperature=1,
                      seed=7, logprobs=2, return_token_ids=True)
    assert answer["id"].startswith("cmpl-") and answer["object"] == "text_completion"
    assert answer["model"] == "policy"
    (choice,) = answer["choices"]
    ids = choice["token_ids"]
    assert choice["prompt_token_ids"] == prompt
    assert answer["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                               "total_tokens": len(prompt) + len(ids)}
    stopped = choice["finish_reason"] == "stop"
    assert len(ids) == 16 or (stopped and ids[-1] == tok.eos_token_id)
    assert choice["text"] == tok.decode(ids[:-1] if stopped else ids, skip_special_tokens=True)

    full = full_forward(model, prompt + ids)[len(prompt) - 1:-1]
    logprobs = choice["logprobs"]
    expected = full[torch.arange(len(ids)), torch.tensor(ids)]
    assert torch.allclose(torch.tensor(logprobs["token_logprobs"]), expected, atol=1e-4)
    assert logprobs["tokens"] == [tok.decode([t]) for t in ids]
    # top_logprobs: the sampled token, then the two most likely ones of the raw distribution.
    for position, top in enumerate(logprobs["top_logprobs"]):
        assert tok.decode([ids[position]]) in top
        assert max(top.values()) == pytest.approx(full[position].max().item(), abs=1e-4)
    assert logprobs["text_offset"][0] == 0 and len(logprobs["text_offset"]) == len(ids)


def test_greedy_is_deterministic_and_takes_the_most_likely_token(server: PolicyServer,
                                                                 model: LlamaForCausalLM,
                                                                 prompt: list[int]) -> None:
    first = greedy(server.url, prompt)
    assert greedy(server.url, prompt) == first
    full = full_forward(model, prompt + first)[len(prompt) - 1:-1]
    assert full.argmax(dim=-1).tolist() == first


def test_a_seed_reproduces_its_sample(server: PolicyServer, prompt: list[int]) -> None:
    def sample(seed: int, **extra: Any) -> list[int]:
        return complete(server.url, prompt=prompt, max_tokens=12, temperature=1, seed=seed,
                        return_token_ids=True, **extra)["choices"][0]["token_ids"]

    assert sample(1) == sample(1)
    assert sample(1) != sample(2)
    # Narrowed to the single most likely token, sampling is greedy decoding.
    assert sample(3, top_k=1) == sample(4, top_p=1e-6) == greedy(server.url, prompt)


def test_max_tokens_ends_with_length(server: PolicyServer, prompt: list[int]) -> None:
    (choice,) = complete(server.url, prompt=prompt, max_tokens=5, temperature=0,
                         return_token_ids=True)["choices"]
    assert len(choice["token_ids"]) == 5 and choice["finish_reason"] == "length"
    assert choice["stop_reason"] is None


def test_a_stop_token_id_ends_the_answer_and_is_kept_in_the_ids(server: PolicyServer,
                                                                tok: PreTrainedTokenizerFast,
                                                                prompt: list[int]) -> None:
    def sample(**extra: Any) -> dict[str, Any]:
        return complete(server.url, prompt=prompt, max_tokens=12, seed=5,
                        return_token_ids=True, **extra)["choices"][0]

    tokens = sample()["token_ids"]
    # The first token that did not come before it: the same sample stops right there.
    i = next(i for i in range(1, len(tokens)) if tokens[i] not in tokens[:i])
    choice = sample(stop_token_ids=[tokens[i]])
    assert choice["token_ids"] == tokens[:i + 1]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == tokens[i]
    assert choice["text"] == tok.decode(tokens[:i], skip_special_tokens=True)


def test_string_prompts_and_a_batch_of_one(server: PolicyServer, tok: PreTrainedTokenizerFast,
                                           prompt: list[int]) -> None:
    text = "def main():\n    return 1"
    (choice,) = complete(server.url, prompt=text, max_tokens=2, return_token_ids=True)["choices"]
    assert choice["prompt_token_ids"] == tok.encode(text, add_special_tokens=False)
    assert greedy(server.url, [prompt]) == greedy(server.url, prompt)  # type: ignore[list-item]


def test_the_default_max_tokens_fits_the_context(server: PolicyServer) -> None:
    # The tiny model reads 2048 positions: a 2047-token prompt leaves room for one token.
    (choice,) = complete(server.url, prompt=[5] * 2047, return_token_ids=True)["choices"]
    assert len(choice["token_ids"]) == 1 and choice["finish_reason"] == "length"


@pytest.mark.parametrize(("body", "status", "says"), [
    ({"prompt": [5, 3072]}, 400, "vocabulary"),
    ({"prompt": [5] * 2040, "max_tokens": 20}, 400, "maximum context length is 2048"),
    ({"prompt": [5] * 2048}, 400, "maximum context length is 2048"),
    ({"prompt": []}, 400, "empty"),
    ({"prompt": [1.5, 2]}, 400, "list of token ids"),
    ({"max_tokens": 3}, 400, "prompt must be"),
    ({"prompt": [[1, 2], [3]]}, 400, "one prompt per request"),
    ({"prompt": "hi", "temperature": "hot"}, 400, "temperature: Input should be a valid number"),
    ({"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ({"prompt": "hi", "logprobs": 21}, 400, "logprobs"),
    ({"prompt": "hi", "stop_token_ids": [-1]}, 400, "stop_token_ids must be in [0, 3072)"),
    ({"prompt": "hi", "echo": True}, 400, "echo=True is not supported"),
    ({"prompt": "hi", "n": 2}, 400, "n=2 is not supported"),
    ({"prompt": "hi", "stream": True}, 400, "stream=True is not supported"),
    ({"prompt": "hi", "model": "gpt-4"}, 404, "'gpt-4' does not exist"),
])
def test_bad_requests_get_a_clear_error(server: PolicyServer, body: dict, status: int,
                                        says: str) -> None:
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == status
    error = r.json()["error"]
    assert says in error["message"] and error["code"] == status


def test_bodies_that_are_not_requests_and_chat_get_a_clear_error(server: PolicyServer) -> None:
    r = httpx.post(f"{server.url}/v1/completions", content=b"{not json",
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.post(f"{server.url}/v1/completions", json=[1, 2])
    assert r.status_code == 400 and "JSON object" in r.json()["error"]["message"]
    r = httpx.post(f"{server.url}/v1/chat/completions", json={"messages": MESSAGES})
    assert r.status_code == 404 and "--render-with" in r.json()["error"]["message"]


def test_models_health_and_weights_endpoints(server: PolicyServer) -> None:
    assert httpx.get(f"{server.url}/health").status_code == 200
    (entry,) = httpx.get(f"{server.url}/v1/models").json()["data"]
    assert entry["id"] == "policy" and entry["max_model_len"] == 2048
    assert entry["weights_version"] == 0
    assert httpx.get(f"{server.url}/v1/weights").json() == {"weights_version": 0,
                                                           "loaded_from": None}


def test_the_server_caps_max_tokens(tok: PreTrainedTokenizerFast, model: LlamaForCausalLM,
                                    prompt: list[int]) -> None:
    engine = PolicyEngine(model, tok, max_new_tokens_limit=3)
    (choice,) = engine.complete({"prompt": prompt, "max_tokens": 50, "temperature": 0,
                                 "return_token_ids": True})["choices"]
    assert len(choice["token_ids"]) == 3 and choice["finish_reason"] == "length"


def test_update_changes_the_answers_and_bumps_the_version(tok: PreTrainedTokenizerFast,
                                                          prompt: list[int]) -> None:
    model = tiny_llama(tok)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    with PolicyServer(model, tok) as server:
        before = greedy(server.url, prompt)
        assert server.update(eos_lover(tok)) == 1
        (choice,) = complete(server.url, prompt=prompt, max_tokens=8, temperature=0,
                             return_token_ids=True)["choices"]
        assert choice["token_ids"] == [tok.eos_token_id] and choice["finish_reason"] == "stop"
        assert choice["text"] == "" and choice["stop_reason"] is None
        assert httpx.get(f"{server.url}/v1/weights").json()["weights_version"] == 1
        assert httpx.get(f"{server.url}/v1/models").json()["data"][0]["weights_version"] == 1

        assert server.update(original) == 2  # a state dict works too
        assert greedy(server.url, prompt) == before
        # Weights of another size are refused whole, and the served ones stay.
        with pytest.raises(ValueError, match="do not fit the served model"):
            server.update(tiny_llama(tok, hidden_size=64))
        assert server.weights_version == 2 and greedy(server.url, prompt) == before


def test_update_waits_for_the_generations_in_flight(tok: PreTrainedTokenizerFast,
                                                    prompt: list[int]) -> None:
    with PolicyServer(tiny_llama(tok), tok) as server:
        old = complete(server.url, prompt=prompt, max_tokens=24, temperature=0,
                       ignore_eos=True, return_token_ids=True)["choices"][0]["token_ids"]
        answers: list[list[int]] = []

        def ask() -> None:
            answers.append(complete(server.url, prompt=prompt, max_tokens=24, temperature=0,
                                    ignore_eos=True, return_token_ids=True
                                    )["choices"][0]["token_ids"])

        threads = [threading.Thread(target=ask) for _ in range(4)]
        for t in threads:
            t.start()
        server.update(eos_lover(tok))
        for t in threads:
            t.join()
        new = [tok.eos_token_id] * 24
        assert greedy(server.url, prompt, 24) != old
        # Each answer came whole from one set of weights, never from a mix of the two.
        assert len(answers) == 4 and all(a in (old, new) for a in answers)


def test_concurrent_requests_decode_as_one_batch_and_answer_as_alone(
        tok: PreTrainedTokenizerFast, model: LlamaForCausalLM, prompt: list[int]) -> None:
    # Prompts of different lengths, sampled (not greedy) with their own seeds and limits.
    bodies = [{"prompt": prompt[:n], "max_tokens": m, "seed": 10 + i, "temperature": 1.0,
               "ignore_eos": True, "logprobs": 0, "return_token_ids": True}
              for i, (n, m) in enumerate([(len(prompt), 16), (9, 5), (23, 12), (4, 16)])]
    with PolicyServer(model, tok, max_batch=1) as alone:
        expected = [complete(alone.url, **b)["choices"][0] for b in bodies]
        assert alone.engine.batcher.batches == 4
    with PolicyServer(model, tok, max_batch=4) as server:
        batcher = server.engine.batcher
        with batcher.lock:  # hold the first batch back until all four are waiting
            answers: dict[int, dict] = {}
            threads = [threading.Thread(target=lambda i=i, b=b: answers.update(
                {i: complete(server.url, **b)["choices"][0]})) for i, b in enumerate(bodies)]
            for t in threads:
                t.start()
            deadline = time.monotonic() + 30
            # The batcher holds the first job while it waits for the lock; three wait queued.
            while batcher._queue.qsize() < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
        for t in threads:
            t.join()
    assert (batcher.batches, batcher.jobs) == (1, 4)
    for i, want in enumerate(expected):
        got = answers[i]
        assert got["token_ids"] == want["token_ids"] and len(got["token_ids"]) == \
            bodies[i]["max_tokens"]
        assert got["logprobs"]["token_logprobs"] == pytest.approx(
            want["logprobs"]["token_logprobs"], abs=1e-4)


def test_load_weights_from_a_saved_folder_over_http(tok: PreTrainedTokenizerFast, prompt: list[int],
                                                    tmp_path: Path) -> None:
    step = save_policy(eos_lover(tok), tok, tmp_path / "step-1")
    save_policy(tiny_llama(tok, hidden_size=64), tok, tmp_path / "other-size")
    with PolicyServer(tiny_llama(tok), tok, admin_key="policy-key") as server:
        assert greedy(server.url, prompt) != [tok.eos_token_id]
        url, key = f"{server.url}/v1/load_weights", {"X-API-Key": "policy-key"}
        # Loading makes the server read a folder and serve it: only with its admin key.
        for headers, status in [({}, 401), ({"X-API-Key": "guess"}, 403)]:
            r = httpx.post(url, json={"path": str(step)}, headers=headers, timeout=120)
            assert r.status_code == status and "admin key" in r.json()["error"]["message"]
        assert server.weights_version == 0
        r = httpx.post(url, json={"path": str(step)}, headers=key, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json() == {"weights_version": 1, "loaded_from": str(step)}
        assert greedy(server.url, prompt) == [tok.eos_token_id]

        for body, says in [({"path": str(tmp_path / "missing")}, "not a model folder"),
                           ({"path": str(tmp_path / "other-size")}, "do not fit"),
                           ({"folder": str(step)}, '{"path"')]:
            r = httpx.post(url, json=body, headers=key, timeout=120)
            assert r.status_code == 400 and says in r.json()["error"]["message"]
        assert server.weights_version == 1


def test_chat_through_the_recording_proxy_is_token_exact(server: PolicyServer,
                                                         tok: PreTrainedTokenizerFast,
                                                         tmp_path: Path) -> None:
    proxy = ThreadedServer(create_proxy_app(ProxySettings(
        upstreams=[server.url], store=tmp_path / "store", render_with=TEST_TOKENIZER,
        admin_key=ADMIN_KEY)), "proxy")
    proxy.start()
    try:
        client = openai.OpenAI(base_url=f"{proxy.url}/s/policy-chat/v1", api_key="unused",
                               max_retries=0)
        answer = client.chat.completions.create(model="policy", messages=MESSAGES, tools=TOOLS,
                                                max_tokens=16, temperature=0, logprobs=True)
        (call,) = httpx.get(f"{proxy.url}/sessions/policy-chat", headers=ADMIN).json()["calls"]
    finally:
        proxy.stop()
    tokens = call["tokens"]
    assert tokens["prompt_ids"] == list(tok.apply_chat_template(
        MESSAGES, tools=TOOLS, add_generation_prompt=True)["input_ids"])
    # The server, asked directly with those ids, gives the same tokens and log-probs.
    (direct,) = complete(server.url, prompt=tokens["prompt_ids"], max_tokens=16, temperature=0,
                         logprobs=1, return_token_ids=True)["choices"]
    assert tokens["completion_ids"] == direct["token_ids"]
    assert tokens["completion_logprobs"] == pytest.approx(direct["logprobs"]["token_logprobs"],
                                                          abs=1e-6)
    # The harness sees a chat answer: the completion's text, with tool calls parsed out of it.
    message = answer.choices[0].message
    assert message.content == parse_tool_calls(direct["text"])[0]
    assert len(answer.choices[0].logprobs.content) == len(direct["token_ids"])


def test_tiny_llama_fits_its_tokenizer_and_is_seeded(tok: PreTrainedTokenizerFast) -> None:
    rng = torch.random.get_rng_state()
    model = tiny_llama(tok, hidden_size=64, heads=2, seed=3)
    assert torch.equal(torch.random.get_rng_state(), rng)  # the global RNG is left alone
    assert model.dtype == torch.float32 and model.config.vocab_size == len(tok)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert model.config.eos_token_id == tok.eos_token_id
    assert model.config.pad_token_id == tok.pad_token_id
    same, other = tiny_llama(tok, hidden_size=64, heads=2, seed=3), tiny_llama(tok, seed=4,
                                                                              hidden_size=64,
                                                                              heads=2)
    weights = model.get_input_embeddings().weight
    assert torch.equal(weights, same.get_input_embeddings().weight)
    assert not torch.equal(weights, other.get_input_embeddings().weight)
    with pytest.raises(ValueError, match="multiple of heads"):
        tiny_llama(tok, hidden_size=100, heads=3)


def test_a_saved_policy_loads_back_the_same(tok: PreTrainedTokenizerFast, model: LlamaForCausalLM,
                                            tmp_path: Path) -> None:
    folder = save_policy(model, tok, tmp_path / "policy")
    loaded, loaded_tok = load_policy(folder)
    ids = torch.tensor([[1, 87, 441, 201, 760]])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
    assert loaded_tok.chat_template == tok.chat_template and len(loaded_tok) == len(tok)
    assert load_policy(folder, dtype=torch.bfloat16)[0].dtype == torch.bfloat16
    with pytest.raises(FileNotFoundError, match="not a model folder"):
        load_policy(tmp_path)



def test_the_command_line_serves_a_saved_folder(tok: PreTrainedTokenizerFast,
                                                model: LlamaForCausalLM, prompt: list[int],
                                                tmp_path: Path) -> None:
    folder = save_policy(model, tok, tmp_path / "policy")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "orchard.recipes.policy_server.server", "--model", str(folder),
             "--port", str(port)],
            stdout=log, stderr=log)
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if process.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    pytest.fail(f"the policy server did not start: {log.read()[-2000:]!r}")
                time.sleep(0.2)
            answer = greedy(url, prompt)
            full = full_forward(model, prompt + answer)[len(prompt) - 1:-1]
            assert full.argmax(dim=-1).tolist() == answer
        finally:
            process.terminate()
            process.wait(30)

