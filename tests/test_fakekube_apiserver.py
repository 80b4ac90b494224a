"""The fake Kubernetes API server, exercised through the real clients: kubernetes_asyncio over
HTTP for the API, kubectl for discovery, a subprocess for the standalone entry point."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client import ApiClient, ApiException, CoreV1Api, NetworkingV1Api

from tests.fakekube import FakeApiServer

TOKEN = "s3cret"
REPO = Path(__file__).resolve().parent.parent
KUBECTL = REPO / ".venv" / "bin" / "kubectl"


@pytest.fixture()
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer(token=TOKEN, bookmark_interval=0.2) as srv:
        yield srv


@pytest.fixture()
async def api(server: FakeApiServer, tmp_path: Path) -> AsyncIterator[ApiClient]:
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    async with await config.new_client_from_config(config_file=str(kubeconfig)) as api_client:
        yield api_client


def pod(name: str, labels: dict[str, str] | None = None, **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels or {}, **meta},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]}}


def netpol(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name},
            "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"]}}


async def events(func: Any, *args: Any, **kwargs: Any) -> list[tuple[str, str, int]]:
    """(type, name, resourceVersion) of every event until the watch's server-side timeout."""
    seen = []
    async with watch.Watch() as w:
        async for ev in w.stream(func, *args, **kwargs):
            meta = ev["raw_object"]["metadata"]
            seen.append((ev["type"], meta.get("name", ""), int(meta["resourceVersion"])))
    return seen


