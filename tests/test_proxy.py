"""The recording proxy in front of the scripted teacher, both over real HTTP with the real
OpenAI client: byte-exact passthrough, recording, token-exact samples, drift, errors."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from orchard.rollout.proxy import upstream as upstream_module
from orchard.rollout.proxy.app import ProxySettings, create_proxy_app
from orchard.rollout.tokenizer import TEST_TOKENIZER, load_tokenizer
from orchard.rollout.traces.samples import build_samples
from orchard.serving import ThreadedServer
from orchard.testing.teacher import Reply, ScriptedPolicy, TeacherServer, ToolCall

TOKENIZER = TEST_TOKENIZER
ADMIN_KEY = "proxy-admin-key"  # reading sessions takes it
ADMIN = {"X-API-Key": ADMIN_KEY}
TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                   "required": ["command"]}}}]
SCRIPT = [Reply(tool_calls=[ToolCall("bash", {"command": "ls"})]),
          Reply(content="I see the files."),
          Reply(content="Done.")]
EXTRA = {"return_token_ids": True, "logprobs": True}


@pytest.fixture(scope="module")
def tok():  # noqa: ANN201 - a transformers tokenizer
    return load_tokenizer(TOKENIZER)


@pytest.fixture(params=[False, True], ids=["continuous", "drift"])
def stack(request: pytest.FixtureRequest, tok, tmp_path: Path) -> Iterator[tuple[str, str, Path]]:
    """(teacher URL, proxy URL, store dir)."""
    with TeacherServer(ScriptedPolicy(SCRIPT), tok, drift=request.param) as teacher:
        proxy = ThreadedServer(create_proxy_app(ProxySettings(
            upstreams=[teacher.url], store=tmp_path / "store", admin_key=ADMIN_KEY)), "proxy")
        proxy.start()
        try:
            yield teacher.url, proxy.url or "", tmp_path / "store"
        finally:
            proxy.stop()


def converse(base_url: str, stream: bool = False) -> list[dict]:
    """Three turns through the OpenAI client, sending the assistant turns back as a harness
    would; returns the raw responses."""
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    messages: list[dict] = [{"role": "system", "content": "You are careful."},
                            {"role": "user", "content": "List the files, then say done."}]
    out = []
    for turn in range(3):
        if stream:
            chunks = list(client.chat.completions.create(
                model="teacher", messages=messages, tools=TOOLS, stream=True,
                extra_body=EXTRA))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            calls: dict[int, dict] = {}
            for c in chunks:
                for tc in (c.choices[0].delta.tool_calls or []) if c.choices else []:
                    slot = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                    slot["id"] = tc.id or slot["id"]
                    slot["name"] += (tc.function.name or "") if tc.function else ""
                    slot["arguments"] += (tc.function.arguments or "") if tc.function else ""
            message = {"role": "assistant", "content": text or None}
            if calls:
                message["tool_calls"] = [
                    {"id": c["id"], "type": "function",
                     "function": {"name": c["name"], "arguments": c["arguments"]}}
                    for _, c in sorted(calls.items())]
            out.append({"message": message})
        else:
            r = client.chat.completions.create(model="teacher", messages=messages, tools=TOOLS,
                                               extra_body=EXTRA)
            message = r.choices[0].message.model_dump(exclude_none=True)
            out.append(r.model_dump())
        messages.append(message)
        if message.get("tool_calls"):
            messages.append({"role": "tool", "tool_call_id": message["tool_calls"][0]["id"],
                             "content": f"turn {turn}: README.md setup.py"})
        else:
            messages.append({"role": "user", "content": "Go on."})
    return out


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_session_is_recorded_and_becomes_samples(stack: tuple[str, str, Path], tok,
                                                 stream: bool,
                                                 request: pytest.FixtureRequest) -> None:
    _, proxy, _ = stack
    drift = "drift" in request.node.callspec.id
    converse(f"{proxy}/s/run-1.task-7/v1", stream=stream)
    calls = httpx.get(f"{proxy}/sessions/run-1.task-7", headers=ADMIN).json()["calls"]
    assert [c["index"] for c in calls] == [0, 1, 2]
    assert all(c["status"] == 200 and c["endpoint"] == "/v1/chat/completions" for c in calls)
    assert calls[0]["request"]["tools"] == TOOLS  # what the harness sent, as sent
    first = calls[0]["response"]["choices"][0]["message"]
    assert first["tool_calls"][0]["function"]["name"] == "bash"
    assert json.loads(first["tool_calls"][0]["function"]["arguments"]) == {"command": "ls"}
    for c in calls:
        t = c["tokens"]
        assert len(t["completion_logprobs"]) == len(t["completion_ids"])
    for c in calls[:1] if drift else calls:  # a drifting server renders its own history
        t = c["tokens"]
        # The recorded prompt is what the model's tokenizer makes of what the harness sent.
        assert t["prompt_ids"] == tok.apply_chat_template(
            c["request"]["messages"], tools=c["request"]["tools"],
            add_generation_prompt=True, tokenize=True, return_dict=False)
        assert all(lp <= 0 for lp in t["completion_logprobs"])
    body = httpx.get(f"{proxy}/sessions/run-1.task-7/samples", headers=ADMIN).json()
    samples, drifts = build_samples("run-1.task-7", calls)
    assert body["samples"][0]["input_ids"] == samples[0].input_ids
    if drift:  # turn 1 re-rendered turn 0's tool call: never joined, always reported
        assert [s.calls for s in samples] == [[0], [1, 2]]
        assert [d["call"] for d in body["drift"]] == [1]
    else:
        assert len(samples) == 1 and body["drift"] == []
        s = samples[0]
        assert s.input_ids[:len(calls[2]["tokens"]["prompt_ids"])] == \
            calls[2]["tokens"]["prompt_ids"]
        trained = [i for i, m in zip(s.input_ids, s.loss_mask, strict=True) if m]
        assert trained == [i for c in calls for i in c["tokens"]["completion_ids"]]


def test_header_session_and_default(stack: tuple[str, str, Path]) -> None:
    _, proxy, store = stack
    body = {"model": "teacher", "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(f"{proxy}/v1/chat/completions", json=body,
                   headers={"X-Orchard-Session": "by-header"})
    assert r.status_code == 200, r.text
    calls = httpx.get(f"{proxy}/sessions/by-header", headers=ADMIN).json()["calls"]
    assert calls[0]["status"] == 200
    assert (store / "by-header.jsonl").exists()  # durable: on disk once it can be read
    assert httpx.get(f"{proxy}/sessions", headers=ADMIN).json()["sessions"] == ["by-header"]


def test_upstream_errors_reach_the_harness_unchanged(stack: tuple[str, str, Path]) -> None:
    teacher_url, proxy, _ = stack
    body = {"model": "teacher", "messages": [{"role": "user", "content": "x"}]}
    direct = httpx.post(f"{teacher_url}/v1/chat/completions",
                        json={**body, "model": "no-such-model"})
    proxied = httpx.post(f"{proxy}/s/e/v1/chat/completions",
                         json={**body, "model": "no-such-model"})
    assert proxied.status_code == direct.status_code == 404
    assert proxied.json() == direct.json()
    call = httpx.get(f"{proxy}/sessions/e", headers=ADMIN).json()["calls"][0]
    assert call["status"] == 404 and call["error"] == direct.json()


def test_unreachable_upstream_is_a_502_that_says_so(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    proxy = ThreadedServer(create_proxy_app(ProxySettings(upstreams=[dead], store=tmp_path,
                                                          admin_key=ADMIN_KEY)), "proxy")
    proxy.start()
    try:
        r = httpx.post(f"{proxy.url}/s/x/v1/chat/completions", json={"messages": []})
        assert r.status_code == 502
        assert f"upstream {dead}/ unreachable" in r.json()["error"]["message"]
        calls = httpx.get(f"{proxy.url}/sessions/x", headers=ADMIN).json()["calls"]
        assert calls[0]["status"] == 502
    finally:
        proxy.stop()


def test_bad_input(stack: tuple[str, str, Path]) -> None:
    _, proxy, _ = stack
    r = httpx.post(f"{proxy}/s/..%2Fetc/v1/chat/completions", json={})
    assert r.status_code in (400, 404)
    r = httpx.post(f"{proxy}/s/ok/v1/chat/completions", content=b"{not json",
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not JSON" in r.json()["error"]["message"]
    r = httpx.get(f"{proxy}/sessions/never-seen", headers=ADMIN)
    assert r.status_code == 404 and "GET /sessions" in r.json()["error"]["message"]


# --- the upstream hop, against a scripted raw HTTP/1.1 upstream ------------------------------


class RawUpstream:
    """An HTTP/1.1 server on 127.0.0.1 that answers as ``handler(conn, request)`` writes; the
    handler returns whether to keep the connection open. Every request is kept in
    ``requests`` as (connection number, head bytes, body bytes)."""

    def __init__(self, handler: Callable[[socket.socket, bytes], bool],
                 tls: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        self.tls = tls
        self.requests: list[tuple[int, bytes, bytes]] = []
        self.connections = 0
        self.release = threading.Event()  # set at the end: a stalling handler returns
        self._sock = socket.create_server(("127.0.0.1", 0))
        host, port = self._sock.getsockname()
        self.url = f"{'https' if tls else 'http'}://{host}:{port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn, self.connections),
                             daemon=True).start()

    def _serve(self, conn: socket.socket, number: int) -> None:
        with contextlib.suppress(OSError, ssl.SSLError):
            if self.tls:
                conn = self.tls.wrap_socket(conn, server_side=True)
            pending = b""
            with conn:
                while True:
                    while b"\r\n\r\n" not in pending:
                        data = conn.recv(65536)
                        if not data:
                            return
                        pending += data
                    head, _, pending = pending.partition(b"\r\n\r\n")
                    length = 0
                    for line in head.split(b"\r\n")[1:]:
                        name, _, value = line.partition(b":")
                        if name.strip().lower() == b"content-length":
                            length = int(value)
                    while len(pending) < length:
                        pending += conn.recv(65536)
                    body, pending = pending[:length], pending[length:]
                    self.requests.append((number, head, body))
                    if not self.handler(conn, head + b"\r\n\r\n" + body):
                        return

    def close(self) -> None:
        self.release.set()
        self._sock.close()


def json_answer(body: bytes, extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s"
            % (len(body), extra, body))


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
ANSWER = json.dumps({"id": "x", "choices": [{"index": 0, "message": {
    "role": "assistant", "content": "hello"}, "finish_reason": "stop"}]}).encode()


@contextlib.contextmanager
def raw_stack(tmp_path: Path, handler: Callable[[socket.socket, bytes], bool], prefix: str = "",
              tls: ssl.SSLContext | None = None,
              **settings: Any) -> Iterator[tuple[RawUpstream, str]]:
    """(the scripted upstream, the proxy's URL); ``prefix`` goes on the upstream's base URL."""
    upstream = RawUpstream(handler, tls=tls)
    proxy = ThreadedServer(create_proxy_app(ProxySettings(
        upstreams=[upstream.url + prefix], store=tmp_path / "store", admin_key=ADMIN_KEY,
        **settings)), "proxy")
    proxy.start()
    try:
        yield upstream, proxy.url or ""
    finally:
        upstream.close()
        proxy.stop()


def recorded_calls(proxy: str, session: str) -> list[dict[str, Any]]:
    return httpx.get(f"{proxy}/sessions/{session}", headers=ADMIN).json()["calls"]


def test_forwarding_is_byte_exact(tmp_path: Path) -> None:
    body = b'{"model": "m",  "messages": [{"role": "user", "content": "caf\\u00e9 \xc3\xa9"}]}'

    def answer(conn: socket.socket, request: bytes) -> bool:
        conn.sendall(json_answer(ANSWER, b"x-upstream: 1\r\n"))
        return True

    with raw_stack(tmp_path, answer, prefix="/prefix/", api_key="secret") as (upstream, proxy):
        r = httpx.post(f"{proxy}/s/exact/v1/chat/completions?a=1%202&b=%2F", content=body,
                       headers={"content-type": "application/json", "authorization": "Bearer x",
                                "x-orchard-session": "ignored", "cookie": "not-forwarded"})
        assert r.status_code == 200 and r.content == ANSWER
        assert r.headers["content-type"] == "application/json"
        [(_, head, sent)] = upstream.requests
        assert sent == body
        lines = head.decode().split("\r\n")
        assert lines[0] == "POST /prefix/v1/chat/completions?a=1%202&b=%2F HTTP/1.1"
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        assert headers["authorization"] == "Bearer secret"  # the proxy's key, not the client's
        assert headers["host"] == upstream.url.removeprefix("http://")
        assert "cookie" not in headers and "accept-encoding" not in headers
        call = recorded_calls(proxy, "exact")[0]
        assert call["request"] == json.loads(body) and call["response"] == json.loads(ANSWER)
        assert call["upstream"] == upstream.url + "/prefix/"
        assert httpx.put(f"{proxy}/v1/models").status_code == 405


def test_only_inference_routes_are_forwarded(tmp_path: Path) -> None:
    with raw_stack(tmp_path, lambda conn, _: conn.sendall(json_answer(b"{}")) or True) as (
            upstream, proxy):
        assert httpx.get(f"{proxy}/s/m/v1/models/org/name-1.5").status_code == 200
        for method, path, status in [
                ("GET", "/v1/chat/completions", 405), ("POST", "/v1/models", 405),
                ("GET", "/v1/models/org/%2e%2e", 404), ("GET", "/v1/models/..%2Fload_weights", 404),
                ("GET", "/v1/responses", 405), ("POST", "/s/m/v1/embeddings", 404)]:
            r = httpx.request(method, proxy + path, json={})
            assert r.status_code == status, (path, r.text)
        assert "POST /v1/chat/completions" in r.json()["error"]["message"]
        assert [head.split(b"\r\n")[0] for _, head, _ in upstream.requests] == [
            b"GET /v1/models/org/name-1.5 HTTP/1.1"]


def test_a_browser_page_cannot_call_the_proxy(tmp_path: Path) -> None:
    """A cross-site page (or a DNS-rebinding one, which a browser also labels with its
    Origin) cannot spend the model's tokens; clients without an Origin are unaffected."""
    with raw_stack(tmp_path, lambda conn, _: conn.sendall(json_answer(b"{}")) or True) as (
            upstream, proxy):
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        r = httpx.post(f"{proxy}/s/m/v1/chat/completions", json=chat,
                       headers={"Origin": "http://evil.test"})
        assert r.status_code == 403 and "allowed_origins" in r.text, r.text
        assert upstream.requests == []
        assert httpx.post(f"{proxy}/s/m/v1/chat/completions", json=chat).status_code == 200
        assert len(upstream.requests) == 1


def test_session_reads_are_off_without_an_admin_key(tmp_path: Path) -> None:
    proxy = ThreadedServer(create_proxy_app(ProxySettings(
        upstreams=["http://127.0.0.1:9"], store=tmp_path, admin_key=None)), "proxy")
    proxy.start()
    try:
        r = httpx.get(f"{proxy.url}/sessions", headers=ADMIN)
        assert r.status_code == 403 and "--admin-key" in r.json()["error"]["message"]
    finally:
        proxy.stop()
    # By default each proxy has its own random key, known to whoever made its settings.
    assert ProxySettings(upstreams=["u"], store=tmp_path).admin_key != \
        ProxySettings(upstreams=["u"], store=tmp_path).admin_key


def test_chunked_answer_is_passed_on_and_recorded(tmp_path: Path) -> None:
    def answer(conn: socket.socket, request: bytes) -> bool:
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                     b"transfer-encoding: chunked\r\n\r\n")
        for i in range(0, len(ANSWER), 20):  # a chunk extension and a trailer, as RFC 9112 allows
            piece = ANSWER[i:i + 20]
            conn.sendall(b"%x;ext=1\r\n%s\r\n" % (len(piece), piece))
        conn.sendall(b"0\r\nx-trailer: 1\r\n\r\n")
        return True

    with raw_stack(tmp_path, answer) as (upstream, proxy):
        for _ in range(3):  # the connection stays usable after a chunked body
            r = httpx.post(f"{proxy}/s/chunked/v1/chat/completions", json=CHAT)
            assert r.status_code == 200 and r.content == ANSWER
        assert upstream.connections == 1
        calls = recorded_calls(proxy, "chunked")
        assert [c["response"] for c in calls] == [json.loads(ANSWER)] * 3


