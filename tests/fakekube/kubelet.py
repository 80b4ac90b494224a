"""A fake kubelet: turns each Pod of a `FakeApiServer` into a real local sandbox.

Each pod gets its own loopback address (127.42.x.y) as its Pod IP. The sandbox's agent runs
with the token from the pod's environment, exactly as the pod spec asks, and the kubelet
relays TCP on podIP:9090 to the agent's socket, standing in for the pod network. Like a real
kubelet, it flips the pod to Ready only once an HTTP probe of /health answers, and it reports
image pull errors and pod failures through the pod's status.

It runs on the API server's loop and uses the server's in-process API, so its own status
writes are not counted as API requests (only the orchestrator's are).

Images: a pod's image is looked up in ``images`` (container image -> local image reference);
anything else runs as "host"; images starting with ``missing/`` fail with ErrImagePull.

Not modelled: ephemeral-storage limits (a real kubelet evicts a pod past them; tests stand in
with ``fail_pod(..., reason="Evicted")``), ``hostUsers`` (every local sandbox has a user
namespace of its own anyway) and NetworkPolicy (see tests/fakekube/netpol.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from orchard.env.agent.bundle import BUNDLE_MOUNT
from orchard.env.backends.base import SandboxSpec
from orchard.env.backends.kubernetes.manifests import NETWORK, TOKEN_ENV
from orchard.env.backends.local.backend import LocalBackend
from tests.fakekube.apiserver import ApiError, FakeApiServer

log = logging.getLogger(__name__)
Pod = dict[str, Any]
FIRST_POD_IP = ipaddress.ip_address("127.42.0.1")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeKubelet:
    def __init__(self, server: FakeApiServer, data_dir: Path,
                 images: dict[str, str] | None = None) -> None:
        self.server = server
        self.images = images or {}
        self.backend = LocalBackend(data_dir, die_with_orchestrator=True)
        self._next_ip = 0
        self._free_ips: list[str] = []
        self._pods: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._relays: dict[tuple[str, str], tuple[asyncio.Server, str]] = {}

    def start(self) -> FakeKubelet:
        self.server.run_in_loop(self._attach()).result()
        return self

    async def _attach(self) -> None:
        self.server.add_listener(self._on_event)
        for pod in await self.server.list_objects("pods"):  # pods made before we started
            self._on_event("ADDED", pod)

    def stop(self) -> None:
        self.server.run_in_loop(self._detach()).result()

    async def _detach(self) -> None:
        self.server.remove_listener(self._on_event)
        for key in list(self._pods):
            await self._stop_pod(key)
        await self.backend.close()

    def __enter__(self) -> FakeKubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- events ---------------------------------------------------------------------------

    def _on_event(self, kind: str, obj: dict[str, Any]) -> None:
        if obj.get("kind") != "Pod":
            return
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        loop = asyncio.get_running_loop()
        if kind == "ADDED" and key not in self._pods:
            self._pods[key] = loop.create_task(self._run_pod(obj))
        elif kind == "DELETED" and key in self._pods:
            loop.create_task(self._stop_pod(key))

    def _allocate_ip(self) -> str:
        if self._free_ips:
            return self._free_ips.pop()
        self._next_ip += 1
        return str(FIRST_POD_IP + self._next_ip - 1)

    async def _status(self, key: tuple[str, str], status: dict[str, Any]) -> None:
        with contextlib.suppress(ApiError):  # deleted meanwhile
            await self.server.update_status("pods", key[0], key[1], status)

    async def _run_pod(self, pod: Pod) -> None:
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        container = pod["spec"]["containers"][0]
        problem = _not_injected(pod)
        if problem:
            await self._status(key, {"phase": "Failed", "reason": "FakeKubelet",
                                     "message": problem})
            return
        if container["image"].startswith("missing/"):
            await self._status(key, {"containerStatuses": [{
                "name": container["name"], "ready": False, "restartCount": 0,
                "image": container["image"], "imageID": "",
                "state": {"waiting": {"reason": "ErrImagePull",
                                      "message": f"pull {container['image']}: not found"}}}]})
            return
        env = {e["name"]: e.get("value", "") for e in container.get("env", [])}
        limits = container.get("resources", {}).get("limits", {})
        spec = SandboxSpec(
            sandbox_id=key[1], image=self.images.get(container["image"], "host"),
            block_network=pod["metadata"]["labels"].get(NETWORK) != "open",
            cpu=limits.get("cpu"), memory=limits.get("memory"),
            env={k: v for k, v in env.items() if k != TOKEN_ENV}, agent_token=env.get(TOKEN_ENV),
        )
        try:
            handle = await self.backend.create(spec)
        except Exception as e:  # noqa: BLE001 - reported through the pod, as a kubelet would
            await self._status(key, {"phase": "Failed", "reason": "StartError",
                                     "message": str(e)[:2000]})
            return
        socket_path = handle.address.removeprefix("unix:")
        port = container["ports"][0]["containerPort"]
        try:
            relay, ip = await self._listen(socket_path, port)
            self._relays[key] = (relay, ip)
            await _probe(ip, port)
        except Exception as e:  # noqa: BLE001 - a pod left Pending would hide it
            await self._status(key, {"phase": "Failed", "reason": "FakeKubelet",
                                     "message": f"pod network: {e!r}"[:2000]})
            return
        await self._status(key, {
            "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "127.0.0.1",
            "startTime": _now(),
            "conditions": [{"type": t, "status": "True", "lastTransitionTime": _now()}
                           for t in ("PodScheduled", "Initialized", "ContainersReady",
                                     "Ready")],
            "containerStatuses": [{"name": container["name"], "ready": True,
                                   "restartCount": 0, "image": container["image"],
                                   "imageID": "", "started": True,
                                   "state": {"running": {"startedAt": _now()}}}],
        })

    async def _listen(self, socket_path: str, port: int) -> tuple[asyncio.Server, str]:
        """The pod's relay, on a Pod IP of its own. Another fake cluster on this host (another
        test session) hands out the same addresses: one that is taken is skipped for good."""
        for _ in range(1000):
            ip = self._allocate_ip()
            try:
                relay = await asyncio.start_server(
                    lambda r, w: _relay(r, w, socket_path), ip, port, reuse_address=True)
            except OSError as e:
                if e.errno != errno.EADDRINUSE:
                    raise
                log.info("pod IP %s:%d is taken by another process; skipping it", ip, port)
                continue
            return relay, ip
        raise RuntimeError(f"no free pod IP for port {port} after 1000 tries")

    async def _stop_pod(self, key: tuple[str, str]) -> None:
        task = self._pods.pop(key, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        relay = self._relays.pop(key, None)
        if relay is not None:
            relay[0].close()
            self._free_ips.append(relay[1])
        await self.backend.delete(key[1])

    # --- test controls ----------------------------------------------------------------------

    def fail_pod(self, namespace: str, name: str, reason: str = "OOMKilled",
                 message: str | None = None) -> None:
        """The pod's container dies, as after an OOM kill or an eviction (reason "Evicted",
        with the kubelet's message): the sandbox goes, the pod stays."""
        async def fail() -> None:
            relay = self._relays.pop((namespace, name), None)
            if relay is not None:
                relay[0].close()
            await self.backend.delete(name)
            await self._status((namespace, name), {
                "phase": "Failed", "reason": reason, **({"message": message} if message else {}),
                "conditions": [{"type": "Ready", "status": "False"}]})
        self.server.run_in_loop(fail()).result()

    def sandboxes(self) -> set[str]:
        return self.server.run_in_loop(self.backend.list()).result()


