"""The local backend: each sandbox is a set of namespaces over a private overlay.

Launch chain, per sandbox (``jail.py``; nothing execs, and the sandbox is in its cgroups
before it runs anything):

    zygote  ->  launcher (fork; host root: id maps, mounts)
            ->  agent (clone3: user, mount, pid, ipc, uts, net namespaces; pid 1; pivot_root,
                then confined: no capabilities, no_new_privs, seccomp)

Sandbox root is an unprivileged host uid, its own per sandbox (``userns.py``); the launcher
writes the user namespace's id maps and makes the id-mapped image view the overlay reads.
The agent shares the zygote's pre-loaded pages; as pid 1, its end is the sandbox's end.

The overlay is mounted inside the sandbox's own mount namespace, so it disappears with the
sandbox's last process: killing the cgroup is a complete teardown even after the orchestrator
was SIGKILLed. All writes go to ``<sandbox>/upper`` (the image is never modified), which a later
snapshot/fork can freeze and reuse as a lower layer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from orchard.env.agent.browser_bundle import ensure_browser_bundle
from orchard.env.agent.bundle import BUNDLE_MOUNT, BundleError, ensure_bundle
from orchard.env.backends.base import (
    BackendError,
    SandboxHandle,
    SandboxSpec,
    SnapshotMade,
    SpecForbidden,
    SpecRejected,
    agent_token,
)
from orchard.env.backends.local import network, quota, zygote
from orchard.env.backends.local.cgroups import CgroupError, CgroupManager, LimitResult
from orchard.env.backends.local.checkpoint import Checkpoints, last_pid
from orchard.env.backends.local.host_state import agent_secret, cgroup_group
from orchard.env.backends.local.image_cache import RegistryImages
from orchard.env.backends.local.image_pull import Skopeo
from orchard.env.backends.local.image_refs import is_registry_ref, parse_ref
from orchard.env.backends.local.images import (
    ImageError,
    ImageForbidden,
    ImageStore,
    ResolvedImage,
)
from orchard.env.backends.local.launch import (
    CTL_MOUNT,
    USER_PATH,
    Launcher,
    agent_pid,
    record_launcher,
)
from orchard.env.backends.local.reaper import Reaper
from orchard.env.backends.local.relay import MARKER, MODEL_PORT, MODEL_SOCKET, ModelRelays
from orchard.env.backends.local.seccomp import write_filter
from orchard.env.backends.local.snapshots import SnapshotLayers, SnapshotTaker
from orchard.env.backends.local.usage import measure
from orchard.env.backends.local.userns import UidRangeError, UidRanges, uid_of
from orchard.env.datadir import private_dir
from orchard.env.images_config import ImagesConfig
from orchard.env.schema import LimitReport, SandboxUsage

log = logging.getLogger("orchard.env")
SOCKET_NAME = "agent.sock"
_MAX_UNIX_PATH = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux
T = TypeVar("T")


async def _to_end(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on a thread, waited for even when the caller is cancelled. A plain
    ``to_thread`` returns at the cancel while its thread goes on, so the cleanup after a
    cancel could run before the thread makes the dir, cgroup or process it should undo."""
    work = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        # Its result or error no longer matters: the cancel wins.
        with contextlib.suppress(BaseException):
            await asyncio.wait([work])
        raise