def test_upstream_closing_kept_alive_connections(tmp_path: Path) -> None:
    """An upstream may close an idle kept-alive connection at any time: after an answer (the
    proxy finds it closed when it next wants it), or just as the next request arrives (the
    request is sent again on a fresh connection: the upstream answered nothing on the old)."""

    def answer(conn: socket.socket, request: bytes) -> bool:
        number = upstream.requests[-1][0]
        if number == 2 and len([r for r in upstream.requests if r[0] == 2]) == 2:
            return False  # closes without answering the connection's second request
        conn.sendall(json_answer(ANSWER))
        return number != 1  # the first connection is closed after its answer

    with raw_stack(tmp_path, answer) as (upstream, proxy):
        for _ in range(3):
            r = httpx.post(f"{proxy}/s/closing/v1/chat/completions", json=CHAT)
            assert r.status_code == 200 and r.content == ANSWER
        # calls: 1 on connection 1 (closed after), 2 on connection 2, 3 on connection 2 (closed
        # unanswered), sent again on connection 3
        assert [n for n, _, _ in upstream.requests] == [1, 2, 2, 3]
        calls = recorded_calls(proxy, "closing")
        assert [c["status"] for c in calls] == [200, 200, 200]


def test_upstream_hanging_up_is_a_502(tmp_path: Path) -> None:
    def answer(conn: socket.socket, request: bytes) -> bool:
        if b"midway" in request:  # the head and part of the body, then the connection closes
            conn.sendall(json_answer(ANSWER)[:-10])
        return False

    with raw_stack(tmp_path, answer) as (upstream, proxy):
        r = httpx.post(f"{proxy}/s/hangup/v1/chat/completions", json=CHAT)
        assert r.status_code == 502
        assert f"upstream {upstream.url}/ broke off" in r.json()["error"]["message"]
        assert len(upstream.requests) == 1  # not sent again: it was a fresh connection
        r = httpx.post(f"{proxy}/s/hangup/v1/chat/completions", json={**CHAT, "user": "midway"})
        assert r.status_code == 502 and "broke off a response" in r.json()["error"]["message"]
        calls = recorded_calls(proxy, "hangup")
        assert [c["status"] for c in calls] == [502, 502]
        assert all("broke off" in c["error"] for c in calls)


