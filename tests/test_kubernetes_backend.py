"""The Kubernetes backend through the real REST API, on the fake cluster of tests/fakekube.

The orchestrator's real kubernetes_asyncio client talks HTTP to the fake API server; the fake
kubelet runs each pod as a local sandbox reached on its Pod IP. These tests check what the
backend promises: readiness from the watch, a hot path that never touches the API server, a
fixed number of writes per sandbox, recovery from broken watches and API faults, and
reconciliation that never deletes on a partial view.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import kubernetes_validate
import pytest
import yaml
from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client import CoreV1Api
from kubernetes_asyncio.client.exceptions import ApiException
from websockets.sync.client import connect

from deploy.validate import KUBERNETES_VERSION
from orchard.env.backends.base import BackendError, SandboxSpec
from orchard.env.backends.kubernetes import (
    KubernetesBackend,
    KubernetesConfig,
    agent_token,
    allow_egress_policy,
    deny_egress_policy,
    pod_manifest,
)
from orchard.env.backends.kubernetes.calls import ApiCaller
from orchard.env.backends.kubernetes.informer import NotSynced, PodInformer
from orchard.env.backends.kubernetes.manifests import DENY_EGRESS, allow_egress_name
from orchard.env.server import EmbeddedOrchestrator
from tests.conftest import free_port, kube_settings, needs_root, run, wait_until
from tests.fakekube.apiserver import FakeApiServer
from tests.fakekube.cluster import NAMESPACE as NS
from tests.fakekube.cluster import FakeCluster

pytestmark = needs_root

IMAGE = "python:3.12"
MANAGED = "app.kubernetes.io/managed-by=orchard"
WRITES = ("POST", "PUT", "PATCH", "DELETE")
SECRET = "test-secret"  # kube_settings' agent_secret
RECONCILE = 0.5  # kube_settings' reconcile_interval
RETRIES = KubernetesConfig().api_retries


# --- the fake cluster, seen in-process (these reads are not logged as API requests) ----------

def on_server(api: FakeApiServer, coro: Any) -> Any:
    return api.run_in_loop(coro).result(timeout=30)


def get_pod(api: FakeApiServer, name: str, ns: str = NS) -> dict | None:
    return on_server(api, api.get_object("pods", ns, name))


def orchard_pods(api: FakeApiServer, ns: str | None = NS) -> set[str]:
    """Names of the sandbox pods in ns (None: in every namespace)."""
    return {p["metadata"]["name"]
            for p in on_server(api, api.list_objects("pods", ns, MANAGED))}


def policies(api: FakeApiServer, ns: str | None = NS) -> set[str]:
    return {p["metadata"]["name"] for p in on_server(api, api.list_objects("networkpolicies", ns))}


def writes(api: FakeApiServer) -> Counter[tuple[str, str | None]]:
    """The orchestrator's writes to the API server since the last reset_counts()."""
    return Counter((r.method, r.resource) for r in api.requests if r.method in WRITES)


def delete_behind_its_back(api: FakeApiServer, name: str, ns: str = NS) -> None:
    on_server(api, api.delete_object("pods", ns, name))


def create_orphan(api: FakeApiServer, name: str, ns: str = NS) -> None:
    """A sandbox pod exactly as an orchestrator makes it, with no record in any store."""
    spec = SandboxSpec(sandbox_id=name, image=IMAGE)
    body = pod_manifest(spec, KubernetesConfig(namespace=ns),
                        agent_token(SECRET.encode(), name), "orphan")
    on_server(api, api.create_object("pods", ns, body))


@contextlib.contextmanager
def namespace(api: FakeApiServer, name: str) -> Iterator[str]:
    """A namespace of its own for a second orchestrator. Orchestrators sharing a namespace
    but not a state store take each other's pods for orphans, as they should."""
    on_server(api, api.create_object("namespaces", None, {"metadata": {"name": name}}))
    try:
        yield name
        assert wait_until(lambda: not orchard_pods(api, name), 60), orchard_pods(api, name)
        assert not {p for p in policies(api, name) if p.startswith("orchard-allow-egress-")}
    finally:
        on_server(api, api.delete_object("namespaces", None, name))


def force_relist(api: FakeApiServer, and_then: Any = None) -> None:
    """Cut every watch so that it can only resume with a 410: a write the pod watch does not
    see moves the history past the informer's version, then the history is compacted. All on
    the server loop in one go, so no BOOKMARK can bring the informer up to date in between.
    ``and_then`` (a coroutine function) runs just before the cut, e.g. to delete a pod whose
    DELETED event must never reach the informer."""
    async def cut() -> None:
        bump = {"metadata": {"name": "orchard-test-bump"}}
        await api.create_object("configmaps", "default", bump)
        await api.delete_object("configmaps", "default", "orchard-test-bump")
        if and_then is not None:
            await and_then()
        api.compact()
        api.disconnect_watches()
    on_server(api, cut())