def http_status(server: FakeApiServer, method: str, path: str, body: bytes = b"",
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(server.url + path, data=body or None, method=method,
                                     headers={"Authorization": f"Bearer {TOKEN}",
                                              **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


# --- CRUD ------------------------------------------------------------------------------------

async def test_pod_crud(api: ApiClient) -> None:
    v1 = CoreV1Api(api)
    created = await v1.create_namespaced_pod("default", pod("web", {"app": "web"}))
    meta = created.metadata
    assert (meta.name, meta.namespace, meta.generation) == ("web", "default", 1)
    assert meta.uid and meta.creation_timestamp and int(meta.resource_version) > 0
    assert created.kind == "Pod" and created.api_version == "v1"
    assert created.status.phase == "Pending"

    got = await v1.read_namespaced_pod("web", "default")
    assert got.metadata.uid == meta.uid

    got.spec.containers[0].image = "busybox:2"
    replaced = await v1.replace_namespaced_pod("web", "default", got)
    assert replaced.spec.containers[0].image == "busybox:2"
    assert replaced.metadata.generation == 2
    assert int(replaced.metadata.resource_version) > int(meta.resource_version)

    merged = await v1.patch_namespaced_pod("web", "default", {"metadata": {"labels": {"v": "2"}}})
    assert merged.metadata.labels == {"app": "web", "v": "2"}
    assert merged.metadata.generation == 2  # metadata changes leave the generation alone

    jsonpatched = await v1.patch_namespaced_pod(
        "web", "default", [{"op": "add", "path": "/metadata/annotations", "value": {"a": "b"}},
                           {"op": "remove", "path": "/metadata/labels/v"}])
    assert jsonpatched.metadata.annotations == {"a": "b"}
    assert jsonpatched.metadata.labels == {"app": "web"}

    listed = await v1.list_namespaced_pod("default")
    assert [p.metadata.name for p in listed.items] == ["web"]
    assert int(listed.metadata.resource_version) >= int(jsonpatched.metadata.resource_version)

    deleted = await v1.delete_namespaced_pod("web", "default", grace_period_seconds=0,
                                             propagation_policy="Background")
    assert deleted.metadata.name == "web"
    with pytest.raises(ApiException) as err:
        await v1.read_namespaced_pod("web", "default")
    assert err.value.status == 404
    assert json.loads(err.value.body)["reason"] == "NotFound"


async def test_generate_name_and_cluster_wide_list(api: ApiClient) -> None:
    v1 = CoreV1Api(api)
    await v1.create_namespace({"metadata": {"name": "other"}})
    first = await v1.create_namespaced_pod("default", {**pod(""), "metadata": {
        "generateName": "worker-"}})
    second = await v1.create_namespaced_pod("other", {**pod(""), "metadata": {
        "generateName": "worker-"}})
    assert first.metadata.name.startswith("worker-") and len(first.metadata.name) == 12
    assert second.metadata.name.startswith("worker-")
    everywhere = await v1.list_pod_for_all_namespaces()
    assert sorted(p.metadata.namespace for p in everywhere.items) == ["default", "other"]


async def test_networkpolicy_crud(api: ApiClient) -> None:
    v1 = CoreV1Api(api)
    net = NetworkingV1Api(api)
    await v1.create_namespace({"metadata": {"name": "team"}})
    created = await net.create_namespaced_network_policy("team", netpol("deny"))
    assert created.kind == "NetworkPolicy" and created.api_version == "networking.k8s.io/v1"
    patched = await net.patch_namespaced_network_policy(
        "deny", "team", {"spec": {"policyTypes": ["Ingress", "Egress"]}})
    assert patched.spec.policy_types == ["Ingress", "Egress"]
    assert patched.metadata.generation == 2
    everywhere = await net.list_network_policy_for_all_namespaces()
    assert [p.metadata.name for p in everywhere.items] == ["deny"]
    await net.delete_namespaced_network_policy("deny", "team")
    assert (await net.list_namespaced_network_policy("team")).items == []


async def test_deleting_a_namespace_deletes_its_objects(api: ApiClient) -> None:
    v1 = CoreV1Api(api)
    await v1.create_namespace({"metadata": {"name": "doomed"}})
    await v1.create_namespaced_pod("doomed", pod("p"))
    await v1.create_namespaced_config_map("doomed", {"metadata": {"name": "c"}})
    await v1.delete_namespace("doomed")
    assert (await v1.list_pod_for_all_namespaces()).items == []
    with pytest.raises(ApiException) as err:
        await v1.create_namespaced_pod("doomed", pod("p"))
    assert err.value.status == 404


async def test_delete_collection_by_label(api: ApiClient) -> None:
    v1 = CoreV1Api(api)
    for i in range(4):
        await v1.create_namespaced_pod("default", pod(f"p{i}", {"batch": str(i % 2)}))
    await v1.delete_collection_namespaced_pod("default", label_selector="batch=1")
    left = await v1.list_namespaced_pod("default")
    assert [p.metadata.name for p in left.items] == ["p0", "p2"]


@pytest.mark.parametrize(("selector", "expected"), [
    ("app=web", ["a", "b"]),
    ("app==web", ["a", "b"]),
    ("app!=web", ["c", "d"]),
    ("tier in (front, back)", ["a", "c"]),
    ("tier notin (front)", ["b", "c", "d"]),
    ("tier", ["a", "c"]),
    ("!tier", ["b", "d"]),
    ("app=web,tier", ["a"]),
    ("app in (web,db),!tier", ["b"]),
    ("", ["a", "b", "c", "d"]),
])
async def test_label_selectors(api: ApiClient, selector: str, expected: list[str]) -> None:
    v1 = CoreV1Api(api)
    for name, labels in [("a", {"app": "web", "tier": "front"}), ("b", {"app": "web"}),
                         ("c", {"app": "db", "tier": "back"}), ("d", {})]:
        await v1.create_namespaced_pod("default", pod(name, labels))
    found = await v1.list_namespaced_pod("default", label_selector=selector)
    assert [p.metadata.name for p in found.items] == expected


async def test_field_selectors(api: ApiClient, server: FakeApiServer) -> None:
    v1 = CoreV1Api(api)
    for name in ("a", "b", "c"):
        await v1.create_namespaced_pod("default", pod(name))
    await v1.patch_namespaced_pod_status("b", "default", {"status": {"phase": "Running"}})
    by_name = await v1.list_namespaced_pod("default", field_selector="metadata.name=a")
    assert [p.metadata.name for p in by_name.items] == ["a"]
    running = await v1.list_pod_for_all_namespaces(field_selector="status.phase=Running")
    assert [p.metadata.name for p in running.items] == ["b"]
    rest = await v1.list_namespaced_pod("default", field_selector="status.phase!=Running",
                                        limit=1, _continue="ignored")
    assert [p.metadata.name for p in rest.items] == ["a", "c"]
    status, body = http_status(server, "GET", "/api/v1/pods?labelSelector=a%20in%20(b")
    assert (status, body["reason"]) == (400, "BadRequest")


# --- errors and concurrency control ----------------------------------------------------------

async def test_error_statuses(api: ApiClient, server: FakeApiServer) -> None:
    v1 = CoreV1Api(api)
    await v1.create_namespaced_pod("default", pod("dup"))

    async def failure(call: Any) -> dict[str, Any]:
        with pytest.raises(ApiException) as err:
            await call
        body = json.loads(err.value.body)
        assert body["kind"] == "Status" and body["code"] == err.value.status
        return body

    dup = await failure(v1.create_namespaced_pod("default", pod("dup")))
    assert (dup["code"], dup["reason"]) == (409, "AlreadyExists")
    missing = await failure(v1.read_namespaced_pod("nope", "default"))
    assert (missing["code"], missing["reason"]) == (404, "NotFound")
    nameless = await failure(v1.create_namespaced_pod("default", pod("")))
    assert (nameless["code"], nameless["reason"]) == (422, "Invalid")
    elsewhere = await failure(v1.create_namespaced_pod("default",
                                                       pod("x", namespace="kube-system")))
    assert (elsewhere["code"], elsewhere["reason"]) == (400, "BadRequest")
    no_ns = await failure(v1.create_namespaced_pod("ghost", pod("x")))
    assert (no_ns["code"], no_ns["message"]) == (404, 'namespaces "ghost" not found')
    failed_test = await failure(v1.patch_namespaced_pod(
        "dup", "default", [{"op": "test", "path": "/metadata/name", "value": "other"}]))
    assert (failed_test["code"], failed_test["reason"]) == (422, "Invalid")

    status, body = http_status(server, "POST", "/api/v1/namespaces/default/pods", b"{nope",
                               {"Content-Type": "application/json"})
    assert (status, body["reason"]) == (400, "BadRequest")
    status, body = http_status(server, "GET", "/apis/example.com/v1/widgets")
    assert (status, body["reason"]) == (404, "NotFound")


async def test_optimistic_concurrency(api: ApiClient) -> None:
    v1 = CoreV1Api(api)
    stale = await v1.create_namespaced_pod("default", pod("p"))
    fresh = await v1.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"x": "1"}}})
    with pytest.raises(ApiException) as err:
        await v1.replace_namespaced_pod("p", "default", stale)
    assert err.value.status == 409 and json.loads(err.value.body)["reason"] == "Conflict"
    with pytest.raises(ApiException) as err:
        await v1.patch_namespaced_pod("p", "default", {"metadata": {
            "resourceVersion": stale.metadata.resource_version, "labels": {"x": "2"}}})
    assert err.value.status == 409

    # An unconditional update (no resourceVersion) wins; one that changes nothing writes nothing.
    fresh.metadata.resource_version = None
    fresh.metadata.labels = {"x": "3"}
    updated = await v1.replace_namespaced_pod("p", "default", fresh)
    again = await v1.replace_namespaced_pod("p", "default", updated)
    assert again.metadata.resource_version == updated.metadata.resource_version


