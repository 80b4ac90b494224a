"""The local backend: each sandbox is a bubblewrap namespace jail over a private overlay.

One request to the zygote (``zygote.py``, a pre-loaded fork-server) starts a sandbox:

    zygote -> fork: join cgroups, private mount ns, mount the overlay, exec bwrap -> holder
           -> fork: wait for the holder, enter its namespaces and root, fork -> agent

The holder is bwrap's sandboxed child, parked on ``--block-fd`` forever: it only keeps the
namespaces alive. The agent shares the zygote's pre-loaded pages, so it starts in about a
millisecond and costs a fraction of a fresh interpreter. The overlay is mounted in a mount
namespace of the sandbox's own, so it disappears with the sandbox's last process: killing the
cgroup is a complete teardown even after the orchestrator was SIGKILLed. All writes go to
``<sandbox>/upper`` (the image is never modified), which a later snapshot/fork can freeze and
reuse as a lower layer.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from orchard.env.backends.base import BackendError, SandboxHandle, SandboxSpec
from orchard.env.backends.local import zygote
from orchard.env.backends.local.bundle import BUNDLE_MOUNT, ensure_bundle
from orchard.env.backends.local.cgroups import CgroupError, CgroupManager
from orchard.env.backends.local.images import ImageError, ImageStore, ResolvedImage
from orchard.env.backends.local.seccomp import write_filter
from orchard.env.schema import LimitReport

CTL_MOUNT = "/.orchard/ctl"
SOCKET_NAME = "agent.sock"
_MAX_UNIX_PATH = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux
USER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Host entries a "host" sandbox sees read-only; everything else (/root, /home, /tmp, /var, the
# orchestrator's state) is absent, and /workspace, /tmp, /home are private and writable.
HOST_VIEW = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt")
HOST_SECRETS = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-",
                "/etc/sudoers", "/etc/ssl/private")
class LocalBackend:
    """Sandboxes on this machine; needs root, bubblewrap, overlayfs and cgroups."""

    name = "local"

    def __init__(self, data_dir: Path, ready_timeout: float = 30.0,
                 die_with_orchestrator: bool = False) -> None:
        if os.geteuid() != 0:
            raise BackendError(
                "the local backend needs root (namespaces, overlay mounts, cgroups): run "
                "`sudo orchard serve` or use the Kubernetes backend"
            )
        if shutil.which("bwrap") is None:
            raise BackendError("bubblewrap is not installed: run `apt-get install bubblewrap` "
                               "(or `make setup`)")
        if any(c in str(data_dir) for c in ",:"):
            raise BackendError(f"data dir {data_dir} must not contain ',' or ':' (overlayfs "
                               "option syntax); choose another --data-dir")
        self.data_dir = data_dir
        self.sandboxes_dir = data_dir / "sandboxes"
        self.sandboxes_dir.mkdir(parents=True, exist_ok=True)
        self.ready_timeout = ready_timeout
        # An embedded orchestrator's sandboxes must not outlive its process (nobody could
        # re-adopt them); a standalone one's do, so a restart can re-adopt them.
        self.die_with_orchestrator = die_with_orchestrator
        self.images = ImageStore(data_dir / "images")
        self.bundle = ensure_bundle(data_dir / "bundle")
        # One cgroup group per data dir: the orphan pass deletes every cgroup in its group
        # that has no record, so orchestrators sharing a host must not share a group.
        data_key = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:12]
        self.cgroups = CgroupManager(f"orchard/{data_key}")
        self.seccomp_path = write_filter(data_dir / "seccomp.bpf")
        self.host_skeleton = self._make_host_skeleton(data_dir / "host-skeleton")
        self.empty_dir = data_dir / "empty"
        self.empty_dir.mkdir(exist_ok=True)
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

    @staticmethod
    def _make_host_skeleton(path: Path) -> Path:
        """An image that is only mount points and the host's top-level symlinks."""
        path.mkdir(parents=True, exist_ok=True)
        for name in (*HOST_VIEW, "proc", "dev", "tmp", "workspace", "home", "root", "run", "var"):
            host, entry = Path("/") / name, path / name
            if entry.exists() or entry.is_symlink():
                continue
            if host.is_symlink():
                entry.symlink_to(os.readlink(host))
            elif host.is_dir() or name not in HOST_VIEW:
                entry.mkdir()
        (path / "tmp").chmod(0o1777)
        return path

    def _dir(self, sandbox_id: str) -> Path:
        return self.sandboxes_dir / sandbox_id

    def socket_path(self, sandbox_id: str) -> Path:
        return self._dir(sandbox_id) / "ctl" / SOCKET_NAME

    def describe(self) -> dict[str, str]:
        return {"backend": "local", **self.cgroups.layout()}

    # --- create -------------------------------------------------------------------------

    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        try:
            image = await asyncio.to_thread(self.images.resolve, spec.image)
        except ImageError as e:
            raise BackendError(str(e)) from None
        sdir = self._dir(spec.sandbox_id)
        sock = self.socket_path(spec.sandbox_id)
        if len(os.fsencode(sock)) > _MAX_UNIX_PATH:
            # Otherwise the sandbox starts "running" but its agent can never be reached.
            raise BackendError(
                f"agent socket path {sock} is over {_MAX_UNIX_PATH} bytes (the AF_UNIX limit); "
                "use a shorter sandbox_id or a shorter --data-dir")
        # The dir comes first: it is this orchestrator's claim on the id (list() reads dirs),
        # so a crash at any later point leaves something the reconcile pass will find.
        for sub in ("upper", "work", "root", "ctl"):
            (sdir / sub).mkdir(parents=True, exist_ok=True)
        try:
            limits = self.cgroups.create(spec.sandbox_id, spec.cpu, spec.memory, spec.pids)
        except (ValueError, CgroupError) as e:
            shutil.rmtree(sdir, ignore_errors=True)
            raise BackendError(f"sandbox {spec.sandbox_id}: {e}") from None
        try:
            await self._launch(spec, image, sdir)
        except BaseException:
            await self.delete(spec.sandbox_id)
            raise
        return SandboxHandle(
            sandbox_id=spec.sandbox_id,
            address=f"unix:{self.socket_path(spec.sandbox_id)}",
            limits={k: LimitReport(requested=v.requested, enforced=v.enforced, detail=v.detail)
                    for k, v in limits.items()},
        )

    def _bwrap_argv(self, spec: SandboxSpec, image: ResolvedImage, sdir: Path) -> list[str]:
        bwrap = ["bwrap", "--bind", str(sdir / "root"), "/", "--proc", "/proc", "--dev", "/dev"]
        if image.kind == "host":
            for name in HOST_VIEW:
                host = Path("/") / name
                if host.is_dir() and not host.is_symlink():
                    bwrap += ["--ro-bind", str(host), str(host)]
            for secret in HOST_SECRETS:
                if os.path.lexists(secret):
                    mask = self.empty_dir if os.path.isdir(secret) else "/dev/null"
                    bwrap += ["--ro-bind", str(mask), secret]
            for key in Path("/etc/ssh").glob("ssh_host_*_key"):
                bwrap += ["--ro-bind", "/dev/null", str(key)]
        bwrap += [
            "--perms", "1777", "--dir", "/tmp", "--dir", "/workspace",
            "--ro-bind", str(self.bundle), BUNDLE_MOUNT,
            "--bind", str(sdir / "ctl"), CTL_MOUNT,
            "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--hostname", spec.sandbox_id[:63], "--cap-drop", "ALL", "--new-session",
            "--seccomp", str(zygote.SECCOMP_FD), "--clearenv", "--setenv", "PATH", USER_PATH,
            "--setenv", "HOME", "/root", "--setenv", "LANG", "C.UTF-8",
            "--setenv", "HOSTNAME", spec.sandbox_id[:63], "--chdir", "/",
        ]
        if spec.block_network:
            bwrap.append("--unshare-net")
        if self.die_with_orchestrator:
            bwrap.append("--die-with-parent")
        # The holder never gets past --block-fd, so the command is never run.
        return [*bwrap, "--block-fd", str(zygote.BLOCK_FD), "--", "/.orchard/never-run"]

    def _agent_env(self, spec: SandboxSpec) -> dict[str, str]:
        return {"PATH": USER_PATH, "HOME": "/root", "LANG": "C.UTF-8",
                "HOSTNAME": spec.sandbox_id[:63], **spec.env}

    async def _launch(self, spec: SandboxSpec, image: ResolvedImage, sdir: Path) -> None:
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        lower = self.host_skeleton if image.kind == "host" else image.rootfs
        request = {
            "procs": [str(p) for p in self.cgroups.procs_files(spec.sandbox_id)],
            "overlay": f"lowerdir={lower},upperdir={sdir / 'upper'},workdir={sdir / 'work'}",
            "root": str(sdir / "root"), "log": str(sdir / "launch.log"),
            "bwrap": self._bwrap_argv(spec, image, sdir),
            "env": self._agent_env(spec), "socket": f"{CTL_MOUNT}/{SOCKET_NAME}",
            "path": [f"{BUNDLE_MOUNT}/lib/{version}", f"{BUNDLE_MOUNT}/lib/{version}/lib-dynload"],
            "timeout": self.ready_timeout,
        }
        try:
            reader, writer = await asyncio.open_unix_connection(str(self.zygote_socket))
            writer.write(json.dumps(request).encode() + b"\n")
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), self.ready_timeout + 5)
            writer.close()
        except (OSError, TimeoutError) as e:
            raise BackendError(f"sandbox {spec.sandbox_id}: the sandbox launcher did not "
                               f"answer ({e!r}); see {self.data_dir / 'zygote.log'}") from None
        reply = json.loads(line or b'{"error": "the launcher closed the connection"}')
        if "error" in reply:
            log = (sdir / "launch.log").read_text(errors="replace").strip()[-2000:]
            raise BackendError(f"sandbox {spec.sandbox_id} failed to start: {reply['error']}"
                               + (f"; launch log: {log}" if log else ""))
        (sdir / "agent.pid").write_text(str(reply["agent"]))

    # --- delete / list / adopt -------------------------------------------------------------

    async def delete(self, sandbox_id: str) -> None:
        await asyncio.to_thread(self._delete_sync, sandbox_id)

    def _delete_sync(self, sandbox_id: str) -> None:
        self.cgroups.kill(sandbox_id)
        sdir = self._dir(sandbox_id)
        shutil.rmtree(sdir, ignore_errors=True)
        if sdir.exists():
            raise BackendError(f"could not remove {sdir}; remove it by hand")

    async def list(self) -> set[str]:
        """Sandboxes of THIS data dir only: other orchestrators on the host share the cgroup
        tree, and their sandboxes are not ours to reap."""
        return {p.name for p in self.sandboxes_dir.iterdir() if p.is_dir()}

    async def adopt(self, sandbox_id: str) -> SandboxHandle | None:
        sock = self.socket_path(sandbox_id)
        try:
            agent = int((self._dir(sandbox_id) / "agent.pid").read_text())
        except (OSError, ValueError):
            return None
        # The agent itself must be alive: the holder alone keeps the cgroup populated.
        if not sock.exists() or agent not in self.cgroups.pids(sandbox_id):
            return None
        return SandboxHandle(sandbox_id=sandbox_id, address=f"unix:{sock}")

    async def close(self) -> None:
        os.close(self._lifeline)
        await asyncio.to_thread(self._zygote.wait)
