"""Attacks on what the Kubernetes backend asks of the cluster (finding 10 of issue 29, and the
Kubernetes half of finding 2).

The attacker is an API caller who asks for a disk limit and writes past it, sandbox code that
would like to be the node's root after a container escape, a networked sandbox whose egress
allow-list is "everything" and which aims at the nodes, their kubelets and load balancers, and
a pod in some other namespace that calls the recording proxy. Each test reads what the cluster
was really given (the objects in the fake API server, or the rendered deploy manifests) and
meets the network policies the way a connection would (tests/fakekube/netpol.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml

from deploy import validate
from orchard.env.backends.base import SandboxSpec
from orchard.env.backends.kubernetes import (
    KubernetesConfig,
    allow_egress_policy,
    deny_egress_policy,
    pod_manifest,
)
from tests.conftest import needs_root
from tests.fakekube.apiserver import FakeApiServer
from tests.fakekube.cluster import FakeCluster
from tests.fakekube.netpol import Endpoint, admits_egress, admits_ingress
from tests.test_kubernetes_backend import (
    create_ready,
    delete_and_wait,
    get_pod,
    kube_orchestrator,
    namespace,
    on_server,
    record,
)

NODES = "10.128.0.0/20"  # the node pool's network, as an operator would list it
NODE = "10.128.0.5"  # one node: its kubelet listens on 10250
BALANCER = "203.0.113.10"  # a public load balancer's address, in front of internal services
PUBLIC = "198.51.100.7"  # somewhere on the internet the sandbox may go
METADATA = "169.254.169.254"  # the cloud metadata service, blocked by default


@pytest.fixture(scope="module")
def cluster(fake_cluster: FakeCluster) -> FakeCluster:
    return fake_cluster


@pytest.fixture(scope="module")
def attacked(cluster: FakeCluster) -> Iterator[tuple[httpx.Client, FakeApiServer, str]]:
    """An orchestrator whose operator listed the nodes and a load balancer as blocked, in a
    namespace of its own (left with no pod and no policy of a sandbox afterwards)."""
    api = cluster.api
    with namespace(api, "orchard-attacks") as ns, kube_orchestrator(
            cluster, namespace=ns, blocked_egress=[NODES, BALANCER, "169.254.0.0/16"]) as http:
        yield http, api, ns


def _policies(api: FakeApiServer, ns: str) -> list[dict[str, Any]]:
    return on_server(api, api.list_objects("networkpolicies", ns))


def _reaches(api: FakeApiServer, ns: str, sid: str, ip: str, port: int) -> bool:
    pod = get_pod(api, sid, ns)
    assert pod is not None
    me = Endpoint(ns, pod["metadata"]["labels"])
    return admits_egress(_policies(api, ns), me, Endpoint(ip=ip), port)


# --- finding 10: disk ---------------------------------------------------------------------------

@needs_root
def test_an_api_caller_asking_for_disk_gets_an_ephemeral_storage_limit(
        attacked: tuple[httpx.Client, FakeApiServer, str]) -> None:
    """It was dropped without a word: the pod had no ephemeral-storage limit, so a sandbox
    could fill the node's disk, while the caller believed it had asked for a bound."""
    http, api, ns = attacked
    sid = create_ready(http, api, ns, disk="1Gi")
    pod = get_pod(api, sid, ns)
    assert pod is not None
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources["limits"].get("ephemeral-storage") == "1Gi", resources
    assert resources["requests"].get("ephemeral-storage") == "1Gi", resources
    disk = record(http, sid)["limits"].get("disk")
    assert disk is not None and disk["requested"] == "1Gi" and disk["enforced"] is True, disk
    assert "evicts" in disk["detail"]
    delete_and_wait(http, api, sid, ns)


# --- finding 10: the node's user namespace ------------------------------------------------------

@needs_root
def test_a_sandbox_pod_does_not_run_in_the_nodes_user_namespace(
        attacked: tuple[httpx.Client, FakeApiServer, str]) -> None:
    """Sandbox root was the node's root: a container escape, or a file written through a
    volume, was root's on the node. The pod must ask for its own user namespace, and the
    sandbox's limits must say it has one."""
    http, api, ns = attacked
    sid = create_ready(http, api, ns)
    pod = get_pod(api, sid, ns)
    assert pod is not None
    spec = pod["spec"]
    assert spec.get("hostUsers") is False, spec
    # What hostUsers: false forbids, so the API server would take the pod.
    assert not any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
    userns = record(http, sid)["limits"].get("user_namespace")
    assert userns is not None and userns["enforced"] is True, userns
    delete_and_wait(http, api, sid, ns)