async def test_status_subresource(api: ApiClient) -> None:
    v1 = CoreV1Api(api)
    created = await v1.create_namespaced_pod("default", {**pod("p"), "status": {
        "phase": "Running"}})
    assert created.status.phase == "Pending"  # status is the server's to set, not the creator's

    patched = await v1.patch_namespaced_pod_status("p", "default", {
        "status": {"phase": "Running", "podIP": "10.0.0.7"}, "spec": {"nodeName": "ignored"}})
    assert (patched.status.phase, patched.status.pod_ip) == ("Running", "10.0.0.7")
    assert patched.spec.node_name is None and patched.metadata.generation == 1

    read = await v1.read_namespaced_pod_status("p", "default")
    read.status.phase = "Succeeded"
    replaced = await v1.replace_namespaced_pod_status("p", "default", read)
    assert replaced.status.phase == "Succeeded"

    # The main endpoint keeps the status it already had.
    replaced.status.phase = "Failed"
    replaced.metadata.labels = {"touched": "yes"}
    updated = await v1.replace_namespaced_pod("p", "default", replaced)
    assert updated.status.phase == "Succeeded" and updated.metadata.labels == {"touched": "yes"}


# --- watches ---------------------------------------------------------------------------------

async def test_watch_from_resource_version_replays_exactly_later_events(api: ApiClient) -> None:
    v1 = CoreV1Api(api)
    await v1.create_namespace({"metadata": {"name": "other"}})
    await v1.create_namespaced_pod("default", pod("a"))
    b = await v1.create_namespaced_pod("default", pod("b"))
    since = b.metadata.resource_version
    await v1.patch_namespaced_pod("a", "default", {"metadata": {"labels": {"x": "1"}}})
    await v1.create_namespaced_pod("other", pod("elsewhere"))
    await v1.delete_namespaced_pod("b", "default")
    await v1.create_namespaced_pod("default", pod("c"))

    seen = await events(v1.list_namespaced_pod, "default", resource_version=since,
                        timeout_seconds=1)
    assert [(t, n) for t, n, _ in seen] == [("MODIFIED", "a"), ("DELETED", "b"), ("ADDED", "c")]
    versions = [rv for _, _, rv in seen]
    assert versions == sorted(versions) and versions[0] > int(since)