def clear_faults(api: FakeApiServer) -> None:
    """Drop faults a failed test left armed (FakeApiServer has no public way to)."""
    with api._faults_lock:
        api._faults.clear()


@contextlib.contextmanager
def paused_kubelet(cluster: FakeCluster) -> Iterator[None]:
    """Pods created meanwhile stay Pending; on exit the kubelet picks them up (its start-up
    path: it runs every pod it does not run yet), as after a slow image pull."""
    kubelet = cluster.kubelet
    assert kubelet is not None

    async def detach() -> None:
        cluster.api.remove_listener(kubelet._on_event)
    on_server(cluster.api, detach())
    try:
        yield
    finally:
        on_server(cluster.api, kubelet._attach())


# --- the orchestrator, seen through its REST API ---------------------------------------------

@contextlib.contextmanager
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="/tmp/orc-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# The orchestrator behind each client kube_orchestrator yields, by base URL.
ORCHESTRATORS: dict[str, EmbeddedOrchestrator] = {}


@contextlib.contextmanager
def kube_orchestrator(cluster: FakeCluster, **kubernetes: object) -> Iterator[httpx.Client]:
    """A private orchestrator on the kubernetes backend; deletes its sandboxes when done."""
    with short_dir() as data:
        embedded = EmbeddedOrchestrator(data_dir=data, **kube_settings(cluster, **kubernetes))
        with embedded as url, httpx.Client(base_url=url, timeout=120) as client:
            ORCHESTRATORS[str(client.base_url)] = embedded
            try:
                yield client
            finally:
                del ORCHESTRATORS[str(client.base_url)]


def reconcile(http: httpx.Client, passes: int = 3) -> None:
    """Reconcile passes run to completion now: what they must not do can then be asserted,
    where sleeping for a few intervals proves nothing on a machine too busy to run one."""
    for _ in range(passes):
        ORCHESTRATORS[str(http.base_url)].reconcile_once()


def record(http: httpx.Client, sid: str) -> dict:
    r = http.get(f"/sandboxes/{sid}")
    assert r.status_code == 200, r.text
    return r.json()


def wait_status(http: httpx.Client, sid: str, status: str, timeout: float = 60) -> dict:
    assert wait_until(lambda: record(http, sid)["status"] == status, timeout), record(http, sid)
    return record(http, sid)


def create(http: httpx.Client, **body: object) -> str:
    r = http.post("/sandboxes", json={"image": IMAGE, **body})
    assert r.status_code == 200, r.text
    return r.json()["sandbox_id"]


def create_ready(http: httpx.Client, api: FakeApiServer, ns: str = NS, **body: object) -> str:
    """A sandbox that became ready; if it did not, the failure shows its pod."""
    sid = create(http, **body)
    r = http.get(f"/sandboxes/{sid}/wait", params={"timeout": 60})
    assert r.status_code == 200, (r.text, get_pod(api, sid, ns))
    assert r.json()["status"] == "running"
    return sid


def delete_and_wait(http: httpx.Client, api: FakeApiServer, sid: str, ns: str = NS) -> None:
    r = http.delete(f"/sandboxes/{sid}")
    assert r.status_code == 200, r.text
    assert wait_until(lambda: get_pod(api, sid, ns) is None, 60), f"pod {sid} never deleted"


def informer_state(http: httpx.Client) -> str:
    return http.get("/resources").json()["cgroup"]["informer"]


def ws_url(http: httpx.Client, sid: str) -> str:
    base = str(http.base_url).rstrip("/").replace("http://", "ws://")
    return f"{base}/sandboxes/{sid}/exec/pty?command=/bin/sh"


# --- fixtures --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster(fake_cluster: FakeCluster) -> Iterator[FakeCluster]:
    """The session's fake cluster; after this module no sandbox of it may be left anywhere."""
    yield fake_cluster
    api, kubelet = fake_cluster.api, fake_cluster.kubelet
    assert kubelet is not None
    assert wait_until(lambda: not orchard_pods(api, None), 60), orchard_pods(api, None)
    assert wait_until(lambda: not kubelet.sandboxes(), 60), kubelet.sandboxes()
    assert not {p for p in policies(api, None) if p.startswith("orchard-allow-egress-")}


@pytest.fixture(scope="module")
def kube(cluster: FakeCluster) -> Iterator[httpx.Client]:
    """One orchestrator on the kubernetes backend, shared by the module."""
    with kube_orchestrator(cluster) as client:
        yield client


@pytest.fixture()
def api(cluster: FakeCluster) -> Iterator[FakeApiServer]:
    yield cluster.api
    clear_faults(cluster.api)


@pytest.fixture()
def ready(kube: httpx.Client, api: FakeApiServer) -> Iterator[str]:
    """A ready sandbox of the shared orchestrator, deleted afterwards."""
    sid = create_ready(kube, api)
    yield sid
    kube.delete(f"/sandboxes/{sid}")
    assert wait_until(lambda: get_pod(api, sid) is None, 60)


