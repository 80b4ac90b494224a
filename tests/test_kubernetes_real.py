"""Opt-in: the Kubernetes backend against a REAL cluster (skipped unless KUBECONFIG is set).

    KUBECONFIG=~/.kube/config \\
    ORCHARD_TEST_AGENT_IMAGE=registry/orchard-agent-injector:TAG \\
    pytest -rs tests/test_kubernetes_real.py

Environment:

- ``KUBECONFIG``: the kubeconfig to use (its first file when it lists several); required.
- ``ORCHARD_TEST_AGENT_IMAGE``: the agent-injector image the cluster can pull
  (deploy/docker/agent-injector.Dockerfile); required.
- ``ORCHARD_TEST_NAMESPACE``: where the sandbox pods go (default ``orchard-sandboxes``); it
  must exist and the credentials need the RBAC of deploy/kubernetes.
- ``ORCHARD_TEST_IMAGE``: the sandbox image (default ``python:3.12-slim``; needs python3).
- ``ORCHARD_TEST_CONTEXT``: a kubeconfig context other than the current one.
- ``ORCHARD_TEST_EGRESS=1``: the cluster can reach the internet, so also check that a sandbox
  with ``block_network: false`` reaches 1.1.1.1:53 (the control for the blocking test).
- ``ORCHARD_TEST_HOST_USERS=1``: the cluster cannot run pods in user namespaces (Kubernetes
  < 1.33, an older runtime, gVisor): create sandbox pods without ``hostUsers: false``.
- ``ORCHARD_TEST_MODEL_PROXY``: the recording proxy's Service URL as pods reach it (e.g.
  ``http://orchard-proxy.orchard-system.svc:8080``, deploy/kubernetes/base/proxy.yaml), to
  check that a ``model_proxy`` sandbox reaches it and still nothing else.

The orchestrator runs embedded, with its usual SQLite state in a temporary directory, and
deletes its sandboxes when the module ends.
"""

from __future__ import annotations

import asyncio
import base64
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from orchard.env.server import EmbeddedOrchestrator
from tests.conftest import create_ready, run, wait_until

HOW_TO_RUN = (
    "real-cluster suite, opt-in: run it with KUBECONFIG=~/.kube/config "
    "ORCHARD_TEST_AGENT_IMAGE=registry/orchard-agent-injector:TAG "
    "pytest -rs tests/test_kubernetes_real.py (optional: ORCHARD_TEST_NAMESPACE, "
    "ORCHARD_TEST_IMAGE, ORCHARD_TEST_CONTEXT, ORCHARD_TEST_EGRESS=1)"
)
pytestmark = pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason=HOW_TO_RUN)

NAMESPACE = os.environ.get("ORCHARD_TEST_NAMESPACE") or "orchard-sandboxes"
IMAGE = os.environ.get("ORCHARD_TEST_IMAGE") or "python:3.12-slim"
CONTEXT = os.environ.get("ORCHARD_TEST_CONTEXT") or None
EGRESS = os.environ.get("ORCHARD_TEST_EGRESS") == "1"
MODEL_PROXY = os.environ.get("ORCHARD_TEST_MODEL_PROXY") or None
HOST_USERS = os.environ.get("ORCHARD_TEST_HOST_USERS") == "1"
READY_S = 600.0  # a first pull of both images can take minutes
CONNECT = "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), 3)\""


def _kubeconfig() -> str:
    first = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
    return os.path.expanduser(first)


def pod_exists(name: str) -> bool:
    """Ask the API server directly, not the orchestrator."""
    from kubernetes_asyncio import config as kube_config
    from kubernetes_asyncio.client import ApiClient, Configuration, CoreV1Api
    from kubernetes_asyncio.client.exceptions import ApiException

    async def check() -> bool:
        cfg = Configuration()
        await kube_config.load_kube_config(config_file=_kubeconfig(), context=CONTEXT,
                                           client_configuration=cfg)
        async with ApiClient(cfg) as api:
            try:
                await CoreV1Api(api).read_namespaced_pod(name, NAMESPACE)
            except ApiException as e:
                if e.status == 404:
                    return False
                raise
        return True

    return asyncio.run(check())


