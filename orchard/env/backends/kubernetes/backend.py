"""Sandboxes as pods: one per sandbox, in one namespace, reached at podIP:9090.

The API server sees only what it must: a pod create and a pod delete per sandbox (plus one
network policy each way for a sandbox with network access). Readiness and Pod IPs come from the
informer's cache; exec, files, patches and PTY go straight to the agent in the pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import uuid
from collections.abc import AsyncIterator
from typing import Any

from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client import ApiClient, Configuration, CoreV1Api, NetworkingV1Api
from kubernetes_asyncio.client.exceptions import ApiException

from orchard.env.agent.client import AgentClient, AgentLimits
from orchard.env.backends.base import (
    BackendError,
    MemoryUnsupported,
    SandboxHandle,
    SandboxSpec,
    SnapshotMade,
    SpecRejected,
    agent_token,
)
from orchard.env.backends.kubernetes.calls import ApiCaller, not_found
from orchard.env.backends.kubernetes.config import KubernetesConfig, covering_block
from orchard.env.backends.kubernetes.informer import NotSynced, Pod, PodInformer
from orchard.env.backends.kubernetes.manifests import (
    LIMIT_NAMES,
    MANAGED_BY,
    NETWORK,
    NONCE,
    allow_egress_name,
    allow_egress_policy,
    deny_egress_policy,
    model_egress_policy,
    pod_manifest,
)
from orchard.env.backends.kubernetes.snapshots import PodSnapshots, signal_pod
from orchard.env.quantities import parse_memory
from orchard.env.schema import LimitReport, SandboxUsage, parse_egress_entry

log = logging.getLogger("orchard.env.kubernetes")
# Waiting reasons that no amount of waiting fixes: fail the create at once, saying why.
_HOPELESS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName",
                       "CreateContainerConfigError", "CreateContainerError", "ErrImageNeverPull"})
# The agent bundle's emptyDir (about 75 MiB) counts against the pod's ephemeral storage: less
# than this would leave the sandbox next to nothing, or have its pod evicted as it starts.
MIN_DISK = 256 << 20
_EVICTION = ("pod resources.limits ephemeral-storage: when the container's writes, its logs "
             "and the agent bundle's emptyDir (about 75 MiB) exceed it, the kubelet evicts the "
             "pod (within its eviction-monitoring interval; writes do not fail with ENOSPC) and "
             "the sandbox turns failed")
_USERNS_KEPT = ("hostUsers: false: the pod has its own user namespace, so sandbox root is an "
                "unprivileged uid of the node (the node's runtime must support it: containerd "
                ">= 2.0 or CRI-O >= 1.25)")
_USERNS_DROPPED = ("NOT in effect: the API server dropped hostUsers: false from the pod (it "
                   "needs Kubernetes >= 1.33, or 1.30-1.32 with the UserNamespacesSupport "
                   "feature gate), so sandbox root is the node's root uid; upgrade, or set "
                   "kubernetes.host_users: true to stop asking")
_USERNS_OFF = ("off: kubernetes.host_users is true, so the pod shares the node's user "
               "namespace and sandbox root is the node's root uid")


def pod_ready(pod: Pod | None) -> bool:
    if pod is None or not (pod.get("status") or {}).get("podIP"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in pod["status"].get("conditions") or [])


def pod_problem(pod: Pod | None) -> str | None:
    """Why this pod will never become ready, or None while it still may."""
    if pod is None:
        return "its pod was deleted"
    status = pod.get("status") or {}
    if status.get("phase") in ("Failed", "Succeeded"):
        # An eviction says why in the message ("Pod ephemeral local storage usage exceeds...").
        why = ": ".join(str(x) for x in (status.get("reason"), status.get("message")) if x)
        return f"its pod ended ({status['phase']}: {why or 'no reason given'})"
    for cs in [*(status.get("initContainerStatuses") or []),
               *(status.get("containerStatuses") or [])]:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in _HOPELESS:
            return (f"container {cs.get('name')} cannot start: {waiting['reason']}: "
                    f"{waiting.get('message', '')}".strip())
        terminated = (cs.get("state") or {}).get("terminated") or {}
        if cs.get("name") != "agent-injector" and terminated:
            return f"container {cs.get('name')} exited: {terminated.get('reason')}"
    return None


class KubernetesBackend:
    name = "kubernetes"
    image_cache = None  # the kubelet pulls images, by its own cache and credentials

    def __init__(self, config: KubernetesConfig, model_proxy: str | None = None,
                 agent_limits: AgentLimits | None = None) -> None:
        self.config = config
        self._agent_limits = agent_limits
        self.model_proxy = model_proxy.rstrip("/") if model_proxy else None
        secret = config.agent_secret or os.environ.get("ORCHARD_AGENT_SECRET")
        if not secret:
            log.warning("no ORCHARD_AGENT_SECRET: agent tokens are random to this replica, so "
                        "other replicas cannot reach its sandboxes; set one for multi-replica")
            secret = secrets.token_hex(32)
        self._secret = secret.encode()
        self.api = ApiCaller(config.max_api_concurrency, config.api_retries, config.api_timeout)
        self._client: ApiClient | None = None
        self._informer_task: asyncio.Task[None] | None = None
        self.snapshots = PodSnapshots(config)
        self._blocked = config.blocked_networks()
        # What the API server did with hostUsers: false on the last pod seen (None: none yet).
        self._userns: LimitReport | None = None

    # --- start / stop -------------------------------------------------------------------

    async def start(self) -> None:
        cfg = Configuration()
        try:
            if self.config.kubeconfig or "KUBERNETES_SERVICE_HOST" not in os.environ:
                await kube_config.load_kube_config(config_file=self.config.kubeconfig,
                                                   context=self.config.context,
                                                   client_configuration=cfg)
            else:
                kube_config.load_incluster_config(client_configuration=cfg)
        except Exception as e:  # noqa: BLE001 - the config loaders raise many kinds
            raise BackendError(f"cannot load Kubernetes credentials ({e}); pass "
                               "kubernetes.kubeconfig or run in a pod with a service account"
                               ) from None
        cfg.connection_pool_maxsize = self.config.max_api_concurrency + 8
        self._client = ApiClient(cfg)
        self.core, self.net = CoreV1Api(self._client), NetworkingV1Api(self._client)
        selector = ",".join(f"{k}={v}" for k, v in MANAGED_BY.items())
        self.informer = PodInformer(self.core, self.config.namespace, selector, self.api,
                                    self.config.watch_timeout)
        self._informer_task = asyncio.create_task(self.informer.run())
        try:
            await asyncio.wait_for(self.informer.first_sync.wait(), self.config.api_timeout)
            await self._ensure_deny_egress()
        except (TimeoutError, ApiException) as e:
            await self.close()
            detail = self.informer.last_error or repr(e)
            raise BackendError(f"cannot list pods in namespace {self.config.namespace} at "
                               f"{cfg.host} ({detail}); check the API server address, the "
                               "namespace and the RBAC (deploy/kubernetes)") from None

    async def _ensure_deny_egress(self) -> None:
        await self._ensure_policy(deny_egress_policy(self.config))
        if self.model_proxy:
            await self._ensure_policy(model_egress_policy(self.config))

    async def _ensure_policy(self, policy: dict[str, Any]) -> None:
        ns, name = self.config.namespace, policy["metadata"]["name"]
        try:
            await self.api("get_policy", lambda: self.net.read_namespaced_network_policy(
                name, ns, _preload_content=False))
        except ApiException as e:
            if not not_found(e):
                raise
            with contextlib.suppress(ApiException):  # another replica may win the race
                await self.api("create_policy", lambda: self.net.create_namespaced_network_policy(
                    ns, policy, _preload_content=False))

    async def prepare_browser(self) -> None:
        """Nothing to build: a pod's browser is the image's own Chromium (docs/guides/browser.md
        says why the host's is not carried into pods)."""

    def model_base_url(self, session: str) -> str:
        if self.model_proxy is None:
            raise SpecRejected("this orchestrator has no recording proxy: set model_proxy to "
                               "the proxy Service's URL, e.g. http://orchard-proxy.orchard-system"
                               ".svc:8080 (deploy/kubernetes/base/proxy.yaml)")
        return f"{self.model_proxy}/s/{session}/v1"

    async def close(self) -> None:
        if self._informer_task is not None:
            self._informer_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._informer_task
        if self._client is not None:
            await self._client.close()

    def describe(self) -> dict[str, str]:
        return {"backend": "kubernetes", "namespace": self.config.namespace,
                "informer": "synced" if self.informer.synced else
                f"not synced: {self.informer.last_error}",
                "api_calls": ", ".join(f"{k}={v}" for k, v in sorted(self.api.counts.items())),
                "snapshots": f"tar of {', '.join(self.snapshots.paths)} in {self.snapshots.dir}"
                if self.snapshots.dir else "off: set kubernetes.snapshot_dir",
                "pause": "SIGSTOP/SIGCONT of the pod's processes",
                "user_namespace": self._userns_summary(),
                "blocked_egress": ", ".join(self.config.blocked_egress) or "none"}

    def _userns_summary(self) -> str:
        if self._userns is not None:
            return self._userns.detail
        if self.config.host_users:
            return _USERNS_OFF
        return ("hostUsers: false asked for; no pod seen yet to tell whether the API server "
                "keeps it")

    # --- sandboxes ------------------------------------------------------------------------

    @property
    def namespace(self) -> str:
        return self.config.namespace

    def check(self, spec: SandboxSpec) -> None:
        if spec.image == "host" or spec.image.startswith("/"):
            raise SpecRejected(f"image {spec.image!r} is a local-backend image; on Kubernetes "
                               "give a container image reference such as python:3.12-slim")
        entries = [(e, parse_egress_entry(e)) for e in spec.egress or ()]
        names = [e for e, parsed in entries if isinstance(parsed, str)]
        if names:
            raise SpecRejected(
                f"egress host names ({', '.join(names)}) cannot be expressed in a Kubernetes "
                "NetworkPolicy, which matches addresses only; give IP addresses or CIDR "
                "networks on this backend (the local backend takes names)")
        for entry, parsed in entries:
            blocked = covering_block(parsed, self._blocked)
            if blocked is not None:
                raise SpecRejected(
                    f"egress entry {entry} lies inside {blocked}, which no sandbox may reach "
                    "on this cluster (kubernetes.blocked_egress: nodes, load balancers, cloud "
                    "metadata); leave it out. A wider entry is opened minus the blocked ranges")
        if spec.disk is not None and parse_memory(spec.disk) < MIN_DISK:
            raise SpecRejected(
                f"disk {spec.disk!r} is below the minimum of 256Mi on Kubernetes: the pod's "
                "ephemeral-storage limit also counts the agent bundle it carries (about 75 "
                "MiB); ask for at least 256Mi")
        if spec.snapshot is not None and self.snapshots.dir is None:
            raise SpecRejected("this orchestrator keeps no snapshots on Kubernetes: set "
                               "kubernetes.snapshot_dir to a volume mounted into it")

    def _handle(self, pod: Pod) -> SandboxHandle:
        ip, sid = pod["status"]["podIP"], pod["metadata"]["name"]
        host = f"[{ip}]" if ":" in ip else ip
        limits = pod["spec"]["containers"][0].get("resources", {}).get("limits", {})
        reports = {name: LimitReport(requested=str(limits[key]), enforced=True,
                                     detail=_EVICTION if name == "disk" else
                                     "pod resources.limits (kubelet)")
                   for name, key in LIMIT_NAMES.items() if key in limits}
        reports["user_namespace"] = self._user_namespace(pod)
        return SandboxHandle(
            sandbox_id=sid, address=f"tcp:{host}:{self.config.agent_port}",
            token=agent_token(self._secret, sid), limits=reports,
        )

    def _user_namespace(self, pod: Pod) -> LimitReport:
        """Whether this pod kept hostUsers: false. An API server that does not know the field,
        or has its feature gate off, drops it without a word: say so once, loudly."""
        if pod["spec"].get("hostUsers") is False:
            report = LimitReport(requested="hostUsers: false", enforced=True, detail=_USERNS_KEPT)
        elif self.config.host_users:
            report = LimitReport(requested=None, enforced=False, detail=_USERNS_OFF)
        else:
            report = LimitReport(requested="hostUsers: false", enforced=False,
                                 detail=_USERNS_DROPPED)
            if self._userns is None or self._userns.enforced:
                log.warning("sandbox pod %s: %s", pod["metadata"]["name"], _USERNS_DROPPED)
        self._userns = report
        return report

    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        if spec.snapshot is not None:
            self.snapshots.require(spec.snapshot)  # before any pod: nothing to clean up
        handle = await self._create_pod(spec)
        if spec.snapshot is not None:
            try:
                async with self._agent_for(handle) as agent:
                    await self.snapshots.restore(agent, spec.sandbox_id, spec.snapshot)
            except Exception:
                # A sandbox without its snapshot's files must not be handed out, nor left.
                with contextlib.suppress(BackendError):
                    await self.delete(spec.sandbox_id)
                raise
        return handle

    async def _create_pod(self, spec: SandboxSpec) -> SandboxHandle:
        ns, sid = self.config.namespace, spec.sandbox_id
        nonce = uuid.uuid4().hex
        body = pod_manifest(spec, self.config, agent_token(self._secret, sid), nonce)
        try:
            if not spec.block_network:
                await self.api("create_policy", lambda: self.net.create_namespaced_network_policy(
                    ns, allow_egress_policy(spec, self.config), _preload_content=False))
            created = await self.api("create_pod", lambda: self.core.create_namespaced_pod(
                ns, body, _preload_content=False))
            version = int(created["metadata"]["resourceVersion"])
        except ApiException as e:
            if e.status != 409 or not await self._is_ours(sid, nonce):
                raise BackendError(_api_error(f"creating pod {sid}", e)) from None
            version = 0

        def settled(pod: Pod | None) -> bool:
            if pod is None:  # deleted, or not yet seen by the watch
                return 0 < version <= self.informer.version
            return pod_ready(pod) or pod_problem(pod) is not None

        try:
            pod = await self.informer.wait_for(sid, settled, self.config.ready_timeout)
        except TimeoutError:
            raise BackendError(f"pod {sid} not ready after {self.config.ready_timeout:.0f}s; "
                               f"see kubectl -n {ns} describe pod {sid}") from None
        if not pod_ready(pod):
            raise BackendError(f"sandbox {sid}: {pod_problem(pod)}")
        assert pod is not None
        return self._handle(pod)

    async def _is_ours(self, sid: str, nonce: str) -> bool:
        """After a 409: did an earlier attempt of this very create (retried after a timeout)
        make the pod, or is the name taken by another?"""
        pod = self.informer.get(sid) or await self._read_pod(sid)
        return pod is not None and (pod["metadata"].get("annotations") or {}).get(NONCE) == nonce

    async def delete(self, sandbox_id: str) -> None:
        ns = self.config.namespace
        pod = self.informer.get(sandbox_id)
        try:
            await self.api("delete_pod", lambda: self.core.delete_namespaced_pod(
                sandbox_id, ns, _preload_content=False))
        except ApiException as e:
            if not not_found(e):
                raise BackendError(_api_error(f"deleting pod {sandbox_id}", e)) from None
        # Unknown pods may have had a policy: deleting a missing one is a cheap 404.
        if pod is None or pod["metadata"]["labels"].get(NETWORK) == "open":
            try:
                await self.api("delete_policy", lambda: self.net.delete_namespaced_network_policy(
                    allow_egress_name(sandbox_id), ns, _preload_content=False))
            except ApiException as e:
                if not not_found(e):
                    raise BackendError(_api_error("deleting its network policy", e)) from None
        with contextlib.suppress(TimeoutError):  # gone from the cache = gone from the cluster
            await self.informer.wait_for(sandbox_id, lambda p: p is None, 60)

    async def list(self) -> set[str]:
        try:
            return self.informer.names()
        except NotSynced as e:
            raise BackendError(str(e)) from None

    async def adopt(self, sandbox_id: str) -> SandboxHandle | None:
        pod = self.informer.get(sandbox_id)
        if pod is None:
            # The API server only on a cache miss, e.g. a pod another replica made ready a
            # moment ago whose event has not reached this replica's watch yet.
            pod = await self._read_pod(sandbox_id)
        if pod_ready(pod):
            return self._handle(pod)
        if pod is not None and (problem := pod_problem(pod)) is not None:
            # The record will say only that the sandbox exited: log the pod's own reason (an
            # eviction for writing past its disk limit, an OOM kill).
            log.warning("sandbox %s: %s", sandbox_id, problem)
        return None

    # --- snapshots and pause, through the pod's agent (see snapshots.py) ---------------------

    @contextlib.asynccontextmanager
    async def _agent_for(self, handle: SandboxHandle) -> AsyncIterator[AgentClient]:
        agent = AgentClient(handle.address, token=handle.token, **(self._agent_limits or {}))
        try:
            yield agent
        finally:
            await agent.close()

    @contextlib.asynccontextmanager
    async def _agent(self, sandbox_id: str) -> AsyncIterator[AgentClient]:
        pod = self.informer.get(sandbox_id) or await self._read_pod(sandbox_id)
        if not pod_ready(pod):
            why = pod_problem(pod) or "its pod is not ready yet"
            raise BackendError(f"sandbox {sandbox_id} cannot be reached: {why}; wait until it "
                               "is running, or create it again")
        assert pod is not None
        async with self._agent_for(self._handle(pod)) as agent:
            yield agent

    async def snapshot(self, sandbox_id: str, snapshot_id: str, parent: str | None,
                       max_bytes: int, memory: bool = False) -> SnapshotMade:
        if memory:
            raise MemoryUnsupported(
                "live (memory) snapshots are local-backend only: the kubelet's checkpoint API "
                "(ContainerCheckpoint) writes an archive on the node, but Kubernetes has no "
                "API to restore it into a pod; take a files-only snapshot (memory: false), or "
                "run this on the local backend")
        # parent does not matter here: every archive holds the whole kept paths.
        self.snapshots.tar(snapshot_id)  # says what to configure before the pod is reached
        async with self._agent(sandbox_id) as agent:
            return await self.snapshots.take(agent, sandbox_id, snapshot_id, max_bytes)

    async def delete_snapshot(self, snapshot_id: str) -> bool:
        return await self.snapshots.delete(snapshot_id)

    async def list_snapshots(self) -> set[str]:
        return await self.snapshots.list()

    async def usage(self, sandbox_id: str) -> SandboxUsage:
        # Reading a pod's use needs metrics-server, which a cluster may not run.
        return SandboxUsage(sandbox_id=sandbox_id)

    async def pause(self, sandbox_id: str) -> None:
        async with self._agent(sandbox_id) as agent:
            await signal_pod(agent, sandbox_id, "STOP")

    async def resume(self, sandbox_id: str) -> None:
        async with self._agent(sandbox_id) as agent:
            await signal_pod(agent, sandbox_id, "CONT")

    async def _read_pod(self, sandbox_id: str) -> Pod | None:
        try:
            pod: Pod = await self.api("get_pod", lambda: self.core.read_namespaced_pod(
                sandbox_id, self.config.namespace, _preload_content=False))
        except ApiException:
            return None
        return pod


def _api_error(what: str, e: ApiException) -> str:
    hint = {403: "the orchestrator's service account lacks RBAC for this (deploy/kubernetes)",
            409: "the name is taken (a pod still terminating?); retry shortly or pick another id",
            422: "the API server rejected the pod spec", 0: "the API server is unreachable"}
    return f"{what}: {e.status} {e.reason}: {hint.get(e.status, 'see the API server message')}"