def test_upstream_timeouts_are_504s(tmp_path: Path) -> None:
    silent_s = 60

    def answer(conn: socket.socket, request: bytes) -> bool:
        if b"midway" in request:  # the head and part of the body, then silence
            conn.sendall(json_answer(ANSWER)[:-10])
        upstream.release.wait(silent_s)
        return False

    with raw_stack(tmp_path, answer, timeout=0.5) as (upstream, proxy):
        t0 = time.monotonic()
        r = httpx.post(f"{proxy}/s/slow/v1/chat/completions", json=CHAT, timeout=silent_s)
        # The upstream stays silent for a minute: in under half of it, the proxy's 0.5 s
        # timeout ended this.
        assert r.status_code == 504 and time.monotonic() - t0 < silent_s / 2
        assert "did not answer within 0.5 s" in r.json()["error"]["message"]
        r = httpx.post(f"{proxy}/s/slow/v1/chat/completions", json={**CHAT, "user": "midway"},
                       timeout=silent_s)
        assert r.status_code == 504
        assert "sent nothing for 0.5 s" in r.json()["error"]["message"]
        assert [c["status"] for c in recorded_calls(proxy, "slow")] == [504, 504]


def test_stream_is_relayed_as_it_arrives(tmp_path: Path) -> None:
    """The first event reaches the client while the upstream still holds back the rest."""
    more = threading.Event()
    event = b'data: {"choices": [{"index": 0, "delta": {"content": "%s"}}]}\n\n'

    def answer(conn: socket.socket, request: bytes) -> bool:
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\n")
        for piece in (event % b"Hel", None, event % b"lo", b"data: [DONE]\n\n"):
            if piece is None:
                more.wait(10)
                continue
            conn.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        conn.sendall(b"0\r\n\r\n")
        return True

    with raw_stack(tmp_path, answer) as (_, proxy), httpx.stream(
            "POST", f"{proxy}/s/sse/v1/chat/completions", json={**CHAT, "stream": True}) as r:
        chunks = r.iter_raw()
        assert next(chunks) == event % b"Hel"
        assert not more.is_set()
        more.set()
        assert b"".join(chunks) == event % b"lo" + b"data: [DONE]\n\n"
        r.close()
        [call] = recorded_calls(proxy, "sse")
        assert call["status"] == 200 and "error" not in call
        assert call["response"]["choices"][0]["message"]["content"] == "Hello"