# --- 1. readiness and the pod spec -----------------------------------------------------------

def test_pending_until_the_kubelet_reports_ready(kube: httpx.Client, api: FakeApiServer,
                                                 cluster: FakeCluster) -> None:
    labels = {"team": "ml", "not a k8s label!": "kept in the annotation"}
    with paused_kubelet(cluster):
        sid = create(kube, cpu="500m", memory="256Mi", labels=labels)
        assert wait_until(lambda: get_pod(api, sid) is not None, 30)
        assert record(kube, sid)["status"] == "pending"
        # Running with an IP, but not Ready: not ready for orchard either.
        on_server(api, api.update_status("pods", NS, sid, {
            "phase": "Running", "podIP": "127.42.255.254",
            "conditions": [{"type": "Ready", "status": "False"}]}))
        r = kube.get(f"/sandboxes/{sid}/wait", params={"timeout": 1.5})
        assert r.status_code == 408, r.text
        assert record(kube, sid)["status"] == "pending"
    r = kube.get(f"/sandboxes/{sid}/wait", params={"timeout": 60})
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "running"
    assert run(kube, sid, command="echo ready")["stdout"] == "ready\n"

    pod = get_pod(api, sid)
    assert pod is not None
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["labels"]["app.kubernetes.io/managed-by"] == "orchard"
    assert meta["labels"]["orchard.dev/sandbox-id"] == sid
    assert meta["labels"]["orchard.dev/network"] == "blocked"
    assert meta["labels"]["label.orchard.dev/team"] == "ml"
    assert not any("not a k8s label" in k for k in meta["labels"])
    assert json.loads(meta["annotations"]["orchard.dev/labels"]) == labels
    assert spec["automountServiceAccountToken"] is False
    assert spec["restartPolicy"] == "Never"
    assert spec["hostUsers"] is False  # a user namespace of its own (kubernetes.host_users)
    [init] = spec["initContainers"]
    assert init["name"] == "agent-injector"
    [bundle] = spec["volumes"]
    assert "emptyDir" in bundle
    assert {m["name"] for m in init["volumeMounts"]} == {bundle["name"]}
    [main] = spec["containers"]
    assert main["image"] == IMAGE
    assert {m["name"] for m in main["volumeMounts"]} == {bundle["name"]}
    assert all(m.get("readOnly") for m in main["volumeMounts"])
    for container in (init, main):
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    for probe in ("startupProbe", "readinessProbe"):
        assert main[probe]["httpGet"] == {"path": "/health", "port": 9090}
    assert main["resources"] == {"requests": {"cpu": "500m", "memory": "256Mi"},
                                 "limits": {"cpu": "500m", "memory": "256Mi"}}
    # The token the pod gets is the one every replica derives, not the cluster's.
    env = {e["name"]: e["value"] for e in main["env"]}
    assert env["ORCHARD_AGENT_TOKEN"] == agent_token(SECRET.encode(), sid)
    for absent in ("nodeSelector", "tolerations", "runtimeClassName", "imagePullSecrets"):
        assert absent not in spec
    delete_and_wait(kube, api, sid)


def test_configured_scheduling_reaches_the_pod(cluster: FakeCluster, api: FakeApiServer) -> None:
    toleration = {"key": "sandboxes", "operator": "Equal", "value": "yes",
                  "effect": "NoSchedule"}
    with namespace(api, "orchard-scheduling") as ns, kube_orchestrator(
            cluster, namespace=ns, node_selector={"pool": "sandboxes"},
            tolerations=[toleration], runtime_class="gvisor",
            image_pull_secrets=["registry-creds"], labels={"cost-center": "42"},
            annotations={"example.com/owner": "tests"}) as http:
        sid = create_ready(http, api, ns)
        pod = get_pod(api, sid, ns)
        assert pod is not None
        spec, meta = pod["spec"], pod["metadata"]
        assert spec["nodeSelector"] == {"pool": "sandboxes"}
        assert spec["tolerations"] == [toleration]
        assert spec["runtimeClassName"] == "gvisor"
        assert spec["imagePullSecrets"] == [{"name": "registry-creds"}]
        assert meta["labels"]["cost-center"] == "42"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "orchard"
        assert meta["annotations"]["example.com/owner"] == "tests"
        assert run(http, sid, command="echo scheduled")["stdout"] == "scheduled\n"
        delete_and_wait(http, api, sid, ns)


# --- 2. what the backend sends validates against the real schemas -----------------------------

def _schema_errors(doc: dict) -> list[str]:
    """As deploy/validate.py checks its manifests: strict, against KUBERNETES_VERSION."""
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{'.'.join(map(str, exc.path))}: {exc.message}"]
    return []