@pytest.fixture(scope="module")
def real_orchestrator() -> Iterator[str]:
    agent_image = os.environ.get("ORCHARD_TEST_AGENT_IMAGE")
    if not agent_image:
        pytest.fail("ORCHARD_TEST_AGENT_IMAGE is required with KUBECONFIG: the agent-injector "
                    "image the cluster can pull (build deploy/docker/agent-injector.Dockerfile "
                    "and push it), e.g. ORCHARD_TEST_AGENT_IMAGE="
                    "registry/orchard-agent-injector:TAG", pytrace=False)
    data_dir = Path(tempfile.mkdtemp(prefix="/tmp/orc-real-"))
    settings = {
        "backend": "kubernetes", "reconcile_interval": 2, "pending_timeout": READY_S,
        "model_proxy": MODEL_PROXY,
        "kubernetes": {"kubeconfig": _kubeconfig(), "context": CONTEXT, "namespace": NAMESPACE,
                       "agent_image": agent_image, "agent_secret": secrets.token_hex(16),
                       "ready_timeout": READY_S, "host_users": HOST_USERS},
    }
    try:
        with EmbeddedOrchestrator(data_dir=data_dir, **settings) as url:
            yield url
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def http(real_orchestrator: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=real_orchestrator, timeout=READY_S + 60) as client:
        yield client


@pytest.fixture(scope="module")
def sandbox(http: httpx.Client) -> Iterator[str]:
    """One ready sandbox (network blocked) shared by the module's tests."""
    sid = create_ready(http, {"image": IMAGE, "labels": {"suite": "kubernetes-real"}},
                       timeout=READY_S)
    yield sid
    http.delete(f"/sandboxes/{sid}")


def test_create_becomes_ready_as_a_pod(http: httpx.Client, sandbox: str) -> None:
    r = http.get(f"/sandboxes/{sandbox}")
    assert r.status_code == 200, r.text
    rec = r.json()
    assert rec["status"] == "running" and rec["backend"] == "kubernetes", rec
    assert rec["ready_at"] and rec["image"] == IMAGE, rec
    assert pod_exists(sandbox)
    r = http.get("/sandboxes", params={"label": "suite=kubernetes-real"})
    assert sandbox in {s["sandbox_id"] for s in r.json()["sandboxes"]}, r.text


def test_user_namespace_is_what_the_limits_say(http: httpx.Client, sandbox: str) -> None:
    """limits.user_namespace must not claim a namespace the node did not make (an API server
    or a runtime that drops hostUsers: false), nor deny one it did."""
    userns = http.get(f"/sandboxes/{sandbox}").json()["limits"]["user_namespace"]
    uid_map = run(http, sandbox, command="cat /proc/self/uid_map")["stdout"].split()
    shares_the_nodes = uid_map[:3] == ["0", "0", "4294967295"]
    assert shares_the_nodes is not userns["enforced"], (userns, uid_map)


def test_exec(http: httpx.Client, sandbox: str) -> None:
    out = run(http, sandbox, command="echo hello; echo oops >&2; exit 3")
    assert out["exit_code"] == 3 and out["stdout"] == "hello\n", out
    assert out["stderr"] == "oops\n" and out["status"] == "failed", out
    out = run(http, sandbox, argv=["python3", "-c", "import sys; print(sys.version_info[0])"])
    assert out["exit_code"] == 0 and out["stdout"] == "3\n", out
    out = run(http, sandbox, command="pwd; cat", stdin="from stdin")
    assert out["stdout"] == "/workspace\nfrom stdin", out


def test_file_round_trip(http: httpx.Client, sandbox: str) -> None:
    data = bytes(range(256)) * 64 + os.urandom(1000)
    r = http.post(f"/sandboxes/{sandbox}/files",
                  json={"path": "/workspace/blob.bin", "content": base64.b64encode(data).decode()})
    assert r.status_code == 200 and r.json()["size"] == len(data), r.text
    r = http.get(f"/sandboxes/{sandbox}/files", params={"path": "/workspace/blob.bin"})
    assert r.status_code == 200, r.text
    assert base64.b64decode(r.json()["content"]) == data

    r = http.put(f"/sandboxes/{sandbox}/files/raw", params={"path": "/workspace/raw.txt"},
                 content=b"raw bytes\n")
    assert r.status_code == 200, r.text
    out = run(http, sandbox, command="cat /workspace/raw.txt; wc -c < /workspace/blob.bin")
    assert out["stdout"].split() == ["raw", "bytes", str(len(data))], out
    r = http.get(f"/sandboxes/{sandbox}/files/raw", params={"path": "/workspace/raw.txt"})
    assert r.status_code == 200 and r.content == b"raw bytes\n", r.text
    r = http.get(f"/sandboxes/{sandbox}/files", params={"path": "/workspace/missing"})
    assert r.status_code == 404, r.text


