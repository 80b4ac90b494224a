"""Model-only egress: a harness inside a block_network sandbox reaches the recording proxy (and
through it the model) and nothing else; on Kubernetes the same request yields the egress policy
and the environment that do so."""

from __future__ import annotations

import contextlib
import json
import shlex
import signal
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from orchard.env.backends.kubernetes.manifests import MODEL_EGRESS, MODEL_PROXY
from orchard.env.server import EmbeddedOrchestrator
from orchard.rollout.proxy.app import ProxySettings, create_proxy_app
from orchard.rollout.tokenizer import TEST_TOKENIZER, load_tokenizer
from orchard.serving import ThreadedServer
from orchard.testing.teacher import Reply, ScriptedPolicy, TeacherServer
from tests.conftest import (
    create_ready,
    dedicated_orchestrator,
    free_port,
    kube_settings,
    needs_root,
    run,
    short_data_dir,
    wait_until,
)
from tests.fakekube.cluster import FakeCluster
from tests.test_kubernetes_backend import (
    _schema_errors,
    delete_and_wait,
    get_pod,
    kube_orchestrator,
    namespace,
    on_server,
    short_dir,
)
from tests.test_lifecycle import _start_server, force_remove, gone

ADMIN_KEY = "proxy-admin-key"  # reading the proxy's sessions takes it
ADMIN = {"X-API-Key": ADMIN_KEY}
pytestmark = needs_root
TOKENIZER = TEST_TOKENIZER
# Plain python3 from the host view: the kind of client a harness inside the sandbox is.
CHAT = """
import json, os, sys, urllib.request, urllib.error
url = sys.argv[1] if len(sys.argv) > 1 else os.environ["OPENAI_BASE_URL"] + "/chat/completions"
body = json.dumps({"model": "teacher", "messages": [{"role": "user", "content": "hi"}],
                   "return_token_ids": True}).encode()
req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
try:
    print(urllib.request.urlopen(req, timeout=10).read().decode())
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode())
    sys.exit(3)
"""
CONNECT = """
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
try:
    socket.create_connection((host, port), timeout=3).close()
except OSError as e:
    print(type(e).__name__, e.errno)
    sys.exit(4)
print("connected")
"""


def py(http: httpx.Client, sid: str, code: str, *args: str) -> dict:
    return run(http, sid, command=f"python3 -c {shlex.quote(code)} "
               + " ".join(shlex.quote(a) for a in args), timeout_seconds=30)


@pytest.fixture(scope="module")
def model_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path]]:
    """(teacher URL, proxy URL, proxy store): the teacher answers every call the same way."""
    store = tmp_path_factory.mktemp("proxy-store")
    policy = ScriptedPolicy([Reply(content="the model says hi")] * 50)
    with TeacherServer(policy, load_tokenizer(TOKENIZER)) as teacher:
        proxy = ThreadedServer(create_proxy_app(ProxySettings(upstreams=[teacher.url],
                                                              store=store, admin_key=ADMIN_KEY)),
                               "proxy")
        proxy.start()
        try:
            yield teacher.url, proxy.url or "", store
        finally:
            proxy.stop()


@pytest.fixture(scope="module")
def egress_http(data_dir: Path, orchestrator: str,
                model_stack: tuple[str, str, Path]) -> Iterator[httpx.Client]:
    # `orchestrator` first: it builds the interpreter bundle the dedicated one links to.
    with dedicated_orchestrator(data_dir, model_proxy=model_stack[1]) as url, \
            httpx.Client(base_url=url, timeout=120) as client:
        yield client


def proxied(http: httpx.Client, session: str, **body: object) -> str:
    return create_ready(http, {"image": "host", "session": session, "model_proxy": True,
                               **body})


def test_harness_in_a_blocked_sandbox_reaches_the_model(egress_http: httpx.Client,
                                                        model_stack: tuple[str, str, Path]
                                                        ) -> None:
    session = f"egress-{uuid.uuid4().hex[:8]}"
    sid = proxied(egress_http, session)
    info = egress_http.get(f"/sandboxes/{sid}").json()
    assert info["block_network"] is True and info["session"] == session
    assert info["model_base_url"] == f"http://127.0.0.1:18080/s/{session}/v1"
    env = run(egress_http, sid, command="env")["stdout"]
    assert f"OPENAI_BASE_URL={info['model_base_url']}" in env.splitlines()
    assert f"ORCHARD_SESSION={session}" in env.splitlines()

    result = py(egress_http, sid, CHAT)
    assert result["exit_code"] == 0, result
    reply = json.loads(result["stdout"])
    assert reply["choices"][0]["message"]["content"] == "the model says hi"
    assert reply["prompt_token_ids"], "the teacher's token ids came through"

    calls = httpx.get(f"{model_stack[1]}/sessions/{session}", headers=ADMIN).json()["calls"]
    assert len(calls) == 1 and calls[0]["status"] == 200
    assert calls[0]["request"]["messages"] == [{"role": "user", "content": "hi"}]
    egress_http.delete(f"/sandboxes/{sid}")