@pytest.mark.parametrize("variant", ["minimal", "everything"])
def test_manifests_validate_strictly(variant: str) -> None:
    if variant == "minimal":
        config, spec = KubernetesConfig(), SandboxSpec(sandbox_id="sb-minimal", image=IMAGE)
    else:
        config = KubernetesConfig(
            node_selector={"pool": "sandboxes"}, runtime_class="gvisor",
            tolerations=[{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}],
            image_pull_secrets=["creds"], labels={"team": "ml"}, annotations={"a/b": "c"},
            add_capabilities=["CHOWN"], image_pull_policy="Always", egress_cidr="10.0.0.0/8",
            blocked_egress=["10.128.0.0/20", "203.0.113.10", "2001:db8:1::/48"])
        spec = SandboxSpec(sandbox_id="sb-everything", image="registry.example/x:1",
                           block_network=False, cpu="2", memory="1Gi", disk="2Gi",
                           env={"A": "1"}, labels={"k": "v", "bad key": "x"})
    listed = SandboxSpec(sandbox_id="sb-listed", image=IMAGE, block_network=False,
                         egress=["0.0.0.0/0", "2001:db8::/32"])
    docs = [pod_manifest(spec, config, "token", "nonce"), deny_egress_policy(config),
            allow_egress_policy(spec, config), allow_egress_policy(listed, config)]
    assert [d["kind"] for d in docs] == ["Pod", "NetworkPolicy", "NetworkPolicy",
                                         "NetworkPolicy"]
    for doc in docs:
        assert _schema_errors(doc) == [], doc["kind"]


def test_schema_check_is_strict() -> None:
    """The check above would notice a misspelled field."""
    pod = pod_manifest(SandboxSpec(sandbox_id="sb-x", image=IMAGE), KubernetesConfig(), "t", "n")
    pod["spec"]["automountServiceAcountToken"] = False
    assert _schema_errors(pod)


# --- 3. the hot path never reaches the API server ---------------------------------------------

PATCH = """\
--- a/notes.txt
+++ b/notes.txt
@@ -1,2 +1,2 @@
 first
-second
+SECOND
"""


def test_hot_path_makes_no_api_requests(kube: httpx.Client, api: FakeApiServer,
                                        ready: str) -> None:
    sid = ready
    run(kube, sid, command="true")  # the agent connection exists before counting starts
    api.reset_counts()

    assert run(kube, sid, command="echo hi; hostname")["stdout"] == f"hi\n{sid}\n"
    accepted = run(kube, sid, command="echo later", wait=False)
    r = kube.get(f"/jobs/{accepted['job_id']}/wait", params={"timeout": 30})
    assert r.json()["stdout"] == "later\n"
    with kube.stream("POST", f"/sandboxes/{sid}/exec",
                     json={"command": "echo a; echo b", "stream": True}) as r:
        events = [json.loads(line) for line in r.iter_lines() if line]
    assert events[-1]["type"] == "exit" and events[-1]["job"]["stdout"] == "a\nb\n"

    content = base64.b64encode(b"first\nsecond\n").decode()
    r = kube.post(f"/sandboxes/{sid}/files", json={"path": "notes.txt", "content": content})
    assert r.status_code == 200, r.text
    r = kube.put(f"/sandboxes/{sid}/files/raw", params={"path": "raw.bin"}, content=b"\0" * 999)
    assert r.json()["size"] == 999
    r = kube.get(f"/sandboxes/{sid}/files/list")
    assert {"notes.txt", "raw.bin"} <= {f["name"] for f in r.json()["files"]}
    r = kube.post(f"/sandboxes/{sid}/apply_patch", json={"patch": PATCH})
    assert r.json()["success"] is True, r.text
    r = kube.get(f"/sandboxes/{sid}/files", params={"path": "notes.txt"})
    assert base64.b64decode(r.json()["content"]) == b"first\nSECOND\n"
    assert kube.get(f"/sandboxes/{sid}/files/raw", params={"path": "raw.bin"}).content \
        == b"\0" * 999

    proc = run(kube, sid, command="echo from-bg", background=True)
    url = f"/sandboxes/{sid}/processes/{proc['process_id']}"
    assert wait_until(lambda: kube.get(url).json()["running"] is False, 30)
    out = kube.get(f"{url}/output").json()
    assert base64.b64decode(out["stdout_b64"]) == b"from-bg\n"

    with connect(ws_url(kube, sid), open_timeout=30) as ws:
        ws.send(b"echo pty-$((6 * 7))\nexit 4\n")
        seen, exit_code = b"", None
        while exit_code is None:
            msg = ws.recv(timeout=30)
            if isinstance(msg, str):
                exit_code = json.loads(msg)["exit_code"]
            else:
                seen += msg
    assert b"pty-42" in seen and exit_code == 4

    reconcile(kube)  # reconcile passes over a running sandbox must not ask either
    made = [f"{r.method} {r.path}" for r in api.requests if not r.watch]
    assert made == [], f"the hot path reached the API server: {made}"


# --- 4. API requests per sandbox --------------------------------------------------------------