async def test_watch_without_version_lists_then_follows(api: ApiClient) -> None:
    v1 = CoreV1Api(api)
    await v1.create_namespaced_pod("default", pod("old"))
    seen = []
    async with watch.Watch() as w:
        async for ev in w.stream(v1.list_namespaced_pod, "default", timeout_seconds=2):
            seen.append((ev["type"], ev["object"].metadata.name))
            if len(seen) == 1:  # the watch is registered: what follows is live
                await v1.create_namespaced_pod("default", pod("new"))
                await v1.delete_namespaced_pod("old", "default")
    assert seen == [("ADDED", "old"), ("ADDED", "new"), ("DELETED", "old")]


async def test_watch_label_selector_deletes_objects_that_stop_matching(api: ApiClient) -> None:
    v1 = CoreV1Api(api)
    start = await v1.create_namespaced_pod("default", pod("p", {"role": "a"}))
    await v1.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"role": "b"}}})
    await v1.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"role": "a"}}})
    await v1.patch_namespaced_pod("p", "default", {"metadata": {"annotations": {"n": "1"}}})
    seen = await events(v1.list_namespaced_pod, "default", label_selector="role=a",
                        resource_version=start.metadata.resource_version, timeout_seconds=1)
    assert [t for t, _, _ in seen] == ["DELETED", "ADDED", "MODIFIED"]


async def test_watch_from_compacted_version_raises_410(api: ApiClient,
                                                        server: FakeApiServer) -> None:
    v1 = CoreV1Api(api)
    old = await v1.create_namespaced_pod("default", pod("p"))
    latest = await v1.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"x": "1"}}})
    server.compact()
    with pytest.raises(ApiException) as err:
        await events(v1.list_namespaced_pod, "default",
                     resource_version=old.metadata.resource_version, timeout_seconds=5)
    assert err.value.status == 410 and "Expired" in err.value.reason
    # Resuming from the current version is still fine, as after a real compaction.
    assert await events(v1.list_namespaced_pod, "default",
                        resource_version=latest.metadata.resource_version,
                        timeout_seconds=1) == []