def test_client_hanging_up_ends_the_upstream_stream(tmp_path: Path) -> None:
    """A harness that hangs up mid-stream: the upstream's connection is closed (a model server
    stops generating), and the record keeps what arrived, marked as cut."""
    upstream_saw_close = threading.Event()

    def answer(conn: socket.socket, request: bytes) -> bool:
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\n")
        piece = b'data: {"choices": [{"index": 0, "delta": {"content": "x"}}]}\n\n'
        deadline = time.monotonic() + 60  # longer than the test waits for the close below
        try:
            while time.monotonic() < deadline:
                conn.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
                time.sleep(0.02)
        except OSError:
            upstream_saw_close.set()
        return False

    with raw_stack(tmp_path, answer) as (_, proxy):
        with httpx.stream("POST", f"{proxy}/s/gone/v1/chat/completions",
                          json={**CHAT, "stream": True}) as r:
            next(r.iter_raw())
        assert upstream_saw_close.wait(30), "the upstream's connection was never closed"
        [call] = recorded_calls(proxy, "gone")
        assert "hung up" in call["error"]
        assert call["response"]["choices"][0]["message"]["content"].startswith("x")


def test_https_upstream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hosted API is HTTPS: verified against the system's CAs (here one made for the test)."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_tls.load_cert_chain(cert, key)
    # the client's default context is made once per process: make it anew, trusting the cert
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    monkeypatch.setattr(upstream_module, "_default_tls", None)

    def answer(conn: socket.socket, request: bytes) -> bool:
        conn.sendall(json_answer(ANSWER))
        return True

    with raw_stack(tmp_path, answer, tls=server_tls) as (upstream, proxy):
        assert upstream.url.startswith("https://")
        for _ in range(2):
            r = httpx.post(f"{proxy}/s/tls/v1/chat/completions", json=CHAT)
            assert r.status_code == 200 and r.content == ANSWER
        assert upstream.connections == 1
