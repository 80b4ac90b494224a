"""What a sandbox pod asks the cluster for beyond CPU and memory (its own user namespace, a disk
limit), and what the backend reports when the cluster gives less: an API server that drops
hostUsers, a pod evicted for its disk, a disk too small for the pod's own files.

The attacks these settings stop are in tests/attacks/test_kubernetes.py.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import httpx
import pytest

from orchard.env.backends.base import SandboxSpec
from orchard.env.backends.kubernetes import KubernetesConfig, pod_manifest
from tests.conftest import needs_root, wait_until
from tests.fakekube.apiserver import FakeApiServer
from tests.fakekube.cluster import FakeCluster
from tests.test_kubernetes_backend import (
    IMAGE,
    create_ready,
    delete_and_wait,
    get_pod,
    kube_orchestrator,
    namespace,
    record,
    wait_status,
)

KUBE_LOG = "orchard.env.kubernetes"


def _resources(http: httpx.Client) -> dict[str, str]:
    """The backend's describe(), as GET /resources shows it."""
    return http.get("/resources").json()["cgroup"]


@pytest.fixture(scope="module")
def cluster(fake_cluster: FakeCluster) -> FakeCluster:
    return fake_cluster


@pytest.fixture(scope="module")
def kube(cluster: FakeCluster) -> Iterator[tuple[httpx.Client, FakeApiServer, str]]:
    with namespace(cluster.api, "orchard-isolation") as ns, \
            kube_orchestrator(cluster, namespace=ns) as http:
        yield http, cluster.api, ns


# --- the pod spec ------------------------------------------------------------------------------

def test_the_pod_asks_for_what_the_config_and_the_request_say() -> None:
    spec = SandboxSpec(sandbox_id="sb-x", image=IMAGE, cpu="1", memory="1Gi", disk="5Gi")
    pod = pod_manifest(spec, KubernetesConfig(), "t", "n")
    assert pod["spec"]["hostUsers"] is False
    assert pod["spec"]["containers"][0]["resources"] == {
        "requests": {"cpu": "1", "memory": "1Gi", "ephemeral-storage": "5Gi"},
        "limits": {"cpu": "1", "memory": "1Gi", "ephemeral-storage": "5Gi"}}
    # host_users: true (clusters without user namespaces, gVisor) leaves the field out.
    shared = pod_manifest(SandboxSpec(sandbox_id="sb-y", image=IMAGE),
                          KubernetesConfig(host_users=True), "t", "n")
    assert "hostUsers" not in shared["spec"]
    assert shared["spec"]["containers"][0]["resources"] == {"requests": {}, "limits": {}}


# --- the user namespace, as the cluster kept it ---------------------------------------------------

@needs_root
def test_a_kept_user_namespace_is_reported(
        kube: tuple[httpx.Client, FakeApiServer, str]) -> None:
    http, api, ns = kube
    sid = create_ready(http, api, ns)
    userns = record(http, sid)["limits"]["user_namespace"]
    assert userns == {"requested": "hostUsers: false", "enforced": True,
                      "detail": userns["detail"]}
    assert "unprivileged uid of the node" in userns["detail"]
    assert _resources(http)["user_namespace"] == userns["detail"]
    assert _resources(http)["blocked_egress"] == "169.254.0.0/16"
    delete_and_wait(http, api, sid, ns)


@needs_root
def test_an_api_server_that_drops_host_users_is_reported_not_believed(
        cluster: FakeCluster, caplog: pytest.LogCaptureFixture) -> None:
    """Kubernetes before 1.33 (or with the feature gate off) drops hostUsers without a word:
    the pod then runs as the node's root. The sandbox's limits, /resources and the log say
    so; the log once, not once per pod."""
    api = cluster.api
    api.prune_fields("pods", "spec.hostUsers")
    try:
        with namespace(api, "orchard-old-api") as ns, \
                kube_orchestrator(cluster, namespace=ns) as http, \
                caplog.at_level(logging.WARNING, logger=KUBE_LOG):
            assert "no pod seen yet" in _resources(http)["user_namespace"]
            sids = [create_ready(http, api, ns) for _ in range(2)]
            pod = get_pod(api, sids[0], ns)
            assert pod is not None and "hostUsers" not in pod["spec"]
            for sid in sids:
                userns = record(http, sid)["limits"]["user_namespace"]
                assert userns["enforced"] is False, userns
                assert "dropped hostUsers: false" in userns["detail"]
                assert "kubernetes.host_users: true" in userns["detail"]  # what to do
            assert _resources(http)["user_namespace"].startswith("NOT in effect")
            warned = [r for r in caplog.records
                      if r.name == KUBE_LOG and "dropped hostUsers" in r.getMessage()]
            assert len(warned) == 1, [r.getMessage() for r in warned]
            for sid in sids:
                delete_and_wait(http, api, sid, ns)
    finally:
        api.prune_fields("pods")


@needs_root
def test_host_users_true_asks_for_nothing_and_says_so(cluster: FakeCluster) -> None:
    api = cluster.api
    with namespace(api, "orchard-host-users") as ns, \
            kube_orchestrator(cluster, namespace=ns, host_users=True) as http:
        assert _resources(http)["user_namespace"].startswith("off")
        sid = create_ready(http, api, ns)
        pod = get_pod(api, sid, ns)
        assert pod is not None and "hostUsers" not in pod["spec"]
        userns = record(http, sid)["limits"]["user_namespace"]
        assert userns["requested"] is None and userns["enforced"] is False
        assert "host_users is true" in userns["detail"]
        delete_and_wait(http, api, sid, ns)


# --- disk --------------------------------------------------------------------------------------

@needs_root
def test_a_disk_below_what_the_pod_itself_holds_is_refused(
        kube: tuple[httpx.Client, FakeApiServer, str]) -> None:
    """The agent bundle's emptyDir counts against the pod's ephemeral storage: a 64Mi pod
    would be evicted as it starts. Refused before anything reaches the API server."""
    http, api, _ = kube
    api.reset_counts()
    r = http.post("/sandboxes", json={"image": IMAGE, "disk": "64Mi"})
    assert r.status_code == 400, r.text
    detail = r.json()["detail"]
    assert "'64Mi'" in detail and "at least 256Mi" in detail and "bundle" in detail, detail
    assert api.count(method="POST") == 0


@needs_root
def test_an_evicted_pod_fails_its_sandbox_and_the_log_says_why(
        kube: tuple[httpx.Client, FakeApiServer, str], cluster: FakeCluster,
        caplog: pytest.LogCaptureFixture) -> None:
    """Writing past the disk limit gets the pod evicted by the kubelet: the caller sees the
    sandbox turn failed (execs answer 409) and the orchestrator's log has the kubelet's
    reason, which the deleted pod no longer shows."""
    http, api, ns = kube
    sid = create_ready(http, api, ns, disk="256Mi")
    message = "Pod ephemeral local storage usage exceeds the total limit of containers 256Mi."
    assert cluster.kubelet is not None
    with caplog.at_level(logging.WARNING, logger=KUBE_LOG):
        cluster.kubelet.fail_pod(ns, sid, reason="Evicted", message=message)
        rec = wait_status(http, sid, "failed")
    assert "exited unexpectedly" in rec["error"]
    r = http.post(f"/sandboxes/{sid}/exec", json={"command": "true"})
    assert r.status_code == 409, r.text
    assert any(sid in entry.getMessage() and f"Evicted: {message}" in entry.getMessage()
               for entry in caplog.records if entry.name == KUBE_LOG), caplog.text
    assert wait_until(lambda: get_pod(api, sid, ns) is None, 30), "the evicted pod was kept"