@pytest.mark.parametrize("block_network", [True, False])
def test_writes_per_sandbox_lifecycle(kube: httpx.Client, api: FakeApiServer,
                                      block_network: bool) -> None:
    api.reset_counts()
    sid = create_ready(kube, api, block_network=block_network)
    allow = allow_egress_name(sid)
    if block_network:
        assert allow not in policies(api)
        assert get_pod(api, sid)["metadata"]["labels"]["orchard.dev/network"] == "blocked"
    else:
        assert allow in policies(api)
        policy = on_server(api, api.get_object("networkpolicies", NS, allow))
        assert policy["spec"]["podSelector"] == {"matchLabels": {"orchard.dev/sandbox-id": sid}}
        block = policy["spec"]["egress"][0]["to"][0]["ipBlock"]
        assert block["cidr"] == "0.0.0.0/0" and "10.0.0.0/8" in block["except"], policy
    assert run(kube, sid, command="echo x")["stdout"] == "x\n"
    delete_and_wait(kube, api, sid)
    assert wait_until(lambda: allow not in policies(api), 30)
    reconcile(kube)  # which must write nothing
    expected = Counter({("POST", "pods"): 1, ("DELETE", "pods"): 1})
    if not block_network:
        expected += Counter({("POST", "networkpolicies"): 1, ("DELETE", "networkpolicies"): 1})
    assert writes(api) == expected


def test_deny_egress_policy_is_made_once_per_namespace(cluster: FakeCluster,
                                                       api: FakeApiServer,
                                                       kube: httpx.Client) -> None:
    policy = on_server(api, api.get_object("networkpolicies", NS, DENY_EGRESS))
    assert policy is not None, "the shared orchestrator made no deny-egress policy"
    assert policy["spec"] == {"podSelector": {"matchLabels": {
        "app.kubernetes.io/managed-by": "orchard"}}, "policyTypes": ["Egress"], "egress": []}
    # The first orchestrator in a namespace makes it; the next ones find it there.
    with namespace(api, "orchard-deny") as ns:
        api.reset_counts()
        for _ in range(2):
            with kube_orchestrator(cluster, namespace=ns):
                pass
        assert api.count(method="POST", resource="networkpolicies") == 1
        assert api.count(method="GET", resource="networkpolicies", name=DENY_EGRESS) == 2
        assert policies(api, ns) == {DENY_EGRESS}
        assert on_server(api, api.get_object("networkpolicies", ns, DENY_EGRESS))["spec"] \
            == policy["spec"]


# --- 5. broken watches ------------------------------------------------------------------------

def test_ready_after_watches_are_cut(kube: httpx.Client, api: FakeApiServer) -> None:
    api.reset_counts()
    api.disconnect_watches()
    sid = create_ready(kube, api)
    assert api.count(resource="pods", watch=True) >= 1, "the informer never watched again"
    delete_and_wait(kube, api, sid)


def test_relist_after_history_is_compacted(kube: httpx.Client, api: FakeApiServer,
                                           ready: str) -> None:
    api.reset_counts()
    force_relist(api)
    sid = create_ready(kube, api)
    assert api.count(resource="pods", verbs="list") >= 1, "no relist after a 410"
    assert wait_until(lambda: informer_state(kube) == "synced", 30)
    for live in (ready, sid):
        assert record(kube, live)["status"] == "running"
        assert run(kube, live, command="echo ok")["stdout"] == "ok\n"
    delete_and_wait(kube, api, sid)


def test_pod_deleted_while_the_watch_was_down_is_noticed(kube: httpx.Client,
                                                         api: FakeApiServer) -> None:
    sid = create_ready(kube, api)
    api.reset_counts()
    api.inject_fault(500, resource="pods", watch=True, times=3)
    # The DELETED event is lost with the watch: only the relist can tell.
    force_relist(api, and_then=lambda: api.delete_object("pods", NS, sid))
    rec = wait_status(kube, sid, "failed")
    assert "exited unexpectedly" in rec["error"]
    assert api.count(resource="pods", watch=True) >= 3, "the watch was never refused"
    assert api.count(resource="pods", verbs="list") >= 1, "no relist"


# --- 6. API faults ----------------------------------------------------------------------------

def _pod_creates(api: FakeApiServer) -> list[float]:
    return [r.time for r in api.requests if r.method == "POST" and r.resource == "pods"]


def test_create_is_retried_after_server_errors(kube: httpx.Client, api: FakeApiServer) -> None:
    api.reset_counts()
    api.inject_fault(500, method="POST", resource="pods", times=2)
    sid = create_ready(kube, api)
    assert len(_pod_creates(api)) == 3
    assert orchard_pods(api) >= {sid}
    delete_and_wait(kube, api, sid)


def test_create_honours_retry_after(kube: httpx.Client, api: FakeApiServer) -> None:
    api.reset_counts()
    api.inject_fault(429, method="POST", resource="pods", times=1, retry_after=1)
    sid = create_ready(kube, api)
    first, second = _pod_creates(api)
    assert second - first >= 0.9, "retried before the Retry-After the server asked for"
    delete_and_wait(kube, api, sid)