def test_nothing_but_the_proxy_is_reachable(egress_http: httpx.Client,
                                            model_stack: tuple[str, str, Path]) -> None:
    teacher, proxy = (httpx.URL(u) for u in model_stack[:2])
    orchestrator = egress_http.base_url
    sid = proxied(egress_http, f"blocked-{uuid.uuid4().hex[:8]}")
    # The host's loopback services, the model server itself and the proxy's own port: none is
    # reachable; only loopback exists in the sandbox's network namespace.
    for host, port in [("127.0.0.1", orchestrator.port), ("127.0.0.1", teacher.port),
                       ("127.0.0.1", proxy.port), ("192.0.2.1", 80), ("127.0.0.1", 22)]:
        result = py(egress_http, sid, CONNECT, host, str(port))
        assert result["exit_code"] == 4, (host, port, result)
        assert "ConnectionRefusedError" in result["stdout"] or "OSError" in result["stdout"]
    # The one open port leads to the proxy, and carries only this sandbox's own inference
    # calls (tests/attacks/test_model_proxy.py tries the rest).
    result = py(egress_http, sid, CHAT, "http://127.0.0.1:18080/health")
    assert result["exit_code"] == 3 and result["stdout"].startswith("403 "), result
    names = run(egress_http, sid, command="cat /etc/hostname /proc/net/dev")["stdout"]
    assert "eth" not in names and "veth" not in names
    egress_http.delete(f"/sandboxes/{sid}")


def test_sandbox_without_model_proxy_has_no_way_out(egress_http: httpx.Client) -> None:
    sid = create_ready(egress_http, {"image": "host", "session": "plain-one"})
    result = py(egress_http, sid, CONNECT, "127.0.0.1", "18080")
    assert result["exit_code"] == 4, result
    assert "OPENAI_BASE_URL" not in run(egress_http, sid, command="env")["stdout"]
    assert egress_http.get(f"/sandboxes/{sid}").json()["model_base_url"] is None
    egress_http.delete(f"/sandboxes/{sid}")


def test_model_proxy_requests_are_checked(egress_http: httpx.Client, http: httpx.Client) -> None:
    r = egress_http.post("/sandboxes", json={"image": "host", "model_proxy": True})
    assert r.status_code == 422 and "session" in r.text
    r = egress_http.post("/sandboxes", json={"image": "host", "session": "../etc",
                                             "model_proxy": True})
    assert r.status_code == 422
    # The shared test orchestrator was started without --model-proxy.
    r = http.post("/sandboxes", json={"image": "host", "session": "s1", "model_proxy": True})
    assert r.status_code == 400 and "--model-proxy" in r.json()["detail"]


def test_caller_env_wins_over_the_injected_one(egress_http: httpx.Client) -> None:
    sid = proxied(egress_http, "env-override", env={"OPENAI_API_KEY": "mine"})
    env = run(egress_http, sid, command="echo $OPENAI_API_KEY $OPENAI_API_BASE")["stdout"]
    assert env.split() == ["mine", "http://127.0.0.1:18080/s/env-override/v1"]
    egress_http.delete(f"/sandboxes/{sid}")


def test_proxy_down_gives_the_harness_a_clear_502(data_dir: Path, orchestrator: str) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    with dedicated_orchestrator(data_dir, model_proxy=dead) as url, \
            httpx.Client(base_url=url, timeout=120) as http:
        sid = proxied(http, "proxy-down")
        result = py(http, sid, CHAT)
        assert result["exit_code"] == 3, result
        assert result["stdout"].startswith("502 ")
        assert "recording proxy" in result["stdout"] and "unreachable" in result["stdout"]