async def test_watch_bookmarks(api: ApiClient) -> None:
    v1 = CoreV1Api(api)
    created = await v1.create_namespaced_pod("default", pod("p"))
    seen = await events(v1.list_namespaced_pod, "default", allow_watch_bookmarks=True,
                        resource_version=created.metadata.resource_version, timeout_seconds=1)
    assert seen and {t for t, _, _ in seen} == {"BOOKMARK"}
    assert seen[0][2] == int(created.metadata.resource_version)


async def test_disconnect_watches_breaks_the_stream(api: ApiClient,
                                                    server: FakeApiServer) -> None:
    v1 = CoreV1Api(api)
    await v1.create_namespaced_pod("default", pod("p"))
    async with watch.Watch() as w:
        stream = w.stream(v1.list_namespaced_pod, "default", timeout_seconds=60)
        first = await stream.__anext__()
        assert first["type"] == "ADDED"
        assert server.count(watch=True) == 1
        await asyncio.to_thread(server.disconnect_watches)
        with pytest.raises(aiohttp.ClientPayloadError):
            await asyncio.wait_for(stream.__anext__(), 10)


# --- test controls ---------------------------------------------------------------------------

async def test_injected_faults(api: ApiClient, server: FakeApiServer) -> None:
    v1 = CoreV1Api(api)
    server.inject_fault(503, method="GET", resource="pods", times=2, retry_after=3)
    for _ in range(2):
        with pytest.raises(ApiException) as err:
            await v1.list_namespaced_pod("default")
        assert err.value.status == 503
        assert err.value.headers["Retry-After"] == "3"
        body = json.loads(err.value.body)
        assert (body["reason"], body["details"]["retryAfterSeconds"]) == ("ServiceUnavailable", 3)
    await v1.list_namespaced_pod("default")  # used up

    server.inject_fault(429, resource="networkpolicies")
    await v1.list_namespaced_pod("default")  # another resource is unaffected
    with pytest.raises(ApiException) as err:
        await NetworkingV1Api(api).list_namespaced_network_policy("default")
    assert err.value.status == 429

    server.inject_fault(500, method="POST")
    server.inject_fault(504, watch=True)
    with pytest.raises(ApiException) as err:
        await v1.create_namespaced_pod("default", pod("p"))
    assert err.value.status == 500
    await v1.list_namespaced_pod("default")  # not a watch
    with pytest.raises(ApiException) as err:
        await events(v1.list_namespaced_pod, "default", timeout_seconds=1)
    assert err.value.status == 504


async def test_request_counting(api: ApiClient, server: FakeApiServer) -> None:
    v1 = CoreV1Api(api)
    server.reset_counts()
    await v1.create_namespaced_pod("default", pod("p"))
    await v1.read_namespaced_pod("p", "default")
    await v1.read_namespaced_pod_status("p", "default")
    await v1.list_namespaced_pod("default")
    await NetworkingV1Api(api).list_namespaced_network_policy("default")
    await events(v1.list_namespaced_pod, "default", timeout_seconds=1)
    assert server.count() == len(server.requests) == 6
    assert server.count(resource="pods") == 5
    assert server.count(method="get", resource="pods", name="p") == 2
    assert server.count(resource="pods", watch=True) == 1
    assert server.count(resource="pods", watch=False) == 4
    assert server.count(verbs=("create", "list")) == 3
    assert server.count(resource="networkpolicies", verbs="list") == 1
    record = server.requests.snapshot()[-1]
    assert (record.verb, record.path, record.query["watch"].lower()) == (
        "watch", "/api/v1/namespaces/default/pods", "true")
    server.requests.reset_counts()
    assert server.count() == 0