def test_persistent_fault_fails_the_sandbox(kube: httpx.Client, api: FakeApiServer) -> None:
    api.reset_counts()
    api.inject_fault(503, method="POST", resource="pods", times=RETRIES + 1)
    sid = create(kube)
    r = kube.get(f"/sandboxes/{sid}/wait", params={"timeout": 60})
    assert r.status_code == 200 and r.json()["ready"] is False, r.text
    rec = record(kube, sid)
    assert rec["status"] == "failed"
    assert f"creating pod {sid}: 503" in rec["error"]
    assert len(_pod_creates(api)) == RETRIES + 1
    assert get_pod(api, sid) is None


def test_forbidden_is_not_retried_and_says_rbac(kube: httpx.Client, api: FakeApiServer) -> None:
    api.reset_counts()
    api.inject_fault(403, method="POST", resource="pods", times=1)
    sid = create(kube)
    rec = wait_status(kube, sid, "failed")
    assert "403" in rec["error"] and "RBAC" in rec["error"], rec["error"]
    assert len(_pod_creates(api)) == 1


def test_failed_pod_lists_never_delete(kube: httpx.Client, api: FakeApiServer,
                                       ready: str) -> None:
    other = create_ready(kube, api, block_network=False)
    api.reset_counts()
    # Enough for two relists to give up after all their retries.
    api.inject_fault(500, method="GET", resource="pods", watch=False, times=2 * (RETRIES + 1))
    force_relist(api)
    assert wait_until(lambda: informer_state(kube).startswith("not synced"), 30)
    assert wait_until(lambda: informer_state(kube) == "synced", 90)
    assert api.count(resource="pods", verbs="list") >= 2 * (RETRIES + 1) + 1
    reconcile(kube)  # on the fresh view
    assert writes(api) == Counter()
    for sid in (ready, other):
        assert record(kube, sid)["status"] == "running"
        assert run(kube, sid, command="echo alive")["stdout"] == "alive\n"
    assert orchard_pods(api) >= {ready, other}
    delete_and_wait(kube, api, other)


# --- 7. reconciliation ------------------------------------------------------------------------

def test_orphan_pod_is_deleted(kube: httpx.Client, api: FakeApiServer,
                               cluster: FakeCluster) -> None:
    create_orphan(api, "orphan-pod")
    assert wait_until(lambda: get_pod(api, "orphan-pod") is None, 30)
    assert wait_until(lambda: "orphan-pod" not in cluster.kubelet.sandboxes(), 30)
    assert kube.get("/sandboxes/orphan-pod").status_code == 404


def test_pod_deleted_behind_its_back_fails_the_record(kube: httpx.Client,
                                                      api: FakeApiServer) -> None:
    sid = create_ready(kube, api)
    delete_behind_its_back(api, sid)
    rec = wait_status(kube, sid, "failed")
    assert "exited unexpectedly" in rec["error"]
    r = kube.post(f"/sandboxes/{sid}/exec", json={"command": "true"})
    assert r.status_code == 409 and "failed" in r.json()["detail"]


def test_failed_pod_fails_the_record_and_is_deleted(kube: httpx.Client, api: FakeApiServer,
                                                    cluster: FakeCluster) -> None:
    sid = create_ready(kube, api)
    cluster.kubelet.fail_pod(NS, sid)
    rec = wait_status(kube, sid, "failed")
    assert "exited unexpectedly" in rec["error"]
    assert wait_until(lambda: get_pod(api, sid) is None, 30), "the failed pod was kept"


def test_unpullable_image_fails_fast(kube: httpx.Client, api: FakeApiServer) -> None:
    sid = create(kube, image="missing/no-such-image:1")
    # Well before ready_timeout (600 s): the pull error is final.
    r = kube.get(f"/sandboxes/{sid}/wait", params={"timeout": 60})
    assert r.status_code == 200 and r.json()["status"] == "failed", r.text
    assert "ErrImagePull" in r.json()["status_message"]
    rec = record(kube, sid)
    assert rec["status"] == "failed" and "ErrImagePull" in rec["error"]
    assert "missing/no-such-image:1" in rec["error"]
    assert wait_until(lambda: get_pod(api, sid) is None, 30)


def test_ttl_expiry_deletes_the_pod(kube: httpx.Client, api: FakeApiServer) -> None:
    sid = create_ready(kube, api, ttl=2)
    assert get_pod(api, sid) is not None
    rec = wait_status(kube, sid, "deleted", timeout=30)
    assert rec["error"] == "ttl expired"
    assert wait_until(lambda: get_pod(api, sid) is None, 30)


# --- 8. restart -------------------------------------------------------------------------------