def test_relay_comes_back_after_an_orchestrator_restart(
        data_dir: Path, orchestrator: str, tmp_path: Path,
        model_stack: tuple[str, str, Path]) -> None:
    """The host end of the relay lives in the orchestrator: one that was SIGKILLed and
    restarted re-opens it when it re-adopts the sandbox."""
    port = free_port()
    url, sid = f"http://127.0.0.1:{port}", f"relay-{uuid.uuid4().hex[:8]}"
    with short_data_dir(data_dir) as d:
        proc = _start_server(d, port, tmp_path / "serve.log", model_proxy=model_stack[1])
        try:
            with httpx.Client(base_url=url, timeout=60) as http:
                create_ready(http, {"image": "host", "sandbox_id": sid, "session": "restarted",
                                    "model_proxy": True})
                assert py(http, sid, CHAT)["exit_code"] == 0
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            proc = _start_server(d, port, tmp_path / "serve.log", model_proxy=model_stack[1])
            with httpx.Client(base_url=url, timeout=60) as http:
                result = py(http, sid, CHAT)
                assert result["exit_code"] == 0, result
                # Re-opened for the session it was created with, and no other.
                result = py(http, sid, CHAT, "http://127.0.0.1:18080/s/other/v1/chat/completions")
                assert result["exit_code"] == 3 and result["stdout"].startswith("403 "), result
                assert http.delete(f"/sandboxes/{sid}").status_code == 200
                assert wait_until(lambda: gone(sid, d), 20)
            calls = httpx.get(f"{model_stack[1]}/sessions/restarted", headers=ADMIN).json()["calls"]
            assert len(calls) == 2
        finally:
            if proc.poll() is None:
                with httpx.Client(base_url=url, timeout=30) as http, \
                        contextlib.suppress(httpx.HTTPError):
                    http.delete(f"/sandboxes/{sid}")
                wait_until(lambda: gone(sid, d), 20)
                proc.terminate()
                proc.wait(20)
            force_remove(sid)


def test_model_proxy_url_must_be_plain_http(data_dir: Path, orchestrator: str) -> None:
    with pytest.raises(Exception, match="must be http://HOST:PORT"), dedicated_orchestrator(
            data_dir, model_proxy="https://proxy.example:443/v1"):
        pass


# --- Kubernetes: the same request, as an egress policy and pod environment ----------------------

def test_kubernetes_model_proxy_pod_and_policy(fake_cluster: FakeCluster,
                                               model_stack: tuple[str, str, Path]) -> None:
    api = fake_cluster.api
    proxy_url = model_stack[1]
    with namespace(api, "orchard-model-egress") as ns, kube_orchestrator(
            fake_cluster, namespace=ns, model_proxy_port=8080,
            model_proxy_pod_labels={"app": "proxy"}) as kube_plain:
        # An orchestrator with no model_proxy makes no policy and refuses such sandboxes.
        assert on_server(api, api.get_object("networkpolicies", ns, MODEL_EGRESS)) is None
        r = kube_plain.post("/sandboxes", json={"image": "python:3.12-slim", "session": "k1",
                                                "model_proxy": True})
        assert r.status_code == 400 and "model_proxy" in r.json()["detail"]

    with namespace(api, "orchard-model-egress2") as ns, _kube_with_proxy(
            fake_cluster, ns, proxy_url) as kube:
        policy = on_server(api, api.get_object("networkpolicies", ns, MODEL_EGRESS))
        assert policy is not None, "no model egress policy was made"
        assert _schema_errors(policy) == []
        spec = policy["spec"]
        assert spec["podSelector"] == {"matchLabels": {MODEL_PROXY: "true"}}
        assert spec["policyTypes"] == ["Egress"]
        to_proxy, to_dns = spec["egress"]
        assert to_proxy["to"] == [{"namespaceSelector": {"matchLabels": {
            "kubernetes.io/metadata.name": "orchard-system"}},
            "podSelector": {"matchLabels": {"app": "proxy"}}}]
        assert to_proxy["ports"] == [{"protocol": "TCP", "port": 8080}]
        assert {p["port"] for p in to_dns["ports"]} == {53}

        r = kube.post("/sandboxes", json={"image": "python:3.12-slim", "session": "k8s-roll",
                                          "model_proxy": True})
        assert r.status_code == 200, r.text
        sid = r.json()["sandbox_id"]
        assert kube.get(f"/sandboxes/{sid}/wait", params={"timeout": 60}).status_code == 200
        pod = get_pod(api, sid, ns)
        assert pod is not None
        assert pod["metadata"]["labels"][MODEL_PROXY] == "true"
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert env["OPENAI_BASE_URL"] == f"{proxy_url}/s/k8s-roll/v1"
        assert env["ORCHARD_SESSION"] == "k8s-roll"
        # Whether the CNI then lets this pod reach the proxy and nothing else cannot be seen
        # here: the fake kubelet enforces no NetworkPolicy (the opt-in real-cluster suite can).
        delete_and_wait(kube, api, sid, ns)


@contextlib.contextmanager
def _kube_with_proxy(cluster: FakeCluster, ns: str, proxy_url: str) -> Iterator[httpx.Client]:
    with short_dir() as data, EmbeddedOrchestrator(
            data_dir=data, model_proxy=proxy_url,
            **kube_settings(cluster, namespace=ns, model_proxy_pod_labels={"app": "proxy"})
    ) as url, httpx.Client(base_url=url, timeout=120) as client:
        yield client