# --- finding 10: egress to the nodes and load balancers ------------------------------------------

@needs_root
@pytest.mark.parametrize("egress", [["0.0.0.0/0"], None], ids=["allow-list of all", "default"])
def test_networked_sandboxes_never_reach_the_blocked_ranges(
        attacked: tuple[httpx.Client, FakeApiServer, str], egress: list[str] | None) -> None:
    """An allow-list of everything is honoured, but for the blocked ranges. The default
    already refused private ranges; a load balancer on a public address was open to every
    networked sandbox."""
    http, api, ns = attacked
    extra = {} if egress is None else {"egress": egress}
    sid = create_ready(http, api, ns, block_network=False, **extra)
    assert _reaches(api, ns, sid, PUBLIC, 443)
    for ip, port in [(NODE, 10250), (BALANCER, 443), (METADATA, 80)]:
        assert not _reaches(api, ns, sid, ip, port), f"{ip}:{port} is reachable"
    delete_and_wait(http, api, sid, ns)


@needs_root
def test_an_allow_list_naming_a_node_is_refused(
        attacked: tuple[httpx.Client, FakeApiServer, str]) -> None:
    http, api, ns = attacked
    api.reset_counts()
    r = http.post("/sandboxes", json={"image": "python:3.12", "block_network": False,
                                      "egress": [PUBLIC, f"{NODE}/32"]})
    assert r.status_code == 400, r.text
    detail = r.json()["detail"]
    assert NODE in detail and NODES in detail and "blocked_egress" in detail, detail
    assert api.count(method="POST") == 0  # no pod, no policy


# --- finding 2: who may call the recording proxy --------------------------------------------------

@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    kubectl = validate.find_kubectl()
    with validate.renderable_tree() as tree:
        return {rel.as_posix(): validate.documents(validate.render(kubectl, tree / rel))
                for rel in validate.kustomizations(tree)}


def _one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [found] = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def _sandbox(config: KubernetesConfig, **spec: Any) -> Endpoint:
    """A sandbox pod as the orchestrator would make it under this config."""
    pod = pod_manifest(SandboxSpec("sb-attack", "python:3.12", **spec), config, "t", "n")
    return Endpoint(config.namespace, pod["metadata"]["labels"], ip="10.4.1.7")


def test_the_model_proxy_admits_no_other_namespace_and_no_other_sandbox(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    """Any pod of any namespace could call the proxy (and so read other rollouts' sessions);
    so could a networked sandbox whose allow-list covers the pod network."""
    for target, docs in rendered.items():
        policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
        [settings] = [yaml.safe_load(d["data"]["orchard.yaml"]) for d in docs
                      if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith(
                          "orchard-config-")]
        config = KubernetesConfig(**settings["kubernetes"])
        proxy_set = _one(docs, "StatefulSet", "orchard-proxy")
        proxy = Endpoint(proxy_set["metadata"]["namespace"],
                         proxy_set["spec"]["template"]["metadata"]["labels"], ip="10.4.0.9")
        port = config.model_proxy_port

        attacker = Endpoint("attacker", {"app.kubernetes.io/name": "orchard-orchestrator"})
        assert not admits_ingress(policies, proxy, attacker, port), target
        # A networked sandbox whose allow-list covers the pod network gets out of its pod...
        wide = {"block_network": False, "egress": ["10.0.0.0/8"]}
        networked = _sandbox(config, **wide)
        egress = [deny_egress_policy(config),
                  allow_egress_policy(SandboxSpec("sb-attack", "python:3.12", **wide), config)]
        assert admits_egress(egress, networked, proxy, port), target
        # ...but not into the proxy.
        assert not admits_ingress(policies, proxy, networked, port), target
        # Those it serves still get in: model_proxy sandboxes and the orchestrator's namespace.
        assert admits_ingress(policies, proxy, _sandbox(config, model_proxy=True),
                              port), target
        orchestrator = _one(docs, "Deployment", "orchard-orchestrator")
        assert admits_ingress(policies, proxy, Endpoint(
            orchestrator["metadata"]["namespace"],
            orchestrator["spec"]["template"]["metadata"]["labels"]), port), target