def _serve(cluster: FakeCluster, ns: str, data: Path, port: int) -> subprocess.Popen[bytes]:
    """`orchard serve` on the kubernetes backend, configured by a YAML file, until killed."""
    config = data / "orchard.yaml"
    config.write_text(yaml.safe_dump({
        "data_dir": str(data), "reconcile_interval": RECONCILE,
        "kubernetes": {"kubeconfig": str(cluster.kubeconfig), "agent_secret": SECRET,
                       "namespace": ns}}))
    orchard = Path(sys.executable).with_name("orchard")
    log = (data / "serve.log").open("ab")
    proc = subprocess.Popen(
        [str(orchard), "serve", "--backend", "kubernetes", "--config", str(config),
         "--state", f"sqlite:///{data / 'state.db'}", "--port", str(port),
         "--log-level", "warning"], stdout=log, stderr=log)

    def up() -> bool:
        assert proc.poll() is None, (data / "serve.log").read_text()
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
        return False
    assert wait_until(up, 60, interval=0.2), (data / "serve.log").read_text()
    return proc


def test_restart_readopts_and_reaps_orphans(cluster: FakeCluster, api: FakeApiServer) -> None:
    port, sid, orphan = free_port(), None, "orphan-while-down"
    with namespace(api, "orchard-restart") as ns, short_dir() as data, \
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as http:
        proc = _serve(cluster, ns, data, port)
        try:
            sid = create_ready(http, api, ns)
            assert run(http, sid, command="echo $((1 + 1)) > /workspace/kept")["exit_code"] == 0
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
            create_orphan(api, orphan, ns)
            assert get_pod(api, sid, ns) is not None, "the sandbox died with its orchestrator"

            proc = _serve(cluster, ns, data, port)
            assert record(http, sid)["status"] == "running", record(http, sid)
            assert run(http, sid, command="cat /workspace/kept")["stdout"] == "2\n"
            assert wait_until(lambda: get_pod(api, orphan, ns) is None, 30)
            assert record(http, sid)["status"] == "running", record(http, sid)
            delete_and_wait(http, api, sid, ns)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)


# --- 9. bad input -----------------------------------------------------------------------------

@pytest.mark.parametrize("image", ["host", "/srv/rootfs"])
def test_local_only_images_are_rejected(kube: httpx.Client, api: FakeApiServer,
                                        image: str) -> None:
    api.reset_counts()
    r = kube.post("/sandboxes", json={"image": image})
    assert r.status_code == 400, r.text
    assert "container image" in r.json()["detail"]
    assert api.count(method="POST") == 0


def test_unknown_and_deleted_sandboxes_are_404(kube: httpx.Client, api: FakeApiServer) -> None:
    # DELETE is idempotent (200, found: false), as in the reference system.
    for method, path in [("GET", ""), ("GET", "/wait"),
                         ("POST", "/exec"), ("GET", "/files/list")]:
        r = kube.request(method, f"/sandboxes/sb-no-such-one{path}",
                         json={"command": "true"} if method == "POST" else None)
        assert r.status_code == 404, (method, path, r.text)
    sid = create_ready(kube, api)
    delete_and_wait(kube, api, sid)
    r = kube.post(f"/sandboxes/{sid}/exec", json={"command": "true"})
    assert r.status_code == 404, r.text


# --- unit: the API caller and the informer on their own ---------------------------------------

class _Response:
    def __init__(self, status: int, body: dict, headers: dict[str, str] | None = None) -> None:
        self.status, self.reason, self.headers = status, "Reason", headers or {}
        self._body = json.dumps(body).encode()

    async def read(self) -> bytes:
        return self._body

    def release(self) -> None:
        pass


def _caller_run(responses: list[Any], retries: int = 3, timeout: float = 5) -> tuple[Any, int]:
    """(what ApiCaller returned or raised, how many attempts it made)."""
    attempts = 0

    async def call() -> Any:
        nonlocal attempts
        attempts += 1
        answer = responses[min(attempts, len(responses)) - 1]
        if isinstance(answer, Exception):
            raise answer
        if answer == "hang":
            await asyncio.sleep(3600)
        return answer

    async def main() -> Any:
        try:
            return await ApiCaller(2, retries, timeout)("verb", call)
        except ApiException as e:
            return e
    return asyncio.run(main()), attempts


def test_api_caller_does_not_retry_forbidden() -> None:
    status = {"kind": "Status", "message": 'pods is forbidden: User "x" cannot create'}
    result, attempts = _caller_run([_Response(403, status), _Response(201, {"ok": 1})])
    assert isinstance(result, ApiException) and result.status == 403
    assert "forbidden" in result.reason  # the server's message, not just "Forbidden"
    assert attempts == 1