async def test_bearer_token_required(server: FakeApiServer) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{server.url}/api/v1/pods") as resp:
            assert resp.status == 401
            assert (await resp.json())["reason"] == "Unauthorized"
        async with session.get(f"{server.url}/api/v1/pods",
                               headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
            assert resp.status == 200


async def test_in_process_api(api: ApiClient, server: FakeApiServer) -> None:
    v1 = CoreV1Api(api)
    seen: list[tuple[str, str, str]] = []
    server.add_listener(lambda kind, obj: seen.append((kind, obj["kind"],
                                                       obj["metadata"]["name"])))
    await v1.create_namespaced_pod("default", pod("p", {"app": "x"}))
    server.reset_counts()

    async def kubelet() -> tuple[Any, ...]:
        got = await server.get_object("pods", "default", "p")
        missing = await server.get_object("pods", "default", "nope")
        running = await server.update_status("pods", "default", "p", {
            "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]})
        listed = await server.list_objects("pods", "default", "app=x")
        made = await server.create_object("configmaps", "default", {"metadata": {"name": "c"}})
        await server.delete_object("configmaps", "default", "c")
        return got, missing, running, listed, made

    got, missing, running, listed, made = await asyncio.wrap_future(
        server.run_in_loop(kubelet()))
    assert got["status"] == {"phase": "Pending"} and missing is None
    assert running["status"]["phase"] == "Running"
    assert int(running["metadata"]["resourceVersion"]) > int(got["metadata"]["resourceVersion"])
    assert [p["metadata"]["name"] for p in listed] == ["p"]
    assert made["kind"] == "ConfigMap"
    assert server.count() == 0  # in-process calls are not HTTP requests
    assert seen == [("ADDED", "Pod", "p"), ("MODIFIED", "Pod", "p"),
                    ("ADDED", "ConfigMap", "c"), ("DELETED", "ConfigMap", "c")]
    assert (await v1.read_namespaced_pod("p", "default")).status.phase == "Running"
    with pytest.raises(RuntimeError, match="server loop"):
        await server.get_object("pods", "default", "p")


async def test_many_concurrent_requests_and_a_thousand_pods(api: ApiClient) -> None:
    v1 = CoreV1Api(api)
    # Watching from the list's version: every create is then a watch event, however late the
    # watch connects.
    start = (await v1.list_namespaced_pod("default")).metadata.resource_version

    async def watch_all() -> list[tuple[str, str, int]]:
        seen = []
        async with watch.Watch() as w:
            async for ev in w.stream(v1.list_namespaced_pod, "default", timeout_seconds=60,
                                     resource_version=start):
                meta = ev["raw_object"]["metadata"]
                seen.append((ev["type"], meta["name"], int(meta["resourceVersion"])))
                if len(seen) == 1000:
                    return seen
        return seen

    watching = asyncio.create_task(watch_all())
    await asyncio.gather(*(v1.create_namespaced_pod("default", pod(f"p{i:04}"),
                                                    _preload_content=False)
                           for i in range(1000)))
    resp = await v1.list_namespaced_pod("default", _preload_content=False)
    assert len(json.loads(await resp.read())["items"]) == 1000
    seen = await watching
    assert sorted(n for _, n, _ in seen) == [f"p{i:04}" for i in range(1000)]
    assert {t for t, _, _ in seen} == {"ADDED"}
    versions = [rv for _, _, rv in seen]
    assert versions == sorted(versions)


# --- kubectl, lifecycle, entry point ---------------------------------------------------------

MANIFESTS = """
apiVersion: v1
kind: Namespace
metadata: {name: demo}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: demo}
data: {mode: test}
---
apiVersion: v1
kind: Secret
metadata: {name: creds, namespace: demo}
stringData: {password: hunter2}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: runner, namespace: demo}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: pod-reader, namespace: demo}
rules: [{apiGroups: [""], resources: [pods], verbs: [get, list, watch]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: runner-reads-pods, namespace: demo}
subjects: [{kind: ServiceAccount, name: runner, namespace: demo}]
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: pod-reader}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: demo}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: web, image: nginx}]}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec: {selector: {app: web}, ports: [{port: 80}]}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web, namespace: demo}
spec: {minAvailable: 1, selector: {matchLabels: {app: web}}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: demo}
spec: {podSelector: {}, policyTypes: [Ingress, Egress]}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db, namespace: demo}
spec:
  serviceName: db
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec: {containers: [{name: db, image: postgres}]}
"""

UNKNOWN_KIND = """
apiVersion: example.com/v1
kind: Widget
metadata: {name: w, namespace: default}
"""


def kubectl(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(KUBECTL), "--kubeconfig", str(kubeconfig),
                           "--cache-dir", str(kubeconfig.parent / "kube-cache"), *args],
                          capture_output=True, text=True, timeout=60)


def test_kubectl_apply_dry_run(tmp_path: Path) -> None:
    # kubectl sends credentials only over TLS, so this server checks no token.
    with FakeApiServer() as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        (tmp_path / "all.yaml").write_text(MANIFESTS)
        (tmp_path / "unknown.yaml").write_text(UNKNOWN_KIND)

        ok = kubectl(kubeconfig, "apply", "--dry-run=client", "--validate=false",
                     "-f", str(tmp_path / "all.yaml"))
        assert ok.returncode == 0, ok.stderr
        for created in ["namespace/demo", "configmap/settings", "secret/creds",
                        "serviceaccount/runner", "role.rbac.authorization.k8s.io/pod-reader",
                        "rolebinding.rbac.authorization.k8s.io/runner-reads-pods",
                        "deployment.apps/web", "service/web",
                        "poddisruptionbudget.policy/web",
                        "networkpolicy.networking.k8s.io/deny-all",
                        "statefulset.apps/db"]:
            assert f"{created} created (dry run)" in ok.stdout, ok.stdout
        assert server.count(verbs=("create", "update", "patch", "delete")) == 0

        bad = kubectl(kubeconfig, "apply", "--dry-run=client", "--validate=false",
                      "-f", str(tmp_path / "unknown.yaml"))
        assert bad.returncode != 0
        assert 'no matches for kind "Widget"' in bad.stderr, bad.stderr

        listed = kubectl(kubeconfig, "get", "namespaces", "-o", "name")
        assert listed.returncode == 0, listed.stderr
        assert "namespace/default" in listed.stdout.split()


def socket_fds() -> set[str]:
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:
            continue
        if target.startswith("socket:"):
            found.add(target)
    return found


def test_stop_leaves_no_thread_or_socket() -> None:
    threads, sockets = set(threading.enumerate()), socket_fds()
    server = FakeApiServer().start()
    port = server.port
    with urllib.request.urlopen(f"{server.url}/version", timeout=10) as resp:
        assert json.loads(resp.read())["major"] == "1"
    # A watch still open when the server stops ends cleanly rather than holding stop() up.
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/api/v1/pods?watch=true")
    watch_resp = conn.getresponse()
    assert watch_resp.status == 200
    server.stop()
    assert watch_resp.read().count(b"\n") == 0  # no events, clean end of the chunked body
    conn.close()

    assert set(threading.enumerate()) <= threads
    assert socket_fds() <= sockets
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    server.stop()  # a second stop is harmless


def test_standalone_entry_point(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    proc = subprocess.Popen([sys.executable, "-m", "tests.fakekube.apiserver", "--port", "0",
                             "--kubeconfig", str(kubeconfig)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        assert url in kubeconfig.read_text()
        with urllib.request.urlopen(f"{url}/api/v1/namespaces", timeout=10) as resp:
            names = [ns["metadata"]["name"] for ns in json.loads(resp.read())["items"]]
        assert "default" in names
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20)
        assert proc.returncode == 0, stderr
        assert "Warning" not in stderr, stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_load_kube_config(server: FakeApiServer, tmp_path: Path) -> None:
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(server.write_kubeconfig(tmp_path / "k")),
                                  client_configuration=cfg)
    async with ApiClient(cfg) as api_client:
        ns = await CoreV1Api(api_client).read_namespace("default")
    assert ns.metadata.name == "default"