def _not_injected(pod: Pod) -> str | None:
    """The kubelet cannot run the image's real entrypoint; it only checks that the pod asks
    for the agent the way a real node would run it."""
    spec = pod["spec"]
    container = spec["containers"][0]
    if not spec.get("initContainers"):
        return "no agent-injector init container"
    mounts = {m["mountPath"] for m in container.get("volumeMounts", [])}
    command = container.get("command") or []
    if BUNDLE_MOUNT not in mounts or not command or not command[0].startswith(BUNDLE_MOUNT):
        return f"the container does not run the agent from {BUNDLE_MOUNT}"
    if "--token-env" not in command:
        return "the agent is not given its token"
    return None


async def _probe(ip: str, port: int) -> None:
    """The readiness probe: GET /health until the agent answers 200."""
    for _ in range(600):
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            reader, writer = await asyncio.open_connection(ip, port)
            writer.write(b"GET /health HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n")
            status = await reader.readline()
            writer.close()
            if b" 200 " in status:
                return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"agent at {ip}:{port} never answered its probe")


async def _relay(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter,
                 socket_path: str) -> None:
    try:
        agent_r, agent_w = await asyncio.open_unix_connection(socket_path)
    except OSError:
        client_w.close()
        return

    async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.write_eof() if dst.can_write_eof() else dst.close()

    await asyncio.gather(pump(client_r, agent_w), pump(agent_r, client_w))
    client_w.close()
    agent_w.close()