def test_api_caller_retries_server_errors_and_timeouts() -> None:
    result, attempts = _caller_run([_Response(503, {}), _Response(200, {"ok": 1})])
    assert (result, attempts) == ({"ok": 1}, 2)
    result, attempts = _caller_run(["hang"], retries=2, timeout=0.05)
    assert isinstance(result, ApiException) and result.status == 0
    assert attempts == 3
    result, attempts = _caller_run([_Response(500, {})] * 9, retries=2)
    assert isinstance(result, ApiException) and result.status == 500 and attempts == 3
    result, attempts = _caller_run([_Response(429, {}, {"Retry-After": "0"}),
                                    ConnectionResetError(), _Response(200, {"ok": 2})])
    assert (result, attempts) == ({"ok": 2}, 3)


@pytest.fixture()
def private_api() -> Iterator[tuple[FakeApiServer, Path]]:
    """An API server of its own (no kubelet), for faults that must not touch the cluster."""
    with short_dir() as tmp, FakeApiServer(
            token="t", namespaces=("default", NS)) as server:
        yield server, server.write_kubeconfig(tmp / "kubeconfig", namespace=NS)


def test_informer_refuses_to_answer_until_it_can_list(
        private_api: tuple[FakeApiServer, Path]) -> None:
    server, kubeconfig = private_api
    server.inject_fault(403, method="GET", resource="pods", watch=False, times=2)

    async def main() -> None:
        client = await kube_config.new_client_from_config(str(kubeconfig))
        informer = PodInformer(CoreV1Api(client), NS, MANAGED, ApiCaller(4, 0, 5), 5)
        task = asyncio.create_task(informer.run())
        try:
            async with asyncio.timeout(10):
                while informer.last_error is None:
                    await asyncio.sleep(0.01)
            assert "403" in informer.last_error
            with pytest.raises(NotSynced, match="403"):
                informer.names()
            await asyncio.wait_for(informer.first_sync.wait(), 30)
            assert informer.names() == set()
            spec = SandboxSpec(sandbox_id="sb-seen", image=IMAGE)
            body = pod_manifest(spec, KubernetesConfig(), "t", "n")
            await asyncio.wrap_future(server.run_in_loop(server.create_object("pods", NS, body)))
            pod = await informer.wait_for("sb-seen", lambda p: p is not None, 10)
            assert pod is not None and pod["metadata"]["name"] == "sb-seen"
            with pytest.raises(TimeoutError):
                await informer.wait_for("sb-never", lambda p: p is not None, 0.2)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await client.close()
    asyncio.run(main())


def test_backend_start_says_why_it_cannot_list(
        private_api: tuple[FakeApiServer, Path]) -> None:
    server, kubeconfig = private_api
    server.inject_fault(403, method="GET", resource="pods", watch=False, times=1000)
    backend = KubernetesBackend(KubernetesConfig(kubeconfig=str(kubeconfig), agent_secret="s",
                                                 api_timeout=1))
    with pytest.raises(BackendError) as info:
        asyncio.run(backend.start())
    message = str(info.value)
    assert "403" in message and NS in message and "RBAC" in message


# --- 10. nothing leaks ------------------------------------------------------------------------

def test_zz_every_pod_and_policy_goes_with_its_sandbox(kube: httpx.Client, api: FakeApiServer,
                                                       cluster: FakeCluster) -> None:
    live = kube.get("/sandboxes").json()["sandboxes"]
    for sb in live:
        if sb["status"] in ("pending", "running"):
            kube.delete(f"/sandboxes/{sb['sandbox_id']}")
    assert wait_until(lambda: not orchard_pods(api), 60), orchard_pods(api)
    assert wait_until(lambda: not cluster.kubelet.sandboxes(), 60), cluster.kubelet.sandboxes()
    assert not {p for p in policies(api) if p.startswith("orchard-allow-egress-")}
    assert DENY_EGRESS in policies(api)


def test_egress_names_are_refused_clearly_and_addresses_become_the_policy(
        kube: httpx.Client, api: FakeApiServer) -> None:
    r = kube.post("/sandboxes", json={"image": "python:3.12", "block_network": False,
                                      "egress": ["pypi.org", "10.1.2.0/24"]})
    assert r.status_code == 400 and "pypi.org" in r.text and "NetworkPolicy" in r.text, r.text
    sid = create_ready(kube, api, block_network=False, egress=["10.1.2.0/24"])
    policy = on_server(api, api.get_object("networkpolicies", NS, allow_egress_name(sid)))
    assert policy["spec"]["egress"][0]["to"] == [{"ipBlock": {"cidr": "10.1.2.0/24"}}]
    assert kube.get(f"/sandboxes/{sid}").json()["namespace"] == NS
    delete_and_wait(kube, api, sid)


def test_image_ls_on_kubernetes_says_the_kubelet_pulls(kube: httpx.Client) -> None:
    from tests.test_cli_e2e import ORCHARD, cli_env

    assert kube.get("/images").status_code == 400  # no image cache: the kubelet pulls
    r = subprocess.run([str(ORCHARD), "image", "ls"], capture_output=True, text=True,
                       timeout=120, env=cli_env(str(kube.base_url).rstrip("/")))
    assert r.returncode == 0 and "the kubelet" in r.stderr, (r.stdout, r.stderr)