PATCH = """\
--- a/hello.py
+++ b/hello.py
@@ -1,2 +1,2 @@
 import sys
-print("hello")
+print("patched")
"""


def test_apply_patch(http: httpx.Client, sandbox: str) -> None:
    original = 'import sys\nprint("hello")\n'
    r = http.post(f"/sandboxes/{sandbox}/files",
                  json={"path": "/workspace/hello.py",
                        "content": base64.b64encode(original.encode()).decode()})
    assert r.status_code == 200, r.text
    tools = run(http, sandbox, command="command -v git patch || true")["stdout"].split()
    r = http.post(f"/sandboxes/{sandbox}/apply_patch", json={"patch": PATCH})
    assert r.status_code == 200, r.text
    result = r.json()
    content = run(http, sandbox, command="cat /workspace/hello.py")["stdout"]
    if tools:  # the image has git and/or patch: the patch applies
        assert result["success"] and result["exit_code"] == 0, result
        assert content == 'import sys\nprint("patched")\n', content
    else:  # neither: a clear failure per method, and the file untouched
        assert not result["success"] and len(result["attempts"]) == 3, result
        assert content == original, content


def test_block_network_true_blocks_egress(http: httpx.Client, sandbox: str) -> None:
    out = run(http, sandbox, command=CONNECT, timeout_seconds=60)
    assert out["exit_code"] != 0, f"a block_network sandbox reached 1.1.1.1:53: {out}"
    assert "Error" in out["stderr"] or "timed out" in out["stderr"], out


@pytest.mark.skipif(not EGRESS, reason="set ORCHARD_TEST_EGRESS=1 where the cluster reaches "
                    "the internet: the control showing that blocking is what stops egress")
def test_block_network_false_allows_egress(http: httpx.Client) -> None:
    sid = create_ready(http, {"image": IMAGE, "block_network": False}, timeout=READY_S)
    try:
        # A fresh allow-egress policy may take a moment to reach the node's datapath.
        assert wait_until(lambda: run(http, sid, command=CONNECT, timeout_seconds=60)
                          ["exit_code"] == 0, timeout=60, interval=2), \
            run(http, sid, command=CONNECT, timeout_seconds=60)
    finally:
        http.delete(f"/sandboxes/{sid}")


@pytest.mark.skipif(not MODEL_PROXY, reason="set ORCHARD_TEST_MODEL_PROXY to the recording "
                    "proxy's Service URL to check model-only egress")
def test_model_proxy_sandbox_reaches_the_proxy_only(http: httpx.Client) -> None:
    sid = create_ready(http, {"image": IMAGE, "session": "real-egress", "model_proxy": True},
                       timeout=READY_S)
    health = ("python3 -c \"import os,urllib.request;u=os.environ['OPENAI_BASE_URL'];"
              "print(urllib.request.urlopen(u.split('/s/')[0]+'/health',timeout=10).read())\"")
    try:
        # The model egress policy and DNS may take a moment to reach the node's datapath.
        assert wait_until(lambda: run(http, sid, command=health, timeout_seconds=60)
                          ["exit_code"] == 0, timeout=60, interval=2), \
            run(http, sid, command=health, timeout_seconds=60)
        out = run(http, sid, command=CONNECT, timeout_seconds=60)
        assert out["exit_code"] != 0, f"a model_proxy sandbox reached 1.1.1.1:53: {out}"
    finally:
        http.delete(f"/sandboxes/{sid}")


def test_delete_removes_the_pod(http: httpx.Client) -> None:
    sid = create_ready(http, {"image": IMAGE}, timeout=READY_S)
    assert pod_exists(sid)
    r = http.delete(f"/sandboxes/{sid}")
    assert r.status_code == 200, r.text
    assert http.get(f"/sandboxes/{sid}").json()["status"] == "deleted"
    r = http.post(f"/sandboxes/{sid}/exec", json={"command": "true"})
    assert r.status_code == 404, r.text
    assert wait_until(lambda: not pod_exists(sid), timeout=180, interval=1), \
        f"pod {sid} still exists 180s after the delete"