class LocalBackend:
    """Sandboxes on this machine; needs root, Linux 5.12+, overlayfs and cgroups."""

    name = "local"
    namespace: str | None = None  # sandboxes are processes on this host: no platform namespace

    def __init__(self, data_dir: Path, ready_timeout: float = 30.0,
                 die_with_orchestrator: bool = False, model_proxy: str | None = None,
                 cache_dir: Path | None = None, egress_refresh: float = 30.0,
                 allow_io_uring: bool = False, image_dir: Path | None = None,
                 image_paths: Sequence[Path] = (), private_dirs: Sequence[Path] = (),
                 images: ImagesConfig | None = None, docker_config: Path | None = None) -> None:
        """``image_dir`` and ``image_paths`` are where image paths may lie besides the
        unpacked-image cache; never in ``data_dir``, the cache dir or ``private_dirs``.
        ``images`` says how to reach registries (auth, mirrors, the cache's cap)."""
        if os.geteuid() != 0:
            raise BackendError(
                "the local backend needs root (namespaces, overlay mounts, cgroups): run "
                "`sudo orchard serve` or use the Kubernetes backend"
            )
        if any(c in str(data_dir) for c in ",:"):
            raise BackendError(f"data dir {data_dir} must not contain ',' or ':' (overlayfs "
                               "option syntax); choose another --data-dir")
        self.relays = ModelRelays(model_proxy)
        self.egress = network.EgressRules(data_dir / "sandboxes", egress_refresh)
        self.data_dir = data_dir
        # Only host root may enter: images and snapshots hold files owned by host ids, set-id
        # bits included, and the sandbox needs none of it (the launcher mounts through fds).
        private_dir(data_dir)
        self.sandboxes_dir = private_dir(data_dir / "sandboxes")
        self._secret = agent_secret(data_dir / "agent.secret")
        self.uid_ranges = UidRanges()
        self.ready_timeout = ready_timeout
        # An embedded orchestrator's sandboxes must not outlive its process (nobody could
        # re-adopt them); a standalone one's do, so a restart can re-adopt them. The embedded
        # one's agents watch the zygote's lifeline, whose write end only this process holds
        # (it is close-on-exec), so they end with it even after a SIGKILL.
        self._die_with_orchestrator = die_with_orchestrator
        self._slirps: dict[str, subprocess.Popen[bytes]] = {}
        cache = cache_dir or data_dir
        private_dir(cache / "images")
        if image_dir is not None:
            image_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.images = ImageStore(cache / "images", image_dir, image_paths,
                                 private=(data_dir, cache, *private_dirs))
        images = images or ImagesConfig()
        self.image_cache = RegistryImages(
            self.images, Skopeo(images, docker_config, data_dir / "registry"),
            images.max_cache_bytes, images.allowed_registries)
        # Built on the first browser action (see prepare_browser), seen live by every sandbox.
        browser = cache / "browser"
        browser.mkdir(mode=0o755, parents=True, exist_ok=True)
        self._browser_ready = False
        self.launcher = Launcher.prepare(data_dir, ensure_bundle(cache / "bundle"), browser)
        self.bundle = self.launcher.bundle
        self.cgroups = CgroupManager(cgroup_group(data_dir))
        self.seccomp_path = write_filter(data_dir / "seccomp.bpf", allow_io_uring)
        self.snapshots = SnapshotLayers(data_dir / "snapshots", self.sandboxes_dir)
        self.snapshots.remove_partials()
        self.checkpoints = Checkpoints(cache / "criu")
        self.snapshot_taker = SnapshotTaker(self.snapshots, self.checkpoints, self.cgroups)
        # A delete's own part (freeze, signal, rename) may sleep a little while a cgroup
        # freezes: a pool of its own keeps that off the default executor (image unpacking).
        self._teardown_pool = ThreadPoolExecutor(8, thread_name_prefix="orchard-teardown")
        # The rest of a delete, off every create's path; first what a killed predecessor left.
        self.reaper = Reaper(data_dir / "reaping", self.cgroups, self.uid_ranges)
        self.reaper.resume()
        self.zygote_socket = data_dir / "zygote.sock"
        self._zygote, self._lifeline = self._start_zygote()

    def _start_zygote(self) -> tuple[subprocess.Popen[bytes], int]:
        """The fork-server; it exits when our end of the lifeline pipe closes."""
        lifeline_r, lifeline_w = os.pipe()
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", zygote.__file__, str(self.zygote_socket),
             str(self.seccomp_path), str(lifeline_r)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=open(self.data_dir / "zygote.log", "ab"),  # noqa: SIM115 - child keeps it
            pass_fds=(lifeline_r,), env={"PATH": USER_PATH}, start_new_session=True,
        )
        os.close(lifeline_r)
        assert proc.stdout is not None
        if proc.stdout.readline() != b"ready\n":
            raise BackendError(f"the agent fork-server failed to start; see "
                               f"{self.data_dir / 'zygote.log'}")
        proc.stdout.close()
        return proc, lifeline_w

    def _dir(self, sandbox_id: str) -> Path:
        return self.sandboxes_dir / sandbox_id

    def socket_path(self, sandbox_id: str) -> Path:
        return self._dir(sandbox_id) / "ctl" / SOCKET_NAME

    def describe(self) -> dict[str, str]:
        return {"backend": "local", **self.cgroups.layout()}

    async def start(self) -> None:
        """The zygote started with the backend; only the allow-list refresh is left."""
        self.egress.start()

    def check(self, spec: SandboxSpec) -> None:
        if spec.model_proxy and spec.session is None:
            raise SpecRejected("model_proxy needs a session: the relay carries that session's "
                               "model calls and no other's")
        if spec.image == "host":
            return
        try:
            if is_registry_ref(spec.image):
                parse_ref(spec.image)
                return
            self.images.confine(spec.image)
        except ImageForbidden as e:
            raise SpecForbidden(str(e)) from None
        except ImageError as e:
            raise SpecRejected(str(e)) from None

    # --- create -------------------------------------------------------------------------

    async def _resolve(self, spec: SandboxSpec) -> ResolvedImage:
        try:
            pulled = await self.image_cache.pull(spec.image)
            return pulled or await asyncio.to_thread(self.images.resolve, spec.image)
        except ImageError as e:
            raise BackendError(str(e)) from None

    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        await self.reaper.settled(spec.sandbox_id)  # the id's cgroup name, if just deleted
        image = await self._resolve(spec)
        sdir = self._dir(spec.sandbox_id)
        sock = self.socket_path(spec.sandbox_id)
        if len(os.fsencode(sock)) > _MAX_UNIX_PATH:
            # Otherwise the sandbox starts "running" but its agent can never be reached.
            raise BackendError(
                f"agent socket path {sock} is over {_MAX_UNIX_PATH} bytes (the AF_UNIX limit); "
                "use a shorter sandbox_id or a shorter --data-dir")
        # With a disk quota, upper and work are made here and copied into its file system.
        layers = sdir / quota.DISK_DIR if spec.disk and quota.unavailable() is None else sdir
        token = spec.agent_token or agent_token(self._secret, spec.sandbox_id)
        net_r = net_w = -1
        # From the dir on, any failure or cancel (a delete of the pending sandbox) undoes
        # the launch here, after the step under way has finished.
        try:
            if not await _to_end(self._make_dir, sdir, layers, image):
                # Evicted between the pull and now: once more, then it is there.
                image = await self._resolve(spec)
                if image.digest is None or self.images.claim(image.digest, sdir) is None:
                    raise BackendError(f"image {spec.image} was removed from the cache while "
                                       "the sandbox started; create it again")
            try:
                limits = await _to_end(
                    self.cgroups.create, spec.sandbox_id, spec.cpu, spec.memory, spec.pids)
            except (ValueError, CgroupError) as e:
                raise BackendError(f"sandbox {spec.sandbox_id}: {e}") from None
            # A networked sandbox's slirp4netns exits when this pipe's write end closes;
            # only the agent (pid 1) keeps that end, so the network goes when it does.
            if not spec.block_network:
                net_r, net_w = os.pipe()
            uid, request, limits["disk"] = await _to_end(
                self._prepare_launch, spec, image, sdir, layers)
            if spec.model_proxy:
                assert spec.session is not None  # check() refused it otherwise
                # So an adopting orchestrator re-opens the relay, for the same session.
                (sdir / MARKER).write_text(spec.session)
                await self.relays.open(spec.sandbox_id, sdir / "ctl", uid, spec.session)
            # A live snapshot's processes are restored with their pids, so none is used first.
            memory = self.snapshots.memory(spec.snapshot) if spec.snapshot else None
            if memory:
                request["last_pid"] = last_pid(memory)
            reply = await self._launch(spec, image, request, token, net_w)
            if reply["launcher"] is not None:
                record_launcher(sdir, reply["launcher"])
            if not spec.block_network:
                await self._attach_network(spec, reply["pid"], net_r)
            if memory:
                await asyncio.to_thread(self.checkpoints.restore, spec.sandbox_id, reply["pid"],
                                        memory, self.cgroups.procs_files(spec.sandbox_id), sdir)
        except quota.QuotaError as e:
            await self.delete(spec.sandbox_id)
            raise BackendError(f"sandbox {spec.sandbox_id}: {e}") from None
        except BaseException:
            await self.delete(spec.sandbox_id)
            raise
        finally:
            for fd in (net_r, net_w):
                if fd >= 0:
                    os.close(fd)
        return SandboxHandle(
            sandbox_id=spec.sandbox_id,
            address=f"unix:{self.socket_path(spec.sandbox_id)}",
            limits={k: LimitReport(requested=v.requested, enforced=v.enforced, detail=v.detail)
                    for k, v in limits.items()},
            token=token,
        )

    def _make_dir(self, sdir: Path, layers: Path, image: ResolvedImage) -> bool:
        """The sandbox dir, and its claim on a cached image (False: the image was evicted).
        The dir comes first: it is this orchestrator's claim on the id (list() reads dirs),
        so a crash at any later point leaves something the reconcile pass will find.
        Blocking, as everything below the event loop's create."""
        for sub in (layers / "upper", layers / "work", sdir / "stage" / "root", sdir / "ctl"):
            sub.mkdir(parents=True, exist_ok=True)
        sdir.chmod(0o700)
        # Host root's, and read-only inside: the sandbox cannot replace what is in it.
        (sdir / "ctl").chmod(0o755)
        return image.digest is None or self.images.claim(image.digest, sdir) is not None

    def _prepare_launch(self, spec: SandboxSpec, image: ResolvedImage, sdir: Path,
                        layers: Path) -> tuple[int, dict[str, Any], LimitResult]:
        """The uid range, the disk quota and the zygote's request (see ``launch.py``)."""
        lower = self.launcher.host_skeleton if image.kind == "host" else image.rootfs
        assert lower is not None
        # A sandbox started from a snapshot mounts the snapshot's layers over the image.
        chain = self.snapshots.pin(sdir, spec.snapshot) if spec.snapshot else []
        try:
            uid = self.uid_ranges.claim(sdir)
        except UidRangeError as e:
            raise BackendError(f"sandbox {spec.sandbox_id}: {e}") from None
        # Sandbox root owns its root directory (the overlay's top takes the upper dir's owner).
        os.chown(layers / "upper", uid, uid)
        disk = quota.make_disk(sdir, spec.disk) if spec.disk else quota.not_requested()
        request = self.launcher.request(spec, image, sdir, uid,
                                        [*self.snapshots.layers(chain), lower],
                                        disk=layers != sdir)
        return uid, request, disk

    async def _attach_network(self, spec: SandboxSpec, agent: int, exit_fd: int) -> None:
        """Egress rules (and an allow-list's resolver) first, then the link: no packet leaves
        before the rules are in. Both act on a handle of the agent's network namespace,
        never on its pid again."""
        sdir = self._dir(spec.sandbox_id)
        try:
            netns = await _to_end(network.open_netns, agent,
                                  lambda: self.cgroups.pids(spec.sandbox_id))
            try:
                await self.egress.install(spec.sandbox_id, netns, spec.egress)
                self._slirps[spec.sandbox_id] = await _to_end(
                    network.start_slirp, netns, exit_fd,
                    self.cgroups.procs_files(spec.sandbox_id), sdir / "launch.log",
                    spec.egress is None)
            finally:
                os.close(netns)
        except network.NetworkError as e:
            raise BackendError(f"sandbox {spec.sandbox_id}: {e}") from None

    def _agent_env(self, spec: SandboxSpec, image: ResolvedImage) -> dict[str, str]:
        # The image's Env (PATH above all) over our defaults; the create's env over both.
        from_image = image.config.env if image.config is not None else {}
        return {"PATH": USER_PATH, "HOME": "/root", "LANG": "C.UTF-8",
                "HOSTNAME": spec.sandbox_id[:63], **from_image, **spec.env}

    async def _launch(self, spec: SandboxSpec, image: ResolvedImage, request: dict[str, Any],
                      token: str, net_w: int) -> dict[str, Any]:
        """Has the zygote launch the sandbox (see ``jail.py``): its reply names the agent (the
        sandbox's pid 1) and, with a disk quota, the launcher kept alive."""
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        v2, v1 = self.cgroups.membership(spec.sandbox_id)
        request |= {
            "cgroup": str(v2) if v2 else None, "procs": [str(p) for p in v1],
            "lifeline": self._die_with_orchestrator, "env": self._agent_env(spec, image),
            # Bound by the launcher on the host, in a dir only host root may write: no path
            # that sandbox code controls is ever on the way to the agent.
            "listen": str(self.socket_path(spec.sandbox_id)), "token": token,
            "forward": (f"127.0.0.1:{MODEL_PORT}={CTL_MOUNT}/{MODEL_SOCKET}"
                        if spec.model_proxy else None),
            "path": [f"{BUNDLE_MOUNT}/lib/{version}", f"{BUNDLE_MOUNT}/lib/{version}/lib-dynload"],
        }
        loop = asyncio.get_running_loop()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.setblocking(False)
            try:
                await loop.sock_connect(conn, str(self.zygote_socket))
                # A few kB into an empty socket buffer: this send never blocks.
                socket.send_fds(conn, [json.dumps({"launch": request}).encode() + b"\n"],
                                [net_w] if net_w >= 0 else [])
                line = await asyncio.wait_for(self._read_line(conn), self.ready_timeout)
            except (OSError, TimeoutError) as e:
                raise BackendError(f"sandbox {spec.sandbox_id}: the fork-server did not launch "
                                   f"it ({e!r}); see {self.data_dir / 'zygote.log'}") from None
        reply = json.loads(line or b'{"error": "no reply"}')
        if "error" in reply:
            raise BackendError(f"sandbox {spec.sandbox_id} failed to start: {reply['error']}")
        (self._dir(spec.sandbox_id) / "agent.pid").write_text(str(reply["pid"]))
        return reply

    @staticmethod
    async def _read_line(conn: socket.socket) -> bytes:
        loop = asyncio.get_running_loop()
        data = b""
        while not data.endswith(b"\n"):
            chunk = await loop.sock_recv(conn, 4096)
            if not chunk:
                break
            data += chunk
        return data

    # --- delete / list / adopt -------------------------------------------------------------

    async def prepare_browser(self) -> None:
        if not self._browser_ready:
            try:
                await asyncio.to_thread(ensure_browser_bundle, self.launcher.browser)
            except BundleError as e:
                raise BackendError(f"cannot carry the host's Chromium into sandboxes: {e}; "
                                   "use an image with chromium on its PATH") from e
            self._browser_ready = True

    def model_base_url(self, session: str) -> str:
        return self.relays.base_url(session)

    async def delete(self, sandbox_id: str) -> None:
        """Returns once the sandbox is unreachable: its processes SIGKILLed, its dir (with
        the agent's socket) out of sandboxes/. The reaper (reaper.py) does the rest."""
        self.egress.forget(sandbox_id)
        self.relays.close(sandbox_id)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._teardown_pool, self._delete_sync, sandbox_id)

    def _delete_sync(self, sandbox_id: str) -> None:
        try:
            self.cgroups.send_kill(sandbox_id)
            self.reaper.take(sandbox_id, self._dir(sandbox_id), self._children(sandbox_id))
        except (OSError, CgroupError) as e:
            raise BackendError(f"sandbox {sandbox_id}: {e}; the reconcile pass retries "
                               "the delete") from None

    def _children(self, sandbox_id: str) -> list[subprocess.Popen[bytes]]:
        """Our own children among the sandbox's processes, for the reaper to wait for so
        that none is left a zombie."""
        slirp = self._slirps.pop(sandbox_id, None)
        return [slirp] if slirp is not None else []

    async def list(self) -> set[str]:
        """Sandboxes of THIS data dir only: other orchestrators on the host share the cgroup
        tree, and their sandboxes are not ours to reap."""
        return {p.name for p in self.sandboxes_dir.iterdir() if p.is_dir()}

    async def adopt(self, sandbox_id: str) -> SandboxHandle | None:
        sock = self.socket_path(sandbox_id)
        try:
            agent = agent_pid(self._dir(sandbox_id))
        except BackendError:
            return None
        # The agent itself must be alive (a disk quota's launcher keeps the cgroup populated).
        if not sock.exists() or agent not in self.cgroups.pids(sandbox_id):
            return None
        # The allow-list's resolver lived in the orchestrator that made the sandbox.
        await self.egress.adopt(sandbox_id, agent, lambda: self.cgroups.pids(sandbox_id))
        marker = self._dir(sandbox_id) / MARKER
        if marker.exists() and self.relays.proxy and sandbox_id not in self.relays:
            # The sandbox dir is host root's: the sandbox cannot have written the marker.
            try:
                await self.relays.open(sandbox_id, self._dir(sandbox_id) / "ctl",
                                       uid_of(self._dir(sandbox_id)), marker.read_text())
            except BackendError as e:  # an empty marker: made before relays had sessions
                log.warning("%s; its harness cannot reach the proxy until it is re-created", e)
        return SandboxHandle(sandbox_id=sandbox_id, address=f"unix:{sock}",
                             token=agent_token(self._secret, sandbox_id))

    # --- snapshots and pause ---------------------------------------------------------------

    async def snapshot(self, sandbox_id: str, snapshot_id: str, parent: str | None,
                       max_bytes: int, memory: bool = False) -> SnapshotMade:
        return await asyncio.to_thread(self.snapshot_taker.take, sandbox_id,
                                       self._dir(sandbox_id), snapshot_id, parent, max_bytes,
                                       memory)

    async def delete_snapshot(self, snapshot_id: str) -> bool:
        return await asyncio.to_thread(self.snapshots.delete, snapshot_id)

    async def list_snapshots(self) -> set[str]:
        return await asyncio.to_thread(self.snapshots.list)

    async def usage(self, sandbox_id: str) -> SandboxUsage:
        return await asyncio.to_thread(measure, self.cgroups, self._dir(sandbox_id), sandbox_id)

    async def pause(self, sandbox_id: str) -> None:
        try:
            await asyncio.to_thread(self.cgroups.freeze, sandbox_id)
        except CgroupError as e:
            raise BackendError(str(e)) from None

    async def resume(self, sandbox_id: str) -> None:
        await asyncio.to_thread(self.cgroups.thaw, sandbox_id)

    async def close(self) -> None:
        await self.image_cache.close()
        self.egress.stop()
        self.relays.close_all()
        self._teardown_pool.shutdown(wait=True)
        await self.reaper.close()
        self.cgroups.remove_group()
        os.close(self._lifeline)
        await asyncio.to_thread(self._zygote.wait)

